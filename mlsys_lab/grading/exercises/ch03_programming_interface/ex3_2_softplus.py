"""Exercise 3.2: a custom operator, softplus registered with its own kernel, VJP and JVP rules.

Wrong ideas rejected: log(1 + exp(x)) overflows at 800; softplus composed of built-in ops (exp,
log, maximum) is not one operator of your own, and the rule cases then have no rules of yours to
check (ml.grad would only differentiate the built-ins); a VJP that ignores g fails with a
non-uniform cotangent; a VJP written in numpy gives a zero second derivative; a JVP that is not
the transpose of the VJP breaks <u, J t> = <Jᵀ u, t>; and rules that let the framework find the
derivative (ml.grad, ml.vjp, backward inside the rule) are off limits (the autodiff modules are
forbidden): each case calls your rules directly under the guard before it uses ml.grad.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register
from mlsys_lab.grading.core.guard import unguarded
from mlsys_lab.grading.exercises.ch03_programming_interface.common import array_of, expect_array


def _sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


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
    return array_of(cts[0]) if isinstance(cts, tuple) and len(cts) == 1 else cts


def _forward_values(seed):
    return np.random.default_rng(seed).standard_normal(20) * 4


def _softplus_forward_probe(softplus, seed):
    import mlsys_lab as ml

    x = _forward_values(seed)
    y = softplus(ml.tensor(x))
    y32 = softplus(ml.tensor(x.astype(np.float32)))
    return {"y": array_of(y), "dtype32": str(getattr(y32, "dtype", type(y32).__name__))}


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
        return array_of(softplus(ml.tensor(_EXTREMES.copy())))


def _stable_judge(raw):
    y = expect_array(raw, _EXTREMES.shape, f"softplus({_EXTREMES.tolist()})")
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
    return {"ops": ops, "rule": rule, "grad": array_of(g), "vjp": array_of(ct)}


def _vjp_judge(raw, seed):
    _expect_own_op(raw)
    x, u = _vjp_inputs(seed)
    s = _sigmoid(x)
    rule = expect_array(raw.get("rule"), x.shape, "your VJP rule's cotangent")
    if not np.allclose(rule, u * s, rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "your VJP rule, called with a non-uniform cotangent g, should return g * sigmoid(x); "
            "the derivative of softplus is sigmoid(x), times the incoming g"
        )
    if not np.allclose(expect_array(raw.get("grad"), x.shape, "ml.grad"), s, rtol=1e-6,
                       atol=1e-9):
        raise AssertionError("ml.grad of softplus(x).sum() does not give sigmoid(x)")
    if not np.allclose(expect_array(raw.get("vjp"), x.shape, "ml.vjp"), u * s, rtol=1e-6,
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
    rule_jvp = array_of(op.jvp((ml.tensor(t),), (xt,), softplus(xt)))
    rule_vjp = _vjp_rule(op, softplus, x, u)
    with unguarded():
        _, tangent = ml.jvp(softplus, (x,), (t,))
    return {"ops": ops, "rule_jvp": rule_jvp, "rule_vjp": rule_vjp, "jvp": array_of(tangent)}


def _jvp_judge(raw, seed):
    _expect_own_op(raw)
    x, t, u = _jvp_inputs(seed)
    s = _sigmoid(x)
    jt = expect_array(raw.get("rule_jvp"), x.shape, "your JVP rule's tangent")
    if not np.allclose(jt, t * s, rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "your JVP rule should return the output tangent t * sigmoid(x) for the input tangent t"
        )
    jtu = expect_array(raw.get("rule_vjp"), x.shape, "your VJP rule's cotangent")
    lhs, rhs = float(np.dot(u, jt)), float(np.dot(jtu, t))
    if not np.isclose(lhs, rhs, rtol=1e-9):
        raise AssertionError(
            f"forward and reverse mode disagree: <u, J t> = {lhs:.9g} but <J^T u, t> = {rhs:.9g}"
        )
    if not np.allclose(expect_array(raw.get("jvp"), x.shape, "ml.jvp"), t * s, rtol=1e-6,
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
    return {"ops": ops, "second": array_of(d2)}


def _second_judge(raw):
    _expect_own_op(raw)
    s = _sigmoid(_SECOND)
    d2 = expect_array(raw.get("second"), _SECOND.shape, "grad(grad(softplus))")
    if not np.allclose(d2, s * (1 - s), rtol=1e-6, atol=1e-9):
        raise AssertionError(
            "grad(grad(softplus)) should be sigmoid(x) (1 - sigmoid(x)); write the VJP rule with "
            "ml.ops (not numpy) so it can be differentiated"
        )


register(
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
)
