"""Learning dynamics in two-player matrix games: best responses, naive self-play, fictitious
play, multiplicative weights, and exploitability (how far a strategy pair is from a Nash
equilibrium).

A mixed strategy is a probability vector over a player's actions. The row player's expected
payoff of ``x`` against ``y`` is ``x R y``; the column player's is ``x C y``.

* **Naive self-play** answers the opponent's *current* strategy with a best response. In
  rock-paper-scissors it cycles rock -> paper -> scissors -> rock forever: every strategy it
  plays is a pure one, exploitable by 1.
* **Fictitious play** (Brown 1951) answers the opponent's *average* strategy so far; in
  two-player zero-sum games the averages converge to a Nash equilibrium (Robinson 1951), in
  rock-paper-scissors to (1/3, 1/3, 1/3).
* **Multiplicative weights** (Hedge) moves each player's strategy along its payoffs; in
  rock-paper-scissors the strategies themselves orbit (and drift out towards the corners)
  while their averages converge.

Ties in a best response are split evenly: the best response is the uniform mixture over every
action within ``TIE_TOL`` of the best payoff (so an equilibrium is not biased towards low
action numbers).
"""

import numba
import numpy as np

from ...engine.numba_cache import CACHE
from ...errors import ArgumentError, ShapeError

TIE_TOL = 1e-12


def _strategy(x, n, where):
    x = np.asarray(x, dtype=np.float64)
    if x.shape != (n,) or (x < -1e-12).any() or abs(x.sum() - 1.0) > 1e-9:
        raise ArgumentError(f"{where}: a strategy must be {n} probabilities summing to 1, "
                            f"got {x}")
    return x


def _start(game, x0, y0, where):
    n, m = game.row.shape
    x = np.eye(n)[0] if x0 is None else _strategy(x0, n, where)
    y = np.eye(m)[0] if y0 is None else _strategy(y0, m, where)
    return x, y


def best_response(payoff, opponent):
    """The best response of a player with ``payoff[i, j]`` to the opponent's mixed strategy.

    Args:
        payoff: ``(A, B)`` the player's payoffs (its actions along rows).
        opponent: ``(B,)`` the opponent's mixed strategy.

    Returns:
        ``(A,)``: the uniform mixture over every action whose expected payoff is within
        :data:`TIE_TOL` of the best (a pure strategy when the best is unique).
    """
    payoff = np.asarray(payoff, dtype=np.float64)
    if payoff.ndim != 2 or np.shape(opponent) != (payoff.shape[1],):
        raise ShapeError(f"best_response: payoff {payoff.shape} and opponent strategy "
                         f"{np.shape(opponent)} do not match")
    values = payoff @ np.asarray(opponent, dtype=np.float64)
    best = values >= values.max() - TIE_TOL
    return best / best.sum()


def exploitability(game, x, y):
    """How much the two players gain, on average, by switching to best responses.

    ``((max_i (R y)_i - x R y) + (max_j (x C)_j - x C y)) / 2`` (NashConv / 2, as OpenSpiel):
    0 exactly at a Nash equilibrium. For a symmetric zero-sum game like rock-paper-scissors with
    ``x = y`` it is ``max_i (R x)_i``: 1 for any pure strategy.
    """
    n, m = game.row.shape
    x = _strategy(x, n, "exploitability")
    y = _strategy(y, m, "exploitability")
    gain_row = (game.row @ y).max() - x @ game.row @ y
    gain_col = (x @ game.col).max() - x @ game.col @ y
    return float((gain_row + gain_col) / 2)


def naive_self_play(game, iterations, x0=None, y0=None):
    """Each player best-responds to the opponent's previous strategy.

    Args:
        game: a :class:`~mlsys_lab.rl.envs.MatrixGame`.
        iterations: rounds to play.
        x0, y0: the first strategies (default: each player's first action).

    Returns:
        ``(xs, ys)``: ``(iterations + 1, A)`` and ``(iterations + 1, B)``, the strategies played.
    """
    x, y = _start(game, x0, y0, "naive_self_play")
    xs, ys = [x], [y]
    for _ in range(int(iterations)):
        x, y = best_response(game.row, y), best_response(game.col.T, x)
        xs.append(x)
        ys.append(y)
    return np.array(xs), np.array(ys)


def fictitious_play(game, iterations, x0=None, y0=None):
    """Simultaneous fictitious play: each player best-responds to the opponent's average.

    ``xbar_{t+1} = xbar_t + (BR(ybar_t) - xbar_t) / (t + 2)``, with ``xbar_0 = x0`` (the first
    strategy counts as round 0); likewise for the column player.

    Args:
        game: a :class:`~mlsys_lab.rl.envs.MatrixGame`.
        iterations: rounds to play.
        x0, y0: the first strategies (default: each player's first action).

    Returns:
        ``(xbars, ybars)``: the average strategies after rounds ``0 .. iterations``.
    """
    x, y = _start(game, x0, y0, "fictitious_play")
    n, m = game.row.shape
    xs, ys = np.empty((int(iterations) + 1, n)), np.empty((int(iterations) + 1, m))
    _fictitious_play_kernel(game.row, np.ascontiguousarray(game.col.T), x, y, xs, ys, TIE_TOL)
    return xs, ys


@numba.njit(cache=CACHE)
def _best_response_into(payoff, opponent, out, tol):
    """:func:`best_response` written out for the kernel (same ties rule)."""
    best = -np.inf
    for i in range(payoff.shape[0]):
        v = 0.0
        for j in range(payoff.shape[1]):
            v += payoff[i, j] * opponent[j]
        out[i] = v
        best = max(best, v)
    count = 0
    for i in range(out.shape[0]):
        if out[i] >= best - tol:
            out[i] = 1.0
            count += 1
        else:
            out[i] = 0.0
    for i in range(out.shape[0]):
        out[i] /= count


@numba.njit(cache=CACHE)
def _fictitious_play_kernel(R, Ct, x, y, xs, ys, tol):
    bx, by = np.empty(R.shape[0]), np.empty(Ct.shape[0])
    for i in range(x.shape[0]):
        xs[0, i] = x[i]
    for j in range(y.shape[0]):
        ys[0, j] = y[j]
    for t in range(xs.shape[0] - 1):
        _best_response_into(R, ys[t], bx, tol)
        _best_response_into(Ct, xs[t], by, tol)
        for i in range(bx.shape[0]):
            xs[t + 1, i] = xs[t, i] + (bx[i] - xs[t, i]) / (t + 2)
        for j in range(by.shape[0]):
            ys[t + 1, j] = ys[t, j] + (by[j] - ys[t, j]) / (t + 2)


def multiplicative_weights(game, iterations, eta=0.1, x0=None, y0=None):
    """Simultaneous Hedge: ``x <- x * exp(eta * R y)``, normalised (likewise ``y``).

    Returns:
        ``(xs, ys, xbars, ybars)``: the strategies played and their running averages,
        ``iterations + 1`` rows each (strategies start uniform unless given).
    """
    n, m = game.row.shape
    x = np.full(n, 1 / n) if x0 is None else _strategy(x0, n, "multiplicative_weights")
    y = np.full(m, 1 / m) if y0 is None else _strategy(y0, m, "multiplicative_weights")
    xs, ys = [x], [y]
    for _ in range(int(iterations)):
        gx, gy = game.row @ y, x @ game.col
        x = x * np.exp(eta * (gx - gx.max()))
        y = y * np.exp(eta * (gy - gy.max()))
        x, y = x / x.sum(), y / y.sum()
        xs.append(x)
        ys.append(y)
    xs, ys = np.array(xs), np.array(ys)
    count = np.arange(1, len(xs) + 1)[:, None]
    return xs, ys, np.cumsum(xs, axis=0) / count, np.cumsum(ys, axis=0) / count
