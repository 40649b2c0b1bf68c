"""Chapter 17, robotic systems (机器人系统): ``solutions/ch17_robotic_systems.ipynb``."""

from mlsys_lab.grading.exercises.ch17_robotic_systems import (  # noqa: F401
    ex17_1_lqr_riccati,
    ex17_2_astar,
    ex17_3_bounded_topic,
)
