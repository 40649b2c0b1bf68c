"""Exercise 16.1: Integrated Gradients, complete to 1e-3 with the steps it is given.

The student writes ``integrated_gradients(grad_f, x, baseline, steps)``: ``grad_f(points)``
returns the gradient of the model's output at each of a batch of points (k, *x.shape); the
answer is (x - x') times the average gradient along the straight path from x' to x, the
integral approximated with at most ``steps + 1`` gradient evaluations. The judge computes the
exact path integral (400-point Gauss-Legendre on an analytic model) and f itself.

Wrong ideas rejected: the gradient at x only, times (x - x') (exact for a linear model only: it
fails completeness on the smooth model); the average gradient without the (x - x') factor, or
averaging the path gradients with no scaling at all (fails the linear model); a left (or right)
Riemann sum with 64 steps (relative completeness error ~1e-2 on the smooth model, the bound is
1e-3); equally spaced points including both ends each weighted 1/steps (Captum's
``riemann_trapezoid``: the weights sum to (n - 1)/n, 1.6 % short at 64 steps); x times the
average gradient, or a path starting at 0 instead of the baseline (fails the non-zero
baseline); many more gradient evaluations than allowed to make a crude rule accurate (the
gradients are counted).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, register
from mlsys_lab.grading.exercises.ch16_explainable_ai.common import expect_array, worst

STEPS = 64

# ----------------------------------------------------------------------------- inputs (both sides)


def _model(seed: int, kind: str, shape):
    """(f, grad_f) on inputs of ``shape``: linear, or a sum of tanh units plus a square."""
    rng = np.random.default_rng(16100 + seed + 31 * len(kind))
    d = int(np.prod(shape))
    if kind == "linear":
        w = rng.normal(size=d)

        def f(P):
            return P.reshape(len(P), -1) @ w

        def grad(P):
            return np.broadcast_to(w, (len(P), d)).reshape((len(P),) + tuple(shape)).copy()
        return f, grad
    W = rng.normal(size=(d, 6)) * 1.2
    a, b, c = rng.normal(size=6) * 2, rng.normal(size=6), rng.normal(size=d) * 0.5

    def f(P):
        X = P.reshape(len(P), -1)
        return np.tanh(X @ W + b) @ a + 0.5 * (X @ c) ** 2

    def grad(P):
        X = P.reshape(len(P), -1)
        g = ((1 - np.tanh(X @ W + b) ** 2) * a) @ W.T + (X @ c)[:, None] * c
        return g.reshape(P.shape)
    return f, grad


def _rule(grad, x, base, alphas, weights=None):
    """(x - x') times the weighted average gradient at x' + a (x - x') for each a in ``alphas``
    (equal weights by default)."""
    path = base[None] + alphas.reshape((-1,) + (1,) * x.ndim) * (x - base)[None]
    g = grad(path)
    return (x - base) * (g.mean(axis=0) if weights is None else np.tensordot(weights, g, axes=1))


def _exact_ig(grad, x, base, n=400):
    nodes, weights = np.polynomial.legendre.leggauss(n)
    return _rule(grad, x, base, (nodes + 1) / 2, weights / 2)


def _discriminating(f, grad, x, base) -> bool:
    """True when these inputs tell the rules apart: ``f(x) - f(x')`` is not small (the bound
    is relative to it), the midpoint rule with 64 steps is well inside the bounds (so is any
    correct rule of at least its order), and the left and right Riemann sums are well outside.
    Without this, about 8 % of seeds had a tiny ``f(x) - f(x')`` or a tanh unit so steep along
    the path that the reference missed 1e-3, and a few let a left Riemann sum through."""
    delta = float(f(x[None])[0] - f(base[None])[0])
    if abs(delta) < 1.0:
        return False
    exact = _exact_ig(grad, x, base)
    n = STEPS
    mid = _rule(grad, x, base, (np.arange(n) + 0.5) / n)
    if np.abs(mid - exact).max() > 2e-4 * np.abs(exact).max() or \
            abs(mid.sum() - delta) > 2e-4 * abs(delta):
        return False
    return all(abs(_rule(grad, x, base, a).sum() - delta) >= 5e-3 * abs(delta)
               for a in (np.arange(n) / n, np.arange(1, n + 1) / n))


def _inputs(seed: int, kind: str, shape, zero_baseline=True):
    rng = np.random.default_rng(16150 + seed + 7 * len(kind) + len(shape))
    f, grad = _model(seed, kind, shape)
    for _ in range(1000):
        x = rng.normal(size=shape) * 1.5
        base = np.zeros(shape) if zero_baseline else rng.normal(size=shape)
        if kind == "linear" or _discriminating(f, grad, x, base):
            return x, base
    raise RuntimeError(f"16.1: no discriminating input for seed {seed}")  # never seen


# ----------------------------------------------------------------------------- probes


def _probe(kind, shape, zero_baseline=True):
    def probe(integrated_gradients, seed):
        f, grad = _model(seed, kind, shape)
        x, base = _inputs(seed, kind, shape, zero_baseline)
        used = []

        def grad_f(points):
            points = np.asarray(points, dtype=np.float64)
            if points.ndim != x.ndim + 1 or points.shape[1:] != x.shape:
                raise ValueError(f"grad_f takes a batch of points of shape (k, *{x.shape}), "
                                 f"got {points.shape}")
            used.append(len(points))
            return grad(points)

        out = attempt(integrated_gradients, grad_f, x.copy(), base.copy(), STEPS)
        return {"attributions": out if not isinstance(out, np.ndarray) else np.array(out),
                "gradients": int(sum(used))}
    return probe


# ----------------------------------------------------------------------------- judges


def _judge(kind, shape, zero_baseline=True, what="", completeness_only=False):
    def judge(raw, seed):
        f, grad = _model(seed, kind, shape)
        x, base = _inputs(seed, kind, shape, zero_baseline)
        attr = expect_array(raw["attributions"], shape, what)
        delta = float(f(x[None])[0] - f(base[None])[0])
        if completeness_only:
            err = abs(attr.sum() - delta) / abs(delta)
            if err >= 1e-3:
                raise AssertionError(
                    f"{what}: the attributions sum to {attr.sum():.6g} but f(x) - f(x') = "
                    f"{delta:.6g} (relative error {err:.2g}, the bound is 1e-3 with {STEPS} "
                    f"steps)")
            return
        want = _exact_ig(grad, x, base)
        scale = np.abs(want).max()
        if not np.allclose(attr, want, rtol=0, atol=1e-3 * scale):
            raise AssertionError(f"{what}: {worst(attr, want)}; the tolerance is 1e-3 of the "
                                 f"largest attribution ({1e-3 * scale:.3g})")
    return judge


def _count_judge(raw, seed):
    used = raw["gradients"]
    if used > STEPS + 1:
        raise AssertionError(f"your function evaluated {used} gradients for steps={STEPS}; at "
                             f"most steps + 1 = {STEPS + 1} are allowed")
    if used == 0:
        raise AssertionError("your function never called grad_f")


register(
    Exercise(
        id="16.1",
        title="Integrated Gradients with completeness",
        target="integrated_gradients",
        task="Integrated Gradients",
        forbidden=("mlsys_lab.explain.gradients",),
        cases=(
            Case("a linear model: attributions are w * (x - x')", 1,
                 feedback="(x - x') times the average gradient along the path",
                 probe=_probe("linear", (5,)), judge=_judge("linear", (5,), what="linear")),
            Case("a smooth model: complete to 1e-3 with 64 steps", 2,
                 feedback="sum(attributions) = f(x) - f(x'); a left Riemann sum is too crude",
                 probe=_probe("smooth", (6,)),
                 judge=_judge("smooth", (6,), what="completeness", completeness_only=True)),
            Case("every attribution equals the path integral (image-shaped x)", 2,
                 feedback="each feature's (x_i - x'_i) * average of d f / d x_i on the path",
                 probe=_probe("smooth", (3, 4)),
                 judge=_judge("smooth", (3, 4), what="a (3, 4) input")),
            Case("a non-zero baseline: the path starts at x'", 1.5,
                 feedback="points x' + a (x - x'), attributions (x - x') * average gradient",
                 probe=_probe("smooth", (6,), zero_baseline=False),
                 judge=_judge("smooth", (6,), False, what="a non-zero baseline")),
            Case("at most steps + 1 gradient evaluations", 0.5,
                 feedback=f"steps={STEPS}: use at most {STEPS + 1} points on the path",
                 probe=_probe("smooth", (6,)), judge=_count_judge),
        ),
    ),
)
