"""Eager mode's memory: an online caching allocator (PyTorch's CUDA caching allocator in
miniature). Eager mode cannot see the future, so it caches frees instead of planning.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from mlsys_lab.errors import OutOfMemoryError, PlanError

from ..dispatch import account_outputs
from .records import _align


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
    """Account every eager op output in a caching allocator (like PyTorch's CUDA caching
    allocator): a block is taken when the output is made and returned to the cache when the
    tensor is garbage-collected. Use as ``with track_memory() as alloc:``; read
    ``alloc.stats()``."""
    return account_outputs(CachingAllocator() if allocator is None else allocator)
