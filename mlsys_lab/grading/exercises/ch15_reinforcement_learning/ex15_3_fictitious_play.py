"""Exercise 15.3: fictitious play on a two-player matrix game.

The student writes ``fictitious_play(row, col, iterations, x0, y0)``: ``row[i, j]`` and
``col[i, j]`` are the two players' payoffs when the row player plays ``i`` and the column
player ``j``; ``x0``, ``y0`` are the strategies of round 0. In each round both players, at the
same time, best-respond to the opponent's *average* strategy so far, and the averages move:
``xbar_{t+1} = xbar_t + (BR_row(ybar_t) - xbar_t) / (t + 2)`` (``xbar_0 = x0``), likewise
``ybar`` with the column player's best response to ``xbar_t``. A best response with ties is the
uniform mixture over every action whose expected payoff is within 1e-9 of the best. It returns
``(xbars, ybars)`` of shapes ``(iterations + 1, n)`` and ``(iterations + 1, m)``.

Wrong ideas rejected: best-responding to the opponent's last move (naive self-play, which
cycles in rock-paper-scissors); putting the opponent's or one's own average into the average
instead of a best response (nothing moves); breaking ties towards the first action (a game with
a duplicated action); weighting ``x0`` as nothing (``1 / (t + 1)``); the column player's best
response computed from ``col`` untransposed (its expected payoffs are ``xbar @ col``); updating
the players in turn (the column player answering the row player's *new* average).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register

TOL = 1e-9
_RPS = np.array([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]])


def _br(values):
    best = values >= values.max() - TOL
    return best / best.sum()


def _reference(row, col, iterations, x0, y0):
    x, y = np.array(x0, dtype=np.float64), np.array(y0, dtype=np.float64)
    xs, ys = [x], [y]
    for t in range(iterations):
        bx, by = _br(row @ y), _br(x @ col)
        x, y = x + (bx - x) / (t + 2), y + (by - y) / (t + 2)
        xs.append(x)
        ys.append(y)
    return np.array(xs), np.array(ys)


def _game(kind, seed):
    rng = np.random.default_rng(15700 + seed)
    if kind == "rps":
        return _RPS, -_RPS, 40, np.eye(3)[0], np.eye(3)[0]
    if kind == "random":
        n, m = 3, 4
        row = rng.integers(-3, 4, (n, m)).astype(float) + rng.normal(0, 0.1, (n, m))
        col = rng.integers(-3, 4, (n, m)).astype(float) + rng.normal(0, 0.1, (n, m))
        return row, col, 60, rng.dirichlet(np.ones(n)), rng.dirichlet(np.ones(m))
    if kind == "twin":  # rock appears twice: an even tie-break keeps the copies equal
        A = np.array([[0, 0, -1, 1], [0, 0, -1, 1], [1, 1, 0, -1], [-1, -1, 1, 0]], float)
        return A, -A, 300, np.eye(4)[2], np.eye(4)[2]
    if kind == "long":
        return _RPS, -_RPS, 20_000, np.eye(3)[int(rng.integers(3))], np.eye(3)[0]
    raise ValueError(kind)


def _exploitability(row, col, x, y):
    return ((row @ y).max() - x @ row @ y + (x @ col).max() - x @ col @ y) / 2


# ----------------------------------------------------------------------------- probes / judges


def _probe(kind):
    def probe(fictitious_play, seed):
        row, col, iterations, x0, y0 = _game(kind, seed)
        out = fictitious_play(row.copy(), col.copy(), iterations, x0.copy(), y0.copy())
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            return {"bad": describe(out)}
        xs, ys = (np.asarray(a, dtype=np.float64) for a in out)
        if kind == "long":  # only what the judge needs from 20,001 rows
            return {"xs": xs[[10, 100, 1000, -1]], "ys": ys[[10, 100, 1000, -1]],
                    "shape": [list(xs.shape), list(ys.shape)]}
        return {"xs": xs, "ys": ys, "shape": [list(xs.shape), list(ys.shape)]}
    return probe


def _judge(kind, what):
    def judge(raw, seed):
        if "bad" in raw:
            raise AssertionError(f"{what}: expected (xbars, ybars), got {raw['bad']}")
        row, col, iterations, x0, y0 = _game(kind, seed)
        xs, ys = _reference(row, col, iterations, x0, y0)
        if raw["shape"] != [list(xs.shape), list(ys.shape)]:
            raise AssertionError(f"{what}: shapes {raw['shape']}, expected "
                                 f"{[list(xs.shape), list(ys.shape)]} (round 0 included)")
        if kind == "long":
            gap = _exploitability(row, col, raw["xs"][-1], raw["ys"][-1])
            if gap >= 0.01:
                raise AssertionError(f"{what}: after 20,000 rounds the averages "
                                     f"{describe(raw['xs'][-1])} are exploitable by {gap:.3f} "
                                     f"(fictitious play gets below 0.01)")
            xs, ys = xs[[10, 100, 1000, -1]], ys[[10, 100, 1000, -1]]
        for name, got, want in (("xbar", raw["xs"], xs), ("ybar", raw["ys"], ys)):
            if not np.allclose(got, want, rtol=0, atol=1e-9):
                t = int(np.argwhere(~np.isclose(got, want, rtol=0, atol=1e-9))[0][0])
                raise AssertionError(f"{what}: {name} row {t} is {describe(got[t])}, expected "
                                     f"{describe(want[t])}")
    return judge


register(
    Exercise(
        id="15.3",
        title="Fictitious play: best responses to the opponent's average",
        target="fictitious_play",
        task="fictitious play",
        forbidden=("mlsys_lab.rl.games.dynamics",),  # fictitious_play, its kernel, best_response
        cases=(
            Case("rock-paper-scissors from (rock, rock): 40 rounds", 2,
                 feedback="each round: best-respond to the opponent's average, then move the "
                          "averages by (BR - xbar) / (t + 2)",
                 probe=_probe("rps"), judge=_judge("rps", "rock-paper-scissors")),
            Case("a random 3 x 4 game from mixed strategies: 60 rounds", 2,
                 feedback="the column player's payoffs for its actions are xbar @ col",
                 probe=_probe("random"), judge=_judge("random", "a random 3 x 4 game")),
            Case("a duplicated action: ties split evenly", 1,
                 feedback="the best response is uniform over every action within 1e-9 of the "
                          "best",
                 probe=_probe("twin"), judge=_judge("twin", "rock twice")),
            Case("20,000 rounds of rock-paper-scissors: exploitability < 0.01", 2,
                 feedback="the averages approach (1/3, 1/3, 1/3)",
                 probe=_probe("long"), judge=_judge("long", "20,000 rounds")),
        ),
    ),
)
