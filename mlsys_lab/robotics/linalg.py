"""Small dense linear algebra the controllers need: the matrix exponential and discretisation.

``expm`` is scaling and squaring with the diagonal [6/6] Padé approximant: scale ``A`` by
``2**-s`` until its ∞-norm is at most 1/2 (the approximant's truncation error is then below
1e-16 relative), evaluate ``(D(A))⁻¹ N(A)`` and square ``s`` times. ``zoh`` discretises a
continuous linear system with a zero-order hold by the augmented-matrix trick
``expm([[A, B], [0, 0]] dt) = [[Ad, Bd], [0, I]]``; ``euler`` is the first-order contrast
``Ad = I + A dt``, ``Bd = B dt``.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError, ShapeError

__all__ = ["as_matrix", "euler", "expm", "zoh"]

_Q = 6  # Padé degree
_PADE = [math.factorial(2 * _Q - k) * math.factorial(_Q)
         / (math.factorial(2 * _Q) * math.factorial(k) * math.factorial(_Q - k))
         for k in range(_Q + 1)]


def as_matrix(a, where, name, shape=None):
    """``a`` as a float64 2-D array, or a ShapeError naming ``where`` and ``name``."""
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim != 2:
        raise ShapeError(f"{where}: {name} must be a 2-D matrix, got shape {arr.shape}")
    if shape is not None and any(s is not None and s != d for s, d in zip(shape, arr.shape)):
        raise ShapeError(f"{where}: {name} must have shape {shape}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ArgumentError(f"{where}: {name} has non-finite entries")
    return arr


def expm(a):
    """The matrix exponential ``e^A`` of a square matrix (scaling and squaring, [6/6] Padé).

    Args:
        a: ``(n, n)`` array.

    Returns:
        ``(n, n)`` float64 array.
    """
    a = as_matrix(a, "expm", "a")
    n = a.shape[0]
    if a.shape != (n, n):
        raise ShapeError(f"expm: a must be square, got shape {a.shape}")
    norm = np.abs(a).sum(axis=1).max() if n else 0.0
    s = max(0, int(math.ceil(math.log2(norm / 0.5)))) if norm > 0.5 else 0
    x = a / (2.0 ** s)
    eye = np.eye(n)
    num, den, power = _PADE[0] * eye, _PADE[0] * eye, eye
    for k in range(1, _Q + 1):
        power = power @ x
        term = _PADE[k] * power
        num = num + term
        den = den + term if k % 2 == 0 else den - term
    e = np.linalg.solve(den, num)
    for _ in range(s):
        e = e @ e
    return e


def zoh(a, b, dt):
    """Zero-order-hold discretisation: ``x[k+1] = Ad x[k] + Bd u[k]`` when ``u`` is held
    constant over each step of ``dt`` seconds.

    Args:
        a: ``(n, n)`` continuous state matrix. b: ``(n, m)`` input matrix. dt: step (s, > 0).

    Returns:
        ``(Ad, Bd)``.
    """
    a = as_matrix(a, "zoh", "a")
    n = a.shape[0]
    b = as_matrix(b, "zoh", "b", (n, None))
    if a.shape != (n, n):
        raise ShapeError(f"zoh: a must be square, got shape {a.shape}")
    if not dt > 0:
        raise ArgumentError(f"zoh: dt must be positive, got {dt}")
    m = b.shape[1]
    big = np.zeros((n + m, n + m))
    big[:n, :n], big[:n, n:] = a * dt, b * dt
    e = expm(big)
    return e[:n, :n], e[:n, n:]


def euler(a, b, dt):
    """Forward-Euler discretisation ``Ad = I + A dt``, ``Bd = B dt`` (the contrast to
    :func:`zoh`: first-order accurate, and it can turn a stable system unstable)."""
    a = as_matrix(a, "euler", "a")
    n = a.shape[0]
    b = as_matrix(b, "euler", "b", (n, None))
    if not dt > 0:
        raise ArgumentError(f"euler: dt must be positive, got {dt}")
    return np.eye(n) + a * dt, b * dt
