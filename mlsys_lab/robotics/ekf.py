"""EKF localisation of the differential-drive robot against known landmarks.

The state is the pose ``[x, y, θ]``. **Predict** with the odometry ``u = [v, ω]`` over ``dt``
(the mean by one RK4 step of :class:`~.dynamics.DiffDrive`, the covariance with
``F = I + dt·∂f/∂x``, the odometry's noise
``M = diag(σ_v², σ_ω²)`` entering as ``G M Gᵀ`` with ``G = dt·∂f/∂u``); **update** with a
range–bearing measurement ``z = [r, φ]`` of landmark ``(l_x, l_y)``:
``h(x) = [√(dx² + dy²), atan2(dy, dx) − θ]`` with ``(dx, dy) = l − (x, y)``, its Jacobian
``H`` (by hand; checked by central differences in the tests), the innovation's bearing wrapped
to ``(−π, π]``, and the Joseph form of the covariance update.

:func:`simulate_run` makes a seeded run (true path, noisy odometry, noisy measurements of the
landmarks in range) so the filter, dead reckoning and the truth can be compared; the tests
check the filter's consistency (NEES) over many seeds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .dynamics import DiffDrive

__all__ = ["EKF", "LocalisationRun", "measure", "measurement_jacobian", "simulate_run", "wrap"]


def wrap(a):
    """Angles wrapped to ``(−π, π]``."""
    return (np.asarray(a) + np.pi) % (2 * np.pi) - np.pi


def measure(pose, landmark):
    """``[range, bearing]`` of ``landmark`` seen from ``pose``."""
    dx, dy = landmark[0] - pose[0], landmark[1] - pose[1]
    return np.array([np.hypot(dx, dy), wrap(np.arctan2(dy, dx) - pose[2])])


def measurement_jacobian(pose, landmark):
    """``∂h/∂pose`` (2 × 3) of :func:`measure`."""
    dx, dy = landmark[0] - pose[0], landmark[1] - pose[1]
    q = dx * dx + dy * dy
    r = np.sqrt(q)
    return np.array([[-dx / r, -dy / r, 0.0], [dy / q, -dx / q, -1.0]])


class EKF:
    """An extended Kalman filter for the pose.

    Args:
        x0: initial pose estimate ``(3,)``. p0: its covariance ``(3, 3)``.
        odom_std: ``(σ_v, σ_ω)`` of the odometry. meas_std: ``(σ_r, σ_φ)`` of a measurement.
    """

    def __init__(self, x0, p0, odom_std=(0.05, 0.05), meas_std=(0.1, 0.05)):
        self.x = np.asarray(x0, float).copy()
        self.p = np.asarray(p0, float).copy()
        if self.x.shape != (3,) or self.p.shape != (3, 3):
            raise ShapeError(f"EKF: x0 must be (3,) and p0 (3, 3), got {self.x.shape}, "
                             f"{self.p.shape}")
        self.m = np.diag(np.square(odom_std))
        self.r = np.diag(np.square(meas_std))
        self.robot = DiffDrive()

    def predict(self, u, dt):
        """Advance the estimate with odometry ``u = [v, ω]`` over ``dt``."""
        u = np.asarray(u, float)
        a, b = self.robot.jacobians(self.x, u)
        f = np.eye(3) + dt * a
        g = dt * b
        self.x = self.robot.step(self.x, u, dt)
        self.x[2] = wrap(self.x[2])
        self.p = f @ self.p @ f.T + g @ self.m @ g.T

    def update(self, z, landmark):
        """Correct the estimate with measurement ``z = [r, φ]`` of ``landmark``; returns the
        innovation's normalised squared length (NIS)."""
        h = measurement_jacobian(self.x, landmark)
        nu = np.asarray(z, float) - measure(self.x, landmark)
        nu[1] = wrap(nu[1])
        s = h @ self.p @ h.T + self.r
        k = self.p @ h.T @ np.linalg.inv(s)
        self.x = self.x + k @ nu
        self.x[2] = wrap(self.x[2])
        ikh = np.eye(3) - k @ h
        self.p = ikh @ self.p @ ikh.T + k @ self.r @ k.T
        return float(nu @ np.linalg.solve(s, nu))


@dataclass
class LocalisationRun:
    """A run: ``truth``, ``ekf`` (estimates), ``dead`` (dead reckoning), ``cov`` (the EKF's
    covariances), ``nees`` (normalised estimation error squared per step), ``seen``
    (measurements used per step), ``landmarks``."""

    truth: np.ndarray
    ekf: np.ndarray
    dead: np.ndarray
    cov: np.ndarray
    nees: np.ndarray
    seen: np.ndarray
    landmarks: np.ndarray


def simulate_run(seed, steps=400, dt=0.1, landmarks=None, max_range=6.0,
                 odom_std=(0.05, 0.05), meas_std=(0.1, 0.05)):
    """A seeded localisation run: the robot drives about one and a half loops; odometry and
    landmark measurements are noisy; the EKF and dead reckoning each estimate the pose."""
    rng = np.random.default_rng(seed)
    if landmarks is None:
        landmarks = np.array([[2.5, -1.0], [4.0, 3.0], [0.5, 6.0], [-3.0, 4.0], [-2.0, -0.5]])
    landmarks = np.asarray(landmarks, float)
    robot = DiffDrive()
    x = np.array([0.0, 0.0, 0.0])
    ekf = EKF(x, np.diag([1e-4, 1e-4, 1e-4]), odom_std, meas_std)
    dead = x.copy()
    truth, est, dr, cov, nees, seen = [x.copy()], [x.copy()], [x.copy()], [ekf.p.copy()], [], []
    for k in range(steps):
        u_true = np.array([0.5, 0.2 + 0.1 * np.sin(2 * np.pi * k / steps)])
        x = robot.step(x, u_true, dt)
        u_odom = u_true + rng.standard_normal(2) * odom_std
        ekf.predict(u_odom, dt)
        dead = robot.step(dead, u_odom, dt)
        n = 0
        for lm in landmarks:
            z = measure(x, lm)
            if z[0] <= max_range:
                z = z + rng.standard_normal(2) * meas_std
                ekf.update(z, lm)
                n += 1
        err = ekf.x - x
        err[2] = wrap(err[2])
        truth.append(x.copy())
        est.append(ekf.x.copy())
        dr.append(dead.copy())
        cov.append(ekf.p.copy())
        nees.append(float(err @ np.linalg.solve(ekf.p, err)))
        seen.append(n)
    return LocalisationRun(np.array(truth), np.array(est), np.array(dr), np.array(cov),
                           np.array(nees), np.array(seen), landmarks)
