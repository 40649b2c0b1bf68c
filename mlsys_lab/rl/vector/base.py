"""What every vector environment here shares: the batched spaces, seeds, action checks and the
auto-reset rule.

Auto-reset is Gymnasium's default, ``NEXT_STEP``: when copy ``i`` ends an episode (terminated or
truncated) at step ``t``, step ``t`` returns that episode's last observation, reward and flags
as they are; at step ``t + 1`` the copy ignores its action, resets, and returns the new episode's
first observation with reward 0 and both flags False. So every transition a learner sees is a
real one (the final observation is there to bootstrap a truncated episode from), and the step
after an episode's end must be skipped by the learner (its action did nothing).
"""

import numpy as np

from ...errors import ArgumentError, ShapeError
from ..envs.spaces import Box, Discrete, MultiDiscrete

NEXT_STEP = "next_step"


def batch_space(space, n):
    """The space of ``n`` stacked values of ``space`` (Box -> Box, Discrete -> MultiDiscrete)."""
    if isinstance(space, Box):
        low = np.broadcast_to(space.low, (n, *space.shape))
        high = np.broadcast_to(space.high, (n, *space.shape))
        return Box(low, high, dtype=space.dtype)
    if isinstance(space, Discrete):
        if space.start != 0:
            raise ArgumentError("batch_space: a Discrete space must start at 0 to batch")
        return MultiDiscrete(np.full(n, space.n))
    raise ArgumentError(f"batch_space: cannot batch {space!r}")


def env_seeds(seed, n, where):
    """Gymnasium's rule: None -> no seeds; ``s`` -> ``s, s + 1, ...``; a list -> itself."""
    if seed is None:
        return [None] * n
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(n)]
    seeds = list(seed)
    if len(seeds) != n:
        raise ArgumentError(f"{where}: {len(seeds)} seeds given for {n} environments")
    return seeds


class VectorEnv:
    """Base class: ``num_envs`` copies of one environment stepped together.

    ``reset(seed=None) -> (obs, info)`` with ``obs`` of shape ``(num_envs, *obs_shape)``;
    ``step(actions) -> (obs, rewards, terminated, truncated, info)``, all batched (rewards
    float64, flags bool). Auto-reset mode :data:`NEXT_STEP` (see the module docstring).
    """

    autoreset_mode = NEXT_STEP
    num_envs = 0
    single_observation_space = None
    single_action_space = None

    def _set_spaces(self, observation_space, action_space):
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_space = batch_space(observation_space, self.num_envs)
        self.action_space = batch_space(action_space, self.num_envs)

    def _check_actions(self, actions, where):
        a = np.asarray(actions)
        if a.shape != (self.num_envs,) or not (np.issubdtype(a.dtype, np.integer)
                                               or a.dtype == bool):
            raise ShapeError(f"{where}: actions must be {self.num_envs} integers (shape "
                             f"({self.num_envs},)), got shape {a.shape} dtype {a.dtype}")
        n = self.single_action_space.n
        if ((a < 0) | (a >= n)).any():
            raise ArgumentError(f"{where}: actions must lie in 0..{n - 1}, got "
                                f"{a[(a < 0) | (a >= n)][:5].tolist()}")
        return a.astype(np.int64)

    def close(self):
        """Release the copies (and any processes)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return f"{type(self).__name__}(num_envs={self.num_envs})"
