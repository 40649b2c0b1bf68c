"""A small gridworld MDP with its transition model, and value iteration over that model.

The agent moves up/right/down/left on a grid drawn as text (``S`` start, ``G`` goal, ``#`` wall,
``.`` floor). Each move costs ``step_reward``; reaching ``G`` gives ``goal_reward`` and
terminates; bumping into a wall or the border leaves the agent where it is. With ``slip > 0`` the
move goes to one of the two perpendicular directions with probability ``slip / 2`` each (drawn
from :attr:`np_random`). :meth:`GridWorld.transition_model` returns the MDP as arrays
``P[s, a, s']`` and ``R[s, a]`` so that :func:`value_iteration` solves it exactly.
"""

import numpy as np

from ...errors import ArgumentError, ShapeError
from .core import Env
from .spaces import Discrete

DEFAULT_MAP = (
    "S...",
    ".#.#",
    "...#",
    "#..G",
)
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left


class GridWorld(Env):
    """A text-map gridworld; observations are cell numbers ``row * width + col``.

    Args:
        layout: rows of the map (``S``, ``G``, ``#``, ``.``), exactly one ``S`` and one ``G``.
        slip: probability that a move goes sideways instead.
        step_reward: reward of every move that does not reach the goal.
        goal_reward: reward of the move that reaches the goal.
        max_episode_steps: truncation length.
    """

    def __init__(self, layout=DEFAULT_MAP, slip=0.0, step_reward=-1.0, goal_reward=0.0,
                 max_episode_steps=100):
        rows = [str(r) for r in layout]
        if not rows or len({len(r) for r in rows}) != 1:
            raise ShapeError(f"GridWorld: the layout's rows must have equal lengths, got {rows}")
        text = "".join(rows)
        if text.count("S") != 1 or text.count("G") != 1 or set(text) - set("SG#."):
            raise ArgumentError("GridWorld: the layout needs one 'S', one 'G' and only "
                                f"'S', 'G', '#', '.' cells, got {rows}")
        if not 0.0 <= slip <= 1.0:
            raise ArgumentError(f"GridWorld: slip must lie in [0, 1], got {slip}")
        self.layout = tuple(rows)
        self.height, self.width = len(rows), len(rows[0])
        self.walls = np.array([[c == "#" for c in r] for r in rows])
        self.start = text.index("S")
        self.goal = text.index("G")
        self.slip, self.step_reward, self.goal_reward = float(slip), float(step_reward), \
            float(goal_reward)
        self.max_episode_steps = int(max_episode_steps)
        self.observation_space = Discrete(self.height * self.width)
        self.action_space = Discrete(4)
        self.position = None
        self.elapsed_steps = 0

    def _move(self, cell, direction):
        r, c = divmod(cell, self.width)
        dr, dc = MOVES[direction]
        r2, c2 = r + dr, c + dc
        if not (0 <= r2 < self.height and 0 <= c2 < self.width) or self.walls[r2, c2]:
            return cell
        return r2 * self.width + c2

    def _outcomes(self, action):
        """``[(probability, direction)]`` of an action under the slip rule."""
        if self.slip == 0.0:
            return [(1.0, action)]
        return [(1.0 - self.slip, action), (self.slip / 2, (action + 1) % 4),
                (self.slip / 2, (action + 3) % 4)]

    def reset(self, *, seed=None, options=None):
        """Put the agent on ``S``. Returns ``(cell, {})``."""
        super().reset(seed=seed)
        self.position = self.start
        self.elapsed_steps = 0
        return self.position, {}

    def step(self, action):
        """Move. Returns ``(cell, reward, terminated, truncated, {})``."""
        if self.position is None:
            raise ArgumentError("GridWorld.step: call reset() before step()")
        if not self.action_space.contains(action):
            raise ArgumentError(f"GridWorld.step: the action must be 0..3, got {action!r}")
        direction = int(action)
        if self.slip > 0.0:
            probs, dirs = zip(*self._outcomes(direction))
            direction = dirs[self.np_random.choice(len(dirs), p=probs)]
        self.position = self._move(self.position, direction)
        terminated = self.position == self.goal
        reward = self.goal_reward if terminated else self.step_reward
        self.elapsed_steps += 1
        truncated = self.elapsed_steps >= self.max_episode_steps
        return self.position, reward, terminated, truncated, {}

    def transition_model(self):
        """The MDP as arrays.

        Returns:
            ``(P, R, terminal)``: ``P[s, a, s']`` transition probabilities, ``R[s, a]`` expected
            rewards and ``terminal[s]`` (the goal, absorbing with reward 0).
        """
        n = self.height * self.width
        P = np.zeros((n, 4, n))
        R = np.zeros((n, 4))
        terminal = np.zeros(n, dtype=bool)
        terminal[self.goal] = True
        for s in range(n):
            for a in range(4):
                if terminal[s] or self.walls.flat[s]:
                    P[s, a, s] = 1.0
                    continue
                for p, d in self._outcomes(a):
                    s2 = self._move(s, d)
                    P[s, a, s2] += p
                    R[s, a] += p * (self.goal_reward if s2 == self.goal else self.step_reward)
        return P, R, terminal


def value_iteration(P, R, gamma, terminal=None, tol=1e-10, max_iterations=10_000):
    """Solve a finite MDP: iterate ``V <- max_a R[s, a] + gamma * sum_s' P[s, a, s'] V[s']``.

    Args:
        P: ``(S, A, S)`` transition probabilities.
        R: ``(S, A)`` expected rewards.
        gamma: discount in ``[0, 1]`` (1 needs every policy worth following to terminate).
        terminal: ``(S,)`` bools, states whose value is 0.
        tol: stop when no value changes by more than this.
        max_iterations: give up (ArgumentError) after this many sweeps.

    Returns:
        ``(V, policy, sweeps)``: the optimal values, a greedy policy (first best action) and how
        many sweeps it took.
    """
    P, R = np.asarray(P, dtype=np.float64), np.asarray(R, dtype=np.float64)
    if P.ndim != 3 or P.shape[0] != P.shape[2] or R.shape != P.shape[:2]:
        raise ShapeError(f"value_iteration: P must be (S, A, S) and R (S, A), got {P.shape} "
                         f"and {R.shape}")
    if not 0.0 <= gamma <= 1.0:
        raise ArgumentError(f"value_iteration: gamma must lie in [0, 1], got {gamma}")
    keep = np.ones(P.shape[0]) if terminal is None else ~np.asarray(terminal, dtype=bool)
    V = np.zeros(P.shape[0])
    for sweep in range(1, max_iterations + 1):
        Q = R + gamma * P @ V
        new = Q.max(axis=1) * keep
        if np.abs(new - V).max() <= tol:
            return new, Q.argmax(axis=1), sweep
        V = new
    raise ArgumentError(f"value_iteration: no convergence within {max_iterations} sweeps "
                        f"(gamma={gamma}); with gamma = 1 some policy may never terminate")
