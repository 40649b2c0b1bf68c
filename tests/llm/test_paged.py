"""The paged cache: same tokens as the contiguous one, copy-on-write sharing, and an allocator
that never hands a block out twice and frees everything (hypothesis over request traces)."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import llm


def _requests(seed, count=6, vocab=61):
    rng = np.random.default_rng(seed)
    return [llm.Request(i, rng.integers(0, vocab, int(rng.integers(1, 20))),
                        int(rng.integers(1, 15)), n=int(rng.integers(1, 4)),
                        arrival=int(rng.integers(0, 6))) for i in range(count)]


def test_paged_and_contiguous_give_identical_tokens(tiny):
    reqs = _requests(0)
    out_c, _ = llm.serve(tiny, reqs, llm.KVCache(tiny.config, 18, 64, sequences=False),
                         max_batch=18, seed=7)
    cache = llm.PagedKVCache(tiny.config, num_blocks=24, block_size=4)
    out_p, log = llm.serve(tiny, reqs, cache, max_batch=18, seed=7)
    assert log["preemptions"] > 0  # the small pool forced recomputation, tokens unchanged
    for r in reqs:
        assert len(out_p[r.id]) == r.n
        for a, b in zip(out_c[r.id], out_p[r.id]):
            assert len(a) == r.max_new_tokens and np.array_equal(a, b)
    assert cache.allocator.num_free == 24 and not cache.tables


def test_paged_logits_equal_contiguous_bit_for_bit(tiny):
    ids = np.random.default_rng(2).integers(0, 61, (2, 23))
    paged = llm.PagedKVCache(tiny.config, num_blocks=16, block_size=4)
    for s in (0, 1):
        paged.add_sequence(s)
    paged.select([0, 1])
    contiguous = llm.KVCache(tiny.config, 2)
    with ml.no_grad():
        for a, b in ((0, 10), (10, 11), (11, 23)):
            lp = tiny(ids[:, a:b], paged).numpy()
            lc = tiny(ids[:, a:b], contiguous).numpy()
            assert np.array_equal(lp, lc)
    assert paged.allocated_tokens() == 2 * 6 * 4  # 23 tokens -> 6 blocks of 4 each


def test_fork_shares_the_prompt_and_copies_on_write(tiny):
    cache = llm.PagedKVCache(tiny.config, num_blocks=8, block_size=4)
    cache.add_sequence("p")
    cache.select(["p"])
    with ml.no_grad():
        tiny(np.arange(6)[None], cache)  # 6 tokens: one full block, one half-full
        cache.fork("p", "c")
        assert cache.tables["c"] == cache.tables["p"]
        assert cache.allocator.refcount[cache.tables["p"]].tolist() == [2, 2]
        assert cache.blocks_needed("c", 1) == 1  # the shared half-full block must be copied
        cache.select(["c"])
        child = tiny(np.array([[9]]), cache).numpy()
        cache.select(["p"])
        parent = tiny(np.array([[9]]), cache).numpy()
    assert cache.tables["c"][0] == cache.tables["p"][0]  # the full block is still shared
    assert cache.tables["c"][1] != cache.tables["p"][1]  # the written one was copied
    assert cache.allocator.refcount[cache.tables["p"][0]] == 2
    assert np.array_equal(child, parent)
    cache.free_sequence("p")
    cache.free_sequence("c")
    assert cache.allocator.num_free == 8


def test_waste_is_only_the_last_blocks_tail(tiny):
    cache = llm.PagedKVCache(tiny.config, num_blocks=8, block_size=4)
    cache.add_sequence(0)
    cache.select([0])
    with ml.no_grad():
        tiny(np.arange(5)[None], cache)
    assert cache.allocated_tokens() == 8 and cache.waste() == pytest.approx(3 / 8)


ops = st.lists(st.tuples(st.sampled_from(["add", "grow", "fork", "free", "truncate"]),
                         st.integers(0, 7), st.integers(1, 9)), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_block_allocator_invariants(trace):
    """Any sequence of adds, growths, forks, truncations and frees: no block is owned by two
    tables unless its refcount says so, the free list and refcounts agree, and freeing every
    sequence returns every block."""
    cfg = llm.GPTConfig(vocab_size=8, context=64, layers=1, dim=4, heads=1)
    cache = llm.PagedKVCache(cfg, num_blocks=12, block_size=3)
    names = iter(range(10 ** 6))
    k = np.zeros((1, 1, 1, 4), np.float32)
    for op, who, n in trace:
        seqs = sorted(cache.tables)
        seq = seqs[who % len(seqs)] if seqs else None
        if op == "add" or seq is None:
            cache.add_sequence(next(names))
        elif op == "grow":
            if cache.blocks_needed(seq, n) > cache.allocator.num_free or \
                    cache.seq_lengths[seq] + n > cfg.context:
                continue
            cache.select([seq])
            cache.append(0, np.zeros((1, 1, n, 4), np.float32), np.zeros((1, 1, n, 4), np.float32))
            cache.advance(n)
        elif op == "fork":
            cache.fork(seq, next(names))
        elif op == "truncate":
            cache.truncate(seq, min(n, cache.seq_lengths[seq]))
        else:
            cache.free_sequence(seq)
        _check(cache)
    del k
    for seq in list(cache.tables):
        cache.free_sequence(seq)
    _check(cache)
    assert cache.allocator.num_free == 12 and not cache.allocator.refcount.any()


def _check(cache):
    alloc = cache.allocator
    owners = np.zeros(alloc.num_blocks, np.int64)
    for seq, table in cache.tables.items():
        assert len(set(table)) == len(table)
        assert len(table) == -(-cache.seq_lengths[seq] // cache.block_size)
        owners[table] += 1
    assert np.array_equal(owners, alloc.refcount)
    assert len(set(alloc.free)) == len(alloc.free)
    assert sorted(alloc.free) == sorted(np.flatnonzero(alloc.refcount == 0).tolist())


def test_allocator_refuses_double_free_and_exhaustion():
    alloc = llm.BlockAllocator(2)
    a, b = alloc.allocate(), alloc.allocate()
    assert a != b
    with pytest.raises(ml.OutOfMemoryError):
        alloc.allocate()
    alloc.release(a)
    with pytest.raises(ml.ArgumentError, match="not allocated"):
        alloc.release(a)


requests = st.lists(st.tuples(st.integers(1, 12), st.integers(1, 8), st.integers(1, 3),
                              st.integers(0, 4)), min_size=1, max_size=5)


@settings(max_examples=15, deadline=None)
@given(requests, st.integers(6, 20))
# a request done at its prefill: the server once kept its blocks to the step's end, preempted
# the other request and then called the model on no sequence at all
@example([(9, 1, 1, 0), (1, 2, 3, 0)], 6)
def test_serving_request_traces_frees_everything_and_matches_contiguous(reqs, blocks):
    """Over request traces (prompt length, new tokens, parallel samples, arrival) and pool
    sizes: the paged server returns every block, never over-books one (checked after each
    forward), and gives the contiguous server's tokens."""
    cfg = llm.GPTConfig(vocab_size=11, context=32, layers=1, dim=8, heads=2)
    model = _MICRO.setdefault("model", llm.GPT(cfg, seed=3).eval())
    rs = [llm.Request(i, np.arange(p) % 11, m, n=n, arrival=a)
          for i, (p, m, n, a) in enumerate(reqs)]
    cache = _CheckedPaged(cfg, num_blocks=blocks, block_size=4)
    if any(-(-(len(r.prompt) + r.max_new_tokens) // 4) * r.n > blocks for r in rs):
        return  # a request that cannot fit even alone
    out_p, _ = llm.serve(model, rs, cache, max_batch=8, seed=1, watermark=0)
    out_c, _ = llm.serve(model, rs, llm.KVCache(cfg, 8, 32, sequences=False), max_batch=8,
                         seed=1)
    assert cache.allocator.num_free == blocks and not cache.allocator.refcount.any()
    for r in rs:
        assert [len(t) for t in out_p[r.id]] == [r.max_new_tokens] * r.n
        assert all(np.array_equal(a, b) for a, b in zip(out_p[r.id], out_c[r.id]))


def test_a_request_done_at_its_prefill_frees_its_blocks_before_anyone_is_preempted():
    """Request 0 needs one new token (sampled by its prefill); request 1's three samples then
    need a block each. Its 3 blocks are free once request 0 is retired, so nobody is preempted
    (a server retiring only at the step's end preempted request 1 and recomputed it)."""
    cfg = llm.GPTConfig(vocab_size=11, context=32, layers=1, dim=8, heads=2)
    model = _MICRO.setdefault("model", llm.GPT(cfg, seed=3).eval())
    rs = [llm.Request(0, np.arange(9) % 11, 1), llm.Request(1, np.arange(1), 2, n=3)]
    cache = _CheckedPaged(cfg, num_blocks=6, block_size=4)
    out, log = llm.serve(model, rs, cache, max_batch=8, seed=1, watermark=0)
    assert log["preemptions"] == 0 and log["admitted"][0] == [0, 1]
    assert [len(t) for t in out[0]] == [1] and [len(t) for t in out[1]] == [2] * 3
    assert cache.allocator.num_free == 6


_MICRO = {}


class _CheckedPaged(llm.PagedKVCache):
    def advance(self, t):
        super().advance(t)
        _check(self)
