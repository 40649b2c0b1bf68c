"""Autoregressive generation, with a KV cache or by recomputing the whole prefix every token.

Both paths run the same model in the same (eager, no-grad) mode and draw the same random
numbers, so for a seed they give the same tokens; only the work per token differs (one token's
rows against the whole prefix's). :func:`decode_step_time` measures one cached decode step of a
batch, the cost a serving simulator is driven by.
"""

import numpy as np

from .. import timing
from ..engine.tensor import no_grad
from ..errors import ArgumentError
from .kv_cache import KVCache
from .sampling import sample


def _last_logits(logits):
    return logits.numpy()[:, -1].astype(np.float64)


def generate(model, prompt, max_new_tokens, temperature=1.0, top_k=None, top_p=None, seed=0,
             use_cache=True, return_logits=False):
    """Continue ``prompt`` (token ids) by ``max_new_tokens`` sampled tokens.

    Args:
        model: a :class:`~mlsys_lab.llm.model.GPT`.
        prompt: 1-D token ids (at least one).
        max_new_tokens: how many to add (prompt + new tokens must fit the context).
        temperature, top_k, top_p: see :mod:`~mlsys_lab.llm.sampling` (``temperature=0``:
            greedy).
        seed: of the sampler's ``numpy`` Generator.
        use_cache: decode with a :class:`KVCache` (True) or recompute the prefix (False).
        return_logits: also return the (max_new_tokens, vocab) logits the tokens came from.

    Returns:
        The new token ids (int64), and the logits if asked.
    """
    prompt = np.asarray(prompt, np.int64).reshape(-1)
    if prompt.size == 0 or prompt.size + max_new_tokens > model.config.context:
        raise ArgumentError(f"generate: prompt of {prompt.size} + {max_new_tokens} new tokens "
                            f"must be 1..{model.config.context} tokens")
    rng = np.random.default_rng(seed)
    tokens, rows = list(prompt), []
    cache = KVCache(model.config, 1, prompt.size + max_new_tokens) if use_cache else None
    with no_grad():
        feed = prompt
        for _ in range(max_new_tokens):
            logits = _last_logits(model(feed[None], cache) if use_cache
                                  else model(np.asarray(tokens)[None]))
            rows.append(logits[0])
            token = int(sample(logits, rng, temperature, top_k, top_p)[0])
            tokens.append(token)
            feed = np.array([token])
    new = np.array(tokens[prompt.size:], np.int64)
    return (new, np.array(rows)) if return_logits else new


def decode_step_time(model, batch, context, repeats=5, budget=0.0, clock=timing.SYSTEM_CLOCK):
    """Seconds of one cached decode step (one new token for each of ``batch`` sequences that
    hold ``context`` tokens): best of ``repeats`` calls (and of ``budget`` seconds of calls)
    after a warm-up."""
    if context + 1 > model.config.context:
        raise ArgumentError(f"decode_step_time: context {context} leaves no room in "
                            f"{model.config.context}")
    cache = KVCache(model.config, batch, context + 1)
    rng = np.random.default_rng(0)
    with no_grad():
        if context:
            model(rng.integers(0, model.config.vocab_size, (batch, context)), cache)
        step = rng.integers(0, model.config.vocab_size, (batch, 1))

        def one_step():
            model(step, cache)
            cache.slot_lengths[:] = context  # forget it again: every call is the same step

        return timing.best_of(one_step, repeats=repeats, budget=budget, clock=clock)


def prefill_time(model, tokens, repeats=3, budget=0.0, clock=timing.SYSTEM_CLOCK):
    """Seconds to run a prompt of ``tokens`` tokens into an empty cache (best of ``repeats``
    calls and of ``budget`` seconds of calls)."""
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (1, tokens))
    with no_grad():
        def one():
            model(ids, KVCache(model.config, 1, tokens))
        return timing.best_of(one, repeats=repeats, budget=budget, clock=clock)
