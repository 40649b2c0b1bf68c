"""Memory planning (book ch. 7): static offsets for a compiled graph, a pool for eager mode.

A compiled graph knows when each tensor is born and dies. ``plan`` turns those ``Lifetime``
records into byte offsets in one arena: tensors live at the same step never share bytes, tensors
with disjoint lifetimes may reuse them. ``verify`` checks that; ``lower_bound`` says how good a
plan is. Eager mode cannot see the future, so it uses ``CachingAllocator``, which caches frees.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Hashable, Iterable, Sequence

import numpy as np

from mlsys_lab.errors import GraphError, OutOfMemoryError, PlanError, UnknownNameError

from .registry import REGISTRY

__all__ = [
    "Lifetime",
    "MemoryPlan",
    "STRATEGIES",
    "check_strategy",
    "plan",
    "lower_bound",
    "naive_size",
    "verify",
    "lifetimes",
    "inplace_pairs",
    "Block",
    "CachingAllocator",
    "track_memory",
]


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Bounds
# --------------------------------------------------------------------------------------------


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


def lower_bound(
    lifetimes: Iterable[Lifetime],
    alignment: int = 1,
    inplace: Iterable[tuple[Hashable, Hashable]] = (),
) -> int:
    """The largest number of (aligned) bytes live at any one step: no plan is smaller.

    An in-place pair's output overwrites its input at the step where the input dies and the
    output is born, so the two hold only one buffer there. Pass the ``inplace`` pairs given to
    :func:`plan` (``plan.inplace``) and each pair counts once: the bound then holds for plans
    that use those pairs as well as for plans that do not. Without pairs it counts every
    tensor, and a plan that uses pairs can go below it.

    Args:
        lifetimes: The tensors.
        alignment: Sizes are rounded up to this many bytes first, as :func:`plan` does.
        inplace: ``(out_id, in_id)`` pairs, checked as :func:`plan` checks them.

    Raises:
        PlanError: a bad record, or sizes that sum past int64.
        GraphError: an in-place pair that :func:`plan` would refuse.
    """
    records = _aligned(lifetimes, alignment)
    pairs = tuple(inplace)
    if pairs:
        _check_unique(records)
        records, _ = _merge_inplace(records, pairs)
    if not records:
        return 0
    return int(_live_bytes_at_starts(records)[1].max())


def naive_size(lifetimes: Iterable[Lifetime], alignment: int = 1) -> int:
    """Bytes needed with no reuse at all: the sum of the aligned sizes."""
    return sum(r.size for r in _aligned(lifetimes, alignment))


# --------------------------------------------------------------------------------------------
# Placement machinery shared by the strategies
# --------------------------------------------------------------------------------------------

_NO_LIMIT = np.iinfo(np.int64).max


class _Placed:
    """Tensors placed so far, as numpy columns kept sorted by offset.

    Sorted columns make "which placed tensors are live with this one, in address order" a
    single vectorised mask, so each placement is O(n) numpy work instead of O(n log n) Python.
    """

    def __init__(self, capacity: int):
        self.columns = np.empty((4, capacity), dtype=np.int64)  # low, high, start, end
        self.count = 0

    def add(self, record: Lifetime, offset: int) -> None:
        n, cols = self.count, self.columns
        i = int(np.searchsorted(cols[0, :n], offset, side="right"))
        cols[:, i + 1 : n + 1] = cols[:, i:n]
        cols[:, i] = (offset, offset + record.size, record.start, record.end)
        self.count += 1

    def gaps(self, record: Lifetime) -> tuple[np.ndarray, np.ndarray]:
        """Free address gaps ``[lo, hi)`` among placed tensors whose lifetime meets ``record``.

        The last gap is unbounded (``hi`` is a huge sentinel), so something always fits.
        """
        low, high, start, end = self.columns[:, : self.count]
        live = (start <= record.end) & (end >= record.start)
        low, high = low[live], high[live]
        reach = np.maximum.accumulate(high) if len(high) else high
        gap_lo = np.concatenate(([0], reach))
        gap_hi = np.concatenate((low, [_NO_LIMIT]))
        return gap_lo, gap_hi


def _lowest_fit(gap_lo: np.ndarray, gap_hi: np.ndarray, size: int) -> int:
    """The lowest offset where ``size`` bytes fit in a gap."""
    return int(gap_lo[np.argmax(gap_hi - gap_lo >= size)])


def _smallest_fit(gap_lo: np.ndarray, gap_hi: np.ndarray, size: int) -> int:
    """The offset of the smallest bounded gap that fits, else the top of the unbounded one."""
    width = (gap_hi - gap_lo)[:-1]
    fitting = np.flatnonzero(width >= size)
    if len(fitting) == 0:
        return int(gap_lo[-1])
    return int(gap_lo[fitting[np.argmin(width[fitting])]])


def _place(records: Sequence[Lifetime], order: Iterable[int], fit=_lowest_fit) -> dict:
    """Place ``records`` one by one in ``order``, each avoiding the live ones placed before."""
    placed, offsets = _Placed(len(records)), {}
    for i in order:
        record = records[i]
        offset = fit(*placed.gaps(record), record.size)
        placed.add(record, offset)
        offsets[record.id] = offset
    return offsets


def _by_start(records: Sequence[Lifetime]) -> list[int]:
    return sorted(range(len(records)), key=lambda i: (records[i].start, -records[i].size, i))


# --------------------------------------------------------------------------------------------
# Strategies: each maps aligned, non-empty records to {id: offset}
# --------------------------------------------------------------------------------------------

# A strategy takes aligned records of non-zero size and returns {id: offset}. Add your own with
# ``STRATEGIES["mine"] = fn``; ``plan(..., "best")`` then tries it too (registry order breaks ties).
STRATEGIES: dict[str, Callable[[Sequence[Lifetime]], dict]] = {}


def _strategy(name: str):
    def register(fn):
        STRATEGIES[name] = fn
        return fn

    return register


@_strategy("naive")
def naive(records: Sequence[Lifetime]) -> dict:
    """No reuse: tensors are laid out one after another."""
    offsets, top = {}, 0
    for r in records:
        offsets[r.id] = top
        top += r.size
    return offsets


@_strategy("first_fit")
def first_fit(records: Sequence[Lifetime]) -> dict:
    """In order of birth, each tensor takes the lowest gap among live tensors that fits it."""
    return _place(records, _by_start(records))


@_strategy("best_fit")
def best_fit(records: Sequence[Lifetime]) -> dict:
    """In order of birth, each tensor takes the smallest gap that fits it (else the top)."""
    return _place(records, _by_start(records), fit=_smallest_fit)


@_strategy("greedy_by_size")
def greedy_by_size(records: Sequence[Lifetime]) -> dict:
    """TFLite's default: biggest tensors first, each at the lowest offset that is free for
    its whole lifetime among the tensors already placed."""
    order = sorted(range(len(records)), key=lambda i: (-records[i].size, records[i].start, i))
    return _place(records, order)


@_strategy("greedy_by_breadth")
def greedy_by_breadth(records: Sequence[Lifetime]) -> dict:
    """Tensors that cover the busiest step go first.

    A tensor's breadth is the most bytes live at any step it covers; ties go to the bigger
    tensor. Placement is then lowest-fit, as in ``greedy_by_size``.
    """
    return _place(records, _breadth_order(records))


def _breadth_order(records: Sequence[Lifetime]) -> list[int]:
    steps, live = _live_bytes_at_starts(records)
    first = np.searchsorted(steps, [r.start for r in records], side="left")
    last = np.searchsorted(steps, [r.end for r in records], side="right")
    breadth = [int(live[a:b].max()) for a, b in zip(first, last, strict=True)]
    return sorted(range(len(records)), key=lambda i: (-breadth[i], -records[i].size, i))


#: Placement budget of ``local_search``, in tensors placed: each try re-places every tensor, so
#: a graph of n tensors gets about ``LOCAL_SEARCH_WORK // n**2`` tries (at most 64).
LOCAL_SEARCH_WORK = 8_000_000


@_strategy("local_search")
def local_search(records: Sequence[Lifetime]) -> dict:
    """``greedy_by_breadth``, then a bounded local search over the placement order.

    The arena's height is set by the tensors that reach its top. Placing one of them earlier
    (before the tensors that pushed it up) may let it sit lower; the search tries each such
    tensor at each earlier position, keeps the first order that shrinks the arena and starts
    again, until nothing improves, the lower bound is reached, or the budget is spent. It is
    deterministic: the same records always give the same plan.
    """
    order = _breadth_order(records)
    offsets = _place(records, order)
    size, floor = _arena_size(records, offsets), lower_bound(records)
    tries = min(64, LOCAL_SEARCH_WORK // max(len(records), 1) ** 2)
    while size > floor and tries > 0:
        top = [k for k, i in enumerate(order) if offsets[records[i].id] + records[i].size == size]
        moves = (order[:pos] + [order[k]] + order[pos:k] + order[k + 1:]
                 for k in top for pos in range(k))
        for candidate in moves:
            if tries == 0:
                break
            tries -= 1
            placed = _place(records, candidate)
            if _arena_size(records, placed) < size:
                order, offsets, size = candidate, placed, _arena_size(records, placed)
                break
        else:  # no move shrinks the arena
            break
    return offsets


LONG_LIVED_FRACTION = 0.5


@_strategy("two_cursor")
def two_cursor(records: Sequence[Lifetime], long_fraction: float = LONG_LIVED_FRACTION) -> dict:
    """The book's two-ended pool: long-lived tensors from the bottom, short-lived from the top.

    Rule: a tensor is long-lived if it is flagged ``long_lived`` or is live for at least
    ``long_fraction`` of the schedule's steps. Long-lived tensors are packed upward from
    offset 0, short-lived ones downward from the top of the pool (each side reusing memory
    among its own tensors by first fit). The two regions meet where the arena ends, so the
    arena is the long region's height plus the short region's depth.
    """
    if not records:
        return {}
    span = max(r.end for r in records) - min(r.start for r in records) + 1

    def is_long(r):
        return r.long_lived or (r.end - r.start + 1) >= long_fraction * span

    bottom = [r for r in records if is_long(r)]
    top = [r for r in records if not is_long(r)]
    up, down = first_fit(bottom), first_fit(top)
    long_height = max((up[r.id] + r.size for r in bottom), default=0)
    short_depth = max((down[r.id] + r.size for r in top), default=0)
    arena = long_height + short_depth
    offsets = dict(up)
    offsets.update({r.id: arena - down[r.id] - r.size for r in top})
    return offsets


def _best(records: Sequence[Lifetime]) -> tuple[str, dict]:
    """Run every registered strategy; keep the smallest arena (ties: registry order)."""
    best_name, best_offsets, best_size = None, None, None
    for name, strategy in STRATEGIES.items():
        offsets = strategy(records)
        size = _arena_size(records, offsets)
        if best_size is None or size < best_size:
            best_name, best_offsets, best_size = name, offsets, size
    return best_name, best_offsets


def _arena_size(records: Sequence[Lifetime], offsets: dict) -> int:
    return max((offsets[r.id] + r.size for r in records), default=0)


# --------------------------------------------------------------------------------------------
# plan / verify
# --------------------------------------------------------------------------------------------


def plan(
    lifetimes: Iterable[Lifetime],
    strategy: str = "best",
    alignment: int = 64,
    inplace: Iterable[tuple[Hashable, Hashable]] = (),
) -> MemoryPlan:
    """Assign each tensor a byte offset in one arena.

    Args:
        lifetimes: The tensors to place; ids must be unique.
        strategy: A name in ``STRATEGIES``, or ``"best"`` to run them all and keep the
            smallest arena (ties go to the first in registry order).
        alignment: Sizes are rounded up to, and offsets are multiples of, this many bytes.
        inplace: ``(out_id, in_id)`` pairs where the output may overwrite its input (an
            elementwise op). Each input must die at the step its output is born and have
            the same aligned size; the two then form one record and share one offset.

    Returns:
        A ``MemoryPlan``. Zero-size tensors get offset 0 and never conflict.

    Raises:
        UnknownNameError: an unknown strategy (an ArgumentError and a KeyError).
        PlanError: duplicate ids, a bad record, or sizes that sum past int64.
        GraphError: an in-place pair that is not allowed.
    """
    check_strategy(strategy)
    records = _aligned(lifetimes, alignment)
    _check_unique(records)
    pairs = tuple(inplace)
    merged, members = _merge_inplace(records, pairs)
    nonempty = [r for r in merged if r.size > 0]
    if strategy == "best":
        winner, offsets = _best(nonempty)
        name = f"best:{winner}" if winner else "best"
    else:
        offsets, name = STRATEGIES[strategy](nonempty), strategy
    arena = _arena_size(nonempty, offsets)
    final = {r.id: offsets.get(members[r.id], 0) if r.size else 0 for r in records}
    return MemoryPlan(final, arena, name, alignment, pairs)


def check_strategy(strategy) -> str:
    """``strategy`` if it names a registered strategy or ``"best"``, else UnknownNameError
    (which lists the known ones)."""
    if not (isinstance(strategy, str) and (strategy == "best" or strategy in STRATEGIES)):
        raise UnknownNameError(f"plan: unknown strategy {strategy!r}; choose from "
                                   f"{', '.join(['best', *STRATEGIES])}")
    return strategy


def _check_unique(records: Sequence[Lifetime]) -> None:
    seen = set()
    for r in records:
        if r.id in seen:
            raise PlanError(f"two lifetimes share the id {r.id!r}")
        seen.add(r.id)


def _merge_inplace(records: Sequence[Lifetime], pairs) -> tuple[list[Lifetime], dict]:
    """Fuse each in-place chain into one record.

    Returns:
        ``(merged records, {id: id of the merged record that holds it})``.
    """
    by_id = {r.id: r for r in records}
    root = {r.id: r.id for r in records}
    taken, written = set(), set()
    for out_id, in_id in pairs:
        out, src = by_id.get(out_id), by_id.get(in_id)
        _check_inplace_pair(out_id, in_id, out, src, taken, written)
        taken.add(in_id)
        written.add(out_id)
        root[out_id] = root[in_id]
    for i in root:  # follow chains a <- b <- c to their first tensor
        while root[root[i]] != root[i]:
            root[i] = root[root[i]]
    groups: dict = {}
    for r in records:
        groups.setdefault(root[r.id], []).append(r)
    merged = [_fuse(root_id, group) for root_id, group in groups.items()]
    return merged, root


def _check_inplace_pair(out_id, in_id, out, src, taken, written) -> None:
    if out is None or src is None:
        missing = out_id if out is None else in_id
        raise GraphError(f"in-place pair ({out_id!r}, {in_id!r}): no lifetime for {missing!r}")
    if src.end != out.start:
        raise GraphError(
            f"in-place pair ({out_id!r}, {in_id!r}): input lives to step {src.end} but the "
            f"output is born at step {out.start}; the input must die where the output is born"
        )
    if src.size != out.size:
        raise GraphError(
            f"in-place pair ({out_id!r}, {in_id!r}): sizes differ ({out.size} vs {src.size} "
            "aligned bytes)"
        )
    if in_id in taken:
        raise GraphError(f"in-place: {in_id!r} is overwritten by two outputs")
    if out_id in written:
        raise GraphError(f"in-place: {out_id!r} is asked to overwrite two inputs")


def _fuse(root_id, group: list[Lifetime]) -> Lifetime:
    return Lifetime(
        root_id,
        group[0].size,
        min(r.start for r in group),
        max(r.end for r in group),
        any(r.long_lived for r in group),
    )


def verify(plan: MemoryPlan, lifetimes: Iterable[Lifetime]) -> bool:
    """Check that no two tensors live at the same step share a byte.

    Also checks every tensor has an offset, offsets are non-negative multiples of the plan's
    alignment and every tensor ends inside ``arena_size``. In-place pairs recorded in the plan
    may share their (identical) offset.

    Returns:
        True.

    Raises:
        PlanError: a bad record, or sizes that sum past int64.
        GraphError: naming the offending tensor(s), their lifetimes and byte ranges.
    """
    records = _aligned(lifetimes)
    for r in records:
        _check_placement(plan, r)
    records = [r for r in records if r.size > 0]
    group = _inplace_groups(plan, records)
    start = np.array([r.start for r in records], dtype=np.int64)
    end = np.array([r.end for r in records], dtype=np.int64)
    low = np.array([plan.offsets[r.id] for r in records], dtype=np.int64)
    high = low + np.array([r.size for r in records], dtype=np.int64)
    for i, r in enumerate(records):
        clash = (start[i + 1 :] <= r.end) & (end[i + 1 :] >= r.start)
        clash &= (low[i + 1 :] < high[i]) & (high[i + 1 :] > low[i])
        clash &= (group[i + 1 :] != group[i]) | (low[i + 1 :] != low[i])
        hits = np.flatnonzero(clash)
        if len(hits):
            raise GraphError(_overlap_message(plan, r, records[i + 1 + hits[0]]))
    return True


def _check_placement(plan: MemoryPlan, r: Lifetime) -> None:
    if r.id not in plan.offsets:
        raise GraphError(f"tensor {r.id!r} (steps {r.start}..{r.end}) has no offset in {plan}")
    offset = plan.offsets[r.id]
    if offset < 0 or offset % plan.alignment:
        raise GraphError(
            f"tensor {r.id!r}: offset {offset} is not a non-negative multiple of the "
            f"alignment {plan.alignment}"
        )
    if r.size and offset + r.size > plan.arena_size:
        raise GraphError(
            f"tensor {r.id!r} (steps {r.start}..{r.end}) occupies bytes "
            f"[{offset}, {offset + r.size}), past arena_size {plan.arena_size}"
        )


def _inplace_groups(plan: MemoryPlan, records: Sequence[Lifetime]) -> np.ndarray:
    """A group number per record; records joined by in-place pairs share one."""
    index = {r.id: i for i, r in enumerate(records)}
    group = list(range(len(records)))

    def find(i):
        while group[i] != i:
            i = group[i]
        return i

    for out_id, in_id in plan.inplace:
        if out_id in index and in_id in index:
            group[find(index[out_id])] = find(index[in_id])
    return np.array([find(i) for i in range(len(records))], dtype=np.int64)


def _overlap_message(plan: MemoryPlan, a: Lifetime, b: Lifetime) -> str:
    def describe(r):
        lo = plan.offsets[r.id]
        return f"{r.id!r} (steps {r.start}..{r.end}, bytes [{lo}, {lo + r.size}))"

    step = max(a.start, b.start)
    return f"{describe(a)} and {describe(b)} overlap in memory while both live at step {step}"


# --------------------------------------------------------------------------------------------
# From a scheduled graph
# --------------------------------------------------------------------------------------------



def _nbytes(value) -> int:
    return math.prod(value.shape) * np.dtype(value.dtype).itemsize


def lifetimes(
    graph, order=None, include_inputs: bool = True, long_lived: Iterable = ()
) -> list[Lifetime]:
    """Lifetime records for every value of a scheduled graph, keyed by the ``Value`` itself.

    Step ``i`` is the ``i``-th node of ``order`` (default ``graph.nodes``). A node's outputs
    are born at its step and die at the step of their last user (at their own step if
    unused); graph outputs live to the last step. Graph inputs and constants (weights) live
    from step 0 to the last step and are flagged ``long_lived``; pass
    ``include_inputs=False`` to leave them out (the caller owns their memory).

    Args:
        graph: An object with ``inputs``, ``outputs``, ``nodes`` and ``consts``; nodes have
            ``inputs`` and ``outputs``; values have ``shape`` and ``dtype``.
        order: A topological order of the nodes (a list of nodes).
        include_inputs: Whether graph inputs and constants get records.
        long_lived: Further values to flag ``long_lived`` (for the ``two_cursor`` strategy).

    Raises:
        GraphError: a node reads a value that no earlier node, input or constant provides.
    """
    nodes = list(graph.nodes if order is None else order)
    last_step = max(len(nodes) - 1, 0)
    consts = getattr(graph, "consts", None) or {}
    external = list(dict.fromkeys([*graph.inputs, *consts]))
    birth = {v: 0 for v in external}
    death = {v: last_step for v in external}
    for step, node in enumerate(nodes):
        for v in node.inputs:
            if v not in birth:
                raise GraphError(f"step {step}: node {node!r} reads {v!r} before it is produced")
            death[v] = max(death[v], step)
        for v in node.outputs:
            birth[v], death[v] = step, step
    for v in graph.outputs:
        death[v] = last_step
    flagged = set(long_lived) | set(external)
    skip = set() if include_inputs else set(external)
    return [
        Lifetime(v, _nbytes(v), birth[v], death[v], v in flagged) for v in birth if v not in skip
    ]


def _op_name(node) -> str:
    op = getattr(node, "op", None)
    return getattr(op, "name", op)


def inplace_pairs(graph, order=None, elementwise: Iterable[str] | None = None,
                  overwrites: dict | None = None) -> list:
    """``(out, in)`` pairs where a node may write its output over an input.

    A pair qualifies when the node's op (``node.op``, a name or an object with ``.name``) is
    elementwise (any input) or listed in ``overwrites`` (op name -> input positions it may
    overwrite, e.g. ``{"gemm": (0,)}``), the node has one output, and the input is an
    intermediate (not a graph input, constant or output) of the same byte size whose last use
    is this node. At most one input per node is chosen. Pass the result to
    ``plan(..., inplace=...)``. ``elementwise`` defaults to the registry's elementwise ops.
    """
    nodes = list(graph.nodes if order is None else order)
    records = {r.id: r for r in lifetimes(graph, nodes)}
    consts = getattr(graph, "consts", None) or {}
    protected = {*graph.inputs, *consts, *graph.outputs}
    if elementwise is None:
        elementwise = [name for name, op in REGISTRY.items() if op.elementwise]
    elementwise, overwrites = set(elementwise), overwrites or {}
    pairs = []
    for step, node in enumerate(nodes):
        name = _op_name(node)
        if len(node.outputs) != 1:
            continue
        if name in elementwise:
            candidates = node.inputs
        elif name in overwrites:  # not an input that the node also reads at another position
            others = [v for i, v in enumerate(node.inputs) if i not in overwrites[name]]
            candidates = [node.inputs[i] for i in overwrites[name] if node.inputs[i] not in others]
        else:
            continue
        out = records[node.outputs[0]]
        for v in dict.fromkeys(candidates):
            src = records[v]
            if v not in protected and src.end == step and src.size == out.size:
                pairs.append((out.id, v))
                break
    return pairs


# --------------------------------------------------------------------------------------------
# Online caching allocator (eager mode)
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Block:
    """A piece of a segment. ``ptr`` is a virtual address, unique across segments.

    Attributes:
        ptr: Start address.
        size: Bytes in the block (the request rounded up to its size class, or more).
        segment: Index of the segment the block was carved from.
        allocated: Whether a caller holds it.
    """

    ptr: int
    size: int
    segment: int
    allocated: bool = False
    prev: Block | None = field(default=None, repr=False)
    next: Block | None = field(default=None, repr=False)

    @property
    def offset(self) -> int:
        """Alias of ``ptr``."""
        return self.ptr


class CachingAllocator:
    """PyTorch's CUDA caching allocator in miniature; bookkeeping only, no real memory.

    Requests up to ``small_limit`` bytes are rounded up to 512 bytes and carved from
    ``small_segment``-byte segments; larger ones are rounded up to ``large_round`` and get a
    segment rounded up to ``large_segment``. ``free`` never returns memory to the "device": the
    block goes back to its pool's cache, merged with free neighbours. ``malloc`` takes the
    smallest cached block that fits (a cache hit) and splits off the rest; only on a miss does
    it reserve a new segment. ``empty_cache`` releases segments that are entirely free.
    ``capacity`` (bytes, optional) is the device size: past it, the cache is emptied and the
    request retried before a ``MemoryError``.
    """

    SMALL_ROUND = 512

    def __init__(
        self,
        capacity: int | None = None,
        small_limit: int = 1 << 20,
        small_segment: int = 2 << 20,
        large_round: int = 128 << 10,
        large_segment: int = 2 << 20,
    ):
        self.capacity = capacity
        self.small_limit, self.small_segment = small_limit, small_segment
        self.large_round, self.large_segment = large_round, large_segment
        self._free = {True: [], False: []}  # is_small -> sorted [(size, ptr, block)]
        self._segments: dict[int, tuple[int, int, bool]] = {}  # index -> (ptr, size, small)
        self._next_ptr, self._next_segment = 0, 0
        self._stats = dict.fromkeys(
            "allocated_bytes reserved_bytes peak_allocated peak_reserved num_mallocs "
            "num_frees cache_hits cache_misses".split(),
            0,
        )

    # -- public API ----------------------------------------------------------------------

    def round_size(self, nbytes: int) -> int:
        """The size class of a request."""
        step = self.SMALL_ROUND if nbytes <= self.small_limit else self.large_round
        return max(_align(nbytes, step), self.SMALL_ROUND)

    def malloc(self, nbytes: int) -> Block:
        """Hand out a block of at least ``nbytes`` bytes (PlanError for a negative or
        non-integer size)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise PlanError(f"malloc: size must be a non-negative integer, got {nbytes!r}")
        size = self.round_size(nbytes)
        small = size <= self.small_limit
        block = self._take_cached(size, small)
        if block is None:
            self._stats["cache_misses"] += 1
            block = self._new_segment(size, small)
        else:
            self._stats["cache_hits"] += 1
        self._split(block, size, small)
        block.allocated = True
        self._stats["num_mallocs"] += 1
        self._count("allocated_bytes", block.size)
        return block

    def free(self, block: Block) -> None:
        """Return a block to the cache, merging it with free neighbours."""
        if not block.allocated or block.segment not in self._segments:
            raise PlanError(f"free: {block!r} is not an allocated block of this allocator")
        block.allocated = False
        self._stats["num_frees"] += 1
        self._count("allocated_bytes", -block.size)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._uncache(neighbour)
                block = self._merge(block, neighbour)
        self._cache(block)

    def empty_cache(self) -> None:
        """Release every segment that holds no allocated block."""
        for index, (ptr, size, small) in list(self._segments.items()):
            entries = self._free[small]
            i = bisect.bisect_left(entries, (size, ptr))
            if i < len(entries) and entries[i][:2] == (size, ptr):
                del entries[i]
                del self._segments[index]
                self._count("reserved_bytes", -size)

    def stats(self) -> dict:
        """Counters: allocated/reserved bytes now and at peak, mallocs, hits, segments."""
        return dict(self._stats, num_segments=len(self._segments))

    # -- internals -----------------------------------------------------------------------

    def _count(self, key: str, delta: int) -> None:
        self._stats[key] += delta
        peak = {"allocated_bytes": "peak_allocated", "reserved_bytes": "peak_reserved"}[key]
        self._stats[peak] = max(self._stats[peak], self._stats[key])

    def _cache(self, block: Block) -> None:
        bisect.insort(self._free[self._is_small(block)], (block.size, block.ptr, block))

    def _uncache(self, block: Block) -> None:
        entries = self._free[self._is_small(block)]
        del entries[bisect.bisect_left(entries, (block.size, block.ptr))]

    def _is_small(self, block: Block) -> bool:
        return self._segments[block.segment][2]

    def _take_cached(self, size: int, small: bool) -> Block | None:
        entries = self._free[small]
        i = bisect.bisect_left(entries, (size, -1))
        return entries.pop(i)[2] if i < len(entries) else None

    def _new_segment(self, size: int, small: bool) -> Block:
        seg_size = self.small_segment if small else _align(size, self.large_segment)
        reserved = self._stats["reserved_bytes"]
        if self.capacity is not None and reserved + seg_size > self.capacity:
            self.empty_cache()
            if self._stats["reserved_bytes"] + seg_size > self.capacity:
                raise OutOfMemoryError(
                    f"malloc: out of memory: {size} bytes requested, "
                    f"{self._stats['allocated_bytes']} allocated, "
                    f"{self._stats['reserved_bytes']} reserved of {self.capacity}"
                )
        index, ptr = self._next_segment, self._next_ptr
        self._next_segment += 1
        self._next_ptr += seg_size
        self._segments[index] = (ptr, seg_size, small)
        self._count("reserved_bytes", seg_size)
        return Block(ptr, seg_size, index)

    def _split(self, block: Block, size: int, small: bool) -> None:
        """Cut ``block`` down to ``size`` and cache the remainder, if worth keeping.

        Like PyTorch: small blocks split if >= 512 bytes remain, large ones only if more
        than ``small_limit`` remain (so big blocks do not shatter into slivers).
        """
        rest = block.size - size
        if rest < self.SMALL_ROUND or (not small and rest <= self.small_limit):
            return
        tail = Block(block.ptr + size, rest, block.segment, prev=block, next=block.next)
        if block.next is not None:
            block.next.prev = tail
        block.next, block.size = tail, size
        self._cache(tail)

    @staticmethod
    def _merge(block: Block, neighbour: Block) -> Block:
        low, high = (block, neighbour) if block.ptr < neighbour.ptr else (neighbour, block)
        low.size += high.size
        low.next = high.next
        if high.next is not None:
            high.next.prev = low
        return low


def track_memory(allocator=None):
    """Account eager-mode op outputs in a :class:`CachingAllocator` (see
    :func:`mlsys_lab.engine.tensor.track_memory`)."""
    from .tensor import track_memory as _track

    return _track(allocator)
