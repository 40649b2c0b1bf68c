"""Exercises of chapter 15 test the idea: the references score full marks on every seed, the
library's replay buffer, GAE and fictitious play are refused, and each wrong idea listed in the
exercise modules of ``mlsys_lab/grading/exercises/ch15_reinforcement_learning/`` scores 0 on the
cases that name it.

Everything runs in process with ``run_cases`` (the probe -> wire -> judge round trip of the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlsys_lab.grading.core.check import run_cases

from ..exercise_results import fails, fails_only, feedback, full, refused

SEEDS = [0, 1, 7, 12345]


# ============================================================================= 15.1 replay buffer
class ReplayBuffer:
    def __init__(self, capacity, obs_dim, *, evict="oldest", slots=0, recent=None,
                 replace=True, per_field=False, copy=True):
        self.capacity = capacity + slots
        self.obs = np.zeros((self.capacity, obs_dim))
        self.next_obs = np.zeros((self.capacity, obs_dim))
        self.actions = np.zeros(self.capacity, dtype=np.int64)
        self.rewards = np.zeros(self.capacity)
        self.terminated = np.zeros(self.capacity, dtype=bool)
        self.count = 0
        self.evict, self.recent, self.replace = evict, recent, replace
        self.per_field, self.copy = per_field, copy
        self.refs = {}

    def __len__(self):
        return min(self.count, self.capacity)

    def add(self, obs, action, reward, next_obs, terminated):
        if self.evict == "newest" and self.count >= self.capacity:
            i = self.capacity - 1
        else:
            i = self.count % self.capacity
        if self.copy:
            self.obs[i], self.next_obs[i] = obs, next_obs
        else:
            self.refs[i] = (obs, next_obs)
        self.actions[i], self.rewards[i], self.terminated[i] = action, reward, terminated
        self.count += 1

    def _indices(self, n, batch_size, rng):
        if self.evict == "all slots":
            n = self.capacity
        if self.recent:
            newest = (self.count - 1) % self.capacity
            return (newest - rng.integers(0, min(n, self.recent), size=batch_size)) % \
                self.capacity
        if not self.replace:  # without replacement whenever the batch fits
            return rng.choice(n, size=batch_size, replace=batch_size > n)
        return rng.integers(0, n, size=batch_size)

    def sample(self, batch_size, rng):
        n = len(self)
        i = self._indices(n, batch_size, rng)
        j = self._indices(n, batch_size, rng) if self.per_field else i
        if self.copy:
            obs, nxt = self.obs[i], self.next_obs[j]
        else:
            obs = np.array([self.refs[k][0] for k in i])
            nxt = np.array([self.refs[k][1] for k in j])
        return obs, self.actions[j], self.rewards[j], nxt, self.terminated[j]


def _buffer(**how):
    return lambda capacity, obs_dim: ReplayBuffer(capacity, obs_dim, **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_replay_buffer_reference_scores_full_marks(seed):
    full(run_cases("15.1", ReplayBuffer, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"evict": "newest"}, ("holds the newest",)),
    ({"slots": 1}, ("holds the newest",)),
    ({"evict": "all slots"}, ("holds the newest",)),
    ({"recent": 16}, ("uniform over", "with replacement")),
    ({"per_field": True}, ("a sampled row",)),
    ({"copy": False}, ("a sampled row",)),
], ids=["evicts newest", "one slot too many", "samples empty slots", "only recent",
        "fields apart", "keeps references"])
def test_replay_buffer_wrong_ideas_fail(how, failing):
    fails(run_cases("15.1", _buffer(**how), seed=3), *failing)


def test_sampling_without_replacement_fails_only_the_replacement_case():
    fails_only(run_cases("15.1", _buffer(replace=False), seed=3), "with replacement")


def test_biased_sampling_fails_the_uniform_case():
    class Biased(ReplayBuffer):
        def _indices(self, n, batch_size, rng):  # favours low slots: sqrt of a uniform
            return (n * rng.uniform(size=batch_size) ** 1.3).astype(int)

    fails(run_cases("15.1", Biased, seed=3), "uniform over")


def test_the_library_replay_buffer_is_refused():
    from mlsys_lab.rl.agents.replay import ReplayBuffer as Library

    class Wrapped:
        def __init__(self, capacity, obs_dim):
            self.inner = Library(capacity, (obs_dim,), obs_dtype=np.float64, seed=0)

        def __len__(self):
            return len(self.inner)

        def add(self, *transition):
            self.inner.add(*transition)

        def sample(self, batch_size, rng):
            return self.inner.sample(batch_size)

    assert refused(run_cases("15.1", Wrapped, seed=0)), "the library ran"


# ============================================================================= 15.2 GAE
def gae(rewards, values, next_values, terminated, truncated, gamma, lam, *, cut_term=True,
        trunc_as_term=False, cut_trunc=True, swap=False, bootstrap=True, forwards=False,
        axis_mix=False):
    if swap:
        gamma, lam = lam, gamma
    rewards, values, next_values = (np.asarray(a, dtype=np.float64)
                                    for a in (rewards, values, next_values))
    term = np.asarray(terminated, dtype=bool)
    trunc = np.asarray(truncated, dtype=bool)
    if trunc_as_term:
        term = term | trunc
    if not cut_term:
        term = np.zeros_like(term)
    next_values = next_values.copy()
    if not bootstrap:
        next_values[-1] = 0.0
    stop = term | trunc if cut_trunc else term
    delta = rewards + gamma * np.where(term, 0.0, next_values) - values
    if axis_mix and delta.ndim == 2:
        delta = delta.T.copy().reshape(delta.shape)
    adv = np.zeros_like(delta)
    last = np.zeros(delta.shape[1:])
    order = range(len(delta)) if forwards else reversed(range(len(delta)))
    for t in order:
        last = delta[t] + gamma * lam * np.where(stop[t], 0.0, last)
        adv[t] = last
    return adv


def _gae(**how):
    return lambda *args: gae(*args, **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_reference_scores_full_marks(seed):
    full(run_cases("15.2", gae, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"cut_term": False}, ("terminations", "both")),
    ({"trunc_as_term": True}, ("truncations", "both")),
    ({"cut_trunc": False}, ("truncations", "both")),
    ({"swap": True}, ("both",)),
    ({"bootstrap": False}, ("one episode",)),
    ({"forwards": True}, ("one episode", "terminations", "truncations", "both", "a (T, N)")),
    ({"axis_mix": True}, ("a (T, N)",)),
], ids=["no cut at terminated", "truncation as termination", "no cut at truncation",
        "gamma lam swapped", "no bootstrap", "forwards", "axes mixed"])
def test_gae_wrong_ideas_fail(how, failing):
    result = run_cases("15.2", _gae(**how), seed=3)
    fails(result, *failing)
    assert result.score < result.max, feedback(result)


def test_gae_writing_into_its_inputs_fails():
    def in_place(rewards, values, next_values, terminated, truncated, gamma, lam):
        adv = gae(rewards, values, next_values, terminated, truncated, gamma, lam)
        rewards[...] = adv  # reuses the caller's buffer for its output
        return rewards

    result = run_cases("15.2", in_place, seed=3)
    assert result.score == 0, feedback(result)


def test_the_library_gae_is_refused():
    from mlsys_lab.rl.agents.advantage import gae as library_gae

    def through_the_library(rewards, values, next_values, terminated, truncated, gamma, lam):
        library_gae(rewards, values, terminated | truncated, next_values[-1], gamma, lam)
        return gae(rewards, values, next_values, terminated, truncated, gamma, lam)

    assert refused(run_cases("15.2", through_the_library, seed=0)), "the library ran"


def test_the_judges_direct_sum_equals_an_independent_monte_carlo_form():
    """lam = 1 without truncation: A_t = discounted return to the end of the episode (bootstrapped
    at the rollout's end) minus V(s_t), computed here from the returns, not from deltas."""
    from mlsys_lab.grading.exercises.ch15_reinforcement_learning.ex15_2_gae import _direct

    rng = np.random.default_rng(0)
    T, gamma = 30, 0.9
    r, v, nv = rng.normal(size=T), rng.normal(size=T), rng.normal(size=T)
    term = np.zeros(T, bool)
    term[[7, 19]] = True
    nv[:-1] = v[1:]
    ret = np.zeros(T)
    following = nv[-1]
    for t in reversed(range(T)):
        following = r[t] + gamma * (0.0 if term[t] else following)
        ret[t] = following
    np.testing.assert_allclose(_direct(r, v, nv, term, np.zeros(T, bool), gamma, 1.0), ret - v,
                               atol=1e-12)


# ============================================================================= 15.3 fictitious play
def fictitious_play(row, col, iterations, x0, y0, *, respond="average", ties="even",
                    weight=2, col_transposed=False, in_turn=False):
    x, y = np.array(x0, dtype=float), np.array(y0, dtype=float)
    last_x, last_y = x, y
    xs, ys = [x], [y]

    def br(values):
        if ties == "first":
            return np.eye(len(values))[np.argmax(values)]
        best = values >= values.max() - 1e-9
        return best / best.sum()

    for t in range(iterations):
        if respond == "average":
            bx = br(row @ y)
        elif respond == "last":
            bx = br(row @ last_y)
        else:  # plays an average instead of a best response
            bx = y if respond == "opponent average" else x
        x_new = x + (bx - x) / (t + weight)
        against = x_new if in_turn else (last_x if respond == "last" else x)
        if respond in ("average", "last"):
            by = br(col @ against) if col_transposed else br(against @ col)
        else:
            by = x if respond == "opponent average" else y
        if respond == "last":
            last_x, last_y = bx, by
        y = y + (by - y) / (t + weight)
        x = x_new
        xs.append(x)
        ys.append(y)
    return np.array(xs), np.array(ys)


def _fp(**how):
    return lambda *args: fictitious_play(*args, **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_fictitious_play_reference_scores_full_marks(seed):
    full(run_cases("15.3", fictitious_play, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"respond": "last"}, ("rock-paper-scissors from", "a random", "20,000 rounds")),
    ({"respond": "opponent average"}, ("rock-paper-scissors from", "20,000 rounds")),
    ({"respond": "own average"}, ("rock-paper-scissors from", "20,000 rounds")),
    ({"ties": "first"}, ("a duplicated action",)),
    ({"weight": 1}, ("rock-paper-scissors from", "a random")),
    ({"in_turn": True}, ("rock-paper-scissors from", "a random")),
], ids=["naive self-play", "opponent's average", "own average", "first-action ties",
        "x0 weighs nothing", "in turn"])
def test_fictitious_play_wrong_ideas_fail(how, failing):
    fails(run_cases("15.3", _fp(**how), seed=3), *failing)


def test_the_column_player_with_col_untransposed_fails():
    result = run_cases("15.3", _fp(col_transposed=True), seed=3)
    fails(result, "rock-paper-scissors from", "a random 3 x 4 game")


def test_the_library_fictitious_play_is_refused():
    from mlsys_lab.rl.envs import MatrixGame
    from mlsys_lab.rl.games import fictitious_play as library

    def through_the_library(row, col, iterations, x0, y0):
        game = MatrixGame("g", tuple(range(row.shape[0])), row, col)
        return library(game, iterations, x0, y0)

    assert refused(run_cases("15.3", through_the_library, seed=0)), "the library ran"


def test_the_library_kernel_called_directly_is_refused():
    from mlsys_lab.rl.games import dynamics

    def through_the_kernel(row, col, iterations, x0, y0):
        xs, ys = np.empty((iterations + 1, len(x0))), np.empty((iterations + 1, len(y0)))
        dynamics._fictitious_play_kernel(np.asarray(row, float), np.ascontiguousarray(col.T),
                                         np.asarray(x0, float), np.asarray(y0, float), xs, ys,
                                         1e-12)
        return xs, ys

    assert refused(run_cases("15.3", through_the_kernel, seed=0)), "the kernel ran"


def test_the_grading_modules_own_references_are_refused():
    from mlsys_lab.grading.exercises.ch15_reinforcement_learning import ex15_2_gae
    from mlsys_lab.grading.exercises.ch15_reinforcement_learning import (
        ex15_3_fictitious_play as ex153,
    )

    assert refused(run_cases("15.2", ex15_2_gae._direct, seed=0)), "the judge's sum ran"
    assert refused(run_cases("15.3", ex153._reference, seed=0)), "the judge's reference ran"
