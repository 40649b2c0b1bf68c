"""The paged KV cache (vLLM's PagedAttention, Kwon et al. 2023): fixed-size blocks, a block
table per sequence, a free list, reference counts and copy-on-write.

A contiguous cache reserves ``max_len`` positions per sequence up front; most of that is never
used (60-80 % in the vLLM paper's measurements). A paged cache cuts the K/V memory into blocks of
``block_size`` token positions, gives a sequence a new block only when its last one is full, and
keeps a *block table* (logical block -> physical block) per sequence, as an OS keeps a page
table. The only waste is the unfilled tail of each sequence's last block.

Blocks are reference counted, so sequences can share them: :meth:`PagedKVCache.fork` makes a
child that shares all of its parent's blocks (parallel sampling from one prompt stores the
prompt once); the first write into a shared block copies it (copy-on-write).
"""

import numpy as np

from ..errors import ArgumentError, OutOfMemoryError, ShapeError
from .kv_cache import attend_mask


class BlockAllocator:
    """Physical block ids ``0..num_blocks-1``: a free list and a reference count per block.

    ``allocate`` pops a free block (refcount 1), ``share`` adds a reference, ``release``
    drops one and returns the block to the free list when none is left.
    """

    def __init__(self, num_blocks):
        if num_blocks < 1:
            raise ArgumentError(f"BlockAllocator: num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # a stack: block 0 is handed out first
        self.refcount = np.zeros(num_blocks, np.int64)

    @property
    def num_free(self):
        return len(self.free)

    def allocate(self):
        """A free block, now with one reference (OutOfMemoryError when none is free)."""
        if not self.free:
            raise OutOfMemoryError(f"BlockAllocator: all {self.num_blocks} blocks are in use")
        block = self.free.pop()
        self.refcount[block] = 1
        return block

    def share(self, block):
        """One more reference to an allocated ``block``."""
        self._check(block, "share")
        self.refcount[block] += 1

    def release(self, block):
        """Drop one reference; the block is free again when none remains."""
        self._check(block, "release")
        self.refcount[block] -= 1
        if self.refcount[block] == 0:
            self.free.append(block)

    def _check(self, block, op):
        if not 0 <= block < self.num_blocks or self.refcount[block] < 1:
            raise ArgumentError(f"BlockAllocator.{op}: block {block} is not allocated")


class PagedKVCache:
    """K/V storage in blocks: per layer a pool ``(num_blocks, heads, block_size, head_dim)``
    for keys and one for values, and a block table per sequence.

    Args:
        config: the model's :class:`~mlsys_lab.llm.model.GPTConfig`.
        num_blocks: physical blocks in the pool.
        block_size: token positions per block (vLLM's default, 16).
        dtype: of the pools.

    The same protocol as :class:`~mlsys_lab.llm.kv_cache.KVCache` (``add_sequence``,
    ``select``, ``lengths``, ``append``, ``advance``, ``free_sequence``, ``truncate``), plus
    :meth:`fork`. A forward gathers each sequence's blocks through its table into the keys and
    values it attends over, so the logits are those of a contiguous cache, bit for bit.
    """

    def __init__(self, config, num_blocks, block_size=16, dtype=np.float32):
        if block_size < 1:
            raise ArgumentError(f"PagedKVCache: block_size must be >= 1, got {block_size}")
        shape = (num_blocks, config.heads, block_size, config.head_dim)
        self.config, self.block_size = config, block_size
        self.allocator = BlockAllocator(num_blocks)
        self.key_pool = [np.zeros(shape, dtype) for _ in range(config.layers)]
        self.value_pool = [np.zeros(shape, dtype) for _ in range(config.layers)]
        self.tables, self.seq_lengths, self.batch = {}, {}, []

    # --- sequences ---------------------------------------------------------------------------
    def add_sequence(self, seq):
        """Start an empty sequence ``seq`` (no blocks until it stores tokens)."""
        if seq in self.tables:
            raise ArgumentError(f"PagedKVCache.add_sequence: sequence {seq!r} is already cached")
        self.tables[seq], self.seq_lengths[seq] = [], 0

    def fork(self, parent, child):
        """``child`` starts as a copy of ``parent`` that shares all its blocks (no copying
        until one of them writes into a shared block)."""
        self.add_sequence(child)
        for block in self.tables[parent]:
            self.allocator.share(block)
        self.tables[child] = list(self.tables[parent])
        self.seq_lengths[child] = self.seq_lengths[parent]

    def free_sequence(self, seq):
        """Drop ``seq``: each of its blocks loses a reference."""
        for block in self.tables.pop(seq):
            self.allocator.release(block)
        del self.seq_lengths[seq]
        self.batch = [s for s in self.batch if s != seq]

    def truncate(self, seq, length):
        """Forget ``seq``'s tokens past ``length``, releasing blocks no longer needed."""
        if not 0 <= length <= self.seq_lengths[seq]:
            raise ArgumentError(f"PagedKVCache.truncate: length {length} outside 0.."
                                f"{self.seq_lengths[seq]}")
        keep = -(-length // self.block_size)
        for block in self.tables[seq][keep:]:
            self.allocator.release(block)
        del self.tables[seq][keep:]
        self.seq_lengths[seq] = length

    def select(self, seqs):
        """Make ``seqs`` (in this order) the batch that the next forward continues."""
        missing = [s for s in seqs if s not in self.tables]
        if missing:
            raise ArgumentError(f"PagedKVCache.select: unknown sequences {missing}")
        self.batch = list(seqs)

    @property
    def lengths(self):
        """Tokens stored for each sequence of the current batch."""
        return np.array([self.seq_lengths[s] for s in self.batch], np.int64)

    def blocks_needed(self, seq, t):
        """New blocks ``seq`` needs to store ``t`` more tokens (copy-on-write included)."""
        n, table = self.seq_lengths[seq], self.tables[seq]
        new = -(-(n + t) // self.block_size) - len(table)
        shared_tail = n % self.block_size and self.allocator.refcount[table[-1]] > 1
        return new + int(bool(shared_tail))

    def can_add(self, tokens, watermark=0):
        """Whether a new sequence of ``tokens`` tokens fits in the free blocks, keeping
        ``watermark`` blocks spare for the running sequences to grow."""
        return -(-tokens // self.block_size) + watermark <= self.allocator.num_free

    # --- the protocol the model calls --------------------------------------------------------
    def _prepare(self, t):
        """Before layer 0 writes: blocks for ``t`` more tokens of every sequence in the batch,
        and a private copy of any shared block that will be written (copy-on-write)."""
        for seq in self.batch:
            table, n = self.tables[seq], self.seq_lengths[seq]
            if n % self.block_size and self.allocator.refcount[table[-1]] > 1:
                old, new = table[-1], self.allocator.allocate()
                for pool in self.key_pool + self.value_pool:
                    pool[new] = pool[old]
                self.allocator.release(old)
                table[-1] = new
            while len(table) * self.block_size < n + t:
                table.append(self.allocator.allocate())

    def append(self, layer, k, v):
        """Store the batch's new keys/values ``(batch, heads, t, head_dim)`` in their blocks;
        return ``(keys, values, mask)`` gathered through the block tables, over
        ``span = max(lengths) + t`` positions (the mask hides those past a sequence's end)."""
        b, h, t, hd = k.shape
        if b != len(self.batch):
            raise ShapeError(f"PagedKVCache.append: {b} sequences for a batch of "
                             f"{len(self.batch)}")
        if layer == 0:
            self._prepare(t)
        lengths, bs = self.lengths, self.block_size
        span = int(lengths.max()) + t
        width = -(-span // bs)
        keys = np.zeros((b, width, h, bs, hd), k.dtype)
        values = np.zeros((b, width, h, bs, hd), v.dtype)
        kpool, vpool = self.key_pool[layer], self.value_pool[layer]
        for i, seq in enumerate(self.batch):
            table = np.asarray(self.tables[seq], np.int64)
            pos = lengths[i] + np.arange(t)
            kpool[table[pos // bs], :, pos % bs] = k[i].transpose(1, 0, 2)
            vpool[table[pos // bs], :, pos % bs] = v[i].transpose(1, 0, 2)
            keys[i, :len(table)] = kpool[table]
            values[i, :len(table)] = vpool[table]
        keys = keys.transpose(0, 2, 1, 3, 4).reshape(b, h, width * bs, hd)[:, :, :span]
        values = values.transpose(0, 2, 1, 3, 4).reshape(b, h, width * bs, hd)[:, :, :span]
        return keys, values, attend_mask(lengths, t, span)

    def advance(self, t):
        """The forward has stored ``t`` more tokens of every sequence in the batch."""
        for seq in self.batch:
            self.seq_lengths[seq] += t

    # --- accounting --------------------------------------------------------------------------
    def allocated_tokens(self):
        """Token positions in allocated blocks (a shared block counted once)."""
        return int((self.allocator.refcount > 0).sum()) * self.block_size

    def waste(self):
        """Fraction of allocated positions that hold no token (the last blocks' tails)."""
        stored = len({(b, j) for seq, table in self.tables.items()
                      for i, b in enumerate(table)
                      for j in range(min(self.block_size,
                                         self.seq_lengths[seq] - i * self.block_size))})
        alloc = self.allocated_tokens()
        return 0.0 if alloc == 0 else 1.0 - stored / alloc
