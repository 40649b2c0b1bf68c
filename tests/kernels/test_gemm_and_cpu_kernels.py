"""The GEMM path of the compiled CPU backend and its Numba cross-entropy kernels.

* ``passes.fusion.kernels.gemm_out`` (``out <- beta*c + alpha*(a@b)`` through numpy's own cblas via
  ctypes) against a float64 oracle, on every layout it takes to BLAS and every case it must
  hand to numpy instead (checked with a spy on the BLAS table);
* the ``gemm`` op (shape/dtype inference, reference compute, ``inplace``);
* the ``fuse_gemm_accumulate`` pass: what it folds (into ``gemm``, and a bias update into
  ``sum_accumulate``), with which alpha/beta, and what it leaves;
* ``memory.inplace_pairs(..., overwrites=...)`` and ``Compiled``'s in-place pairs/donations
  into gemm's accumulator;
* ``ml.compile`` / ``ml.compile_train_step`` end to end: in-place parameter updates, eager SGD
  equivalence, bad targets named from the generated code without a rerun;
* ``cross_entropy_out`` / ``cross_entropy_grad_out`` against the registry's numpy reference.
"""

import contextlib
import ctypes

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import nn, ops
from mlsys_lab.engine import cpu_impls as ck
from mlsys_lab.engine import memory
from mlsys_lab.engine.compiler import Compiled
from mlsys_lab.engine.passes import default_pipeline, fuse_gemm_accumulate
from mlsys_lab.engine.passes.fusion import kernels as fk
from mlsys_lab.engine.registry import AVal, Kernel, get
from mlsys_lab.engine.runtime import run_graph
from mlsys_lab.errors import DTypeError, GraphError, OpError, ShapeError
from mlsys_lab.nn.train_step import compile_train_step
from tests.engine.test_compile import _assert_compiled_step_matches_sgd

F32, F64 = np.float32, np.float64


# --- helpers ----------------------------------------------------------------------------------
def _oracle(c, a, b, alpha, beta):
    """float64 ``beta*c + alpha*(a@b)`` and an elementwise bound on a correct result's error."""
    c64, a64, b64 = (np.asarray(x, F64) for x in (c, a, b))
    want = beta * c64 + alpha * (a64 @ b64)
    scale = abs(alpha) * (np.abs(a64) @ np.abs(b64)) + abs(beta) * np.abs(c64)
    return want, scale


def _assert_gemm_close(got, c, a, b, alpha, beta, dtype=None):
    dtype = np.dtype(dtype or got.dtype)
    want, scale = _oracle(c, a, b, alpha, beta)
    eps = np.finfo(dtype).eps
    tol = 4 * eps * (a.shape[1] + 2) * scale + np.finfo(dtype).tiny
    err = np.abs(np.asarray(got, F64) - want)
    assert np.all(err <= tol), f"max error {err.max()} (tolerance {tol.max()})"


def _operand(rng, shape, dtype, transposed):
    """A random (rows, cols) array: C-contiguous, or a transposed (F-contiguous) view."""
    if transposed:
        x = rng.standard_normal(shape[::-1]).astype(dtype).T
        assert x.flags.f_contiguous
        return x
    return rng.standard_normal(shape).astype(dtype)


def _blas_table():
    if not fk._CBLAS:
        fk._CBLAS.append(fk._find_cblas())
    return fk._CBLAS[0]


@contextlib.contextmanager
def _blas_spy():
    """Wrap the cached BLAS functions so each call is recorded (dtype) and still runs."""
    real = _blas_table()
    calls = []

    def wrap(dt, fn):
        def spy(*args):
            calls.append(dt)
            return fn(*args)
        return spy

    fk._CBLAS[0] = {dt: wrap(dt, fn) for dt, fn in real.items()}
    try:
        yield calls
    finally:
        fk._CBLAS[0] = real


def ops_of(graph):
    return [n.op for n in graph.nodes]


def _rand(rng, *shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


# --- 1. gemm_out through BLAS -------------------------------------------------------------------
def test_numpy_blas_is_found_for_float32_and_float64():
    table = fk._find_cblas()
    assert set(table) <= {np.dtype(F32), np.dtype(F64)}
    if not table:
        pytest.skip("numpy's BLAS exposes no cblas_?gemm here; only the numpy route runs")
    assert set(table) == {np.dtype(F32), np.dtype(F64)}
    kernels = get("gemm").impls["cpu"]
    assert [k.name for k in kernels] == ["cblas.sgemm", "cblas.dgemm"]
    assert all(k.out_fn is fk.blas_gemm_out for k in kernels)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40),
       dtype=st.sampled_from([F32, F64]), a_t=st.booleans(), b_t=st.booleans(),
       alpha=st.sampled_from([1.0, -1.0, 0.5, -0.1, 2.5, 0.0]),
       beta=st.sampled_from([-1.0, 0.0, 1.0, 0.75]), inplace=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_gemm_out_matches_float64_oracle(m, k, n, dtype, a_t, b_t, alpha, beta, inplace, seed):
    rng = np.random.default_rng(seed)
    a, b = _operand(rng, (m, k), dtype, a_t), _operand(rng, (k, n), dtype, b_t)
    c = _rand(rng, m, n, dtype=dtype)
    c0 = c.copy()
    with _blas_spy() as calls:
        if inplace:
            out = c
            fk.gemm_out(out, out, a, b, alpha, beta)
        else:
            out = np.full((m, n), np.nan, dtype)
            fk.gemm_out(out, c, a, b, alpha, beta)
            np.testing.assert_array_equal(c, c0)  # c is read, never written
    assert out.dtype == dtype and out.shape == (m, n)
    _assert_gemm_close(out, c0, a, b, alpha, beta)
    if np.dtype(dtype) in _blas_table():  # these layouts all go to BLAS, in one call
        assert calls == [np.dtype(dtype)]


def test_gemm_out_in_place_accumulates_into_c_itself():
    rng = np.random.default_rng(1)
    a, b, c = _rand(rng, 7, 5), _rand(rng, 5, 6), _rand(rng, 7, 6)
    c0, keep = c.copy(), c
    fk.gemm_out(c, c, a.T.copy().T, b, -0.25, 1.0)
    assert c is keep
    _assert_gemm_close(c, c0, a, b, -0.25, 1.0)


def test_gemm_out_zero_inner_dimension_scales_c():
    c = np.arange(6, dtype=F64).reshape(2, 3)
    out = np.full_like(c, np.nan)
    fk.gemm_out(out, c, np.zeros((2, 0)), np.zeros((0, 3)), 3.0, -2.0)
    np.testing.assert_array_equal(out, -2.0 * c)


# --- 2. the numpy route -------------------------------------------------------------------------
def _fallback_cases(rng):
    """(name, out, c, a, b, out dtype) for inputs BLAS must not be given."""
    big_a, big_b = _rand(rng, 6, 10), _rand(rng, 10, 7)
    a, b, c = big_a[:, :5].copy(), big_b[:5].copy(), _rand(rng, 6, 7)
    h = [_rand(rng, 4, 5).astype(np.float16), _rand(rng, 5, 3).astype(np.float16)]
    sq, sq2, buf = _rand(rng, 5, 5), _rand(rng, 5, 5), _rand(rng, 7, 4)
    return [
        ("a strided", np.empty((6, 7), F32), c, big_a[:, ::2], b, F32),
        ("b strided", np.empty((6, 7), F32), c, a, big_b[::2], F32),
        ("float16", np.empty((4, 3), np.float16), _rand(rng, 4, 3).astype(np.float16), *h,
         np.float16),
        ("out F-contiguous", np.empty((7, 6), F32).T, c, a, b, F32),
        ("a float64, out float32", np.empty((6, 7), F32), c, a.astype(F64), b, F32),
        ("out is a", sq, sq.copy(), sq, _rand(rng, 5, 5), F32),
        ("out is b", sq2, _rand(rng, 5, 5), _rand(rng, 5, 5), sq2, F32),
        ("out overlaps c at an offset", buf[:-1], buf[1:], _rand(rng, 6, 3), _rand(rng, 3, 4),
         F32),
    ]


def test_gemm_out_hands_what_blas_cannot_take_to_numpy(monkeypatch):
    calls = []

    def boom(*args):
        calls.append(args)

    monkeypatch.setattr(fk, "_CBLAS", [{np.dtype(F32): boom, np.dtype(F64): boom}])
    rng = np.random.default_rng(2)
    for name, out, c, a, b, dt in _fallback_cases(rng):
        want = [x.copy() for x in (c, a, b)]  # operands as they were before out is written
        fk.gemm_out(out, c, a, b, 0.7, -1.0)
        assert not calls, f"{name}: sent to BLAS"
        assert out.dtype == dt
        _assert_gemm_close(out, *want, 0.7, -1.0, dtype=dt)
    # the spy does see contiguous inputs, so the silence above is meaningful
    fk.gemm_out(np.empty((2, 2), F32), np.ones((2, 2), F32), np.ones((2, 3), F32),
                np.ones((3, 2), F32), 1.0, 1.0)
    assert len(calls) == 1


@pytest.mark.parametrize("dtype", [F32, F64])
def test_gemm_out_without_blas_gives_the_same_results(monkeypatch, dtype):
    monkeypatch.setattr(fk, "_CBLAS", [{}])
    rng = np.random.default_rng(3)
    a, b, c = _rand(rng, 9, 4, dtype=dtype), _rand(rng, 6, 4, dtype=dtype).T, \
        _rand(rng, 9, 6, dtype=dtype)
    out = np.empty_like(c)
    fk.gemm_out(out, c, a, b, -0.5, 1.0)
    _assert_gemm_close(out, c, a, b, -0.5, 1.0)
    c0 = c.copy()
    fk.gemm_out(c, c, a, b, 2.0, -1.0)
    _assert_gemm_close(c, c0, a, b, 2.0, -1.0)


def test_blas_lookup_is_cached_and_a_missing_library_means_numpy(monkeypatch):
    found = []
    real = fk._find_cblas

    def counting():
        found.append(1)
        return real()

    monkeypatch.setattr(fk, "_CBLAS", [])
    monkeypatch.setattr(fk, "_find_cblas", counting)
    a = np.ones((2, 2), F64)
    for _ in range(3):
        fk.gemm_out(np.empty((2, 2)), a, a, a, 1.0, 1.0)
    assert len(found) == 1 and len(fk._CBLAS) == 1

    def no_library(*args, **kwargs):
        raise OSError("cannot open")

    monkeypatch.setattr(ctypes, "CDLL", no_library)
    assert real() == {}


@pytest.mark.parametrize("view", ["transpose", "broadcast row"])
def test_gemm_out_c_aliasing_out_through_another_view(view):
    rng = np.random.default_rng(4)
    a, b = _rand(rng, 4, 3), _rand(rng, 3, 4)
    out = _rand(rng, 4, 4)
    c = out.T if view == "transpose" else np.broadcast_to(out[0], out.shape)
    c0 = c.copy()
    fk.gemm_out(out, c, a, b, 0.5, 2.0)
    _assert_gemm_close(out, c0, a, b, 0.5, 2.0)


# --- 3. the gemm op -----------------------------------------------------------------------------
def test_gemm_op_infers_shapes_and_dtypes_and_names_itself():
    op = get("gemm")
    assert op.inplace == (0,) and op.vjp is None and not op.elementwise
    f32 = np.dtype(F32)
    y = op.infer(AVal((3, 5), f32), AVal((3, 4), f32), AVal((4, 5), f32), alpha=2.0, beta=0.0)
    assert tuple(y.shape) == (3, 5) and y.dtype == f32
    for shapes in [((3, 6), (3, 4), (4, 5)), ((5,), (3, 4), (4, 5)),
                   ((2, 3, 5), (2, 3, 4), (2, 4, 5))]:
        with pytest.raises(ShapeError, match="gemm") as e:
            op.infer(*(AVal(s, f32) for s in shapes))
        for s in shapes:
            assert str(s) in str(e.value)
    for dts in [(F64, F32, F32), (np.int32, np.int32, np.int32)]:
        with pytest.raises(DTypeError, match="gemm") as e:
            op.infer(*(AVal(s, np.dtype(d)) for s, d in zip([(3, 5), (3, 4), (4, 5)], dts)))
        assert np.dtype(dts[0]).name in str(e.value)


def test_gemm_op_inner_dimension_error_names_gemm():
    f32 = np.dtype(F32)
    with pytest.raises(ShapeError, match="gemm"):
        get("gemm").infer(AVal((3, 5), f32), AVal((3, 4), f32), AVal((6, 5), f32))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_gemm_op_compute_matches_oracle(dtype):
    rng = np.random.default_rng(5)
    a, b, c = _rand(rng, 6, 4, dtype=dtype), _rand(rng, 4, 3, dtype=dtype), \
        _rand(rng, 6, 3, dtype=dtype)
    c0 = c.copy()
    y = get("gemm").compute(c, a, b, alpha=-0.3, beta=-1.0)
    assert y.dtype == dtype and y.shape == (6, 3)
    _assert_gemm_close(y, c0, a, b, -0.3, -1.0)
    np.testing.assert_array_equal(c, c0)


# --- 4. fuse_gemm_accumulate ------------------------------------------------------------------
M, K, N = 6, 5, 4


def _gemm_args(rng, transposed_a=False):
    a = _rand(rng, K, M) if transposed_a else _rand(rng, M, K)
    return _rand(rng, M, N), a, _rand(rng, K, N)


FOLDS = [
    ("c - 0.1*(a@b)", lambda c, a, b: c - 0.1 * (a @ b), False, -0.1, 1.0),
    ("c + a@b", lambda c, a, b: c + a @ b, False, 1.0, 1.0),
    ("a@b + c", lambda c, a, b: a @ b + c, False, 1.0, 1.0),
    ("(a@b)*0.5 - c", lambda c, a, b: (a @ b) * 0.5 - c, False, 0.5, -1.0),
    ("c + 2.5*(a@b)", lambda c, a, b: c + 2.5 * (a @ b), False, 2.5, 1.0),
    ("c - a.T@b", lambda c, a, b: c - ops.transpose(a) @ b, True, -1.0, 1.0),
]


@pytest.mark.parametrize("name, f, transposed_a, alpha, beta", FOLDS, ids=[x[0] for x in FOLDS])
def test_fuse_gemm_accumulate_folds_into_one_gemm(name, f, transposed_a, alpha, beta):
    rng = np.random.default_rng(6)
    args = _gemm_args(rng, transposed_a)
    g = ml.trace(f, *args)
    before = str(g)
    h = fuse_gemm_accumulate(g)
    assert str(g) == before  # pure: the input graph is untouched
    h.lint()
    assert ops_of(h).count("gemm") == 1 and "matmul" not in ops_of(h)
    assert not {"add", "sub", "mul"} & set(ops_of(h))
    (gemm,) = [n for n in h.nodes if n.op == "gemm"]
    assert gemm.attrs["alpha"] == pytest.approx(alpha, rel=1e-6)
    assert gemm.attrs["beta"] == beta
    assert gemm.inputs[0] is h.inputs[0]  # c is the accumulator
    assert gemm.output is h.outputs[0]
    if transposed_a:
        assert gemm.inputs[1].producer.op == "transpose"
    else:
        assert gemm.inputs[1] is h.inputs[1] and gemm.inputs[2] is h.inputs[2]
    (want,), (got,) = run_graph(g, *args), run_graph(h, *args)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(h(*args).numpy()), want, rtol=1e-5, atol=1e-5)


def _product_is_an_output(c, a, b):
    p = a @ b
    return c + p, p


def _product_used_twice(c, a, b):
    p = a @ b
    return (c + p) * p


def _scaled_product_is_an_output(c, a, b):
    q = 0.5 * (a @ b)
    return c - q, q


def _product_under_a_scale_is_an_output(c, a, b):
    p = a @ b
    return c - 0.5 * p, p


def _product_under_a_scale_used_twice(c, a, b):
    p = a @ b
    return (c - 0.5 * p) * p


NO_FOLDS = [
    ("product is an output", _product_is_an_output, None),
    ("product used twice", _product_used_twice, None),
    ("scaled product is an output", _scaled_product_is_an_output, None),
    ("product under a scale is an output", _product_under_a_scale_is_an_output, None),
    ("product under a scale used twice", _product_under_a_scale_used_twice, None),
    ("c broadcasts", lambda c, a, b: c[0] + a @ b, None),
    ("traced scale", lambda c, a, b, s: c - s * (a @ b), np.float32(0.3)),
    ("batched product", lambda c, a, b: ops.reshape(c, (1, M, N)) + ops.reshape(a, (1, M, K))
     @ ops.reshape(b, (1, K, N)), None),
]


@pytest.mark.parametrize("name, f, extra", NO_FOLDS, ids=[x[0] for x in NO_FOLDS])
def test_fuse_gemm_accumulate_leaves_what_it_must_not_fold(name, f, extra):
    rng = np.random.default_rng(7)
    args = (*_gemm_args(rng), *([] if extra is None else [extra]))
    g = ml.trace(f, *args)
    before = str(g)
    h = fuse_gemm_accumulate(g)
    assert str(g) == before
    assert "gemm" not in ops_of(h) and "matmul" in ops_of(h)
    assert str(h) == before
    for w, o in zip(run_graph(g, *args), run_graph(h, *args), strict=True):
        np.testing.assert_array_equal(o, w)


def test_fuse_gemm_accumulate_is_in_the_default_pipeline():
    assert fuse_gemm_accumulate in default_pipeline()


# --- 7. in-place pairs with overwrites (fake scheduled graphs, as in test_memory) ---------------
class V:
    def __init__(self, name, shape=(4, 4)):
        self.name, self.shape, self.dtype = name, shape, np.dtype(F32)

    def __repr__(self):
        return self.name


class _N:
    def __init__(self, op, inputs, outputs):
        self.op, self.inputs, self.outputs = op, inputs, outputs


class _G:
    def __init__(self, inputs, outputs, nodes):
        self.inputs, self.outputs, self.nodes, self.consts = inputs, outputs, nodes, {}


def _gemm_graph(a_is_c=False, c_read_later=False):
    """x, w inputs; c = exp(x); y = gemm(c, c or w, w) [; z = neg(c)]; outputs y [, z]."""
    x, w, c, y, z = V("x"), V("w"), V("c"), V("y"), V("z")
    nodes = [_N("exp", [x], [c]), _N("gemm", [c, c if a_is_c else w, w], [y])]
    outs = [y]
    if c_read_later:
        nodes.append(_N("neg", [c], [z]))
        outs.append(z)
    return _G([x, w], outs, nodes), c, y


def test_inplace_pairs_overwrite_a_dying_accumulator():
    graph, c, y = _gemm_graph()
    assert memory.inplace_pairs(graph, overwrites={"gemm": (0,)}) == [(y, c)]
    assert memory.inplace_pairs(graph) == []  # gemm is not elementwise
    assert memory.inplace_pairs(graph, overwrites={"gemm": (1,)}) == []  # w is an input
    lts = memory.lifetimes(graph, include_inputs=False)
    p = memory.plan(lts, "best", inplace=[(y, c)])
    assert p.offsets[y] == p.offsets[c] and memory.verify(p, lts)


@pytest.mark.parametrize("a_is_c, c_read_later", [(True, False), (False, True)])
def test_inplace_pairs_never_overwrite_an_accumulator_still_read(a_is_c, c_read_later):
    graph, c, y = _gemm_graph(a_is_c, c_read_later)
    pairs = memory.inplace_pairs(graph, overwrites={"gemm": (0,)})
    assert all(o is not y for o, _ in pairs)
    if c_read_later:
        assert pairs == [(graph.outputs[1], c)]  # the last reader, neg, may take c over


# --- 5. ml.compile end to end -------------------------------------------------------------------
def _residual(x, u, w):
    h = ops.tanh(x @ u)
    return h + x @ w


def test_compiled_residual_accumulates_into_the_dying_intermediate():
    rng = np.random.default_rng(8)
    x, u, w = _rand(rng, 7, 5), _rand(rng, 5, 6), _rand(rng, 5, 6)
    want = np.tanh(x.astype(F64) @ u) + x.astype(F64) @ w
    default = ml.compile(_residual, x, u, w)
    fused = Compiled(_residual, x, u, w, passes=[fuse_gemm_accumulate])
    (gemm,) = [n for n in fused.graph.nodes if n.op == "gemm"]
    assert (gemm.output, gemm.inputs[0]) in fused.plan.inplace
    assert fused.plan.offsets[gemm.output] == fused.plan.offsets[gemm.inputs[0]]
    for c in (default, fused):
        for profile in (True, False):
            for _ in range(2):  # the arena is reused across calls
                np.testing.assert_allclose(c(x, u, w, profile=profile), want, rtol=1e-5,
                                           atol=1e-5)


def test_compiled_gemm_reading_its_accumulator_through_a_view_is_not_in_place():
    def f(x, u, w):
        h = ops.tanh(x @ u)
        return h - 0.5 * (ops.transpose(h) @ w)

    rng = np.random.default_rng(9)
    x, u, w = _rand(rng, 6, 3), _rand(rng, 3, 6), _rand(rng, 6, 6)
    c = Compiled(f, x, u, w, passes=[fuse_gemm_accumulate])
    (gemm,) = [n for n in c.graph.nodes if n.op == "gemm"]
    assert all(o is not gemm.output for o, _ in c.plan.inplace)
    h = np.tanh(x.astype(F64) @ u)
    np.testing.assert_allclose(c(x, u, w, profile=False), h - 0.5 * (h.T @ w), rtol=1e-5,
                               atol=1e-5)


def test_compiled_sgd_update_is_one_gemm_written_into_the_donated_weight():
    rng = np.random.default_rng(10)
    w, x, g = _rand(rng, 5, 3), _rand(rng, 8, 5), _rand(rng, 8, 3)
    lr = 0.05

    def update(w, x, g):
        return w - lr * (x.T @ g)

    c = ml.compile(update, w, x, g, donate=[(0, 0)])
    assert ops_of(c.graph).count("gemm") == 1 and "matmul" not in ops_of(c.graph)
    assert c.donated == {c.graph.outputs[0]: c.graph.inputs[0]}
    for profile in (False, True):
        w0 = w.copy()
        want = w0.astype(F64) - np.float32(lr) * (x.astype(F64).T @ g)
        got = c(w, x, g, profile=profile)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(w, want, rtol=1e-5, atol=1e-6)  # updated in place
        assert not np.shares_memory(got, w)  # without out=, a fresh copy is returned
    w0 = w.copy()
    assert c(w, x, g, out=[w]) is w
    np.testing.assert_allclose(w, w0 - np.float32(lr) * (x.T @ g), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["accumulator read as an operand", "read after the update"])
def test_compiled_gemm_does_not_take_a_donation_it_would_corrupt(case):
    rng = np.random.default_rng(11)
    w, g = _rand(rng, 4, 4), _rand(rng, 4, 4)
    if case == "accumulator read as an operand":
        def f(w, g):
            return w - 0.5 * (w.T @ g)
        want = (w - 0.5 * (w.T @ g),)
    else:
        def f(w, g):
            return w - 0.5 * (g @ g), w * 2.0
        want = (w - 0.5 * (g @ g), w * 2.0)
    c = ml.compile(f, w, g, donate=[(0, 0)])
    assert "gemm" in ops_of(c.graph) and c.donated == {}
    w0 = w.copy()
    got = c(w, g, profile=False)
    got = got if isinstance(got, tuple) else (got,)
    np.testing.assert_array_equal(w, w0)
    for o, e in zip(got, want, strict=True):
        np.testing.assert_allclose(o, e, rtol=1e-5, atol=1e-5)


def test_donated_input_returned_as_a_view_keeps_its_old_value():
    rng = np.random.default_rng(12)
    w, x, g = _rand(rng, 5, 3), _rand(rng, 4, 5), _rand(rng, 4, 3)

    def f(w, x, g):
        wt = ops.transpose(w)
        return w - 0.1 * (x.T @ g), wt

    w0 = w.copy()
    c = ml.compile(f, w, x, g, donate=[(0, 0)])
    _, wt = c(w, x, g)
    np.testing.assert_array_equal(wt, w0.T)


def test_call_flat_checks_the_number_of_inputs():
    a = np.ones((2, 2), F32)
    c = ml.compile(lambda c, a, b: c + 0.5 * (a @ b), a, a, a)
    with pytest.raises(GraphError, match="expects 3 inputs, got 2"):
        c.call_flat([a, a])
    res = c.call_flat([a, a, a])  # the flat list of outputs
    assert isinstance(res, list) and len(res) == 1
    np.testing.assert_allclose(res[0], a + 0.5 * (a @ a))


def _mlp():
    return nn.Sequential(nn.Linear(10, 12, rng=0), nn.ReLU(), nn.Linear(12, 8, rng=1),
                         nn.ReLU(), nn.Linear(8, 4, rng=2))


def _batch(seed=13):
    rng = np.random.default_rng(seed)
    return _rand(rng, 32, 10), rng.integers(0, 4, 32)


def test_compiled_train_step_updates_parameters_in_place_with_gemms():
    x, y = _batch()
    model, eager = _mlp(), _mlp()
    step = compile_train_step(model, ops.cross_entropy, x, y, lr=0.1)
    graph = step.compiled.graph
    assert ops_of(graph).count("gemm") == 3  # one per Linear weight
    position = {id(v): i for i, v in enumerate(graph.inputs)}
    accumulators = {step._names[position[id(n.inputs[0])]] for n in graph.nodes
                    if n.op == "gemm"}
    assert accumulators == {n for n, _ in model.named_parameters() if n.endswith("weight")}
    # every parameter's buffer is donated: each gemm writes its weight, not a temporary
    assert len(step.compiled.donated) == len(step._names)
    assert all(step.compiled.donated.get(n.output) is n.inputs[0] for n in graph.nodes
               if n.op == "gemm")
    arrays = [p.data for p in model.parameters()]
    opt = ml.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(2):
        loss = step(x, y)
        ref = ops.cross_entropy(eager(ml.tensor(x)), ml.tensor(y))
        opt.zero_grad()
        ref.backward()
        opt.step()
        assert loss == pytest.approx(ref.item(), rel=1e-5)
    for p, arr, q in zip(model.parameters(), arrays, eager.parameters(), strict=True):
        assert p.data is arr  # the same ndarray, written in place
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)
    assert any(not np.array_equal(p.numpy(), q.numpy())
               for p, q in zip(model.parameters(), _mlp().parameters()))


def test_compiled_train_step_with_gemm_matches_eager_sgd():
    x, y = _batch(14)
    _assert_compiled_step_matches_sgd(_mlp, x, y, lr=0.1, steps=4, loss_rel=1e-5, rtol=1e-5,
                                      atol=1e-6)


# --- 6. bad targets in a compiled training step -----------------------------------------------
@pytest.mark.parametrize("profile", [False, True])
@pytest.mark.parametrize("bad", [4, 100, -1])
def test_bad_target_raises_names_the_node_and_leaves_parameters(profile, bad):
    x, y = _batch(15)
    model = _mlp()
    step = compile_train_step(model, ops.cross_entropy, x, y, lr=0.1)
    before = [p.numpy().copy() for p in model.parameters()]
    yb = y.copy()
    yb[7] = bad
    (ce,) = [n for n in step.compiled.graph.nodes if n.op == "cross_entropy"]
    with pytest.raises(OpError) as e:
        step(x, yb, profile=profile)
    msg = str(e.value)
    assert "cross_entropy" in msg and "while running node" in msg
    assert f"#{ce.id} cross_entropy" in msg and "[0, 4)" in msg
    for p, b in zip(model.parameters(), before, strict=True):
        np.testing.assert_array_equal(p.numpy(), b)
    # the compiled step still works afterwards
    eager = _mlp()
    step(x, y)
    opt = ml.optim.SGD(eager.parameters(), lr=0.1)
    ops.cross_entropy(eager(ml.tensor(x)), ml.tensor(y)).backward()
    opt.step()
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-5, atol=1e-6)


def test_error_in_generated_code_is_named_without_rerunning(monkeypatch):
    """An update applied before the failing node runs exactly once: no rerun to find it."""
    calls = []
    sgemm, *others = get("gemm").impls["cpu"]  # the operands below are float32

    def counting(*args, **kwargs):
        calls.append(1)
        return sgemm.out_fn(*args, **kwargs)

    monkeypatch.setitem(get("gemm").impls, "cpu",
                        [Kernel(sgemm.name, counting, sgemm.accepts), *others])

    def f(w, x, g, logits, t):
        return w - 0.5 * (x.T @ g), ops.cross_entropy(logits, t)

    rng = np.random.default_rng(16)
    w, x, g, logits = _rand(rng, 3, 2), _rand(rng, 4, 3), _rand(rng, 4, 2), _rand(rng, 5, 3)
    t = np.array([0, 1, 2, 1, 0])
    c = ml.compile(f, w, x, g, logits, t, donate=[(0, 0)])
    assert ops_of(c.graph).index("gemm") < ops_of(c.graph).index("cross_entropy")
    assert c.donated
    w0 = w.copy()
    with pytest.raises(OpError, match="while running node #\\d+ cross_entropy"):
        c(w, x, g, logits, np.array([0, 1, 3, 1, 0]), profile=False)
    assert len(calls) == 1
    np.testing.assert_allclose(w, w0 - 0.5 * (x.T @ g), rtol=1e-5, atol=1e-6)


# --- 8. the Numba cross-entropy kernels ---------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("tdtype", [np.int32, np.int64])
@pytest.mark.parametrize("n, c, scale", [(1, 1, 1.0), (9, 5, 1.0), (33, 17, 30.0)])
def test_cross_entropy_kernels_match_the_numpy_reference(dtype, tdtype, n, c, scale):
    rng = np.random.default_rng(n * c)
    x = (rng.standard_normal((n, c)) * scale).astype(dtype)
    t = rng.integers(0, c, n).astype(tdtype)
    x0, t0 = x.copy(), t.copy()
    rtol = 1e-5 if dtype == F32 else 1e-12
    loss = np.full((), np.nan, dtype)
    ck.cross_entropy_out(loss, x, t)
    want = get("cross_entropy").compute(x.astype(F64), t)
    np.testing.assert_allclose(loss, want, rtol=rtol, atol=rtol)
    np.testing.assert_allclose(loss, get("cross_entropy").compute(x, t), rtol=rtol, atol=rtol)
    grad = np.full((n, c), np.nan, dtype)
    ck.cross_entropy_grad_out(grad, x, t)
    want = get("cross_entropy_grad").compute(x.astype(F64), t)
    np.testing.assert_allclose(grad, want, rtol=rtol, atol=rtol / n)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(t, t0)


def test_cross_entropy_kernels_are_the_cpu_kernels_of_their_ops():
    for op, fn in (("cross_entropy", ck.cross_entropy_out),
                   ("cross_entropy_grad", ck.cross_entropy_grad_out)):
        (kernel,) = get(op).impls["cpu"]
        assert kernel.name == f"numba.{op}" and kernel.out_fn is fn


@pytest.mark.parametrize("row", [0, 2, 3])
@pytest.mark.parametrize("bad", [-1, 3, 1000])
def test_cross_entropy_kernels_reject_bad_targets(bad, row):
    x = np.zeros((4, 3), F32)
    t = np.array([0, 2, 1, 1])
    t[row] = bad
    with pytest.raises(OpError, match=r"^cross_entropy: targets must lie in \[0, 3\)"):
        ck.cross_entropy_out(np.zeros((), F32), x, t)
    with pytest.raises(OpError, match=r"^cross_entropy_grad: targets must lie in \[0, 3\)"):
        ck.cross_entropy_grad_out(np.zeros((4, 3), F32), x, t)


# --- 9. the Numba relu kernels keep numpy's semantics, NaN and inf included --------------------
def test_relu_kernels_match_numpy_on_special_values():
    rng = np.random.default_rng(21)
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.5], F32)
    g = rng.choice(special, size=(6, 7)).astype(F32)
    x = rng.choice(special, size=(6, 7)).astype(F32)
    out = np.empty_like(g)
    ck.relu_grad_out(out, g, x)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, np.where(x > 0, g, F32(0)))
    a, w = rng.standard_normal((6, 3)).astype(F32), rng.standard_normal((3, 7)).astype(F32)
    b = rng.choice(special, size=7).astype(F32)
    fk.fused_linear_relu_out(out, a, w, b, activation="relu")
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out, np.maximum(a @ w + b, 0))


# --- 10. the bias update: c +- s * x.sum(axis=0) as one sum_accumulate -------------------------
@pytest.mark.parametrize("f, alpha, beta", [
    (lambda c, x: c - 0.1 * ops.sum(x, 0), -0.1, 1.0),
    (lambda c, x: c + ops.sum(x, 0) * 0.5, 0.5, 1.0),
    (lambda c, x: ops.sum(x, 0) - c, 1.0, -1.0),
])
def test_fuse_gemm_accumulate_folds_a_bias_update(f, alpha, beta):
    rng = np.random.default_rng(31)
    c, x = _rand(rng, 7), _rand(rng, 5, 7)
    g = ml.trace(f, c, x)
    h = fuse_gemm_accumulate(g)
    assert ops_of(h) == ["sum_accumulate"]
    (node,) = h.nodes
    assert node.attrs["alpha"] == pytest.approx(alpha, rel=1e-6) and node.attrs["beta"] == beta
    (want,), (got,) = run_graph(g, c, x), run_graph(h, c, x)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    out = np.empty_like(c)
    fk.sum_accumulate_out(out, c, x, **node.attrs)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("f, shapes", [
    (lambda c, x: c - 0.1 * ops.sum(x, 1), ((5,), (5, 7))),          # rows, not columns
    (lambda c, x: c - 0.1 * ops.sum(x, 0, True), ((1, 7), (5, 7))),  # keepdims
    (lambda c, x: c - 0.1 * ops.sum(x, 0), ((4, 7), (3, 4, 7))),     # 3-D input
    (lambda c, x: c - 0.1 * ops.sum(x, 0), ((5, 7), (5, 7))),        # c broadcasts the sum
])
def test_fuse_gemm_accumulate_leaves_other_sums(f, shapes):
    rng = np.random.default_rng(32)
    args = [_rand(rng, *s) for s in shapes]
    h = fuse_gemm_accumulate(ml.trace(f, *args))
    assert "sum_accumulate" not in ops_of(h) and "sum" in ops_of(h)


@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "in place"])
def test_sum_accumulate_kernel_matches_float64_oracle(dtype, layout):
    rng = np.random.default_rng(33)
    c, x = _rand(rng, 9, dtype=dtype), _rand(rng, 40, 18, dtype=dtype)
    if layout == "strided":
        x = x[::2, ::2]
    else:
        x = x[:, :9].copy()
    want = 0.75 * c.astype(F64) - 0.3 * x.astype(F64).sum(axis=0)
    out = c if layout == "in place" else np.full_like(c, np.nan)
    fk.sum_accumulate_out(out, c, x, alpha=-0.3, beta=0.75)
    tol = 1e-5 if dtype == F32 else 1e-12
    np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


def test_sum_accumulate_op_checks_shapes_and_dtypes():
    op = get("sum_accumulate")
    f32 = np.dtype(F32)
    assert op.inplace == (0,)
    with pytest.raises(ShapeError, match=r"sum_accumulate.*\(6,\).*\(5, 7\)"):
        op.infer(AVal((6,), f32), AVal((5, 7), f32))
    with pytest.raises(DTypeError, match="sum_accumulate"):
        op.infer(AVal((7,), np.dtype(F64)), AVal((5, 7), f32))


def test_compiled_train_step_folds_every_sgd_update():
    model, (x, y) = _mlp(), _batch()
    step = ml.compile_train_step(model, ops.cross_entropy, x, y, lr=0.1)
    used = ops_of(step.compiled.graph)
    assert used.count("gemm") == 3 and used.count("sum_accumulate") == 3
    assert not {"sub", "fused_elementwise"} & set(used)  # nothing of the update is left over
    assert len(step.compiled.donated) == 6               # every parameter updated in place
