"""Lifetime records and the MemoryPlan the planner returns (book ch. 7).

A ``Lifetime`` is one tensor's memory request: size in bytes and the steps it is live. The
planner works on these plain records only, so it can be tested without any graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Hashable, Iterable, Sequence

import numpy as np

from mlsys_lab.errors import PlanError


@dataclass(frozen=True)
class Lifetime:
    """One tensor's memory request.

    Attributes:
        id: Any hashable name for the tensor (a string, an int, a graph ``Value``).
        size: Bytes needed, an int >= 0 that fits in int64.
        start: First step at which the tensor is live.
        end: Last step at which it is live (inclusive: live at steps ``start..end``).
        long_lived: A hint for the ``two_cursor`` strategy (weights, graph inputs).

    Raises:
        PlanError: a field is not an int or does not fit in int64, the size is negative, or
            ``end`` is before ``start``.
    """

    id: Hashable
    size: int
    start: int
    end: int
    long_lived: bool = False

    def __post_init__(self):
        _check_record(self)

    def overlaps(self, other: Lifetime) -> bool:
        """Whether the two tensors are live at a common step."""
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class Workspace:
    """The id of a kernel's scratch memory in a :class:`Lifetime`: what the kernel selected for
    ``producer`` (a graph node) declares through ``Kernel.workspace``, live at that node's step
    only. It quacks like a graph value where the planner's readers look (``name``,
    ``producer``, ``nbytes``).

    Attributes:
        producer: the node whose kernel holds the memory.
        nbytes: its size in bytes.
        kernel: the kernel's name.
    """

    producer: object
    nbytes: int
    kernel: str = ""

    @property
    def name(self) -> str:
        return f"workspace#{getattr(self.producer, 'id', '?')}"

    def __repr__(self):
        return f"{self.name}({self.kernel}, {self.nbytes} B)"


@dataclass
class MemoryPlan:
    """Where each tensor lives in one arena.

    Attributes:
        offsets: Byte offset of each tensor, keyed by ``Lifetime.id``.
        arena_size: Bytes the arena needs (the highest byte any tensor reaches).
        strategy: The strategy that produced the plan (``"best:<winner>"`` for ``best``).
        alignment: Every offset is a multiple of it.
        inplace: The ``(out_id, in_id)`` pairs that were allowed to share memory.
    """

    offsets: dict
    arena_size: int
    strategy: str
    alignment: int = 1
    inplace: tuple = field(default_factory=tuple)

    def __repr__(self):
        return (
            f"MemoryPlan(strategy={self.strategy!r}, tensors={len(self.offsets)}, "
            f"arena_size={self.arena_size})"
        )


_INT64 = (-(2**63), 2**63 - 1)


def _check_record(r) -> None:
    """Raise PlanError unless ``r`` is a Lifetime the planner's int64 arithmetic can hold."""
    if not isinstance(r, Lifetime):
        raise PlanError(f"memory planner: expected Lifetime records, got {type(r).__name__} {r!r}")
    for name in ("size", "start", "end"):
        value = getattr(r, name)
        if not isinstance(value, (int, np.integer)):
            raise PlanError(f"Lifetime {r.id!r}: {name} must be an int, got {value!r}")
        if not _INT64[0] <= value <= _INT64[1]:
            raise PlanError(f"Lifetime {r.id!r}: {name} {value} does not fit in int64")
    if r.size < 0:
        raise PlanError(f"Lifetime {r.id!r}: size {r.size} is negative")
    if r.start > r.end:
        raise PlanError(f"Lifetime {r.id!r}: start {r.start} is after end {r.end}")


def _aligned(records: Iterable[Lifetime], alignment: int = 1) -> list[Lifetime]:
    """The records, each checked, with the sizes rounded up to ``alignment``.

    Raises:
        PlanError: a bad record or alignment, or sizes that sum past int64 (offsets and live
            totals are computed in int64, so they could not be represented).
    """
    records = list(records)
    if not isinstance(alignment, (int, np.integer)) or alignment < 1:
        raise PlanError(f"alignment must be an int >= 1, got {alignment!r}")
    for r in records:
        _check_record(r)
    sizes = [_align(int(r.size), int(alignment)) for r in records]
    if sum(sizes) > _INT64[1]:
        raise PlanError(f"memory planner: the {len(records)} tensors need {sum(sizes)} bytes in "
                        f"all, more than int64 can count (sizes must sum below 2**63)")
    return [r if r.size == n else replace(r, size=n) for r, n in zip(records, sizes, strict=True)]


def _align(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def _live_bytes_at_starts(records: Sequence[Lifetime]) -> tuple[np.ndarray, np.ndarray]:
    """Bytes live at each distinct start step (the live total only rises at a start).

    Returns:
        ``(steps, live)``: sorted distinct start steps and the bytes live at each.
    """
    starts = np.array([r.start for r in records], dtype=np.int64)
    ends = np.array([r.end for r in records], dtype=np.int64)
    sizes = np.array([r.size for r in records], dtype=np.int64)
    steps = np.unique(starts)
    by_start, by_end = np.argsort(starts, kind="stable"), np.argsort(ends, kind="stable")
    born = np.concatenate(([0], np.cumsum(sizes[by_start])))
    dead = np.concatenate(([0], np.cumsum(sizes[by_end])))
    born_by = born[np.searchsorted(starts[by_start], steps, side="right")]
    dead_before = dead[np.searchsorted(ends[by_end], steps, side="left")]
    return steps, born_by - dead_before


def _peak_live(records: Sequence[Lifetime]) -> int:
    """The most bytes live at any one step (0 for no records)."""
    return int(_live_bytes_at_starts(records)[1].max()) if records else 0
