"""Occlusion and RISE from their definitions; LIME recovers a linear model."""

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.explain import lime, perturbation


def pixel_model(r, c):
    """A 'model' whose single output is the pixel (r, c) of its (1, H, W) input."""
    def f(X):
        return np.asarray(X)[:, 0, r, c][:, None]
    return f


def test_occlusion_of_a_linear_model_is_weight_times_input():
    """For f(x) = w . x and 1x1 windows, occluding a pixel drops f by w_i x_i exactly."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(1, 5, 6))
    x = rng.normal(size=(1, 5, 6))

    def linear(X):
        return (np.asarray(X) * w).reshape(len(X), -1).sum(axis=1)

    occ = perturbation.occlusion(linear, x, None, window=1, strides=1)
    np.testing.assert_allclose(occ.attributions, w * x, atol=1e-12)
    assert occ.forward == 31
    big = perturbation.occlusion(linear, x, None, window=(1, 2, 3), strides=(1, 1, 2))
    # every window's drop is the sum of w x over the window; each pixel averages its windows
    total, count = np.zeros_like(x), np.zeros_like(x)
    for sl in perturbation.occlusion_windows(x.shape, (1, 2, 3), (1, 1, 2)):
        total[sl] += (w * x)[sl].sum()
        count[sl] += 1
    np.testing.assert_allclose(big.attributions, total / count, atol=1e-12)


def test_occlusion_windows_cover_the_input_like_captum():
    wins = list(perturbation.occlusion_windows((1, 8, 8), (1, 3, 3), (1, 2, 2)))
    assert len(wins) == 1 * 4 * 4  # ceil((8 - 3) / 2) + 1 = 4 positions per axis
    assert wins[-1][1] == slice(6, 8)  # the last window is cut at the edge
    with pytest.raises(ArgumentError, match="occlusion: strides"):
        perturbation.occlusion(pixel_model(0, 0), np.zeros((1, 8, 8)), None, window=(1, 2, 2),
                               strides=(1, 3, 3))
    with pytest.raises(ShapeError, match="occlusion: window"):
        perturbation.occlusion(pixel_model(0, 0), np.zeros((1, 4, 4)), None, window=(1, 5, 5))


def test_rise_is_its_definition_and_finds_the_pixel_that_matters():
    x = np.ones((1, 8, 8))
    sal = perturbation.rise(pixel_model(2, 5), x, None, masks=400, seed=4)
    masks = perturbation.rise_masks(400, (8, 8), seed=4)
    want = np.tensordot(masks[:, 2, 5], masks, axes=1) / (400 * 0.5)
    np.testing.assert_allclose(sal.attributions, want, atol=1e-12)
    assert np.unravel_index(np.argmax(sal.attributions), (8, 8)) == (2, 5)
    assert sal.forward == 400
    assert masks.min() >= 0 and masks.max() <= 1
    assert abs(perturbation.rise_masks(2000, (8, 8), p=0.3, seed=1).mean() - 0.3) < 0.02


def test_rise_and_occlusion_on_the_digits_cnn_agree_roughly(chapter_models):
    x, t = chapter_models.digits_x[17], int(chapter_models.digits_y[17])
    occ = perturbation.occlusion(chapter_models.digits, x, t, window=(1, 2, 2))
    r = perturbation.rise(chapter_models.digits, x, t, masks=1000)
    corr = np.corrcoef(occ.attributions[0].ravel(), r.attributions.ravel())[0, 1]
    assert corr > 0.3, corr


def test_lime_recovers_a_linear_models_coefficients():
    rng = np.random.default_rng(1)
    M = 6
    w, b = rng.normal(size=M) * 3, 0.7
    data = rng.normal(size=(300, M)) * rng.uniform(0.5, 4, M) + rng.normal(size=M)

    def linear(X):
        return np.asarray(X) @ w + b

    x = data[5]
    exact = lime.lime_tabular(linear, x, data, alpha=0.0, samples=200)
    np.testing.assert_allclose(exact.info["coefficients"], w, atol=1e-9)
    assert exact.info["score"] == pytest.approx(1.0)
    assert exact.info["local_prediction"] == pytest.approx(float(linear(x[None])[0]))
    ridge = lime.lime_tabular(linear, x, data)  # lime's defaults: ridge alpha = 1, 5000 rows
    np.testing.assert_allclose(ridge.info["coefficients"], w, rtol=2e-3)
    assert ridge.forward == 5000


def test_lime_with_a_narrow_kernel_is_the_local_gradient(chapter_models):
    from mlsys_lab.explain import gradients
    x = chapter_models.wine_x[20]
    # 'training data' in a small cloud around x: the samples stay where the model is linear
    data = x + 0.01 * np.random.default_rng(2).normal(size=(200, 13))
    local = lime.lime_tabular(chapter_models.wine, x, data, target=0, around_instance=True,
                              alpha=0.0, samples=2000, seed=2)
    g = gradients.saliency(chapter_models.wine, x, 0, absolute=False).attributions
    np.testing.assert_allclose(local.info["coefficients"], g, atol=0.02 * np.abs(g).max())


def test_weighted_ridge_matches_the_normal_equations():
    rng = np.random.default_rng(3)
    X, y, w = rng.normal(size=(50, 4)), rng.normal(size=50), rng.uniform(0.1, 2, 50)
    coef, icpt = lime.weighted_ridge(X, y, w, alpha=0.5)
    A = np.hstack([X, np.ones((50, 1))])
    P = np.diag([0.5] * 4 + [0.0])
    theta = np.linalg.solve(A.T @ (A * w[:, None]) + P, A.T @ (w * y))
    np.testing.assert_allclose(np.r_[coef, icpt], theta, atol=1e-10)


def test_bad_inputs_get_errors_that_name_the_function(chapter_models):
    x = chapter_models.wine_x[0]
    with pytest.raises(ShapeError, match=r"lime_tabular: data must be \(n, 13\)"):
        lime.lime_tabular(chapter_models.wine, x, np.zeros((5, 4)))
    with pytest.raises(ArgumentError, match="lime_tabular: kernel_width must be > 0"):
        lime.lime_tabular(chapter_models.wine, x, chapter_models.wine_x, kernel_width=-1.0)
    with pytest.raises(ArgumentError, match="lime_tabular: samples must be an int >= 2"):
        lime.lime_tabular(chapter_models.wine, x, chapter_models.wine_x, samples=1)
    with pytest.raises(ShapeError, match=r"rise: x must be one \(C, H, W\) image"):
        perturbation.rise(chapter_models.wine, x, 0)
    with pytest.raises(ArgumentError, match=r"rise: p must be in \(0, 1\]"):
        perturbation.rise(pixel_model(0, 0), np.ones((1, 4, 4)), None, p=0.0)
    with pytest.raises(ArgumentError, match="weighted_ridge: alpha must be >= 0"):
        lime.weighted_ridge(np.zeros((3, 2)), np.zeros(3), np.ones(3), alpha=-1)
