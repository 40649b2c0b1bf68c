"""Perturbation attributions: occlusion and RISE. Both only run the model (no gradients).

Occlusion slides a window over the input, replaces it by a baseline and records how much the
target output drops; each feature gets the mean drop over the windows that covered it (Captum's
``Occlusion``: windows start every ``strides`` and are cut at the input's edge). RISE (Petsiuk
et al. 2018) runs the model on the input under random smooth masks and weights each mask by the
score it left: saliency = sum_i f(x . M_i) M_i / (N p).
"""

import itertools

import numpy as np

from ..errors import ArgumentError, ShapeError
from .cam import upsample
from .core import CountedModel, check_baseline, check_count, check_input


def _tuple(fn, name, value, ndim):
    value = (value,) * ndim if np.isscalar(value) else tuple(value)
    if len(value) != ndim or any(isinstance(v, bool) or not isinstance(v, (int, np.integer))
                                 or v < 1 for v in value):
        raise ArgumentError(f"{fn}: {name} must be a positive int or {ndim} of them, "
                            f"got {value!r}")
    return tuple(int(v) for v in value)


def occlusion_windows(shape, window, strides):
    """The slices of every window position (Captum's order: the last axis moves fastest)."""
    counts = [int(np.ceil((n - w) / s)) + 1 for n, w, s in zip(shape, window, strides)]
    for index in itertools.product(*(range(c) for c in counts)):
        yield tuple(slice(k * s, min(k * s + w, n))
                    for k, s, w, n in zip(index, strides, window, shape))


def occlusion(model, x, target=None, window=(1, 2, 2), strides=1, baseline=0.0,
              batch: int = 64):
    """Occlusion attributions of ``x`` (no batch axis) for ``target``.

    Args:
        window: the occluded block's shape (one size per axis of x, or one int for all).
        strides: its step per axis (<= the window where the window does not span the axis).
        baseline: the value the block is replaced by (a number or an array like x).
        batch: occluded inputs per model call.

    Returns:
        An :class:`Explanation`; ``info['windows']`` is the number of occluded inputs.
        Cost: windows + 1 forward.
    """
    x = check_input("occlusion", x)
    base = check_baseline("occlusion", x, baseline)
    window = _tuple("occlusion", "window", window, x.ndim)
    strides = _tuple("occlusion", "strides", strides, x.ndim)
    if any(w > n for w, n in zip(window, x.shape)):
        raise ShapeError(f"occlusion: window {window} is larger than the input {x.shape}")
    if any(s > w and w < n for s, w, n in zip(strides, window, x.shape)):
        raise ArgumentError(f"occlusion: strides {strides} larger than the window {window} "
                            f"would skip features")
    m = CountedModel(model, target, "occlusion")
    f_x = float(m.values(x[None])[0])
    total = np.zeros_like(x)
    counts = np.zeros_like(x)
    slices = list(occlusion_windows(x.shape, window, strides))
    for start in range(0, len(slices), batch):
        chunk = slices[start:start + batch]
        inputs = np.repeat(x[None], len(chunk), axis=0)
        for i, sl in enumerate(chunk):
            inputs[(i,) + sl] = base[sl]
        drops = f_x - m.values(inputs)
        for drop, sl in zip(drops, chunk):
            total[sl] += drop
            counts[sl] += 1
    return m.explanation(total / counts, "occlusion", windows=len(slices))


def rise_masks(n: int, shape, cells: int = 4, p: float = 0.5, seed: int = 0):
    """``n`` RISE masks of ``shape`` (H, W): a ``cells`` x ``cells`` grid of Bernoulli(p) cells,
    bilinearly upsampled to (cells + 1) cell sizes and cropped at a random shift."""
    rng = np.random.default_rng(seed)
    H, W = shape
    ch, cw = int(np.ceil(H / cells)), int(np.ceil(W / cells))
    grids = (rng.random((n, cells, cells)) < p).astype(np.float64)
    big = (cells + 1) * ch, (cells + 1) * cw
    out = np.empty((n, H, W))
    shifts = rng.integers(0, [ch, cw], size=(n, 2))
    for i in range(n):
        up = upsample(grids[i], big)
        out[i] = up[shifts[i, 0]:shifts[i, 0] + H, shifts[i, 1]:shifts[i, 1] + W]
    return out


def rise(model, x, target=None, masks: int = 500, cells: int = 4, p: float = 0.5,
         baseline=0.0, seed: int = 0, batch: int = 250):
    """RISE saliency of an image ``x`` (C, H, W) for ``target``.

    Returns:
        An :class:`Explanation` with the (H, W) map (the same for every channel).
        Cost: ``masks`` forward.
    """
    x = check_input("rise", x)
    if x.ndim != 3:
        raise ShapeError(f"rise: x must be one (C, H, W) image, got shape {x.shape}")
    masks = check_count("rise", "masks", masks)
    if not 0.0 < p <= 1.0:
        raise ArgumentError(f"rise: p must be in (0, 1], got {p!r}")
    base = check_baseline("rise", x, baseline)
    M = rise_masks(masks, x.shape[1:], cells, p, seed)
    m = CountedModel(model, target, "rise")
    scores = np.empty(masks)
    for start in range(0, masks, batch):
        mk = M[start:start + batch, None]
        scores[start:start + batch] = m.values((base[None] + (x - base)[None] * mk)
                                               .astype(x.dtype))
    sal = np.tensordot(scores, M, axes=1) / (masks * p)
    return m.explanation(sal, "rise", masks=masks)
