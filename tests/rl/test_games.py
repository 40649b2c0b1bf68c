"""Matrix-game dynamics: fictitious play converges on rock-paper-scissors, naive self-play
cycles, exploitability and best responses against brute force, the policy-space counts."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.rl.envs import PRISONERS_DILEMMA, ROCK_PAPER_SCISSORS, MatrixGame
from mlsys_lab.rl.games import (
    best_response,
    deterministic_policies,
    exploitability,
    fictitious_play,
    joint_actions,
    joint_policies,
    multiplicative_weights,
    naive_self_play,
)

RPS = ROCK_PAPER_SCISSORS
THIRD = np.full(3, 1 / 3)


def test_fictitious_play_converges_and_naive_self_play_does_not():
    xs, ys = fictitious_play(RPS, 100_000)
    gaps = [exploitability(RPS, xs[t], ys[t]) for t in (10, 100, 1_000, 100_000)]
    assert gaps[-1] < 0.01
    assert gaps[0] > gaps[1] > gaps[2] > gaps[3]
    np.testing.assert_allclose(xs[-1], THIRD, atol=0.01)
    np.testing.assert_allclose(ys[-1], THIRD, atol=0.01)
    px, py = naive_self_play(RPS, 1_000)
    assert min(exploitability(RPS, px[t], py[t]) for t in range(1, 1_001)) > 0.1
    # it cycles: rock -> paper -> scissors -> rock, period 3
    assert px[:4].argmax(axis=1).tolist() == [0, 1, 2, 0]
    np.testing.assert_array_equal(px[3:], px[:-3])


def test_fictitious_play_kernel_equals_a_direct_loop():
    rng = np.random.default_rng(0)
    for game in (RPS, PRISONERS_DILEMMA,
                 MatrixGame("random", ("a", "b", "c", "d"), rng.normal(size=(4, 3)),
                            rng.normal(size=(4, 3)))):
        n, m = game.row.shape
        x0, y0 = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m))
        xs, ys = fictitious_play(game, 300, x0, y0)
        x, y = x0, y0
        counts_x, counts_y = x0.copy(), y0.copy()
        for t in range(300):
            bx = best_response(game.row, y)
            by = best_response(game.col.T, x)
            counts_x, counts_y = counts_x + bx, counts_y + by
            x, y = counts_x / (t + 2), counts_y / (t + 2)
            np.testing.assert_allclose(xs[t + 1], x, atol=1e-12)
            np.testing.assert_allclose(ys[t + 1], y, atol=1e-12)


def test_ties_are_split_evenly():
    # two copies of rock: an even split keeps the copies equal (argmax would favour the first)
    A = np.array([[0, 0, -1, 1], [0, 0, -1, 1], [1, 1, 0, -1], [-1, -1, 1, 0]], float)
    game = MatrixGame("rock twice", ("rock", "rock'", "paper", "scissors"), A, -A)
    xs, _ = fictitious_play(game, 3_000, x0=np.eye(4)[2], y0=np.eye(4)[2])
    assert xs[-1][0] == xs[-1][1] > 0.1
    assert best_response(A, np.array([0, 0, 0, 1.0])).tolist() == [0.5, 0.5, 0.0, 0.0]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_exploitability_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    n, m = rng.integers(2, 5, size=2)
    game = MatrixGame("g", tuple("abcd"[:n]), rng.normal(size=(n, m)), rng.normal(size=(n, m)))
    x, y = rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m))
    best_row = max(game.expected(np.eye(n)[i], y)[0] for i in range(n))
    best_col = max(game.expected(x, np.eye(m)[j])[1] for j in range(m))
    r, c = game.expected(x, y)
    assert exploitability(game, x, y) == pytest.approx((best_row - r + best_col - c) / 2)
    assert exploitability(game, x, y) >= -1e-12
    br = best_response(game.row, y)
    assert game.expected(br, y)[0] == pytest.approx(best_row)


def test_equilibria_have_zero_exploitability():
    assert exploitability(RPS, THIRD, THIRD) == pytest.approx(0.0, abs=1e-15)
    assert exploitability(RPS, np.eye(3)[0], np.eye(3)[0]) == 1.0
    confess = np.array([0.0, 1.0])
    assert exploitability(PRISONERS_DILEMMA, confess, confess) == 0.0
    silent = np.array([1.0, 0.0])
    assert exploitability(PRISONERS_DILEMMA, silent, silent) == 1.0  # each gains 1 by confessing


def test_multiplicative_weights_orbit_while_the_average_converges():
    xs, ys, xb, yb = multiplicative_weights(RPS, 3_000, eta=0.05, x0=[0.5, 0.3, 0.2],
                                            y0=[0.5, 0.3, 0.2])
    last = exploitability(RPS, xs[-1], ys[-1])
    avg = exploitability(RPS, xb[-1], yb[-1])
    assert last > 0.1 and avg < last / 4
    np.testing.assert_allclose(xs.sum(axis=1), 1.0)


def test_policy_space_counts():
    assert joint_actions(3, 4) == 81
    assert deterministic_policies(states=5, actions=2) == 32
    assert joint_policies(5, 2, 3) == 2 ** 15
    assert joint_policies(5, 2, 2, shared_state=True) == 2 ** 50
    # brute force on a tiny case: enumerate each agent's state -> action tables
    tables = list(itertools.product(range(2), repeat=3))
    assert len(list(itertools.product(tables, tables))) == joint_policies(3, 2, 2)
    with pytest.raises(ArgumentError):
        joint_actions(0, 3)


def test_bad_strategies_are_refused():
    with pytest.raises(ArgumentError, match="fictitious_play"):
        fictitious_play(RPS, 10, x0=[0.5, 0.5, 0.5])
    with pytest.raises(ShapeError, match="best_response"):
        best_response(RPS.row, np.ones(2) / 2)
