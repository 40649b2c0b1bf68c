"""Gradient attributions: central differences, IG's completeness, the path rules, SmoothGrad,
Grad-CAM's definition and the errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.explain import cam, gradients
from mlsys_lab.explain.core import CountedModel


def _central_difference(model, x, target, h=1e-6):
    f = CountedModel(model, target)
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        g[idx] = (f.values((x + e)[None])[0] - f.values((x - e)[None])[0]) / (2 * h)
    return g


def test_saliency_is_the_gradient_by_central_differences(chapter_models):
    x = chapter_models.wine_x[3]
    got = gradients.saliency(chapter_models.wine, x, 2, absolute=False).attributions
    np.testing.assert_allclose(got, _central_difference(chapter_models.wine, x, 2), atol=1e-8)
    x = chapter_models.digits_x[7] + 0.013  # off the ReLU kinks of zero pixels
    got = gradients.saliency(chapter_models.digits, x, 7, absolute=False).attributions
    np.testing.assert_allclose(got, _central_difference(chapter_models.digits, x, 7), atol=1e-6)


def test_path_rules_integrate_polynomials():
    for rule, exact_degree in (("riemann_middle", 1), ("riemann_trapezoid", 1),
                               ("gausslegendre", 2 * 8 - 1)):
        a, w = gradients.path_rule(8, rule)
        assert w.sum() == pytest.approx(1.0)
        assert a.min() >= 0 and a.max() <= 1
        for d in range(exact_degree + 1):
            assert w @ a ** d == pytest.approx(1 / (d + 1), abs=1e-13), (rule, d)
    a, w = gradients.path_rule(4, "riemann_left")
    np.testing.assert_allclose(a, [0, .25, .5, .75])
    a, w = gradients.path_rule(4, "riemann_right")
    np.testing.assert_allclose(a, [.25, .5, .75, 1])


@pytest.mark.parametrize("rule", ["gausslegendre", "riemann_middle", "riemann_trapezoid"])
def test_ig_completeness_with_64_steps_on_a_smooth_model(chapter_models, rule):
    """The wine MLP is smooth (tanh): 64 steps leave a relative completeness error < 1e-3 for
    every input (Gauss-Legendre: at rounding level)."""
    worst = 0.0
    for i in range(0, 178, 11):
        x, t = chapter_models.wine_x[i], int(chapter_models.wine_y[i])
        ig = gradients.integrated_gradients(chapter_models.wine, x, t, steps=64, rule=rule)
        assert ig.info["delta"] == pytest.approx(
            float(chapter_models.wine(x[None]).numpy()[0, t]
                  - chapter_models.wine(np.zeros((1, 13))).numpy()[0, t]))
        assert ig.info["completeness_error"] == pytest.approx(
            abs(ig.attributions.sum() - ig.info["delta"]))
        worst = max(worst, ig.info["relative_error"])
    assert worst < (1e-12 if rule == "gausslegendre" else 1e-3), worst


def test_ig_completeness_on_the_relu_cnn_shrinks_with_steps(chapter_models):
    """A ReLU/max-pool network's gradient jumps along the path, so every rule converges only
    like 1/steps there: the error at 64 steps is about 1e-3 (not below it for every digit), and
    512 steps bring it well below."""
    errors = {n: [] for n in (16, 64, 512)}
    for i in (0, 17, 42, 123):
        x, t = chapter_models.digits_x[i], int(chapter_models.digits_y[i])
        for n in errors:
            errors[n].append(gradients.integrated_gradients(
                chapter_models.digits, x, t, steps=n, rule="riemann_middle")
                .info["relative_error"])
    med = {n: float(np.median(e)) for n, e in errors.items()}
    assert med[512] < 1e-3 and med[512] < med[64] < med[16], med


def test_ig_to_tolerance_meets_1e3_on_the_relu_cnn(chapter_models):
    """Doubling the steps until completeness holds to 1e-3 gets there for every digit tried,
    and the cost is the sum over the rounds."""
    for i in (0, 17, 42, 123, 300, 777):
        x, t = chapter_models.digits_x[i], int(chapter_models.digits_y[i])
        ig = gradients.integrated_gradients_to_tolerance(chapter_models.digits, x, t,
                                                         tolerance=1e-3)
        assert ig.info["converged"] and ig.info["relative_error"] < 1e-3
        n, rounds = ig.info["steps"], ig.info["rounds"]
        assert n == 16 * 2 ** (rounds - 1)
        assert ig.backward == sum(16 * 2 ** k for k in range(rounds))
        assert ig.forward == ig.backward + 2 * rounds
    with pytest.raises(ArgumentError, match="tolerance must be > 0"):
        gradients.integrated_gradients_to_tolerance(chapter_models.wine, np.zeros(13), 0,
                                                    tolerance=0)


def test_ig_of_a_linear_model_is_exact_with_one_step():
    w = np.array([1.5, -2.0, 0.5])

    def linear(x):
        return x @ w.reshape(3, 1)

    x, base = np.array([1.0, 2.0, 3.0]), np.array([0.5, 0.0, -1.0])
    ig = gradients.integrated_gradients(linear, x, None, baseline=base, steps=1)
    np.testing.assert_allclose(ig.attributions, w * (x - base), atol=1e-14)
    assert ig.info["completeness_error"] < 1e-12


def test_smoothgrad_averages_noisy_gradients(chapter_models):
    x = chapter_models.wine_x[9]
    sg = gradients.smoothgrad(chapter_models.wine, x, 0, samples=16, noise=0.1, seed=3)
    rng = np.random.default_rng(3)
    sigma = 0.1 * (x.max() - x.min())
    noisy = x[None] + rng.normal(0, sigma, (16, 13))
    want = np.mean([gradients.saliency(chapter_models.wine, row, 0, absolute=False)
                    .attributions for row in noisy], axis=0)
    np.testing.assert_allclose(sg.attributions, want, atol=1e-12)
    assert (sg.forward, sg.backward) == (16, 16)
    zero_noise = gradients.smoothgrad(chapter_models.wine, x, 0, samples=2, noise=0.0)
    np.testing.assert_allclose(zero_noise.attributions, gradients.saliency(
        chapter_models.wine, x, 0, absolute=False).attributions, atol=1e-14)


def test_grad_cam_is_the_weighted_activation_sum(chapter_models):
    """Grad-CAM from its definition, with the layer's gradient by central differences on the
    activation (the rest of the model run on a perturbed activation)."""
    m = chapter_models.digits
    x, t = chapter_models.digits_x[42], int(chapter_models.digits_y[42])
    head, tail = cam.split_at(m, 3)
    a = head(x[None]).numpy()
    g = _central_difference(lambda b: tail(b), a[0], t)
    want = np.maximum(np.tensordot(g.mean(axis=(1, 2)), a[0], axes=1), 0)
    got = cam.grad_cam(m, x, t, 3)
    np.testing.assert_allclose(got.attributions, want, atol=1e-6)
    assert (got.forward, got.backward) == (1, 1)
    assert cam.upsample(got.attributions, (8, 8)).shape == (8, 8)


def test_upsample_is_bilinear_and_keeps_constants():
    np.testing.assert_allclose(cam.upsample(np.full((2, 3), 4.0), (5, 7)), 4.0)
    ramp = np.arange(4.0)[None].repeat(2, 0)
    up = cam.upsample(ramp, (2, 8))
    np.testing.assert_allclose(up[0], [0, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3])


def test_errors_name_the_function_and_shapes(chapter_models):
    with pytest.raises(ShapeError, match="integrated_gradients: baseline of shape"):
        gradients.integrated_gradients(chapter_models.wine, np.zeros(13), 0,
                                       baseline=np.zeros(4))
    with pytest.raises(ArgumentError, match="path_rule: rule must be one of"):
        gradients.integrated_gradients(chapter_models.wine, np.zeros(13), 0, rule="simpson")
    with pytest.raises(ShapeError, match="saliency: target 7 is not a column"):
        gradients.saliency(chapter_models.wine, np.zeros(13), 7)
    with pytest.raises(ArgumentError, match="saliency: target must be an int"):
        gradients.saliency(chapter_models.wine, np.zeros(13), "a")
    with pytest.raises(ShapeError, match="grad_cam: layer 6's output has shape"):
        cam.grad_cam(chapter_models.digits, chapter_models.digits_x[0], 0, 6)  # flatten: (1, 32)
    with pytest.raises(ArgumentError, match="grad_cam: layer 9 is not one of"):
        cam.grad_cam(chapter_models.digits, chapter_models.digits_x[0], 0, 9)
    with pytest.raises(ArgumentError, match="grad_cam: the model must be a Sequential"):
        cam.grad_cam(lambda x: x, chapter_models.digits_x[0], 0, 0)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), d=st.integers(1, 6),
       rule=st.sampled_from(["riemann_middle", "riemann_trapezoid", "gausslegendre"]),
       steps=st.integers(2, 9))
def test_ig_is_complete_for_any_quadratic_model(seed, d, rule, steps):
    """For f(x) = x.Ax + b.x the path gradient is linear in alpha, which the midpoint,
    trapezoid and Gauss-Legendre rules integrate exactly: completeness holds to rounding with
    any number of steps, and each attribution equals its closed form."""
    rng = np.random.default_rng(seed)
    A, b = rng.normal(size=(d, d)), rng.normal(size=d)

    def quadratic(X):
        X = ml.tensor(X) if not isinstance(X, ml.Tensor) else X
        return ml.ops.sum((X @ ml.tensor(A)) * X, axis=1) + X @ ml.tensor(b)

    x, base = rng.normal(size=d), rng.normal(size=d)
    ig = gradients.integrated_gradients(quadratic, x, None, baseline=base, steps=steps, rule=rule)
    assert ig.info["completeness_error"] <= 1e-10 * max(1.0, abs(ig.info["delta"]))
    # closed form: (x - x')_i * (grad at the midpoint of the path)_i
    mid = (x + base) / 2
    np.testing.assert_allclose(ig.attributions, (x - base) * ((A + A.T) @ mid + b), atol=1e-10)


def test_grad_cam_on_a_residual_cnn_from_the_zoo():
    """Any layer of a Sequential whose output is a feature map: here a residual block (conv-BN-
    ReLU-conv-BN + shortcut) of ``nn.zoo.resnet_cnn``, in eval mode, against the definition with
    the block's gradient by central differences."""
    from mlsys_lab.explain.models import to_dtype
    from mlsys_lab.nn import zoo

    model = to_dtype(zoo.resnet_cnn(channels=4, blocks=2, image=6, seed=3)).eval()
    x = np.random.default_rng(1).uniform(0, 1, (1, 6, 6))
    head, tail = cam.split_at(model, 2)              # conv, ReLU, the first residual block
    a = head(x[None]).numpy()
    g = _central_difference(lambda b: tail(b), a[0], 4)
    want = np.maximum(np.tensordot(g.mean(axis=(1, 2)), a[0], axes=1), 0)
    np.testing.assert_allclose(cam.grad_cam(model, x, 4, 2).attributions, want, atol=1e-6)
