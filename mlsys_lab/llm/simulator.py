"""A serving simulator: a seeded request trace, a step-cost model measured on the GPT, and three
schedulers at the same KV-cache memory.

* ``static``: a batch of up to ``kv_tokens // max_len`` requests is formed when the server is
  idle and runs until its longest request finishes (finished ones keep their slot and are
  padded, as in ``generate`` on a padded batch);
* ``contiguous``: continuous batching (admit and retire at every step), each request reserving
  ``max_len`` positions while it runs;
* ``paged``: continuous batching on ``block_size``-token blocks allocated as the sequence grows;
  when blocks run out, the latest-admitted request is preempted and recomputed later (vLLM).

A step prefills the requests admitted at it (their first token) and decodes one token for every
other running request; its duration comes from a :class:`CostModel`. Reported: throughput
(generated tokens per second), p50/p99 latency (arrival to last token), and the KV memory
waste, the time-average of ``1 - stored tokens / reserved (allocated) positions``.
"""

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError
from .generate import decode_step_time, prefill_time

POLICIES = ("static", "contiguous", "paged")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: arrival time (s), prompt and output lengths (tokens)."""

    id: int
    arrival: float
    prompt: int
    output: int


def poisson_trace(num_requests, rate, seed=0, prompt=(16, 512), mean_output=128,
                  max_output=512):
    """A seeded trace: Poisson arrivals at ``rate`` requests/s, prompt lengths uniform in
    ``prompt`` (inclusive), output lengths geometric with mean ``mean_output`` (capped at
    ``max_output``)."""
    if num_requests < 1 or rate <= 0 or mean_output < 1:
        raise ArgumentError(f"poisson_trace: need num_requests >= 1, rate > 0, mean_output "
                            f">= 1; got {num_requests}, {rate}, {mean_output}")
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, num_requests))
    prompts = rng.integers(prompt[0], prompt[1] + 1, num_requests)
    outputs = np.minimum(rng.geometric(1.0 / mean_output, num_requests), max_output)
    return [TraceRequest(i, float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


@dataclass(frozen=True)
class CostModel:
    """Seconds of one step: ``base + per_seq · decoded + per_context · context tokens of the
    decoded sequences + per_prefill · prompt tokens prefilled``."""

    base: float
    per_seq: float
    per_context: float
    per_prefill: float

    def step_seconds(self, decoded, context_tokens, prefill_tokens):
        return (self.base + self.per_seq * decoded + self.per_context * context_tokens
                + self.per_prefill * prefill_tokens)


def measure_cost_model(model, batch_sizes=(1, 2, 4, 8, 16), contexts=(16, 64, 128),
                       prefill=(32, 128), repeats=5, budget=0.0):
    """Fit a :class:`CostModel` to measured cached decode steps of ``model`` (each batch size
    at each context length, the best of ``repeats`` calls and of ``budget`` seconds of calls)
    and prompt runs (least squares; coefficients kept >= 0).

    Returns:
        ``(cost_model, measurements)`` with measurements a list of
        ``(batch, context, seconds)`` and ``(prompt tokens, seconds)`` pairs.
    """
    rows, times = [], []
    decode = []
    for b in batch_sizes:
        for L in contexts:
            t = decode_step_time(model, b, L, repeats=repeats, budget=budget)
            decode.append((b, L, t))
            rows.append([1.0, b, b * L])
            times.append(t)
    coef = np.maximum(np.linalg.lstsq(np.array(rows), np.array(times), rcond=None)[0], 0.0)
    pre = [(n, prefill_time(model, n, repeats=repeats, budget=budget)) for n in prefill]
    per_prefill = max(0.0, float(np.polyfit([n for n, _ in pre], [t for _, t in pre], 1)[0]))
    return CostModel(*map(float, coef), per_prefill), {"decode": decode, "prefill": pre}


@dataclass
class _Seq:
    req: TraceRequest
    generated: int = 0
    admitted: int = -1
    blocks: int = 0

    @property
    def tokens(self):
        return self.req.prompt + self.generated


@dataclass
class SimResult:
    """What :func:`simulate` reports (times in seconds)."""

    policy: str
    throughput: float
    p50_latency: float
    p99_latency: float
    waste: float
    mean_batch: float
    makespan: float
    finished: int
    generated_tokens: int
    preemptions: int
    latencies: np.ndarray


def simulate(trace, policy, kv_tokens, cost, block_size=16, max_len=1024, max_batch=256,
             watermark=0.01):
    """Serve ``trace`` with ``policy`` ("static", "contiguous" or "paged") in a KV cache of
    ``kv_tokens`` token positions; see the module docstring. ``watermark``: fraction of the
    paged blocks kept free at admission."""
    if policy not in POLICIES:
        raise ArgumentError(f"simulate: unknown policy {policy!r} (known: {POLICIES})")
    if any(r.prompt + r.output > max_len for r in trace):
        raise ArgumentError(f"simulate: a request is longer than max_len {max_len}")
    slots = kv_tokens // max_len
    total_blocks = kv_tokens // block_size
    if policy != "paged" and slots < 1:
        raise ArgumentError(f"simulate: {kv_tokens} KV positions hold no {max_len}-token slot")
    pending = sorted(trace, key=lambda r: (r.arrival, r.id))
    queue, running, batch = [], [], []
    finish, now, step = {}, 0.0, 0
    free_blocks = total_blocks
    waste_time = busy = batch_time = 0.0
    preemptions = 0
    i = 0
    while i < len(pending) or queue or running or batch:
        while i < len(pending) and pending[i].arrival <= now:
            queue.append(_Seq(pending[i]))
            i += 1
        if not (queue or running or batch):
            now = pending[i].arrival
            continue
        new = []
        if policy == "static":
            if not batch:
                batch, queue = queue[:min(slots, max_batch)], queue[min(slots, max_batch):]
                new = list(batch)
                running = list(batch)
        else:
            while queue and len(running) < max_batch:
                s = queue[0]
                if policy == "contiguous":
                    ok = len(running) < slots
                else:
                    need = -(-(s.tokens + 1) // block_size)
                    ok = need <= free_blocks - int(watermark * total_blocks) or not running
                    ok = ok and need <= free_blocks
                if not ok:
                    break
                queue.pop(0)
                if policy == "paged":
                    s.blocks = -(-(s.tokens + 1) // block_size)
                    free_blocks -= s.blocks
                s.admitted = step
                running.append(s)
                new.append(s)
        if policy == "paged":  # blocks for this step's token; preempt the newest if short
            while True:
                grow = [s for s in running if s not in new
                        and -(-(s.tokens + 1) // block_size) > s.blocks]
                if len(grow) <= free_blocks or len(running) == 1:
                    break
                victim = max(running, key=lambda s: (s.admitted, s.req.id))
                running.remove(victim)
                if victim in new:
                    new.remove(victim)
                free_blocks += victim.blocks
                victim.blocks = 0
                queue.insert(0, victim)  # recomputed later: prompt + what it had generated
                preemptions += 1
            for s in grow:
                s.blocks += 1
                free_blocks -= 1
        if not running:
            now = pending[i].arrival if i < len(pending) else now
            continue
        decoding = [s for s in running if s not in new and s.generated < s.req.output]
        decoded = len(running) - len(new) if policy == "static" else len(decoding)
        dt = cost.step_seconds(decoded, sum(s.tokens for s in decoding),
                               sum(s.tokens for s in new))
        stored = sum(s.tokens for s in (batch if policy == "static" else running))
        reserved = (len(batch) * max_len if policy == "static" else
                    len(running) * max_len if policy == "contiguous" else
                    sum(s.blocks for s in running) * block_size)
        waste_time += dt * (1.0 - stored / reserved) if reserved else 0.0
        batch_time += dt * len(running)
        busy += dt
        now += dt
        step += 1
        for s in new + decoding:
            s.generated += 1
        done = [s for s in running if s.generated >= s.req.output]
        for s in done:
            if s.req.id not in finish:
                finish[s.req.id] = now
        if policy == "static":
            if len(done) == len(batch):
                batch, running = [], []
        else:
            for s in done:
                running.remove(s)
                free_blocks += s.blocks
    latencies = np.array([finish[r.id] - r.arrival for r in trace])
    start = min(r.arrival for r in trace)
    makespan = max(finish.values()) - start
    tokens = sum(r.output for r in trace)
    return SimResult(policy, tokens / makespan, float(np.percentile(latencies, 50)),
                     float(np.percentile(latencies, 99)), waste_time / busy if busy else 0.0,
                     batch_time / busy if busy else 0.0, makespan, len(finish), tokens,
                     preemptions, latencies)


def capacity_rate(cost, batch, mean_context=392, mean_output=128):
    """Requests/s a server decoding ``batch`` sequences of ``mean_context`` tokens at a time
    could sustain, prefill aside (for choosing a saturating arrival rate):
    ``batch / (mean_output · step seconds)``."""
    step = cost.step_seconds(batch, batch * mean_context, 0)
    return batch / (mean_output * step) if math.isfinite(step) and step > 0 else float("inf")
