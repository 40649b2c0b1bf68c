"""Exercises of chapter 10 test the idea: shortcuts and wrong ideas score 0 on their cases.

Each wrong idea listed in the exercise modules of
``mlsys_lab/grading/exercises/ch10_model_deployment/`` is run here in process with
``run_cases``, which makes the same probe -> wire -> judge round trip as the grader. The
reference answers (copies of the solution notebook's code) must score full marks on several
seeds, and the library's own implementations must be refused.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlsys_lab import nn
from mlsys_lab.deploy import quant as Q
from mlsys_lab.deploy.compress import prune as PR
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.core.exercise import exercises_for_chapter

from ..exercise_results import fails_only as _failed
from ..exercise_results import feedback as _feedback
from ..exercise_results import refused as _refused


def test_three_exercises():
    assert [e.id for e in exercises_for_chapter(10)] == ["10.1", "10.2", "10.3"]
    assert all(e.forbidden and e.max_points >= 6 for e in exercises_for_chapter(10))


# ============================================================================= 10.1 BN folding


def fold_bn(weight, bias, gamma, beta, mean, var, eps, kind):
    """The reference: the solution notebook's answer."""
    scale = gamma / np.sqrt(var + eps)
    if kind == "conv":
        w = weight * scale[:, None, None, None]
    else:
        w = weight * scale[None, :]
    b = np.zeros_like(mean) if bias is None else bias
    return w, (b - mean) * scale + beta


def _fold_with(scale_of=None, bias_of=None, axis=None, dtype=None, in_place=False):
    def fold(weight, bias, gamma, beta, mean, var, eps, kind):
        scale = scale_of(gamma, var, eps) if scale_of else gamma / np.sqrt(var + eps)
        out_axis = (0 if kind == "conv" else 1) if axis is None else axis
        shape = [1] * weight.ndim
        shape[out_axis] = -1
        if in_place:
            weight *= scale.reshape(shape)
            w = weight
        else:
            w = weight * scale.reshape(shape)
        b = np.zeros_like(mean) if bias is None else bias
        new_b = bias_of(b, beta, mean, scale) if bias_of else (b - mean) * scale + beta
        if dtype is not None:
            w, new_b = w.astype(dtype), new_b.astype(dtype)
        return w, new_b
    return fold


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_10_1_reference_answer_scores_full_marks(seed):
    result = run_cases("10.1", fold_bn, seed=seed)
    assert result.score == result.max, _feedback(result)


def test_10_1_the_reference_is_conv_then_batch_norm():
    """Independent oracle: a float64 conv followed by BN equals the folded conv."""
    from mlsys_lab.grading.exercises.ch10_model_deployment import ex10_1_bn_fold as bn
    w, b, gamma, beta, mean, var, eps = bn._bn_case(0, "conv")
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6))

    def conv(x, w, b):
        out = np.zeros((2, w.shape[0], 4, 4))
        for i in range(4):
            for j in range(4):
                out[:, :, i, j] = np.einsum("nchw,ochw->no", x[:, :, i:i + 3, j:j + 3], w)
        return out + b[None, :, None, None]

    y = conv(x, w, b)
    bn = (y - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    bn = bn * gamma[None, :, None, None] + beta[None, :, None, None]
    fw, fb = fold_bn(w, b, gamma, beta, mean, var, eps, "conv")
    np.testing.assert_allclose(conv(x, fw, fb), bn, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cheat", [
    lambda w, b, g, be, m, v, eps, kind: __import__(
        "mlsys_lab.deploy.passes", fromlist=["x"]).channel_vector(g, (1, len(g)), 1),
])
def test_10_1_library_passes_are_refused(cheat):
    assert _refused(run_cases("10.1", cheat, seed=3))


@pytest.mark.parametrize("wrong, failing", [
    (_fold_with(scale_of=lambda g, v, e: g / (v + e)), ["conv", "linear", "no bias", "tiny"]),
    (_fold_with(scale_of=lambda g, v, e: g / np.sqrt(v)), ["conv", "linear", "no bias", "tiny"]),
    (_fold_with(bias_of=lambda b, be, m, s: be - m * s), ["conv", "linear", "tiny"]),
    (_fold_with(bias_of=lambda b, be, m, s: b * s + be), ["conv", "linear", "no bias", "tiny"]),
    (_fold_with(bias_of=lambda b, be, m, s: b), ["conv", "linear", "no bias", "tiny"]),
    (_fold_with(axis=0), ["linear", "tiny"]),
    (_fold_with(dtype=np.float32), ["conv", "linear", "no bias", "tiny"]),
    (_fold_with(in_place=True), ["the inputs"]),
])
def test_10_1_each_wrong_idea_fails_its_cases(wrong, failing):
    _failed(run_cases("10.1", wrong, seed=4), *failing)


def read_off_the_layers(weight, bias, gamma, beta, mean, var, eps, kind):
    """No fold: the unfolded layer (its own forward, then batch norm) run as a black box on
    basis inputs, W' and b' read off its outputs by linearity (b' = f(0), W'e_k = f(e_k) - f(0))."""
    shape_in = weight.shape[1:] if kind == "conv" else weight.shape[:1]

    def layer(x):
        y = np.einsum("ihw,oihw->o", x, weight) if kind == "conv" else x @ weight
        y = y + (0.0 if bias is None else bias)
        return (y - mean) / np.sqrt(var + eps) * gamma + beta

    folded_b = layer(np.zeros(shape_in))
    size = int(np.prod(shape_in))
    rows = np.array([layer(np.eye(size)[k].reshape(shape_in)) - folded_b for k in range(size)])
    return (rows.T.reshape(weight.shape) if kind == "conv" else rows), folded_b


def test_10_1_weights_read_off_a_black_box_fail_the_exact_cases():
    # the statistics sit far from zero (means and shifts of 1e5..1e6), where the closed form
    # is exact to a few ulps but f(e_k) - f(0) cancels six digits away
    _failed(run_cases("10.1", read_off_the_layers, seed=7), "conv", "linear", "no bias", "tiny")


def test_10_1_feedback_names_the_wrong_idea():
    fb = _feedback(run_cases("10.1", _fold_with(scale_of=lambda g, v, e: g / (v + e)), seed=5))
    assert "var + eps instead of sqrt" in fb
    fb = _feedback(run_cases("10.1", _fold_with(axis=0), seed=5))
    assert "rows" in fb
    fb = _feedback(run_cases("10.1", _fold_with(bias_of=lambda b, be, m, s: be - m * s),
                             seed=5))
    assert "bias left out" in fb


def test_10_1_a_stub_scores_zero():
    def stub(*args):
        raise NotImplementedError("write fold_bn")
    assert run_cases("10.1", stub, seed=6).score == 0


# ============================================================================= 10.2 quantiser


class ChannelQuantizer:
    """The reference: the solution notebook's answer."""

    def __init__(self, axis, bits=8):
        self.axis, self.qmax, self.amax = axis, 2 ** (bits - 1) - 1, None

    def _per_channel(self, x):
        return np.moveaxis(np.abs(np.asarray(x, np.float64)), self.axis, 0).reshape(
            x.shape[self.axis], -1).max(axis=1)

    def observe(self, x):
        m = self._per_channel(x)
        self.amax = m if self.amax is None else np.maximum(self.amax, m)
        return self

    def scale(self):
        return np.where(self.amax > 0, self.amax / self.qmax, 1.0)

    def _shaped(self, ndim):
        shape = [1] * ndim
        shape[self.axis] = -1
        return self.scale().reshape(shape)

    def quantize(self, x):
        q = np.rint(np.asarray(x, np.float64) / self._shaped(np.ndim(x)))
        return np.clip(q, -self.qmax, self.qmax).astype(np.int8)

    def dequantize(self, q):
        return q.astype(np.float64) * self._shaped(np.ndim(q))


def _quantizer(scale_rule=None, rounding=np.rint, clip=True, qmin_extra=False, last_only=False,
               as_float=False, fixed_qmax=False):
    class Wrong(ChannelQuantizer):
        def __init__(self, axis, bits=8):
            super().__init__(axis, 8 if fixed_qmax else bits)
            self.lo = self.hi = None

        def observe(self, x):
            x = np.asarray(x, np.float64)
            moved = np.moveaxis(x, self.axis, 0).reshape(x.shape[self.axis], -1)
            lo, hi = moved.min(1), moved.max(1)
            if self.lo is None or last_only:
                self.lo, self.hi = lo, hi
            else:
                self.lo, self.hi = np.minimum(self.lo, lo), np.maximum(self.hi, hi)
            self.amax = np.maximum(-self.lo, self.hi)
            return self

        def scale(self):
            if scale_rule is not None:
                return scale_rule(self.lo, self.hi, self.amax, self.qmax)
            return super().scale()

        def quantize(self, x):
            q = rounding(np.asarray(x, np.float64) / self._shaped(np.ndim(x)))
            if clip:
                q = np.clip(q, -self.qmax - (1 if qmin_extra else 0), self.qmax)
            return q.astype(np.float64 if as_float else np.int8)

    return Wrong


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_10_2_reference_answer_scores_full_marks(seed):
    result = run_cases("10.2", ChannelQuantizer, seed=seed)
    assert result.score == result.max, _feedback(result)


def test_10_2_the_reference_agrees_with_the_library_observer():
    from mlsys_lab.grading.exercises.ch10_model_deployment import ex10_2_quantizer as q
    for axis in (0, 1):
        batches = q._q_batches(7, axis)
        obs = Q.MinMaxObserver(axis)
        ours = ChannelQuantizer(axis)
        for b in batches:
            obs.update(b)
            ours.observe(b)
        qp = obs.qparams(8, symmetric=True)
        np.testing.assert_allclose(ours.scale(), qp.scale, rtol=1e-12)
        x = q._q_grid_input(batches, axis, 7, factor=3.0)
        np.testing.assert_array_equal(ours.quantize(x), qp.quantize(x))


class _LibraryQuantizer:
    def __init__(self, axis, bits=8):
        self.obs, self.bits = Q.MinMaxObserver(axis), bits

    def observe(self, x):
        self.obs.update(x)
        return self

    def scale(self):
        return self.obs.qparams(self.bits, symmetric=True).scale

    def quantize(self, x):
        return self.obs.qparams(self.bits, symmetric=True).quantize(x)

    def dequantize(self, q):
        return self.obs.qparams(self.bits, symmetric=True).dequantize(q)


def test_10_2_the_library_quantiser_is_refused():
    assert _refused(run_cases("10.2", _LibraryQuantizer, seed=3))


class _GradersScale(ChannelQuantizer):
    """The answer's own quantize, with the scales from the grader's ``_q_reference_scale``
    fed the batches it saw: the probes once called that function (to lay out their test
    values), and a function a probe calls is not refused."""

    def observe(self, x):
        self.seen = [*getattr(self, "seen", []), np.asarray(x, np.float64)]
        return self

    def scale(self):
        from mlsys_lab.grading.exercises.ch10_model_deployment import ex10_2_quantizer
        return ex10_2_quantizer._q_reference_scale(self.seen, self.axis, self.bits)

    def __init__(self, axis, bits=8):
        super().__init__(axis, bits)
        self.bits = bits


def test_10_2_the_graders_scale_helper_is_refused():
    result = run_cases("10.2", _GradersScale, seed=3)
    assert _refused(result) and result.score <= 1, _feedback(result)
    assert "_q_reference_scale` (the grader's own reference) is off limits" in _feedback(result)


SCALE_CASES = ["scales", "channels on axis 0", "quantize rounds", "beyond the range",
               "dequantize"]


@pytest.mark.parametrize("wrong, failing", [
    (_quantizer(scale_rule=lambda lo, hi, a, qm: np.full_like(a, a.max() / qm)),
     SCALE_CASES + ["bits=4"]),
    (_quantizer(scale_rule=lambda lo, hi, a, qm: (np.maximum(hi, 0) - np.minimum(lo, 0)) / 255),
     SCALE_CASES + ["bits=4"]),
    (_quantizer(scale_rule=lambda lo, hi, a, qm: np.maximum(hi, 0) / qm),
     SCALE_CASES + ["bits=4"]),
    (_quantizer(last_only=True), SCALE_CASES + ["bits=4"]),
    (_quantizer(rounding=np.floor), ["quantize rounds", "beyond the range", "bits=4",
                                     "dequantize"]),
    (_quantizer(rounding=np.trunc), ["quantize rounds", "beyond the range", "bits=4",
                                     "dequantize"]),
    (_quantizer(clip=False), ["beyond the range", "bits=4"]),
    (_quantizer(qmin_extra=True), ["beyond the range", "bits=4"]),
    (_quantizer(as_float=True), ["quantize rounds", "beyond the range", "bits=4"]),
    (_quantizer(fixed_qmax=True), ["bits=4"]),
])
def test_10_2_each_wrong_idea_fails_its_cases(wrong, failing):
    _failed(run_cases("10.2", wrong, seed=8), *failing)


def test_10_2_feedback_names_the_wrong_idea():
    fb = _feedback(run_cases("10.2", _quantizer(
        scale_rule=lambda lo, hi, a, qm: np.full_like(a, a.max() / qm)), seed=9))
    assert "per tensor" in fb
    assert "floor" in _feedback(run_cases("10.2", _quantizer(rounding=np.floor), seed=9))
    assert "-128" in _feedback(run_cases("10.2", _quantizer(qmin_extra=True), seed=9))
    assert "wrapped" in _feedback(run_cases("10.2", _quantizer(clip=False), seed=9))
    assert "last batch" in _feedback(run_cases("10.2", _quantizer(last_only=True), seed=9))


def test_10_2_a_stub_scores_zero():
    class Stub:
        def __init__(self, axis, bits=8):
            raise NotImplementedError("write ChannelQuantizer")
    assert run_cases("10.2", Stub, seed=10).score == 0


# ============================================================================= 10.3 pruning


def prune_to_sparsity(weights, sparsity, scope="global"):
    """The reference: the solution notebook's answer."""
    if scope == "layer":
        return {name: prune_to_sparsity({name: w}, sparsity)[name] for name, w in weights.items()}
    flat = np.concatenate([np.abs(w).ravel() for w in weights.values()])
    k = round(sparsity * flat.size)
    keep = np.ones(flat.size, bool)
    keep[np.argsort(flat, kind="stable")[:k]] = False
    masks, start = {}, 0
    for name, w in weights.items():
        masks[name] = keep[start:start + w.size].reshape(w.shape)
        start += w.size
    return masks


def _signed(weights, sparsity, scope="global"):
    flat = np.concatenate([w.ravel() for w in weights.values()])
    keep = np.ones(flat.size, bool)
    keep[np.argsort(flat, kind="stable")[:round(sparsity * flat.size)]] = False
    return _split(keep, weights)


def _split(keep, weights):
    masks, start = {}, 0
    for name, w in weights.items():
        masks[name] = keep[start:start + w.size].reshape(w.shape)
        start += w.size
    return masks


def _per_layer_always(weights, sparsity, scope="global"):
    return prune_to_sparsity(weights, sparsity, "layer")


def _per_row(weights, sparsity, scope="global"):
    out = {}
    for name, w in weights.items():
        rows = np.abs(w).reshape(w.shape[0], -1)
        keep = np.ones(rows.shape, bool)
        for i, row in enumerate(rows):
            keep[i, np.argsort(row, kind="stable")[:round(sparsity * row.size)]] = False
        out[name] = keep.reshape(w.shape)
    return out


def _count_rule(rule):
    def prune(weights, sparsity, scope="global"):
        if scope == "layer":
            return {n: prune({n: w}, sparsity)[n] for n, w in weights.items()}
        flat = np.concatenate([np.abs(w).ravel() for w in weights.values()])
        keep = np.ones(flat.size, bool)
        keep[np.argsort(flat, kind="stable")[:rule(sparsity * flat.size)]] = False
        return _split(keep, weights)
    return prune


def _threshold(weights, sparsity, scope="global"):
    if scope == "layer":
        return {n: _threshold({n: w}, sparsity)[n] for n, w in weights.items()}
    flat = np.concatenate([np.abs(w).ravel() for w in weights.values()])
    k = round(sparsity * flat.size)
    if k == 0:
        return {n: np.ones(w.shape, bool) for n, w in weights.items()}
    t = np.sort(flat)[k - 1]
    return {n: np.abs(w) > t for n, w in weights.items()}


def _in_place(weights, sparsity, scope="global"):
    masks = prune_to_sparsity(weights, sparsity, scope)
    for name, m in masks.items():
        weights[name] *= m
    return masks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_10_3_reference_answer_scores_full_marks(seed):
    result = run_cases("10.3", prune_to_sparsity, seed=seed)
    assert result.score == result.max, _feedback(result)


def test_10_3_the_reference_agrees_with_the_library_masks():
    model = nn.Sequential(nn.Linear(8, 6, rng=0), nn.ReLU(), nn.Linear(6, 4, rng=1))
    weights = {n: p.numpy() for n, p in PR.prunable(model).items()}
    for scope in ("global", "layer"):
        for s in (0.3, 0.55, 0.9):
            lib = PR.magnitude_masks(model, s, scope)
            ours = prune_to_sparsity(weights, s, scope)
            assert all(np.array_equal(lib[n], ours[n]) for n in weights)


def test_10_3_the_library_masks_are_refused():
    model = nn.Sequential(nn.Linear(4, 4, rng=0))

    def cheat(weights, sparsity, scope="global"):
        return PR.magnitude_masks(model, sparsity, scope)
    assert _refused(run_cases("10.3", cheat, seed=3))


@pytest.mark.parametrize("wrong, failing", [
    (_signed, ["exactly", "global", "ties", "scope='layer'"]),
    (_per_layer_always, ["exactly", "global", "ties"]),
    (_per_row, ["exactly", "global", "ties", "scope='layer'"]),
    (_count_rule(int), ["exactly"]),
    (_count_rule(lambda v: int(np.ceil(v))), ["exactly", "global", "ties"]),
    (_count_rule(lambda v: round(v) + 1), ["exactly", "global", "ties", "scope='layer'",
                                           "sparsity 0"]),
    (_threshold, ["ties"]),
    (_in_place, ["exactly", "global", "ties", "scope='layer'", "sparsity 0"]),
])
def test_10_3_each_wrong_idea_fails_its_cases(wrong, failing):
    _failed(run_cases("10.3", wrong, seed=11), *failing)


def test_10_3_feedback_names_the_wrong_idea():
    assert "most negative" in _feedback(run_cases("10.3", _signed, seed=12))
    assert "scope='layer'" in _feedback(run_cases("10.3", _per_layer_always, seed=12))
    assert "floor" in _feedback(run_cases("10.3", _count_rule(int), seed=12))


def test_10_3_a_stub_scores_zero():
    def stub(weights, sparsity, scope="global"):
        raise NotImplementedError("write prune_to_sparsity")
    assert run_cases("10.3", stub, seed=13).score == 0
