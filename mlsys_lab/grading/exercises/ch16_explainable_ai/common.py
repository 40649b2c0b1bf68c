"""Helpers the chapter 16 exercises share: reading an answer's array back."""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Raised, describe


def expect_array(raw, shape, what: str) -> np.ndarray:
    """``raw`` as a float64 array of ``shape``, or an AssertionError that says what came back."""
    if isinstance(raw, Raised):
        raise AssertionError(f"{what}: your function raised {raw}")
    try:
        arr = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        raise AssertionError(f"{what}: expected an array of shape {shape}, got "
                             f"{describe(raw)}") from None
    if arr.shape != tuple(shape):
        raise AssertionError(f"{what}: expected shape {tuple(shape)}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise AssertionError(f"{what}: the answer holds NaN or inf: {describe(arr)}")
    return arr


def worst(got, want) -> str:
    """Where two arrays differ most, for a judge's message."""
    diff = np.abs(got - want)
    k = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return (f"largest difference {diff[k]:.3g} at index {tuple(int(i) for i in k)} "
            f"(got {got[k]:.6g}, expected {want[k]:.6g})")
