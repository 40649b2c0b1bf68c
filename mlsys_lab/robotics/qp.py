"""A small convex QP solver: ADMM in the style of OSQP, with cached factorisations and polishing.

Problem::

    minimise ½ zᵀHz + gᵀz   subject to   lo ≤ C z ≤ hi        (H ⪰ 0)

ADMM (Stellato et al. 2020, OSQP) splits it with ``w = Cz`` and iterates, for step ``ρ`` and
relaxation ``α``::

    z̃ = (H + σI + ρCᵀC)⁻¹ (σz − g + Cᵀ(ρw − y))
    w̃ = C z̃,   ẑ = α w̃ + (1 − α) w
    z ← α z̃ + (1 − α) z
    w ← clip(ẑ + y/ρ, lo, hi)
    y ← y + ρ (ẑ − w)

The matrix ``(H + σI + ρCᵀC)⁻¹`` depends on ``ρ`` only, so it is computed once per ``ρ`` and
kept (:class:`ADMM` caches it across solves: MPC changes ``g``, ``lo`` and ``hi`` every step,
never ``H`` or ``C``); ``ρ`` adapts to balance the primal and dual residuals, from a ladder of
values so that the cache is reused. Once the active set stops changing, *polishing* solves the
equality-constrained KKT system on it exactly and keeps the result when it is feasible and its
multipliers have the right signs, giving residuals near machine precision.

:func:`kkt_residual` is the optimality measure: the largest of the constraint violation,
the stationarity ``‖Hz + g + Cᵀy‖∞`` and the complementarity ``|y_i| × slack_i`` (with the sign
of ``y_i`` saying which bound it pushes against: negative the lower, positive the upper).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, ShapeError

__all__ = ["ADMM", "QPResult", "kkt_residual"]


def kkt_residual(h, g, c, lo, hi, z, y):
    """The KKT residual of ``(z, y)`` for the QP (see the module docstring)."""
    cz = c @ z
    primal = np.maximum(np.maximum(lo - cz, cz - hi), 0.0).max(initial=0.0)
    dual = np.abs(h @ z + g + c.T @ y).max(initial=0.0)
    with np.errstate(invalid="ignore"):
        lower = np.where(y < 0, -y * np.where(np.isfinite(lo), cz - lo, np.inf), 0.0)
        upper = np.where(y > 0, y * np.where(np.isfinite(hi), hi - cz, np.inf), 0.0)
    comp = np.abs(np.concatenate([lower, upper])).max(initial=0.0)
    return float(max(primal, dual, comp))


@dataclass
class QPResult:
    """``z`` (the solution), ``y`` (the constraint multipliers), ``iterations`` (ADMM steps),
    ``residual`` (:func:`kkt_residual`), ``status`` (``"solved"``, ``"infeasible"``: no ``z``
    meets the limits, or ``"max_iter"``),
    ``polished`` (the answer came from the active-set KKT solve) and ``objective``."""

    z: np.ndarray
    y: np.ndarray
    iterations: int
    residual: float
    status: str
    polished: bool
    objective: float


class ADMM:
    """An ADMM QP solver for fixed ``H`` and ``C`` (``g``, ``lo``, ``hi`` per solve).

    Args:
        h: ``(n, n)`` symmetric positive semi-definite. c: ``(k, n)`` constraint matrix.
        rho: initial step. sigma: the proximal term (keeps the system definite).
        alpha: over-relaxation in ``(0, 2)``. eps: target KKT residual. max_iter: ADMM steps.
        polish: try the active-set KKT solve (every ``check_every`` steps).
        factorize: cache ``(H + σI + ρCᵀC)⁻¹`` (``False``: solve the system every step, the
            unfactorised baseline).
    """

    def __init__(self, h, c, rho=0.1, sigma=1e-6, alpha=1.6, eps=1e-6, max_iter=4000,
                 polish=True, check_every=10, factorize=True):
        h = np.asarray(h, dtype=np.float64)
        c = np.asarray(c, dtype=np.float64)
        n = h.shape[0]
        if h.shape != (n, n) or c.ndim != 2 or c.shape[1] != n:
            raise ShapeError(f"ADMM: H must be (n, n) and C (k, n), got {h.shape} and {c.shape}")
        if not 0 < alpha < 2:
            raise ArgumentError(f"ADMM: alpha must be in (0, 2), got {alpha}")
        # equilibrate: every constraint row scaled to unit ∞-norm (rows of very different
        # sizes, like predicted-state limits beside input limits, stall ADMM otherwise)
        row = np.abs(c).max(axis=1) if c.size else np.ones(0)
        self.e = 1.0 / np.where(row > 0, row, 1.0)
        self.h0, self.c0 = h, c
        c = c * self.e[:, None]
        self.h, self.c, self.ct = h, c, np.ascontiguousarray(c.T)
        self.ctc = c.T @ c
        self.rho, self.sigma, self.alpha, self.eps = float(rho), sigma, alpha, eps
        self.max_iter, self.polish, self.check_every = max_iter, polish, check_every
        self.factorize = factorize
        self._inverse = {}
        self.warm = None  # (z, w, y) of the last solve

    def system(self, rho):
        return self.h + self.sigma * np.eye(len(self.h)) + rho * self.ctc

    def inverse(self, rho):
        """``(H + σI + ρCᵀC)⁻¹``, computed once per ``ρ``."""
        inv = self._inverse.get(rho)
        if inv is None:
            inv = self._inverse[rho] = np.linalg.inv(self.system(rho))
        return inv

    def solve(self, g, lo, hi, warm=None):
        """Solve for ``g``, ``lo``, ``hi``; ``warm``: a ``(z, w, y)`` start (default: none).

        Returns:
            :class:`QPResult`.
        """
        h, c = self.h, self.c
        n, k = h.shape[0], c.shape[0]
        g = np.asarray(g, dtype=np.float64)
        lo = np.asarray(lo, dtype=np.float64)
        hi = np.asarray(hi, dtype=np.float64)
        if g.shape != (n,) or lo.shape != (k,) or hi.shape != (k,):
            raise ShapeError(f"ADMM.solve: g must be ({n},), lo and hi ({k},); got {g.shape}, "
                             f"{lo.shape}, {hi.shape}")
        if np.any(lo > hi):
            raise ArgumentError("ADMM.solve: some lower bound exceeds its upper bound")
        e = self.e
        lo0, hi0, lo, hi = lo, hi, lo * e, hi * e
        if warm is not None:  # given in the caller's units
            z_, w_, y_ = warm
            warm = (z_, np.asarray(w_) * e, np.asarray(y_) / e)
        result = self._solve(g, lo, hi, warm)
        result.y = result.y * e  # back to the caller's units
        result.residual = kkt_residual(self.h0, g, self.c0, lo0, hi0, result.z, result.y)
        if result.residual > self.eps and result.status == "solved":
            result.status = "max_iter"
        return result

    def _solve(self, g, lo, hi, warm):
        h, c, ct = self.h, self.c, self.ct
        n, k = h.shape[0], c.shape[0]
        if warm is None:
            z, w, y = np.zeros(n), np.clip(np.zeros(k), lo, hi), np.zeros(k)
        else:
            z, w, y = (np.array(v, dtype=np.float64) for v in warm)
            w = np.clip(w, lo, hi)
        rho, sigma, alpha = self.rho, self.sigma, self.alpha
        inv = self.inverse(rho) if self.factorize else None
        last_active, polished_ok = None, None
        y_check = y.copy()
        it = 0
        for it in range(1, self.max_iter + 1):
            rhs = sigma * z - g + ct @ (rho * w - y)
            zt = inv @ rhs if inv is not None else np.linalg.solve(self.system(rho), rhs)
            wt = c @ zt
            wh = alpha * wt + (1 - alpha) * w
            z = alpha * zt + (1 - alpha) * z
            w_new = np.clip(wh + y / rho, lo, hi)
            y = y + rho * (wh - w_new)
            w = w_new
            if it % self.check_every:
                continue
            # OSQP's guess: lower bound active when w − lo < −y, upper when hi − w < y
            low, up = w - lo < -y, hi - w < y
            active = low.astype(np.int8) - up.astype(np.int8)
            if self.polish and (last_active is None or not np.array_equal(active, last_active)
                                or polished_ok is None):
                polished_ok = self._polish(g, lo, hi, np.flatnonzero(low), np.flatnonzero(up))
                last_active = active
                if polished_ok is not None:
                    zp, yp, res = polished_ok
                    if res <= self.eps:
                        self.warm = (zp, c @ zp, yp)
                        return QPResult(zp, yp, it, res, "solved", True,
                                        float(0.5 * zp @ h @ zp + g @ zp))
            res = kkt_residual(h, g, c, lo, hi, z, y)
            if res <= self.eps:
                self.warm = (z, w, y)
                return QPResult(z, y, it, res, "solved", False, float(0.5 * z @ h @ z + g @ z))
            if self._infeasible(y - y_check, lo, hi):
                self.warm = None
                return QPResult(z, y, it, res, "infeasible", False,
                                float(0.5 * z @ h @ z + g @ z))
            y_check = y.copy()
            # adapt rho to balance the primal and dual residuals (on a ladder of 10^(k/2))
            prim = np.abs(c @ z - w).max() / max(np.abs(c @ z).max(), np.abs(w).max(), 1e-12)
            dual = np.abs(h @ z + g + ct @ y).max() / max(np.abs(h @ z).max(),
                                                           np.abs(ct @ y).max(),
                                                           np.abs(g).max(), 1e-12)
            if prim > 0 and dual > 0:
                ratio = np.sqrt(prim / dual)
                if ratio > 5 or ratio < 0.2:
                    new = 10.0 ** (np.round(2 * np.log10(rho * ratio)) / 2)
                    new = float(np.clip(new, 1e-6, 1e6))
                    if new != rho:
                        rho = new
                        inv = self.inverse(rho) if self.factorize else None
        res = kkt_residual(h, g, c, lo, hi, z, y)
        self.warm = (z, w, y)
        status = "solved" if res <= self.eps else "max_iter"
        return QPResult(z, y, it, res, status, False, float(0.5 * z @ h @ z + g @ z))

    def _infeasible(self, dy, lo, hi, tol=1e-5):
        """OSQP's certificate of primal infeasibility: the change of ``y`` between checks,
        ``δy``, with ``Cᵀδy ≈ 0`` and ``hiᵀ max(δy, 0) + loᵀ min(δy, 0) < 0``."""
        norm = np.abs(dy).max(initial=0.0)
        if norm <= 1e-12:
            return False
        up, down = np.maximum(dy, 0.0), np.minimum(dy, 0.0)
        if np.any((up > tol * norm) & ~np.isfinite(hi)) or \
                np.any((down < -tol * norm) & ~np.isfinite(lo)):
            return False
        support = (np.where(up > 0, hi, 0.0) * up).sum() + (np.where(down < 0, lo, 0.0)
                                                             * down).sum()
        return bool(np.abs(self.ct @ dy).max() <= tol * norm and support < -tol * norm)

    def _polish(self, g, lo, hi, lower, upper):
        """Solve the KKT system with the rows ``lower`` at their lower bounds and ``upper`` at
        their upper bounds; ``(z, y, residual)`` when the result is feasible with multipliers
        of the right sign, else ``None``."""
        h, c = self.h, self.c
        n, y = h.shape[0], np.zeros(len(lo))
        rows = np.concatenate([lower, upper])
        bounds = np.concatenate([lo[lower], hi[upper]])
        ca = c[rows]
        m = len(rows)
        kkt = np.zeros((n + m, n + m))
        kkt[:n, :n] = h
        kkt[:n, n:] = ca.T
        kkt[n:, :n] = ca
        rhs = np.concatenate([-g, bounds])
        try:
            sol = np.linalg.solve(kkt, rhs)
        except np.linalg.LinAlgError:
            return None
        z = sol[:n]
        yy = np.zeros(len(y))
        yy[rows] = sol[n:]
        if np.any(yy[lower] > 0) or np.any(yy[upper] < 0):
            return None
        res = kkt_residual(h, g, c, lo, hi, z, yy)
        return z, yy, res
