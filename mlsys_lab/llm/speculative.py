"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a cheap draft model proposes
``gamma`` tokens, the target model checks all of them in one forward, and a rejection rule keeps
the output distribution exactly the target's.

The rule, for a drafted token ``x ~ q``: accept it with probability ``min(1, p(x) / q(x))``; on
the first rejection, emit a token from ``norm(max(0, p - q))`` instead and stop; if all
``gamma`` are accepted, emit a bonus token from the target's next distribution. Every step emits
at least one token. With acceptance rate ``alpha = E[sum_x min(p(x), q(x))]`` (i.i.d. per
position) and a draft step costing ``c`` target steps ``T``::

    expected tokens per step  = (1 - alpha^(gamma+1)) / (1 - alpha)
    time per token            = (c·gamma + 1) (1 - alpha) / (1 - alpha^(gamma+1)) · T

The greedy variant (``temperature=0``) accepts a drafted token iff it is the target's argmax,
so it emits exactly the target's greedy tokens.
"""

import time

import numpy as np

from ..engine.tensor import no_grad
from ..errors import ArgumentError
from .kv_cache import KVCache
from .sampling import draw, probabilities


def acceptance_probability(p, q, x):
    """``min(1, p(x) / q(x))`` for a token ``x`` drawn from ``q``."""
    return 1.0 if p[x] >= q[x] else p[x] / q[x]


def residual(p, q):
    """``norm(max(0, p - q))``: where the target has more mass than the draft (``p`` itself
    when ``p == q``, where no rejection can happen)."""
    r = np.maximum(np.asarray(p, np.float64) - q, 0.0)
    total = r.sum()
    return np.asarray(p, np.float64) if total <= 0 else r / total


def output_distribution(p, q):
    """The exact distribution of the token the rule emits at one position, from ``x ~ q``:
    ``q(x) min(1, p(x)/q(x)) + (1 - beta) residual(p, q)(x)`` with ``beta = sum min(p, q)``.
    The theorem: it equals ``p``."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    accepted = np.array([q[x] * acceptance_probability(p, q, x) if q[x] > 0 else 0.0
                         for x in range(len(p))])
    return accepted + (1.0 - accepted.sum()) * residual(p, q)


def verify(p_rows, q_rows, drafted, rng, greedy=False):
    """Apply the rule to ``drafted`` tokens (gamma of them) given the target's distributions
    ``p_rows`` (gamma + 1 rows: after each drafted prefix) and the draft's ``q_rows`` (gamma).

    Returns:
        ``(tokens, accepted)``: the emitted tokens (the accepted prefix plus one corrected or
        bonus token) and how many drafted tokens were accepted.
    """
    gamma = len(drafted)
    for j, x in enumerate(drafted):
        p, q = p_rows[j], q_rows[j]
        if greedy:
            ok = x == int(np.argmax(p))
        else:
            ok = rng.random() < acceptance_probability(p, q, x)
        if not ok:
            fix = int(np.argmax(p)) if greedy else int(draw(residual(p, q), rng))
            return [int(t) for t in drafted[:j]] + [fix], j
    last = p_rows[gamma]
    bonus = int(np.argmax(last)) if greedy else int(draw(last, rng))
    return [int(t) for t in drafted] + [bonus], gamma


def expected_tokens(alpha, gamma):
    """Expected tokens emitted per speculative step: ``(1 - alpha^(gamma+1)) / (1 - alpha)``."""
    if not 0.0 <= alpha <= 1.0:
        raise ArgumentError(f"expected_tokens: alpha must be in [0, 1], got {alpha}")
    return gamma + 1.0 if alpha == 1.0 else (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def time_per_token(alpha, gamma, c, T=1.0):
    """Expected time per emitted token: ``(c·gamma + 1) T / expected_tokens(alpha, gamma)``."""
    return (c * gamma + 1.0) * T / expected_tokens(alpha, gamma)


def speedup(alpha, gamma, c):
    """Speed-up over plain decoding predicted by the formulas (``T / time_per_token``)."""
    return 1.0 / time_per_token(alpha, gamma, c)


def speculative_generate(target, draft, prompt, max_new_tokens, gamma=4, temperature=1.0,
                         seed=0):
    """Generate with ``draft`` proposing ``gamma`` tokens per step and ``target`` verifying.

    Both models keep a :class:`KVCache`; rejected tokens are cut off with ``truncate``.
    ``temperature=0`` is the greedy variant.

    Returns:
        ``(tokens, stats)``: the new token ids and a dict with ``steps``, ``drafted``,
        ``accepted``, ``alpha`` (the mean of ``sum_x min(p, q)`` over the verified
        positions, the formula's acceptance rate), ``step_tokens`` (the tokens each step
        emitted), ``tokens_per_step`` (their mean) and the seconds spent in the draft and
        target forwards (``draft_seconds``, ``target_seconds``).
    """
    prompt = np.asarray(prompt, np.int64).reshape(-1)
    limit = prompt.size + max_new_tokens
    if prompt.size == 0 or limit + gamma > target.config.context:
        raise ArgumentError(f"speculative_generate: prompt {prompt.size} + {max_new_tokens} "
                            f"new + gamma {gamma} tokens exceed the context "
                            f"{target.config.context}")
    greedy = temperature == 0
    rng = np.random.default_rng(seed)
    tcache = KVCache(target.config, 1, limit + gamma)
    dcache = KVCache(draft.config, 1, limit + gamma)
    out = list(prompt)
    stats = dict(steps=0, drafted=0, accepted=0, draft_seconds=0.0, target_seconds=0.0,
                 step_tokens=[])
    overlaps = []
    with no_grad():
        t0 = time.perf_counter()
        if prompt.size > 1:
            target(prompt[None, :-1], tcache)
            draft(prompt[None, :-1], dcache)
        stats["target_seconds"] += time.perf_counter() - t0
        draft_feed = [int(prompt[-1])]  # tokens the draft has not seen yet
        while len(out) < limit:
            base = len(out) - 1  # tokens both caches must keep: all but the pending one
            t0 = time.perf_counter()
            drafted, q_rows = [], []
            feed = np.array(draft_feed)
            for _ in range(gamma):
                logits = draft(feed[None], dcache).numpy()[0, -1]
                q = probabilities(logits, temperature)
                x = int(np.argmax(q)) if greedy else int(draw(q, rng))
                drafted.append(x)
                q_rows.append(q)
                feed = np.array([x])
            t1 = time.perf_counter()
            block = np.array([out[-1]] + drafted)
            p_rows = probabilities(target(block[None], tcache).numpy()[0], temperature)
            t2 = time.perf_counter()
            tokens, n = verify(p_rows, q_rows, drafted, rng, greedy)
            overlaps += [float(np.minimum(p_rows[j], q_rows[j]).sum()) for j in range(n + 1)
                         if j < gamma]
            stats["draft_seconds"] += t1 - t0
            stats["target_seconds"] += t2 - t1
            stats["steps"] += 1
            stats["drafted"] += gamma
            stats["accepted"] += n
            stats["step_tokens"].append(len(tokens))
            tcache.truncate(0, base + 1 + n)
            if n == gamma:  # the draft never saw its own last token
                dcache.truncate(0, base + gamma)
                draft_feed = [drafted[-1], tokens[-1]]
            else:
                dcache.truncate(0, base + 1 + n)
                draft_feed = [tokens[-1]]
            out.extend(tokens)
    new = np.array(out[prompt.size:limit], np.int64)
    stats["alpha"] = float(np.mean(overlaps)) if overlaps else 0.0
    stats["tokens_per_step"] = (stats["accepted"] + stats["steps"]) / max(stats["steps"], 1)
    return new, stats
