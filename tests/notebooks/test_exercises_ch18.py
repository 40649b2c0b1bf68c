"""Exercises of chapter 18 test the idea: the references score full marks on every seed, the
library's attention is refused, and each wrong idea listed in the exercise modules of
``mlsys_lab/grading/exercises/ch18_llm_inference/`` scores 0 on the cases that name it.

Everything runs in process with ``run_cases`` (the probe -> wire -> judge round trip of the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.grading.core.check import run_cases

from ..exercise_results import fails, fails_only, feedback, full, refused

SEEDS = [0, 1, 7, 12345]


# ============================================================================= 18.1 online softmax
def online_softmax_step(state, scores, values):
    m, l, acc = state
    m_new = np.maximum(m, scores.max(axis=1))
    safe = np.where(np.isfinite(m_new), m_new, 0.0)
    alpha = np.exp(m - safe)
    p = np.exp(scores - safe[:, None])
    return m_new, l * alpha + p.sum(axis=1), acc * alpha[:, None] + p @ values


def without_rescaling(state, scores, values):
    m, l, acc = state
    m_new = np.maximum(m, scores.max(axis=1))
    safe = np.where(np.isfinite(m_new), m_new, 0.0)
    p = np.exp(scores - safe[:, None])
    return m_new, l + p.sum(axis=1), acc + p @ values


def without_the_max(state, scores, values):
    m, l, acc = state
    p = np.exp(scores)
    return np.maximum(m, scores.max(axis=1)), l + p.sum(axis=1), acc + p @ values


def nan_on_masked_rows(state, scores, values):
    m, l, acc = state
    m_new = np.maximum(m, scores.max(axis=1))
    with np.errstate(invalid="ignore"):
        alpha = np.exp(m - m_new)
        p = np.exp(scores - m_new[:, None])
    return m_new, l * alpha + p.sum(axis=1), acc * alpha[:, None] + p @ values


def averaging_block_softmaxes(state, scores, values):
    m, l, acc = state
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    out = (p / p.sum(axis=1, keepdims=True)) @ values
    n = l + 1
    return np.maximum(m, scores.max(axis=1)), n, acc + (out - acc) / n[:, None]


_STASH = []


def exact_from_a_hidden_copy(state, scores, values):
    """Keeps every block outside the state and recomputes the exact softmax."""
    if np.isneginf(state[0]).all():
        _STASH.clear()
    _STASH.append((scores.copy(), values.copy()))
    s = np.concatenate([a for a, _ in _STASH], axis=1)
    v = np.concatenate([b for _, b in _STASH])
    m = s.max(axis=1)
    safe = np.where(np.isfinite(m), m, 0.0)
    w = np.exp(s - safe[:, None])
    return m, w.sum(axis=1), w @ v


@pytest.mark.parametrize("seed", SEEDS)
def test_online_softmax_reference_scores_full_marks(seed):
    full(run_cases("18.1", online_softmax_step, seed=seed))


def test_online_softmax_without_rescaling_fails_the_growing_blocks():
    with np.errstate(all="ignore"):
        result = run_cases("18.1", without_rescaling, seed=3)
    fails(result, "blocks whose scores grow", "scores of ±800")


def test_online_softmax_without_the_max_overflows():
    with np.errstate(all="ignore"):
        fails(run_cases("18.1", without_the_max, seed=3), "scores of ±800")


def test_online_softmax_nan_on_a_masked_block_fails_only_that_case():
    with np.errstate(all="ignore"):
        result = run_cases("18.1", nan_on_masked_rows, seed=3)
    fails_only(result, "a fully masked first block")


def test_averaging_per_block_softmaxes_fails():
    with np.errstate(all="ignore"):
        fails(run_cases("18.1", averaging_block_softmaxes, seed=3), "blocks whose scores grow")


def test_a_hidden_copy_of_the_blocks_fails_the_interleaved_sequences():
    with np.errstate(all="ignore"):
        result = run_cases("18.1", exact_from_a_hidden_copy, seed=3)
    fails(result, "two sequences stepped in turn")


def test_online_softmax_through_the_library_op_is_refused():
    def through_the_op(state, scores, values):
        m, l, acc = state
        q = ml.tensor(np.eye(scores.shape[0], scores.shape[1]))
        ml.ops.scaled_dot_product_attention(q, q, ml.tensor(values))
        return online_softmax_step(state, scores, values)

    assert refused(run_cases("18.1", through_the_op, seed=0)), "the op ran"


# ============================================================================= 18.2 decode step
def decode_step(x, W_q, W_k, W_v, cache_k, cache_v, pos, *, scale="d", whole=False,
                selfless=False, at_end=False, interleaved=False):
    H, T, d = cache_k.shape
    split = (lambda v: v.reshape(d, H).T) if interleaved else (lambda v: v.reshape(H, d))
    q, k, v = split(x @ W_q), split(x @ W_k), split(x @ W_v)
    slot = T - 1 - pos if at_end else pos
    cache_k[:, slot], cache_v[:, slot] = k, v
    n = T if whole else (pos if selfless else pos + 1)
    if n == 0:
        return np.zeros(H * d)
    keys, vals = cache_k[:, :n], cache_v[:, :n]
    s = np.einsum("hd,hsd->hs", q, keys) / {"d": np.sqrt(d), "D": np.sqrt(x.size), "1/d": d}[scale]
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return np.einsum("hs,hsd->hd", w / w.sum(axis=1, keepdims=True), vals).reshape(H * d)


def _variant(**how):
    return lambda *args: decode_step(*args, **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_decode_reference_scores_full_marks(seed):
    full(run_cases("18.2", decode_step, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"scale": "D"}, ("every step",)),
    ({"scale": "1/d"}, ("every step",)),
    ({"whole": True}, ("the first token", "every step", "keys and values")),
    ({"selfless": True}, ("the first token", "every step")),
    ({"at_end": True}, ("every step", "keys and values")),
    ({"interleaved": True}, ("the first token", "every step", "keys and values")),
], ids=["sqrt-D", "1/d", "whole buffer", "without itself", "slot at the end", "interleaved"])
def test_decode_wrong_ideas_fail(how, failing):
    with np.errstate(all="ignore"):
        result = run_cases("18.2", _variant(**how), seed=5)
    fails(result, *failing)


def _from_hidden_tokens(recompute):
    """A decode step that keeps every token it was given in a hidden list and recomputes the
    attention over them: ``recompute(W, X, H, d) -> (outputs, K, V)``."""
    seen = []

    def decode_step(x, W_q, W_k, W_v, cache_k, cache_v, pos):
        if pos == 0:
            seen.clear()
        seen.append(x)
        H, T, d = cache_k.shape
        out, K, V = recompute((W_q, W_k, W_v), np.array(seen), H, d)
        cache_k[:, pos], cache_v[:, pos] = K[:, -1], V[:, -1]
        return out[-1]
    return decode_step


def _recompute_by_hand(W, X, H, d):
    q = (X[-1] @ W[0]).reshape(H, d)
    K, V = ((X @ w).reshape(len(X), H, d).transpose(1, 0, 2) for w in W[1:])
    s = np.einsum("hd,hsd->hs", q, K) / np.sqrt(d)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    return [np.einsum("hs,hsd->hd", w / w.sum(axis=1, keepdims=True), V).reshape(-1)], K, V


def test_recomputing_from_a_hidden_list_of_tokens_fails_the_prefilled_cache():
    result = run_cases("18.2", _from_hidden_tokens(_recompute_by_hand), seed=5)
    fails_only(result, "a cache filled before the first call")


def test_recomputing_with_the_graders_reference_is_refused():
    """The grader's ``_reference`` (attention recomputed over every prefix) on the tokens seen
    so far: the probes once filled the prefilled cache with it, and a function a probe calls
    is not refused."""
    from mlsys_lab.grading.exercises.ch18_llm_inference import ex18_2_kv_decode as ex
    result = run_cases("18.2", _from_hidden_tokens(ex._reference), seed=5)
    assert refused(result), "the reference ran"


def test_decode_through_the_library_attention_is_refused():
    def through_the_op(x, W_q, W_k, W_v, cache_k, cache_v, pos):
        H, T, d = cache_k.shape
        q, k, v = ((x @ W).reshape(H, 1, d) for W in (W_q, W_k, W_v))
        cache_k[:, pos], cache_v[:, pos] = k[:, 0], v[:, 0]
        out = ml.ops.scaled_dot_product_attention(
            ml.tensor(q), ml.tensor(cache_k[:, :pos + 1].copy()),
            ml.tensor(cache_v[:, :pos + 1].copy()))
        return np.asarray(out.numpy()).reshape(-1)

    assert refused(run_cases("18.2", through_the_op, seed=0)), "the op ran"


# ============================================================================= 18.3 speculative
def speculative_verify(p, q, draft, u, sample, *, rule="ratio", residual="norm",
                       go_on=False, bonus=True):
    out = []
    for i, x in enumerate(draft):
        if rule == "ratio":
            ok = u[i] < min(1.0, p[i][x] / q[i][x])
        elif rule == "p >= q":
            ok = p[i][x] >= q[i][x]
        else:
            ok = u[i] < min(1.0, q[i][x] / p[i][x])
        if ok:
            out.append(x)
            continue
        r = np.maximum(p[i] - q[i], 0.0)
        r = {"norm": r / r.sum(), "p": p[i], "raw": r, "p - q": p[i] - q[i]}[residual]
        out.append(sample(r))
        if not go_on:
            return out
    if bonus:
        out.append(sample(p[len(draft)]))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_speculative_reference_scores_full_marks(seed):
    full(run_cases("18.3", speculative_verify, seed=seed))


@pytest.mark.parametrize("how", [
    {"rule": "p >= q"}, {"rule": "q/p"}, {"residual": "p"}, {"residual": "raw"},
    {"residual": "p - q"}, {"go_on": True}, {"bonus": False},
], ids=lambda how: "-".join(f"{k}={v}" for k, v in how.items()))
def test_speculative_wrong_ideas_fail_the_distribution(how):
    result = run_cases("18.3", lambda *a: speculative_verify(*a, **how), seed=7)
    assert result.score < result.max, feedback(result)
    if "bonus" not in how and "go_on" not in how:  # they change what is emitted, not P(first)
        fails(result, "the emitted token is distributed exactly")


def test_speculative_through_the_library_is_refused():
    from mlsys_lab.llm import speculative

    def through_the_library(p, q, draft, u, sample):
        speculative.residual(p[0], q[0])
        return speculative_verify(p, q, draft, u, sample)

    assert refused(run_cases("18.3", through_the_library, seed=0)), "the library ran"


def test_speculative_own_random_source_fails():
    rng = np.random.default_rng(0)

    def own_rng(p, q, draft, u, sample):
        return speculative_verify(p, q, draft, rng.uniform(0, 1, len(draft)), sample)

    fails(run_cases("18.3", own_rng, seed=7), "accept while")


def test_the_exact_distribution_check_agrees_with_sampling():
    """The judge's induced distribution is what sampling gives: 40k draws of the reference rule
    with a poor draft match the target to 4 sigma."""
    rng = np.random.default_rng(2)
    p = np.array([[0.5, 0.2, 0.15, 0.1, 0.05], [0.2] * 5])
    q = np.array([[0.05, 0.1, 0.15, 0.3, 0.4]])
    sample = lambda dist: int(rng.choice(5, p=dist))  # noqa: E731
    n = 40_000
    drafts = rng.choice(5, size=n, p=q[0])
    first = np.array([speculative_verify(p, q, [x], [rng.uniform()], sample)[0] for x in drafts])
    freq = np.bincount(first, minlength=5) / n
    assert np.all(np.abs(freq - p[0]) < 4 * np.sqrt(p[0] * (1 - p[0]) / n)), freq
