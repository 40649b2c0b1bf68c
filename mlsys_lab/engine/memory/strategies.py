"""Placement strategies: each maps aligned, non-empty Lifetime records to ``{id: offset}``.

First-fit, best-fit, greedy by size and by breadth (TFLite's two planners), two cursors, and a
local search; add your own with ``STRATEGIES["mine"] = fn``.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from .records import Lifetime, _live_bytes_at_starts, _peak_live

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
    size, floor = _arena_size(records, offsets), _peak_live(records)
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
