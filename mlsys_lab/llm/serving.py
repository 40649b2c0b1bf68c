"""A serving loop with continuous batching (Orca, Yu et al. 2022; vLLM): requests join and leave
the running batch at every decode step instead of waiting for a whole batch to finish.

Each step: admit waiting requests that have arrived while the cache has room (run their
prompt, the *prefill*), then run one batched decode step for every running sequence and retire
those that are done. With a :class:`~mlsys_lab.llm.paged.PagedKVCache` a request with ``n > 1``
samples prefills its prompt once and forks ``n`` sequences that share the prompt's blocks
(copy-on-write); when the blocks run out mid-decode the most recently admitted request is
preempted (its blocks freed, the request queued again to be recomputed, as vLLM does).

Each sequence samples from its own generator, seeded by (seed, request id, sample index), so its
tokens do not depend on the batch it ran in, the cache layout or preemptions: the paged and
contiguous caches give identical tokens.
"""

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from ..engine.tensor import no_grad
from ..errors import ArgumentError, OutOfMemoryError
from .paged import PagedKVCache
from .sampling import sample


@dataclass
class Request:
    """A generation request: ``prompt`` token ids, ``max_new_tokens``, ``n`` parallel samples,
    ``arrival`` (the step at which it may be admitted)."""

    id: int
    prompt: np.ndarray
    max_new_tokens: int
    n: int = 1
    arrival: int = 0


@dataclass
class _Running:
    request: Request
    admitted: int
    tokens: dict = field(default_factory=dict)  # seq -> new tokens
    rngs: dict = field(default_factory=dict)


def serve(model, requests, cache, max_batch=8, temperature=1.0, top_k=None, top_p=None,
          seed=0, watermark=1):
    """Run ``requests`` to completion with continuous batching on ``model``.

    Args:
        model: a :class:`~mlsys_lab.llm.model.GPT`.
        requests: :class:`Request` objects.
        cache: an empty :class:`~mlsys_lab.llm.kv_cache.KVCache` (contiguous: one slot per
            sequence) or :class:`~mlsys_lab.llm.paged.PagedKVCache`.
        max_batch: most sequences decoded together.
        temperature, top_k, top_p: the sampler's settings.
        seed: with the request id and sample index, seeds each sequence's generator.
        watermark: blocks a paged cache keeps free when admitting.

    Returns:
        ``(outputs, log)``: ``outputs[request id]`` is a list of ``n`` token arrays; ``log``
        a dict of per-step lists ``batch`` (sequences decoded) and ``admitted``, and the
        count of ``preemptions``.
    """
    for r in requests:
        if len(r.prompt) + r.max_new_tokens > model.config.context or r.n < 1:
            raise ArgumentError(f"serve: request {r.id} needs {len(r.prompt)} + "
                                f"{r.max_new_tokens} tokens, over the context "
                                f"{model.config.context} (or n = {r.n} < 1)")
    paged = isinstance(cache, PagedKVCache)
    waiting = deque(sorted(requests, key=lambda r: (r.arrival, r.id)))
    running, outputs = [], {}
    log = {"batch": [], "admitted": [], "preemptions": 0}
    step = 0
    with no_grad():
        while waiting or running:
            admitted = []
            while (waiting and waiting[0].arrival <= step
                   and sum(r.request.n for r in running) + waiting[0].n <= max_batch
                   and _fits(cache, waiting[0], paged, watermark)):
                req = waiting.popleft()
                running.append(_prefill(model, cache, req, step, seed, temperature, top_k,
                                        top_p))
                admitted.append(req.id)
            log["admitted"].append(admitted)
            _retire(cache, running, outputs)  # done at its prefill: its blocks free now
            live = [(r, s) for r in running for s, toks in r.tokens.items()
                    if len(toks) < r.request.max_new_tokens]
            if live and paged:
                live = _make_room(cache, running, live, waiting, log)
            if live:
                seqs = [s for _, s in live]
                cache.select(seqs)
                last = np.array([[r.tokens[s][-1]] for r, s in live])
                logits = model(last, cache).numpy()[:, -1].astype(np.float64)
                for (r, s), row in zip(live, logits):
                    r.tokens[s].append(int(sample(row, r.rngs[s], temperature, top_k,
                                                  top_p)))
                log["batch"].append(seqs)
            _retire(cache, running, outputs)
            step += 1
            if not running and waiting and waiting[0].arrival > step:
                step = waiting[0].arrival
    return outputs, log


def _fits(cache, req, paged, watermark):
    need = len(req.prompt) + 1
    if paged:
        return cache.can_add(need, watermark + req.n - 1)
    return len(cache.slot_of) + req.n <= len(cache.slot_lengths) and \
        len(req.prompt) + req.max_new_tokens <= cache.max_len


def _prefill(model, cache, req, step, seed, temperature, top_k, top_p):
    """Run the prompt once; fork ``n`` sequences; sample each one's first token."""
    run = _Running(req, step)
    first = (req.id, 0)
    cache.add_sequence(first)
    cache.select([first])
    row = model(np.asarray(req.prompt, np.int64)[None], cache).numpy()[0, -1].astype(np.float64)
    for j in range(req.n):
        seq = (req.id, j)
        if j:
            cache.fork(first, seq)
        run.rngs[seq] = np.random.default_rng([seed, req.id, j])
        run.tokens[seq] = [int(sample(row, run.rngs[seq], temperature, top_k, top_p))]
    return run


def _retire(cache, running, outputs):
    """Free the blocks of every request whose sequences are all done; record its tokens."""
    for r in list(running):
        if all(len(t) >= r.request.max_new_tokens for t in r.tokens.values()):
            for s in r.tokens:
                cache.free_sequence(s)
            outputs[r.request.id] = [np.array(r.tokens[(r.request.id, j)], np.int64)
                                     for j in range(r.request.n)]
            running.remove(r)


def _make_room(cache, running, live, waiting, log):
    """Preempt the latest-admitted requests until every live sequence can store one token."""
    while sum(cache.blocks_needed(s, 1) for _, s in live) > cache.allocator.num_free:
        if len(running) == 1:
            raise OutOfMemoryError("serve: one request alone does not fit the paged cache")
        victim = max(running, key=lambda r: (r.admitted, r.request.id))
        running.remove(victim)
        for s in victim.tokens:
            cache.free_sequence(s)
        waiting.appendleft(victim.request)
        log["preemptions"] += 1
        live = [(r, s) for r, s in live if r is not victim]
    return live
