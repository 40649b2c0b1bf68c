"""Exercise 7.4: decode every bit pattern of an 8-bit float.

A decoder for 8-bit floats of any exponent width and bias, on formats that neither numpy nor
``ml_dtypes`` knows.

Wrong ideas rejected: numpy's float16 (or an ml_dtypes float8, rescaled) decodes none of these
formats (E2M5, E6M1 and non-standard biases); the normal-number formula applied everywhere gets
subnormals, infinities and NaN wrong; a subnormal exponent of ``-bias`` instead of ``1 - bias``
is off by 2x; dropping the sign of zero fails -0.0; a table fails because the biases change
every run.
"""

import math
import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    Opaque,
    Raised,
    describe,
    expect_list,
    plain,
    register,
)

# ----------------------------------------------------------------------------- inputs (both sides)

#: (exponent bits, bias) of the fixed formats; none is a format numpy or ml_dtypes has (their
#: 8-bit floats are E4M3 with bias 7, 8 or 11, E5M2 with bias 15 or 16, E3M4 with bias 3).
NORMAL_FORMATS = [(4, 9), (6, 40), (2, 2)]
SPECIAL_FORMATS = [(3, 5), (2, 1), (5, 13), (4, 4)]


def _format_biases(seed):
    """A non-standard bias for each exponent width 2..6, drawn from ``seed``."""
    rng = np.random.default_rng(7400 + seed)
    out = []
    for e in range(2, 7):
        choices = [b for b in range(1, 2 ** e) if b != 2 ** (e - 1) - 1 and b != 2 ** (e - 1)]
        out.append((e, int(rng.choice(choices))))
    return out


def _normal_patterns(exp_bits):
    """Ten normal patterns of the format (exponent neither 0 nor all ones), both signs."""
    rng = np.random.default_rng(100 + exp_bits)
    top = (1 << exp_bits) - 1
    pats = []
    while len(pats) < 10:
        b = int(rng.integers(0, 256))
        e = (b >> (7 - exp_bits)) & top
        if 0 < e < top and b not in pats:
            pats.append(b)
    return pats


def _special_patterns(exp_bits):
    m_bits = 7 - exp_bits
    top = ((1 << exp_bits) - 1) << m_bits
    mmax = (1 << m_bits) - 1
    patterns = [0x00, 0x80, 0x01, mmax, 0x80 | (mmax >> 1 or 1), 0x80 | mmax,  # zeros, subnormals
                top, 0x80 | top]  # infinities
    if m_bits:
        patterns += [top | 1, top | mmax, 0x80 | top | (1 << (m_bits - 1))]  # NaNs
    return patterns


def _fp8_reference(bits, exp_bits, bias):
    """The value of an 8-bit float: 1 sign, ``exp_bits`` exponent and ``7 - exp_bits`` mantissa
    bits, IEEE 754 rules for exponent 0 (subnormal) and all ones (inf / NaN)."""
    m_bits = 7 - exp_bits
    s, e, m = bits >> 7, (bits >> m_bits) & ((1 << exp_bits) - 1), bits & ((1 << m_bits) - 1)
    sign = -1.0 if s else 1.0
    if e == (1 << exp_bits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + m, e - bias - m_bits)


# ----------------------------------------------------------------------------- probes


def _decode_raw(decode_fp8, formats, patterns_of):
    return [[plain(decode_fp8(b, e, bias)) for b in patterns_of(e)] for e, bias in formats]


def _all_patterns(exp_bits):
    return list(range(256))


def _fp8_normal_probe(decode_fp8):
    return _decode_raw(decode_fp8, NORMAL_FORMATS, _normal_patterns)


def _fp8_special_probe(decode_fp8):
    return _decode_raw(decode_fp8, SPECIAL_FORMATS, _special_patterns)


def _fp8_all_probe(decode_fp8, seed):
    return _decode_raw(decode_fp8, _format_biases(seed), _all_patterns)


# ----------------------------------------------------------------------------- judges


def _compare_fp8(raw, formats, patterns_of, what):
    raw = expect_list(raw, len(formats), what)
    for (e, bias), values in zip(formats, raw):
        patterns = patterns_of(e)
        values = expect_list(values, len(patterns), f"{what}, E{e}M{7 - e} bias {bias}")
        for b, got in zip(patterns, values):
            call = f"decode_fp8(0b{b:08b}, {e}, {bias})"
            if isinstance(got, (bool, np.bool_, Opaque, Raised)) or \
                    not isinstance(got, numbers.Real):
                raise AssertionError(f"{what}: {call} returned {describe(got)}; return a float")
            got, want = float(got), _fp8_reference(b, e, bias)
            if math.isnan(want):
                if not math.isnan(got):
                    raise AssertionError(f"{what}: {call} = {got!r}; expected nan")
            elif got != want or math.copysign(1.0, got) != math.copysign(1.0, want):
                raise AssertionError(f"{what}: {call} = {got!r}; expected {want!r}")


def _fp8_normal_judge(raw):
    _compare_fp8(raw, NORMAL_FORMATS, _normal_patterns, "normal numbers")


def _fp8_special_judge(raw):
    _compare_fp8(raw, SPECIAL_FORMATS, _special_patterns, "zeros, subnormals, infinities, NaN")


def _fp8_all_judge(raw, seed):
    _compare_fp8(raw, _format_biases(seed), _all_patterns, "all 256 patterns")


register(
    Exercise(
        id="7.4",
        title="Decode every bit pattern of an 8-bit float",
        target="decode_fp8",
        task="the bit-level decoding",
        forbidden=("numpy:frombuffer", "numpy:ndarray.view", "numpy:generic.view",
                   "struct:unpack"),
        cases=(
            Case("normal numbers (E4M3 bias 9, E6M1 bias 40, E2M5 bias 2)", 1,
                 feedback="(-1)^s · 2^(e - bias) · (1 + m / 2^M)",
                 probe=_fp8_normal_probe, judge=_fp8_normal_judge),
            Case("zeros, subnormals, infinities and NaN", 2,
                 feedback="exponent 0: subnormal; all ones: inf or NaN",
                 probe=_fp8_special_probe, judge=_fp8_special_judge),
            Case("all 256 patterns of E2M5 .. E6M1 with random biases", 2,
                 feedback="every pattern of every format", probe=_fp8_all_probe,
                 judge=_fp8_all_judge),
        ),
    ),
)
