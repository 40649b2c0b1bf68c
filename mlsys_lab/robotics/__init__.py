"""Robotic systems in miniature (chapter 17, 机器人系统): dynamics, LQR, MPC, planning,
estimation and a ROS-2-like publish/subscribe runtime on the cluster simulator's event loop.
``README.md`` maps each concept to its module."""

from . import dynamics, ekf, linalg, lqr, mpc, planning, qp, robot_loop, runtime, simulate
from .dynamics import CartPole, DiffDrive, discretize, rk4
from .ekf import EKF
from .linalg import euler, expm, zoh
from .lqr import closed_loop, dare, riccati_step, stability
from .mpc import MPC, cartpole_mpc
from .planning import astar, dijkstra, follow_path
from .qp import ADMM, kkt_residual
from .robot_loop import run_loop
from .runtime import Runtime
from .simulate import closed_loop_sim, lqr_policy

__all__ = ["ADMM", "EKF", "MPC", "CartPole", "DiffDrive", "Runtime", "astar", "cartpole_mpc",
           "closed_loop", "closed_loop_sim", "dare", "dijkstra", "discretize", "dynamics", "ekf",
           "euler", "expm", "follow_path", "kkt_residual", "linalg", "lqr", "lqr_policy", "mpc",
           "planning", "qp", "riccati_step", "rk4", "robot_loop", "run_loop", "runtime",
           "simulate", "stability", "zoh"]
