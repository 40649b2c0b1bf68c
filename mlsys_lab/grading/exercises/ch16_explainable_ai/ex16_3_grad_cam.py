"""Exercise 16.3: Grad-CAM through ``ml.grad``, on a layer of a Sequential model.

The student writes ``grad_cam(model, x, target, layer)``: run the layers up to and including
``layer`` on the image batch ``x[None]`` to get the activation A (1, C, H, W); differentiate the
target class's *score* (the logit, before any softmax) of the remaining layers with respect to A
with ``ml.grad``; weight each channel by its gradient averaged over the H x W positions; return
ReLU(sum_c w_c A_c) as an (H, W) array. The judge computes the map from the same definition,
with the gradient of the rest of the model from the engine's reverse mode.

Wrong ideas rejected: no final ReLU (the class the image does not show has negative evidence);
the gradients summed instead of averaged (H W times too large), or not averaged at all
(ReLU(sum_c g_c(h, w) A_c(h, w)), position by position); the activations without gradient
weights (the channel mean of A: the same map for every class); the gradient of the softmax
probability instead of the score — Selvaraju et al. use the score y^c, and the probability's
gradient mixes in every other class's (p_c (grad y_c - sum_k p_k grad y_k)), so its map differs
where the model is not certain; the layer's input instead of its output (the layer index is off
by one).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab import nn
from mlsys_lab.engine.autodiff import grad
from mlsys_lab.engine.tensor import tensor
from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, register
from mlsys_lab.grading.exercises.ch16_explainable_ai.common import expect_array, worst

# ----------------------------------------------------------------------------- inputs (both sides)


def _model(seed: int):
    """A small float64 CNN on 1 x 6 x 6 images: conv(1->4)-ReLU-conv(4->6)-ReLU-pool-linear(5)."""
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=seed), nn.ReLU(),
                          nn.Conv2d(4, 6, 3, padding=1, rng=seed + 1), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(54, 5, rng=seed + 2))
    rng = np.random.default_rng(16300 + seed)
    for p in model.parameters():
        p.data = rng.normal(0.0, 0.6, p.data.shape)
    return model.eval()


def _image(seed: int):
    return np.random.default_rng(16350 + seed).uniform(0, 1, (1, 6, 6))


def _target(seed: int, which: str):
    """The predicted class, or the least likely one (negative evidence)."""
    logits = np.asarray(_model(seed)(_image(seed)[None]).numpy())[0]
    return int(np.argmax(logits) if which == "top" else np.argmin(logits))


def _reference(seed: int, layer: int, target: int):
    """The definition, with the rest of the model differentiated by the engine's reverse mode
    (``ml.grad``; central differences would meet the max-pool's ties between zeros)."""
    model = _model(seed)
    layers = list(model)
    a = _image(seed)[None]
    for lay in layers[:layer + 1]:
        a = np.asarray(lay(a).numpy())

    def score(act):
        for lay in layers[layer + 1:]:
            act = lay(act)
        return act[0, target]

    g = np.asarray(grad(score)(tensor(a)).numpy())[0]
    return np.maximum(np.tensordot(g.mean(axis=(1, 2)), a[0], axes=1), 0.0)


# ----------------------------------------------------------------------------- probes


def _probe(layer: int, which: str):
    def probe(grad_cam, seed):
        target = _target(seed, which)
        out = attempt(grad_cam, _model(seed), _image(seed), target, layer)
        try:
            return np.array(np.asarray(out), dtype=np.float64)
        except (TypeError, ValueError):
            return out
    return probe


# ----------------------------------------------------------------------------- judges


def _judge(layer: int, which: str, what: str):
    def judge(raw, seed):
        want = _reference(seed, layer, _target(seed, which))
        got = expect_array(raw, want.shape, what)
        if not np.allclose(got, want, rtol=1e-6, atol=1e-7 * max(1.0, np.abs(want).max())):
            raise AssertionError(f"{what}: {worst(got, want)}")
    return judge


register(
    Exercise(
        id="16.3",
        title="Grad-CAM through ml.grad",
        target="grad_cam",
        task="Grad-CAM",
        forbidden=("mlsys_lab.explain.cam", "mlsys_lab.explain.concepts",
                   "mlsys_lab.explain.core:CountedModel"),
        cases=(
            Case("the last conv block (layer 3) for the predicted class", 2,
                 feedback="ReLU(sum_c mean_hw(d score / d A_c) * A_c) at the layer's output",
                 probe=_probe(3, "top"), judge=_judge(3, "top", "layer 3, predicted class")),
            Case("the least likely class: negative evidence is cut by the ReLU", 1.5,
                 feedback="the final ReLU keeps only positive evidence",
                 probe=_probe(3, "bottom"),
                 judge=_judge(3, "bottom", "layer 3, least likely class")),
            Case("the first conv's output (before its ReLU), predicted class", 1.5,
                 feedback="any layer: run the layers up to it, differentiate the rest",
                 probe=_probe(0, "top"), judge=_judge(0, "top", "layer 0, predicted class")),
            Case("the pooled features (layer 4) for the least likely class", 1,
                 feedback="the class score (logit), not its softmax probability",
                 probe=_probe(4, "bottom"),
                 judge=_judge(4, "bottom", "layer 4, least likely class")),
        ),
    ),
)
