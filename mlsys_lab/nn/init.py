"""Parameter initialisers (all take a numpy Generator for reproducibility)."""

import numpy as np


def _rng(rng):
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def fan_in_out(shape):
    """(fan_in, fan_out) of a Linear weight (in, out) or a conv weight (O, I, kH, kW)."""
    if len(shape) == 2:
        return shape[0], shape[1]
    receptive = int(np.prod(shape[2:])) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def kaiming_uniform(shape, rng=None, gain=2.0 ** 0.5, dtype="float32"):
    """He initialisation: U(-b, b) with b = gain * sqrt(3 / fan_in) (for ReLU networks).

    A shape with no elements (``Linear(0, n)``) has a zero fan and gives an empty array, as in
    PyTorch."""
    if 0 in tuple(shape):
        return np.zeros(shape, dtype)
    fan_in, _ = fan_in_out(shape)
    bound = gain * np.sqrt(3.0 / fan_in)
    return _rng(rng).uniform(-bound, bound, shape).astype(dtype)


def xavier_uniform(shape, rng=None, gain=1.0, dtype="float32"):
    """Glorot initialisation: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)); a shape
    with no elements gives an empty array."""
    if 0 in tuple(shape):
        return np.zeros(shape, dtype)
    fan_in, fan_out = fan_in_out(shape)
    bound = gain * np.sqrt(6.0 / (fan_in + fan_out))
    return _rng(rng).uniform(-bound, bound, shape).astype(dtype)


def normal(shape, rng=None, std=0.01, dtype="float32"):
    """N(0, std**2) samples."""
    return (_rng(rng).standard_normal(shape) * std).astype(dtype)


def zeros(shape, dtype="float32"):
    """An array of zeros."""
    return np.zeros(shape, dtype)


def ones(shape, dtype="float32"):
    """An array of ones."""
    return np.ones(shape, dtype)
