"""Exercise 6.2: forward mode with dual numbers (the book's ``y = ln(x1) + x1 x2 - sin(x2)`` at
(2, 5)).

Wrong ideas rejected: a product rule of tangents alone (da db), sin giving cos(a) without the
factor da, or log giving 1/a, pass the book's seed (da = 1) but not the random tangents;
`1.5 - x` computed as x - 1.5 fails the reflected operators; updating x in place fails "changed
x"; tangents from finite differences miss the 1e-9 tolerance. `ml.jvp`, the rest of autodiff
and the ops' JVP rules are off limits (``AUTODIFF``).
"""

from __future__ import annotations

import math

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, expect_list, register
from mlsys_lab.grading.exercises.fixtures import AUTODIFF, as_array, from_wire


def _dual_out(y, Dual):
    return {"is_dual": isinstance(y, Dual), "type": type(y).__name__,
            "value": as_array(getattr(y, "value", None)),
            "tangent": as_array(getattr(y, "tangent", None))}


def _book_y(x1, x2):
    return x1.log() + x1 * x2 - x2.sin()


def _dual_book_probe(Dual):
    return [_dual_out(_book_y(Dual(2.0, 1.0), Dual(5.0, 0.0)), Dual),
            _dual_out(_book_y(Dual(2.0, 0.0), Dual(5.0, 1.0)), Dual)]


def _number(x, what):
    x = from_wire(x)
    if isinstance(x, np.ndarray) and x.shape == () and x.dtype.kind in "iuf":
        return float(x)
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        return float(x)
    raise AssertionError(f"{what} is {describe(x)}, not a number")


def _dual_result(out, what):
    if not isinstance(out, dict) or not out.get("is_dual"):
        got = out.get("type") if isinstance(out, dict) else describe(out)
        raise AssertionError(f"{what} gave a {got}, expected an instance of your Dual class")
    return _number(out["value"], f"{what}: .value"), _number(out["tangent"], f"{what}: .tangent")


def _dual_x1_judge(raw):
    value, tangent = _dual_result(expect_list(raw, 2, "the book's y")[0], "y at (2, 5)")
    expected = math.log(2.0) + 10.0 - math.sin(5.0)
    if not math.isclose(value, expected, rel_tol=1e-12):
        raise AssertionError(f"at (2, 5) y.value is {value!r}, expected {expected!r}")
    if not math.isclose(tangent, 5.5, rel_tol=1e-12):
        raise AssertionError(f"seeding x1 (tangents 1, 0) gave dy = {tangent!r}, expected "
                             f"5.5 = 1/x1 + x2")


def _dual_x2_judge(raw):
    _, tangent = _dual_result(expect_list(raw, 2, "the book's y")[1], "y at (2, 5)")
    expected = 2.0 - math.cos(5.0)
    if not math.isclose(tangent, expected, rel_tol=1e-12):
        raise AssertionError(f"seeding x2 (tangents 0, 1) gave dy = {tangent!r}, expected "
                             f"{expected:.6f} = x1 - cos(x2)")


_NUMBER_CASES = [
    ("x + 1.5", lambda x: x + 1.5, 4.5, 2.0),
    ("1.5 + x", lambda x: 1.5 + x, 4.5, 2.0),
    ("x - 1.5", lambda x: x - 1.5, 1.5, 2.0),
    ("1.5 - x", lambda x: 1.5 - x, -1.5, -2.0),
    ("x * 4", lambda x: x * 4, 12.0, 8.0),
    ("4 * x", lambda x: 4 * x, 12.0, 8.0),
    ("x * x", lambda x: x * x, 9.0, 12.0),
    ("x - x", lambda x: x - x, 0.0, 0.0),
]


def _dual_numbers_probe(Dual):
    out = []
    for _, f, _, _ in _NUMBER_CASES:
        x = Dual(3.0, 2.0)
        y = f(x)
        out.append([_dual_out(y, Dual), _dual_out(x, Dual)])
    return out


def _dual_numbers_judge(raw):
    for (label, _, value, tangent), got in zip(_NUMBER_CASES, expect_list(raw, len(_NUMBER_CASES),
                                                                      "+, -, *"), strict=True):
        what = f"{label} with x = Dual(3, 2)"
        y, x = expect_list(got, 2, what)
        pair = _dual_result(y, what)
        if not (math.isclose(pair[0], value, abs_tol=1e-12)
                and math.isclose(pair[1], tangent, abs_tol=1e-12)):
            raise AssertionError(f"{what} gave (value, tangent) = {pair}, expected "
                                 f"{(value, tangent)}")
        if _dual_result(x, what) != (3.0, 2.0):
            raise AssertionError(f"{label} changed x itself; return a new Dual instead")


def _expr(x1, x2, sin, log):
    return sin(x1 * x2) * log(x1 * x1 + 1.0) - 3.0 * x2 + x1 * sin(x2) + log(x2 * x2 + 2.0)


def _random_points(seed: int):
    rng = np.random.default_rng([seed, 6])
    return [(rng.standard_normal(2), rng.standard_normal(2)) for _ in range(6)]


def _dual_random_probe(Dual, seed):
    return [_dual_out(_expr(Dual(float(p[0]), float(t[0])), Dual(float(p[1]), float(t[1])),
                            lambda d: d.sin(), lambda d: d.log()), Dual)
            for p, t in _random_points(seed)]


def _dual_random_judge(raw, seed):
    import mlsys_lab as ml

    points = _random_points(seed)
    for i, ((p, t), got) in enumerate(zip(points, expect_list(raw, len(points), "random points"),
                                          strict=True)):
        what = f"random point #{i} x = {np.round(p, 3).tolist()}, tangent {np.round(t, 3).tolist()}"
        _, tangent = _dual_result(got, what)
        _, expected = ml.jvp(lambda a, b: _expr(a, b, ml.ops.sin, ml.ops.log), (p[0], p[1]),
                             (t[0], t[1]))
        expected = float(expected.numpy())
        if not math.isclose(tangent, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError(f"{what}: your tangent {tangent:.12g}, forward mode gives "
                                 f"{expected:.12g}")


_X1 = np.array([1.0, 2.0, 3.0])
_X2 = np.array([0.5, 5.0, -1.0])


def _dual_arrays_probe(Dual):
    return _dual_out(_book_y(Dual(_X1.copy(), np.ones(3)), Dual(_X2.copy(), np.zeros(3))), Dual)


def _dual_arrays_judge(raw):
    got = from_wire(raw.get("tangent") if isinstance(raw, dict) else raw)
    expected = 1.0 / _X1 + _X2
    if not (isinstance(got, np.ndarray) and got.shape == (3,)
            and np.allclose(got.astype(np.float64), expected, rtol=1e-12)):
        raise AssertionError(f"with numpy arrays as values, dy = {describe(got)}, expected "
                             f"{np.round(expected, 4).tolist()}; use np.sin/np.cos/np.log so "
                             f"arrays work too")


register(
    Exercise(
        id="6.2",
        title="Forward mode with dual numbers",
        target="Dual",
        task="forward mode (the dual-number rules)",
        forbidden=AUTODIFF,
        cases=(
            Case("book: dy = 5.5 at (2, 5)", 1, feedback="1/x1 + x2",
                 probe=_dual_book_probe, judge=_dual_x1_judge),
            Case("book: seeding x2 gives 2 - cos 5", 1, feedback="x1 - cos(x2)",
                 probe=_dual_book_probe, judge=_dual_x2_judge),
            Case("+, -, * with numbers on either side", 1, feedback="lift numbers to Duals",
                 probe=_dual_numbers_probe, judge=_dual_numbers_judge),
            Case("random points and tangents", 1.5, feedback="the product and chain rules",
                 probe=_dual_random_probe, judge=_dual_random_judge),
            Case("numpy arrays as values", 0.5, feedback="use np.sin/np.cos/np.log",
                 probe=_dual_arrays_probe, judge=_dual_arrays_judge),
        ),
    ),
)
