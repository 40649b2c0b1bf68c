"""Two robots as continuous-time dynamics ``ẋ = f(x, u)`` with analytic Jacobians.

* :class:`CartPole` — a pole on a cart (state ``[x, ẋ, θ, θ̇]``, ``θ = 0`` upright, input the
  horizontal force ``F`` in newtons), the equations of Barto, Sutton and Anderson (1983) as in
  Gym's ``CartPole``: with ``M = m_c + m_p`` and ``l`` the half length of the pole,
  ``t = (F + m_p l θ̇² sin θ) / M``,
  ``θ̈ = (g sin θ − t cos θ) / (l (4/3 − m_p cos² θ / M))``,
  ``ẍ = t − m_p l θ̈ cos θ / M``.
* :class:`DiffDrive` — a differential-drive (unicycle) robot, state ``[x, y, θ]``, input
  ``[v, ω]`` (forward speed, turn rate); ``wheels_to_twist`` maps wheel speeds to ``(v, ω)``.

Each has ``f(x, u)``, ``jacobians(x, u) -> (A, B)`` (∂f/∂x and ∂f/∂u, derived by hand; the
tests check them against central differences), ``linearize(x, u)`` and ``step(x, u, dt)``
(one classic Runge–Kutta step with ``u`` held: the "true" plant the controllers drive).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from .linalg import euler, zoh

__all__ = ["CartPole", "DiffDrive", "discretize", "rk4"]


def _vec(v, n, where, name):
    arr = np.asarray(v, dtype=np.float64)
    if arr.shape != (n,):
        raise ShapeError(f"{where}: {name} must have shape ({n},), got {arr.shape}")
    return arr


def rk4(f, x, u, dt):
    """One Runge–Kutta 4 step of ``ẋ = f(x, u)`` with ``u`` held for ``dt``."""
    k1 = f(x, u)
    k2 = f(x + 0.5 * dt * k1, u)
    k3 = f(x + 0.5 * dt * k2, u)
    k4 = f(x + dt * k3, u)
    return x + dt / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)


def discretize(a, b, dt, method="zoh"):
    """``(Ad, Bd)`` of ``(A, B)``: ``method="zoh"`` (exact for a held input) or ``"euler"``."""
    if method == "zoh":
        return zoh(a, b, dt)
    if method == "euler":
        return euler(a, b, dt)
    from ..errors import ArgumentError
    raise ArgumentError(f"discretize: method must be 'zoh' or 'euler', got {method!r}")


class _Robot:
    nx = nu = 0

    def linearize(self, x=None, u=None):
        """``(A, B)`` at ``(x, u)`` (default: the upright / origin equilibrium)."""
        x = np.zeros(self.nx) if x is None else x
        u = np.zeros(self.nu) if u is None else u
        return self.jacobians(x, u)

    def discrete(self, dt, x=None, u=None, method="zoh"):
        """The linearisation at ``(x, u)`` discretised with step ``dt``."""
        a, b = self.linearize(x, u)
        return discretize(a, b, dt, method)

    def step(self, x, u, dt):
        """The nonlinear plant advanced ``dt`` seconds (RK4, ``u`` held)."""
        x = _vec(x, self.nx, f"{type(self).__name__}.step", "x")
        u = _vec(u, self.nu, f"{type(self).__name__}.step", "u")
        return rk4(self.f, x, u, dt)


@dataclass(frozen=True)
class CartPole(_Robot):
    """A cart-pole; the defaults are Gym's (cart 1 kg, pole 0.1 kg, half length 0.5 m)."""

    mass_cart: float = 1.0
    mass_pole: float = 0.1
    half_length: float = 0.5
    gravity: float = 9.8
    nx = 4
    nu = 1

    def f(self, x, u):
        """``ẋ`` for state ``x = [x, ẋ, θ, θ̇]`` and input ``u = [F]``."""
        x = _vec(x, 4, "CartPole.f", "x")
        u = _vec(u, 1, "CartPole.f", "u")
        mp, l, g = self.mass_pole, self.half_length, self.gravity
        m = self.mass_cart + mp
        th, w, force = x[2], x[3], u[0]
        s, c = np.sin(th), np.cos(th)
        t = (force + mp * l * w * w * s) / m
        den = l * (4.0 / 3.0 - mp * c * c / m)
        alpha = (g * s - c * t) / den
        acc = t - mp * l * alpha * c / m
        return np.array([x[1], acc, w, alpha])

    def jacobians(self, x, u):
        """``(∂f/∂x, ∂f/∂u)`` at ``(x, u)``, shapes ``(4, 4)`` and ``(4, 1)``."""
        x = _vec(x, 4, "CartPole.jacobians", "x")
        u = _vec(u, 1, "CartPole.jacobians", "u")
        mp, l, g = self.mass_pole, self.half_length, self.gravity
        m = self.mass_cart + mp
        ml = mp * l
        th, w, force = x[2], x[3], u[0]
        s, c = np.sin(th), np.cos(th)
        t = (force + ml * w * w * s) / m
        t_th, t_w, t_f = ml * w * w * c / m, 2 * ml * w * s / m, 1.0 / m
        den = l * (4.0 / 3.0 - mp * c * c / m)
        den_th = l * 2 * mp * c * s / m
        num = g * s - c * t
        num_th = g * c + s * t - c * t_th
        alpha = num / den
        al_th = (num_th * den - num * den_th) / den ** 2
        al_w, al_f = -c * t_w / den, -c * t_f / den
        acc_th = t_th - ml / m * (al_th * c - alpha * s)
        acc_w = t_w - ml / m * c * al_w
        acc_f = t_f - ml / m * c * al_f
        a = np.array([[0.0, 1.0, 0.0, 0.0],
                      [0.0, 0.0, acc_th, acc_w],
                      [0.0, 0.0, 0.0, 1.0],
                      [0.0, 0.0, al_th, al_w]])
        b = np.array([[0.0], [acc_f], [0.0], [al_f]])
        return a, b


@dataclass(frozen=True)
class DiffDrive(_Robot):
    """A differential-drive robot: wheel radius ``radius`` and track width ``track`` (m)."""

    radius: float = 0.05
    track: float = 0.3
    nx = 3
    nu = 2

    def f(self, x, u):
        """``ẋ`` for ``x = [x, y, θ]`` and ``u = [v, ω]``."""
        x = _vec(x, 3, "DiffDrive.f", "x")
        u = _vec(u, 2, "DiffDrive.f", "u")
        return np.array([u[0] * np.cos(x[2]), u[0] * np.sin(x[2]), u[1]])

    def jacobians(self, x, u):
        """``(∂f/∂x, ∂f/∂u)``, shapes ``(3, 3)`` and ``(3, 2)``."""
        x = _vec(x, 3, "DiffDrive.jacobians", "x")
        u = _vec(u, 2, "DiffDrive.jacobians", "u")
        s, c = np.sin(x[2]), np.cos(x[2])
        a = np.array([[0.0, 0.0, -u[0] * s], [0.0, 0.0, u[0] * c], [0.0, 0.0, 0.0]])
        b = np.array([[c, 0.0], [s, 0.0], [0.0, 1.0]])
        return a, b

    def wheels_to_twist(self, left, right):
        """Wheel angular speeds (rad/s) to ``(v, ω)``."""
        v = self.radius * (right + left) / 2.0
        return v, self.radius * (right - left) / self.track

    def twist_to_wheels(self, v, w):
        """``(v, ω)`` to wheel angular speeds ``(left, right)``."""
        half = w * self.track / 2.0
        return (v - half) / self.radius, (v + half) / self.radius
