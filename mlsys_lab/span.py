"""One timeline record for every part of the framework: the :class:`Span`.

Whatever runs over time records spans: the runtime (a graph node on a device and worker), the
data pipeline (an operator's worker processing an item), pipeline parallelism (a stage's forward
or backward of a micro-batch) and the distributed simulator (a rank's compute, send or receive).
One drawing path (:func:`mlsys_lab.viz.plot_spans`, :func:`mlsys_lab.viz.spans_widget`) draws
any list of them::

    ml.Span("cpu/worker0", "c=matmul", 0.0, 1e-3, kind="matmul")
    ml.Span("rank 3", "send 3->4", 2e-6, 5e-6, kind="send", detail={"rank": 3, "bytes": 1024})

It sits at the bottom of the package (beside ``timing``), so the engine may emit spans without
importing ``viz``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["Span"]


@functools.total_ordering
@dataclass(frozen=True, slots=True)
class Span:
    """One interval on a timeline: ``name`` ran on ``lane`` from ``start`` to ``end``.

    Attributes:
        lane: The row it is drawn on: ``"cpu/worker0"`` (a device and worker), ``"rank 3"``,
            ``"stage 1"``, ``"decode 0"`` (an operator's worker).
        name: What ran, as a bar's label: ``"c=matmul"``, ``"F3"``, ``"send 3->4"``.
        start, end: Seconds (measured, or simulated; a schedule's own units for a pipeline
            schedule), ``start <= end``.
        kind: The category a picture colours it by: the op, ``"compute"``/``"send"``/
            ``"recv"``, ``"F"``/``"B"``, the operator's name.
        detail: The emitter's own facts (a rank, bytes, the micro-batch, the item), also
            readable as attributes: ``span.rank`` is ``span.detail["rank"]``.

    Spans compare equal field by field and sort by ``(start, end, lane, name, kind)`` (then by
    their details), so two traces can be compared as sorted lists.
    """

    lane: str
    name: str
    start: float
    end: float
    kind: str = ""
    detail: Mapping = field(default_factory=dict, hash=False)

    @property
    def duration(self) -> float:
        """``end - start``."""
        return self.end - self.start

    def __getattr__(self, name):
        # Only reached when ``name`` is no field: the emitter's details (``span.rank``).
        try:
            detail = object.__getattribute__(self, "detail")
        except AttributeError:  # not initialised yet
            detail = {}
        if not name.startswith("_") and name in detail:
            return detail[name]
        raise AttributeError(f"Span has no field or detail {name!r} (its details: "
                             f"{', '.join(map(str, detail)) or 'none'})")

    def _head(self):
        return (self.start, self.end, self.lane, self.name, self.kind)

    def __lt__(self, other):
        if not isinstance(other, Span):
            return NotImplemented
        a, b = self._head(), other._head()
        if a != b:
            return a < b
        return _detail_key(self.detail) < _detail_key(other.detail)


def _detail_key(detail):
    return sorted((str(k), repr(v)) for k, v in detail.items())
