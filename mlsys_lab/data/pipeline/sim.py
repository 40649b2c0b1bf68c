"""A discrete-event simulator of a staged data pipeline feeding a device.

Items flow from a reader (rate F) through preprocessing stages (each with a per-item cost and
a degree: that many workers) into a consumer, the device (rate G). A stage's workers take
items from the previous stage's output buffer; a worker that finishes while the next buffer is
full waits, holding its item (back-pressure). With ``cores`` given, the preprocessing workers
share that many CPUs (processor sharing: with ``b`` busy workers each runs at
``min(1, cores / b)`` of full speed); the reader and the device are not CPUs.

``ordered=True`` models the order-preserving scheme: producer ``i`` of a stage with ``M``
workers owns items ``i + M*k`` and has its own input and output queue (``buffer`` items each),
and the next stage takes items strictly in order. ``ordered=False`` shares one buffer per
stage and takes items as they come.

In steady state the pipeline runs at ``min(F, P, G)`` with ``P = min_i degree_i / cost_i``:
``analytic_throughput``. When CPUs are shared, ``P`` is also capped by ``cores / sum(cost_i)``
and the formula becomes an upper bound: fair sharing slows every busy worker alike, so a stage
with few workers can fall behind while the CPUs are not all busy (the simulation shows how far).
The device is kept busy exactly when it is the slowest part, ``G < min(F, P)``; otherwise it
idles for a fraction ``1 - min(F, P) / G`` of the time.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentError
from .report import work_span

__all__ = ["SimStage", "SimResult", "SimStageStats", "simulate", "analytic_throughput",
           "preprocess_rate", "book_stages", "BOOK_DEGREES"]

#: The book's example per-operator degrees (13 workers: 3 + 2 + 4 + 3 + 1).
BOOK_DEGREES = {"decode": 3, "resize": 2, "rotate": 4, "normalize": 3, "hwc_to_chw": 1}
_EPS = 1e-12


@dataclass(frozen=True)
class SimStage:
    """A stage: ``cost`` seconds per item (a number, a per-item sequence, or ``f(item)``),
    ``degree`` workers, and whether it runs on the CPUs (``cpu``)."""

    name: str
    cost: float | Sequence | Callable = 0.0
    degree: int = 1
    cpu: bool = True

    def cost_of(self, item: int) -> float:
        if callable(self.cost):
            return float(self.cost(item))
        if isinstance(self.cost, (int, float)):
            return float(self.cost)
        return float(self.cost[item % len(self.cost)])

    def mean_cost(self, n_items: int = 1000) -> float:
        if isinstance(self.cost, (int, float)):
            return float(self.cost)
        length = n_items if callable(self.cost) else len(self.cost)
        return float(np.mean([self.cost_of(i) for i in range(length)]))


@dataclass(frozen=True)
class SimStageStats:
    """Per-stage outcome: ``utilisation`` (busy), ``blocked`` (holding a finished item) and
    ``starved`` (idle, waiting for input) are fractions of ``degree x makespan``."""

    name: str
    degree: int
    capacity: float
    utilisation: float
    blocked: float
    starved: float


@dataclass(frozen=True)
class SimResult:
    """What ``simulate`` found.

    Attributes:
        throughput: Steady-state items per second (between the 20th and 80th percentile
            deliveries, leaving out the fill and drain phases).
        analytic: ``analytic_throughput`` of the same configuration.
        makespan: Time until the last item was delivered.
        stages: ``SimStageStats`` per stage (reader and device included when present).
        bottleneck: The stage with the lowest capacity (``degree / mean cost``), or "cpus"
            when the shared CPUs limit the rate more than any stage.
        device_idle: Fraction of time the device waits for data (None without a device).
        timeline: :class:`~mlsys_lab.span.Span` records (``report.work_span``: one per item per
            stage) when asked for, else empty.
    """

    throughput: float
    analytic: float
    makespan: float
    stages: tuple
    bottleneck: str
    device_idle: float | None
    timeline: tuple

    def table(self) -> str:
        lines = [f"{'stage':<14}{'workers':>8}{'capacity/s':>12}{'busy':>7}{'blocked':>9}"
                 f"{'starved':>9}"]
        for s in self.stages:
            lines.append(f"{s.name:<14}{s.degree:>8}{s.capacity:>12.1f}{s.utilisation:>7.0%}"
                         f"{s.blocked:>9.0%}{s.starved:>9.0%}")
        idle = "" if self.device_idle is None else f"; device idle {self.device_idle:.0%}"
        lines.append(f"throughput {self.throughput:.1f}/s (analytic {self.analytic:.1f}/s); "
                     f"bottleneck: {self.bottleneck}{idle}")
        return "\n".join(lines)

    __str__ = table


def _check_stages(stages) -> list:
    stages = list(stages)
    for stage in stages:
        if not isinstance(stage, SimStage):
            raise ArgumentError(f"simulate: stages must be SimStage, got {type(stage).__name__}")
        if not isinstance(stage.degree, int) or stage.degree < 1:
            raise ArgumentError(f"simulate: stage {stage.name!r} has degree {stage.degree!r}")
    if len({s.name for s in stages}) != len(stages):
        raise ArgumentError(f"simulate: stage names repeat: {[s.name for s in stages]}")
    return stages


def _check_rate(name, rate):
    if rate is not None and (not isinstance(rate, (int, float)) or not rate > 0):
        raise ArgumentError(f"simulate: {name} must be a positive number, got {rate!r}")


def preprocess_rate(stages, cores: float | None = None) -> float:
    """P: items per second the preprocessing stages sustain (their slowest, and the CPUs)."""
    stages = _check_stages(stages)
    costs = [s.mean_cost() for s in stages]
    rates = [s.degree / c if c > 0 else math.inf for s, c in zip(stages, costs)]
    cpu_work = sum(c for s, c in zip(stages, costs) if s.cpu)
    if cores is not None and cpu_work > 0:
        rates.append(cores / cpu_work)
    return min(rates, default=math.inf)


def analytic_throughput(stages, read_rate=None, consume_rate=None, cores=None) -> float:
    """``min(F, P, G)``: the steady-state rate of the pipeline (None rates are unlimited)."""
    limits = [preprocess_rate(stages, cores)]
    limits += [r for r in (read_rate, consume_rate) if r is not None]
    return min(limits)


def book_stages(costs: dict | None = None, degrees: dict | None = None) -> list:
    """The book's five stages with the book's degrees (or ``degrees``) and ``costs`` (seconds
    per item; by default proportional to the degrees, so that every stage runs at 1000/s)."""
    degrees = dict(BOOK_DEGREES, **(degrees or {}))
    costs = costs or {name: d / 1000.0 for name, d in BOOK_DEGREES.items()}
    return [SimStage(name, costs[name], degrees[name]) for name in BOOK_DEGREES]


class _StageState:
    def __init__(self, stage: SimStage, ordered: bool, buffer: int, last: bool):
        self.stage, self.last = stage, last
        d = stage.degree
        self.item = [-1] * d
        self.remaining = [0.0] * d
        self.started = [0.0] * d
        self.blocked = deque()           # workers holding a finished item, in finish order
        self.is_blocked = [False] * d
        self.lanes = [deque() for _ in range(d if ordered else 1)]
        self.capacity = buffer if ordered else buffer * d
        self.busy_time = 0.0
        self.blocked_time = 0.0
        self.next_in = 0                 # ordered mode: the next item this stage takes
        self.inbox = [deque() for _ in range(d)]  # ordered mode: each producer's input queue

    def idle(self, w):
        return self.item[w] < 0 and not self.is_blocked[w]


class _Simulation:
    def __init__(self, stages, n_items, cores, buffer, ordered, record):
        self.n, self.cores, self.ordered, self.record = n_items, cores, ordered, record
        self.states = [_StageState(s, ordered, buffer, i == len(stages) - 1)
                       for i, s in enumerate(stages)]
        self.now = 0.0
        self.source_next = 0
        self.done = np.full(n_items, np.nan)
        self.delivered = 0
        self.spans = []

    # -- moving items -------------------------------------------------------------------------
    def _lane_for(self, state: _StageState, w: int) -> deque:
        return state.lanes[w if self.ordered else 0]

    def _unblock(self, state: _StageState) -> bool:
        moved = False
        for _ in range(len(state.blocked)):
            w = state.blocked[0]
            lane = self._lane_for(state, w)
            if len(lane) >= state.capacity:
                if not self.ordered:
                    break
                state.blocked.rotate(-1)
                continue
            state.blocked.popleft()
            lane.append(state.item[w])
            state.item[w], state.is_blocked[w] = -1, False
            moved = True
        return moved

    def _available(self, s: int):
        """The next item stage ``s`` may take, or None."""
        if s == 0:
            return self.source_next if self.source_next < self.n else None
        upstream = self.states[s - 1]
        if self.ordered:
            want = self.states[s].next_in
            lane = upstream.lanes[want % upstream.stage.degree]
            return want if lane and lane[0] == want else None
        return upstream.lanes[0][0] if upstream.lanes[0] else None

    def _take(self, s: int) -> bool:
        state, moved = self.states[s], False
        while True:
            item = self._available(s)
            if item is None:
                return moved
            if self.ordered:
                w = item % state.stage.degree
                if len(state.inbox[w]) >= state.capacity:
                    return moved
            else:
                w = next((w for w in range(state.stage.degree) if state.idle(w)), None)
                if w is None:
                    return moved
            if s == 0:
                self.source_next += 1
            else:
                upstream = self.states[s - 1]
                upstream.lanes[item % upstream.stage.degree if self.ordered else 0].popleft()
            state.next_in = item + 1
            if self.ordered:
                state.inbox[w].append(item)
                self._start_from_inbox(state)
            else:
                self._start(state, w, item)
            moved = True

    def _start(self, state: _StageState, w: int, item: int):
        state.item[w], state.started[w] = item, self.now
        state.remaining[w] = state.stage.cost_of(item)

    def _start_from_inbox(self, state: _StageState) -> bool:
        started = False
        for w in range(state.stage.degree):
            if state.idle(w) and state.inbox[w]:
                self._start(state, w, state.inbox[w].popleft())
                started = True
        return started

    def _settle(self):
        moved = True
        while moved:
            moved = False
            for s in range(len(self.states)):
                moved |= self._unblock(self.states[s])
                if self.ordered:
                    moved |= self._start_from_inbox(self.states[s])
                moved |= self._take(s)

    def _finish(self, state: _StageState, w: int):
        item = state.item[w]
        if self.record:
            self.spans.append(work_span(state.stage.name, w, item, state.started[w], self.now))
        if state.last:
            self.done[item] = self.now
            self.delivered += 1
            state.item[w] = -1
        else:
            state.is_blocked[w] = True
            state.blocked.append(w)

    # -- time -----------------------------------------------------------------------------------
    def run(self):
        self._settle()
        while self.delivered < self.n:
            running = [(st, w) for st in self.states for w in range(st.stage.degree)
                       if st.item[w] >= 0 and not st.is_blocked[w]]
            if not running:
                raise RuntimeError("pipeline.sim: no worker can make progress (deadlock)")
            cpu_busy = sum(1 for st, _ in running if st.stage.cpu)
            cpu_speed = 1.0 if self.cores is None or cpu_busy <= self.cores \
                else self.cores / cpu_busy
            speeds = [cpu_speed if st.stage.cpu else 1.0 for st, _ in running]
            dt = min(st.remaining[w] / v for (st, w), v in zip(running, speeds))
            for st in self.states:
                st.busy_time += dt * sum(1 for w in range(st.stage.degree)
                                         if st.item[w] >= 0 and not st.is_blocked[w])
                st.blocked_time += dt * len(st.blocked)
            self.now += dt
            for (st, w), v in zip(running, speeds):
                st.remaining[w] -= dt * v
                if st.remaining[w] <= _EPS * max(1.0, self.now):
                    self._finish(st, w)
            self._settle()


def simulate(stages, n_items: int = 500, *, read_rate: float | None = None,
             consume_rate: float | None = None, cores: float | None = None, buffer: int = 2,
             ordered: bool = False, timeline: bool = False) -> SimResult:
    """Simulate ``n_items`` through ``stages``; see the module docstring for the model.

    Args:
        stages: ``SimStage``s in pipeline order.
        n_items: Items to push through.
        read_rate: F, items/s the reader delivers (None: unlimited).
        consume_rate: G, items/s the device consumes (None: no device stage).
        cores: CPUs shared by the preprocessing workers (None: one per worker).
        buffer: Output buffer per worker (the stage's buffer is ``buffer * degree`` when
            unordered).
        ordered: Use the order-preserving scheme.
        timeline: Record a :class:`~mlsys_lab.span.Span` per item per stage.
    """
    stages = _check_stages(stages)
    _check_rate("read_rate", read_rate)
    _check_rate("consume_rate", consume_rate)
    if not isinstance(n_items, int) or n_items < 4:
        raise ArgumentError(f"simulate: n_items must be an int >= 4, got {n_items!r}")
    if not isinstance(buffer, int) or buffer < 1:
        raise ArgumentError(f"simulate: buffer must be an int >= 1, got {buffer!r}")
    analytic = analytic_throughput(stages, read_rate, consume_rate, cores)
    full = ([SimStage("read", 1.0 / read_rate, 1, cpu=False)] if read_rate else []) + stages
    if consume_rate:
        full.append(SimStage("device", 1.0 / consume_rate, 1, cpu=False))
    sim = _Simulation(full, n_items, cores, buffer, ordered, timeline)
    sim.run()
    finished = np.sort(sim.done)
    first, last = n_items // 5, (4 * n_items) // 5  # steady state: no fill, no drain
    span = finished[last] - finished[first]
    throughput = (last - first) / span if span > 0 else math.inf
    makespan = float(finished[-1])
    stats = []
    for st in sim.states:
        mean = st.stage.mean_cost(n_items)
        capacity = st.stage.degree / mean if mean > 0 else math.inf
        total = st.stage.degree * makespan if makespan > 0 else 1.0
        util, blocked = st.busy_time / total, st.blocked_time / total
        stats.append(SimStageStats(st.stage.name, st.stage.degree, capacity, util, blocked,
                                   max(0.0, 1.0 - util - blocked)))
    bottleneck = min(stats, key=lambda s: s.capacity)
    bottleneck = "cpus" if analytic < bottleneck.capacity * (1 - 1e-9) else bottleneck.name
    idle = None if consume_rate is None else max(0.0, 1.0 - throughput / consume_rate)
    return SimResult(float(throughput), float(analytic), makespan, tuple(stats), bottleneck,
                     idle, tuple(sim.spans))
