"""Closed-loop simulation: a controller drives the nonlinear plant, one held input per step."""

from __future__ import annotations

import time

import numpy as np

from ..errors import ArgumentError

__all__ = ["closed_loop_sim", "lqr_policy", "saturate"]


def lqr_policy(k, u_min=-np.inf, u_max=np.inf):
    """``u = clip(−K x, u_min, u_max)``: LQR, optionally saturated by the actuator."""
    k = np.asarray(k, float)
    return lambda x: np.clip(-k @ x, u_min, u_max)


def saturate(policy, u_min, u_max):
    """The policy's input clipped to the actuator's range."""
    return lambda x: np.clip(policy(x), u_min, u_max)


def closed_loop_sim(robot, policy, x0, dt, steps, stop=None):
    """Run ``u = policy(x)`` on ``robot`` (RK4 steps of ``dt``) for ``steps`` steps.

    Args:
        robot: a :class:`~.dynamics.CartPole` or :class:`~.dynamics.DiffDrive`.
        policy: ``policy(x) -> u``.
        stop: optional ``stop(x) -> bool`` (e.g. the pole fell) ending the run early.

    Returns:
        ``dict(t=(T,), x=(T, n), u=(T-1, m), seconds=(T-1,))`` — ``seconds``: the wall time
        of each policy call.
    """
    if steps < 1 or not dt > 0:
        raise ArgumentError(f"closed_loop_sim: need steps >= 1 and dt > 0, got {steps}, {dt}")
    x = np.asarray(x0, float).copy()
    xs, us, secs = [x.copy()], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        u = np.atleast_1d(np.asarray(policy(x), float))
        secs.append(time.perf_counter() - t0)
        x = robot.step(x, u, dt)
        xs.append(x.copy())
        us.append(u)
        if stop is not None and stop(x):
            break
    xs = np.array(xs)
    return dict(t=np.arange(len(xs)) * dt, x=xs, u=np.array(us), seconds=np.array(secs))
