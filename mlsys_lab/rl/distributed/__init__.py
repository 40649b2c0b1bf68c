"""Distributed RL (chapter 15): IMPALA's actor-learner with V-trace, and A3C as the contrast.

Public names::

    from mlsys_lab.rl.distributed import (vtrace, ActorLearner, A3C, simulate_actor_learner,
                                          simulate_a3c)

* ``vtrace(behaviour_logp, target_logp, rewards, discounts, values, bootstrap_value)`` — the
  V-trace targets and policy-gradient advantages (Espeholt et al. 2018).
* ``ActorLearner(env_fn, n_actors=2)`` — actor processes, a bounded queue, a V-trace learner;
  ``run(updates=...)`` gives frames/s, policy lag and episode returns; ``close()``.
* ``A3C(env_fn, n_workers=2)`` — the contrast: workers compute gradients themselves and apply
  them to shared parameters without a lock (Hogwild, shared RMSProp); same ``run``/``close``.
* ``simulate_actor_learner(n_actors)`` / ``simulate_a3c(n_actors)`` — the same systems on
  :mod:`mlsys_lab.distributed.sim`, to 1,000 actors, with the saturating resource named.
"""

from .a3c import A3C
from .actor_learner import ActorError, ActorLearner, impala_loss
from .simulated import SimulatedRun, simulate_a3c, simulate_actor_learner
from .vtrace import VTrace, vtrace

__all__ = ["vtrace", "VTrace", "ActorLearner", "A3C", "ActorError", "impala_loss",
           "simulate_actor_learner", "simulate_a3c", "SimulatedRun"]
