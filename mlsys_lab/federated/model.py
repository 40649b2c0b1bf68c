"""The chapter's model: a functional MLP whose parameters are a dict of numpy arrays.

``{"W1": (64, 32), "b1": (32,), "W2": (32, 10), "b2": (10,)}`` for sizes ``(64, 32, 10)``. The
same functions run a *stack* of models, one per client, when every parameter has a leading
client axis (``W: (C, in, out)``, ``b: (C, 1, out)``) and the inputs are ``(C, B, in)``: that
is how :mod:`.training` trains all sampled clients of a round in one batched computation.
The forward pass is engine ops (``ml.ops.matmul``, ``relu``, ``log_softmax``), so
``ml.value_and_grad`` and ``ml.per_example_grad`` differentiate it.
"""

from __future__ import annotations

import numpy as np

from ..engine.dispatch import no_grad
from ..engine.tensor import Tensor
from ..errors import ArgumentError, ShapeError
from ..ops import log_softmax, matmul, relu

__all__ = ["accuracy", "flatten", "forward", "init_mlp", "layer_names", "loss", "num_params",
           "per_example_loss", "predict", "stack", "train_flops", "unflatten", "unstack"]


def init_mlp(sizes=(64, 32, 10), seed=0, dtype=np.float64):
    """He-uniform weights and zero biases for layer ``sizes`` (input, hidden..., classes)."""
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or min(sizes) < 1:
        raise ArgumentError(f"init_mlp: sizes={sizes} needs >= 2 positive layer sizes")
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
        bound = np.sqrt(6.0 / a)
        params[f"W{i}"] = rng.uniform(-bound, bound, size=(a, b)).astype(dtype)
        params[f"b{i}"] = np.zeros(b, dtype=dtype)
    return params


def layer_names(params):
    """``["1", "2", ...]``: the layers, in order."""
    n = sum(1 for k in params if k.startswith("W"))
    for i in range(1, n + 1):
        if f"W{i}" not in params or f"b{i}" not in params:
            raise ArgumentError(f"model: parameters {sorted(params)} are not W1, b1, ..., W{n}, "
                                f"b{n}")
    return [str(i) for i in range(1, n + 1)]


def forward(params, x):
    """Logits (a Tensor). ``x``: ``(n, in)`` for one model, ``(C, B, in)`` for a stack."""
    names = layer_names(params)
    h = x
    if isinstance(x, (np.ndarray, list)):
        h = np.asarray(x, dtype=np.asarray(getattr(params["W1"], "data", params["W1"])).dtype)
    for j, i in enumerate(names):
        h = matmul(h, params["W" + i]) + params["b" + i]
        if j < len(names) - 1:
            h = relu(h)
    return h


def _onehot(y, classes, dtype):
    y = np.asarray(y)
    if y.ndim >= 1 and y.shape[-1] == classes and np.issubdtype(y.dtype, np.floating):
        return y.astype(dtype, copy=False)
    return np.eye(classes, dtype=dtype)[y]


def per_example_loss(params, x, y):
    """Cross-entropy of each row (reduces over the last axis only, so it works for a batch of
    one under :func:`ml.per_example_grad`); ``y``: int labels or one-hot rows."""
    z = forward(params, x)
    return -(log_softmax(z, axis=-1) * _onehot(y, z.shape[-1], z.dtype)).sum(axis=-1)


def loss(params, x, y):
    """Mean cross-entropy over the rows of ``x`` (a float)."""
    with no_grad():
        return float(np.asarray(per_example_loss(params, x, y).data).mean())


def predict(params, x):
    """Predicted class of each row (numpy int array)."""
    with no_grad():
        z = forward(params, x)
    return np.asarray(z.data if isinstance(z, Tensor) else z).argmax(axis=-1)


def accuracy(params, x, y):
    """Share of rows of ``x`` classified as ``y``."""
    return float((predict(params, x) == np.asarray(y)).mean())


def num_params(params):
    """Number of scalars in the model."""
    return int(sum(np.asarray(v).size for v in params.values()))


def train_flops(params, samples):
    """FLOPs of forward + backward for ``samples`` examples (6 per weight per example)."""
    return 6.0 * num_params(params) * float(samples)


def flatten(params):
    """All parameters as one vector (keys in sorted order): what goes on the wire."""
    return np.concatenate([np.asarray(params[k]).reshape(-1) for k in sorted(params)])


def unflatten(vector, like):
    """Inverse of :func:`flatten`, shaped and typed like ``like``."""
    vector = np.asarray(vector)
    total = num_params(like)
    if vector.ndim != 1 or vector.size != total:
        raise ShapeError(f"model.unflatten: need a vector of {total} values, got shape "
                         f"{vector.shape}")
    out, at = {}, 0
    for k in sorted(like):
        shape = np.shape(like[k])
        size = int(np.prod(shape))
        out[k] = vector[at:at + size].reshape(shape).astype(np.asarray(like[k]).dtype,
                                                            copy=False)
        at += size
    return out


def stack(params, count):
    """``count`` copies of one model with a leading client axis (biases ``(C, 1, out)``)."""
    return {k: np.repeat(np.asarray(v)[None, None] if k.startswith("b") else
                         np.asarray(v)[None], count, axis=0) for k, v in params.items()}


def unstack(stacked, i):
    """Client ``i``'s model out of a stack."""
    return {k: (v[i, 0] if k.startswith("b") else v[i]).copy() for k, v in stacked.items()}
