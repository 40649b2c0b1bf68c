"""Checks for chapter 3, the programming interface (``solutions/ch03_programming_interface.ipynb``).

3.1 a custom layer (a low-rank linear layer as an ``ml.nn.Module``), 3.2 a custom operator
(softplus registered with its own kernel, VJP and JVP rules), 3.3 the functional style: a pure
loss of a parameter dict differentiated with ``ml.grad`` and a pure SGD step.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.checks import Case, Exercise, register

# ----------------------------------------------------------------------------- 3.1 LowRankLinear

_SIZES = [(8, 6, 2), (5, 7, 3), (10, 4, 1)]


def _layer(LowRankLinear, n_in, n_out, rank, rng=0):
    import mlsys_lab as ml

    layer = LowRankLinear(n_in, n_out, rank, rng=rng)
    if not isinstance(layer, ml.nn.Module):
        raise AssertionError("LowRankLinear must subclass ml.nn.Module")
    return layer


def _arrays(layer, what):
    params = dict(layer.named_parameters())
    if set(params) != {"U", "V", "bias"}:
        raise AssertionError(
            f"{what} has parameters {sorted(params)}; expected exactly U, V "
            f"and bias (assign ml.nn.Parameter objects to self.U, self.V, "
            f"self.bias)"
        )
    return (np.asarray(params[k].numpy(), np.float64) for k in ("U", "V", "bias"))


def _lowrank_params(LowRankLinear):
    for n_in, n_out, rank in _SIZES:
        what = f"LowRankLinear({n_in}, {n_out}, {rank})"
        layer = _layer(LowRankLinear, n_in, n_out, rank)
        params = dict(layer.named_parameters())
        _arrays(layer, what)
        shapes = {k: tuple(params[k].shape) for k in ("U", "V", "bias")}
        expected = {"U": (n_in, rank), "V": (rank, n_out), "bias": (n_out,)}
        if shapes != expected:
            raise AssertionError(f"{what}: parameter shapes {shapes}, expected {expected}")
        count = n_in * rank + rank * n_out + n_out
        if layer.num_parameters() != count:
            raise AssertionError(f"{what}: {layer.num_parameters()} parameters, expected {count}")


def _lowrank_forward(LowRankLinear):
    import mlsys_lab as ml

    rng = np.random.default_rng(0)
    for n_in, n_out, rank in _SIZES:
        what = f"LowRankLinear({n_in}, {n_out}, {rank})"
        layer = _layer(LowRankLinear, n_in, n_out, rank, rng=1)
        layer.bias.data = rng.standard_normal(n_out).astype(np.float32)
        U, V, b = _arrays(layer, what)
        x = rng.standard_normal((5, n_in)).astype(np.float32)
        y = np.asarray(layer(ml.tensor(x)))
        expected = (x @ U) @ V + b
        if y.shape != expected.shape or not np.allclose(y, expected, rtol=1e-4, atol=1e-5):
            raise AssertionError(
                f"{what} on x{x.shape}: output {y.shape} differs from (x @ U) @ V + bias"
            )


def _lowrank_init(LowRankLinear):
    a = _layer(LowRankLinear, 8, 6, 2, rng=3)
    b = _layer(LowRankLinear, 8, 6, 2, rng=3)
    c = _layer(LowRankLinear, 8, 6, 2, rng=4)
    Ua, Va, _ = _arrays(a, "LowRankLinear(8, 6, 2)")
    Ub, Vb, _ = _arrays(b, "LowRankLinear(8, 6, 2)")
    Uc, Vc, _ = _arrays(c, "LowRankLinear(8, 6, 2)")
    if not (np.any(Ua) and np.any(Va)):
        raise AssertionError(
            "U or V starts at all zeros, so no gradient can ever reach them; "
            "initialise both randomly (e.g. ml.nn.init.kaiming_uniform)"
        )
    if not (np.array_equal(Ua, Ub) and np.array_equal(Va, Vb)):
        raise AssertionError(
            "two layers built with rng=3 have different weights; draw the "
            "initial values from the rng argument"
        )
    if np.array_equal(Ua, Uc) and np.array_equal(Va, Vc):
        raise AssertionError("rng=3 and rng=4 give the same weights; use the rng argument")


def _lowrank_grads(LowRankLinear):
    import mlsys_lab as ml

    rng = np.random.default_rng(5)
    layer = _layer(LowRankLinear, 5, 7, 3, rng=6)
    U, V, b = _arrays(layer, "LowRankLinear(5, 7, 3)")
    x = rng.standard_normal((4, 5)).astype(np.float32)
    target = rng.standard_normal((4, 7)).astype(np.float32)
    d = layer(ml.tensor(x)) - ml.tensor(target)
    (d * d).sum().backward()
    dY = 2 * ((x @ U) @ V + b - target)
    expected = {"U": x.T @ (dY @ V.T), "V": (x @ U).T @ dY, "bias": dY.sum(axis=0)}
    for name, p in layer.named_parameters():
        if p.grad is None:
            raise AssertionError(
                f"after backward, {name}.grad is None; gradients do not reach "
                f"{name} (build the output from ml ops on the Parameters)"
            )
        if not np.allclose(np.asarray(p.grad), expected[name], rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{name}.grad differs from the gradient of sum((y - t)^2)")


def _lowrank_cheap(LowRankLinear):
    import mlsys_lab as ml

    n_in, n_out, rank = 8, 6, 2
    layer = _layer(LowRankLinear, n_in, n_out, rank)
    graph = ml.trace(layer, np.zeros((5, n_in), np.float32))
    for node in graph.nodes:
        if tuple(node.outputs[0].shape) == (n_in, n_out):
            raise AssertionError(
                f"forward builds a full {n_in}x{n_out} matrix ({node!r}); compute (x @ U) @ V so "
                f"a batch costs (in + out) * rank multiplies per row, not in * out"
            )
    matmuls = sum(node.op == "matmul" for node in graph.nodes)
    if matmuls != 2:
        raise AssertionError(f"the traced forward has {matmuls} matmuls, expected 2")


def _lowrank_bad_rank(LowRankLinear):
    for args in [(8, 6, 7), (8, 6, 0)]:
        try:
            LowRankLinear(*args)
        except ValueError:
            continue
        raise AssertionError(
            f"LowRankLinear{args} should raise ValueError: the rank must lie "
            f"in 1..min(in_features, out_features)"
        )


# ----------------------------------------------------------------------------- 3.2 softplus

_BUILTIN = {"softplus_c", "swish_numba"}


def _softplus_ref(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _softplus_forward(softplus):
    import mlsys_lab as ml

    rng = np.random.default_rng(0)
    x = rng.standard_normal(20) * 4
    y = softplus(ml.tensor(x))
    if not isinstance(y, ml.Tensor):
        raise AssertionError(
            f"softplus returned {type(y).__name__}; return the Tensor that apply(op, x) gives"
        )
    if y.dtype != np.float64 or not np.allclose(y.numpy(), _softplus_ref(x), rtol=1e-12):
        raise AssertionError("softplus(x) differs from log(1 + exp(x)) on 20 random float64 values")
    y32 = softplus(ml.tensor(x.astype(np.float32)))
    if y32.dtype != np.float32:
        raise AssertionError(f"a float32 input gave {y32.dtype}; keep the input's dtype")


def _softplus_stable(softplus):
    import mlsys_lab as ml

    x = np.array([-800.0, -40.0, 0.0, 40.0, 800.0])
    with np.errstate(all="ignore"):
        y = np.asarray(softplus(ml.tensor(x)))
    if not np.all(np.isfinite(y)) or not np.allclose(y, _softplus_ref(x), rtol=1e-12):
        raise AssertionError(
            f"softplus({x.tolist()}) gave {y.tolist()}; log(1 + exp(800)) "
            f"overflows, use np.logaddexp(0, x)"
        )


def _softplus_is_op(softplus):
    import mlsys_lab as ml
    from mlsys_lab.engine.registry import REGISTRY

    graph = ml.trace(softplus, np.zeros(4, np.float32))
    if len(graph.nodes) != 1:
        ops = [n.op for n in graph.nodes]
        raise AssertionError(
            f"tracing softplus gives {len(graph.nodes)} nodes {ops}; it should "
            f"be one node of your own registered op"
        )
    name = graph.nodes[0].op
    if name in set(ml.ops.__all__) | _BUILTIN:
        raise AssertionError(
            f"softplus traces to the op {name!r}, which is not yours; register an Op under "
            f"a new name"
        )
    op = REGISTRY[name]
    missing = [rule for rule in ("vjp", "jvp") if getattr(op, rule) is None]
    if missing:
        raise AssertionError(f"op {name!r} is registered without a {' or '.join(missing)} rule")
    x = ml.tensor(np.linspace(-2.0, 2.0, 5))
    out = ml.tensor(_softplus_ref(x.numpy()))
    g = ml.tensor(np.ones(5))
    cts = op.vjp(g, (x,), out, (True,))
    if not isinstance(cts, tuple) or len(cts) != 1:
        raise AssertionError(
            f"the VJP rule returned {type(cts).__name__}; it must return a tuple with one "
            f"cotangent per input: (g * sigmoid(x),)"
        )
    tangent = op.jvp((g,), (x,), out)
    if not isinstance(tangent, ml.Tensor) or tuple(tangent.shape) != (5,):
        raise AssertionError(
            f"the JVP rule returned {type(tangent).__name__}; it must return the output "
            f"tangent as a Tensor of the output's shape"
        )


def _numeric_grad(x, eps=1e-6):
    return (_softplus_ref(x + eps) - _softplus_ref(x - eps)) / (2 * eps)


def _softplus_vjp(softplus):
    import mlsys_lab as ml

    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4)) * 3
    u = rng.standard_normal((3, 4))
    g = ml.grad(lambda t: softplus(t).sum())(x)
    if not np.allclose(np.asarray(g), _numeric_grad(x), rtol=1e-6, atol=1e-8):
        raise AssertionError(
            "ml.grad of softplus(x).sum() differs from float64 central "
            "differences; the derivative of softplus is sigmoid(x)"
        )
    _, vjp_fn = ml.vjp(softplus, x)
    (ct,) = vjp_fn(u)
    if not np.allclose(np.asarray(ct), u * _numeric_grad(x), rtol=1e-6, atol=1e-8):
        raise AssertionError(
            "the VJP with a non-uniform cotangent u should be u * sigmoid(x); "
            "multiply by the incoming g"
        )


def _softplus_jvp(softplus):
    import mlsys_lab as ml

    rng = np.random.default_rng(2)
    x = rng.standard_normal(6) * 3
    t = rng.standard_normal(6)
    u = rng.standard_normal(6)
    _, tangent = ml.jvp(softplus, (x,), (t,))
    if not np.allclose(np.asarray(tangent), t * _numeric_grad(x), rtol=1e-6, atol=1e-8):
        raise AssertionError(
            "ml.jvp of softplus differs from central differences; the tangent out is t * sigmoid(x)"
        )
    _, vjp_fn = ml.vjp(softplus, x)
    (ct,) = vjp_fn(u)
    lhs, rhs = float(np.dot(u, np.asarray(tangent))), float(np.dot(np.asarray(ct), t))
    if not np.isclose(lhs, rhs, rtol=1e-9):
        raise AssertionError(
            f"forward and reverse mode disagree: <u, J t> = {lhs:.9g} but <J^T u, t> = {rhs:.9g}"
        )


def _softplus_second_order(softplus):
    import mlsys_lab as ml

    x = np.linspace(-3, 3, 7)
    d1 = ml.grad(lambda t: softplus(t).sum())
    d2 = ml.grad(lambda t: d1(t).sum())(x)
    s = _sigmoid(x)
    if not np.allclose(np.asarray(d2), s * (1 - s), rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "grad(grad(softplus)) should be sigmoid(x) (1 - sigmoid(x)); write "
            "the VJP rule with ml.ops (not numpy) so it can be differentiated"
        )


# ----------------------------------------------------------------------------- 3.3 functional


def _problem(seed, n=30, d=4, c=3):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((c, d)) * 2
    y = rng.integers(0, c, n)
    X = centers[y] + rng.standard_normal((n, d))
    params = {"W": rng.standard_normal((d, c)) * 0.3, "b": rng.standard_normal(c) * 0.1}
    return params, X, y.astype(np.int64)


def _ref_loss_grad(params, X, y):
    z = X @ params["W"] + params["b"]
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(y)
    loss = -logp[np.arange(n), y].mean()
    dz = np.exp(logp)
    dz[np.arange(n), y] -= 1
    dz /= n
    return loss, {"W": X.T @ dz, "b": dz.sum(axis=0)}


def _scalar(value, what):
    arr = np.asarray(value, dtype=np.float64)
    if arr.size != 1:
        raise AssertionError(f"{what} returned shape {arr.shape}; a loss is a scalar (the mean)")
    return float(arr.reshape(()))


def _loss_value(loss_fn, sgd_step):
    for seed in range(3):
        params, X, y = _problem(seed)
        got = _scalar(loss_fn(params, X, y), "loss_fn")
        expected, _ = _ref_loss_grad(params, X, y)
        if not np.isclose(got, expected, rtol=1e-9):
            raise AssertionError(
                f"problem {seed}: loss_fn gave {got:.6f}, expected {expected:.6f} "
                f"(mean cross-entropy of softmax(X @ W + b))"
            )


def _loss_grad(loss_fn, sgd_step):
    import mlsys_lab as ml

    for seed in range(3):
        params, X, y = _problem(10 + seed)
        grads = ml.grad(loss_fn)(params, X, y)
        _, expected = _ref_loss_grad(params, X, y)
        if not isinstance(grads, dict) or set(grads) != {"W", "b"}:
            raise AssertionError("ml.grad(loss_fn)(params, X, y) should give a dict with W and b")
        for k in ("W", "b"):
            if not np.allclose(np.asarray(grads[k]), expected[k], rtol=1e-7, atol=1e-10):
                raise AssertionError(f"problem {seed}: the gradient with respect to {k} is wrong")


def _sgd_pure(loss_fn, sgd_step):
    params, X, y = _problem(20)
    saved = {k: v.copy() for k, v in params.items()}
    new = sgd_step(params, X, y, 0.5)
    if not isinstance(new, dict) or set(new) != {"W", "b"}:
        raise AssertionError("sgd_step should return a new dict with W and b")
    if new is params:
        raise AssertionError("sgd_step returned the same dict; build a new one")
    if any(not np.array_equal(params[k], saved[k]) for k in params):
        raise AssertionError(
            "sgd_step changed the params it was given; a pure function returns new values instead"
        )
    _, g = _ref_loss_grad(saved, X, y)
    for k in ("W", "b"):
        if not np.allclose(np.asarray(new[k]), saved[k] - 0.5 * g[k], rtol=1e-7, atol=1e-10):
            raise AssertionError(f"new {k} should be {k} - lr * dL/d{k}")


def _sgd_learns(loss_fn, sgd_step):
    params, X, y = _problem(30, n=60)
    first, _ = _ref_loss_grad(params, X, y)
    for _ in range(40):
        params = sgd_step(params, X, y, 0.5)
    params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    last, _ = _ref_loss_grad(params, X, y)
    if not last < 0.5 * first:
        raise AssertionError(
            f"40 steps of sgd_step(lr=0.5) took the loss from {first:.3f} only to {last:.3f}"
        )


register(
    Exercise(
        id="3.1",
        title="A custom layer: LowRankLinear",
        target="LowRankLinear",
        cases=(
            Case("parameters U, V, bias: shapes and count", 1, _lowrank_params),
            Case("forward equals (x @ U) @ V + bias", 1, _lowrank_forward),
            Case("random, seeded initialisation", 0.5, _lowrank_init),
            Case("gradients reach U, V and bias", 1, _lowrank_grads),
            Case("never forms the full in x out matrix", 1, _lowrank_cheap),
            Case("a bad rank raises ValueError", 0.5, _lowrank_bad_rank),
        ),
    ),
    Exercise(
        id="3.2",
        title="A custom operator: softplus",
        target="softplus",
        cases=(
            Case("forward equals log(1 + e^x)", 1, _softplus_forward),
            Case("no overflow at +-800", 0.5, _softplus_stable),
            Case("one registered op; rules follow the registry", 1, _softplus_is_op),
            Case("VJP vs central differences", 1, _softplus_vjp),
            Case("JVP vs central differences and VJP", 1, _softplus_jvp),
            Case("second derivative (rules in ml ops)", 0.5, _softplus_second_order),
        ),
    ),
    Exercise(
        id="3.3",
        title="Functional style: loss_fn and sgd_step",
        target=("loss_fn", "sgd_step"),
        cases=(
            Case("loss value on 3 problems", 1, _loss_value),
            Case("ml.grad(loss_fn) on 3 problems", 1.5, _loss_grad),
            Case("sgd_step is pure and correct", 1, _sgd_pure),
            Case("40 steps reduce the loss", 0.5, _sgd_learns),
        ),
    ),
)
