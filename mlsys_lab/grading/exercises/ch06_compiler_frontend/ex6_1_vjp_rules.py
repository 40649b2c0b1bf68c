"""Exercise 6.1: VJP rules by hand, over numpy (``vjp_mul``, ``vjp_tanh``, ``vjp_matmul``).

Wrong ideas rejected: returning g * b without summing over the broadcast axes, summing only the
leading axes, or summing to a scalar gives the wrong shape on (3, 1) x (1, 4), (2, 1, 4) x
(3, 1) and friends; tanh' taken as 1 - x^2 (of x, not of tanh x) or cos-like mistakes give wrong
values; a transpose in the wrong place gives the wrong shape on non-square matrices; finite
differences miss the 1e-12 tolerance. `ml.vjp`, `ml.grad`, the tape, the ops' own VJP rules and
`unbroadcast` are off limits (``AUTODIFF``).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, expect_list, register
from mlsys_lab.grading.exercises.fixtures import AUTODIFF, as_array, as_arrays, from_wire

_MUL_SAME = ((3, 4), (5,), ())
_MUL_BROADCAST = (((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3), ()), ((4,), (2, 3, 4)),
                  ((2, 1, 4), (3, 1)))
_MATMUL = (((2, 3), (3, 5)), ((1, 4), (4, 1)), ((4, 4), (4, 2)))
_TANH = ((3, 4), (7,), (2, 3))


def _binary_inputs(seed: int, i: int, shapes, f):
    rng = np.random.default_rng([seed, i])
    a, b = (np.asarray(rng.standard_normal(s)) for s in shapes)
    return np.asarray(rng.standard_normal(np.shape(f(a, b)))), a, b


def _tanh_inputs(seed: int, i: int):
    rng = np.random.default_rng([seed, 50 + i])
    scale = 3.0 if i == 2 else 1.0  # saturating inputs too
    return rng.standard_normal(_TANH[i]), rng.standard_normal(_TANH[i]) * scale


def _mul_cases(shapes_list, offset):
    return [(offset + i, shapes) for i, shapes in enumerate(shapes_list)]


_SAME = _mul_cases([(s, s) for s in _MUL_SAME], 0)
_BROADCAST = _mul_cases(_MUL_BROADCAST, 10)
_MATMULS = _mul_cases(_MATMUL, 30)
def _binary_probe(name: str, f, cases):
    def probe(vjp_mul, vjp_tanh, vjp_matmul, seed):
        rule = {"vjp_mul": vjp_mul, "vjp_matmul": vjp_matmul}[name]
        return [as_arrays(rule(*_binary_inputs(seed, i, shapes, f))) for i, shapes in cases]

    return probe


_ML_BINARY = {"vjp_mul": lambda x, y: x * y, "vjp_matmul": lambda x, y: x @ y}


def _reference_vjp(f, g, *xs):
    import mlsys_lab as ml

    _, back = ml.vjp(f, *xs)
    return [t.numpy() for t in back(g)]


def _compare(got, expected, what, name):
    got = from_wire(got)
    if not isinstance(got, np.ndarray):
        raise AssertionError(f"{what}: the cotangent of {name} is {describe(got)}, not an array")
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: the cotangent of {name} has shape {got.shape}, expected "
                             f"{expected.shape} (the shape of {name})")
    err = float(np.max(np.abs(got.astype(np.float64) - expected), initial=0.0))
    if not err <= 1e-12 * max(1.0, float(np.max(np.abs(expected), initial=0.0))):
        raise AssertionError(f"{what}: the cotangent of {name} is off by up to {err:.3g}")


def _binary_judge(name: str, f, cases):
    def judge(raw, seed):
        for (i, shapes), got in zip(cases, expect_list(raw, len(cases), name), strict=True):
            g, a, b = _binary_inputs(seed, i, shapes, f)
            what = f"{name} with a{shapes[0]}, b{shapes[1]}"
            if not isinstance(got, list) or len(got) != 2:
                raise AssertionError(f"{what} should return a pair (grad_a, grad_b), got "
                                     f"{describe(got)}")
            ea, eb = _reference_vjp(_ML_BINARY[name], g, a, b)
            _compare(got[0], ea, what, "a")
            _compare(got[1], eb, what, "b")

    return judge


def _tanh_probe(vjp_mul, vjp_tanh, vjp_matmul, seed):
    return [as_array(vjp_tanh(*_tanh_inputs(seed, i))) for i in range(len(_TANH))]


def _tanh_judge(raw, seed):
    import mlsys_lab as ml

    for i, got in enumerate(expect_list(raw, len(_TANH), "vjp_tanh")):
        g, x = _tanh_inputs(seed, i)
        (expected,) = _reference_vjp(ml.ops.tanh, g, x)
        _compare(got, expected, f"vjp_tanh on x{_TANH[i]}", "x")


register(
    Exercise(
        id="6.1",
        title="VJP rules by hand",
        target=("vjp_mul", "vjp_tanh", "vjp_matmul"),
        task="the VJP rules",
        forbidden=AUTODIFF,
        cases=(
            Case("vjp_mul, equal shapes", 1, feedback="(g * b, g * a)",
                 probe=_binary_probe("vjp_mul", np.multiply, _SAME),
                 judge=_binary_judge("vjp_mul", np.multiply, _SAME)),
            Case("vjp_mul with broadcasting", 2, feedback="sum back over the broadcast axes",
                 probe=_binary_probe("vjp_mul", np.multiply, _BROADCAST),
                 judge=_binary_judge("vjp_mul", np.multiply, _BROADCAST)),
            Case("vjp_tanh", 1, feedback="g * (1 - tanh(x)^2)", probe=_tanh_probe,
                 judge=_tanh_judge),
            Case("vjp_matmul", 2, feedback="(g @ b^T, a^T @ g)",
                 probe=_binary_probe("vjp_matmul", np.matmul, _MATMULS),
                 judge=_binary_judge("vjp_matmul", np.matmul, _MATMULS)),
        ),
    ),
)
