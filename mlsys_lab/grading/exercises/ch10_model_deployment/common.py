"""What the judges of chapter 10 share: a result that must be an array, and a result that must
not be an exception the answer raised (a probe's ``attempt``)."""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Raised, describe


def expect_array(raw, what, shape=None, kind=None):
    """``raw`` as an ndarray of ``shape`` (and dtype kind), else a failed case."""
    if not isinstance(raw, np.ndarray):
        raise AssertionError(f"{what}: expected a numpy array, got {describe(raw)}")
    if shape is not None and tuple(raw.shape) != tuple(shape):
        raise AssertionError(f"{what}: expected shape {tuple(shape)}, got {tuple(raw.shape)}")
    if kind is not None and raw.dtype.kind not in kind:
        raise AssertionError(f"{what}: expected a {'bool' if kind == 'b' else kind} array, "
                             f"got dtype {raw.dtype}")
    return raw


def expect_not_raised(raw, what):
    """``raw`` itself, unless it is the ``Raised`` record of ``attempt``: then a failed case that
    names the exception."""
    if isinstance(raw, Raised):
        raise AssertionError(f"{what}: your code raised {raw.type_name}: {raw.message}")
    return raw
