"""Exercise 10.1: fold a batch norm into the conv / linear layer before it, checked exactly in
float64.

Wrong ideas rejected: dividing by var (or var + eps) instead of sqrt(var + eps), or sqrt(var)
without eps (the tiny-variance case, where eps decides), gives other scales; forgetting the
layer's own bias, or the mean, or leaving the bias unfolded gives another b'; scaling a
(in, out) linear weight along axis 0 (its inputs) instead of axis 1 is caught by the square
linear case (in a conv the broadcast fails outright); float32 arithmetic misses the float64
tolerance; scaling the inputs in place fails the untouched case. No fold at all — the unfolded
layer run as a black box on basis inputs, W' and b' read off its outputs (b' = f(0),
W' e_k = f(e_k) - f(0)) — fails the four value cases: the means and shifts lie 1e5..1e6 from
zero (``STAT_OFFSET``), so f(0) is that large and the differences lose six digits. The judge
names the wrong idea an answer's numbers match (``_bn_wrong_ideas``).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, Raised, attempt, describe, register
from mlsys_lab.grading.exercises.ch10_model_deployment.common import (
    expect_array,
    expect_not_raised,
)

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
    out = attempt(fold_bn, w, b, gamma, beta, mean, var, eps, kind)
    if isinstance(out, Raised):
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
    out = attempt(fold_bn, *args, "conv")
    if isinstance(out, Raised):
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
    expect_not_raised(raw, label)
    if "not_pair" in raw:
        raise AssertionError(f"{label}: fold_bn should return (weight, bias), got "
                             f"{raw['not_pair']}")
    want_w, want_b = _bn_reference(*args, kind)
    got_w = expect_array(raw["w"], f"{label}: folded weight", want_w.shape)
    got_b = expect_array(raw["b"], f"{label}: folded bias", want_b.shape)
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
    expect_not_raised(raw, "conv with a bias")
    if not isinstance(raw, list) or len(raw) != 6:
        raise AssertionError(f"the check got {describe(raw)}")
    changed = [n for n, same in zip(names, raw) if not same]
    if changed:
        raise AssertionError(f"fold_bn changed its inputs in place: {changed}; return new "
                             f"arrays (the float model must keep working)")


register(
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
)
