"""Every differentiable op against float64 central differences (first and second order), and
the agreement of the tape, the functional API, the graph transform and forward mode."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops

from ..gradcheck import noncontiguous, numeric_vjp, tape_vjp

R = np.random.default_rng(0)


def rnd(*shape):
    return R.standard_normal(shape)


def pos(*shape):
    return R.uniform(0.5, 2.0, shape)


def away(*shape):  # values away from the kinks of relu/abs/max
    x = R.uniform(0.2, 1.5, shape) * R.choice([-1, 1], shape)
    return x


def distinct(*shape):
    return R.permutation(np.arange(int(np.prod(shape)), dtype=float)).reshape(shape) * 0.37


# name, function, input makers, differentiable input positions, smooth (second order checked)
SPECS = [
    ("add_broadcast", lambda a, b: a + b, lambda: [rnd(3, 4), rnd(4)], (0, 1), True),
    ("sub_broadcast", lambda a, b: a - b, lambda: [rnd(3, 1), rnd(1, 4)], (0, 1), True),
    ("mul_broadcast", lambda a, b: a * b, lambda: [rnd(2, 3, 4), rnd(3, 1)], (0, 1), True),
    ("div", lambda a, b: a / b, lambda: [rnd(3, 4), pos(3, 4)], (0, 1), True),
    ("pow", lambda a, b: a ** b, lambda: [pos(3, 4), rnd(4)], (0, 1), True),
    ("pow_scalar", lambda a: a ** 3, lambda: [rnd(5)], (0,), True),
    ("neg", lambda a: -a, lambda: [rnd(3, 4)], (0,), True),
    ("exp", ops.exp, lambda: [rnd(3, 4)], (0,), True),
    ("log", ops.log, lambda: [pos(3, 4)], (0,), True),
    ("sqrt", ops.sqrt, lambda: [pos(3, 4)], (0,), True),
    ("tanh", ops.tanh, lambda: [rnd(3, 4)], (0,), True),
    ("sigmoid", ops.sigmoid, lambda: [rnd(3, 4)], (0,), True),
    ("sin", ops.sin, lambda: [rnd(3, 4)], (0,), True),
    ("cos", ops.cos, lambda: [rnd(3, 4)], (0,), True),
    ("relu", ops.relu, lambda: [away(3, 4)], (0,), False),
    ("abs", ops.abs, lambda: [away(3, 4)], (0,), False),
    ("maximum", ops.maximum, lambda: [distinct(3, 4), distinct(4) + 0.185], (0, 1), False),
    ("minimum", ops.minimum, lambda: [distinct(3, 4), distinct(3, 4) + 0.1], (0, 1), False),
    ("where", lambda a, b: ops.where(ml.tensor(np.arange(12).reshape(3, 4) % 3 == 0), a, b),
     lambda: [rnd(3, 4), rnd(4)], (0, 1), True),
    ("matmul", ops.matmul, lambda: [rnd(3, 4), rnd(4, 5)], (0, 1), True),
    ("matmul_batched", ops.matmul, lambda: [rnd(2, 3, 4), rnd(4, 2)], (0, 1), True),
    ("sum_axis", lambda a: ops.sum(a, axis=1), lambda: [rnd(3, 4, 2)], (0,), True),
    ("sum_keepdims", lambda a: ops.sum(a, axis=(0, 2), keepdims=True), lambda: [rnd(3, 4, 2)],
     (0,), True),
    ("mean", lambda a: ops.mean(a, axis=0), lambda: [rnd(3, 4)], (0,), True),
    ("max", lambda a: ops.max(a, axis=1), lambda: [distinct(3, 5)], (0,), False),
    ("reshape", lambda a: ops.reshape(a, (4, -1)), lambda: [rnd(2, 6)], (0,), True),
    ("transpose", lambda a: ops.transpose(a, (2, 0, 1)), lambda: [rnd(2, 3, 4)], (0,), True),
    ("broadcast_to", lambda a: ops.broadcast_to(a, (2, 3, 4)), lambda: [rnd(3, 1)], (0,), True),
    ("concatenate", lambda a, b: ops.concatenate([a, b], axis=1), lambda: [rnd(2, 3), rnd(2, 2)],
     (0, 1), True),
    ("stack", lambda a, b: ops.stack([a, b], axis=1), lambda: [rnd(2, 3), rnd(2, 3)], (0, 1),
     True),
    ("getitem", lambda a: a[1:, ::2, None], lambda: [rnd(3, 5)], (0,), True),
    ("take", lambda a: ops.take(a, ml.tensor(np.array([0, 2, 2, 1])), axis=0),
     lambda: [rnd(3, 4)], (0,), True),
    ("pad", lambda a: ops.pad(a, ((1, 0), (2, 1))), lambda: [rnd(2, 3)], (0,), True),
    ("softmax", lambda a: ops.softmax(a, axis=1), lambda: [rnd(3, 4)], (0,), True),
    ("log_softmax", lambda a: ops.log_softmax(a, axis=0), lambda: [rnd(3, 4)], (0,), True),
    ("cross_entropy", lambda a: ops.cross_entropy(a, ml.tensor(np.array([1, 0, 3]))),
     lambda: [rnd(3, 4)], (0,), True),
    ("mse_loss", ops.mse_loss, lambda: [rnd(3, 4), rnd(3, 4)], (0, 1), True),
    ("conv2d", lambda x, w: ops.conv2d(x, w, stride=2, padding=1),
     lambda: [rnd(2, 2, 5, 5), rnd(3, 2, 3, 3)], (0, 1), True),
    ("conv2d_bias", lambda x, w, b: ops.conv2d(x, w, b, stride=1, padding=0),
     lambda: [rnd(1, 2, 4, 4), rnd(2, 2, 2, 2), rnd(2)], (0, 1, 2), True),
    ("max_pool2d", lambda x: ops.max_pool2d(x, 2, stride=1, padding=1),
     lambda: [distinct(1, 2, 4, 4)], (0,), False),
    ("avg_pool2d", lambda x: ops.avg_pool2d(x, 2, padding=1), lambda: [rnd(1, 2, 4, 5)], (0,),
     True),
    ("dropout", lambda x: ops.dropout(x, 0.4, seed=3), lambda: [rnd(4, 5)], (0,), True),
    ("layer_norm", lambda x, w, b: ops.layer_norm(x, w, b), lambda: [rnd(3, 5), rnd(5), rnd(5)],
     (0, 1, 2), True),
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
