"""Checks for chapter 3, the programming interface (``solutions/ch03_programming_interface.ipynb``).

3.1 a custom layer (a low-rank linear layer as an ``ml.nn.Module``), 3.2 a custom operator
(softplus registered with its own kernel, VJP and JVP rules), 3.3 the functional style: a pure
loss of a parameter dict differentiated with ``ml.grad`` and a pure SGD step.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    register,
)
from mlsys_lab.grading.core.guard import unguarded

# ----------------------------------------------------------------------------- shared helpers


def _arr(value):
    """A Tensor as a numpy array (a copy); anything else as it is (the wire says what it was)."""
    import mlsys_lab as ml

    return np.array(value.numpy(), copy=True) if isinstance(value, ml.Tensor) else value


def _expect_array(raw, shape, what) -> np.ndarray:
    if not isinstance(raw, np.ndarray) or raw.shape != tuple(shape):
        raise AssertionError(f"{what} should be an array of shape {tuple(shape)}, got "
                             f"{describe(raw)}")
    return raw.astype(np.float64)


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


# ----------------------------------------------------------------------------- 3.1 LowRankLinear
# A wrong idea that still produces plausible output would fail because: forming U @ V (in either
# layout, or by broadcasting) shows as an in x out node in the traced forward; a weight
# precomputed in __init__, or a forward in numpy, gets no gradient and ignores new values written
# into U, V and bias; an initialisation that ignores rng (numpy's global generator, constant ones
# — which keep every rank column identical for ever) shows when layers built with the same and with
# different rng are compared; the forward and gradient cases first write random values into U, V
# and bias, so a zero factor cannot hide a wrong formula. Both factors zero is refused, with the
# true reason; one zero factor (LoRA's initialisation) is accepted, as V's gradient (xU)ᵀ·dY is
# then non-zero and training moves it.

_SIZES = [(8, 6, 2), (5, 7, 3), (10, 4, 1)]


def _layer_info(layer):
    import mlsys_lab as ml

    if not isinstance(layer, ml.nn.Module):
        return {"module": False, "type": type(layer).__name__}
    return {"module": True, "count": layer.num_parameters(),
            "params": {name: tuple(p.shape) for name, p in layer.named_parameters()}}


def _expect_module(info, what) -> dict:
    if not isinstance(info, dict) or not info.get("module"):
        kind = info.get("type") if isinstance(info, dict) else describe(info)
        raise AssertionError(f"{what} is a {kind}; LowRankLinear must subclass ml.nn.Module")
    if set(info["params"]) != {"U", "V", "bias"}:
        raise AssertionError(
            f"{what} has parameters {sorted(info['params'])}; expected exactly U, V and bias "
            f"(assign ml.nn.Parameter objects to self.U, self.V, self.bias)"
        )
    return info


def _params_probe(LowRankLinear):
    return [_layer_info(LowRankLinear(n_in, n_out, rank, rng=0)) for n_in, n_out, rank in _SIZES]


def _params_judge(raw):
    if not isinstance(raw, list) or len(raw) != len(_SIZES):
        raise AssertionError(f"the check got {describe(raw)}")
    for info, (n_in, n_out, rank) in zip(raw, _SIZES, strict=True):
        what = f"LowRankLinear({n_in}, {n_out}, {rank})"
        info = _expect_module(info, what)
        expected = {"U": (n_in, rank), "V": (rank, n_out), "bias": (n_out,)}
        if info["params"] != expected:
            raise AssertionError(f"{what}: parameter shapes {info['params']}, expected {expected}")
        count = n_in * rank + rank * n_out + n_out
        if info["count"] != count:
            raise AssertionError(f"{what}: {info['count']} parameters, expected {count}")


def _factors(seed, n_in, n_out, rank, batch):
    """Random U, V, bias (float32) and an input x for one layer size."""
    rng = np.random.default_rng(seed)
    values = {"U": rng.standard_normal((n_in, rank)), "V": rng.standard_normal((rank, n_out)),
              "bias": rng.standard_normal(n_out)}
    x = rng.standard_normal((batch, n_in))
    return {k: v.astype(np.float32) for k, v in values.items()}, x.astype(np.float32)


def _with_factors(LowRankLinear, seed, n_in, n_out, rank, batch):
    """A layer with the seed's random values written into U, V and bias; and the input."""
    layer = LowRankLinear(n_in, n_out, rank, rng=1)
    values, x = _factors(seed, n_in, n_out, rank, batch)
    for name, value in values.items():
        getattr(layer, name).data = value.copy()
    return layer, x


def _forward_probe(LowRankLinear, seed):
    import mlsys_lab as ml

    out = []
    for i, size in enumerate(_SIZES):
        layer, x = _with_factors(LowRankLinear, seed + i, *size, batch=5)
        out.append(_arr(layer(ml.tensor(x))))
    return out


def _forward_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != len(_SIZES):
        raise AssertionError(f"the check got {describe(raw)}")
    for i, (y, (n_in, n_out, rank)) in enumerate(zip(raw, _SIZES, strict=True)):
        values, x = _factors(seed + i, n_in, n_out, rank, 5)
        U, V, b = (values[k].astype(np.float64) for k in ("U", "V", "bias"))
        expected = (x @ U) @ V + b
        what = f"LowRankLinear({n_in}, {n_out}, {rank}) on x{x.shape}"
        if not isinstance(y, np.ndarray) or y.shape != expected.shape:
            raise AssertionError(f"{what} returned {describe(y)}, expected a {expected.shape} "
                                 f"Tensor")
        if not np.allclose(y, expected, rtol=1e-4, atol=1e-5):
            raise AssertionError(
                f"{what}: the output differs from (x @ U) @ V + bias, with random values written "
                f"into U, V and bias (compute it from the Parameters in forward)"
            )


def _factor_arrays(layer):
    return {k: np.array(getattr(layer, k).numpy(), copy=True) for k in ("U", "V")}


def _init_probe(LowRankLinear):
    return [_factor_arrays(LowRankLinear(8, 6, 2, rng=r)) for r in (3, 3, 4)]


def _init_judge(raw):
    if not isinstance(raw, list) or len(raw) != 3 or not all(isinstance(d, dict) for d in raw):
        raise AssertionError(f"the check got {describe(raw)}")
    (a, b, c) = ({k: _expect_array(d.get(k), s, f"{k} of LowRankLinear(8, 6, 2)")
                  for k, s in (("U", (8, 2)), ("V", (2, 6)))} for d in raw)
    if not np.any(a["U"]) and not np.any(a["V"]):
        raise AssertionError(
            "U and V both start at zero: then dL/dU = xᵀ(dY Vᵀ) = 0 and dL/dV = (xU)ᵀ dY = 0, so "
            "gradient descent can never move them; draw at least one factor from rng (both, or "
            "as LoRA does, U random and V zero: V's gradient (xU)ᵀ dY is non-zero)"
        )
    if not (np.array_equal(a["U"], b["U"]) and np.array_equal(a["V"], b["V"])):
        raise AssertionError(
            "two layers built with rng=3 have different weights; draw the initial values from "
            "the rng argument (rng = np.random.default_rng(rng))"
        )
    if np.array_equal(a["U"], c["U"]) and np.array_equal(a["V"], c["V"]):
        raise AssertionError("rng=3 and rng=4 give the same weights; draw them from the rng "
                             "argument")


def _grads_probe(LowRankLinear, seed):
    import mlsys_lab as ml

    layer, x = _with_factors(LowRankLinear, seed, 5, 7, 3, batch=4)
    target = np.random.default_rng(seed + 1).standard_normal((4, 7)).astype(np.float32)
    d = layer(ml.tensor(x)) - ml.tensor(target)
    (d * d).sum().backward()
    return {name: _arr(p.grad) for name, p in layer.named_parameters()}


def _grads_judge(raw, seed):
    values, x = _factors(seed, 5, 7, 3, 4)
    target = np.random.default_rng(seed + 1).standard_normal((4, 7)).astype(np.float32)
    U, V, b = (values[k].astype(np.float64) for k in ("U", "V", "bias"))
    dY = 2 * ((x @ U) @ V + b - target)
    expected = {"U": x.T @ (dY @ V.T), "V": (x @ U).T @ dY, "bias": dY.sum(axis=0)}
    if not isinstance(raw, dict) or set(raw) != set(expected):
        raise AssertionError(f"the layer's parameters are {describe(raw)}; expected U, V, bias")
    for name, want in expected.items():
        if raw[name] is None:
            raise AssertionError(
                f"after backward, {name}.grad is None; gradients do not reach {name} (build the "
                f"output from ml ops on the Parameters)"
            )
        got = _expect_array(raw[name], want.shape, f"{name}.grad")
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{name}.grad differs from the gradient of sum((y - t)^2)")


_CHEAP = (12, 10, 2, 3)  # in, out, rank, batch: the full matrix (120) is the largest thing


def _cheap_probe(LowRankLinear):
    import mlsys_lab as ml

    n_in, n_out, rank, batch = _CHEAP
    graph = ml.trace(LowRankLinear(n_in, n_out, rank), np.zeros((batch, n_in), np.float32))
    return [(node.op, [tuple(v.shape) for v in node.outputs]) for node in graph.nodes]


def _cheap_judge(raw):
    n_in, n_out, rank, _ = _CHEAP
    if not isinstance(raw, list):
        raise AssertionError(f"the check got {describe(raw)}")
    for op, shapes in raw:
        for shape in shapes:
            if int(np.prod(shape)) >= n_in * n_out:
                raise AssertionError(
                    f"forward builds a {shape} array ({op}) as large as the full {n_in}x{n_out} "
                    f"matrix; compute (x @ U) @ V so a batch costs (in + out) * rank multiplies "
                    f"per row, not in * out"
                )
    matmuls = sum(op == "matmul" for op, _ in raw)
    if matmuls != 2:
        raise AssertionError(f"the traced forward has {matmuls} matmuls, expected 2: "
                             f"(x @ U) @ V")


BAD_RANK_CALLS = ((8, 6, 7), (8, 6, 0))


def _bad_rank_probe(LowRankLinear):
    return [attempt(LowRankLinear, *args) for args in BAD_RANK_CALLS]


def _bad_rank_judge(raw):
    expect_each_raised("LowRankLinear", BAD_RANK_CALLS, raw, "ValueError",
                       "the rank must lie in 1..min(in_features, out_features)")


# ----------------------------------------------------------------------------- 3.2 softplus
# A wrong idea that still produces plausible output would fail because: log(1 + exp(x)) overflows
# at 800; softplus composed of built-in ops (exp, log, maximum) is not one operator of your own,
# and the rule cases then have no rules of yours to check (ml.grad would only differentiate the
# built-ins); a VJP that ignores g fails with a non-uniform cotangent; a VJP written in numpy gives
# a zero second derivative; a JVP that is not the transpose of the VJP breaks <u, J t> = <Jᵀ u, t>;
# and rules that let the framework find the derivative (ml.grad, ml.vjp, backward inside the rule)
# are off limits: each case calls your rules directly under the guard before it uses ml.grad.

_CHAPTER_OPS = frozenset({"softplus_c", "swish_numba", "softsign_c"})  # chapter 3's notebook


def _library_op(name: str) -> bool:
    import mlsys_lab as ml
    from mlsys_lab.engine.registry import REGISTRY

    op = REGISTRY.get(name)
    module = getattr(getattr(op, "compute", None), "__module__", "") or ""
    return name in set(ml.ops.__all__) | _CHAPTER_OPS or module.startswith("mlsys_lab")


def _own_op(softplus):
    """(the ops softplus traces to, the registered Op when it is exactly one node, else None)."""
    import mlsys_lab as ml
    from mlsys_lab.engine.registry import REGISTRY

    ops = [node.op for node in ml.trace(softplus, np.zeros(4, np.float32)).nodes]
    return ops, (REGISTRY.get(ops[0]) if len(ops) == 1 else None)


def _expect_own_op(raw) -> dict:
    ops = raw.get("ops") if isinstance(raw, dict) else None
    if not isinstance(ops, list):
        raise AssertionError(f"the check got {describe(raw)}")
    if len(ops) != 1:
        raise AssertionError(
            f"tracing softplus gives {len(ops)} nodes {ops}; it should be one node of your own "
            f"registered op, whose rules are what this case checks"
        )
    if _library_op(ops[0]):
        raise AssertionError(
            f"softplus traces to the op {ops[0]!r}, which is not yours; register an Op under a "
            f"new name"
        )
    return raw


def _vjp_rule(op, softplus, x, g):
    """Your VJP rule, called directly (under the guard): its first cotangent, or what it gave."""
    import mlsys_lab as ml

    xt = ml.tensor(x)
    cts = op.vjp(ml.tensor(g), (xt,), softplus(xt), (True,))
    return _arr(cts[0]) if isinstance(cts, tuple) and len(cts) == 1 else cts


def _forward_values(seed):
    return np.random.default_rng(seed).standard_normal(20) * 4


def _softplus_forward_probe(softplus, seed):
    import mlsys_lab as ml

    x = _forward_values(seed)
    y = softplus(ml.tensor(x))
    y32 = softplus(ml.tensor(x.astype(np.float32)))
    return {"y": _arr(y), "dtype32": str(getattr(y32, "dtype", type(y32).__name__))}


def _softplus_forward_judge(raw, seed):
    x = _forward_values(seed)
    y = raw.get("y") if isinstance(raw, dict) else raw
    if not isinstance(y, np.ndarray):
        raise AssertionError(
            f"softplus returned {describe(y)}; return the Tensor that apply(op, x) gives"
        )
    if y.dtype != np.float64 or not np.allclose(y, np.logaddexp(0.0, x), rtol=1e-12):
        raise AssertionError("softplus(x) differs from log(1 + exp(x)) on 20 random float64 values")
    if raw.get("dtype32") != "float32":
        raise AssertionError(f"a float32 input gave {raw.get('dtype32')}; keep the input's dtype")


_EXTREMES = np.array([-800.0, -40.0, 0.0, 40.0, 800.0])


def _stable_probe(softplus):
    import mlsys_lab as ml

    with np.errstate(all="ignore"):
        return _arr(softplus(ml.tensor(_EXTREMES.copy())))


def _stable_judge(raw):
    y = _expect_array(raw, _EXTREMES.shape, f"softplus({_EXTREMES.tolist()})")
    if not np.all(np.isfinite(y)) or not np.allclose(y, np.logaddexp(0.0, _EXTREMES), rtol=1e-12):
        raise AssertionError(
            f"softplus({_EXTREMES.tolist()}) gave {y.tolist()}; log(1 + exp(800)) overflows, use "
            f"np.logaddexp(0, x)"
        )


def _is_op_probe(softplus):
    import mlsys_lab as ml

    ops, op = _own_op(softplus)
    if op is None:
        return {"ops": ops}
    x = ml.tensor(np.linspace(-2.0, 2.0, 5))
    cts = op.vjp(ml.tensor(np.ones(5)), (x,), softplus(x), (True,))
    tangent = op.jvp((ml.tensor(np.ones(5)),), (x,), softplus(x))
    return {"ops": ops, "has_vjp": op.vjp is not None, "has_jvp": op.jvp is not None,
            "vjp_kind": type(cts).__name__,
            "vjp_len": len(cts) if isinstance(cts, tuple) else None,
            "jvp_kind": type(tangent).__name__,
            "jvp_shape": tuple(tangent.shape) if isinstance(tangent, ml.Tensor) else None}


def _is_op_judge(raw):
    _expect_own_op(raw)
    if raw.get("has_vjp") is not True or raw.get("has_jvp") is not True:
        raise AssertionError(f"op {raw['ops'][0]!r} is registered without a VJP or a JVP rule")
    if raw.get("vjp_kind") != "tuple" or raw.get("vjp_len") != 1:
        raise AssertionError(
            f"the VJP rule returned a {raw.get('vjp_kind')}; it must return a tuple with one "
            f"cotangent per input: (g * sigmoid(x),)"
        )
    if raw.get("jvp_kind") not in ("Tensor",) or raw.get("jvp_shape") != (5,):
        raise AssertionError(
            f"the JVP rule returned a {raw.get('jvp_kind')}; it must return the output tangent "
            f"as a Tensor of the output's shape"
        )


def _vjp_inputs(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((3, 4)) * 3, rng.standard_normal((3, 4))


def _vjp_probe(softplus, seed):
    import mlsys_lab as ml

    ops, op = _own_op(softplus)
    if op is None:
        return {"ops": ops}
    x, u = _vjp_inputs(seed)
    rule = _vjp_rule(op, softplus, x, u)
    with unguarded():  # ml.grad / ml.vjp are off limits to the rule, not to the check
        g = ml.grad(lambda t: softplus(t).sum())(x)
        (ct,) = ml.vjp(softplus, x)[1](u)
    return {"ops": ops, "rule": rule, "grad": _arr(g), "vjp": _arr(ct)}


def _vjp_judge(raw, seed):
    _expect_own_op(raw)
    x, u = _vjp_inputs(seed)
    s = _sigmoid(x)
    rule = _expect_array(raw.get("rule"), x.shape, "your VJP rule's cotangent")
    if not np.allclose(rule, u * s, rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "your VJP rule, called with a non-uniform cotangent g, should return g * sigmoid(x); "
            "the derivative of softplus is sigmoid(x), times the incoming g"
        )
    if not np.allclose(_expect_array(raw.get("grad"), x.shape, "ml.grad"), s, rtol=1e-6,
                       atol=1e-9):
        raise AssertionError("ml.grad of softplus(x).sum() does not give sigmoid(x)")
    if not np.allclose(_expect_array(raw.get("vjp"), x.shape, "ml.vjp"), u * s, rtol=1e-6,
                       atol=1e-9):
        raise AssertionError("ml.vjp of softplus with cotangent u does not give u * sigmoid(x)")


def _jvp_inputs(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(6) * 3, rng.standard_normal(6), rng.standard_normal(6)


def _jvp_probe(softplus, seed):
    import mlsys_lab as ml

    ops, op = _own_op(softplus)
    if op is None:
        return {"ops": ops}
    x, t, u = _jvp_inputs(seed)
    xt = ml.tensor(x)
    rule_jvp = _arr(op.jvp((ml.tensor(t),), (xt,), softplus(xt)))
    rule_vjp = _vjp_rule(op, softplus, x, u)
    with unguarded():
        _, tangent = ml.jvp(softplus, (x,), (t,))
    return {"ops": ops, "rule_jvp": rule_jvp, "rule_vjp": rule_vjp, "jvp": _arr(tangent)}


def _jvp_judge(raw, seed):
    _expect_own_op(raw)
    x, t, u = _jvp_inputs(seed)
    s = _sigmoid(x)
    jt = _expect_array(raw.get("rule_jvp"), x.shape, "your JVP rule's tangent")
    if not np.allclose(jt, t * s, rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "your JVP rule should return the output tangent t * sigmoid(x) for the input tangent t"
        )
    jtu = _expect_array(raw.get("rule_vjp"), x.shape, "your VJP rule's cotangent")
    lhs, rhs = float(np.dot(u, jt)), float(np.dot(jtu, t))
    if not np.isclose(lhs, rhs, rtol=1e-9):
        raise AssertionError(
            f"forward and reverse mode disagree: <u, J t> = {lhs:.9g} but <J^T u, t> = {rhs:.9g}"
        )
    if not np.allclose(_expect_array(raw.get("jvp"), x.shape, "ml.jvp"), t * s, rtol=1e-6,
                       atol=1e-9):
        raise AssertionError("ml.jvp of softplus does not give t * sigmoid(x)")


_SECOND = np.linspace(-3, 3, 7)


def _second_probe(softplus):
    import mlsys_lab as ml

    ops, op = _own_op(softplus)
    if op is None:
        return {"ops": ops}
    _vjp_rule(op, softplus, _SECOND, np.ones_like(_SECOND))  # the rule runs under the guard once
    with unguarded():
        d1 = ml.grad(lambda t: softplus(t).sum())
        d2 = ml.grad(lambda t: d1(t).sum())(_SECOND.copy())
    return {"ops": ops, "second": _arr(d2)}


def _second_judge(raw):
    _expect_own_op(raw)
    s = _sigmoid(_SECOND)
    d2 = _expect_array(raw.get("second"), _SECOND.shape, "grad(grad(softplus))")
    if not np.allclose(d2, s * (1 - s), rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "grad(grad(softplus)) should be sigmoid(x) (1 - sigmoid(x)); write the VJP rule with "
            "ml.ops (not numpy) so it can be differentiated"
        )


# ----------------------------------------------------------------------------- 3.3 functional
# A wrong idea that still produces plausible output would fail because: a summed (not averaged)
# cross-entropy shows in the loss values; numpy inside loss_fn cuts the tape, so ml.grad gives
# zeros; an in-place update (params[k] -= ...) or returning the same dict fails the purity case;
# hidden state (momentum kept in a global, a step counter for a decaying lr) makes two calls on the
# same params disagree and the 40-step run drift from plain gradient descent; an lr fixed in the
# code fails because lr is drawn from the seed; and ml.optim's in-place optimisers are off limits.


def _problem(seed, n=30, d=4, c=3):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((c, d)) * 2
    y = rng.integers(0, c, n)
    X = centers[y] + rng.standard_normal((n, d))
    params = {"W": rng.standard_normal((d, c)) * 0.3, "b": rng.standard_normal(c) * 0.1}
    return params, X, y.astype(np.int64)


def _lr(seed):
    return 0.2 + 0.1 * (seed % 4)


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


def _ref_sgd(params, X, y, lr, steps):
    for _ in range(steps):
        _, g = _ref_loss_grad(params, X, y)
        params = {k: params[k] - lr * g[k] for k in params}
    return params


def _dict_out(value):
    return {k: _arr(v) for k, v in value.items()} if isinstance(value, dict) else _arr(value)


def _expect_params(raw, like, what) -> dict:
    if not isinstance(raw, dict) or set(raw) != set(like):
        raise AssertionError(f"{what} should be a dict with W and b, got {describe(raw)}")
    return {k: _expect_array(raw[k], like[k].shape, f"{what}[{k!r}]") for k in like}


def _scalar(value, what):
    if isinstance(value, (bool, str)) or value is None:
        raise AssertionError(f"{what} returned {describe(value)}; a loss is a number")
    arr = np.asarray(value) if isinstance(value, (int, float, np.ndarray, np.generic)) else None
    if arr is None or arr.dtype.kind not in "iuf":
        raise AssertionError(f"{what} returned {describe(value)}; a loss is a number")
    if arr.size != 1:
        raise AssertionError(f"{what} returned shape {arr.shape}; a loss is a scalar (the mean)")
    return float(arr.reshape(()))


def _loss_probe(loss_fn, sgd_step, seed):
    return [_arr(loss_fn(*_problem(seed * 3 + i))) for i in range(3)]


def _loss_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 3:
        raise AssertionError(f"loss_fn on 3 problems returned {describe(raw)}")
    for i, value in enumerate(raw):
        got = _scalar(value, "loss_fn")
        expected, _ = _ref_loss_grad(*_problem(seed * 3 + i))
        if not np.isclose(got, expected, rtol=1e-9):
            raise AssertionError(
                f"problem {i}: loss_fn gave {got:.6f}, expected {expected:.6f} (the mean "
                f"cross-entropy of softmax(X @ W + b))"
            )


def _loss_grad_probe(loss_fn, sgd_step, seed):
    import mlsys_lab as ml

    return [_dict_out(ml.grad(loss_fn)(*_problem(seed * 3 + 10 + i))) for i in range(3)]


def _loss_grad_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 3:
        raise AssertionError(f"ml.grad(loss_fn) on 3 problems returned {describe(raw)}")
    for i, grads in enumerate(raw):
        _, expected = _ref_loss_grad(*_problem(seed * 3 + 10 + i))
        got = _expect_params(grads, expected, "ml.grad(loss_fn)(params, X, y)")
        for k in ("W", "b"):
            if not np.allclose(got[k], expected[k], rtol=1e-7, atol=1e-10):
                raise AssertionError(f"problem {i}: the gradient with respect to {k} is wrong "
                                     f"(build the loss from ml.ops, not numpy, so ml.grad sees it)")


def _pure_probe(loss_fn, sgd_step, seed):
    params, X, y = _problem(seed + 20)
    new = sgd_step(params, X, y, _lr(seed))
    again = sgd_step(params, X, y, _lr(seed))
    return {"same_dict": new is params, "params": _dict_out(params), "new": _dict_out(new),
            "again": _dict_out(again)}


def _pure_judge(raw, seed):
    params, X, y = _problem(seed + 20)
    lr = _lr(seed)
    if not isinstance(raw, dict):
        raise AssertionError(f"the check got {describe(raw)}")
    if raw.get("same_dict"):
        raise AssertionError("sgd_step returned the dict it was given; build a new one")
    after = _expect_params(raw.get("params"), params, "params")
    if any(not np.array_equal(after[k], params[k]) for k in params):
        raise AssertionError(
            "sgd_step changed the params it was given; a pure function returns new values instead"
        )
    _, g = _ref_loss_grad(params, X, y)
    new = _expect_params(raw.get("new"), params, "sgd_step")
    for k in ("W", "b"):
        if not np.allclose(new[k], params[k] - lr * g[k], rtol=1e-7, atol=1e-10):
            raise AssertionError(f"new {k} should be {k} - lr * dL/d{k} (lr = {lr:g})")
    again = _expect_params(raw.get("again"), params, "sgd_step")
    if any(not np.allclose(again[k], new[k], rtol=1e-12, atol=1e-14) for k in params):
        raise AssertionError(
            "two calls of sgd_step on the same params gave different results; a pure function "
            "keeps no hidden state (no momentum or step counter outside its arguments)"
        )


def _learns_probe(loss_fn, sgd_step, seed):
    params, X, y = _problem(seed + 30, n=60)
    for _ in range(40):
        params = sgd_step(params, X, y, 0.5)
    return _dict_out(params)


def _learns_judge(raw, seed):
    params, X, y = _problem(seed + 30, n=60)
    first, _ = _ref_loss_grad(params, X, y)
    expected = _ref_sgd(params, X, y, 0.5, 40)
    got = _expect_params(raw, params, "40 steps of sgd_step")
    if any(not np.allclose(got[k], expected[k], rtol=1e-6, atol=1e-9) for k in params):
        last, _ = _ref_loss_grad(got, X, y)
        want, _ = _ref_loss_grad(expected, X, y)
        raise AssertionError(
            f"40 steps of sgd_step(lr=0.5) took the loss from {first:.3f} to {last:.3f}; plain "
            f"gradient descent reaches {want:.3f}"
        )


register(
    Exercise(
        id="3.1",
        title="A custom layer: LowRankLinear",
        target="LowRankLinear",
        task="a low-rank linear layer",
        forbidden=("mlsys_lab.nn.layers:Linear",),
        cases=(
            Case("parameters U, V, bias: shapes and count", 1,
                 probe=_params_probe, judge=_params_judge),
            Case("forward equals (x @ U) @ V + bias", 1, probe=_forward_probe,
                 judge=_forward_judge),
            Case("seeded initialisation that can train", 0.5, probe=_init_probe,
                 judge=_init_judge),
            Case("gradients reach U, V and bias", 1, probe=_grads_probe, judge=_grads_judge),
            Case("never forms the full in x out matrix", 1, probe=_cheap_probe,
                 judge=_cheap_judge),
            Case("a bad rank raises ValueError", 0.5, probe=_bad_rank_probe,
                 judge=_bad_rank_judge),
        ),
    ),
    Exercise(
        id="3.2",
        title="A custom operator: softplus",
        target="softplus",
        task="softplus's derivative rules",
        forbidden=("mlsys_lab.engine.autodiff", "mlsys_lab.engine.autodiff_graph"),
        cases=(
            Case("forward equals log(1 + e^x)", 1, probe=_softplus_forward_probe,
                 judge=_softplus_forward_judge),
            Case("no overflow at +-800", 0.5, probe=_stable_probe, judge=_stable_judge),
            Case("one registered op; rules follow the registry", 1, probe=_is_op_probe,
                 judge=_is_op_judge),
            Case("your VJP rule, ml.grad and ml.vjp", 1, probe=_vjp_probe, judge=_vjp_judge),
            Case("your JVP rule, ml.jvp, agreement with the VJP", 1, probe=_jvp_probe,
                 judge=_jvp_judge),
            Case("second derivative (rules in ml ops)", 0.5, probe=_second_probe,
                 judge=_second_judge),
        ),
    ),
    Exercise(
        id="3.3",
        title="Functional style: loss_fn and sgd_step",
        target=("loss_fn", "sgd_step"),
        task="a pure gradient-descent step",
        forbidden=("mlsys_lab.optim.optimizers", "mlsys_lab.kernels.optim"),
        cases=(
            Case("loss value on 3 problems", 1, probe=_loss_probe, judge=_loss_judge),
            Case("ml.grad(loss_fn) on 3 problems", 1.5, probe=_loss_grad_probe,
                 judge=_loss_grad_judge),
            Case("sgd_step is pure and correct", 1, probe=_pure_probe, judge=_pure_judge),
            Case("40 steps equal plain gradient descent", 0.5, probe=_learns_probe,
                 judge=_learns_judge),
        ),
    ),
)
