"""Vector environments: many copies of an environment stepped as one batch (book chapter 15).

    base            VectorEnv, batch_space, the NEXT_STEP auto-reset rule (Gymnasium's default)
    sync            SyncVectorEnv: a plain loop over the copies
    processes       ProcessVectorEnv: worker processes, observations in shared memory
    cartpole_numba  NumbaCartPoleVectorEnv: one Numba kernel steps every CartPole copy

All three give the same trajectories for the same seeds (copy ``i`` seeded ``seed + i``) and
actions.
"""

from .base import NEXT_STEP, VectorEnv, batch_space
from .cartpole_numba import NumbaCartPoleVectorEnv, cartpole_batch_step
from .processes import ProcessVectorEnv, VectorEnvError
from .sync import SyncVectorEnv

__all__ = [
    "NEXT_STEP", "NumbaCartPoleVectorEnv", "ProcessVectorEnv", "SyncVectorEnv", "VectorEnv",
    "VectorEnvError", "batch_space", "cartpole_batch_step",
]
