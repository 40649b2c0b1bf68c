"""Exercise 11.3: ZeRO's memory per device, term by term.

Wrong ideas rejected: sharding the gradients from stage 1 on, or the weights instead of the
gradients at stage 2 (the same total when both take 2 bytes) gives wrong terms with the byte
widths drawn here; dividing everything by N from stage 1 on misses the paper's 31.4 GB; leaving
the optimiser state whole at stages 2 and 3 fails the terms; a stage of 4 or -1 must raise.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from mlsys_lab.distributed import zero
from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    plain,
    register,
)

# ----------------------------------------------------------------------------- inputs (both sides)

PAPER = (7.5e9, 64)  # the ZeRO paper's example: 7.5 B parameters on 64 GPUs, 2 + 2 + 12 bytes
_KEYS = ("params", "grads", "optimizer", "total")


def _zero_configs(seed):
    """(P, N, stage, weight bytes, grad bytes, optimizer bytes), byte widths that differ."""
    rng = np.random.default_rng(seed)
    widths = [(4, 2, 12), (2, 4, 8), (4, 4, 8), (2, 2, 12), (8, 4, 0)]
    out = []
    for w, g, k in widths:
        for stage in range(4):
            out.append((int(rng.integers(10**6, 10**10)), int(rng.integers(2, 1025)), stage,
                        w, g, k))
    return out


def _zero_call(zero_memory, P, N, stage, w, g, k):
    return zero_memory(P, N, stage, weight_bytes=w, grad_bytes=g, optimizer_bytes=k)


# ----------------------------------------------------------------------------- probes


def _zero_paper_probe(zero_memory):
    return [zero_memory(PAPER[0], PAPER[1], stage) for stage in range(4)]


def _zero_terms_probe(zero_memory, seed):
    return [_zero_call(zero_memory, *cfg) for cfg in _zero_configs(seed)]


ZERO_BAD_CALLS = ((1e9, 8, 4), (1e9, 8, -1), (1e9, 0, 1))


def _zero_errors_probe(zero_memory):
    return [attempt(zero_memory, *args) for args in ZERO_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _expect_breakdown(got, want, what):
    if not isinstance(got, dict) or set(_KEYS) - set(got):
        raise AssertionError(f"{what} returned {describe(got)}; return a dict with the keys "
                             f"{list(_KEYS)} (bytes per device)")
    for key in _KEYS:
        value = got[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                not math.isclose(float(value), want[key], rel_tol=1e-9, abs_tol=1e-6):
            raise AssertionError(f"{what}: {key} = {plain(value)!r} bytes, expected "
                                 f"{want[key]:.6g}")


def _zero_paper_judge(raw):
    if not isinstance(raw, list) or len(raw) != 4:
        raise AssertionError(f"expected the four stages' breakdowns, got {describe(raw)}")
    for stage, got in enumerate(raw):
        want = zero.zero_memory_breakdown(*PAPER, stage)
        _expect_breakdown(got, want, f"zero_memory(7.5e9, 64, {stage})")


def _zero_terms_judge(raw, seed):
    configs = _zero_configs(seed)
    if not isinstance(raw, list) or len(raw) != len(configs):
        raise AssertionError(f"expected {len(configs)} breakdowns, got {describe(raw)}")
    for (P, N, stage, w, g, k), got in zip(configs, raw):
        want = zero.zero_memory_breakdown(P, N, stage, k=k, weight_bytes=w, grad_bytes=g)
        _expect_breakdown(got, want, f"zero_memory({P}, {N}, {stage}, weight_bytes={w}, "
                                     f"grad_bytes={g}, optimizer_bytes={k})")


def _zero_errors_judge(raw):
    expect_each_raised("zero_memory", ZERO_BAD_CALLS, raw, "ValueError",
                       "stages are 0..3, devices >= 1")


register(
    Exercise(
        id="11.3",
        title="ZeRO memory per device",
        target="zero_memory",
        task="the ZeRO memory formulas",
        forbidden=(
            "mlsys_lab.distributed.parallel.zero:zero_memory_per_device",
            "mlsys_lab.distributed.parallel.zero:zero_memory_breakdown",
            "mlsys_lab.distributed.parallel.zero:training_memory",
            "mlsys_lab.distributed.parallel.zero:smallest_stage_that_fits",
        ),
        cases=(
            Case("the ZeRO paper: 7.5 B parameters on 64 GPUs (120, 31.4, 16.6, 1.9 GB)", 2,
                 feedback="2 + 2 + 12 bytes per parameter, sharded stage by stage",
                 probe=_zero_paper_probe, judge=_zero_paper_judge),
            Case("each term sharded from its stage on (random sizes and byte widths)", 3,
                 feedback="stage 1 shards the optimiser state, 2 the gradients, 3 the weights",
                 probe=_zero_terms_probe, judge=_zero_terms_judge),
            Case("a stage outside 0..3 or no devices raises ValueError", 1,
                 feedback="check the arguments", probe=_zero_errors_probe,
                 judge=_zero_errors_judge),
        ),
    ),
)
