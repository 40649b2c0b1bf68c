"""Distributed RL (chapter 15): IMPALA's actor-learner with V-trace, and A3C as the contrast.

Public names::

    from mlsys_lab.rl.distributed import vtrace, ActorLearner, simulate_actor_learner, simulate_a3c
"""
