"""Exercise 8.4: Winograd F(2,3) by hand, with its data × filter multiplies counted.

Wrong ideas rejected: the direct correlation multiplies 6 times; the book's misprinted Aᵀ (first
row 1, 1, -1, 0) gives wrong outputs; converting to floats (``np.asarray(..., float)``, the
library's ``winograd_f23``, ``np.correlate``) cannot count multiplies and is refused or raises
on the counting inputs.
"""

import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, plain, register


class _Counted:
    """A number that counts multiplies between two input-dependent values (data × filter)."""

    counter = None  # a one-element list, set by the case

    __array_priority__ = 1000  # numpy hands arithmetic with ndarrays to us

    def __init__(self, value):
        self.value = float(value)

    @staticmethod
    def _value(other):
        if isinstance(other, _Counted):
            return other.value
        if isinstance(other, (int, float, np.integer, np.floating)):
            return float(other)
        return NotImplemented

    def _binary(self, other, op, count=False):
        value = self._value(other)
        if value is NotImplemented:
            return NotImplemented
        if count and isinstance(other, _Counted):
            _Counted.counter[0] += 1
        return _Counted(op(self.value, value))

    def __add__(self, other):
        return self._binary(other, lambda x, y: x + y)

    def __radd__(self, other):
        return self._binary(other, lambda x, y: y + x)

    def __sub__(self, other):
        return self._binary(other, lambda x, y: x - y)

    def __rsub__(self, other):
        return self._binary(other, lambda x, y: y - x)

    def __mul__(self, other):
        return self._binary(other, lambda x, y: x * y, count=True)

    def __rmul__(self, other):
        return self._binary(other, lambda x, y: y * x, count=True)

    def __truediv__(self, other):
        if isinstance(other, _Counted):
            raise TypeError("divide only by constants in Winograd F(2,3)")
        return self._binary(other, lambda x, y: x / y)

    def __neg__(self):
        return _Counted(-self.value)

    def __pos__(self):
        return self

    def __float__(self):
        raise TypeError("the check passes special numbers that count multiplies; do the "
                        "arithmetic on the elements as given (no float(...) or dtype=float)")


def _correlation(d, g):
    """The 3-tap correlation at two positions (the judges' reference)."""
    return np.correlate(np.asarray(d, np.float64), np.asarray(g, np.float64), "valid").tolist()


def _winograd_inputs(seed):
    rng = np.random.default_rng(8400 + seed)
    cases = [([1.0, 2.0, 3.0, 4.0], [1.0, 0.0, -1.0])]
    return cases + [([float(x) for x in rng.standard_normal(4)],
                     [float(x) for x in rng.standard_normal(3)]) for _ in range(20)]


def _as_list(result):
    """The answer's outputs as a list (a list, a tuple or an array of numbers)."""
    if isinstance(result, np.ndarray):
        return [v.item() if isinstance(v, np.generic) else v for v in result.ravel()]
    return plain(list(result)) if isinstance(result, (list, tuple)) else result


def _winograd_values_probe(winograd_f23, seed):
    return [_as_list(winograd_f23(list(d), list(g))) for d, g in _winograd_inputs(seed)]


COUNTED_D, COUNTED_G = (0.5, -1.25, 2.0, 0.75), (1.5, -0.5, 0.25)


def _winograd_multiplies_probe(winograd_f23):
    _Counted.counter = [0]
    try:
        result = _as_list(winograd_f23([_Counted(v) for v in COUNTED_D],
                                       [_Counted(v) for v in COUNTED_G]))
    finally:
        count, _Counted.counter = _Counted.counter[0], None
    if isinstance(result, list):
        result = [v.value if isinstance(v, _Counted) else v for v in result]
    return {"count": count, "values": result}


def _two_numbers(values, what):
    if not isinstance(values, list) or len(values) != 2:
        raise AssertionError(f"{what} returned {describe(values)}; F(2,3) gives 2 outputs")
    if not all(isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_)) for v in values):
        raise AssertionError(f"{what} returned {describe(values)}; return 2 numbers")
    return [float(v) for v in values]


def _winograd_values_judge(raw, seed):
    cases = _winograd_inputs(seed)
    if not isinstance(raw, list) or len(raw) != len(cases):
        raise AssertionError(f"expected {len(cases)} results, got {describe(raw)}")
    for (d, g), values in zip(cases, raw):
        got = _two_numbers(values, "winograd_f23")
        expected = _correlation(d, g)
        if not np.allclose(got, expected, rtol=1e-9, atol=1e-12):
            shown = [round(x, 4) for x in d], [round(x, 4) for x in g]
            raise AssertionError(
                f"winograd_f23(d={shown[0]}, g={shown[1]}) returned "
                f"{[round(x, 6) for x in got]}, expected {[round(x, 6) for x in expected]} "
                "(the 3-tap correlation at two positions); check your output transform Aᵀ"
            )


def _winograd_multiplies_judge(raw):
    if not isinstance(raw, dict) or "count" not in raw:
        raise AssertionError(f"the check got {describe(raw)}")
    got = _two_numbers(raw["values"], "winograd_f23 on the counting inputs")
    if not np.allclose(got, _correlation(COUNTED_D, COUNTED_G)):
        raise AssertionError("winograd_f23 gave wrong outputs on the counting inputs")
    if raw["count"] != 4:
        raise AssertionError(
            f"winograd_f23 multiplied input-dependent values {raw['count']} times; Winograd "
            "F(2,3) needs exactly 4 (the element-wise product of the transformed filter and "
            "data; the transforms themselves only add, subtract or scale by constants)"
        )


register(
    Exercise(
        id="8.4",
        title="Winograd F(2,3) by hand",
        target="winograd_f23",
        task="Winograd F(2,3)",
        forbidden=("mlsys_lab.kernels.conv", "mlsys_lab.kernels.winograd", "numpy:correlate",
                   "numpy:convolve"),
        cases=(
            Case("equals the direct 3-tap correlation", 2, feedback="y = Aᵀ[(G g) ⊙ (Bᵀ d)]",
                 probe=_winograd_values_probe, judge=_winograd_values_judge),
            Case("4 data × filter multiplies (direct: 6)", 1,
                 feedback="only the element-wise product multiplies data by filter",
                 probe=_winograd_multiplies_probe, judge=_winograd_multiplies_judge),
        ),
    ),
)
