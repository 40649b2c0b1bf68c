"""Chapter 17, robotic systems (机器人系统): ``solutions/ch17_robotic_systems.ipynb``."""
