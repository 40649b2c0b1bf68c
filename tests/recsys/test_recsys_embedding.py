"""Sparse embeddings: EmbeddingBag / Embedding(sparse=True) against a dense numpy reference, the
row-sparse gradient through the tape and ml.grad, and the optimisers that take it (SGD and
Adagrad equal to dense training; SparseAdam equal to a reference of PyTorch's lazy semantics,
and to torch itself where torch is installed)."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.distributed import RowSparse as DistRowSparse
from mlsys_lab.engine import ops_embedding
from mlsys_lab.engine.sparse import RowSparse
from mlsys_lab.errors import ArgumentError, DTypeError, RankError

from ..conformance import torch_misc_reference


def bag_reference(w, ids, offsets, mode):
    """Bag by bag, the obvious loop."""
    ends = list(offsets[1:]) + [len(ids)]
    out = np.zeros((len(offsets), w.shape[1]))
    for b, (s, e) in enumerate(zip(offsets, ends)):
        if e > s:
            rows = w[ids[s:e]]
            out[b] = rows.sum(0) if mode == "sum" else rows.mean(0)
    return out


def bag_grad_reference(w, ids, offsets, mode, gout):
    """The table's gradient as a dense array, one id at a time."""
    ends = list(offsets[1:]) + [len(ids)]
    grad = np.zeros_like(w)
    for b, (s, e) in enumerate(zip(offsets, ends)):
        for i in ids[s:e]:
            grad[i] += gout[b] / (1 if mode == "sum" else e - s)
    return grad


@st.composite
def bags(draw):
    rows = draw(st.integers(1, 7))
    sizes = draw(st.lists(st.integers(0, 4), min_size=1, max_size=6))  # 0: an empty bag
    ids = np.array([draw(st.integers(0, rows - 1)) for _ in range(sum(sizes))], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    seed = draw(st.integers(0, 2 ** 16))
    return rows, ids, offsets, seed


@settings(max_examples=60, deadline=None)
@given(bags(), st.sampled_from(["sum", "mean"]), st.booleans())
def test_embedding_bag_forward_and_backward_equal_the_reference(case, mode, sparse):
    rows, ids, offsets, seed = case
    r = np.random.default_rng(seed)
    w0, gout = r.standard_normal((rows, 3)), r.standard_normal((len(offsets), 3))
    w = ml.tensor(w0, requires_grad=True)
    y = ml.ops.embedding_bag(w, ids, offsets, mode=mode, sparse=sparse)
    np.testing.assert_allclose(y.numpy(), bag_reference(w0, ids, offsets, mode), atol=1e-12)
    (y * ml.tensor(gout)).sum().backward()
    want = bag_grad_reference(w0, ids, offsets, mode, gout)
    if sparse:
        assert isinstance(w.grad, RowSparse)
        assert set(w.grad.indices.tolist()) == set(ids.tolist())  # only touched rows, all of them
        np.testing.assert_allclose(w.grad.to_dense(), want, atol=1e-12)
    else:
        np.testing.assert_allclose(w.grad.numpy(), want, atol=1e-12)
    f = lambda w: (ml.ops.embedding_bag(w, ids, offsets, mode, sparse) * ml.tensor(gout)).sum()
    np.testing.assert_allclose(np.asarray(ml.grad(f)(w0)), want, atol=1e-12)


def test_repeated_ids_accumulate_and_tape_keeps_them_sparse():
    w = ml.tensor(np.ones((1000, 2)), requires_grad=True)
    y = ml.ops.embedding_bag(w, [7, 7, 7, 3], [0, 2], mode="sum", sparse=True)
    (y.sum() + ml.ops.embedding_bag(w, [7], [0], sparse=True).sum()).backward()
    g = w.grad.coalesce()
    assert g.indices.tolist() == [3, 7] and g.values.tolist() == [[1, 1], [4, 4]]
    assert g.nbytes < 100  # two rows, not a 1000-row table


def test_sparse_gradient_meets_a_dense_one_and_densifies():
    w0 = np.arange(8.0).reshape(4, 2)
    w = ml.tensor(w0, requires_grad=True)
    loss = ml.ops.embedding_bag(w, [1], [0], sparse=True).sum() + (w * w).sum()
    loss.backward()
    want = 2 * w0
    want[1] += 1
    np.testing.assert_allclose(np.asarray(w.grad), want)


def test_mean_of_an_empty_bag_is_zero_and_gets_no_gradient():
    w = ml.tensor(np.ones((3, 2)), requires_grad=True)
    y = ml.ops.embedding_bag(w, [2, 2], [0, 0, 2], mode="mean", sparse=True)
    assert y.numpy().tolist() == [[0, 0], [1, 1], [0, 0]]
    y.sum().backward()
    np.testing.assert_allclose(w.grad.to_dense(), [[0, 0], [0, 0], [1, 1]])


def test_create_graph_and_compiled_gradients_follow_the_flag():
    """A compiled gradient or create_graph=True used to turn a sparse=True table's gradient
    into a dense one silently (the kernel was named "[densified]"); now the flag alone decides:
    sparse=True refuses both, naming the op and the flag, and sparse=False gives the dense,
    differentiable gradient."""
    ids, off = np.array([0, 2, 2]), np.array([0, 1])
    w0 = np.random.default_rng(0).standard_normal((3, 2))
    for sparse in (True, False):
        f = ml.grad(lambda w, i, o, s=sparse: (ml.ops.embedding_bag(w, i, o, sparse=s) ** 2).sum())
        w = ml.tensor(w0, requires_grad=True)
        loss = (ml.ops.embedding_bag(w, ids, off, sparse=sparse) ** 2).sum()
        if sparse:
            with pytest.raises(ArgumentError, match=r"embedding_bag\(sparse=True\).*traced"):
                ml.compile(f, w0, ids, off)
            with pytest.raises(ArgumentError, match=r"embedding_bag\(sparse=True\).*records a"):
                ml.gradients(loss, [w], create_graph=True)
            continue
        c = ml.compile(f, w0, ids, off)
        np.testing.assert_allclose(c(w0, ids, off), np.asarray(f(w0, ids, off)))
        assert "numpy.embedding_bag_grad" in c.explain() and "densified" not in c.explain()
        (g,) = ml.gradients(loss, [w], create_graph=True)
        assert isinstance(g, ml.Tensor) and g.requires_grad  # a differentiable dense gradient
        (hess_row,) = ml.gradients(g.sum(), [w])
        assert np.isfinite(hess_row.numpy()).all()


def test_embedding_module_sparse_and_dense_agree():
    ids = np.array([[1, 4], [4, 4], [0, 9]])
    dense, sparse = ml.nn.Embedding(10, 3, rng=1), ml.nn.Embedding(10, 3, rng=1, sparse=True)
    yd, ys = dense(ids), sparse(ids)
    np.testing.assert_array_equal(yd.numpy(), ys.numpy())
    assert ys.shape == (3, 2, 3)
    (yd ** 2).sum().backward()
    (ys ** 2).sum().backward()
    assert isinstance(sparse.weight.grad, RowSparse)
    np.testing.assert_allclose(sparse.weight.grad.to_dense(), dense.weight.grad.numpy(),
                               rtol=1e-6)


def test_embedding_bag_module_2d_input_and_errors():
    bag = ml.nn.EmbeddingBag(5, 2, mode="sum", rng=0)
    w = bag.weight.numpy()
    np.testing.assert_allclose(bag(np.array([[0, 1], [4, 4]])).numpy(),
                               [w[0] + w[1], 2 * w[4]], rtol=1e-6)
    with pytest.raises(ArgumentError, match="outside the table"):
        bag(np.array([5]), np.array([0]))
    with pytest.raises(ArgumentError, match="offsets\\[0\\] must be 0"):
        bag(np.array([1, 2]), np.array([1]))
    with pytest.raises(ArgumentError, match="non-decreasing"):
        bag(np.array([1, 2]), np.array([0, 2, 1]))
    with pytest.raises(DTypeError, match="ids must be integers"):
        ml.ops.embedding_bag(w, np.array([0.5]), np.array([0]))
    with pytest.raises(RankError):
        bag(np.array([1, 2]))
    with pytest.raises(ArgumentError, match="mode"):
        ml.nn.EmbeddingBag(5, 2, mode="max")


def test_row_sparse_keeps_its_distributed_import_path():
    assert DistRowSparse is RowSparse


# --- optimisers -----------------------------------------------------------------------------------
def _train(opt_cls, sparse, steps=6, **hyper):
    r = np.random.default_rng(3)
    bag = ml.nn.EmbeddingBag(50, 4, mode="mean", sparse=sparse, rng=0)
    w_out = ml.nn.Parameter(r.standard_normal((4, 1)).astype(np.float32))
    opt_t = opt_cls([bag.weight], **hyper)
    opt_d = ml.optim.SGD([w_out], lr=0.1)
    for _ in range(steps):
        ids = r.integers(0, 50, 12)  # Zipf-free but repeats are likely
        offsets = np.array([0, 3, 3, 7])
        y = ml.tensor(r.standard_normal((4, 1)).astype(np.float32))
        loss = ml.ops.mean((bag(ids, offsets) @ w_out - y) ** 2)
        opt_t.zero_grad()
        opt_d.zero_grad()
        loss.backward()
        assert isinstance(bag.weight.grad, RowSparse) == sparse
        opt_t.step()
        opt_d.step()
    return bag.weight.numpy().copy(), w_out.numpy().copy()


@pytest.mark.parametrize("opt_cls,hyper", [(ml.optim.SGD, {"lr": 0.5}),
                                           (ml.optim.Adagrad, {"lr": 0.3, "lr_decay": 0.01,
                                                               "initial_accumulator_value": 0.1})])
def test_sparse_and_dense_training_give_equal_parameters(opt_cls, hyper):
    ws, outs = _train(opt_cls, True, **hyper)
    wd, outd = _train(opt_cls, False, **hyper)
    np.testing.assert_allclose(ws, wd, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs, outd, rtol=1e-5, atol=1e-6)
    w0 = ml.nn.EmbeddingBag(50, 4, rng=0).weight.numpy()
    assert not np.allclose(ws, w0)  # it trained


def test_sparse_gradients_are_refused_where_they_would_touch_every_row():
    bag = ml.nn.EmbeddingBag(5, 2, sparse=True, rng=0)
    bag(np.array([1]), np.array([0])).sum().backward()
    for opt in (ml.optim.Adam([bag.weight]), ml.optim.SGD([bag.weight], momentum=0.9),
                ml.optim.Adagrad([bag.weight], weight_decay=0.1)):
        with pytest.raises(ArgumentError, match="sparse"):
            opt.step()
    dense = ml.nn.EmbeddingBag(5, 2, rng=0)
    dense(np.array([1]), np.array([0])).sum().backward()
    with pytest.raises(ArgumentError, match="dense gradients"):
        ml.optim.SparseAdam([dense.weight]).step()


def sparse_adam_reference(w, grads, lr, betas, eps):
    """PyTorch's SparseAdam semantics written out row by row: a row's moments and position
    change only in steps whose gradient touches it; the bias correction counts the steps the
    parameter had a gradient."""
    w = w.astype(np.float64).copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, (rows, vals) in enumerate(grads, start=1):
        g = {}
        for r, val in zip(rows, vals):
            g[r] = g.get(r, 0) + val
        for r, gr in g.items():
            m[r] = betas[0] * m[r] + (1 - betas[0]) * gr
            v[r] = betas[1] * v[r] + (1 - betas[1]) * gr * gr
            step = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)
            w[r] -= step * m[r] / (np.sqrt(v[r]) + eps)
    return w


def _sparse_adam_steps(w0, grads, **hyper):
    p = ml.nn.Parameter(w0.copy())
    opt = ml.optim.SparseAdam([p], **hyper)
    for rows, vals in grads:
        p.grad = RowSparse(rows, vals, w0.shape[0])
        opt.step()
    return p.numpy()


def _grads(seed, rows=8, dim=3, steps=5):
    r = np.random.default_rng(seed)
    return [(r.integers(0, rows, 4), r.standard_normal((4, dim))) for _ in range(steps)]


def test_sparse_adam_equals_the_reference_and_is_lazy():
    w0 = np.random.default_rng(1).standard_normal((8, 3))
    grads = _grads(2)
    hyper = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6)
    got = _sparse_adam_steps(w0, grads, **hyper)
    np.testing.assert_allclose(got, sparse_adam_reference(w0, grads, **hyper), rtol=1e-12)
    untouched = sorted(set(range(8)) - {int(i) for rows, _ in grads for i in rows})
    np.testing.assert_array_equal(got[untouched], w0[untouched])
    # dense Adam would keep moving a row after its last gradient: lazy Adam does not
    p, dense = ml.nn.Parameter(w0.copy()), ml.nn.Parameter(w0.copy())
    lazy, adam = ml.optim.SparseAdam([p], lr=0.1), ml.optim.Adam([dense], lr=0.1)
    for t in range(3):
        rows = [0] if t == 0 else [1]
        p.grad = RowSparse(rows, np.ones((1, 3)), 8)
        dense.grad = ml.tensor(RowSparse(rows, np.ones((1, 3)), 8).to_dense())
        lazy.step()
        adam.step()
    assert np.allclose(p.numpy()[0], w0[0] - 0.1) and not np.allclose(dense.numpy()[0],
                                                                       w0[0] - 0.1)


def test_sparse_adam_state_round_trips(tmp_path):
    w0 = np.zeros((4, 2))
    p = ml.nn.Parameter(w0.copy())
    opt = ml.optim.SparseAdam([p], lr=0.1)
    p.grad = RowSparse([1], np.ones((1, 2)), 4)
    opt.step()
    ml.save(opt.state_dict(), tmp_path / "opt.npz")
    q = ml.nn.Parameter(p.numpy().copy())
    opt2 = ml.optim.SparseAdam([q], lr=0.1)
    opt2.load_state_dict(ml.load(tmp_path / "opt.npz"))
    for o, x in ((opt, p), (opt2, q)):
        x.grad = RowSparse([1], np.ones((1, 2)), 4)
        o.step()
    np.testing.assert_allclose(p.numpy(), q.numpy())


def test_sparse_adam_and_adagrad_equal_torch():
    ref = torch_misc_reference("sparse_opt")  # torch.optim.SparseAdam / Adagrad, committed
    w0 = ref["w0"]
    grads = [(ref[f"rows{i}"], ref[f"vals{i}"]) for i in range(5)]
    for ours, name, hyper in ((ml.optim.SparseAdam, "SparseAdam",
                               dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6)),
                              (ml.optim.Adagrad, "Adagrad",
                               dict(lr=0.2, lr_decay=0.05, eps=1e-10))):
        p = ml.nn.Parameter(w0.copy())
        opt = ours([p], **hyper)
        for rows, vals in grads:
            p.grad = RowSparse(rows, vals, 8)
            opt.step()
        np.testing.assert_allclose(p.numpy(), ref[name], rtol=1e-10, atol=1e-12)


def test_embedding_layers_trace_and_compile():
    bag = ml.nn.EmbeddingBag(10, 3, mode="mean", rng=0)
    table = ml.nn.Embedding(10, 3, rng=0, sparse=True)
    ids = np.array([[1, 2], [3, 3]])
    for f in (lambda i: bag(i).sum(), lambda i: (table(i) ** 2).sum()):
        c = ml.compile(f, ids)
        np.testing.assert_allclose(c(ids), f(ids).numpy(), rtol=1e-6)


def test_embedding_bag_equals_torch_including_empty_bags():
    ref = torch_misc_reference("bag")  # F.embedding_bag(sparse=True), committed
    w0, ids, offsets, gout = ref["w0"], ref["ids"], ref["offsets"], ref["gout"]  # bag 1 is empty
    assert offsets[1] == offsets[2]
    for mode in ("sum", "mean"):
        w = ml.tensor(w0, requires_grad=True)
        y = ml.ops.embedding_bag(w, ids, offsets, mode, sparse=True)
        (y * ml.tensor(gout)).sum().backward()
        np.testing.assert_allclose(y.numpy(), ref[f"{mode}::out"], rtol=1e-12)
        np.testing.assert_allclose(w.grad.to_dense(), ref[f"{mode}::grad"], rtol=1e-12)


def eager_bag_case(rng, dtype):
    """``embedding_bag`` arrays and attributes for ``tests/kernels/test_eager_kernels.py``: a
    table with NaN, infinities and signed zeros, repeated ids, an empty bag, sum/mean, and
    per-sample weights on some seeds."""
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 1e-30, -3.5])
    w = rng.standard_normal((7, 5)) * 3
    mask = rng.random(w.shape) < 0.3
    w[mask] = rng.choice(specials, int(mask.sum()))
    ids = rng.integers(0, 7, 9)
    offsets = np.array([0, 3, 3, 6, 8])
    mode = ["sum", "mean"][int(rng.integers(2))]
    arrays = [w.astype(dtype), ids, offsets]
    if mode == "sum" and rng.random() < 0.5:
        arrays.append(rng.choice([-1.0, 0.0, -0.0, 0.5, 2.0, np.nan], 9).astype(dtype))
    return arrays, {"mode": mode, "sparse": bool(rng.integers(2))}


# --- issue 26: int32 ids, all-empty batches, negative ids --------------------------------------
def _bag_run(ids_dtype, off_dtype, mode, sparse, psw, last):
    """Forward, the table's gradient and the per-sample weights' gradient of one bag batch,
    with ids and offsets of the given dtypes."""
    r = np.random.default_rng(4)
    w0 = r.standard_normal((6, 3)).astype(np.float32)
    ids = np.array([5, 0, 0, 3, 2, 5, 1], ids_dtype)
    offsets = np.array([0, 2, 2, 5] + ([7] if last else []), off_dtype)  # bag 1 is empty
    gout = r.standard_normal((4, 3)).astype(np.float32)
    w = ml.tensor(w0, requires_grad=True)
    p = ml.tensor(r.standard_normal(7).astype(np.float32), requires_grad=True) if psw else None
    y = ml.ops.embedding_bag(w, ids, offsets, mode, sparse, per_sample_weights=p,
                             include_last_offset=last)
    (y * ml.tensor(gout)).sum().backward()
    assert isinstance(w.grad, RowSparse) == sparse
    return y.numpy(), np.asarray(w.grad), None if p is None else p.grad.numpy()


@pytest.mark.parametrize("ids_dtype,off_dtype", [(np.int32, np.int32), (np.int32, np.int64),
                                                 (np.int64, np.int32), (np.uint32, np.int16)])
@pytest.mark.parametrize("mode,psw", [("sum", False), ("mean", False), ("sum", True)])
@pytest.mark.parametrize("sparse,last", [(False, False), (True, False), (True, True)])
def test_int32_ids_and_offsets_work_on_every_bag_path(ids_dtype, off_dtype, mode, psw, sparse,
                                                      last):
    """PyTorch takes int32 as well as int64 ids and offsets; the prefetch in the Numba gather
    used to get an int32 row index uncast and fail to compile ('Operands must be the same
    type, got (i32, i64)'). Every path equals the int64 one bit for bit."""
    got = _bag_run(ids_dtype, off_dtype, mode, sparse, psw, last)
    want = _bag_run(np.int64, np.int64, mode, sparse, psw, last)
    for a, b in zip(got, want):
        if b is not None:
            np.testing.assert_array_equal(a, b)


def test_int32_ids_in_layers_compiled_graphs_and_optimisers():
    ids32 = np.array([[1, 4], [4, 0]], np.int32)
    for sparse in (False, True):
        tables = [ml.nn.Embedding(5, 2, rng=0, sparse=sparse) for _ in range(2)]
        opts = [ml.optim.Adagrad(t.parameters(), lr=0.1) for t in tables]
        for t, opt, ids in zip(tables, opts, (ids32, ids32.astype(np.int64))):
            np.testing.assert_array_equal(t(ids).numpy(), t.weight.numpy()[ids])
            (t(ids) ** 2).sum().backward()
            opt.step()
        np.testing.assert_array_equal(tables[0].weight.numpy(), tables[1].weight.numpy())
    bag = ml.nn.EmbeddingBag(5, 2, mode="mean", rng=0)
    np.testing.assert_array_equal(bag(ids32).numpy(), bag(ids32.astype(np.int64)).numpy())
    np.testing.assert_array_equal(
        bag(ids32.reshape(-1), np.array([0, 3], np.int32)).numpy(),
        bag(ids32.reshape(-1).astype(np.int64), np.array([0, 3])).numpy())
    w = np.arange(10, dtype=np.float32).reshape(5, 2)
    f = ml.compile(lambda t, i, o: ml.ops.embedding_bag(t, i, o, "sum"), w,
                   np.array([0, 2], np.int32), np.array([0], np.int32))
    np.testing.assert_array_equal(f(w, np.array([0, 2], np.int32), np.array([0], np.int32)),
                                  [[4.0, 6.0]])
    g = ml.grad(lambda t: ml.ops.embedding_bag(t, np.array([3, 3], np.int32),
                                               np.array([0], np.int32), "sum", True).sum())(w)
    np.testing.assert_array_equal(np.asarray(g), [[0, 0], [0, 0], [0, 0], [2, 2], [0, 0]])
    dense_grad = ops_embedding.embedding_bag_grad(ml.tensor(np.ones((1, 2), np.float32)),
                                               np.array([0, 2, 2], np.int32),
                                               np.array([0], np.int32), 3)
    np.testing.assert_array_equal(dense_grad.numpy(), [[1, 1], [0, 0], [2, 2]])


@pytest.mark.parametrize("opt_cls,hyper", [(ml.optim.SGD, {"lr": 0.5}),
                                           (ml.optim.Adagrad, {"lr": 0.3, "lr_decay": 0.1}),
                                           (ml.optim.SparseAdam, {"lr": 0.1})])
@pytest.mark.parametrize("layer", ["bag", "embedding"])
def test_a_batch_of_only_empty_bags_steps_without_moving_anything(opt_cls, hyper, layer):
    """Every bag empty (or no ids at all): the gradient is a RowSparse of 0 rows. PyTorch's
    SGD, Adagrad and SparseAdam step (nothing moves, the step still counts); ours used to
    fail reshaping the 0 rows ('cannot reshape array of size 0 into shape (0,newaxis)')."""
    if layer == "bag":
        m = ml.nn.EmbeddingBag(6, 3, mode="sum", sparse=True, rng=0)
        run = lambda: m(np.zeros(0, np.int64), np.array([0, 0, 0]))  # noqa: E731
    else:
        m = ml.nn.Embedding(6, 3, sparse=True, rng=0)
        run = lambda: m(np.zeros((2, 0), np.int32))  # noqa: E731
    opt = opt_cls(m.parameters(), **hyper)
    w0 = m.weight.numpy().copy()
    state0 = {k: v.copy() for k, v in opt.state[0].items()}
    run().sum().backward()
    assert isinstance(m.weight.grad, RowSparse) and m.weight.grad.nnz_rows == 0
    opt.step()
    np.testing.assert_array_equal(m.weight.numpy(), w0)
    for k, v in opt.state[0].items():
        np.testing.assert_array_equal(v, state0[k])
    assert opt.step_count == 1
    if opt_cls is ml.optim.SparseAdam:
        assert opt.param_steps == [1]  # torch's SparseAdam: state["step"] += 1 all the same


def test_sparse_adam_counts_an_empty_step_in_its_bias_correction():
    """A step whose gradient has no rows advances the parameter's step count, as
    ``torch.optim.SparseAdam``'s ``state['step']`` does, so the next step's bias correction
    uses t = 2, not t = 1 (the reference counts every step that had a gradient)."""
    w0 = np.random.default_rng(1).standard_normal((8, 3))
    grads = _grads(2, steps=3)
    grads.insert(1, (np.zeros(0, np.int64), np.zeros((0, 3))))
    hyper = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6)
    got = _sparse_adam_steps(w0, grads, **hyper)
    np.testing.assert_allclose(got, sparse_adam_reference(w0, grads, **hyper), rtol=1e-12)
    skipped = [g for g in grads if len(g[0])]
    assert not np.allclose(got, sparse_adam_reference(w0, skipped, **hyper), rtol=1e-12)


def test_all_empty_batches_train_sparse_as_dense():
    """Adagrad's lr decay counts the empty step on both paths: sparse equals dense."""
    ws = []
    for sparse in (True, False):
        bag = ml.nn.EmbeddingBag(5, 2, mode="mean", sparse=sparse, rng=0)
        opt = ml.optim.Adagrad(bag.parameters(), lr=0.3, lr_decay=0.5)
        for ids, offsets in ((np.array([1, 2], np.int32), [0, 1]), (np.zeros(0, np.int32), [0]),
                             (np.array([2, 4]), [0, 2])):
            opt.zero_grad()
            (bag(ids, np.array(offsets)) ** 2).sum().backward()
            opt.step()
        ws.append(bag.weight.numpy())
    np.testing.assert_allclose(ws[0], ws[1], rtol=1e-6)


@pytest.mark.parametrize("bad", [-1, -5, 5, 7])
def test_dense_embedding_refuses_ids_outside_the_table_eager_traced_and_compiled(bad):
    """PyTorch's nn.Embedding / F.embedding raise on a negative or too large id; the dense path
    went through ``take`` and wrapped -1 round to the last row (4 of 5). Now it raises the
    same ArgumentError as the sparse path, naming the op, the id and the table's rows, when
    the lookup runs: eagerly, in a compiled graph whose ids are an input, and in a compiled
    gradient whose forward lookup is dead code (the gradient checks the ids too)."""
    e = ml.nn.Embedding(5, 2, rng=0)
    ids = np.array([[0, bad], [1, 2]])
    msg = rf"embedding\w*: id {bad} is outside the table's rows \[0, 5\)"
    with pytest.raises(ArgumentError, match=msg):
        e(ids)
    with pytest.raises(ArgumentError, match=msg):
        ml.nn.Embedding(5, 2, rng=0, sparse=True)(ids)  # the sparse path, as before
    with pytest.raises(ArgumentError, match=msg):
        ops_embedding.embedding(e.weight, ids.astype(np.int32))
    fwd = ml.compile(lambda i: e(i) * 2.0, np.zeros((2, 2), np.int64))
    np.testing.assert_array_equal(fwd(np.array([[4, 0], [1, 1]])),
                                  2.0 * e.weight.numpy()[[[4, 0], [1, 1]]])
    with pytest.raises(ArgumentError, match=msg):
        fwd(ids)
    w0 = e.weight.numpy()
    grad = ml.grad(lambda w, i: ops_embedding.embedding(w, i).sum())
    with pytest.raises(ArgumentError, match=msg):
        grad(w0, ids)
    compiled_grad = ml.compile(grad, w0, np.zeros((2, 2), np.int64))
    np.testing.assert_array_equal(compiled_grad(w0, np.array([[4, 0], [4, 4]])),
                                  np.array([[1, 1], [0, 0], [0, 0], [0, 0], [3, 3]]))
    with pytest.raises(ArgumentError, match=msg):
        compiled_grad(w0, ids)


def test_dense_embedding_values_and_gradients_and_take_keeps_numpys_semantics():
    r = np.random.default_rng(0)
    w0 = r.standard_normal((6, 3)).astype(np.float32)
    gout = r.standard_normal((2, 3, 3)).astype(np.float32)
    ids = np.array([[5, 0, 5], [2, 2, 5]])
    for dtype in (np.int32, np.int64, np.uint8):
        w = ml.tensor(w0, requires_grad=True)
        y = ops_embedding.embedding(w, ids.astype(dtype))
        np.testing.assert_array_equal(y.numpy(), w0[ids])
        (y * ml.tensor(gout)).sum().backward()
        want = np.zeros_like(w0)
        np.add.at(want, ids, gout)
        np.testing.assert_array_equal(w.grad.numpy(), want)
    e = ml.nn.Embedding(6, 3, rng=0)
    assert e(np.zeros((0, 4), np.int64)).shape == (0, 4, 3)
    with pytest.raises(DTypeError, match="embedding: ids must be integers"):
        e(np.array([0.5]))
    with pytest.raises(RankError, match="embedding: weight must be 2-D"):
        ops_embedding.embedding(ml.tensor(np.ones(3)), np.array([0]))
    # ops.take is not embedding: it keeps numpy's (and torch.take's) negative indices
    np.testing.assert_array_equal(ml.ops.take(ml.tensor(w0), np.array([-1]), axis=0).numpy(),
                                  w0[[-1]])
