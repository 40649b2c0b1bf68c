"""Reinforcement learning systems (book chapter 15): environments in Gymnasium's shape, vector
environments, matrix games and their learning dynamics; agents and the distributed actor-learner
system live in ``mlsys_lab.rl.agents`` and ``mlsys_lab.rl.distributed`` (import them directly).
See ``mlsys_lab/rl/README.md`` for the map."""

from . import envs, games, vector

__all__ = ["envs", "games", "vector"]
