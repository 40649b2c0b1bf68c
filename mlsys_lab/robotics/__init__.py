"""Robotic systems in miniature (chapter 17, 机器人系统): dynamics, LQR, MPC, planning,
estimation and a ROS-2-like publish/subscribe runtime on the cluster simulator's event loop.
``README.md`` maps each concept to its module."""

from . import dynamics, linalg, lqr, planning, runtime
from .dynamics import CartPole, DiffDrive, discretize, rk4
from .linalg import euler, expm, zoh
from .lqr import closed_loop, dare, riccati_step, stability
from .planning import astar, dijkstra, follow_path
from .runtime import Runtime

__all__ = ["CartPole", "DiffDrive", "Runtime", "astar", "closed_loop", "dare", "dijkstra",
           "discretize", "dynamics", "euler", "expm", "follow_path", "linalg", "lqr",
           "planning", "riccati_step", "rk4", "runtime", "stability", "zoh"]
