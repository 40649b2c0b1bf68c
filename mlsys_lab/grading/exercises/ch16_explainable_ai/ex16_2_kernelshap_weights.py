"""Exercise 16.2: KernelSHAP with the Shapley kernel, equal to the exact Shapley values.

The student writes ``shapley_kernel(M, size)`` — the Shapley kernel weight
(M - 1) / (C(M, size) size (M - size)) of a coalition of ``size`` features, ``inf`` for size 0 and
M — and ``kernel_shap(value, M)``: ``value(Z)`` gives v(z) for each row of a (n, M) 0/1 array of
coalitions. The answer enumerates the coalitions, weights each by the Shapley
kernel (M - 1) / (C(M, |z|) |z| (M - |z|)), treats the empty and full coalitions (infinite
weight) as the constraints phi_0 = v(0) and phi_0 + sum(phi) = v(1), and solves the weighted
least squares for phi (M,). With every coalition the result is exactly the Shapley values,
which the judge computes from their definition (weighted marginal contributions).

The kernel is judged directly for M = 2..9 and every size (the regression alone would not see a
constant factor, nor an answer that reaches the Shapley values without the kernel).

Wrong ideas rejected: uniform weights (LIME-like; right only for additive games — the game here
has pair and triple interactions); C(M, |z|) without the |z| (M - |z|) factor, or
|z| (M - |z|) without the binomial; an off-by-one M in the binomial or the factor (C(M + 1, |z|),
|z| (M + 1 - |z|)); dropping the empty and full coalitions without the constraints (the
intercept is then free: efficiency fails), or giving them a large finite weight (efficiency off
by ~1e-6 relative, the tolerance is 1e-8); in the kernel itself, M instead of M - 1 in the numerator
(a constant factor: the regression does not notice, the direct check does), and a large finite
number instead of ``inf`` for the empty and full coalitions.
"""

from __future__ import annotations

import math
from math import comb, factorial

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register
from mlsys_lab.grading.exercises.ch16_explainable_ai.common import expect_array, worst

# ----------------------------------------------------------------------------- inputs (both sides)


def _game(seed: int, M: int, kind: str):
    """v(Z) for (n, M) coalitions: an offset, linear terms, and (unless additive) pair and
    triple interactions."""
    rng = np.random.default_rng(16200 + seed + 13 * M + len(kind))
    v0 = 3.0 + rng.normal()
    a = rng.normal(size=M) * 2
    B = np.triu(rng.normal(size=(M, M)), 1) * (0 if kind == "additive" else 1.5)
    triple = rng.choice(M, size=min(3, M), replace=False)
    t = 0.0 if kind == "additive" else 2.0 + abs(rng.normal())

    def value(Z):
        Z = np.asarray(Z, dtype=np.float64)
        return v0 + Z @ a + np.einsum("ni,ij,nj->n", Z, B, Z) + t * Z[:, triple].prod(axis=1)
    return value


def _shapley(value, M):
    """The definition: each marginal contribution v(S + i) - v(S) weighted by
    |S|! (M - |S| - 1)! / M!, over every coalition S without i."""
    k = np.arange(2 ** M)
    Z = (k[:, None] >> np.arange(M)) & 1
    v = value(Z)
    sizes = Z.sum(axis=1)
    weight = np.array([factorial(s) * factorial(M - s - 1) / factorial(M) for s in range(M)])
    phi = np.zeros(M)
    for i in range(M):
        without = k[(k >> i) & 1 == 0]
        phi[i] = np.sum(weight[sizes[without]] * (v[without | (1 << i)] - v[without]))
    return phi


# ----------------------------------------------------------------------------- probes


def _probe(M, kind):
    def probe(shapley_kernel, kernel_shap, seed):
        game = _game(seed, M, kind)

        def value(Z):
            Z = np.asarray(Z)
            if Z.ndim != 2 or Z.shape[1] != M:
                raise ValueError(f"value takes an (n, {M}) array of coalitions, got shape "
                                 f"{Z.shape}")
            if not np.all((Z == 0) | (Z == 1)):
                raise ValueError("value takes 0/1 coalitions")
            return game(Z)

        out = attempt(kernel_shap, value, M)
        return np.array(out) if isinstance(out, np.ndarray) else out
    return probe


# ----------------------------------------------------------------------------- judges


def _judge(M, kind, what, efficiency_only=False):
    def judge(raw, seed):
        game = _game(seed, M, kind)
        phi = expect_array(raw, (M,), what)
        total = game(np.ones((1, M)))[0] - game(np.zeros((1, M)))[0]
        if efficiency_only:
            if not np.isclose(phi.sum(), total, rtol=1e-8, atol=1e-10):
                raise AssertionError(
                    f"{what}: the values sum to {phi.sum():.10g}, v(all) - v(none) = "
                    f"{total:.10g} (the empty and full coalitions are constraints, not "
                    f"ordinary rows)")
            return
        want = _shapley(game, M)
        if not np.allclose(phi, want, rtol=0, atol=1e-8 * max(1.0, np.abs(want).max())):
            raise AssertionError(f"{what}: {worst(phi, want)} against the exact Shapley values")
    return judge


def _sizes_judge(raw, seed):
    for M, s in zip((2, 3, 5, 7), range(4)):
        _judge(M, "interactions", f"M = {M}")(raw[s], seed)


def _sizes_probe(shapley_kernel, kernel_shap, seed):
    return [_probe(M, "interactions")(shapley_kernel, kernel_shap, seed) for M in (2, 3, 5, 7)]


KERNEL_M = tuple(range(2, 10))


def _kernel_probe(shapley_kernel, kernel_shap):
    out = []
    for M in KERNEL_M:
        row = []
        for size in range(M + 1):
            w = attempt(shapley_kernel, M, size)
            try:
                row.append(float(w))
            except (TypeError, ValueError):
                row.append(w)
        out.append(row)
    return out


def _kernel_judge(raw):
    if not isinstance(raw, list) or len(raw) != len(KERNEL_M):
        raise AssertionError(f"expected the weights for M = 2..9, got {describe(raw)}")
    for M, row in zip(KERNEL_M, raw):
        for size, w in enumerate(row):
            if isinstance(w, bool) or not isinstance(w, float):
                raise AssertionError(f"shapley_kernel({M}, {size}) returned {describe(w)}, "
                                     f"expected a number")
            if size in (0, M):
                if w != float("inf"):
                    raise AssertionError(
                        f"shapley_kernel({M}, {size}) = {w!r}: the empty and the full coalition "
                        f"have infinite weight (return float('inf'); kernel_shap turns them "
                        f"into constraints)")
                continue
            want = (M - 1) / (comb(M, size) * size * (M - size))
            if not math.isclose(w, want, rel_tol=1e-12):
                raise AssertionError(f"shapley_kernel({M}, {size}) = {w!r}, expected {want!r} "
                                     f"= (M - 1) / (C(M, |z|) |z| (M - |z|))")


register(
    Exercise(
        id="16.2",
        title="KernelSHAP: the Shapley kernel and its constraints",
        target=("shapley_kernel", "kernel_shap"),
        task="the Shapley kernel and KernelSHAP",
        forbidden=("mlsys_lab.explain.shapley",),
        cases=(
            Case("the Shapley kernel for M = 2..9, every coalition size", 2,
                 feedback="(M - 1) / (C(M, |z|) |z| (M - |z|)); inf for |z| = 0 and |z| = M",
                 probe=_kernel_probe, judge=_kernel_judge),
            Case("an additive game: each feature gets its own term", 1,
                 feedback="phi_i = v({i}) - v({}) when the game is additive",
                 probe=_probe(4, "additive"), judge=_judge(4, "additive", "additive game")),
            Case("efficiency: the values sum to v(all) - v(none)", 1,
                 feedback="phi_0 = v(0) and phi_0 + sum(phi) = v(1) are constraints",
                 probe=_probe(5, "interactions"),
                 judge=_judge(5, "interactions", "efficiency", efficiency_only=True)),
            Case("a game with interactions (M = 4): the exact Shapley values", 2,
                 feedback="weight (M - 1) / (C(M, |z|) |z| (M - |z|)), all coalitions",
                 probe=_probe(4, "interactions"),
                 judge=_judge(4, "interactions", "M = 4")),
            Case("M = 2, 3, 5, 7", 1,
                 feedback="the kernel for every M and every coalition size",
                 probe=_sizes_probe, judge=_sizes_judge),
        ),
    ),
)
