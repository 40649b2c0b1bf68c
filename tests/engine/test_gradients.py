"""Functions composed of several ops against float64 central differences (first and second
order), and the agreement of the tape, the functional API, the graph transform and forward mode;
gradient rules of autodiff itself (accumulation, casts, cond, refusals). Each op's own gradients
are checked in ``tests/conformance.py`` (``tests/engine/test_conformance.py``)."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops

from ..gradcheck import noncontiguous, numeric_vjp, tape_vjp

R = np.random.default_rng(0)


def rnd(*shape):
    return R.standard_normal(shape)


# Every registered op's gradients (tape, ml.grad, vjp, the graph transform, compiled; forward
# mode; second order by grad of grad, the tape and ml.hvp) are checked case by case in
# tests/conformance.py. Here: functions built from several ops, which have no spec there.
# name, function, input makers, differentiable input positions, smooth (second order checked)
SPECS = [
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b), lambda: [rnd(3, 5), rnd(5), rnd(5)],
     (0, 1, 2), True),
    ("softmax_cross_entropy_chain",
     lambda a, w: ops.cross_entropy(ops.tanh(a @ w), ml.tensor(np.array([1, 0, 3]))),
     lambda: [rnd(3, 4), rnd(4, 4)], (0, 1), True),
]
IDS = [s[0] for s in SPECS]


def _inputs(make, layout):
    xs = make()
    return [noncontiguous(x) for x in xs] if layout == "strided" else xs


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_vjp_matches_central_differences(spec, layout):
    name, fn, make, diff, _ = spec
    xs = _inputs(make, layout)
    y = np.asarray(fn(*[ml.tensor(x) for x in xs]))
    u = R.standard_normal(y.shape)
    got = tape_vjp(fn, xs, u, diff)
    want = numeric_vjp(fn, [np.ascontiguousarray(x) for x in xs], u, diff)
    for i, g, w in zip(diff, got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name}: gradient of input {i} is wrong")


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_functional_and_graph_transform_agree_with_tape(spec):
    name, fn, make, diff, _ = spec
    xs = make()
    u = R.standard_normal(np.shape(np.asarray(fn(*[ml.tensor(x) for x in xs]))))

    def scalar(*args):
        return (fn(*args) * u).sum()

    tape = tape_vjp(fn, xs, u, diff)
    functional = ml.grad(scalar, argnums=tuple(diff))(*xs)
    graph = ml.trace(scalar, *xs)
    gg = ml.grad_graph(graph, wrt=diff).lint()
    value, *transform = gg(*xs)
    np.testing.assert_allclose(float(value), float(scalar(*[ml.tensor(x) for x in xs])),
                               rtol=1e-10)
    for t, f, g in zip(tape, functional, transform):
        np.testing.assert_allclose(np.asarray(f), t, rtol=1e-9, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(np.asarray(g), t, rtol=1e-9, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("spec", SPECS, ids=IDS)
def test_jvp_is_the_transpose_of_vjp(spec):
    """<J v, u> == <v, J^T u> for random v, u."""
    name, fn, make, diff, _ = spec
    xs = make()
    vs = [R.standard_normal(x.shape) if i in diff else np.zeros(x.shape)
          for i, x in enumerate(xs)]

    def only_diff(*d):
        full = list(xs)
        for i, a in zip(diff, d):
            full[i] = a
        return fn(*[a if isinstance(a, ml.Tensor) else ml.tensor(a) for a in full])

    y, jv = ml.jvp(only_diff, [xs[i] for i in diff], [vs[i] for i in diff])
    u = R.standard_normal(y.shape)
    jtu = tape_vjp(fn, xs, u, diff)
    lhs = float(np.sum(np.asarray(jv) * u))
    rhs = sum(float(np.sum(vs[i] * g)) for i, g in zip(diff, jtu))
    assert lhs == pytest.approx(rhs, rel=1e-8, abs=1e-10), name


@pytest.mark.parametrize("spec", [s for s in SPECS if s[4]], ids=[s[0] for s in SPECS if s[4]])
def test_second_order_matches_central_differences_of_the_gradient(spec):
    """H v by grad-of-grad and by jvp-of-grad equals a central difference of the gradient."""
    name, fn, make, diff, _ = spec
    xs = make()
    u = R.standard_normal(np.shape(np.asarray(fn(*[ml.tensor(x) for x in xs]))))
    v = [R.standard_normal(xs[i].shape) for i in diff]

    def scalar(*d):
        full = list(xs)
        for i, a in zip(diff, d):
            full[i] = a
        return (fn(*[a if isinstance(a, ml.Tensor) else ml.tensor(a) for a in full]) * u).sum()

    g = ml.grad(scalar, argnums=tuple(range(len(diff))))

    def gv(*d):
        return sum((gi * vi).sum() for gi, vi in zip(g(*d), v))

    hv_rev = ml.grad(gv, argnums=tuple(range(len(diff))))(*[xs[i] for i in diff])
    hv_fwd = ml.hvp(scalar, [xs[i] for i in diff], v)
    eps = 1e-5
    plus = g(*[xs[i] + eps * vi for i, vi in zip(diff, v)])
    minus = g(*[xs[i] - eps * vi for i, vi in zip(diff, v)])
    for k, (a, b, p, m) in enumerate(zip(hv_rev, hv_fwd, plus, minus)):
        want = (np.asarray(p) - np.asarray(m)) / (2 * eps)
        np.testing.assert_allclose(np.asarray(a), want, rtol=1e-4, atol=1e-6,
                                   err_msg=f"{name}: H v (reverse over reverse), input {k}")
        np.testing.assert_allclose(np.asarray(b), want, rtol=1e-4, atol=1e-6,
                                   err_msg=f"{name}: H v (forward over reverse), input {k}")


def test_cond_gradients_eager_and_traced_agree():
    def f(x, flag):
        return ops.cond(flag, lambda a: (a * a).sum(), lambda a: ops.sin(a).sum(), x)

    x = R.standard_normal(4)
    for flag in (True, False):
        eager = ml.grad(f)(x, np.array(flag))
        g = ml.grad_graph(ml.trace(f, x, np.array(flag)), wrt=[0])
        _, traced = g(x, np.array(flag))
        want = 2 * x if flag else np.cos(x)
        np.testing.assert_allclose(np.asarray(eager), want, rtol=1e-12)
        np.testing.assert_allclose(np.asarray(traced), want, rtol=1e-12)


def test_gradient_accumulates_for_reused_values():
    a = ml.tensor([1.0, 2.0], requires_grad=True)
    (a + a + a * a).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), [4.0, 6.0])
    (a * 3).sum().backward()  # .grad accumulates across backward calls, like PyTorch
    np.testing.assert_allclose(a.grad.numpy(), [7.0, 9.0])


def test_cast_gradient_casts_back():
    x = ml.tensor(np.array([0.5, -1.25, 2.0]), requires_grad=True)  # float64
    w = np.array([1.5, 2.0, -3.0], np.float32)
    (ops.cast(x, "float32") * ml.tensor(w)).sum().backward()
    assert x.grad.dtype == np.float64
    np.testing.assert_array_equal(x.grad.numpy(), w.astype(np.float64))
    _, t = ml.jvp(lambda a: ops.cast(a, "float32") * 2.0, [x.numpy()], [np.ones(3)])
    assert t.dtype == np.float32 and np.all(t.numpy() == 2.0)


def test_float32_gradients_keep_dtype():
    x = ml.tensor(np.ones((2, 3), np.float32), requires_grad=True)
    w = ml.tensor(np.ones((3, 1), np.float64), requires_grad=True)
    (ops.cast(x, "float64") @ w).sum().backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float64


def test_hessian_of_a_quadratic_is_exact():
    A = np.array([[2.0, 1.0], [1.0, 3.0]])

    def f(x):
        return 0.5 * (ml.tensor(A) @ ops.reshape(x, (2, 1)) * ops.reshape(x, (2, 1))).sum()

    for e in np.eye(2):
        np.testing.assert_allclose(np.asarray(ml.hvp(f, [np.zeros(2)], [e])[0]), A @ e)


def test_grad_graph_refuses_an_op_without_gradient_rule():
    """A fused backend op has no VJP: differentiating through it must raise, not give zeros."""
    from mlsys_lab.engine.passes import default_pipeline, run_pipeline

    x, w = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32)
    g = ml.trace(lambda x, w: ml.ops.sum(ml.ops.tanh(x @ w) * 2.0 + 1.0), x, w)
    fused = run_pipeline(g, default_pipeline()).graph
    assert "fused_elementwise" in [n.op for n in fused.nodes]
    with pytest.raises(ml.GraphError, match="no gradient rule"):
        ml.grad_graph(fused)
    # sign is flat: its rule contributes nothing, so the gradient through it is exactly zero
    _, gx = ml.grad_graph(ml.trace(lambda x: ml.ops.sum(ml.ops.sign(x) * x), x))(x)
    np.testing.assert_array_equal(np.asarray(gx), np.ones_like(x))
