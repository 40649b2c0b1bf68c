"""Exercise 17.1: the discrete-time LQR gain by iterating the Riccati equation.

The student writes ``lqr_gain(A, B, Q, R)`` returning ``K`` (m × n) such that ``u = −K x``
minimises ``Σ xᵀQx + uᵀRu`` for ``x[k+1] = A x[k] + B u[k]``: iterate
``P ← Q + AᵀPA − AᵀPB (R + BᵀPB)⁻¹ BᵀPA`` from ``P = Q`` to its fixed point, then
``K = (R + BᵀPB)⁻¹ BᵀPA``.

The judge's reference is the library's :func:`mlsys_lab.robotics.lqr.dare` (itself checked
against SciPy's ``solve_discrete_are`` and python-control's ``dlqr`` to 1e-9 in
``tests/robotics/test_control.py``), compared to 1e-6 relative.

Wrong ideas rejected: the continuous-time gain ``K = R⁻¹BᵀP`` (no ``A``, no ``BᵀPB`` term);
leaving out the ``(R + BᵀPB)⁻¹`` term (``K = R⁻¹BᵀPA``); stopping after one iteration (or a
fixed handful: the slow system needs 390–860); the transposes swapped (``APAᵀ`` — the Kalman
filter's form — and ``BᵀPAᵀ``: right only for symmetric ``A``; the systems here are not);
a scalar ``1 / (R + BᵀPB)`` (the two-input systems need the matrix inverse).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register

# ----------------------------------------------------------------------------- inputs


def _system(seed: int, kind: str):
    rng = np.random.default_rng(17100 + seed * 13 + len(kind))
    if kind == "slow":
        # a mode at 0.98 that the input barely reaches: the iteration needs 390-860 steps
        # (seeds 0-299), and after 30 steps K is still off by at least 2e-3 relative
        u, _ = np.linalg.qr(rng.standard_normal((3, 3)))
        a = u @ np.diag([0.98, 0.9, 0.7]) @ u.T
        b = u @ np.array([[0.05], [rng.uniform(0.5, 1.0)], [rng.uniform(0.5, 1.0)]])
        c = rng.standard_normal((3, 3))
        return a, b, c.T @ c / 3 + 0.2 * np.eye(3), np.array([[rng.uniform(0.5, 1.5)]])
    n, m = {"stable": (3, 1), "unstable": (4, 1), "two inputs": (4, 2)}[kind]
    a = rng.standard_normal((n, n))
    radius = {"stable": 0.8, "unstable": 1.4, "two inputs": 1.2}[kind]
    a *= radius / np.abs(np.linalg.eigvals(a)).max()
    b = rng.standard_normal((n, m))
    c = rng.standard_normal((n, n))
    q = c.T @ c / n + 0.2 * np.eye(n)
    d = rng.standard_normal((m, m))
    r = d.T @ d / m + 0.5 * np.eye(m)
    return a, b, q, r


def _reference(a, b, q, r):
    from mlsys_lab.robotics.lqr import dare
    return dare(a, b, q, r).K


# ----------------------------------------------------------------------------- probes, judges


def _probe(kind):
    def probe(lqr_gain, seed):
        a, b, q, r = _system(seed, kind)
        k = lqr_gain(a.copy(), b.copy(), q.copy(), r.copy())
        return np.asarray(k, dtype=np.float64)
    return probe


def _judge(kind, what):
    def judge(raw, seed):
        a, b, q, r = _system(seed, kind)
        want = _reference(a, b, q, r)
        got = np.asarray(raw)
        if got.shape != want.shape:
            raise AssertionError(f"{what}: K should have shape {want.shape} (m × n), got "
                                 f"{describe(raw)}")
        if not np.all(np.isfinite(got)):
            raise AssertionError(f"{what}: K has non-finite entries: {describe(raw)}")
        err = np.abs(got - want).max() / np.abs(want).max()
        if err > 1e-6:
            raise AssertionError(f"{what}: K = {describe(got)}, expected {describe(want)} "
                                 f"(largest relative difference {err:.2e})")
        eig = np.abs(np.linalg.eigvals(a - b @ got)).max()
        if eig >= 1:
            raise AssertionError(f"{what}: the closed loop A − BK has spectral radius "
                                 f"{eig:.4f} ≥ 1: not stable")
    return judge


register(
    Exercise(
        id="17.1",
        title="LQR by Riccati iteration",
        target="lqr_gain",
        task="the Riccati iteration and the LQR gain",
        forbidden=("mlsys_lab.robotics.lqr",),
        cases=(
            Case("a stable system: K at the Riccati fixed point", 1.5,
                 feedback="K = (R + BᵀPB)⁻¹ BᵀPA with P the fixed point of the DARE",
                 probe=_probe("stable"), judge=_judge("stable", "a stable 3-state system")),
            Case("an unstable system: the gain stabilises it", 2,
                 feedback="iterate from P = Q until P stops changing; A − BK must be stable",
                 probe=_probe("unstable"),
                 judge=_judge("unstable", "an unstable 4-state system")),
            Case("two inputs: R + BᵀPB is a matrix", 1.5,
                 feedback="solve with the m × m matrix R + BᵀPB, not a scalar",
                 probe=_probe("two inputs"), judge=_judge("two inputs", "a two-input system")),
            Case("a slowly converging system: iterate to convergence", 1,
                 feedback="stop when P changes by less than a small tolerance, not after a "
                          "fixed few steps",
                 probe=_probe("slow"), judge=_judge("slow", "a slowly converging system")),
        ),
    ),
)
