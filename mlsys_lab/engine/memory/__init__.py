"""Memory planning (book ch. 7): static offsets for a compiled graph, a pool for eager mode.

A compiled graph knows when each tensor is born and dies. ``plan`` turns those ``Lifetime``
records into byte offsets in one arena: tensors live at the same step never share bytes, tensors
with disjoint lifetimes may reuse them. ``verify`` checks that; ``lower_bound`` says how good a
plan is. Eager mode cannot see the future, so it uses ``CachingAllocator``, which caches frees.

Modules: ``records`` (Lifetime, MemoryPlan), ``strategies`` (the placement algorithms),
``planner`` (plan, verify, bounds), ``lifetimes`` (records from a scheduled graph, kernels'
declared workspaces included, in-place pairs), ``allocator`` (the caching allocator of eager mode).
"""

from .allocator import Block, CachingAllocator, track_memory
from .lifetimes import inplace_pairs, lifetimes, workspace_bytes
from .planner import check_strategy, lower_bound, naive_size, plan, verify
from .records import Lifetime, MemoryPlan, Workspace
from .strategies import (
    LOCAL_SEARCH_WORK,
    LONG_LIVED_FRACTION,
    STRATEGIES,
    best_fit,
    first_fit,
    greedy_by_breadth,
    greedy_by_size,
    local_search,
    naive,
    two_cursor,
)

__all__ = [
    "Lifetime",
    "MemoryPlan",
    "Workspace",
    "workspace_bytes",
    "STRATEGIES",
    "LONG_LIVED_FRACTION",
    "LOCAL_SEARCH_WORK",
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
    "naive",
    "first_fit",
    "best_fit",
    "greedy_by_size",
    "greedy_by_breadth",
    "local_search",
    "two_cursor",
]
