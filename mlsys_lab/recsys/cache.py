"""A worker's hot-row cache in front of the parameter server (HugeCTR's embedding cache idea):
LRU and LFU eviction, and the hit rate a lookup trace gets for each cache size."""

from collections import OrderedDict

import numpy as np

from ..errors import ArgumentError


def _check_capacity(capacity, owner):
    if isinstance(capacity, (bool, np.bool_)) or not isinstance(capacity, (int, np.integer)) \
            or capacity < 0:
        raise ArgumentError(f"{owner}: capacity must be an int >= 0, got {capacity!r}")
    return int(capacity)


class LRUCache:
    """Keeps the ``capacity`` most recently used keys; a miss evicts the least recently used."""

    def __init__(self, capacity):
        self.capacity = _check_capacity(capacity, "LRUCache")
        self.keys = OrderedDict()
        self.hits = self.misses = 0

    def access(self, key):
        """Look ``key`` up; returns True on a hit (the key is cached afterwards either way)."""
        if key in self.keys:
            self.keys.move_to_end(key)
            self.hits += 1
            return True
        self.misses += 1
        if self.capacity:
            if len(self.keys) >= self.capacity:
                self.keys.popitem(last=False)
            self.keys[key] = None
        return False

    def __contains__(self, key):
        return key in self.keys

    def __len__(self):
        return len(self.keys)


class LFUCache:
    """Keeps the most frequently used keys (counted while cached); a miss evicts the key with
    the fewest uses, the least recently used of those on a tie. O(1) per access (a bucket of
    keys per use count)."""

    def __init__(self, capacity):
        self.capacity = _check_capacity(capacity, "LFUCache")
        self.count = {}
        self.buckets = {}  # use count -> OrderedDict of keys, oldest first
        self.min_count = 0
        self.hits = self.misses = 0

    def _bump(self, key):
        c = self.count[key]
        bucket = self.buckets[c]
        del bucket[key]
        if not bucket:
            del self.buckets[c]
            if self.min_count == c:
                self.min_count = c + 1
        self.count[key] = c + 1
        self.buckets.setdefault(c + 1, OrderedDict())[key] = None

    def access(self, key):
        """Look ``key`` up; returns True on a hit (the key is cached afterwards either way)."""
        if key in self.count:
            self._bump(key)
            self.hits += 1
            return True
        self.misses += 1
        if not self.capacity:
            return False
        if len(self.count) >= self.capacity:
            bucket = self.buckets[self.min_count]
            victim, _ = bucket.popitem(last=False)
            if not bucket:
                del self.buckets[self.min_count]
            del self.count[victim]
        self.count[key] = 1
        self.buckets.setdefault(1, OrderedDict())[key] = None
        self.min_count = 1
        return False

    def __contains__(self, key):
        return key in self.count

    def __len__(self):
        return len(self.count)


POLICIES = {"lru": LRUCache, "lfu": LFUCache}


def simulate_cache(trace, capacity, policy="lru"):
    """Hits of one cache over a lookup trace: ``(hits, misses)``.

    Args:
        trace: the row ids looked up, in order.
        capacity: how many rows the cache holds.
        policy: ``"lru"`` or ``"lfu"``.
    """
    if policy not in POLICIES:
        raise ArgumentError(f"simulate_cache: policy must be one of {sorted(POLICIES)}, got "
                            f"{policy!r}")
    cache = POLICIES[policy](capacity)
    for key in np.asarray(trace).reshape(-1).tolist():
        cache.access(key)
    return cache.hits, cache.misses


def hit_rate_curve(trace, capacities, policy="lru"):
    """The hit rate (hits / lookups) for each cache size in ``capacities``."""
    n = max(np.asarray(trace).size, 1)
    return [simulate_cache(trace, c, policy)[0] / n for c in capacities]


__all__ = ["LRUCache", "LFUCache", "simulate_cache", "hit_rate_curve"]
