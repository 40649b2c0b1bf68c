"""Chapter 15, reinforcement learning systems (强化学习系统):
``solutions/ch15_reinforcement_learning.ipynb``."""

from mlsys_lab.grading.exercises.ch15_reinforcement_learning import (  # noqa: F401
    ex15_1_replay_buffer,
    ex15_2_gae,
    ex15_3_fictitious_play,
)
