"""Two-player matrix (normal-form) games: the book's payoff tables as arrays, and a one-shot
two-agent environment over them.

A game is two payoff matrices: ``row[i, j]`` is what the row player gets when it plays ``i`` and
the column player ``j``; ``col[i, j]`` is what the column player gets. Rock-paper-scissors is
zero-sum (``col = -row``); the prisoner's dilemma pays (-1, -1) when both stay silent, (-3, 0)
/ (0, -3) when one confesses alone and (-2, -2) when both confess (years in prison, negated).
"""

import dataclasses

import numpy as np

from ...errors import ArgumentError, ShapeError
from .core import Env
from .spaces import Discrete, MultiDiscrete


@dataclasses.dataclass(frozen=True)
class MatrixGame:
    """A two-player normal-form game.

    Attributes:
        name: what to call it.
        actions: the actions' names (both players have the same ones here).
        row: ``(A, A)`` payoffs of the row player.
        col: ``(A, A)`` payoffs of the column player.
    """

    name: str
    actions: tuple
    row: np.ndarray
    col: np.ndarray

    def __post_init__(self):
        row, col = np.asarray(self.row, dtype=np.float64), np.asarray(self.col, dtype=np.float64)
        if row.ndim != 2 or row.shape != col.shape:
            raise ShapeError(f"MatrixGame {self.name!r}: row and col payoffs must be matrices of "
                             f"one shape, got {row.shape} and {col.shape}")
        object.__setattr__(self, "row", row)
        object.__setattr__(self, "col", col)

    @property
    def zero_sum(self):
        return bool(np.allclose(self.row + self.col, 0.0))

    def payoffs(self, i, j):
        """``(row player's, column player's)`` payoff for the action pair ``(i, j)``."""
        return float(self.row[i, j]), float(self.col[i, j])

    def expected(self, x, y):
        """Expected payoffs ``(x R y, x C y)`` of mixed strategies ``x`` (row) and ``y`` (col)."""
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        return float(x @ self.row @ y), float(x @ self.col @ y)

    def table(self):
        """The payoff table as text, each cell ``(row, col)``."""
        width = max(len(a) for a in self.actions) + 2
        lines = [" " * width + "".join(f"{a:>12}" for a in self.actions)]
        for i, a in enumerate(self.actions):
            cells = "".join(f"{f'({self.row[i, j]:g}, {self.col[i, j]:g})':>12}"
                            for j in range(len(self.actions)))
            lines.append(f"{a:<{width}}" + cells)
        return "\n".join(lines)


_RPS = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=np.float64)
ROCK_PAPER_SCISSORS = MatrixGame("rock-paper-scissors", ("rock", "paper", "scissors"),
                                 _RPS, 0.0 - _RPS)
PRISONERS_DILEMMA = MatrixGame(
    "prisoner's dilemma", ("silent", "confess"),
    np.array([[-1, -3], [0, -2]], dtype=np.float64),
    np.array([[-1, 0], [-3, -2]], dtype=np.float64))


def pure_nash_equilibria(game):
    """The pure action pairs where neither player gains by deviating alone."""
    out = []
    for i in range(game.row.shape[0]):
        for j in range(game.row.shape[1]):
            if game.row[i, j] >= game.row[:, j].max() and game.col[i, j] >= game.col[i, :].max():
                out.append((i, j))
    return out


class MatrixGameEnv(Env):
    """One round of a matrix game as a two-agent environment.

    ``step((i, j))`` returns ``(obs, (r_row, r_col), True, False, {})``: the observation is the
    pair just played (what a repeated-game agent sees of the last round).
    """

    def __init__(self, game):
        self.game = game
        n = game.row.shape[0]
        self.action_space = MultiDiscrete([n, game.row.shape[1]])
        self.observation_space = MultiDiscrete([n + 1, game.row.shape[1] + 1])
        self.single_action_spaces = (Discrete(n), Discrete(game.row.shape[1]))
        self._ready = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._ready = True
        return np.array([self.game.row.shape[0], self.game.row.shape[1]]), {}

    def step(self, action):
        if not self._ready:
            raise ArgumentError("MatrixGameEnv.step: call reset() before step()")
        if not self.action_space.contains(action):
            raise ArgumentError(f"MatrixGameEnv.step: the actions must be a pair in "
                                f"{self.action_space}, got {action!r}")
        i, j = int(action[0]), int(action[1])
        self._ready = False
        return np.array([i, j]), np.array(self.game.payoffs(i, j)), True, False, {}
