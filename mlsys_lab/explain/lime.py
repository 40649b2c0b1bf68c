"""LIME for tabular data (Ribeiro et al. 2016): a weighted linear surrogate around one input.

As ``lime``'s ``LimeTabularExplainer`` without discretisation: draw samples from a Gaussian with
the training data's per-feature mean and standard deviation (or centred on the input), standardise
them, weight each by an exponential kernel of its distance to the input (width 0.75 sqrt(M) in
standard units by default), and fit a ridge regression of the model's output on the standardised
samples with those weights. The coefficients are the explanation: the change of the output per
standard deviation of each feature, near x.
"""

import numpy as np

from ..errors import ArgumentError, ShapeError
from .core import CountedModel, check_count, check_input


def weighted_ridge(X, y, weights, alpha: float = 1.0):
    """(coefficients, intercept) minimising sum_k w_k (y_k - b - X_k . c)^2 + alpha |c|^2
    (the intercept is not penalised, as scikit-learn's ``Ridge``)."""
    X, y, w = (np.asarray(a, np.float64) for a in (X, y, weights))
    if alpha < 0:
        raise ArgumentError(f"weighted_ridge: alpha must be >= 0, got {alpha}")
    sw = w.sum()
    xm, ym = w @ X / sw, w @ y / sw
    Xc, yc = X - xm, y - ym
    A = (Xc * w[:, None]).T @ Xc + alpha * np.eye(X.shape[1])
    coef = np.linalg.solve(A, (Xc * w[:, None]).T @ yc)
    return coef, float(ym - xm @ coef)


def lime_tabular(model, x, data, target=None, samples: int = 5000, kernel_width=None,
                 alpha: float = 1.0, around_instance: bool = False, seed: int = 0):
    """LIME's linear explanation of ``x`` (M,) for ``target``.

    Args:
        data: (n, M) training rows; their mean and std set the sampling and the units.
        samples: perturbed rows (the first is x itself).
        kernel_width: in standard units; 0.75 sqrt(M) by default (``lime``'s).
        alpha: the ridge penalty (``lime`` uses 1).
        around_instance: centre the samples on x instead of the data's mean.
        seed: an int (``np.random.default_rng``), or a generator with ``normal`` — a
            ``np.random.RandomState(k)`` draws exactly the samples of ``lime``'s explainer
            created with ``random_state=k``.

    Returns:
        An :class:`Explanation`: ``attributions`` = the coefficients per standard deviation;
        ``info``: ``coefficients`` per original unit, ``intercept``, ``score`` (the weighted R^2)
        and ``local_prediction`` (the surrogate at x). Cost: ``samples`` forward.
    """
    x = check_input("lime_tabular", x, 1)
    data = np.asarray(data, np.float64)
    if data.ndim != 2 or data.shape[1] != x.shape[0]:
        raise ShapeError(f"lime_tabular: data must be (n, {x.shape[0]}), got {data.shape}")
    samples = check_count("lime_tabular", "samples", samples, 2)
    M = x.shape[0]
    mean, scale = data.mean(axis=0), data.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    width = 0.75 * np.sqrt(M) if kernel_width is None else float(kernel_width)
    if width <= 0:
        raise ArgumentError(f"lime_tabular: kernel_width must be > 0, got {kernel_width}")
    rng = seed if hasattr(seed, "normal") else np.random.default_rng(seed)
    rows = rng.normal(0.0, 1.0, samples * M).reshape(samples, M) * scale \
        + (x if around_instance else mean)
    rows[0] = x
    scaled = (rows - mean) / scale
    distance = np.linalg.norm(scaled - scaled[0], axis=1)
    weights = np.sqrt(np.exp(-distance ** 2 / width ** 2))
    m = CountedModel(model, target, "lime_tabular")
    y = m.values(rows.astype(x.dtype))
    coef, intercept = weighted_ridge(scaled, y, weights, alpha)
    fit = intercept + scaled @ coef
    ybar = weights @ y / weights.sum()
    score = 1.0 - (weights @ (y - fit) ** 2) / (weights @ (y - ybar) ** 2)
    return m.explanation(coef, "lime_tabular", coefficients=coef / scale, intercept=intercept,
                         score=float(score), local_prediction=float(fit[0]))
