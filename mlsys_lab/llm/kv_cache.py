"""The KV cache: keep each layer's keys and values so decoding a token costs one token's work.

Without a cache, generating token ``n`` runs the model over all ``n`` tokens again; with it, the
model runs over the new token only, appends its key and value to per-layer buffers and attends
over everything stored. The logits are the same (up to float rounding); the work per token drops
from O(n) to O(1) matmul rows.

:class:`KVCache` is the contiguous layout: one ``(slots, heads, max_len, head_dim)`` buffer for
the keys and one for the values of every layer, each sequence owning a slot of ``max_len``
positions whether it uses them or not (the reservation a paged cache avoids, see
:mod:`~mlsys_lab.llm.paged`). The buffers are visible to the memory machinery of chapter 7:
:meth:`KVCache.lifetimes` gives their :class:`~mlsys_lab.engine.memory.Lifetime` records for
the planner, and a :class:`~mlsys_lab.engine.memory.CachingAllocator` passed in books them.

The cache protocol the model uses (shared with the paged cache): ``lengths`` (tokens already
stored for each sequence of the batch), ``append(layer, k, v)`` (store the new tokens' keys and
values, return everything the batch may attend to and a mask) and ``advance(t)``.
"""

import numpy as np

from ..engine.memory import Lifetime
from ..errors import ArgumentError, OutOfMemoryError, ShapeError


def attend_mask(lengths, t, span):
    """Which keys each new query may see: ``(batch, 1, t, span)`` booleans, row ``r`` of
    sequence ``i`` seeing keys ``j <= lengths[i] + r`` (causal, aligned to the end); ``None``
    when nothing is hidden (one new token and every sequence of length ``span - 1``)."""
    lengths = np.asarray(lengths, np.int64)
    if t == 1 and np.all(lengths + 1 == span):
        return None
    limit = lengths[:, None] + np.arange(t)  # (batch, t): last visible key
    return (np.arange(span)[None, None, :] <= limit[:, :, None])[:, None]


class KVCache:
    """Contiguous per-layer K/V buffers, one slot of ``max_len`` positions per sequence.

    Args:
        config: the model's :class:`~mlsys_lab.llm.model.GPTConfig`.
        slots: how many sequences it holds at once.
        max_len: positions per slot (default: the model's context).
        dtype: of the buffers.
        allocator: a :class:`~mlsys_lab.engine.memory.CachingAllocator` that books the
            buffers (``allocator.stats()`` then counts them; :meth:`release` frees them).

    By default slot ``i`` is sequence ``i`` and all slots form the batch; with
    ``sequences=False`` the slots start empty, and a server assigns them with
    :meth:`add_sequence` and picks the batch with :meth:`select`.
    """

    def __init__(self, config, slots=1, max_len=None, dtype=np.float32, allocator=None,
                 sequences=True):
        max_len = config.context if max_len is None else max_len
        if slots < 1 or max_len < 1:
            raise ArgumentError(f"KVCache: slots and max_len must be >= 1, got {slots}, "
                                f"{max_len}")
        shape = (slots, config.heads, max_len, config.head_dim)
        self.config, self.max_len = config, max_len
        self.keys = [np.zeros(shape, dtype) for _ in range(config.layers)]
        self.values = [np.zeros(shape, dtype) for _ in range(config.layers)]
        self.slot_lengths = np.zeros(slots, np.int64)
        self.slot_of = {i: i for i in range(slots)} if sequences else {}
        self.batch = np.arange(slots) if sequences else np.zeros(0, np.int64)
        self.allocator = allocator
        self.blocks = [allocator.malloc(b.nbytes) for b in self.keys + self.values] \
            if allocator is not None else []

    # --- which sequences ---------------------------------------------------------------------
    @property
    def lengths(self):
        """Tokens stored for each sequence of the current batch."""
        return self.slot_lengths[self.batch]

    def add_sequence(self, seq):
        """Give sequence ``seq`` a free slot (its whole ``max_len`` reserved)."""
        used = set(self.slot_of.values())
        free = [s for s in range(len(self.slot_lengths)) if s not in used]
        if seq in self.slot_of:
            raise ArgumentError(f"KVCache.add_sequence: sequence {seq!r} is already cached")
        if not free:
            raise OutOfMemoryError(f"KVCache: all {len(self.slot_lengths)} slots are taken")
        self.slot_of[seq] = free[0]
        self.slot_lengths[free[0]] = 0

    def fork(self, parent, child):
        """``child`` starts as a copy of ``parent`` (a contiguous cache copies the slot)."""
        self.add_sequence(child)
        src, dst = self.slot_of[parent], self.slot_of[child]
        for buf in self.keys + self.values:
            buf[dst, :, :self.slot_lengths[src]] = buf[src, :, :self.slot_lengths[src]]
        self.slot_lengths[dst] = self.slot_lengths[src]

    def free_sequence(self, seq):
        """Release ``seq``'s slot."""
        self.slot_lengths[self.slot_of.pop(seq)] = 0

    def select(self, seqs):
        """Make ``seqs`` (in this order) the batch that the next forward continues."""
        self.batch = np.array([self.slot_of[s] for s in seqs], np.int64)

    def truncate(self, seq, length):
        """Forget ``seq``'s tokens past ``length`` (rejected speculative tokens)."""
        slot = self.slot_of[seq]
        if not 0 <= length <= self.slot_lengths[slot]:
            raise ArgumentError(f"KVCache.truncate: length {length} outside 0.."
                                f"{self.slot_lengths[slot]}")
        self.slot_lengths[slot] = length

    # --- the protocol the model calls --------------------------------------------------------
    def append(self, layer, k, v):
        """Store the batch's new keys/values ``(batch, heads, t, head_dim)`` after its stored
        tokens; return ``(keys, values, mask)`` over ``span = max(lengths) + t`` positions."""
        b, _, t, _ = k.shape
        if b != len(self.batch):
            raise ShapeError(f"KVCache.append: {b} sequences for a batch of {len(self.batch)}")
        lengths = self.lengths
        span = int(lengths.max()) + t
        if span > self.max_len:
            raise OutOfMemoryError(f"KVCache: {span} positions exceed max_len {self.max_len}")
        keys, values = self.keys[layer], self.values[layer]
        for i, slot in enumerate(self.batch):
            keys[slot, :, lengths[i]:lengths[i] + t] = k[i]
            values[slot, :, lengths[i]:lengths[i] + t] = v[i]
        if np.array_equal(self.batch, np.arange(len(self.slot_lengths))):
            keys, values = keys[:, :, :span], values[:, :, :span]  # views, no copy
        else:
            keys, values = keys[self.batch, :, :span], values[self.batch, :, :span]
        return keys, values, attend_mask(lengths, t, span)

    def advance(self, t):
        """The forward has stored ``t`` more tokens of every sequence in the batch."""
        self.slot_lengths[self.batch] += t

    # --- what memory sees --------------------------------------------------------------------
    @property
    def nbytes(self):
        """Bytes reserved by the buffers."""
        return sum(b.nbytes for b in self.keys + self.values)

    def used_bytes(self):
        """Bytes holding stored tokens."""
        return int(self.slot_lengths.sum()) * self.config.kv_bytes_per_token(
            self.keys[0].itemsize)

    def lifetimes(self, start=0, end=0):
        """The buffers as long-lived :class:`Lifetime` records (live ``start..end``), one per
        layer and K/V, for ``engine.memory.plan`` beside a step's activations."""
        return [Lifetime(("kv", layer, kind), buf.nbytes, start, end, long_lived=True)
                for kind, bufs in (("k", self.keys), ("v", self.values))
                for layer, buf in enumerate(bufs)]

    def release(self):
        """Return the buffers' blocks to the allocator (if one booked them)."""
        for block in self.blocks:
            self.allocator.free(block)
        self.blocks = []
