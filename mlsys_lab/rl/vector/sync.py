"""The plain loop: one Python call per copy per step (Gymnasium's ``SyncVectorEnv``)."""

import numpy as np

from ...errors import ArgumentError
from .base import VectorEnv, env_seeds


class SyncVectorEnv(VectorEnv):
    """Step ``len(env_fns)`` environments one after another in this process.

    Args:
        env_fns: functions that each make one environment (called once here).

    Example:
        >>> from mlsys_lab.rl.envs import CartPole
        >>> envs = SyncVectorEnv([CartPole] * 4)
        >>> obs, info = envs.reset(seed=0)          # copy i seeded with 0 + i
        >>> obs, rewards, terminated, truncated, info = envs.step(np.zeros(4, np.int64))
    """

    def __init__(self, env_fns):
        env_fns = list(env_fns)
        if not env_fns:
            raise ArgumentError("SyncVectorEnv: needs at least one environment function")
        self.envs = [fn() for fn in env_fns]
        self.num_envs = len(self.envs)
        self._set_spaces(self.envs[0].observation_space, self.envs[0].action_space)
        space = self.single_observation_space
        self._obs = np.zeros((self.num_envs, *space.shape), dtype=space.dtype)
        self._autoreset = np.zeros(self.num_envs, dtype=bool)

    def reset(self, *, seed=None, options=None):
        """Reset every copy (copy ``i`` with ``seed + i``). Returns ``(obs, {})``."""
        for i, (env, s) in enumerate(zip(self.envs, env_seeds(seed, self.num_envs,
                                                              "SyncVectorEnv.reset"))):
            self._obs[i], _ = env.reset(seed=s, options=options)
        self._autoreset[:] = False
        return self._obs.copy(), {}

    def step(self, actions):
        """Step every copy; a copy whose episode ended at the previous step resets instead."""
        actions = self._check_actions(actions, "SyncVectorEnv.step")
        rewards = np.zeros(self.num_envs, dtype=np.float64)
        terminated = np.zeros(self.num_envs, dtype=bool)
        truncated = np.zeros(self.num_envs, dtype=bool)
        for i, env in enumerate(self.envs):
            if self._autoreset[i]:
                self._obs[i], _ = env.reset()
            else:
                self._obs[i], rewards[i], terminated[i], truncated[i], _ = env.step(actions[i])
        self._autoreset = terminated | truncated
        return self._obs.copy(), rewards, terminated, truncated, {}

    def close(self):
        for env in self.envs:
            env.close()
