"""One Numba kernel steps every CartPole copy of a batch, auto-reset included.

:func:`cartpole_batch_step` runs CartPole-v1's Euler step (the arithmetic of
:func:`mlsys_lab.rl.envs.cartpole.cartpole_dynamics`, same order of operations) over ``N``
states in one compiled loop, with the time limit and NEXT_STEP auto-reset: a copy that ended its
episode at the previous call takes its next initial state instead of stepping.

Initial states are where a batch kernel and Gymnasium's seeding meet: each copy has its own
generator (seeded ``seed + i`` as :class:`SyncVectorEnv` seeds its copies), and the kernel cannot
call it. So every copy keeps a few initial states drawn ahead from its generator
(``uniform(-0.05, 0.05, size=(K, 4))`` gives exactly the numbers of K successive
``reset()`` calls); the kernel consumes them, and the Python side refills a copy's stock only
when it runs out (once every K episodes of that copy). Trajectories therefore equal the loop's
for the same seeds and actions.
"""

import numba
import numpy as np

from ...engine.numba_cache import CACHE
from ...errors import ArgumentError
from ..envs import cartpole as cp
from ..envs.seeding import np_random
from .base import VectorEnv, env_seeds

STOCK = 16  # initial states drawn ahead per copy


@numba.njit(cache=CACHE)
def cartpole_batch_step(state, steps, done, actions, stock, used, obs, rewards, terminated,
                        truncated, max_steps):
    """Step ``N`` CartPoles in place (NEXT_STEP auto-reset); see the module docstring.

    Args:
        state: ``(N, 4)`` float64 states, updated.
        steps: ``(N,)`` int64 steps taken in the current episodes, updated.
        done: ``(N,)`` bool, which copies ended at the previous call; updated.
        actions: ``(N,)`` int64 actions (0 left, 1 right).
        stock: ``(N, K, 4)`` float64 initial states drawn ahead.
        used: ``(N,)`` int64, how many of each copy's stock are consumed; updated.
        obs: ``(N, 4)`` float32 output observations.
        rewards: ``(N,)`` float64 output rewards.
        terminated: ``(N,)`` bool output flags.
        truncated: ``(N,)`` bool output flags.
        max_steps: the truncation length.
    """
    for i in range(state.shape[0]):
        if done[i]:
            k = used[i]
            for j in range(4):
                state[i, j] = stock[i, k, j]
            used[i] = k + 1
            steps[i] = 0
            rewards[i] = 0.0
            terminated[i] = False
            truncated[i] = False
        else:
            x, x_dot, theta, theta_dot = state[i, 0], state[i, 1], state[i, 2], state[i, 3]
            force = cp.FORCE_MAG if actions[i] == 1 else -cp.FORCE_MAG
            costheta = np.cos(theta)
            sintheta = np.sin(theta)
            temp = (force + cp.POLE_MASS_LENGTH * (theta_dot * theta_dot) * sintheta) \
                / cp.TOTAL_MASS
            thetaacc = (cp.GRAVITY * sintheta - costheta * temp) / (
                cp.LENGTH * (4.0 / 3.0 - cp.MASS_POLE * (costheta * costheta) / cp.TOTAL_MASS))
            xacc = temp - cp.POLE_MASS_LENGTH * thetaacc * costheta / cp.TOTAL_MASS
            x = x + cp.TAU * x_dot
            x_dot = x_dot + cp.TAU * xacc
            theta = theta + cp.TAU * theta_dot
            theta_dot = theta_dot + cp.TAU * thetaacc
            state[i, 0], state[i, 1], state[i, 2], state[i, 3] = x, x_dot, theta, theta_dot
            steps[i] += 1
            rewards[i] = 1.0
            terminated[i] = (x < -cp.X_THRESHOLD or x > cp.X_THRESHOLD
                             or theta < -cp.THETA_THRESHOLD or theta > cp.THETA_THRESHOLD)
            truncated[i] = steps[i] >= max_steps
        for j in range(4):
            obs[i, j] = np.float32(state[i, j])
        done[i] = terminated[i] or truncated[i]


class NumbaCartPoleVectorEnv(VectorEnv):
    """``num_envs`` CartPole-v1 copies stepped by one compiled kernel.

    Same trajectories as ``SyncVectorEnv([CartPole] * num_envs)`` for the same seeds and
    actions (copy ``i`` seeded ``seed + i``), NEXT_STEP auto-reset.

    Args:
        num_envs: how many copies.
        max_episode_steps: the truncation length (500 for v1).
    """

    def __init__(self, num_envs, max_episode_steps=cp.MAX_EPISODE_STEPS):
        if int(num_envs) != num_envs or num_envs < 1:
            raise ArgumentError(f"NumbaCartPoleVectorEnv: num_envs must be a positive integer, "
                                f"got {num_envs!r}")
        self.num_envs = n = int(num_envs)
        self.max_episode_steps = int(max_episode_steps)
        probe = cp.CartPole(self.max_episode_steps)
        self._set_spaces(probe.observation_space, probe.action_space)
        self.state = np.zeros((n, 4))
        self._steps = np.zeros(n, dtype=np.int64)
        self._done = np.zeros(n, dtype=bool)
        self._stock = np.zeros((n, STOCK, 4))
        self._used = np.full(n, STOCK, dtype=np.int64)  # no stock yet: the first reset draws
        self._generators = [None] * n
        self._ready = False
        self._obs = np.zeros((n, 4), dtype=np.float32)
        self._rewards = np.zeros(n)
        self._terminated = np.zeros(n, dtype=bool)
        self._truncated = np.zeros(n, dtype=bool)

    def _refill(self, i):
        g = self._generators[i]
        if g is None:
            g, _ = np_random(None)
            self._generators[i] = g
        self._stock[i] = g.uniform(cp.RESET_LOW, cp.RESET_HIGH, size=(STOCK, 4))
        self._used[i] = 0

    def reset(self, *, seed=None, options=None):
        """Reset every copy (copy ``i`` seeded ``seed + i``; unseeded copies continue their
        generators). Returns ``(obs, {})``."""
        if options:
            raise ArgumentError("NumbaCartPoleVectorEnv.reset: options are not supported")
        for i, s in enumerate(env_seeds(seed, self.num_envs, "NumbaCartPoleVectorEnv.reset")):
            if s is not None:
                self._generators[i], _ = np_random(s)
                self._used[i] = STOCK  # a fresh generator: the old stock is void
            if self._used[i] >= STOCK:
                self._refill(i)
            self.state[i] = self._stock[i, self._used[i]]
            self._used[i] += 1
        self._steps[:] = 0
        self._done[:] = False
        self._ready = True
        return self.state.astype(np.float32), {}

    def step(self, actions):
        """Step every copy in one kernel call (NEXT_STEP auto-reset)."""
        actions = self._check_actions(actions, "NumbaCartPoleVectorEnv.step")
        if not self._ready:
            raise ArgumentError("NumbaCartPoleVectorEnv.step: call reset() before step()")
        cartpole_batch_step(self.state, self._steps, self._done, actions, self._stock,
                            self._used, self._obs, self._rewards, self._terminated,
                            self._truncated, self.max_episode_steps)
        for i in np.flatnonzero(self._used >= STOCK):
            self._refill(i)
        return (self._obs.copy(), self._rewards.copy(), self._terminated.copy(),
                self._truncated.copy(), {})
