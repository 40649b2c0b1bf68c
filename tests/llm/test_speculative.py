"""Speculative decoding: the rule's output distribution is exactly the target's; the greedy
variant emits the target's greedy tokens; the formulas."""

import itertools

import numpy as np
import pytest

from mlsys_lab import llm
from mlsys_lab.llm import speculative


@pytest.mark.parametrize("seed", range(5))
def test_one_position_output_distribution_is_the_target(seed):
    rng = np.random.default_rng(seed)
    p, q = rng.dirichlet(np.ones(7) * 0.5), rng.dirichlet(np.ones(7) * 0.5)
    q[2] = 0.0  # a token the draft never proposes: only the residual can emit it
    q /= q.sum()
    assert np.abs(llm.output_distribution(p, q) - p).max() <= 1e-12
    assert np.abs(llm.output_distribution(p, p) - p).max() <= 1e-12


def _exact_verify_distribution(p_rows, q_rows, gamma, vocab):
    """Enumerate every draft (x1..xg) and the accept/reject outcomes at the first position with
    their probabilities: the exact distribution of the first emitted token."""
    first = np.zeros(vocab)
    for drafted in itertools.product(range(vocab), repeat=gamma):
        prob_draft = np.prod([q_rows[j][x] for j, x in enumerate(drafted)])
        if prob_draft == 0:
            continue
        p_acc0 = llm.acceptance_probability(p_rows[0], q_rows[0], drafted[0])
        first[drafted[0]] += prob_draft * p_acc0
        first += prob_draft * (1 - p_acc0) * llm.residual(p_rows[0], q_rows[0])
    return first


def test_enumerated_first_token_over_drafts_is_the_target():
    rng = np.random.default_rng(3)
    vocab, gamma = 4, 2
    p_rows = rng.dirichlet(np.ones(vocab), gamma + 1)
    q_rows = rng.dirichlet(np.ones(vocab), gamma)
    dist = _exact_verify_distribution(p_rows, q_rows, gamma, vocab)
    assert np.abs(dist - p_rows[0]).max() <= 1e-12


def test_a_wrong_rule_is_caught():
    """Sampling the correction from p instead of norm(max(0, p - q)) is biased: the exact check
    above would fail for it."""
    rng = np.random.default_rng(0)
    p, q = rng.dirichlet(np.ones(5)), rng.dirichlet(np.ones(5))
    accepted = np.array([q[x] * llm.acceptance_probability(p, q, x) for x in range(5)])
    wrong = accepted + (1 - accepted.sum()) * p
    assert np.abs(wrong - p).max() > 1e-3


def test_verify_follows_the_rule_empirically():
    rng = np.random.default_rng(1)
    p_rows = rng.dirichlet(np.ones(3), 2)
    q_rows = rng.dirichlet(np.ones(3), 1)
    counts = np.zeros(3)
    draws = np.random.default_rng(2)
    for _ in range(6000):
        x = int(llm.sampling.draw(q_rows[0], draws))
        tokens, n = llm.verify(p_rows, q_rows, [x], draws)
        assert len(tokens) == n + 1
        counts[tokens[0]] += 1
    assert np.abs(counts / counts.sum() - p_rows[0]).max() < 0.03


def test_greedy_speculative_emits_the_targets_greedy_tokens(tiny):
    prompt = np.arange(4)
    plain = llm.generate_tokens(tiny, prompt, 40, temperature=0)
    for gamma in (1, 3, 5):
        for draft in (tiny.truncated(1), tiny):
            tokens, stats = llm.speculative_generate(tiny, draft, prompt, 40, gamma=gamma,
                                                     temperature=0)
            assert np.array_equal(tokens, plain)
    assert stats["alpha"] == 1.0 and stats["tokens_per_step"] == gamma + 1


def test_sampled_speculative_with_the_target_as_draft_accepts_everything(tiny):
    tokens, stats = llm.speculative_generate(tiny, tiny, np.arange(4), 30, gamma=3,
                                             temperature=1.0, seed=4)
    assert len(tokens) == 30 and stats["accepted"] == stats["drafted"]
    assert stats["alpha"] == pytest.approx(1.0)


def test_step_tokens_count_what_each_step_emitted(tiny):
    """``step_tokens`` holds one entry per step: the accepted drafts plus the one token the
    target adds, so they sum to ``accepted + steps`` and cover the tokens returned."""
    draft = llm.GPT(tiny.config, seed=2).eval()  # other weights: it guesses wrong at times
    tokens, stats = llm.speculative_generate(tiny, draft, np.arange(4), 30, gamma=3,
                                             temperature=0.2, seed=5)
    per_step = stats["step_tokens"]
    assert len(per_step) == stats["steps"] and all(1 <= n <= 4 for n in per_step)
    assert sum(per_step) == stats["accepted"] + stats["steps"] >= len(tokens)
    assert stats["tokens_per_step"] == pytest.approx(np.mean(per_step))
    assert min(per_step) < 4  # rejected somewhere: the entries are not all gamma + 1


def test_formulas():
    assert llm.expected_tokens(0.0, 4) == 1.0
    assert llm.expected_tokens(1.0, 4) == 5.0
    assert llm.expected_tokens(0.5, 2) == pytest.approx(1.75)
    # the book's expression of time per token
    a, g, c = 0.8, 4, 0.1
    assert llm.time_per_token(a, g, c, T=2.0) == pytest.approx(
        (c * g + 1) * (1 - a) / (1 - a ** (g + 1)) * 2.0)
    assert llm.speedup(a, g, c) == pytest.approx((1 - a ** 5) / ((1 - a) * 1.4))
    assert speculative.residual([0.5, 0.5], [0.5, 0.5]).tolist() == [0.5, 0.5]
