"""Chapter 15, reinforcement learning systems (强化学习系统): ``solutions/ch15_reinforcement_learning.ipynb``."""
