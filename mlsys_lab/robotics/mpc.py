"""Model predictive control with input and state limits, as a QP solved by :mod:`.qp`'s ADMM.

At every step MPC plans ``N`` inputs ``U = [u_0 … u_{N−1}]`` for the linear model
``x[k+1] = A x[k] + B u[k]`` from the measured state ``x_0``, applies ``u_0`` and plans again
(receding horizon). The plan minimises

    Σ_{k=0}^{N−1} (x_kᵀ Q x_k + u_kᵀ R u_k) + x_Nᵀ P x_N

(``P`` the LQR cost-to-go by default, so an unconstrained plan *is* LQR) subject to
``u_min ≤ u_k ≤ u_max`` and ``x_min ≤ x_k ≤ x_max`` for ``k = 1 … N``. Condensing — writing the
predicted states as ``X = Φ x_0 + Γ U`` — makes it a dense QP in ``U`` alone::

    minimise ½ Uᵀ H U + gᵀ U,   H = 2 (Γᵀ Q̄ Γ + R̄),   g = 2 Γᵀ Q̄ Φ x_0
    subject to  [u_min; x_min − SΦx_0] ≤ [I; SΓ] U ≤ [u_max; x_max − SΦx_0]

``H`` and the constraint matrix never change, so the solver's factorisation is cached across
steps; only ``g`` and the bounds move with ``x_0``. Each step warm-starts from the previous
plan shifted by one.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, ShapeError
from .dynamics import CartPole
from .lqr import dare
from .qp import ADMM, kkt_residual

__all__ = ["MPC", "cartpole_mpc"]


class MPC:
    """A linear MPC controller with box limits on inputs and (some) states.

    Args:
        a, b: the discrete model. q, r: stage weights. horizon: ``N``.
        u_min, u_max: input limits (scalars or ``(m,)``).
        x_min, x_max: state limits (``(n,)``, ``±inf`` for unconstrained components).
        p: terminal weight (default: the DARE's solution).
        **solver: options for :class:`~.qp.ADMM` (``eps``, ``rho``, ``factorize``, ...).
    """

    def __init__(self, a, b, q, r, horizon, u_min, u_max, x_min=None, x_max=None, p=None,
                 **solver):
        a, b = np.asarray(a, float), np.asarray(b, float)
        n, m = b.shape
        if a.shape != (n, n):
            raise ShapeError(f"MPC: A must be ({n}, {n}) to match B {b.shape}, got {a.shape}")
        if not isinstance(horizon, int) or horizon < 1:
            raise ArgumentError(f"MPC: horizon must be a positive int, got {horizon!r}")
        q, r = np.asarray(q, float), np.asarray(r, float)
        p = dare(a, b, q, r).P if p is None else np.asarray(p, float)
        self.a, self.b, self.n, self.m, self.N = a, b, n, m, horizon
        self.u_min = np.broadcast_to(np.asarray(u_min, float), (m,)).copy()
        self.u_max = np.broadcast_to(np.asarray(u_max, float), (m,)).copy()
        x_min = np.full(n, -np.inf) if x_min is None else np.asarray(x_min, float)
        x_max = np.full(n, np.inf) if x_max is None else np.asarray(x_max, float)
        if x_min.shape != (n,) or x_max.shape != (n,):
            raise ShapeError(f"MPC: x_min and x_max must have shape ({n},)")
        self.x_min, self.x_max = x_min, x_max
        N = horizon
        # prediction: X = Phi x0 + Gamma U, X = [x1; ...; xN]
        phi = np.zeros((N * n, n))
        gamma = np.zeros((N * n, N * m))
        power = np.eye(n)
        powers = []
        for k in range(N):
            powers.append(power)
            power = a @ power
            phi[k * n:(k + 1) * n] = power
        for k in range(N):
            for j in range(k + 1):
                gamma[k * n:(k + 1) * n, j * m:(j + 1) * m] = powers[k - j] @ b
        qbar = np.kron(np.eye(N), q)
        qbar[-n:, -n:] = p
        rbar = np.kron(np.eye(N), r)
        self.phi, self.gamma = phi, gamma
        self.h = 2 * (gamma.T @ qbar @ gamma + rbar)
        self.h = (self.h + self.h.T) / 2
        self.f = 2 * gamma.T @ qbar @ phi  # g = f x0
        limited = np.flatnonzero(np.isfinite(x_min) | np.isfinite(x_max))
        self.limited = limited
        sel = np.zeros((N * len(limited), N * n))
        for k in range(N):
            for i, s in enumerate(limited):
                sel[k * len(limited) + i, k * n + s] = 1.0
        self.sel_phi = sel @ phi
        self.c = np.vstack([np.eye(N * m), sel @ gamma])
        self.xlo = np.tile(x_min[limited], N)
        self.xhi = np.tile(x_max[limited], N)
        self.solver = ADMM(self.h, self.c, **solver)
        self.last, self.shift, self.fallbacks = None, 0, 0

    def qp(self, x0):
        """``(H, g, C, lo, hi)`` of the plan from ``x0``."""
        x0 = np.asarray(x0, float)
        if x0.shape != (self.n,):
            raise ShapeError(f"MPC.qp: x0 must have shape ({self.n},), got {x0.shape}")
        g = self.f @ x0
        off = self.sel_phi @ x0
        lo = np.concatenate([np.tile(self.u_min, self.N), self.xlo - off])
        hi = np.concatenate([np.tile(self.u_max, self.N), self.xhi - off])
        return self.h, g, self.c, lo, hi

    def solve(self, x0, warm=True):
        """Plan from ``x0``: a :class:`~.qp.QPResult` whose ``z`` is ``U`` (``N·m``)."""
        _, g, _, lo, hi = self.qp(x0)
        start = None
        if warm and self.last is not None:  # the last plan, shifted by one step
            z, _, y = self.last
            m, nu = self.m, self.N * self.m
            zs = np.concatenate([z[m:], z[-m:]])
            ys = np.concatenate([y[m:nu], y[nu - m:nu], self._shift_states(y[nu:])])
            start = (zs, self.c @ zs, ys)
        res = self.solver.solve(g, lo, hi, warm=start)
        if res.status == "solved":
            self.last = (res.z, self.c @ res.z, res.y)
            self.shift = 0
        return res

    def _shift_states(self, y):
        k = len(self.limited)
        if k == 0:
            return y
        return np.concatenate([y[k:], y[-k:]])

    def control(self, x0):
        """The first input of the plan from ``x0``. When the limits cannot be met from ``x0``
        (the QP is infeasible: hard state limits and a plant that differs from the model), the
        controller falls back on the last feasible plan, one step further along each time
        (``fallbacks`` counts them)."""
        res = self.solve(x0)
        if res.status == "solved":
            return res.z[:self.m]
        self.fallbacks += 1
        if self.last is None:
            return np.clip(res.z[:self.m], self.u_min, self.u_max)
        self.shift = min(self.shift + 1, self.N - 1)
        return self.last[0][self.shift * self.m:(self.shift + 1) * self.m]

    def predict(self, x0, u):
        """Predicted states ``(N, n)`` of the linear model for the plan ``u`` (``N·m``)."""
        return (self.phi @ np.asarray(x0, float) + self.gamma @ np.asarray(u, float)).reshape(
            self.N, self.n)

    def residual(self, x0, res):
        """The KKT residual of ``res`` for the plan from ``x0``."""
        h, g, c, lo, hi = self.qp(x0)
        return kkt_residual(h, g, c, lo, hi, res.z, res.y)


def cartpole_mpc(horizon=20, dt=0.02, u_max=10.0, x_max=1.0, theta_max=0.4, **solver):
    """MPC of the cart-pole (Gym's parameters) balanced upright: ``|F| ≤ u_max`` N, cart
    ``|x| ≤ x_max`` m, pole ``|θ| ≤ theta_max`` rad; ``Q = diag(1, 1, 10, 1)``, ``R = 0.1``."""
    a, b = CartPole().discrete(dt)
    inf = np.inf
    return MPC(a, b, np.diag([1.0, 1.0, 10.0, 1.0]), np.array([[0.1]]), horizon,
               -u_max, u_max, x_min=np.array([-x_max, -inf, -theta_max, -inf]),
               x_max=np.array([x_max, inf, theta_max, inf]), **solver)
