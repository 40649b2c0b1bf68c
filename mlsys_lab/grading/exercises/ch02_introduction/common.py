"""What several exercises of chapter 2 share: the seeded data sets and models, a spy that
records what a model sees, and the judges' checks of a float result and of a model's
parameters."""

from __future__ import annotations

import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import Opaque, describe


def blobs(seed: int, n: int = 60, features: int = 4, classes: int = 3):
    """Gaussian blobs: float32 features (n, features) and int64 labels (n,)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, features)) * 2.5
    y = rng.integers(0, classes, n)
    X = centers[y] + rng.standard_normal((n, features))
    return X.astype(np.float32), y.astype(np.int64)


def mlp(seed: int, features: int = 4, classes: int = 3, dropout: float = 0.0):
    """A seeded two-layer MLP (Linear, ReLU, [Dropout], Linear) with 16 hidden units."""
    import mlsys_lab as ml

    layers = [ml.nn.Linear(features, 16, rng=seed), ml.nn.ReLU()]
    if dropout:
        layers.append(ml.nn.Dropout(dropout))
    layers.append(ml.nn.Linear(16, classes, rng=seed + 1))
    return ml.nn.Sequential(*layers)


def param_arrays(model) -> dict:
    """Copies of the model's parameters by name."""
    return {name: p.numpy().copy() for name, p in model.named_parameters()}


def batch_loss(model, xb, yb):
    """The cross-entropy of ``model`` on one batch (a Tensor on the tape)."""
    import mlsys_lab as ml

    return ml.nn.cross_entropy(model(ml.tensor(xb)), ml.tensor(yb))


def spy_class():
    """A ``Spy`` module class (made on demand: it subclasses ``ml.nn.Module``)."""
    import mlsys_lab as ml

    class Spy(ml.nn.Module):
        """Wraps a model; records each batch it sees and whether the tape was on."""

        def __init__(self, inner):
            super().__init__()
            self.inner = inner
            object.__setattr__(self, "seen", [])
            object.__setattr__(self, "grad_modes", [])

        def forward(self, x):
            self.seen.append(np.array(x, copy=True))
            self.grad_modes.append(bool(ml.is_grad_enabled()))
            return self.inner(x)

    return Spy


def as_float(value, what):
    """For judges: a student's number as a float, or fail (a Tensor gets its own hint)."""
    if isinstance(value, Opaque) and value.type_name in ("Tensor", "Parameter"):
        raise AssertionError(
            f"{what} returned a Tensor; return a Python float (loss.item() or float(loss.numpy()))"
        )
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise AssertionError(f"{what} returned {describe(value)}, expected a float")
    return float(value)


def expect_params(raw, model, what) -> dict:
    """``raw`` as {name: array} with the names and shapes of ``model``'s parameters."""
    expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
    if not isinstance(raw, dict) or set(raw) != set(expected):
        raise AssertionError(f"{what}: the model's parameters changed names (got {describe(raw)})")
    for name, shape in expected.items():
        if not isinstance(raw[name], np.ndarray) or raw[name].shape != shape:
            raise AssertionError(f"{what}: parameter {name} is no longer an array of {shape}")
    return raw
