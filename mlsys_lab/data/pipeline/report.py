"""What ``Pipeline.profile`` measures: the work spans a run records, and the per-operator
report (items/s, busy and waiting fractions, the timeline) built from them."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ArgumentError
from ...span import Span
from .runtime import now

__all__ = ["Report", "StageReport", "work_span"]


def work_span(stage, worker, item, start, end) -> Span:
    """The :class:`~mlsys_lab.span.Span` of ``stage``'s ``worker`` processing ``item`` from
    ``start`` to ``end`` (seconds since the run began): lane ``"stage worker"``, name
    ``"item N"``, kind the stage; details ``stage``, ``worker`` and ``item`` (also readable as
    ``span.stage``, ``span.worker``, ``span.item``)."""
    return Span(f"{stage} {worker}", f"item {item}", start, end, stage,
                {"stage": stage, "worker": worker, "item": item})


class Recorder:
    """Collects busy and waiting seconds per ``(stage, worker)`` and the work spans."""

    def __init__(self):
        self.origin = now()
        self.spans: list[Span] = []
        self.busy: dict = {}
        self.wait: dict = {}
        self.items: dict = {}

    def work(self, stage, worker, item, start, end):
        key = (stage, worker)  # each key is written by one thread only
        self.busy[key] = self.busy.get(key, 0.0) + (end - start)
        self.items[key] = self.items.get(key, 0) + 1
        self.spans.append(work_span(stage, worker, item, start - self.origin, end - self.origin))

    def waited(self, stage, worker, seconds):
        key = (stage, worker)
        self.wait[key] = self.wait.get(key, 0.0) + seconds


@dataclass(frozen=True)
class StageReport:
    """One operator's numbers from a profiled run.

    Attributes:
        items: Items (or batches) the operator produced work for.
        items_per_s: ``items`` over the run's wall time.
        busy: Fraction of ``degree x wall`` spent in the operator's own work.
        waiting: Fraction of ``degree x wall`` its workers spent waiting for input or for room
            downstream (for an inline operator, the time its upstream took to deliver).
        busy_seconds, wait_seconds: The totals behind those fractions.
    """

    name: str
    kind: str
    degree: int
    items: int
    items_per_s: float
    busy: float
    waiting: float
    busy_seconds: float
    wait_seconds: float


@dataclass(frozen=True)
class Report:
    """What ``Pipeline.profile`` measured: per-stage numbers and the work timeline (a tuple of
    :class:`~mlsys_lab.span.Span`, one per item an operator's worker processed; see
    :func:`work_span`)."""

    stages: tuple
    wall: float
    outputs: int
    timeline: tuple

    @property
    def bottleneck(self) -> str:
        """The operator with the highest busy fraction (the one to give more workers)."""
        return max(self.stages, key=lambda s: s.busy).name

    @property
    def throughput(self) -> float:
        """Outputs per second."""
        return self.outputs / self.wall if self.wall > 0 else 0.0

    def stage(self, name: str) -> StageReport:
        """The numbers of the operator called ``name``."""
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ArgumentError(f"Report.stage: no stage {name!r}; stages: "
                            f"{[s.name for s in self.stages]}")

    def table(self) -> str:
        """The report as a text table."""
        lines = [f"{'stage':<28}{'workers':>8}{'items':>8}{'items/s':>11}{'busy':>7}{'wait':>7}"]
        for s in self.stages:
            lines.append(f"{s.name:<28}{s.degree:>8}{s.items:>8}{s.items_per_s:>11.1f}"
                         f"{s.busy:>7.0%}{s.waiting:>7.0%}")
        lines.append(f"{self.outputs} outputs in {self.wall:.3f} s "
                     f"({self.throughput:.1f}/s); bottleneck: {self.bottleneck}")
        return "\n".join(lines)

    __str__ = table


def make_report(nodes, recorder: Recorder, wall: float, outputs: int) -> Report:
    """The ``Report`` of a run of ``nodes`` that ``recorder`` watched."""
    stages = []
    for node in nodes:
        busy = sum(v for (stage, _), v in recorder.busy.items() if stage == node.name)
        wait = sum(v for (stage, _), v in recorder.wait.items() if stage == node.name)
        items = sum(v for (stage, _), v in recorder.items.items() if stage == node.name)
        capacity = node.degree * wall if wall > 0 else 1.0
        stages.append(StageReport(node.name, node.kind, node.degree, items,
                                  items / wall if wall > 0 else 0.0, min(busy / capacity, 1.0),
                                  min(wait / capacity, 1.0), busy, wait))
    return Report(tuple(stages), wall, outputs, tuple(recorder.spans))
