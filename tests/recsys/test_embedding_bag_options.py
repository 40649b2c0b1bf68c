"""``embedding_bag``'s ``per_sample_weights`` and ``include_last_offset`` (PyTorch semantics),
the fast kernels behind it, and the row-sparse machinery they use.

Oracles: a bag-by-bag numpy loop, float64 central differences for the gradients w.r.t. the
table (dense and row-sparse) and w.r.t. the per-sample weights, ``np.unique`` for the hash
merge, the numpy row updates for the optimiser kernels, and ``torch.nn.functional.embedding_bag``
where torch is installed."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.engine import ops_embedding
from mlsys_lab.engine.registry import get
from mlsys_lab.engine.sparse import RowSparse, unique_first_seen
from mlsys_lab.errors import ArgumentError, DTypeError, RankError
from mlsys_lab.kernels import embedding as kernels

from ..conformance import torch_misc_reference
from .test_recsys_embedding import bags  # rows, ids (repeats, empty bags), offsets, seed


def weighted_bag_reference(w, ids, offsets, psw):
    """Bag by bag: the sum of each id's row times its weight."""
    ends = list(offsets[1:]) + [len(ids)]
    out = np.zeros((len(offsets), w.shape[1]))
    for b, (s, e) in enumerate(zip(offsets, ends)):
        for k in range(s, e):
            out[b] += psw[k] * w[ids[k]]
    return out


def _central(f, x, eps=1e-6):
    """d f / d x by central differences (float64), f returning a scalar."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (f(up) - f(down)) / (2 * eps)
    return grad


@settings(max_examples=40, deadline=None)
@given(bags(), st.booleans(), st.booleans())
def test_per_sample_weights_forward_and_gradients(case, sparse, last):
    """Forward equals the weighted loop; the gradients w.r.t. the table (dense, or row-sparse
    with each touched row once) and w.r.t. the weights equal central differences of the
    reference; include_last_offset with the closing len(ids) entry gives the same bags."""
    rows, ids, offsets, seed = case
    r = np.random.default_rng(seed)
    w0, psw0 = r.standard_normal((rows, 3)), r.standard_normal(len(ids))
    gout = r.standard_normal((len(offsets), 3))
    offs = np.append(offsets, len(ids)) if last else offsets
    w = ml.tensor(w0, requires_grad=True)
    psw = ml.tensor(psw0, requires_grad=True)
    y = ml.ops.embedding_bag(w, ids, offs, "sum", sparse, per_sample_weights=psw,
                             include_last_offset=last)
    np.testing.assert_allclose(y.numpy(), weighted_bag_reference(w0, ids, offsets, psw0),
                               atol=1e-12)
    y.backward(ml.tensor(gout))

    def loss_w(wx):
        return np.sum(weighted_bag_reference(wx, ids, offsets, psw0) * gout)

    def loss_p(px):
        return np.sum(weighted_bag_reference(w0, ids, offsets, px) * gout)

    if sparse:
        assert isinstance(w.grad, RowSparse)
        assert sorted(w.grad.indices.tolist()) == sorted(set(ids.tolist()))  # each row once
    np.testing.assert_allclose(np.asarray(w.grad.numpy()), _central(loss_w, w0), atol=1e-7)
    np.testing.assert_allclose(psw.grad.numpy(), _central(loss_p, psw0), atol=1e-7)


def test_per_sample_weights_second_order_and_jvp():
    """Through create_graph the weights' gradient is differentiable again (w.r.t. the table),
    and forward mode agrees with reverse mode."""
    r = np.random.default_rng(1)
    w0, psw0 = r.standard_normal((4, 2)), r.standard_normal(5)
    ids, offsets = np.array([0, 3, 3, 1, 0]), np.array([0, 2, 2])

    def f(w, p):
        return (ml.ops.embedding_bag(w, ids, offsets, "sum", per_sample_weights=p) ** 2).sum()

    def psw_grad_sum(wx):
        p = ml.tensor(psw0, requires_grad=True)
        return ml.grad(lambda q: f(ml.tensor(wx), q))(p).numpy().sum()

    w, p = ml.tensor(w0, requires_grad=True), ml.tensor(psw0, requires_grad=True)
    (gp,) = ml.gradients(f(w, p), [p], create_graph=True)
    (gw,) = ml.gradients(gp.sum(), [w])
    np.testing.assert_allclose(gw.numpy(), _central(psw_grad_sum, w0), atol=1e-6)

    def table_grad_sum(px):  # and the other way: the table's gradient, differentiated in psw
        return ml.grad(lambda v: f(v, ml.tensor(px)))(ml.tensor(w0)).numpy().sum()

    w, p = ml.tensor(w0, requires_grad=True), ml.tensor(psw0, requires_grad=True)
    (gw,) = ml.gradients(f(w, p), [w], create_graph=True)
    (gp,) = ml.gradients(gw.sum(), [p])
    np.testing.assert_allclose(gp.numpy(), _central(table_grad_sum, psw0), atol=1e-6)
    tw, tp = r.standard_normal(w0.shape), r.standard_normal(psw0.shape)
    _, jv = ml.jvp(f, (ml.tensor(w0), ml.tensor(psw0)), (ml.tensor(tw), ml.tensor(tp)))
    gw, gp = ml.grad(f, argnums=(0, 1))(ml.tensor(w0), ml.tensor(psw0))
    np.testing.assert_allclose(jv.numpy(), np.sum(gw.numpy() * tw) + np.sum(gp.numpy() * tp),
                               rtol=1e-10)


def test_module_options_and_2d_ids():
    """The module: include_last_offset on 1-D calls, per-sample weights of 2-D ids."""
    bag = ml.nn.EmbeddingBag(5, 2, mode="sum", rng=0, include_last_offset=True)
    w0 = bag.weight.numpy()
    ids, offs = np.array([4, 1, 1, 0]), np.array([0, 1, 4])
    psw = np.array([2.0, -1.0, 0.5, 3.0], np.float32)
    np.testing.assert_allclose(bag(ids, offs, per_sample_weights=psw).numpy(),
                               weighted_bag_reference(w0, ids, offs[:-1], psw), rtol=1e-6)
    ids2 = np.array([[4, 1], [1, 0]])
    psw2 = psw.reshape(2, 2)
    np.testing.assert_allclose(bag(ids2, per_sample_weights=psw2).numpy(),
                               weighted_bag_reference(w0, ids2.ravel(), [0, 2], psw), rtol=1e-6)


def test_bad_options_are_refused_naming_the_op():
    w = ml.tensor(np.ones((4, 2)))
    ids, offs = np.array([0, 1, 2]), np.array([0, 1])
    with pytest.raises(ArgumentError, match="embedding_bag.*only supported for mode='sum'"):
        ml.ops.embedding_bag(w, ids, offs, "mean", per_sample_weights=np.ones(3))
    with pytest.raises(RankError, match="embedding_bag.*shape of ids"):
        ml.ops.embedding_bag(w, ids, offs, "sum", per_sample_weights=np.ones(2))
    with pytest.raises(DTypeError, match="embedding_bag.*dtype float64"):
        ml.ops.embedding_bag(w, ids, offs, "sum", per_sample_weights=np.ones(3, np.float32))
    with pytest.raises(ArgumentError, match="last offset must be len\\(ids\\)=3, got 2"):
        ml.ops.embedding_bag(w, ids, np.array([0, 1, 2]), include_last_offset=True)
    with pytest.raises(ArgumentError, match="at least one entry"):
        ml.ops.embedding_bag(w, ids, np.zeros(0, np.int64), include_last_offset=True)
    with pytest.raises(RankError, match="EmbeddingBag: per_sample_weights"):
        ml.nn.EmbeddingBag(4, 2, mode="sum")(np.array([[0, 1]]), per_sample_weights=np.ones(2))
    with pytest.raises(ArgumentError, match="embedding_bag: id 9 is outside"):  # the kernel
        ml.ops.embedding_bag(w, np.array([0, 9]), np.array([0, 1]))


def test_eager_mode_runs_the_prefetching_kernel():
    """Eager dispatch runs the registered Numba gather, bit-identical to the numpy reference,
    on a table big enough that the prefetch runs ahead of the loop."""
    op = get("embedding_bag")
    assert [k.name for k in op.eager_impls] == ["numba.embedding_bag_prefetch"]
    r = np.random.default_rng(3)
    w = r.standard_normal((500, 7)).astype(np.float32)
    ids = r.integers(0, 500, 300)
    offsets = np.sort(r.integers(0, 300, 40))
    offsets[0] = 0
    for mode, psw in (("sum", None), ("mean", None), ("sum", r.standard_normal(300))):
        extra = () if psw is None else (psw.astype(np.float32),)
        got = ml.ops.embedding_bag(ml.tensor(w), ids, offsets, mode,
                                   per_sample_weights=extra[0] if extra else None).numpy()
        want = op.compute(w, ids, offsets, *extra, mode=mode, sparse=False)
        np.testing.assert_array_equal(got, want)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.sampled_from(["sum", "mean"]))
def test_sparse_gradient_merges_rows_like_the_dense_one(ids, mode):
    """The hash-merged row-sparse gradient: distinct ids in order of first appearance, and
    rows bit-identical to the dense gradient's rows (both add in id order)."""
    ids = np.array(ids, np.int64)
    r = np.random.default_rng(len(ids))
    offsets = np.sort(r.integers(0, len(ids) + 1, 4))
    offsets[0] = 0
    g = r.standard_normal((4, 3)).astype(np.float32)
    sp = ops_embedding.sparse_bag_grad(g, ids, offsets, 41, mode)
    _, first = np.unique(ids, return_index=True)
    np.testing.assert_array_equal(sp.indices, ids[np.sort(first)])
    dense = get("embedding_bag_grad").compute(g, ids, offsets, num_rows=41, mode=mode)
    np.testing.assert_array_equal(sp.values, dense[sp.indices])
    assert sp.unique


def test_unique_first_seen_and_merged_equal_numpy():
    r = np.random.default_rng(0)
    for n, high in ((0, 3), (7, 2), (500, 50), (3000, 10 ** 12)):
        ids = r.integers(0, high, n)
        unique, inverse = unique_first_seen(ids)
        _, first = np.unique(ids, return_index=True)
        np.testing.assert_array_equal(unique, ids[np.sort(first)])
        np.testing.assert_array_equal(unique[inverse], ids)
    rows = RowSparse(np.array([5, 1, 5, 5, 0]), np.arange(10.0).reshape(5, 2), 6)
    merged = rows.merged()
    assert merged.unique and merged.merged() is merged
    np.testing.assert_array_equal(merged.indices, [5, 1, 0])
    np.testing.assert_array_equal(merged.to_dense(), rows.to_dense())
    np.testing.assert_array_equal(merged.values, rows.coalesce().values[[2, 1, 0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_optimiser_row_kernels_equal_their_numpy_references(dtype):
    """SGD, Adagrad and SparseAdam row kernels: bit-identical to the numpy row updates, and
    only the touched rows change."""
    r = np.random.default_rng(5)
    rows = np.array([7, 2, 40, 0, 13])
    g = RowSparse(rows, r.standard_normal((5, 19)).astype(dtype), 50, unique=True)
    p0 = r.standard_normal((50, 19)).astype(dtype)
    acc0, m0 = r.uniform(0, 2, (50, 19)).astype(dtype), r.standard_normal((50, 19)).astype(dtype)
    for fast, slow, state in (
            (kernels.sgd_rows, kernels.sgd_rows_reference, ()),
            (kernels.adagrad_rows, kernels.adagrad_rows_reference, (acc0,)),
            (kernels.sparse_adam_rows, kernels.sparse_adam_rows_reference, (m0, acc0))):
        args = {"sgd_rows": (0.1,), "adagrad_rows": (0.1, 1e-10),
                "sparse_adam_rows": (0.01, (0.9, 0.99), 1e-8, 3)}[fast.__name__]
        a = [p0.copy(), *[s.copy() for s in state]]
        b = [p0.copy(), *[s.copy() for s in state]]
        fast(*a, g, *args)
        slow(*b, g, *args)
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y, err_msg=fast.__name__)
        untouched = np.setdiff1d(np.arange(50), rows)
        np.testing.assert_array_equal(a[0][untouched], p0[untouched])
        assert not np.array_equal(a[0][rows], p0[rows])


def test_sparse_sgd_with_repeated_ids_equals_dense_sgd_bit_for_bit():
    """Duplicates are merged before the step, in the order the dense gradient adds them."""
    r = np.random.default_rng(2)
    w0 = r.standard_normal((30, 4)).astype(np.float32)
    ids, offsets = r.integers(0, 30, 50), np.arange(0, 50, 5)
    g = r.standard_normal((10, 4)).astype(np.float32)
    out = []
    for sparse in (True, False):
        w = ml.nn.Parameter(w0.copy())
        opt = ml.optim.SGD([w], lr=0.3)
        ml.ops.embedding_bag(w, ids, offsets, "mean", sparse).backward(ml.tensor(g))
        opt.step()
        out.append(w.numpy())
    np.testing.assert_array_equal(out[0], out[1])


def test_per_sample_weights_equal_torch():
    ref = torch_misc_reference("psw")  # F.embedding_bag with per_sample_weights, committed
    w = ml.tensor(ref["w0"], requires_grad=True)
    p = ml.tensor(ref["psw0"], requires_grad=True)
    # an empty bag, and include_last_offset's closing entry
    y = ml.ops.embedding_bag(w, ref["ids"], ref["offsets"], "sum", sparse=True,
                             per_sample_weights=p, include_last_offset=True)
    y.backward(ml.tensor(ref["gout"]))
    np.testing.assert_allclose(y.numpy(), ref["out"], rtol=1e-12)
    np.testing.assert_allclose(w.grad.numpy(), ref["wgrad"], rtol=1e-12)
    np.testing.assert_allclose(p.grad.numpy(), ref["pgrad"], rtol=1e-12)


@pytest.mark.parametrize("opt_cls", [ml.optim.Adagrad, ml.optim.SparseAdam])
def test_sparse_row_updates_divide_by_zero_as_numpy(opt_cls):
    """eps=0 (allowed, as in PyTorch) and a zero gradient row: 0 / (sqrt(0) + 0) is NaN in
    numpy and in torch; the Numba row kernels used Python's error model and raised
    ZeroDivisionError instead. Now they equal their numpy references, NaN for NaN."""
    p = ml.nn.Parameter(np.ones((4, 2), np.float32))
    opt = opt_cls([p], lr=0.1, eps=0.0)
    p.grad = RowSparse([1, 3], np.array([[0.0, 2.0], [0.0, -1.0]], np.float32), 4)
    with np.errstate(all="ignore"):
        opt.step()
    got = p.numpy()
    assert np.isnan(got[[1, 3], 0]).all() and np.isfinite(got[[1, 3], 1]).all()
    np.testing.assert_array_equal(got[[0, 2]], 1.0)  # untouched rows
