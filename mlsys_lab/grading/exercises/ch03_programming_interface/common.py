"""What several exercises of chapter 3 share: a Tensor result as an array for the wire
(probes), and the judges' check of an array's shape."""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import describe


def array_of(value):
    """A Tensor as a numpy array (a copy); anything else as it is (the wire says what it was)."""
    import mlsys_lab as ml

    return np.array(value.numpy(), copy=True) if isinstance(value, ml.Tensor) else value


def expect_array(raw, shape, what) -> np.ndarray:
    """For judges: ``raw`` as a float64 array of ``shape``, or fail naming ``what``."""
    if not isinstance(raw, np.ndarray) or raw.shape != tuple(shape):
        raise AssertionError(f"{what} should be an array of shape {tuple(shape)}, got "
                             f"{describe(raw)}")
    return raw.astype(np.float64)
