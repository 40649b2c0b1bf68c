"""The environment interface in Gymnasium's shape.

``reset(seed=None, options=None) -> (obs, info)``; ``step(action) -> (obs, reward, terminated,
truncated, info)``. ``terminated`` means the MDP reached a terminal state (no future reward: the
value of the next state is 0); ``truncated`` means the episode was cut short from outside (a
time limit), so the next state still has a value a learner should bootstrap from.

Seeding follows Gymnasium: ``reset(seed=s)`` replaces :attr:`Env.np_random` with a generator made
from ``s``; ``reset()`` without a seed keeps using the current generator, so a run seeded once
and reset many times is reproducible.
"""

from .seeding import np_random


class Env:
    """Base class of an environment (subclasses implement ``step`` and ``reset``).

    Attributes:
        observation_space: the :mod:`~mlsys_lab.rl.envs.spaces` space observations belong to.
        action_space: the space actions belong to.
        np_random: the environment's generator (seeded at random if used before any seed).
    """

    observation_space = None
    action_space = None
    metadata = {}
    _np_random = None
    np_random_seed = None

    @property
    def np_random(self):
        if self._np_random is None:
            self._np_random, self.np_random_seed = np_random(None)
        return self._np_random

    @np_random.setter
    def np_random(self, generator):
        self._np_random, self.np_random_seed = generator, -1

    def reset(self, *, seed=None, options=None):
        """Start an episode. Subclasses call ``super().reset(seed=seed)`` first, which reseeds
        :attr:`np_random` when ``seed`` is given."""
        if seed is not None:
            self._np_random, self.np_random_seed = np_random(seed)

    def step(self, action):  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self):
        """Release what the environment holds (nothing, for the environments here)."""

    @property
    def unwrapped(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
