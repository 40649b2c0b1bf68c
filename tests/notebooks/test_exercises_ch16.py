"""Exercises of chapter 16 test the idea: the references score full marks on every seed, the
library's explainers are refused, and each wrong idea listed in the exercise modules of
``mlsys_lab/grading/exercises/ch16_explainable_ai/`` scores 0 on the cases that name it.

Everything runs in process with ``run_cases`` (the probe -> wire -> judge round trip of the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.grading.core.check import run_cases

from ..exercise_results import fails, fails_only, full, refused

SEEDS = [0, 1, 7, 12345]


# ============================================================================= 16.1 IG
def integrated_gradients(grad_f, x, baseline, steps, *, rule="middle", factor=True,
                         at_input=False, scale=True, from_zero=False):
    start = np.zeros_like(x) if from_zero else baseline
    if at_input:
        return grad_f(x[None])[0] * (x - baseline)
    if rule == "middle":
        alphas, weights = (np.arange(steps) + 0.5) / steps, np.full(steps, 1.0 / steps)
    elif rule == "left":
        alphas, weights = np.arange(steps) / steps, np.full(steps, 1.0 / steps)
    elif rule == "captum trapezoid":
        alphas, weights = np.linspace(0, 1, steps), np.full(steps, 1.0 / steps)
        weights[[0, -1]] /= 2
    elif rule == "fine middle":
        n = 10 * steps
        alphas, weights = (np.arange(n) + 0.5) / n, np.full(n, 1.0 / n)
    path = start + alphas.reshape((-1,) + (1,) * x.ndim) * (x - start)
    g = grad_f(path)
    avg = np.tensordot(weights, g, axes=1) if scale else g.sum(axis=0)
    if not factor:
        return avg
    return (x if from_zero == "x" else x - start) * avg


def _ig(**how):
    return lambda grad_f, x, baseline, steps: integrated_gradients(grad_f, x, baseline, steps,
                                                                  **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_ig_reference_scores_full_marks(seed):
    full(run_cases("16.1", integrated_gradients, seed=seed))


def test_ig_gauss_legendre_scores_full_marks_too():
    def gl(grad_f, x, baseline, steps):
        nodes, weights = np.polynomial.legendre.leggauss(steps)
        path = baseline + ((nodes + 1) / 2).reshape((-1,) + (1,) * x.ndim) * (x - baseline)
        return (x - baseline) * np.tensordot(weights / 2, grad_f(path), axes=1)
    full(run_cases("16.1", gl, seed=3))


@pytest.mark.parametrize("how, failing", [
    ({"at_input": True}, ("a smooth model", "every attribution", "a non-zero baseline")),
    ({"factor": False}, ("a linear model", "a smooth model", "every attribution")),
    ({"scale": False}, ("a linear model", "a smooth model", "every attribution")),
    ({"rule": "left"}, ("a smooth model", "every attribution")),
    ({"rule": "captum trapezoid"}, ("a linear model", "a smooth model", "every attribution")),
    ({"from_zero": True}, ("a non-zero baseline",)),
    ({"from_zero": "x"}, ("a non-zero baseline",)),
], ids=["gradient at x", "no (x - x')", "no scaling", "left Riemann", "captum trapezoid",
        "path from 0", "x times average"])
def test_ig_wrong_ideas_fail(how, failing):
    fails(run_cases("16.1", _ig(**how), seed=5), *failing)


def test_ig_with_many_more_gradients_than_allowed_fails_only_the_count():
    fails_only(run_cases("16.1", _ig(rule="fine middle"), seed=5), "at most steps + 1")


def test_ig_through_the_library_is_refused():
    from mlsys_lab.explain import gradients

    def through_the_library(grad_f, x, baseline, steps):
        gradients.path_rule(steps, "riemann_middle")
        return integrated_gradients(grad_f, x, baseline, steps)

    assert refused(run_cases("16.1", through_the_library, seed=0)), "the library ran"


# ============================================================================= 16.2 KernelSHAP
def shapley_kernel(M, size, *, numerator="M - 1", ends=float("inf"), weighting="shapley"):
    if size in (0, M):
        return ends
    return {"shapley": {"M - 1": M - 1, "M": M}[numerator] / (comb(M, size) * size * (M - size)),
            "uniform": 1.0,
            "binomial only": 1.0 / comb(M, size),
            "no binomial": 1.0 / (size * (M - size)),
            "M + 1": (M - 1) / (comb(M + 1, size) * size * (M - size)),
            "M + 1 factor": (M - 1) / (comb(M, size) * size * (M + 1 - size))}[weighting]


def kernel_shap(value, M, *, weighting="shapley", ends="constraints"):
    k = np.arange(1, 2 ** M - 1)
    Z = ((k[:, None] >> np.arange(M)) & 1).astype(float)
    s = Z.sum(axis=1).astype(int)
    binom = np.array([comb(M, int(n)) for n in s], dtype=float)
    w = {"shapley": (M - 1) / (binom * s * (M - s)),
         "uniform": np.ones(len(s)),
         "binomial only": 1.0 / binom,
         "no binomial": 1.0 / (s * (M - s)),
         "M + 1": (M - 1) / (np.array([comb(M + 1, int(n)) for n in s]) * s * (M - s)),
         "M + 1 factor": (M - 1) / (binom * s * (M + 1 - s))}[weighting]
    v0, v1 = value(np.zeros((1, M)))[0], value(np.ones((1, M)))[0]
    v = value(Z)
    if ends == "constraints":
        y = v - v0 - Z[:, -1] * (v1 - v0)
        X = Z[:, :-1] - Z[:, -1:]
        sw = np.sqrt(w)
        head = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)[0]
        return np.append(head, v1 - v0 - head.sum())
    A = np.hstack([np.ones((len(Z), 1)), Z])
    if ends == "big weight":
        A = np.vstack([A, np.r_[1.0, np.zeros(M)], np.ones(M + 1)])
        v, w = np.r_[v, v0, v1], np.r_[w, 1e6, 1e6]
    sw = np.sqrt(w)
    return np.linalg.lstsq(A * sw[:, None], v * sw, rcond=None)[0][1:]


@pytest.mark.parametrize("seed", SEEDS)
def test_kernel_shap_reference_scores_full_marks(seed):
    full(run_cases("16.2", shapley_kernel, kernel_shap, seed=seed))


@pytest.mark.parametrize("how", [{"weighting": "uniform"}, {"weighting": "binomial only"},
                                 {"weighting": "no binomial"}, {"weighting": "M + 1"},
                                 {"weighting": "M + 1 factor"}, {"numerator": "M"},
                                 {"ends": 1e12}, {"ends": 0.0}],
                         ids=lambda how: str(how))
def test_wrong_kernels_fail_only_the_kernel_case(how):
    fails_only(run_cases("16.2", lambda M, s: shapley_kernel(M, s, **how), kernel_shap, seed=5),
               "the Shapley kernel")


def test_shapley_values_without_the_kernel_fail_the_kernel_case():
    """The Shapley values from their definition (no regression, no kernel) pass the games but
    not the kernel itself: the exercise asks for the kernel."""
    from math import factorial

    def direct(value, M):
        k = np.arange(2 ** M)
        Z = (k[:, None] >> np.arange(M)) & 1
        v, sizes = value(Z), Z.sum(axis=1)
        w = [factorial(s) * factorial(M - s - 1) / factorial(M) for s in range(M)]
        return np.array([sum(w[sizes[j]] * (v[j | (1 << i)] - v[j])
                             for j in k if not (j >> i) & 1) for i in range(M)])

    fails_only(run_cases("16.2", lambda M, s: 1.0, direct, seed=5), "the Shapley kernel")


@pytest.mark.parametrize("how, failing", [
    ({"weighting": "uniform"}, ("a game with interactions", "M = 2, 3")),
    ({"weighting": "binomial only"}, ("a game with interactions", "M = 2, 3")),
    ({"weighting": "no binomial"}, ("a game with interactions", "M = 2, 3")),
    ({"weighting": "M + 1"}, ("a game with interactions", "M = 2, 3")),
    ({"weighting": "M + 1 factor"}, ("a game with interactions", "M = 2, 3")),
    ({"ends": "dropped"}, ("efficiency", "a game with interactions")),
    ({"ends": "big weight"}, ("efficiency", "a game with interactions")),
], ids=lambda how: str(how) if isinstance(how, dict) else "")
def test_kernel_shap_wrong_ideas_fail(how, failing):
    result = run_cases("16.2", shapley_kernel, lambda value, M: kernel_shap(value, M, **how),
                       seed=5)
    fails(result, *failing)


def test_uniform_weights_still_get_an_additive_game_right():
    result = run_cases("16.2", shapley_kernel,
                       lambda value, M: kernel_shap(value, M, weighting="uniform"), seed=5)
    assert next(r for r in result.rows if r.name.startswith("an additive")).passed


def test_kernel_shap_through_the_library_is_refused():
    from mlsys_lab.explain import shapley

    def through_the_library(value, M):
        shapley.shapley_kernel(M, 1)
        return kernel_shap(value, M)

    def kernel_of_the_library(M, size):
        return shapley.shapley_kernel(M, size)

    result = run_cases("16.2", kernel_of_the_library, through_the_library, seed=0)
    assert refused(result), "the library ran"


# ============================================================================= 16.3 Grad-CAM
def grad_cam(model, x, target, layer, *, relu=True, pool="mean", weights="grad",
             score="logit", offset=0):
    layers = list(model)
    a = x[None]
    for lay in layers[:layer + 1 + offset]:
        a = lay(a)
    a = ml.tensor(np.asarray(a.numpy()))

    def rest(act):
        for lay in layers[layer + 1 + offset:]:
            act = lay(act)
        if score == "softmax":
            act = ml.ops.softmax(act, axis=-1)
        return act[0, target]

    g = np.asarray(ml.grad(rest)(a).numpy())[0]
    A = np.asarray(a.numpy())[0]
    if weights == "none":
        cam = A.mean(axis=0)
    elif pool == "mean":
        cam = np.tensordot(g.mean(axis=(1, 2)), A, axes=1)
    elif pool == "sum":
        cam = np.tensordot(g.sum(axis=(1, 2)), A, axes=1)
    else:
        cam = (g * A).sum(axis=0)
    return np.maximum(cam, 0) if relu else cam


@pytest.fixture(scope="module", autouse=True)
def _compiled_kernels():
    """Run the float64 conv/pool kernels once outside the guard: Numba compiling them under the
    guard's profile hook (in whichever test comes first) is several times slower."""
    from mlsys_lab.grading.exercises.ch16_explainable_ai import ex16_3_grad_cam as ex
    grad_cam(ex._model(0), ex._image(0), 0, 3)


def _cam(**how):
    return lambda model, x, target, layer: grad_cam(model, x, target, layer, **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_grad_cam_reference_scores_full_marks(seed):
    full(run_cases("16.3", grad_cam, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"relu": False}, ("the least likely class",)),
    ({"pool": "sum"}, ("the last conv block", "the first conv")),
    ({"pool": "none"}, ("the last conv block", "the first conv")),
    ({"weights": "none"}, ("the last conv block", "the least likely", "the first conv")),
    ({"score": "softmax"}, ("the last conv block", "the least likely", "the first conv")),
], ids=["no relu", "summed", "not averaged", "no gradient weights", "softmax"])
def test_grad_cam_wrong_ideas_fail(how, failing):
    fails(run_cases("16.3", _cam(**how), seed=5), *failing)


def test_grad_cam_of_the_layer_before_fails():
    result = run_cases("16.3", _cam(offset=-1), seed=5)
    assert result.score < result.max


def test_grad_cam_through_the_library_is_refused():
    from mlsys_lab.explain import cam

    def through_the_library(model, x, target, layer):
        return cam.grad_cam(model, x, target, layer).attributions

    assert refused(run_cases("16.3", through_the_library, seed=0)), "the library ran"


def test_grad_cam_through_a_copy_of_the_library_is_refused():
    from mlsys_lab.explain import cam

    copied = type(cam.grad_cam)(cam.grad_cam.__code__, cam.grad_cam.__globals__, "my_cam",
                                cam.grad_cam.__defaults__)

    def through_a_copy(model, x, target, layer):
        return copied(model, x, target, layer).attributions

    assert refused(run_cases("16.3", through_a_copy, seed=0)), "the copy ran"
