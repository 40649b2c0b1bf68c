"""Checks for chapter 10, model deployment (``solutions/ch10_model_deployment.ipynb``).

10.1 folding a batch norm into the conv / linear layer before it, checked exactly in float64;
10.2 a per-channel symmetric int8 quantiser calibrated over several batches; 10.3 magnitude
pruning to an exact sparsity target, global or per layer.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references in float64 and decide,
and name the wrong idea an answer's numbers match where they can.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ============================================================================= shared helpers


def _array(raw, what, shape=None, kind=None):
    """``raw`` as an ndarray of ``shape`` (and dtype kind), else a failed case."""
    if not isinstance(raw, np.ndarray):
        raise AssertionError(f"{what}: expected a numpy array, got {describe(raw)}")
    if shape is not None and tuple(raw.shape) != tuple(shape):
        raise AssertionError(f"{what}: expected shape {tuple(shape)}, got {tuple(raw.shape)}")
    if kind is not None and raw.dtype.kind not in kind:
        raise AssertionError(f"{what}: expected a {'bool' if kind == 'b' else kind} array, "
                             f"got dtype {raw.dtype}")
    return raw


def _raised(raw, what):
    if isinstance(raw, dict) and "raised" in raw:
        raise AssertionError(f"{what}: your code raised {raw['raised']}")
    return raw


def _call(fn, *args, **kwargs):
    """``fn(...)``, or ``{"raised": description}`` when it raised."""
    from mlsys_lab.grading.core.wire import Raised

    out = attempt(fn, *args, **kwargs)
    if isinstance(out, Raised):
        return {"raised": f"{out.type_name}: {out.message}"}
    return out


# ============================================================================= 10.1 BN folding
# ----------------------------------------------------------------------------- inputs (both sides)


#: How far the running means (and the shifts beta) lie from zero in 10.1's inputs.
STAT_OFFSET = (1e5, 1e6)


def _bn_case(seed, kind, with_bias=True, tiny_var=False, square=False):
    """Weights and batch-norm statistics in float64: a conv (O, I, kh, kw) with O != I, or a
    linear weight stored (in, out) as mlsys_lab's Linear stores it."""
    rng = np.random.default_rng(10100 + seed + (7 if kind == "linear" else 0))
    if kind == "conv":
        o, i = 5, 3
        w = rng.standard_normal((o, i, 3, 3))
    else:
        o = 6
        i = o if square else 4
        w = rng.standard_normal((i, o))
    b = rng.standard_normal(o) if with_bias else None
    gamma = rng.uniform(0.5, 2.0, o) * rng.choice([-1.0, 1.0], o)
    beta = rng.standard_normal(o)
    mean = rng.standard_normal(o) * 2.0
    var = rng.uniform(1e-6, 4e-6, o) if tiny_var else rng.uniform(0.2, 4.0, o)
    eps = 1e-3 if tiny_var else 1e-5
    # Running means far from zero (as after unnormalised inputs), and shifts of the same size
    # and sign as (b - mean) * scale, so b' is as large and never cancels: the closed form is
    # exact to a few ulps, while W' and b' read off evaluations of the unfolded layers
    # (f(e_k) - f(0), with f(0) ~ 1e6) lose about six digits and miss the 1e-12 tolerance.
    mean = mean + rng.uniform(*STAT_OFFSET, o) * rng.choice([-1.0, 1.0], o)
    side = np.sign(((0.0 if b is None else b) - mean) * gamma)
    beta = beta + side * rng.uniform(*STAT_OFFSET, o)
    return w, b, gamma, beta, mean, var, eps


def _bn_reference(w, b, gamma, beta, mean, var, eps, kind):
    scale = gamma / np.sqrt(var + eps)
    shaped = scale[:, None, None, None] if kind == "conv" else scale[None, :]
    bias = np.zeros_like(mean) if b is None else b
    return w * shaped, (bias - mean) * scale + beta


def _bn_wrong_ideas(w, b, gamma, beta, mean, var, eps, kind):
    """What the named wrong ideas compute, for the judge's hints."""
    ideas = {}
    bias = np.zeros_like(mean) if b is None else b
    scale = gamma / np.sqrt(var + eps)
    shaped = scale[:, None, None, None] if kind == "conv" else scale[None, :]
    right_w = w * shaped
    s_var = gamma / (var + eps)
    ideas["var + eps instead of sqrt(var + eps)"] = (
        w * (s_var[:, None, None, None] if kind == "conv" else s_var[None, :]),
        (bias - mean) * s_var + beta)
    s_noeps = gamma / np.sqrt(var)
    ideas["sqrt(var) without eps"] = (
        w * (s_noeps[:, None, None, None] if kind == "conv" else s_noeps[None, :]),
        (bias - mean) * s_noeps + beta)
    ideas["the bias left out (b' = beta - mean * scale, the layer's own b forgotten)"] = (
        right_w, beta - mean * scale)
    ideas["b' = b * scale + beta (the mean forgotten)"] = (right_w, bias * scale + beta)
    ideas["b' = b (the bias not folded)"] = (right_w, bias)
    if kind == "linear" and w.shape[0] == w.shape[1]:
        ideas["the scale applied to the weight's rows (axis 0, the inputs) instead of its "
              "columns (axis 1, the outputs of a (in, out) weight)"] = (
            w * scale[:, None], (bias - mean) * scale + beta)
    return ideas


_BN_VARIANTS = {
    "conv": dict(kind="conv"),
    "linear": dict(kind="linear", square=True),
    "nobias": dict(kind="conv", with_bias=False),
    "tiny": dict(kind="linear", tiny_var=True),
}

# ----------------------------------------------------------------------------- probes


def _bn_probe(fold_bn, seed, variant):
    spec = _BN_VARIANTS[variant]
    w, b, gamma, beta, mean, var, eps = _bn_case(seed, **spec)
    kind = spec["kind"]
    out = _call(fold_bn, w, b, gamma, beta, mean, var, eps, kind)
    if isinstance(out, dict):
        return out
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        return {"not_pair": describe(out)}
    return {"w": np.asarray(out[0]) if out[0] is not None else None,
            "b": np.asarray(out[1]) if out[1] is not None else None}


def _bn_conv_probe(fold_bn, seed):
    return _bn_probe(fold_bn, seed, "conv")


def _bn_linear_probe(fold_bn, seed):
    return _bn_probe(fold_bn, seed, "linear")


def _bn_nobias_probe(fold_bn, seed):
    return _bn_probe(fold_bn, seed, "nobias")


def _bn_tiny_probe(fold_bn, seed):
    return _bn_probe(fold_bn, seed, "tiny")


def _bn_untouched_probe(fold_bn, seed):
    args = _bn_case(seed + 50, "conv")
    copies = [None if a is None else np.array(a, copy=True) for a in args[:6]]
    out = _call(fold_bn, *args, "conv")
    if isinstance(out, dict):
        return out
    return [bool(a is None or np.array_equal(a, c)) for a, c in zip(args[:6], copies)]


# ----------------------------------------------------------------------------- judges


def _bn_judge(raw, seed, variant):
    spec = _BN_VARIANTS[variant]
    args = _bn_case(seed, **spec)
    kind = spec["kind"]
    label = {"conv": "conv (5, 3, 3, 3) with a bias", "linear": "linear (6, 6) stored (in, out)",
             "nobias": "conv without a bias (bias=None)",
             "tiny": "linear with variances ~1e-6 and eps = 1e-3"}[variant]
    _raised(raw, label)
    if "not_pair" in raw:
        raise AssertionError(f"{label}: fold_bn should return (weight, bias), got "
                             f"{raw['not_pair']}")
    want_w, want_b = _bn_reference(*args, kind)
    got_w = _array(raw["w"], f"{label}: folded weight", want_w.shape)
    got_b = _array(raw["b"], f"{label}: folded bias", want_b.shape)
    ok_w = np.allclose(got_w, want_w, rtol=1e-12, atol=1e-12)
    ok_b = np.allclose(got_b, want_b, rtol=1e-12, atol=1e-12)
    if ok_w and ok_b:
        if got_w.dtype != np.float64 or got_b.dtype != np.float64:
            raise AssertionError(f"{label}: float64 in, {got_w.dtype}/{got_b.dtype} out: keep "
                                 f"the dtype, the fold is exact only in float64")
        return
    for idea, (iw, ib) in _bn_wrong_ideas(*args, kind).items():
        if np.allclose(got_w, iw, rtol=1e-9, atol=1e-12) and \
                np.allclose(got_b, ib, rtol=1e-9, atol=1e-12):
            raise AssertionError(f"{label}: your result matches {idea}")
    part = "weight" if not ok_w else "bias"
    where = got_w if not ok_w else got_b
    want = want_w if not ok_w else want_b
    err = float(np.max(np.abs(where - want)))
    raise AssertionError(f"{label}: the folded {part} is off by up to {err:.3g} (want "
                         f"scale = gamma / sqrt(var + eps) on the output channels, b' = (b - "
                         f"mean) * scale + beta)")


def _bn_conv_judge(raw, seed):
    _bn_judge(raw, seed, "conv")


def _bn_linear_judge(raw, seed):
    _bn_judge(raw, seed, "linear")


def _bn_nobias_judge(raw, seed):
    _bn_judge(raw, seed, "nobias")


def _bn_tiny_judge(raw, seed):
    _bn_judge(raw, seed, "tiny")


def _bn_untouched_judge(raw, seed):
    names = ["weight", "bias", "gamma", "beta", "mean", "var"]
    _raised(raw, "conv with a bias")
    if not isinstance(raw, list) or len(raw) != 6:
        raise AssertionError(f"the check got {describe(raw)}")
    changed = [n for n, same in zip(names, raw) if not same]
    if changed:
        raise AssertionError(f"fold_bn changed its inputs in place: {changed}; return new "
                             f"arrays (the float model must keep working)")


# ============================================================================= 10.2 quantiser
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


def _q_grid_input(scale, axis, seed, factor=1.0):
    """Test values at k + f steps of each channel (f far from 1/2: no rounding ties)."""
    rng = np.random.default_rng(10250 + seed)
    c = scale.size
    k = rng.integers(-120, 121, (4, c, 6)).astype(np.float64)
    f = rng.choice([0.12, 0.3, 0.62, 0.85, -0.3, -0.7], (4, c, 6))
    x = (k + f) * scale[None, :, None] * factor
    return np.moveaxis(x, 1, axis).copy() if axis != 1 else x


# ----------------------------------------------------------------------------- probes


def _q_scale_probe(ChannelQuantizer, seed, axis=1):
    batches = _q_batches(seed, axis)
    return _call(lambda: np.asarray(_q_build(ChannelQuantizer, batches, axis).scale()))


def _q_scale_axis0_probe(ChannelQuantizer, seed):
    return _q_scale_probe(ChannelQuantizer, seed, axis=0)


def _q_round_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed, 1)
    scale = _q_reference_scale(batches, 1)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 1)
        return np.asarray(quantizer.quantize(_q_grid_input(scale, 1, seed)))
    return _call(run)


def _q_clip_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed, 0)
    scale = _q_reference_scale(batches, 0)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 0)
        return np.asarray(quantizer.quantize(_q_grid_input(scale, 0, seed, factor=3.0)))
    return _call(run)


def _q_bits_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed + 3, 1)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 1, bits=4)
        scale = np.asarray(quantizer.scale())
        x = _q_grid_input(_q_reference_scale(batches, 1, 4), 1, seed) / 12.0
        return {"scale": scale, "q": np.asarray(quantizer.quantize(x))}
    return _call(run)


def _q_round_trip_probe(ChannelQuantizer, seed):
    batches = _q_batches(seed + 5, 1)

    def run():
        quantizer = _q_build(ChannelQuantizer, batches, 1)
        x = batches[1]
        return np.asarray(quantizer.dequantize(quantizer.quantize(x)), np.float64)
    return _call(run)


# ----------------------------------------------------------------------------- judges


def _q_scale_judge(raw, seed, axis=1):
    what = f"scales of 5 channels on axis {axis}, calibrated on 3 batches"
    batches = _q_batches(seed, axis)
    want = _q_reference_scale(batches, axis)
    got = _array(_raised(raw, what), what).astype(np.float64).reshape(-1)
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
    x = _q_grid_input(scale, 1, seed)
    want = _q_reference(x, scale, 1)
    got = _array(_raised(raw, what), what, want.shape)
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
    x = _q_grid_input(scale, 0, seed, factor=3.0)
    want = _q_reference(x, scale, 0)
    got = _array(_raised(raw, what), what, want.shape)
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
    _raised(raw, what)
    if not isinstance(raw, dict) or set(raw) != {"scale", "q"}:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    want_s = _q_reference_scale(batches, 1, 4)
    got_s = _array(raw["scale"], f"{what}: scales").astype(np.float64).reshape(-1)
    if got_s.size != want_s.size or not np.allclose(got_s, want_s, rtol=1e-9):
        hint = ""
        if got_s.size == want_s.size and np.allclose(got_s, _q_reference_scale(batches, 1),
                                                     rtol=1e-9):
            hint = " (that is 8 bits: qmax = 2**(bits - 1) - 1 = 7 for 4 bits)"
        raise AssertionError(f"{what}: scales should be max|x| / 7{hint}")
    x = _q_grid_input(want_s, 1, seed) / 12.0
    want = np.clip(np.rint(x / want_s[None, :, None]), -7, 7).astype(np.int8)
    got = _array(raw["q"], f"{what}: values", want.shape)
    if got.dtype == np.int8 and int(np.abs(got.astype(int)).max()) > 7:
        raise AssertionError(f"{what}: values beyond ±7 appear; clip to [-qmax, qmax]")
    _q_values_judge(got, want, what)


def _q_round_trip_judge(raw, seed):
    what = "dequantize(quantize(x)) on a calibration batch"
    batches = _q_batches(seed + 5, 1)
    scale = _q_reference_scale(batches, 1)
    x = batches[1]
    got = _array(_raised(raw, what), what, x.shape)
    want = _q_reference(x, scale, 1).astype(np.float64) * scale[None, :, None]
    if np.allclose(got, want, rtol=1e-9, atol=1e-12):
        return
    err = np.abs(got - x) / scale[None, :, None]
    raise AssertionError(f"{what}: expected s * q; the error is up to {float(err.max()):.3g} "
                         f"steps (at most 1/2 within the calibrated range)")


# ============================================================================= 10.3 pruning
# ----------------------------------------------------------------------------- inputs (both sides)


def _p_weights(seed, ties=False):
    """Three layers of very different scales (one per-row scale pattern inside the conv), with
    positive and negative weights; with ``ties``, small integer magnitudes repeat many times."""
    rng = np.random.default_rng(10300 + seed + (1000 if ties else 0))
    if ties:
        return {"0.weight": rng.integers(-4, 5, (6, 7)).astype(np.float32),
                "2.weight": 2 * rng.integers(-3, 4, (7, 5)).astype(np.float32)}
    conv = rng.standard_normal((4, 2, 3, 3)) * np.array([0.05, 1.0, 0.2, 3.0])[:, None, None,
                                                                               None]
    return {"0.weight": conv.astype(np.float32),
            "3.weight": (rng.standard_normal((72, 10)) * 0.1).astype(np.float32),
            "5.weight": (rng.standard_normal((10, 10)) * 1.5 - 0.8).astype(np.float32)}


def _p_sparsities(seed):
    """Targets whose ``sparsity * n`` has a fractional part below and above 1/2 (never 1/2)."""
    n = sum(w.size for w in _p_weights(seed).values())
    rng = np.random.default_rng(10390 + seed)
    out = []
    for frac in (0.2, 0.8, 0.35, 0.7):
        k = int(rng.integers(1, n - 2))
        out.append((k + frac) / n)
    return out


# ----------------------------------------------------------------------------- probes


def _p_masks(prune_to_sparsity, weights, sparsity, scope=None):
    copies = {k: v.copy() for k, v in weights.items()}
    out = _call(prune_to_sparsity, copies, sparsity) if scope is None else \
        _call(prune_to_sparsity, copies, sparsity, scope)
    if isinstance(out, dict) and "raised" in out:
        return out
    if not isinstance(out, dict):
        return {"not_dict": describe(out)}
    touched = [k for k in weights if not np.array_equal(copies[k], weights[k])]
    return {"masks": {str(k): np.asarray(v) for k, v in out.items()}, "touched": touched}


def _p_count_probe(prune_to_sparsity, seed):
    w = _p_weights(seed)
    return [_p_masks(prune_to_sparsity, w, s) for s in _p_sparsities(seed)]


def _p_global_probe(prune_to_sparsity, seed):
    return _p_masks(prune_to_sparsity, _p_weights(seed), 0.6)


def _p_ties_probe(prune_to_sparsity, seed):
    w = _p_weights(seed, ties=True)
    n = sum(v.size for v in w.values())
    return [_p_masks(prune_to_sparsity, w, s) for s in (0.3, 11.2 / n, 0.55)]


def _p_layer_probe(prune_to_sparsity, seed):
    return _p_masks(prune_to_sparsity, _p_weights(seed), 0.5, "layer")


def _p_edges_probe(prune_to_sparsity, seed):
    w = _p_weights(seed)
    return [_p_masks(prune_to_sparsity, w, 0.0), _p_masks(prune_to_sparsity, w, 1.0)]


# ----------------------------------------------------------------------------- judges


def _p_masks_of(raw, weights, what):
    _raised(raw, what)
    if "not_dict" in raw:
        raise AssertionError(f"{what}: expected a dict of masks, got {raw['not_dict']}")
    masks = raw["masks"]
    if set(masks) != set(weights):
        raise AssertionError(f"{what}: expected masks for {sorted(weights)}, got "
                             f"{sorted(masks)}")
    for name, w in weights.items():
        _array(masks[name], f"{what}: mask {name!r}", w.shape, "b")
    if raw["touched"]:
        raise AssertionError(f"{what}: prune_to_sparsity changed the weights {raw['touched']} "
                             f"in place; return masks only")
    return masks


def _p_check_global(masks, weights, sparsity, what):
    n = sum(w.size for w in weights.values())
    k = round(sparsity * n)
    removed = sum(int(np.count_nonzero(~masks[name])) for name in weights)
    if removed != k:
        hint = ""
        if removed == int(np.floor(sparsity * n)) or removed == int(np.ceil(sparsity * n)):
            hint = (f" — that is {'floor' if removed < k else 'ceil'}(sparsity * n); remove "
                    f"round(sparsity * n)")
        elif removed > k:
            hint = " (more than asked: ties at the threshold? remove exactly k)"
        raise AssertionError(f"{what}: sparsity {sparsity:.6f} of {n} weights: remove "
                             f"round({sparsity * n:.2f}) = {k}, you removed {removed}{hint}")
    flat_w = np.concatenate([weights[name].ravel() for name in weights])
    flat_m = np.concatenate([masks[name].ravel() for name in weights])
    if k and k < n and np.abs(flat_w[~flat_m]).max() > np.abs(flat_w[flat_m]).min():
        if np.all(flat_w[~flat_m] <= np.sort(flat_w)[k - 1]):
            raise AssertionError(f"{what}: you removed the {k} most negative weights; prune by "
                                 f"magnitude |w|")
        per_layer = all(
            int(np.count_nonzero(~masks[name])) == round(sparsity * weights[name].size)
            for name in weights)
        if per_layer:
            raise AssertionError(f"{what}: each layer lost the same fraction: that is "
                                 f"scope='layer'; global ranks |w| across all layers at once")
        raise AssertionError(f"{what}: a removed weight has |w| = "
                             f"{float(np.abs(flat_w[~flat_m]).max()):.4g} but a kept one "
                             f"{float(np.abs(flat_w[flat_m]).min()):.4g}; remove the smallest "
                             f"|w| over every layer")


def _p_count_judge(raw, seed):
    w = _p_weights(seed)
    if not isinstance(raw, list) or len(raw) != 4:
        raise AssertionError(f"the check got {describe(raw)}")
    for r, s in zip(raw, _p_sparsities(seed)):
        _p_check_global(_p_masks_of(r, w, f"sparsity {s:.4f}"), w, s, "global pruning")


def _p_global_judge(raw, seed):
    w = _p_weights(seed)
    masks = _p_masks_of(raw, w, "sparsity 0.6 over layers of different scales")
    _p_check_global(masks, w, 0.6, "sparsity 0.6 over layers of different scales")


def _p_ties_judge(raw, seed):
    w = _p_weights(seed, ties=True)
    n = sum(v.size for v in w.values())
    if not isinstance(raw, list) or len(raw) != 3:
        raise AssertionError(f"the check got {describe(raw)}")
    for r, s in zip(raw, (0.3, 11.2 / n, 0.55)):
        what = f"integer weights with many equal |w|, sparsity {s:.3f}"
        _p_check_global(_p_masks_of(r, w, what), w, s, what)


def _p_layer_judge(raw, seed):
    w = _p_weights(seed)
    what = "scope='layer', sparsity 0.5"
    masks = _p_masks_of(raw, w, what)
    for name, arr in w.items():
        _p_check_global({name: masks[name]}, {name: arr}, 0.5, f"{what}, layer {name!r}")


def _p_edges_judge(raw, seed):
    w = _p_weights(seed)
    if not isinstance(raw, list) or len(raw) != 2:
        raise AssertionError(f"the check got {describe(raw)}")
    keep_all = _p_masks_of(raw[0], w, "sparsity 0")
    if not all(m.all() for m in keep_all.values()):
        raise AssertionError("sparsity 0 must keep every weight")
    none = _p_masks_of(raw[1], w, "sparsity 1")
    if any(m.any() for m in none.values()):
        raise AssertionError("sparsity 1 must remove every weight")


# ============================================================================= registry

register(
    # 10.1. A wrong idea that still returns arrays of the right shapes fails because: dividing by
    # var (or var + eps) instead of sqrt(var + eps), or sqrt(var) without eps (the tiny-variance
    # case, where eps decides), gives other scales; forgetting the layer's own bias, or the
    # mean, or leaving the bias unfolded gives another b'; scaling a (in, out) linear weight
    # along axis 0 (its inputs) instead of axis 1 is caught by the square linear case (in a
    # conv the broadcast fails outright); float32 arithmetic misses the float64 tolerance;
    # scaling the inputs in place fails the untouched case. No fold at all — the unfolded
    # layer run as a black box on basis inputs, W' and b' read off its outputs (b' = f(0),
    # W' e_k = f(e_k) - f(0)) — fails the four value cases: the means and shifts lie 1e5..1e6
    # from zero (STAT_OFFSET), so f(0) is that large and the differences lose six digits.
    Exercise(
        id="10.1",
        title="Fold batch norm into the layer before it",
        target="fold_bn",
        task="the BN-folding function",
        forbidden=(
            "mlsys_lab.deploy.passes",
            "mlsys_lab.deploy.quant.ptq",
            "mlsys_lab.engine.ops_nn:batch_norm",
        ),
        cases=(
            Case("conv (O, I, kh, kw) with a bias: exact in float64", 2,
                 feedback="scale = gamma / sqrt(var + eps) per output channel",
                 probe=_bn_conv_probe, judge=_bn_conv_judge),
            Case("linear weight (in, out): the output axis is 1", 2,
                 feedback="scale the weight's columns",
                 probe=_bn_linear_probe, judge=_bn_linear_judge),
            Case("no bias: b' = beta - mean * scale", 1,
                 feedback="a missing bias is a bias of zeros",
                 probe=_bn_nobias_probe, judge=_bn_nobias_judge),
            Case("tiny variances: eps matters", 1, feedback="sqrt(var + eps), not sqrt(var)",
                 probe=_bn_tiny_probe, judge=_bn_tiny_judge),
            Case("the inputs are left unchanged", 1, feedback="return new arrays",
                 probe=_bn_untouched_probe, judge=_bn_untouched_judge),
        ),
    ),
    # 10.2. A wrong idea that still returns int8 values fails because: one scale for the whole
    # tensor (per tensor) differs from per-channel scales when channels differ by 1000x; max(x)
    # instead of max|x| misses the mostly-negative channels; an asymmetric (max - min) / 255
    # scale or a zero point differs from max|x| / 127; keeping only the last batch's range
    # loses the peaks the earlier batches held; floor or truncation instead of round is seen
    # at the fractional steps 0.62 and 0.85; no clipping wraps around in the int8 cast and a
    # qmin of -128 lets -128 appear, both seen at 3x the range; qmax fixed at 127 fails
    # bits=4; returning floats instead of int8 fails every value case.
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
    # 10.3. A wrong idea that still returns masks of the right shapes fails because: ranking
    # the signed values removes the most negative weights, not the smallest |w| (global case);
    # pruning each layer (or each row) by the same fraction keeps small weights of a small
    # layer while removing larger ones elsewhere (global case, layers 60x apart); int() or ceil
    # instead of round removes one too few or too many (count case, fractional parts .2 .35
    # .7 .8); a threshold test |w| <= t removes every tie of the k-th smallest (ties case);
    # changing the weights in place, or no special care at sparsity 0 or 1, fail the last cases.
    Exercise(
        id="10.3",
        title="Magnitude pruning to a sparsity target",
        target="prune_to_sparsity",
        task="the magnitude pruning function",
        forbidden=(
            "mlsys_lab.deploy.compress.prune",
            "mlsys_lab.deploy.passes",
        ),
        cases=(
            Case("exactly round(sparsity * n) weights removed", 2,
                 feedback="k = round(sparsity * n); remove k weights, not a threshold's worth",
                 probe=_p_count_probe, judge=_p_count_judge),
            Case("global: the smallest |w| across every layer", 2,
                 feedback="rank |w| of all layers together",
                 probe=_p_global_probe, judge=_p_global_judge),
            Case("ties at the threshold: still exactly k", 1,
                 feedback="choose k indices (np.argsort(..., kind='stable')), not |w| <= t",
                 probe=_p_ties_probe, judge=_p_ties_judge),
            Case("scope='layer': the same fraction from each layer", 1,
                 feedback="round(sparsity * n_layer) per layer",
                 probe=_p_layer_probe, judge=_p_layer_judge),
            Case("sparsity 0 keeps all, 1 removes all; weights untouched", 1,
                 feedback="the edge cases of k = 0 and k = n",
                 probe=_p_edges_probe, judge=_p_edges_judge),
        ),
    ),
)

