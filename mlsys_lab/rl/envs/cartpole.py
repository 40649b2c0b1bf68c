"""CartPole with Gymnasium CartPole-v1's dynamics, termination, truncation and seeding.

The cart moves on a frictionless track; a pole is hinged on it; each step pushes the cart left
(action 0) or right (action 1) with 10 N, and the equations of motion (Barto, Sutton and Anderson
1983, as Gymnasium writes them) are integrated with explicit Euler over 0.02 s. The reward is 1
on every step, the terminating one included. The episode *terminates* when the cart leaves
``|x| <= 2.4`` or the pole ``|theta| <= 12 deg``, and is *truncated* at 500 steps (Gymnasium's
``TimeLimit`` wrapper of CartPole-v1, folded in here). ``reset`` draws all four state variables
uniformly in ``[-0.05, 0.05)`` from :attr:`np_random`. The state is float64; observations are its
float32 copy, as Gymnasium returns them.

:func:`cartpole_dynamics` is the one step on float64 scalars, shared with the tests' loops; the
Numba kernel of :mod:`mlsys_lab.rl.vector.cartpole_numba` spells the same arithmetic.
"""

import math

import numpy as np

from ...errors import ArgumentError
from .core import Env
from .spaces import Box, Discrete

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
LENGTH = 0.5  # half the pole's length
POLE_MASS_LENGTH = MASS_POLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
MAX_EPISODE_STEPS = 500
RESET_LOW, RESET_HIGH = -0.05, 0.05


def cartpole_dynamics(state, action):
    """One Euler step of CartPole from a float64 ``state = (x, x_dot, theta, theta_dot)``.

    Returns:
        ``(new_state, terminated)``: the float64 state after 0.02 s and whether it is outside
        the track or the angle limit.
    """
    x, x_dot, theta, theta_dot = state
    force = FORCE_MAG if action == 1 else -FORCE_MAG
    costheta = np.cos(theta)
    sintheta = np.sin(theta)
    temp = (force + POLE_MASS_LENGTH * np.square(theta_dot) * sintheta) / TOTAL_MASS
    thetaacc = (GRAVITY * sintheta - costheta * temp) / (
        LENGTH * (4.0 / 3.0 - MASS_POLE * np.square(costheta) / TOTAL_MASS))
    xacc = temp - POLE_MASS_LENGTH * thetaacc * costheta / TOTAL_MASS
    x = x + TAU * x_dot
    x_dot = x_dot + TAU * xacc
    theta = theta + TAU * theta_dot
    theta_dot = theta_dot + TAU * thetaacc
    new = np.array((x, x_dot, theta, theta_dot), dtype=np.float64)
    terminated = bool(x < -X_THRESHOLD or x > X_THRESHOLD
                      or theta < -THETA_THRESHOLD or theta > THETA_THRESHOLD)
    return new, terminated


class CartPole(Env):
    """Gymnasium's ``CartPole-v1`` (time limit included).

    Args:
        max_episode_steps: the truncation length (500 for v1).

    Example:
        >>> env = CartPole()
        >>> obs, info = env.reset(seed=0)
        >>> obs, reward, terminated, truncated, info = env.step(1)
    """

    metadata = {"render_fps": 50}

    def __init__(self, max_episode_steps=MAX_EPISODE_STEPS):
        if int(max_episode_steps) != max_episode_steps or max_episode_steps < 1:
            raise ArgumentError(f"CartPole: max_episode_steps must be a positive integer, "
                                f"got {max_episode_steps!r}")
        self.max_episode_steps = int(max_episode_steps)
        high = np.array([X_THRESHOLD * 2, np.inf, THETA_THRESHOLD * 2, np.inf], dtype=np.float32)
        self.observation_space = Box(-high, high, dtype=np.float32)
        self.action_space = Discrete(2)
        self.state = None
        self.elapsed_steps = None
        self._ended = False

    def reset(self, *, seed=None, options=None):
        """Start an episode: the state uniform in ``[-0.05, 0.05)^4`` (``options`` may give
        ``low``/``high``). Returns ``(obs, {})``."""
        super().reset(seed=seed)
        low, high = RESET_LOW, RESET_HIGH
        if options:
            low, high = options.get("low", low), options.get("high", high)
            if not low <= high:
                raise ArgumentError(f"CartPole.reset: low {low} must not exceed high {high}")
        self.state = self.np_random.uniform(low=low, high=high, size=(4,))
        self.elapsed_steps = 0
        self._ended = False
        return np.array(self.state, dtype=np.float32), {}

    def step(self, action):
        """Push left (0) or right (1). Returns ``(obs, 1.0, terminated, truncated, {})``."""
        if self.state is None:
            raise ArgumentError("CartPole.step: call reset() before step()")
        if not self.action_space.contains(action):
            raise ArgumentError(f"CartPole.step: the action must be 0 or 1, got {action!r} "
                                f"({type(action).__name__})")
        self.state, terminated = cartpole_dynamics(self.state, action)
        # Gymnasium gives 0 reward for steps taken after termination (undefined behaviour there)
        reward = 0.0 if self._ended and terminated else 1.0
        self._ended = self._ended or terminated
        self.elapsed_steps += 1
        truncated = self.elapsed_steps >= self.max_episode_steps
        return np.array(self.state, dtype=np.float32), reward, terminated, truncated, {}

    def __repr__(self):
        return f"CartPole(max_episode_steps={self.max_episode_steps})"
