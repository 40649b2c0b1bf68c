"""The KV cache gives the logits of recomputing the prefix; its buffers are visible to memory."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import llm
from mlsys_lab.engine.memory import CachingAllocator, plan, verify


def test_incremental_logits_equal_recompute(tiny):
    ids = np.random.default_rng(0).integers(0, 61, (3, 40))
    with ml.no_grad():
        full = tiny(ids).numpy()
        cache = llm.KVCache(tiny.config, 3)
        chunks = [tiny(ids[:, a:b], cache).numpy() for a, b in ((0, 9), (9, 10), (10, 25),
                                                                  *((t, t + 1) for t in
                                                                    range(25, 40)))]
    assert np.abs(np.concatenate(chunks, axis=1) - full).max() <= 1e-5
    assert cache.lengths.tolist() == [40, 40, 40]


def test_sequences_of_different_lengths_in_one_batch(tiny):
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 61, 12), rng.integers(0, 61, 5)
    cache = llm.KVCache(tiny.config, 2, sequences=False)
    with ml.no_grad():
        for seq, ids in (("a", a), ("b", b)):
            cache.add_sequence(seq)
            cache.select([seq])
            tiny(ids[None], cache)
        cache.select(["a", "b"])
        step = tiny(np.array([[7], [9]]), cache).numpy()[:, -1]
        ref_a = tiny(np.concatenate([a, [7]])[None]).numpy()[0, -1]
        ref_b = tiny(np.concatenate([b, [9]])[None]).numpy()[0, -1]
    assert np.abs(step[0] - ref_a).max() <= 1e-5 and np.abs(step[1] - ref_b).max() <= 1e-5


def test_generate_with_and_without_cache_agree(tiny):
    prompt = np.arange(5)
    new, logits = llm.generate_tokens(tiny, prompt, 20, seed=3, return_logits=True)
    again, ref = llm.generate_tokens(tiny, prompt, 20, seed=3, use_cache=False,
                                     return_logits=True)
    assert np.array_equal(new, again) and np.abs(logits - ref).max() <= 1e-5


def test_attend_mask_is_causal_from_each_end():
    m = llm.attend_mask(np.array([2, 0]), 2, 4)
    assert m.shape == (2, 1, 2, 4)
    assert m[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert m[1, 0].tolist() == [[True, False, False, False], [True, True, False, False]]
    assert llm.attend_mask(np.array([3, 3]), 1, 4) is None


def test_buffers_are_visible_to_the_allocator_and_planner(tiny):
    alloc = CachingAllocator()
    cache = llm.KVCache(tiny.config, 2, 32, allocator=alloc)
    expected = 2 * tiny.config.layers * 2 * 4 * 32 * 8 * 4  # K,V x layers x (2,4,32,8) f32
    assert cache.nbytes == expected and alloc.stats()["allocated_bytes"] >= expected
    records = cache.lifetimes(0, 3)
    assert sum(r.size for r in records) == expected and all(r.long_lived for r in records)
    p = plan(records)
    verify(p, records)
    assert p.arena_size >= expected
    cache.release()
    assert alloc.stats()["allocated_bytes"] == 0


def test_cache_overflow_is_refused(tiny):
    cache = llm.KVCache(tiny.config, 1, 8)
    with ml.no_grad(), pytest.raises(ml.OutOfMemoryError, match="max_len 8"):
        tiny(np.zeros((1, 9), np.int64), cache)


def test_composed_attention_of_training_equals_the_op(tiny):
    """The training script's matmul/softmax attention and the op give the same logits."""
    ids = np.random.default_rng(4).integers(0, 61, (2, 30))
    with ml.no_grad():
        op = tiny(ids).numpy()
        for block in tiny.blocks:
            block.composed_attention = True
        try:
            composed = tiny(ids).numpy()
            cache = llm.KVCache(tiny.config, 2)
            inc = np.concatenate([tiny(ids[:, :11], cache).numpy(),
                                  tiny(ids[:, 11:], cache).numpy()], axis=1)
        finally:
            for block in tiny.blocks:
                block.composed_attention = False
    assert np.abs(op - composed).max() <= 1e-5 and np.abs(op - inc).max() <= 1e-5
