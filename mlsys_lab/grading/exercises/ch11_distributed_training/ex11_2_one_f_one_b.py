"""Exercise 11.2: a 1F1B pipeline schedule generator: valid, at most ``min(p - s, m)``
micro-batches in flight on stage ``s`` and no bubble beyond GPipe's.

Wrong ideas rejected: GPipe's order (all forwards, then all backwards) is valid and as fast but
keeps m micro-batches in flight; strict alternation F0 B0 F1 B1 ... from the start is valid with
one in flight but serialises the pipeline (about 3x GPipe's makespan); p - s warm-up forwards
(one too many) keeps p - s + 1 in flight; s warm-up forwards on stage s (the order reversed)
deadlocks; a backward before its forward, a missing or repeated operation fail validation. A
table of the library's schedules made before the check (where nothing is off limits) fails
every case: three of the (p, m) are drawn from p <= 200, m <= 500 (p * m <= 12,000), some
37,000 pairs and 4e8 operations, too many to tabulate.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from mlsys_lab.distributed import pipeline_parallel as pp
from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


#: The random (p, m) of 11.2: p and m log-uniform in these ranges with p * m at most
#: ``PIPELINE_MAX_WORK`` (up to 24,000 operations a schedule, about a second to judge). Some
#: 37,000 pairs with 4e8 operations in all: too many to tabulate from the library before the
#: check, while each one alone is small.
PIPELINE_STAGES, PIPELINE_MICRO, PIPELINE_MAX_WORK = (2, 200), (1, 500), 12_000


def _pipeline_configs(seed):
    """A few small fixed (p, m), edge cases included, then three drawn from a wide range."""
    rng = np.random.default_rng(seed)
    fixed = [(4, 8), (4, 4), (4, 2), (1, 3), (2, 1), (5, 7), (6, 3)]
    drawn = []
    while len(drawn) < 3:
        p, m = (min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))
                for lo, hi in (PIPELINE_STAGES, PIPELINE_MICRO))
        if p * m <= PIPELINE_MAX_WORK:
            drawn.append((p, m))
    return fixed + drawn


# ----------------------------------------------------------------------------- probes


def _packed_stage(ops):
    """A stage's operations as one int64 array, ``j + 1`` for ``("F", j)`` and ``-(j + 1)`` for
    ``("B", j)`` (``j >= 0``), when every operation is such a pair; else the stage as the answer
    gave it (the judge names the problem). Whole-array numpy steps, not a loop per operation:
    a schedule of thousands of operations would otherwise cost thousands of profiled calls
    under the guard (and on the wire)."""
    if not isinstance(ops, (list, tuple)) or not ops:
        return ops
    try:
        table = np.array(ops, dtype=object)
        if table.shape != (len(ops), 2):
            return ops
        kinds, index = table[:, 0], table[:, 1]
        forward = kinds == "F"
        types = set(map(type, index))
        if not (np.all(forward | (kinds == "B")) and all(
                issubclass(t, (int, np.integer)) and not issubclass(t, (bool, np.bool_))
                for t in types)):
            return ops
        j = np.array(index.tolist(), dtype=np.int64)
    except Exception:  # odd operations (ragged, huge ints): the judge explains
        return ops
    if j.min() < 0:
        return ops
    return np.where(forward, j + 1, -(j + 1))


def _schedule_probe(one_f_one_b, seed):
    out = []
    for p, m in _pipeline_configs(seed):
        got = one_f_one_b(p, m)
        out.append([_packed_stage(ops) for ops in got] if isinstance(got, (list, tuple))
                   else got)
    return out


# ----------------------------------------------------------------------------- judges


def _as_schedule(raw, p, m):
    """The answer as lists of ``(kind, j)`` tuples, or an AssertionError naming the problem."""
    what = f"one_f_one_b({p}, {m})"
    if not isinstance(raw, (list, tuple)) or len(raw) != p:
        raise AssertionError(f"{what} returned {describe(raw)}; expected a list of {p} stages")
    out = []
    for s, ops in enumerate(raw):
        if isinstance(ops, np.ndarray) and ops.dtype == np.int64 and ops.ndim == 1:  # packed
            out.append([("F", c - 1) if c > 0 else ("B", -c - 1) for c in ops.tolist()])
            continue
        if not isinstance(ops, (list, tuple)):
            raise AssertionError(f"{what}: stage {s} is {describe(ops)}, not a list")
        stage = []
        for op in ops:
            ok = isinstance(op, (list, tuple)) and len(op) == 2 and op[0] in ("F", "B") and \
                isinstance(op[1], numbers.Integral) and not isinstance(op[1], bool)
            if not ok:
                raise AssertionError(f"{what}: stage {s} holds {describe(op)}; each operation "
                                     "is a pair ('F', j) or ('B', j)")
            stage.append((op[0], int(op[1])))
        out.append(stage)
    return out


def _schedules(raw, seed):
    configs = _pipeline_configs(seed)
    if not isinstance(raw, list) or len(raw) != len(configs):
        raise AssertionError(f"expected {len(configs)} schedules, got {describe(raw)}")
    return [(p, m, _as_schedule(r, p, m)) for (p, m), r in zip(configs, raw)]


def _valid_judge(raw, seed):
    for p, m, sched in _schedules(raw, seed):
        problems = pp.schedule_problems(sched, p, m)
        if problems:
            raise AssertionError(f"one_f_one_b({p}, {m}): {problems[0]}")


def _in_flight_judge(raw, seed):
    for p, m, sched in _schedules(raw, seed):
        peaks = pp.in_flight_peak(sched)
        limit = [min(p - s, m) for s in range(p)]
        over = [s for s in range(p) if peaks[s] > limit[s]]
        if over:
            s = over[0]
            raise AssertionError(f"one_f_one_b({p}, {m}): stage {s} holds {peaks[s]} micro-"
                                 f"batches' activations at once; 1F1B keeps at most "
                                 f"min(p - s, m) = {limit[s]} (GPipe keeps all m)")


def _makespan_judge(raw, seed):
    for p, m, sched in _schedules(raw, seed):
        if pp.schedule_problems(sched, p, m):
            raise AssertionError(f"one_f_one_b({p}, {m}) is not a valid schedule")
        for tf, tb in ((1.0, 2.0), (1.0, 1.0)):
            want = pp.simulate_schedule(pp.gpipe_schedule(p, m), tf, tb).makespan
            got = pp.simulate_schedule(sched, tf, tb).makespan
            if got > want + 1e-9:
                raise AssertionError(f"one_f_one_b({p}, {m}) with forward {tf:g}, backward "
                                     f"{tb:g} takes {got:g}; GPipe's bubble gives {want:g}: "
                                     "start with enough warm-up forwards to fill the pipeline")


register(
    Exercise(
        id="11.2",
        title="A 1F1B pipeline schedule",
        target="one_f_one_b",
        task="the 1F1B schedule",
        forbidden=(
            "mlsys_lab.distributed.parallel.pipeline_parallel:one_f_one_b_schedule",
            "mlsys_lab.distributed.parallel.pipeline_parallel:make_schedule",
            "mlsys_lab.viz.pipeline_view:schedule_timeline",
        ),
        cases=(
            Case("valid: F and B of each micro-batch once, F first, no deadlock", 2,
                 feedback="each stage runs F j and B j for every j, forwards first",
                 probe=_schedule_probe, judge=_valid_judge),
            Case("at most min(p - s, m) micro-batches in flight on stage s", 2,
                 feedback="warm up with p - s - 1 forwards, then one forward, one backward",
                 probe=_schedule_probe, judge=_in_flight_judge),
            Case("no bubble beyond GPipe's (same makespan)", 2,
                 feedback="fill the pipeline before alternating", probe=_schedule_probe,
                 judge=_makespan_judge),
        ),
    ),
)
