"""The discrete-time linear-quadratic regulator, by iterating the Riccati equation.

For ``x[k+1] = A x[k] + B u[k]`` and the cost ``Σ xᵀQx + uᵀRu`` the optimal control is
``u = −K x`` with ``K = (R + BᵀPB)⁻¹ BᵀPA`` and ``P`` the fixed point of the discrete
algebraic Riccati equation (DARE)

    P = Q + AᵀPA − AᵀPB (R + BᵀPB)⁻¹ BᵀPA,

which :func:`dare` reaches by value iteration from ``P = Q`` (the cost-to-go of a horizon
growing by one step per iteration). It converges when ``(A, B)`` is stabilisable and
``(A, Q^½)`` detectable — unstable ``A`` included — linearly at the rate of the closed loop's
spectral radius squared. The closed loop ``A − BK`` is stable when every eigenvalue lies inside
the unit circle (:func:`stability`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, ShapeError
from .linalg import as_matrix

__all__ = ["DareResult", "Stability", "closed_loop", "dare", "lqr", "riccati_step",
           "stability"]


def _check(a, b, q, r, where):
    a = as_matrix(a, where, "A")
    n = a.shape[0]
    if a.shape != (n, n):
        raise ShapeError(f"{where}: A must be square, got shape {a.shape}")
    b = as_matrix(b, where, "B", (n, None))
    m = b.shape[1]
    q = as_matrix(q, where, "Q", (n, n))
    r = as_matrix(r, where, "R", (m, m))
    if not np.allclose(q, q.T) or np.linalg.eigvalsh((q + q.T) / 2).min() < -1e-12:
        raise ArgumentError(f"{where}: Q must be symmetric positive semi-definite")
    if not np.allclose(r, r.T) or np.linalg.eigvalsh((r + r.T) / 2).min() <= 0:
        raise ArgumentError(f"{where}: R must be symmetric positive definite")
    return a, b, q, r


def riccati_step(a, b, q, r, p):
    """One Riccati (value-iteration) step: ``(P_next, K)`` from the cost-to-go ``P``."""
    btp = b.T @ p
    k = np.linalg.solve(r + btp @ b, btp @ a)
    p_next = q + a.T @ p @ a - (a.T @ p @ b) @ k
    return (p_next + p_next.T) / 2, k


@dataclass(frozen=True)
class DareResult:
    """``P`` (the DARE's solution), ``K`` (the LQR gain), ``iterations``, ``residual``
    (``‖DARE(P) − P‖_max / max(1, ‖P‖_max)`` at the end)."""

    P: np.ndarray
    K: np.ndarray
    iterations: int
    residual: float


def dare(a, b, q, r, tol=1e-13, max_iter=100_000):
    """Solve the discrete algebraic Riccati equation by iteration from ``P = Q``.

    Args:
        a: ``(n, n)``. b: ``(n, m)``. q: ``(n, n)`` symmetric PSD. r: ``(m, m)`` SPD.
        tol: stop when a step changes ``P`` by less than ``tol`` relative to ``max(1, |P|)``.
        max_iter: give up (``ArgumentError``: not stabilisable / detectable) after this many.

    Returns:
        :class:`DareResult`.
    """
    a, b, q, r = _check(a, b, q, r, "dare")
    p = q.copy()
    for it in range(1, max_iter + 1):
        p_next, k = riccati_step(a, b, q, r, p)
        scale = max(1.0, np.abs(p_next).max())
        if not np.all(np.isfinite(p_next)) or scale > 1e150:
            break
        change = np.abs(p_next - p).max() / scale
        p = p_next
        if change < tol:
            btp = b.T @ p
            k = np.linalg.solve(r + btp @ b, btp @ a)
            return DareResult(p, k, it, change)
    raise ArgumentError(f"dare: the Riccati iteration did not converge in {max_iter} steps "
                        f"(is (A, B) stabilisable and (A, Q^1/2) detectable?)")


def lqr(a, b, q, r, **kw):
    """``(K, P)``: the LQR gain (``u = −K x``) and the DARE's solution."""
    res = dare(a, b, q, r, **kw)
    return res.K, res.P


def closed_loop(a, b, k):
    """``A − B K``."""
    return np.asarray(a, float) - np.asarray(b, float) @ np.asarray(k, float)


@dataclass(frozen=True)
class Stability:
    """The eigenvalues of a discrete-time system matrix, its spectral radius and
    ``stable = radius < 1``."""

    eigenvalues: np.ndarray
    radius: float
    stable: bool


def stability(m):
    """Stability of ``x[k+1] = M x[k]`` from the eigenvalues of ``M``."""
    m = as_matrix(m, "stability", "M")
    if m.shape[0] != m.shape[1]:
        raise ShapeError(f"stability: M must be square, got shape {m.shape}")
    eig = np.linalg.eigvals(m)
    radius = float(np.abs(eig).max()) if eig.size else 0.0
    return Stability(eig, radius, radius < 1.0)
