"""Exercise 10.2: a per-channel symmetric int8 quantiser calibrated over several batches.

Wrong ideas rejected: one scale for the whole tensor (per tensor) differs from per-channel
scales when channels differ by 1000x; max(x) instead of max|x| misses the mostly-negative
channels; an asymmetric (max - min) / 255 scale or a zero point differs from max|x| / 127;
keeping only the last batch's range loses the peaks the earlier batches held; floor or
truncation instead of round is seen at the fractional steps 0.62 and 0.85; no clipping wraps
around in the int8 cast and a qmin of -128 lets -128 appear, both seen at 3x the range; qmax
fixed at 127 fails bits=4; returning floats instead of int8 fails every value case. The judges
name the wrong scale an answer's numbers match (``_q_wrong_scales``).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register
from mlsys_lab.grading.exercises.ch10_model_deployment.common import (
    expect_array,
    expect_not_raised,
)

# ----------------------------------------------------------------------------- inputs (both sides)


def _q_batches(seed, axis=1, channels=5, asym=True):
    """Three calibration batches whose channels have very different ranges; in some channels
    most values are negative (so max(x) is not max|x|), and each batch holds the largest value
    of some channel (so the last batch alone is not the range)."""
    rng = np.random.default_rng(10200 + seed + 31 * axis)
    spread = 10.0 ** rng.uniform(-2, 1, channels)
    batches = []
    for k in range(3):
        x = rng.standard_normal((6, channels, 2)) * spread[None, :, None] * 0.3
        if asym:
            x[:, ::2] -= 2.0 * spread[None, ::2, None]     # even channels mostly negative
        peak = k % channels
        x[0, peak::3, 0] = 3.0 * spread[peak::3] * (-1.0 if peak % 2 == 0 else 1.0)
        batches.append(np.moveaxis(x, 1, axis).copy() if axis != 1 else x)
    return batches


def _q_reference_scale(batches, axis, bits=8):
    qmax = 2 ** (bits - 1) - 1
    amax = np.max([np.moveaxis(np.abs(b), axis, 0).reshape(b.shape[axis], -1).max(1)
                   for b in batches], axis=0)
    return np.where(amax > 0, amax / qmax, 1.0)


def _q_reference(x, scale, axis, bits=8):
    qmax = 2 ** (bits - 1) - 1
    shape = [1] * x.ndim
    shape[axis] = -1
    return np.clip(np.rint(x / scale.reshape(shape)), -qmax, qmax).astype(np.int8)


def _q_wrong_scales(batches, axis, bits=8):
    qmax = 2 ** (bits - 1) - 1
    per = [np.moveaxis(b, axis, 0).reshape(b.shape[axis], -1) for b in batches]
    lo = np.min([p.min(1) for p in per], axis=0)
    hi = np.max([p.max(1) for p in per], axis=0)
    amax = np.maximum(-lo, hi)
    last = np.abs(per[-1]).max(1)
    return {
        "one scale for the whole tensor (per tensor, not per channel)":
            np.full_like(amax, amax.max() / qmax),
        "max(x) / 127 instead of max|x| / 127": np.maximum(hi, 0) / qmax,
        "the asymmetric scale (max - min) / 255": (np.maximum(hi, 0) - np.minimum(lo, 0)) / 255,
        "the asymmetric scale (max - min) / 254": (np.maximum(hi, 0) - np.minimum(lo, 0)) / 254,
        "max|x| / 128 (qmax 128)": amax / (qmax + 1),
        "the range of the last batch only (calibration must keep the max over all batches)":
            last / qmax,
    }


def _q_build(ChannelQuantizer, batches, axis, bits=8):
    quantizer = ChannelQuantizer(axis, bits) if bits != 8 else ChannelQuantizer(axis)
    for b in batches:
        quantizer.observe(b.copy())
    return quantizer


def _q_grid_input(batches, axis, seed, factor=1.0, bits=8):
    """Test values at k + f steps of each channel's scale, as calibrated on ``batches`` (f far
    from 1/2: no rounding ties). The scale is worked out here, not with ``_q_reference_scale``:
    a function the probes call is not refused, and that one answers ``scale()``."""
    qmax = 2 ** (bits - 1) - 1
    per = [np.moveaxis(np.abs(b), axis, 0).reshape(b.shape[axis], -1) for b in batches]
    top = np.max([p.max(1) for p in per], axis=0)
    scale = np.where(top > 0, top / qmax, 1.0)
    rng = np.random.default_rng(10250 + seed)
    c = scale.size
    k = rng.integers(-120, 121, (4, c, 6)).astype(np.float64)
    f = rng.choice([0.12, 0.3, 0.62, 0.85, -0.3, -0.7], (4, c, 6))
    x = (k + f) * scale[None, :, None] * factor
    return np.moveaxis(x, 1, axis).copy() if axis != 1 else x


# ----------------------------------------------------------------------------- probes


def _q_scale_probe(ChannelQuantizer, seed, axis=1):
    batches = _q_batches(seed, axis)
    return attempt(lambda: np.asarray(_q_build(ChannelQuantizer, batches, axis).scale()))


def _q_scale_axis0_probe(ChannelQuantizer, seed):
    return _q_scale_probe(ChannelQuantizer, seed, axis=0)


def _q_round_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed, 1)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 1)
        return np.asarray(quantizer.quantize(_q_grid_input(batches, 1, seed)))
    return attempt(run)


def _q_clip_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed, 0)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 0)
        return np.asarray(quantizer.quantize(_q_grid_input(batches, 0, seed, factor=3.0)))
    return attempt(run)


def _q_bits_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed + 3, 1)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 1, bits=4)
        scale = np.asarray(quantizer.scale())
        x = _q_grid_input(batches, 1, seed, bits=4) / 12.0
        return {"scale": scale, "q": np.asarray(quantizer.quantize(x))}
    return attempt(run)


def _q_round_trip_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed + 5, 1)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 1)
        x = batches[1]
        return np.asarray(quantizer.dequantize(quantizer.quantize(x)), np.float64)
    return attempt(run)


# ----------------------------------------------------------------------------- judges


def _q_scale_judge(raw, seed, axis=1):
    what = f"scales of 5 channels on axis {axis}, calibrated on 3 batches"
    batches = _q_batches(seed, axis)
    want = _q_reference_scale(batches, axis)
    got = expect_array(expect_not_raised(raw, what), what).astype(np.float64).reshape(-1)
    if got.size != want.size:
        raise AssertionError(f"{what}: expected {want.size} scales (one per channel), got "
                             f"{got.size}")
    if np.allclose(got, want, rtol=1e-9):
        return
    for idea, s in _q_wrong_scales(batches, axis).items():
        if np.allclose(got, s, rtol=1e-6):
            raise AssertionError(f"{what}: your scales match {idea}")
    raise AssertionError(f"{what}: expected {np.round(want, 6).tolist()}, got "
                         f"{np.round(got, 6).tolist()} (max |x| per channel over every batch, "
                         f"/ 127)")


def _q_scale_axis0_judge(raw, seed):
    _q_scale_judge(raw, seed, axis=0)


def _q_values_judge(got, want, x_desc):
    if got.dtype != np.int8:
        hint = ""
        if got.dtype.kind == "f":
            hint = " (the integers themselves, not the dequantised values)"
        raise AssertionError(f"{x_desc}: expected int8 values, got dtype {got.dtype}{hint}")
    if np.array_equal(got, want):
        return
    bad = np.argwhere(got != want)[0]
    g, w = int(got[tuple(bad)]), int(want[tuple(bad)])
    raise AssertionError(f"{x_desc}: at index {tuple(int(i) for i in bad)} expected {w}, got "
                         f"{g}")


def _q_round_judge(raw, seed):
    what = "values at k + f steps (f = 0.12, 0.3, 0.62, 0.85, -0.3, -0.7)"
    batches = _q_batches(seed, 1)
    scale = _q_reference_scale(batches, 1)
    x = _q_grid_input(batches, 1, seed)
    want = _q_reference(x, scale, 1)
    got = expect_array(expect_not_raised(raw, what), what, want.shape)
    if got.dtype == np.int8 and not np.array_equal(got, want):
        shape = [1] * x.ndim
        shape[1] = -1
        t = x / scale.reshape(shape)
        if np.array_equal(got, np.clip(np.floor(t), -127, 127).astype(np.int8)):
            raise AssertionError(f"{what}: your values are floor(x / s); round to the nearest "
                                 f"integer (np.rint)")
        if np.array_equal(got, np.clip(np.trunc(t), -127, 127).astype(np.int8)):
            raise AssertionError(f"{what}: your values are x / s truncated toward 0 (astype "
                                 f"without rounding); round to the nearest integer first")
    _q_values_judge(got, want, what)


def _q_clip_judge(raw, seed):
    what = "values up to 3x the calibrated range"
    batches = _q_batches(seed, 0)
    scale = _q_reference_scale(batches, 0)
    x = _q_grid_input(batches, 0, seed, factor=3.0)
    want = _q_reference(x, scale, 0)
    got = expect_array(expect_not_raised(raw, what), what, want.shape)
    if got.dtype == np.int8 and not np.array_equal(got, want):
        if np.any((np.abs(got.astype(int) - want.astype(int)) > 2) & (np.abs(want) == 127)):
            raise AssertionError(f"{what}: values beyond the range wrapped around; clip to "
                                 f"[-127, 127] before casting to int8")
        if int(got.min()) == -128:
            raise AssertionError(f"{what}: -128 appears; symmetric int8 uses [-127, 127] "
                                 f"(qmin = -qmax), so that -x quantises to -q")
    _q_values_judge(got, want, what)


def _q_bits_judge(raw, seed):
    what = "bits=4"
    batches = _q_batches(seed + 3, 1)
    expect_not_raised(raw, what)
    if not isinstance(raw, dict) or set(raw) != {"scale", "q"}:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    want_s = _q_reference_scale(batches, 1, 4)
    got_s = expect_array(raw["scale"], f"{what}: scales").astype(np.float64).reshape(-1)
    if got_s.size != want_s.size or not np.allclose(got_s, want_s, rtol=1e-9):
        hint = ""
        if got_s.size == want_s.size and np.allclose(got_s, _q_reference_scale(batches, 1),
                                                     rtol=1e-9):
            hint = " (that is 8 bits: qmax = 2**(bits - 1) - 1 = 7 for 4 bits)"
        raise AssertionError(f"{what}: scales should be max|x| / 7{hint}")
    x = _q_grid_input(batches, 1, seed, bits=4) / 12.0
    want = np.clip(np.rint(x / want_s[None, :, None]), -7, 7).astype(np.int8)
    got = expect_array(raw["q"], f"{what}: values", want.shape)
    if got.dtype == np.int8 and int(np.abs(got.astype(int)).max()) > 7:
        raise AssertionError(f"{what}: values beyond ±7 appear; clip to [-qmax, qmax]")
    _q_values_judge(got, want, what)


def _q_round_trip_judge(raw, seed):
    what = "dequantize(quantize(x)) on a calibration batch"
    batches = _q_batches(seed + 5, 1)
    scale = _q_reference_scale(batches, 1)
    x = batches[1]
    got = expect_array(expect_not_raised(raw, what), what, x.shape)
    want = _q_reference(x, scale, 1).astype(np.float64) * scale[None, :, None]
    if np.allclose(got, want, rtol=1e-9, atol=1e-12):
        return
    err = np.abs(got - x) / scale[None, :, None]
    raise AssertionError(f"{what}: expected s * q; the error is up to {float(err.max()):.3g} "
                         f"steps (at most 1/2 within the calibrated range)")


register(
    Exercise(
        id="10.2",
        title="A per-channel symmetric int8 quantiser with calibration",
        target="ChannelQuantizer",
        task="the per-channel quantiser",
        forbidden=(
            "mlsys_lab.deploy.quant.params",
            "mlsys_lab.deploy.quant.observers",
            "mlsys_lab.deploy.quant.ops",
            "mlsys_lab.deploy.quant.ptq",
            "mlsys_lab.deploy.quant.qat",
            "mlsys_lab.deploy.quant.int8_kernels",
            "mlsys_lab.deploy.passes",
        ),
        cases=(
            Case("scales: max |x| per channel over all batches / 127", 2,
                 feedback="keep the running max of |x| per channel; scale = amax / qmax",
                 probe=_q_scale_probe, judge=_q_scale_judge),
            Case("channels on axis 0 (a conv weight)", 1,
                 feedback="reduce over every axis but `axis`",
                 probe=_q_scale_axis0_probe, judge=_q_scale_axis0_judge),
            Case("quantize rounds to the nearest step", 2, feedback="np.rint(x / scale)",
                 probe=_q_round_probe, judge=_q_round_judge),
            Case("beyond the range: clipped to [-127, 127], int8", 2,
                 feedback="np.clip before astype(np.int8); qmin = -qmax",
                 probe=_q_clip_probe, judge=_q_clip_judge),
            Case("bits=4: qmax = 7", 1, feedback="qmax = 2**(bits - 1) - 1",
                 probe=_q_bits_probe, judge=_q_bits_judge),
            Case("dequantize(q) = scale * q", 1, feedback="multiply back per channel",
                 probe=_q_round_trip_probe, judge=_q_round_trip_judge),
        ),
    ),
)
