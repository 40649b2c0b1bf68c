"""``plan`` (offsets in one arena), ``verify`` (no two live tensors overlap) and the bounds
(``lower_bound``, ``naive_size``) that say how good a plan is. Pure functions over records.
"""

from __future__ import annotations

from typing import Hashable, Iterable, Sequence

import numpy as np

from mlsys_lab.errors import GraphError, PlanError, UnknownNameError

from .records import Lifetime, MemoryPlan, _aligned, _peak_live
from .strategies import STRATEGIES, _arena_size, _best


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
    return _peak_live(records)


def naive_size(lifetimes: Iterable[Lifetime], alignment: int = 1) -> int:
    """Bytes needed with no reuse at all: the sum of the aligned sizes."""
    return sum(r.size for r in _aligned(lifetimes, alignment))


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
