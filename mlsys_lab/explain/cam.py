"""Grad-CAM (Selvaraju et al. 2017) on any layer of a sequential ``nn`` model.

The model's layers run in order up to the chosen one, whose activation A (C x H x W) becomes
the input of a second function, the rest of the model; ``ml.grad`` differentiates the target
logit with respect to A. No hook enters the model's code. The channel weights are the gradients
averaged over the spatial positions; the map is ReLU(sum_c w_c A_c).
"""

import numpy as np

from ..engine.tensor import no_grad
from ..errors import ArgumentError, ShapeError
from .core import CountedModel, check_input


def layers_of(model, fn="grad_cam"):
    """The model's top-level layers in call order (a ``Sequential`` or a list of callables)."""
    if isinstance(model, (list, tuple)):
        return list(model)
    try:
        return list(iter(model))
    except TypeError:
        raise ArgumentError(f"{fn}: the model must be a Sequential (or a list of layers run in "
                            f"order), got {type(model).__name__}") from None


def _run(layers, x):
    for layer in layers:
        x = layer(x)
    return x


def split_at(model, layer, fn="grad_cam"):
    """(head, tail): functions for the layers up to and including ``layer`` (an index or the
    layer object) and for the rest."""
    layers = layers_of(model, fn)
    if isinstance(layer, (int, np.integer)) and not isinstance(layer, bool):
        k = int(layer) % len(layers) if -len(layers) <= layer < len(layers) else None
    else:
        k = next((i for i, item in enumerate(layers) if item is layer), None)
    if k is None:
        raise ArgumentError(f"{fn}: layer {layer!r} is not one of the model's {len(layers)} "
                            f"layers")
    head, tail = layers[:k + 1], layers[k + 1:]
    return (lambda x: _run(head, x)), (lambda a: _run(tail, a))


def grad_cam(model, x, target, layer, relu: bool = True):
    """Grad-CAM of ``target`` at ``layer`` for one input ``x`` (no batch axis).

    Args:
        model: a ``Sequential`` model (or list of layers run in order).
        x: the input; target: the class whose logit is explained.
        layer: index (or object) of the layer whose output is the activation; its output must
            be (N, C, H, W).
        relu: apply the final ReLU (Selvaraju et al.; Captum's ``relu_attributions=True``).

    Returns:
        An :class:`Explanation` with the (H, W) map at the layer's resolution and, in
        ``info``, the channel weights. Cost: 1 forward, 1 backward.
    """
    x = check_input("grad_cam", x)
    head, tail = split_at(model, layer)
    with no_grad():
        act = head(x[None])
    a = np.asarray(act.numpy())
    if a.ndim != 4:
        raise ShapeError(f"grad_cam: layer {layer!r}'s output has shape {a.shape}; Grad-CAM "
                         f"needs a (N, C, H, W) feature map")
    m = CountedModel(tail, target, "grad_cam")
    _, g = m.gradients(a)
    weights = g[0].mean(axis=(1, 2))
    cam = np.tensordot(weights, a[0], axes=1)
    out = m.explanation(np.maximum(cam, 0.0) if relu else cam, "grad_cam")
    out.info["channel_weights"] = weights
    return out


def upsample(cam, shape):
    """Bilinear upsampling of an (h, w) map to ``shape`` (align-corners=False), for drawing a
    map over its image."""
    cam = np.asarray(cam, np.float64)
    h, w = cam.shape
    H, W = shape

    def coords(n_in, n_out):
        c = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
        c = np.clip(c, 0, n_in - 1)
        lo = np.floor(c).astype(int)
        hi = np.minimum(lo + 1, n_in - 1)
        return lo, hi, c - lo

    ylo, yhi, fy = coords(h, H)
    xlo, xhi, fx = coords(w, W)
    top = cam[ylo][:, xlo] * (1 - fx) + cam[ylo][:, xhi] * fx
    bottom = cam[yhi][:, xlo] * (1 - fx) + cam[yhi][:, xhi] * fx
    return top * (1 - fy)[:, None] + bottom * fy[:, None]
