"""The chapter's data: scikit-learn's bundled digits (1,797 8x8 images, no download)."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

__all__ = ["load_digits"]


def load_digits(test_fraction=0.2, seed=0, dtype=np.float32):
    """Digits split into a training and a test set, features scaled to ``[0, 1]``.

    Args:
        test_fraction: the share held out for testing (stratified by nothing: a seeded shuffle).
        seed: the shuffle's seed.
        dtype: the features' dtype.

    Returns:
        ``(x_train, y_train, x_test, y_test)``: features ``(n, 64)``, labels int64 ``0..9``.
    """
    if not 0.0 < float(test_fraction) < 1.0:
        raise ArgumentError(f"load_digits: test_fraction={test_fraction!r} must be in (0, 1)")
    from sklearn.datasets import load_digits as sk_digits

    bunch = sk_digits()
    x = (bunch.data / 16.0).astype(dtype)
    y = bunch.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * float(test_fraction)))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]
