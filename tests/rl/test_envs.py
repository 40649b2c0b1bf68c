"""Environments: CartPole against Gymnasium's CartPole-v1 (committed reference arrays written by
``tests/data/make_gymnasium_reference.py``), spaces and seeding, the gridworld against value
iteration, the book's payoff tables."""

import os

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.rl.envs import (
    PRISONERS_DILEMMA,
    ROCK_PAPER_SCISSORS,
    Box,
    CartPole,
    Discrete,
    GridWorld,
    MatrixGameEnv,
    MultiDiscrete,
    np_random,
    pure_nash_equilibria,
    value_iteration,
)

REF = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                   "gymnasium_cartpole_reference.npz")
CASES = ("c0", "c1", "c2", "c3", "c4", "c5", "c6")


@pytest.fixture(scope="module")
def ref():
    with np.load(REF, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def test_reference_was_written_by_gymnasium_1_x(ref):
    assert str(ref["gymnasium_version"]).startswith("1.")


@pytest.mark.parametrize("case", CASES)
def test_cartpole_equals_gymnasium_step_for_step(ref, case):
    env = CartPole()
    kind, seed, action = ref[f"{case}_kind"], ref[f"{case}_seed"], ref[f"{case}_action"]
    assert (kind == 1).sum() >= 60
    for t in range(len(kind)):
        if kind[t] == 0:
            obs, info = env.reset(seed=None if seed[t] < 0 else int(seed[t]))
            reward, terminated, truncated = 0.0, False, False
            assert info == {}
        else:
            obs, reward, terminated, truncated, info = env.step(int(action[t]))
        assert obs.dtype == np.float32 and obs.shape == (4,)
        np.testing.assert_allclose(obs, ref[f"{case}_obs"][t], rtol=0, atol=1e-12)
        np.testing.assert_allclose(env.state, ref[f"{case}_state"][t], rtol=0, atol=1e-12)
        assert reward == ref[f"{case}_reward"][t], (case, t)
        assert terminated == bool(ref[f"{case}_terminated"][t]), (case, t)
        assert truncated == bool(ref[f"{case}_truncated"][t]), (case, t)


def test_the_reference_covers_truncation_termination_and_steps_after_termination(ref):
    assert ref["c4_truncated"].any() and ref["c5_truncated"].any()
    assert ref["c0_terminated"].sum() >= 5
    # c6 steps on after termination: Gymnasium then gives reward 0
    assert ((ref["c6_kind"] == 1) & (ref["c6_reward"] == 0.0)).sum() > 10


def test_truncation_comes_at_step_500_exactly(ref):
    kind, trunc = ref["c4_kind"], ref["c4_truncated"]
    first = np.flatnonzero(trunc)[0]
    assert (kind[1:first + 1] == 1).sum() == 500


def test_seeding_matches_gymnasium(ref):
    space = Discrete(2, seed=3)
    assert [int(space.sample()) for _ in range(32)] == ref["discrete_samples"].tolist()
    g, used = np_random(5)
    expected = np.random.Generator(np.random.PCG64(np.random.SeedSequence(5))).uniform(size=3)
    np.testing.assert_array_equal(g.uniform(size=3), expected)
    assert used == 5
    _, drawn = np_random(None)
    assert isinstance(drawn, int) and drawn >= 0


def test_reset_without_seed_continues_the_generator():
    a, b = CartPole(), CartPole()
    a.reset(seed=4)
    b.reset(seed=4)
    np.testing.assert_array_equal(a.reset()[0], b.reset()[0])
    first = a.reset(seed=4)[0]
    assert not np.array_equal(first, a.reset()[0])


def test_reset_state_lies_in_the_gymnasium_range():
    env = CartPole()
    env.reset(seed=0)
    states = np.array([env.reset()[0] for _ in range(2000)])
    assert (np.abs(states) <= 0.05).all()
    assert states.min() < -0.045 and states.max() > 0.045


def test_cartpole_rejects_bad_use():
    env = CartPole()
    with pytest.raises(ArgumentError, match="reset"):
        env.step(0)
    env.reset(seed=0)
    for bad in (2, -1, 0.5, "left", True):
        with pytest.raises(ArgumentError, match="CartPole.step"):
            env.step(bad)
    with pytest.raises(ArgumentError):
        CartPole(max_episode_steps=0)
    with pytest.raises(ArgumentError):
        env.reset(options={"low": 0.1, "high": -0.1})


def test_spaces():
    box = Box(-1.0, 2.0, shape=(3,), seed=0)
    samples = np.array([box.sample() for _ in range(200)])
    assert samples.dtype == np.float32 and ((samples >= -1) & (samples <= 2)).all()
    assert box.contains(np.zeros(3, np.float32)) and not box.contains(np.full(3, 3.0))
    assert not box.contains(np.zeros(2, np.float32))
    d = Discrete(3, start=1, seed=0)
    assert {int(d.sample()) for _ in range(100)} == {1, 2, 3}
    assert d.contains(3) and not d.contains(0) and not d.contains(1.0)
    m = MultiDiscrete([2, 5], seed=0)
    assert m.contains(np.array([1, 4])) and not m.contains(np.array([2, 0]))
    assert m.contains(m.sample())
    with pytest.raises(ArgumentError):
        Discrete(0)


def test_gridworld_value_iteration_equals_shortest_path():
    g = GridWorld()
    P, R, terminal = g.transition_model()
    np.testing.assert_allclose(P.sum(axis=2), 1.0)
    V, policy, _ = value_iteration(P, R, 1.0, terminal)
    # deterministic moves, -1 per move except the one onto the goal (0): V = -(moves - 1)
    dist = {g.goal: 0}
    frontier = [g.goal]
    while frontier:
        nxt = []
        for s in frontier:
            for s2 in range(P.shape[0]):
                if s2 not in dist and not g.walls.flat[s2] and (P[s2, :, s] > 0).any():
                    dist[s2] = dist[s] + 1
                    nxt.append(s2)
        frontier = nxt
    for s, d in dist.items():
        assert V[s] == -max(d - 1, 0)
    # following the greedy policy in the environment reaches the goal in 1 - V[start] moves
    obs, _ = g.reset(seed=0)
    moves = 0
    for moves in range(1, 50):  # noqa: B007 (the count is the result)
        obs, r, term, trunc, _ = g.step(int(policy[obs]))
        if term:
            break
    assert moves == 1 - V[g.start] and len(dist) == 12


def test_slippery_gridworld_samples_its_model():
    g = GridWorld(slip=0.4)
    P, _, _ = g.transition_model()
    g.reset(seed=1)
    counts = np.zeros(P.shape[0])
    for _ in range(4000):
        g.position = 6
        s2, *_ = g.step(0)
        counts[s2] += 1
    np.testing.assert_allclose(counts / 4000, P[6, 0], atol=0.03)


def test_payoff_tables_are_the_books():
    pd = PRISONERS_DILEMMA
    assert [pd.payoffs(i, j) for i in range(2) for j in range(2)] == \
        [(-1, -1), (-3, 0), (0, -3), (-2, -2)]
    assert pure_nash_equilibria(pd) == [(1, 1)]  # both confess
    rps = ROCK_PAPER_SCISSORS
    assert rps.zero_sum and pure_nash_equilibria(rps) == []
    assert rps.payoffs(1, 0) == (1.0, -1.0)  # paper covers rock
    u = np.full(3, 1 / 3)
    np.testing.assert_allclose(rps.row @ u, 0.0)  # no pure deviation gains against (1/3,)*3
    env = MatrixGameEnv(pd)
    env.reset(seed=0)
    obs, r, term, trunc, _ = env.step(np.array([0, 1]))
    assert term and not trunc and r.tolist() == [-3.0, 0.0] and obs.tolist() == [0, 1]
