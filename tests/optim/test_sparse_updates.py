"""Optimisers and the gradient type an embedding's ``sparse`` flag picks: a RowSparse updates
only the touched rows (and their state), equal to the dense update there, and leaves every
other row and its state untouched bit for bit; a dense gradient updates the whole table; an
optimiser that cannot take a RowSparse refuses it, naming itself and the flag, instead of
densifying it.

Oracles: the same optimiser stepped on the densified gradient, and the start values.
"""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine.sparse import RowSparse
from mlsys_lab.errors import ArgumentError

ROWS, DIM = 12, 3

#: (sparse optimiser, its hyper-parameters, the dense optimiser whose step it equals on the
#: touched rows, and for how many steps: SparseAdam is lazy Adam, equal to Adam's first step
#: only, where an untouched row has zero moments and does not move either)
PAIRS = [
    (ml.optim.SGD, {"lr": 0.3}, ml.optim.SGD, 4),
    (ml.optim.Adagrad, {"lr": 0.2, "lr_decay": 0.1, "initial_accumulator_value": 0.05},
     ml.optim.Adagrad, 4),
    (ml.optim.SparseAdam, {"lr": 0.05, "betas": (0.8, 0.9), "eps": 1e-6}, ml.optim.Adam, 1),
]


def _grad(r):
    """A RowSparse with repeated rows (which must add up), touching a few of the rows."""
    idx = r.choice(ROWS, 5, replace=True)
    return RowSparse(idx, r.standard_normal((5, DIM)), ROWS)


@pytest.mark.parametrize("opt_cls,hyper,dense_cls,steps", PAIRS,
                         ids=[p[0].__name__ for p in PAIRS])
def test_row_updates_equal_the_dense_update_on_touched_rows_and_leave_the_rest(
        opt_cls, hyper, dense_cls, steps):
    r = np.random.default_rng(7)
    w0 = r.standard_normal((ROWS, DIM))
    ps, pd = ml.nn.Parameter(w0.copy()), ml.nn.Parameter(w0.copy())
    opt_s, opt_d = opt_cls([ps], **hyper), dense_cls([pd], **hyper)
    touched = set()
    for _ in range(steps):
        g = _grad(r)
        touched |= set(g.indices.tolist())
        state0 = {k: v.copy() for k, v in opt_s.state[0].items()}
        before = ps.numpy().copy()
        ps.grad, pd.grad = g, ml.tensor(g.to_dense())
        opt_s.step()
        opt_d.step()
        rows = np.unique(g.indices)
        others = np.setdiff1d(np.arange(ROWS), rows)
        np.testing.assert_array_equal(ps.numpy()[others], before[others])  # not a bit moved
        for k, v in opt_s.state[0].items():
            np.testing.assert_array_equal(v[others], state0[k][others])
        assert not np.allclose(ps.numpy()[rows], before[rows])  # the touched rows did move
    rows = sorted(touched)
    np.testing.assert_allclose(ps.numpy()[rows], pd.numpy()[rows], rtol=1e-12, atol=1e-15)
    if dense_cls is opt_cls:  # SGD, Adagrad: an untouched row has g = 0 on the dense path too
        np.testing.assert_allclose(ps.numpy(), pd.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("opt_cls,hyper", [(ml.optim.SGD, {"lr": 0.5}),
                                           (ml.optim.Adagrad, {"lr": 0.3})])
@pytest.mark.parametrize("layer", ["Embedding", "EmbeddingBag"])
def test_the_layers_flag_picks_the_update_and_both_train_alike(opt_cls, hyper, layer):
    """Through the layers: sparse=True hands the optimiser a RowSparse (rows only), sparse=False
    a dense table (the whole table); the trained tables agree."""
    trained = {}
    for sparse in (False, True):
        r = np.random.default_rng(1)
        m = getattr(ml.nn, layer)(ROWS, DIM, sparse=sparse, rng=0)
        opt = opt_cls(m.parameters(), **hyper)
        for _ in range(3):
            ids = r.integers(0, ROWS, (4, 2))
            opt.zero_grad()
            ((m(ids) - 1.0) ** 2).sum().backward()
            assert type(m.weight.grad) is (RowSparse if sparse else ml.Tensor)
            opt.step()
        trained[sparse] = m.weight.numpy()
    np.testing.assert_allclose(trained[True], trained[False], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("opt", [lambda p: ml.optim.Adam(p), lambda p: ml.optim.RMSProp(p),
                                 lambda p: ml.optim.SGD(p, lr=0.1, momentum=0.9),
                                 lambda p: ml.optim.SGD(p, lr=0.1, weight_decay=0.1),
                                 lambda p: ml.optim.Adagrad(p, weight_decay=0.1)],
                         ids=["Adam", "RMSProp", "SGD-momentum", "SGD-weight_decay",
                              "Adagrad-weight_decay"])
def test_an_optimiser_that_cannot_take_a_row_sparse_gradient_refuses_it(opt):
    table = ml.nn.Embedding(ROWS, DIM, sparse=True, rng=0)
    table(np.array([1, 4])).sum().backward()
    w0 = table.weight.numpy().copy()
    o = opt(table.parameters())
    with pytest.raises(ArgumentError, match=rf"{type(o).__name__}.*sparse=True"):
        o.step()
    np.testing.assert_array_equal(table.weight.numpy(), w0)  # nothing densified and applied


def test_sparse_adam_refuses_a_dense_gradient_naming_the_flag():
    table = ml.nn.Embedding(ROWS, DIM, sparse=False, rng=0)
    table(np.array([1, 4])).sum().backward()
    with pytest.raises(ArgumentError, match="SparseAdam does not support dense.*sparse=True"):
        ml.optim.SparseAdam(table.parameters()).step()
