"""Attributions against Captum's and SHAP's (``tests/data/captum_reference.npz``, written by
``tests/data/make_captum_reference.py`` for the same float64 weights and inputs, the same
methods and step counts): saliency, gradient x input, Integrated Gradients (every rule, two
baselines), Grad-CAM on three layers, occlusion and exact Shapley values, to 1e-6."""

import numpy as np
import pytest

from mlsys_lab.explain import cam, gradients, lime, perturbation, shapley
from tests.data.make_captum_reference import (
    CAM_LAYERS,
    IG_RULES,
    LIME_SAMPLES,
    LIME_SEED,
    OCCLUSION,
    weights_digest,
)

TOL = 1e-6


def test_the_reference_was_made_for_these_weights_and_inputs(chapter_models, reference):
    np.testing.assert_allclose(weights_digest(chapter_models.digits), reference["digits_digest"])
    np.testing.assert_allclose(weights_digest(chapter_models.wine), reference["wine_digest"])
    np.testing.assert_array_equal(chapter_models.digits_x[reference["digits_index"]],
                                  reference["digits_x"])
    np.testing.assert_array_equal(chapter_models.wine_x[reference["wine_index"]],
                                  reference["wine_x"])


def _digits(reference):
    return list(zip(reference["digits_x"], reference["digits_target"].tolist()))


def test_saliency_and_gradient_x_input_match_captum(chapter_models, reference):
    for k, (x, t) in enumerate(_digits(reference)):
        np.testing.assert_allclose(gradients.saliency(chapter_models.digits, x, t).attributions,
                                   reference["saliency"][k], atol=TOL, rtol=0)
        signed = gradients.saliency(chapter_models.digits, x, t, absolute=False)
        np.testing.assert_allclose(signed.attributions, reference["saliency_signed"][k],
                                   atol=TOL, rtol=0)
        gxi = gradients.gradient_x_input(chapter_models.digits, x, t)
        np.testing.assert_allclose(gxi.attributions, reference["input_x_gradient"][k],
                                   atol=TOL, rtol=0)
        assert (signed.forward, signed.backward) == (1, 1)


def _captum_scale(rule, steps=64):
    """Captum's trapezoid weights are 1/n with the two ends halved: they sum to (n - 1)/n, not
    1 (its points are n - 1 intervals apart). Ours are the trapezoid rule's, 1/(n - 1) with the
    ends halved, so Captum's answer is ours times (n - 1)/n; the other rules agree as they are."""
    return (steps - 1) / steps if rule == "riemann_trapezoid" else 1.0


@pytest.mark.parametrize("rule", IG_RULES)
def test_integrated_gradients_match_captum_for_every_rule(chapter_models, reference, rule):
    scale = _captum_scale(rule)
    for k, (x, t) in enumerate(_digits(reference)):
        ig = gradients.integrated_gradients(chapter_models.digits, x, t, steps=64, rule=rule)
        np.testing.assert_allclose(ig.attributions * scale, reference[f"ig_{rule}"][k],
                                   atol=TOL, rtol=0)
        if scale == 1.0:  # Captum's convergence delta: sum(attributions) - (f(x) - f(x'))
            assert ig.info["completeness_error"] == pytest.approx(
                abs(reference[f"ig_{rule}_delta"][k]), abs=TOL)
        assert (ig.forward, ig.backward) == (66, 64)
        mean = gradients.integrated_gradients(chapter_models.digits, x, t, steps=64, rule=rule,
                                              baseline=reference["mean_image"])
        np.testing.assert_allclose(mean.attributions * scale,
                                   reference[f"ig_{rule}_mean_baseline"][k], atol=TOL, rtol=0)


@pytest.mark.parametrize("layer", CAM_LAYERS)
def test_grad_cam_matches_layer_grad_cam(chapter_models, reference, layer):
    for k, (x, t) in enumerate(_digits(reference)):
        got = cam.grad_cam(chapter_models.digits, x, t, layer)
        np.testing.assert_allclose(got.attributions, reference[f"grad_cam_{layer}"][k],
                                   atol=TOL, rtol=0)
        raw = cam.grad_cam(chapter_models.digits, x, t, chapter_models.digits[layer],
                           relu=False)
        np.testing.assert_allclose(raw.attributions, reference[f"grad_cam_{layer}_raw"][k],
                                   atol=TOL, rtol=0)


@pytest.mark.parametrize("name", sorted(OCCLUSION))
def test_occlusion_matches_captum(chapter_models, reference, name):
    window, strides = OCCLUSION[name]
    for k, (x, t) in enumerate(_digits(reference)):
        got = perturbation.occlusion(chapter_models.digits, x, t, window=window, strides=strides)
        np.testing.assert_allclose(got.attributions, reference[f"occlusion_{name}"][k],
                                   atol=TOL, rtol=0)
        assert got.forward == got.info["windows"] + 1


def test_exact_shapley_and_kernel_shap_match_shap(chapter_models, reference):
    bg = reference["wine_background"]
    for k, (x, t) in enumerate(zip(reference["wine_x"], reference["wine_target"].tolist())):
        exact = shapley.exact_shapley(chapter_models.wine, x, bg, t)
        np.testing.assert_allclose(exact.attributions, reference["shap_exact"][k],
                                   atol=TOL, rtol=0)
        assert exact.info["base_value"] == pytest.approx(reference["wine_base_value"][k],
                                                         abs=TOL)
        assert exact.forward == 2 ** 13 * len(bg)
        np.testing.assert_allclose(exact.attributions, reference["shap_kernel"][k],
                                   atol=TOL, rtol=0)


def test_lime_matches_the_lime_package(chapter_models, reference):
    """``lime``'s tabular explainer (regression mode, no discretisation) with the same samples:
    a ``RandomState`` seeded as its ``random_state`` draws them."""
    for k, (x, t) in enumerate(zip(reference["wine_x"], reference["wine_target"].tolist())):
        got = lime.lime_tabular(chapter_models.wine, x, chapter_models.wine_x, target=t,
                                samples=LIME_SAMPLES, seed=np.random.RandomState(LIME_SEED))
        np.testing.assert_allclose(got.attributions, reference["lime_coef"][k], atol=TOL, rtol=0)
        assert got.info["intercept"] == pytest.approx(reference["lime_intercept"][k], abs=TOL)
        assert got.info["score"] == pytest.approx(reference["lime_score"][k], abs=TOL)
