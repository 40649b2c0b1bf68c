"""Robotic systems in miniature (chapter 17, 机器人系统): dynamics, LQR, MPC, planning,
estimation and a ROS-2-like publish/subscribe runtime on the cluster simulator's event loop.
``README.md`` maps each concept to its module."""

from . import dynamics, linalg, lqr
from .dynamics import CartPole, DiffDrive, discretize, rk4
from .linalg import euler, expm, zoh
from .lqr import closed_loop, dare, riccati_step, stability

__all__ = ["CartPole", "DiffDrive", "closed_loop", "dare", "discretize", "dynamics", "euler",
           "expm", "linalg", "lqr", "riccati_step", "rk4", "stability", "zoh"]
