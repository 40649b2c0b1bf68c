"""The ``sparse`` flag of ``embedding`` and ``embedding_bag`` alone decides the table's gradient.

``sparse=False`` gives a dense Tensor (the op ``embedding_bag_grad``) everywhere: the eager
tape, ``ml.grad``, ``create_graph=True``, graph autodiff and compiled gradients. ``sparse=True``
gives a ``RowSparse`` of the touched rows from the tape and ``ml.grad``, and an
``ArgumentError`` naming the op and the flag where a row-sparse gradient cannot go. Before,
``sparse=True`` turned dense inside the VJP on four runtime conditions (a traced cotangent,
grad mode on during backward, a computed table), so the same call gave either type.

Oracles: densified sparse == dense bit for bit over random cases, float64 central differences
for the dense gradient, and the node attributes of traced graphs.
"""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine.autodiff_graph import grad_graph
from mlsys_lab.engine.sparse import RowSparse
from mlsys_lab.errors import ArgumentError, DTypeError

IDS = np.array([3, 0, 3, 3, 1, 4])
OFFSETS = np.array([0, 2, 2, 5])  # bag 1 is empty; id 3 repeats within and across bags


def _lookup(op, w, sparse, ids=IDS, offsets=OFFSETS, mode="sum"):
    """The op on table ``w``: ``embedding`` looks ``ids`` up as a (2, 3) grid."""
    if op == "embedding":
        return ml.ops.embedding(w, ids.reshape(2, 3), sparse=sparse)
    return ml.ops.embedding_bag(w, ids, offsets, mode, sparse=sparse)


def _loss(op, w, sparse, cot):
    return (_lookup(op, w, sparse) * ml.tensor(cot)).sum()


def _cotangent(op, rng):
    return rng.standard_normal((2, 3, 3) if op == "embedding" else (len(OFFSETS), 3))


OPS = ["embedding", "embedding_bag"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("sparse", [False, True])
def test_the_tape_and_ml_grad_give_the_type_the_flag_names(op, sparse):
    rng = np.random.default_rng(0)
    w0, cot = rng.standard_normal((5, 3)), _cotangent(op, rng)
    kind = RowSparse if sparse else ml.Tensor
    w = ml.tensor(w0, requires_grad=True)
    _loss(op, w, sparse, cot).backward()
    assert type(w.grad) is kind
    w = ml.tensor(w0, requires_grad=True)
    (g,) = ml.gradients(_loss(op, w, sparse, cot), [w])
    assert type(g) is kind
    assert type(ml.grad(lambda t: _loss(op, t, sparse, cot))(w0)) is kind
    if sparse:  # one row per distinct id, no other row
        assert sorted(g.indices.tolist()) == sorted(set(IDS.tolist()))


@pytest.mark.parametrize("op", OPS)
def test_the_flag_is_an_attribute_of_the_traced_node(op):
    w0 = np.ones((5, 3))
    for sparse in (False, True):
        g = ml.trace(lambda w, s=sparse: _lookup(op, w, s), w0)
        (node,) = [n for n in g.nodes if n.op == op]
        assert node.attrs["sparse"] is sparse
        assert ("sparse=True" in str(g)) is sparse  # the printed graph says so
    bag = ml.nn.EmbeddingBag(5, 3, mode="sum", sparse=True, rng=0)
    table = ml.nn.Embedding(5, 3, sparse=True, rng=0)
    for layer, name in ((bag, "embedding_bag"), (table, "embedding")):
        g = ml.trace(lambda i, m=layer: m(i), np.array([[1, 2]]))
        assert [n.attrs["sparse"] for n in g.nodes if n.op == name] == [True]


@pytest.mark.parametrize("op", OPS)
def test_graph_autodiff_follows_the_flag(op):
    """sparse=False: a dense gradient graph with an embedding_bag_grad node, equal to the
    tape's. sparse=True: the graph cannot hold a RowSparse, so grad_graph and ml.compile of
    ml.grad refuse it, naming the op and the flag (they used to densify it silently)."""
    rng = np.random.default_rng(1)
    w0, cot = rng.standard_normal((5, 3)), _cotangent(op, rng)
    # the cotangent is a graph input, so the gradient is not folded into a constant
    loss = lambda w, c, s: (_lookup(op, w, s) * c).sum()  # noqa: E731
    dense = grad_graph(ml.trace(lambda w, c: loss(w, c, False), w0, cot), wrt=0)
    assert "embedding_bag_grad" in [n.op for n in dense.nodes]
    want = ml.grad(lambda w: _loss(op, w, False, cot))(w0).numpy()
    np.testing.assert_array_equal(dense(w0, cot)[1], want)
    compiled = ml.compile(ml.grad(lambda w, c: loss(w, c, False)), w0, cot)
    np.testing.assert_allclose(compiled(w0, cot), want, rtol=1e-12)
    traced = ml.trace(lambda w, c: loss(w, c, True), w0, cot)
    with pytest.raises(ArgumentError, match=rf"{op}\(sparse=True\).*traced gradient"):
        grad_graph(traced, wrt=0)
    with pytest.raises(ArgumentError, match=rf"{op}\(sparse=True\).*sparse=False"):
        ml.compile(ml.grad(lambda w, c: loss(w, c, True)), w0, cot)


@pytest.mark.parametrize("op", OPS)
def test_where_a_row_sparse_gradient_cannot_go_it_is_refused_not_densified(op):
    """create_graph=True, a nested ml.grad and a computed table each used to give a dense
    gradient for sparse=True; now each raises, and sparse=False gives the dense gradient."""
    rng = np.random.default_rng(2)
    w0, cot = rng.standard_normal((5, 3)), _cotangent(op, rng)
    for sparse in (False, True):
        w = ml.tensor(w0, requires_grad=True)
        create = lambda s=sparse, w=w: ml.gradients(  # noqa: E731
            _loss(op, w, s, cot) ** 2, [w], create_graph=True)
        nested = lambda s=sparse: ml.grad(  # noqa: E731
            lambda v: ml.grad(lambda t: _loss(op, t, s, cot) ** 2)(v).sum())(w0)
        w2 = ml.tensor(w0, requires_grad=True)
        computed = lambda s=sparse, w=w2: (_loss(op, w * 2.0, s, cot)).backward()  # noqa: E731
        if not sparse:
            (g,) = create()
            assert type(g) is ml.Tensor and g.requires_grad
            assert type(nested()) is ml.Tensor
            computed()
            assert type(w2.grad) is ml.Tensor
            continue
        with pytest.raises(ArgumentError, match=rf"{op}\(sparse=True\).*records a graph"):
            create()
        with pytest.raises(ArgumentError, match=rf"{op}\(sparse=True\).*records a graph"):
            nested()
        with pytest.raises(ArgumentError, match=rf"{op}\(sparse=True\): the table is computed "
                                                rf"\(the output of mul\)"):
            computed()


@pytest.mark.parametrize("op", OPS)
def test_a_dense_use_of_the_same_table_densifies_as_documented(op):
    """The one documented densification: the table's sparse and dense gradients add up."""
    rng = np.random.default_rng(3)
    w0, cot = rng.standard_normal((5, 3)), _cotangent(op, rng)
    w = ml.tensor(w0, requires_grad=True)
    (_loss(op, w, True, cot) + (w * w).sum()).backward()
    assert type(w.grad) is ml.Tensor
    v = ml.tensor(w0, requires_grad=True)
    (_loss(op, v, False, cot) + (v * v).sum()).backward()
    np.testing.assert_allclose(w.grad.numpy(), v.grad.numpy(), rtol=1e-15, atol=1e-15)


def _random_case(r):
    rows, dim = int(r.integers(1, 9)), int(r.integers(1, 4))
    sizes = r.integers(0, 5, int(r.integers(1, 6)))  # 0: an empty bag
    ids = r.integers(0, rows, int(sizes.sum()))
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return rows, dim, ids, offsets


@pytest.mark.parametrize("seed", range(30))
def test_densified_sparse_gradient_equals_the_dense_one(seed):
    """Over random bags (repeats, empty bags, sum / mean / per-sample weights) and lookups:
    to_dense() of the sparse gradient is the dense gradient, bit for bit, and holds exactly
    the touched rows."""
    r = np.random.default_rng(seed)
    rows, dim, ids, offsets = _random_case(r)
    w0 = r.standard_normal((rows, dim))
    mode = ["sum", "mean", "psw"][seed % 3]
    psw = r.standard_normal(len(ids)) if mode == "psw" else None
    cot = r.standard_normal((len(offsets), dim))
    grads, lookups = [], []
    for sparse in (False, True):
        w = ml.tensor(w0, requires_grad=True)
        y = ml.ops.embedding_bag(w, ids, offsets, "sum" if mode == "psw" else mode, sparse,
                                 per_sample_weights=psw)
        (y * ml.tensor(cot)).sum().backward()
        grads.append(w.grad)
        v = ml.tensor(w0, requires_grad=True)
        (ml.ops.embedding(v, ids, sparse=sparse) * ml.tensor(w0[ids] + 1.0)).sum().backward()
        lookups.append(v.grad)
    for dense, sparse in (grads, lookups):
        assert type(dense) is ml.Tensor and type(sparse) is RowSparse
        assert sorted(sparse.indices.tolist()) == sorted(set(ids.tolist()))
        np.testing.assert_array_equal(sparse.to_dense(), dense.numpy())


def _central(f, x, eps=1e-6):
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (f(up) - f(down)) / (2 * eps)
    return grad


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_dense_gradient_equals_central_differences(op, mode):
    rng = np.random.default_rng(4)
    w0, cot = rng.standard_normal((5, 3)), _cotangent(op, rng)

    def loss(w):
        y = (w[IDS.reshape(2, 3)] if op == "embedding" else
             np.stack([w[IDS[s:e]].sum(0) / (1 if mode == "sum" or e == s else e - s)
                       for s, e in zip(OFFSETS, [*OFFSETS[1:], len(IDS)])]))
        return float(np.sum(y * cot))

    g = ml.grad(lambda w: (_lookup(op, w, False, mode=mode) * ml.tensor(cot)).sum())(w0)
    assert type(g) is ml.Tensor
    np.testing.assert_allclose(g.numpy(), _central(loss, w0), rtol=1e-7, atol=1e-8)


def test_the_flag_must_be_a_bool():
    w = ml.tensor(np.ones((3, 2)))
    for call in (lambda: ml.ops.embedding(w, [0], sparse="yes"),
                 lambda: ml.ops.embedding_bag(w, [0], [0], sparse=1),
                 lambda: ml.nn.Embedding(3, 2, sparse=None),
                 lambda: ml.nn.EmbeddingBag(3, 2, sparse="no")):
        with pytest.raises(DTypeError, match="sparse must be True or False"):
            call()
