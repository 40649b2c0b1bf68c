"""KernelSHAP against exact Shapley values: equal with every coalition (1e-8), and sampled
estimates within 3 standard errors over 20 seeds; the Shapley kernel and the axioms."""

from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.explain import shapley


class Game:
    """A random game on M features given as a model: a cubic polynomial of the kept features,
    with the background rows at zero (so v(z) is the polynomial of z * x)."""

    def __init__(self, M, seed):
        rng = np.random.default_rng(seed)
        self.a = rng.normal(size=M)
        self.B = rng.normal(size=(M, M))
        self.c = rng.normal(size=M)

    def __call__(self, X):
        X = np.asarray(X)
        return X @ self.a + np.einsum("ni,ij,nj->n", X, self.B, X) + (X @ self.c) ** 3


def _shapley_by_permutations(v, M):
    """The definition: average marginal contribution over all orderings (M <= 6)."""
    from itertools import permutations
    phi = np.zeros(M)
    perms = list(permutations(range(M)))
    for order in perms:
        z = np.zeros(M)
        prev = v(z[None])[0]
        for i in order:
            z[i] = 1
            cur = v(z[None])[0]
            phi[i] += cur - prev
            prev = cur
    return phi / len(perms)


@pytest.mark.parametrize("M", [2, 3, 5])
def test_exact_shapley_is_the_average_over_orderings(M):
    game = Game(M, M)
    x = np.random.default_rng(M).normal(size=M)
    exact = shapley.exact_shapley(game, x, np.zeros((1, M)))
    want = _shapley_by_permutations(lambda Z: game(Z * x), M)
    np.testing.assert_allclose(exact.attributions, want, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(M=st.integers(2, 8), seed=st.integers(0, 10_000), B=st.integers(1, 4))
def test_kernel_shap_with_every_coalition_equals_exact(M, seed, B):
    rng = np.random.default_rng(seed)
    game = Game(M, seed)
    x, bg = rng.normal(size=M), rng.normal(size=(B, M))
    exact = shapley.exact_shapley(game, x, bg)
    kernel = shapley.kernel_shap(game, x, bg)
    np.testing.assert_allclose(kernel.attributions, exact.attributions, atol=1e-8, rtol=0)
    # efficiency: phi_0 + sum(phi) = f(x), phi_0 = the background's mean output
    assert kernel.info["base_value"] + kernel.attributions.sum() == pytest.approx(
        float(game(x[None])[0]), abs=1e-9)
    assert kernel.info["base_value"] == pytest.approx(float(game(bg).mean()), abs=1e-12)
    assert kernel.forward == (2 ** M) * B


def test_kernel_shap_on_the_wine_model_equals_exact(chapter_models):
    x, bg = chapter_models.wine_x[5], chapter_models.wine_x[::15]
    exact = shapley.exact_shapley(chapter_models.wine, x, bg, target=1)
    kernel = shapley.kernel_shap(chapter_models.wine, x, bg, target=1)
    np.testing.assert_allclose(kernel.attributions, exact.attributions, atol=1e-8, rtol=0)


@pytest.mark.parametrize("paired", [True, False])
def test_sampled_kernel_shap_is_within_three_standard_errors(chapter_models, paired):
    """20 seeds of 300 sampled coalitions each: the mean estimate of every feature lies within
    3 standard errors (the seeds' spread / sqrt(20)) of the exact value, and the spread shrinks
    with more samples."""
    x, bg = chapter_models.wine_x[40], chapter_models.wine_x[::12]
    exact = shapley.exact_shapley(chapter_models.wine, x, bg, target=0).attributions
    runs = np.array([shapley.kernel_shap(chapter_models.wine, x, bg, target=0, samples=300,
                                         seed=s, paired=paired).attributions for s in range(20)])
    se = runs.std(axis=0, ddof=1) / np.sqrt(len(runs))
    assert np.all(np.abs(runs.mean(axis=0) - exact) <= 3 * se + 1e-12), (
        runs.mean(axis=0) - exact, se)
    assert np.all(se > 0)
    more = np.array([shapley.kernel_shap(chapter_models.wine, x, bg, target=0, samples=2000,
                                         seed=s, paired=paired).attributions
                     for s in range(5)])
    assert more.std(axis=0, ddof=1).mean() < runs.std(axis=0, ddof=1).mean()


def test_the_shapley_kernel():
    for M in (2, 3, 7):
        for s in range(1, M):
            assert shapley.shapley_kernel(M, s) == pytest.approx(
                (M - 1) / (comb(M, s) * s * (M - s)))
        assert shapley.shapley_kernel(M, 0) == np.inf == shapley.shapley_kernel(M, M)
    np.testing.assert_allclose(shapley.shapley_kernel(4, np.array([1, 2, 3])),
                               [0.25, 0.125, 0.25])


def test_sampled_coalition_sizes_follow_the_kernel():
    M, n = 6, 40_000
    Z = shapley.sample_coalitions(M, n, np.random.default_rng(0), paired=False)
    sizes = np.bincount(Z.sum(axis=1), minlength=M + 1)[1:M]
    k = np.arange(1, M)
    want = (1 / (k * (M - k))) / (1 / (k * (M - k))).sum()
    assert np.all(np.abs(sizes / n - want) < 4 * np.sqrt(want * (1 - want) / n))
    assert not np.any(Z.sum(axis=1) == 0) and not np.any(Z.sum(axis=1) == M)


def test_shapley_errors_name_the_function():
    game = Game(3, 0)
    with pytest.raises(ShapeError, match="exact_shapley: background must be"):
        shapley.exact_shapley(game, np.zeros(3), np.zeros((2, 4)))
    with pytest.raises(ArgumentError, match="kernel_shap: samples"):
        shapley.kernel_shap(game, np.zeros(3), np.zeros((1, 3)), samples=0)
    with pytest.raises(ArgumentError, match="shapley_kernel: sizes"):
        shapley.shapley_kernel(3, 4)


@settings(max_examples=20, deadline=None)
@given(M=st.integers(3, 7), seed=st.integers(0, 10_000))
def test_shapley_axioms_on_random_games(M, seed):
    """Symmetry (two interchangeable features get equal values), the null player (a feature the
    model ignores gets zero) and linearity (the values of f + g are the sums), for exact and
    all-coalition KernelSHAP values."""
    rng = np.random.default_rng(seed)
    game, other = Game(M, seed), Game(M, seed + 1)
    x, bg = rng.normal(size=M), rng.normal(size=(2, M))
    x[1], bg[:, 1] = x[0], bg[:, 0]

    def symmetric(X):  # ignores feature M - 1; features 0 and 1 enter symmetrically
        X = np.array(X, dtype=float)
        X[:, M - 1] = 0.0
        s = X[:, 0] + X[:, 1]
        X[:, 0] = X[:, 1] = s / 2
        return game(X)

    for fn in (shapley.exact_shapley, shapley.kernel_shap):
        phi = fn(symmetric, x, bg).attributions
        assert phi[0] == pytest.approx(phi[1], abs=1e-9)
        assert phi[M - 1] == pytest.approx(0.0, abs=1e-9)
        both = fn(lambda X: game(X) + other(X), x, bg).attributions
        np.testing.assert_allclose(both, fn(game, x, bg).attributions
                                   + fn(other, x, bg).attributions, atol=1e-9)
