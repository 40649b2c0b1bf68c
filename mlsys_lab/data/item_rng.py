"""Per-item random generators for pipeline maps: counter-based, so a batch can draw vectorised.

Item ``index`` of a map with ``seed`` in epoch ``epoch`` gets numpy's Philox generator with the
key derived from ``(seed, *epoch)`` (once per pass, by ``SeedSequence``) and the counter
``[0, index, 0, 0]``. Philox is counter-based: block ``b`` of an item's stream is
``philox(key, [b, index, 0, 0])``, a pure function of the item's number. So the first draw of
every item of a batch can be computed in one Numba loop (:meth:`ItemRngs.uniform`) instead of
building a ``Generator`` per item (about 7 us each), and it equals what the item's own
``Generator`` draws first, bit for bit (tests compare the two).

Streams of different items never overlap (they differ in the second counter word; an item
would need 2**64 blocks to reach another's).
"""

from __future__ import annotations

import functools

import numba
import numpy as np

from ..engine.numba_cache import CACHE

__all__ = ["item_key", "item_rng", "ItemRngs"]

_M0, _M1 = np.uint64(0xD2E7470EE14C6C93), np.uint64(0xCA5A826395121157)  # Philox4x64 constants
_W0, _W1 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBB67AE8584CAA73B)  # key schedule
_ROUNDS = 10  # numpy's Philox is Philox4x64-10
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53: numpy's uint64 -> double in [0, 1)


@functools.lru_cache(maxsize=256)
def item_key(seed: int, epoch: tuple) -> np.ndarray:
    """The Philox key (two uint64) of a map's generators in one pass."""
    key = np.random.SeedSequence([int(seed), *map(int, epoch)]).generate_state(2, np.uint64)
    key.setflags(write=False)
    return key


def item_rng(seed: int, epoch: tuple, index: int) -> np.random.Generator:
    """Item ``index``'s generator (a fresh one: its stream starts at its first draw)."""
    return np.random.Generator(np.random.Philox(key=item_key(seed, epoch),
                                                counter=[0, int(index), 0, 0]))


@numba.njit(nogil=True, inline="always")
def _mulhilo(a, b):
    """The high and low 64 bits of the 128-bit product ``a * b``."""
    mask, shift = np.uint64(0xFFFFFFFF), np.uint64(32)
    a_lo, a_hi, b_lo, b_hi = a & mask, a >> shift, b & mask, b >> shift
    lh, hl = a_lo * b_hi, a_hi * b_lo
    mid = ((a_lo * b_lo) >> shift) + (lh & mask) + (hl & mask)
    return a_hi * b_hi + (lh >> shift) + (hl >> shift) + (mid >> shift), a * b


@numba.njit(nogil=True, cache=CACHE)
def _first_doubles(key0, key1, first, count, low, span, out):
    """``out[j]``: item ``first + j``'s first ``uniform(low, low + span)`` (block 1, word 0)."""
    for j in range(count):
        x0, x1, x2, x3 = np.uint64(1), np.uint64(first + j), np.uint64(0), np.uint64(0)
        k0, k1 = key0, key1
        for r in range(_ROUNDS):
            if r > 0:
                k0, k1 = k0 + _W0, k1 + _W1
            hi0, lo0 = _mulhilo(_M0, x0)
            hi1, lo1 = _mulhilo(_M1, x2)
            x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
        out[j] = low + span * (np.float64(x0 >> np.uint64(11)) * _TO_UNIT)


class ItemRngs:
    """The generators of items ``first .. first + count - 1`` of one pass, for a batched map.

    Indexing (``rngs[j]``) or iterating builds the items' ``Generator`` objects, as a per-item
    map would get them. :meth:`uniform` gives every item's first uniform draw at once, without
    building any.
    """

    __slots__ = ("seed", "epoch", "first", "count")

    def __init__(self, seed: int, epoch: tuple, first: int, count: int):
        self.seed, self.epoch, self.first, self.count = int(seed), tuple(epoch), first, count

    def __len__(self):
        return self.count

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[k] for k in range(self.count)[j]]
        if not -self.count <= j < self.count:
            raise IndexError(f"ItemRngs: index {j} out of range for {self.count} items")
        return item_rng(self.seed, self.epoch, self.first + j % self.count)

    def __iter__(self):
        return (self[j] for j in range(self.count))

    def uniform(self, low: float = 0.0, high: float = 1.0) -> np.ndarray:
        """Each item's first draw ``rngs[j].uniform(low, high)``, as one float64 array."""
        key = item_key(self.seed, self.epoch)
        out = np.empty(self.count, np.float64)
        _first_doubles(key[0], key[1], self.first, self.count, float(low),
                       float(high) - float(low), out)
        return out
