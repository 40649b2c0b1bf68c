"""Experience replay: a fixed-capacity ring of transitions, sampled uniformly (DQN's buffer)."""

import numpy as np

from ...errors import ArgumentError, ShapeError


class ReplayBuffer:
    """Transitions ``(obs, action, reward, next_obs, terminated)`` in preallocated arrays.

    Storage is a ring: once ``capacity`` transitions are held, each new one overwrites the
    oldest (first in, first out). :meth:`sample` draws indices uniformly *with replacement*
    from the transitions held, so every held transition has probability ``1 / len(buffer)``
    per draw, independently of when it arrived.

    Args:
        capacity: how many transitions the buffer holds.
        obs_shape: shape of one observation, e.g. ``(4,)`` for CartPole.
        obs_dtype: dtype the observations are stored in.
        seed: seed of the buffer's own ``np.random.Generator`` (or a Generator).

    Raises:
        ArgumentError: ``capacity`` is not a positive integer.
    """

    def __init__(self, capacity, obs_shape, obs_dtype=np.float32, seed=None):
        if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) \
                or capacity < 1:
            raise ArgumentError(f"ReplayBuffer: capacity must be a positive integer, got "
                                f"{capacity!r}")
        self.capacity = int(capacity)
        self.obs_shape = tuple(obs_shape)
        self.obs = np.zeros((self.capacity, *self.obs_shape), obs_dtype)
        self.next_obs = np.zeros_like(self.obs)
        self.actions = np.zeros(self.capacity, np.int64)
        self.rewards = np.zeros(self.capacity, np.float32)
        self.terminated = np.zeros(self.capacity, np.float32)
        self.rng = seed if isinstance(seed, np.random.Generator) else \
            np.random.default_rng(seed)
        self.position = 0  # where the next transition goes
        self.size = 0
        self.added = 0  # transitions ever added

    def __len__(self):
        return self.size

    def add(self, obs, action, reward, next_obs, terminated):
        """Store one transition, evicting the oldest when full."""
        self.add_batch(np.asarray(obs)[None], np.asarray(action)[None],
                       np.asarray(reward)[None], np.asarray(next_obs)[None],
                       np.asarray(terminated)[None])

    def add_batch(self, obs, actions, rewards, next_obs, terminated):
        """Store ``n`` transitions (leading axis), as ``n`` calls of :meth:`add` would."""
        obs, next_obs = np.asarray(obs), np.asarray(next_obs)
        n = len(obs)
        if obs.shape[1:] != self.obs_shape or next_obs.shape != obs.shape:
            raise ShapeError(f"ReplayBuffer.add_batch: obs {obs.shape} and next_obs "
                             f"{next_obs.shape} must both be (n, *{self.obs_shape})")
        columns = [np.asarray(c).reshape(-1) for c in (actions, rewards, terminated)]
        if any(len(c) != n for c in columns):
            raise ShapeError(f"ReplayBuffer.add_batch: actions, rewards, terminated must have "
                             f"{n} entries, got {[len(c) for c in columns]}")
        if n > self.capacity:  # only the newest `capacity` survive
            obs, next_obs = obs[-self.capacity:], next_obs[-self.capacity:]
            columns = [c[-self.capacity:] for c in columns]
            self.added += n - self.capacity
            self.position = (self.position + n - self.capacity) % self.capacity
            n = self.capacity
        idx = (self.position + np.arange(n)) % self.capacity
        self.obs[idx], self.next_obs[idx] = obs, next_obs
        self.actions[idx], self.rewards[idx], self.terminated[idx] = columns
        self.position = (self.position + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        self.added += n

    def sample(self, batch_size):
        """``batch_size`` transitions drawn uniformly with replacement.

        Returns:
            dict with ``obs``, ``actions``, ``rewards``, ``next_obs``, ``terminated`` and the
            slot ``indices`` drawn.

        Raises:
            ArgumentError: the buffer is empty or ``batch_size`` is not a positive integer.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ArgumentError(f"ReplayBuffer.sample: batch_size must be a positive integer, "
                                f"got {batch_size!r}")
        if self.size == 0:
            raise ArgumentError("ReplayBuffer.sample: the buffer is empty")
        idx = self.rng.integers(0, self.size, size=batch_size)
        return {"obs": self.obs[idx], "actions": self.actions[idx],
                "rewards": self.rewards[idx], "next_obs": self.next_obs[idx],
                "terminated": self.terminated[idx], "indices": idx}
