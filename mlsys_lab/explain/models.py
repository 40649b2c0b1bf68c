"""The chapter's two models and their committed weights (``models.npz``).

``digits_cnn`` classifies scikit-learn's 8x8 digits (conv-ReLU-pool-conv-ReLU-linear);
``wine_mlp`` classifies the 13 standardised features of scikit-learn's wine data (13-16-3, tanh).
Both are trained by ``python -m mlsys_lab.explain.train`` and stored with ``ml.save`` (no pickle).
:func:`load` returns them in float64, the precision the reference attributions use.
"""

import os
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, CheckpointError
from ..nn import AvgPool2d, Conv2d, Flatten, Linear, MaxPool2d, ReLU, Sequential, Tanh
from ..nn.checkpoint import load as load_checkpoint

#: Where the committed weights live (package data).
WEIGHTS = os.path.join(os.path.dirname(__file__), "models.npz")


def digits_cnn(seed: int = 0) -> Sequential:
    """The digits CNN: (N, 1, 8, 8) -> (N, 10) logits.

    Layers: 0 conv 1->16 (3x3, pad 1), 1 ReLU, 2 max-pool 2, 3 conv 16->32 (3x3, pad 1),
    4 ReLU, 5 global average pool (4x4), 6 flatten, 7 linear 32->10. The global average pool
    keeps the class evidence spatial up to layer 4, as in the networks Grad-CAM was made for
    (with a flattened 4x4 map feeding the linear layer, the position-averaged gradients lose
    where the evidence is).
    """
    return Sequential(Conv2d(1, 16, 3, padding=1, rng=seed), ReLU(), MaxPool2d(2),
                      Conv2d(16, 32, 3, padding=1, rng=seed + 1), ReLU(), AvgPool2d(4),
                      Flatten(), Linear(32, 10, rng=seed + 2))


def wine_mlp(seed: int = 0) -> Sequential:
    """The tabular model: (N, 13) standardised wine features -> (N, 3) logits."""
    return Sequential(Linear(13, 16, rng=seed), Tanh(), Linear(16, 3, rng=seed + 1))


def to_dtype(model, dtype=np.float64):
    """Cast every parameter of ``model`` to ``dtype`` in place and return the model."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ArgumentError(f"to_dtype: dtype must be a floating type, got {dtype}")
    for p in model.parameters():
        p.data = np.asarray(p.data, dtype)
    return model


@dataclass
class Models:
    """What :func:`load` returns: the two models and the data they were trained on.

    ``digits_x`` (1797, 1, 8, 8) in [0, 1] and ``digits_y``; ``wine_x`` (178, 13) standardised
    and ``wine_y``; ``meta``: the training record (accuracies, seed, epochs).
    """

    digits: Sequential
    wine: Sequential
    digits_x: np.ndarray
    digits_y: np.ndarray
    wine_x: np.ndarray
    wine_y: np.ndarray
    meta: dict


def wine_data():
    """The wine features standardised with their own mean and std (float64), and labels."""
    from sklearn.datasets import load_wine

    bunch = load_wine()
    x = bunch.data.astype(np.float64)
    return (x - x.mean(axis=0)) / x.std(axis=0), bunch.target.astype(np.int64)


def digits_data():
    """The digits as (1797, 1, 8, 8) float64 images in [0, 1], and labels."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return (bunch.images / 16.0).astype(np.float64)[:, None], bunch.target.astype(np.int64)


def load(path: str = WEIGHTS, dtype=np.float64) -> Models:
    """The committed models in ``dtype`` (eval mode), with their data.

    Raises:
        CheckpointError: the file is missing or is not this module's checkpoint.
    """
    ckpt = load_checkpoint(path)
    try:
        digits_w, wine_w, meta = ckpt["digits"], ckpt["wine"], ckpt["meta"]
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"explain.models.load: {path} lacks {e}") from None
    digits, wine = digits_cnn(), wine_mlp()
    digits.load_state_dict({k: np.asarray(v, np.float32) for k, v in digits_w.items()})
    wine.load_state_dict({k: np.asarray(v, np.float32) for k, v in wine_w.items()})
    to_dtype(digits, dtype), to_dtype(wine, dtype)  # float32 -> float64 is exact
    dx, dy = digits_data()
    wx, wy = wine_data()
    return Models(digits.eval(), wine.eval(), dx.astype(dtype), dy, wx.astype(dtype), wy, meta)
