"""Timing code on a shared, noisy machine: best-of-N after a warm-up, and interleaved comparisons.

The chapters (7 and 8), ``benchmarks/`` and the roofline's peak measurement all time code the
same way, with these functions::

    from mlsys_lab import timing

    timing.best_of(np.matmul, a, b, repeats=10)   # seconds: fastest of 10, after a warm-up
    result = timing.compare({"numpy": f_np, "fused": f_fused}, rounds=30)
    print(result)                                 # a table: time, ratio, speed-up vs "numpy"
    result.speedup("fused")                       # time of numpy / time of fused

Why these rules:

* **Warm-up.** The first call of a function compiles it (Numba), faults in fresh pages, fills the
  caches and starts thread pools. None of that is the cost of the steady state being measured, so
  it runs untimed first.
* **Best of N.** Noise on a shared machine only ever *adds* time: another process takes the core,
  an interrupt arrives, the clock frequency drops. No run is faster than the code allows, so the
  fastest of N runs is the least disturbed estimate (``stat="median"`` gives the typical run
  instead, when occasional slow runs are part of what is measured).
* **Interleaving.** Machine load drifts: a noisy neighbour starts a build, the CPU heats up and
  clocks down. Timing A completely and then B charges the drift to whichever ran in the bad
  period, and their ratio is wrong. ``compare`` runs the contestants round-robin (A, B, C, A, B,
  C, ...) so a drift hits every contestant alike and the ratios stay fair even when the absolute
  times move.
* **Blocks and pauses** (``block``, ``discard``, ``pause``). OpenBLAS, OpenMP and PyTorch keep
  their worker threads spinning for a while after a call, and steal cores from whatever runs
  next. For such code, interleave *blocks* of calls instead of single calls, sleep briefly
  before each block (``pause``) and drop the first calls of each block (``discard``).

Every function takes a ``clock`` (an object with ``now()`` in seconds and ``sleep(seconds)``),
so that tests can drive the logic with a fake clock; by default it is ``time.perf_counter``
and ``time.sleep``. Never assert on real timings in tests: print ratios in benchmarks instead.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

from .errors import ArgumentError, UnknownNameError

__all__ = ["Clock", "Comparison", "SYSTEM_CLOCK", "best_of", "compare", "samples", "timed"]

STATS = {"min": min, "median": statistics.median}


@dataclass(frozen=True)
class Clock:
    """Where time comes from: ``now()`` (seconds, monotonic) and ``sleep(seconds)``."""

    now: Callable[[], float] = time.perf_counter
    sleep: Callable[[float], None] = time.sleep


SYSTEM_CLOCK = Clock()


def timed(fn, *args, clock=SYSTEM_CLOCK):
    """Call ``fn(*args)`` once; return its result and the seconds it took.

    For one-off measurements whose result is needed (a compile time, a planning time); to
    estimate a function's cost, use ``best_of`` or ``compare``.
    """
    start = clock.now()
    value = fn(*args)
    return value, clock.now() - start


def samples(fn, *args, repeats=5, budget=0.0, pause=0.0, discard=0, clock=SYSTEM_CLOCK):
    """Time back-to-back calls of ``fn(*args)`` (one block, no warm-up); return the seconds of each.

    Args:
        fn: The callable to time.
        *args: Passed to every call.
        repeats: Calls at least (``discard`` of them included).
        budget: Keep calling until this many seconds have passed since the block started, too.
        pause: Seconds to sleep before the block, so that worker threads of whatever ran before
            (BLAS, OpenMP) stop spinning first.
        discard: Drop the first this many calls of the block (threads still settling).
        clock: Time source (see the module docstring).

    Returns:
        The kept times in seconds, in call order.

    Raises:
        ArgumentError: ``repeats`` below 1, or ``discard`` that would drop every call.
    """
    _check_block(repeats, discard)
    if pause:
        clock.sleep(pause)
    times, started = [], clock.now()
    while True:
        t0 = clock.now()
        fn(*args)
        t1 = clock.now()
        times.append(t1 - t0)
        if len(times) >= repeats and t1 - started >= budget:
            return times[discard:]


def best_of(fn, *args, repeats=5, warmup=1, budget=0.0, pause=0.0, clock=SYSTEM_CLOCK):
    """The fastest of ``repeats`` back-to-back runs of ``fn(*args)``, after untimed warm-up calls.

    The fastest run is the least disturbed one: noise only ever adds time (module docstring).

    Args:
        fn: The callable to time.
        *args: Passed to every call.
        repeats: Timed calls at least.
        warmup: Untimed calls first (compilation, page faults, caches, thread start-up).
        budget: Keep calling until this many seconds of timed calls have passed, too.
        pause: Seconds to sleep before the warm-up (let other code's worker threads go quiet).
        clock: Time source (see the module docstring).

    Returns:
        The best time, in seconds.

    Raises:
        ArgumentError: ``repeats`` below 1 or a negative ``warmup``.
    """
    _check_count("warmup", warmup, 0)
    _check_count("repeats", repeats, 1)
    if pause:
        clock.sleep(pause)
    for _ in range(warmup):
        fn(*args)
    return min(samples(fn, *args, repeats=repeats, budget=budget, clock=clock))


def compare(fns, *args, rounds=5, block=1, warmup=1, budget=0.0, pause=0.0, discard=0,
            stat="min", baseline=None, clock=SYSTEM_CLOCK):
    """Time several callables interleaved and compare them against a baseline.

    Every callable is first called ``warmup`` times untimed. Then, ``rounds`` times, each in
    turn runs one block of ``block`` back-to-back timed calls (see ``samples`` for ``budget``,
    ``pause`` and ``discard``). Taking turns spreads drifts in machine load over every contestant
    alike, so their ratios stay fair (module docstring).

    Args:
        fns: ``{label: callable}``, or a sequence of callables (labelled 0, 1, ...). Labels may
            be any hashable (a string, a tile size, a tuple).
        *args: Passed to every call of every callable.
        rounds: How many turns each callable gets.
        block: Timed calls per turn (1: pure round-robin).
        warmup: Untimed calls of each callable before the first round.
        budget: Per turn, keep calling until this many seconds have passed, too.
        pause: Seconds to sleep before each turn.
        discard: Drop the first this many calls of each turn.
        stat: ``"min"`` (best of all kept calls, the default) or ``"median"``.
        baseline: The label the ratios are taken against; the first label by default.
        clock: Time source (see the module docstring).

    Returns:
        A ``Comparison``: ``result[label]`` is a time in seconds, ``result.ratio(label)`` its
        time over the baseline's, ``result.speedup(label)`` the inverse, ``print(result)`` a
        table.

    Raises:
        ArgumentError: No callables, a non-callable, or a count or ``stat`` that is not valid.
        UnknownNameError: ``baseline`` is not one of the labels.
    """
    table = dict(fns) if isinstance(fns, Mapping) else dict(enumerate(fns))
    if not table:
        raise ArgumentError("timing.compare: no callables to compare")
    for label, fn in table.items():
        if not callable(fn):
            raise ArgumentError(f"timing.compare: {label!r} is a {type(fn).__name__}, "
                                "not a callable")
    if stat not in STATS:
        raise ArgumentError(f"timing.compare: stat={stat!r}; use one of {', '.join(STATS)}")
    baseline = next(iter(table)) if baseline is None else baseline
    if baseline not in table:
        raise UnknownNameError(f"timing.compare: baseline {baseline!r} is not one of the "
                               f"labels {', '.join(map(repr, table))}")
    _check_count("rounds", rounds, 1)
    _check_count("warmup", warmup, 0)
    _check_block(block, discard)
    for fn in table.values():
        for _ in range(warmup):
            fn(*args)
    kept = {label: [] for label in table}
    for _ in range(rounds):
        for label, fn in table.items():
            kept[label] += samples(fn, *args, repeats=block, budget=budget, pause=pause,
                                   discard=discard, clock=clock)
    return Comparison(kept, baseline, stat)


@dataclass(frozen=True, repr=False)
class Comparison:
    """What ``compare`` measured: every kept sample per label, and how to summarise them.

    Attributes:
        samples: ``{label: [seconds, ...]}`` in call order.
        baseline: The label ratios are taken against.
        stat: ``"min"`` or ``"median"``: how a label's samples become its time.
    """

    samples: dict
    baseline: Hashable
    stat: str = "min"

    @property
    def labels(self) -> list:
        """The labels, in the order they were given."""
        return list(self.samples)

    @property
    def times(self) -> dict:
        """``{label: seconds}``, each the ``stat`` of that label's samples."""
        return {label: STATS[self.stat](ts) for label, ts in self.samples.items()}

    def __getitem__(self, label) -> float:
        """The time of ``label`` in seconds."""
        return self.times[label]

    def ratio(self, label) -> float:
        """Time of ``label`` over the baseline's (2.0: twice as slow as the baseline)."""
        return self[label] / self[self.baseline]

    def speedup(self, label) -> float:
        """Time of the baseline over ``label``'s (2.0: twice as fast as the baseline)."""
        return self[self.baseline] / self[label]

    @property
    def ratios(self) -> dict:
        """``{label: ratio(label)}``."""
        return {label: self.ratio(label) for label in self.samples}

    def table(self, unit: str = "ms") -> str:
        """Times, ratios and speed-ups as aligned text (``unit``: ``"s"``, ``"ms"`` or ``"us"``)."""
        scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
        counts = "/".join(map(str, sorted({len(ts) for ts in self.samples.values()})))
        what = "best" if self.stat == "min" else "median"
        width = max(len(str(label)) for label in self.samples)
        lines = [f"{what} of {counts} interleaved runs each, against {self.baseline!r}",
                 f"  {'':<{width}}  {unit:>10}  {'ratio':>8}  {'speed-up':>8}"]
        for label, t in self.times.items():
            lines.append(f"  {str(label):<{width}}  {t * scale:>10.3f}  "
                         f"{_times(self.ratio(label)):>8}  {_times(self.speedup(label)):>8}")
        return "\n".join(lines)

    __str__ = table

    def __repr__(self) -> str:
        return self.table()


def _times(x: float) -> str:
    """``1.50x``; small values keep two significant digits (``0.0031x``)."""
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def _check_block(calls, discard) -> None:
    _check_count("block (repeats)", calls, 1)
    _check_count("discard", discard, 0)
    if discard >= calls:
        raise ArgumentError(f"timing: discard={discard} would drop every one of the {calls} "
                            "calls of a block; make discard smaller")


def _check_count(name: str, value, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArgumentError(f"timing: {name} must be an integer >= {least}, got {value!r}")

