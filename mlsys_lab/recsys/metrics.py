"""Recommendation metrics: Recall@k, AUC and log loss (checked against scikit-learn's)."""

import numpy as np

from ..errors import ArgumentError, ShapeError


def _check_k(k, owner):
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ArgumentError(f"{owner}: k must be a positive int, got {k!r}")
    return int(k)


def recall_at_k(retrieved, relevant, k):
    """Recall@k of one query: ``TP / min(TP + FN, k)``.

    ``TP`` counts the distinct relevant items among the first ``k`` retrieved ones (an item
    retrieved twice counts once); ``TP + FN`` is the number of relevant items. Dividing by
    ``min(., k)`` makes a perfect top-k score 1 even when more than ``k`` items are relevant.

    Args:
        retrieved: item ids, best first.
        relevant: the ids that are relevant (any iterable; duplicates ignored).
        k: how many retrieved items count.

    Raises:
        ArgumentError: ``k`` is not a positive int, or no item is relevant (recall undefined).
    """
    k = _check_k(k, "recall_at_k")
    relevant = set(np.asarray(list(relevant)).reshape(-1).tolist())
    if not relevant:
        raise ArgumentError("recall_at_k: no relevant items, so recall is undefined")
    top = set(np.asarray(retrieved).reshape(-1)[:k].tolist())
    return len(top & relevant) / min(len(relevant), k)


def mean_recall_at_k(retrieved, relevant, k):
    """The mean of :func:`recall_at_k` over queries (rows of ``retrieved``, one relevant set
    each); queries with no relevant item are left out."""
    if len(retrieved) != len(relevant):
        raise ShapeError(f"mean_recall_at_k: {len(retrieved)} retrieved lists for "
                         f"{len(relevant)} relevant sets")
    scores = [recall_at_k(r, s, k) for r, s in zip(retrieved, relevant) if len(s)]
    if not scores:
        raise ArgumentError("mean_recall_at_k: no query has a relevant item")
    return float(np.mean(scores))


def _binary(labels, scores, owner):
    y, s = np.asarray(labels).reshape(-1), np.asarray(scores, dtype=np.float64).reshape(-1)
    if y.shape != s.shape:
        raise ShapeError(f"{owner}: {y.shape[0]} labels for {s.shape[0]} scores")
    if not np.isin(y, (0, 1)).all():
        raise ArgumentError(f"{owner}: labels must be 0 or 1, got {np.unique(y)[:5]}")
    return y.astype(np.int64), s


def _average_ranks(s):
    """1-based ranks of ``s``, ties sharing the mean of their ranks."""
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], len(s)]
    ranks = np.empty(len(s))
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def auc(labels, scores):
    """Area under the ROC curve: the probability that a random positive scores above a random
    negative (ties count one half), from the Mann-Whitney rank sum.

    Raises:
        ArgumentError: only one class is present (AUC undefined, as scikit-learn says).
    """
    y, s = _binary(labels, scores, "auc")
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ArgumentError("auc: needs both positive and negative labels")
    ranks = _average_ranks(s)
    return float((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def log_loss(labels, probs):
    """Mean binary cross-entropy ``-mean(y log p + (1 - y) log(1 - p))``; ``p`` is clipped to
    ``[eps, 1 - eps]`` (float64's eps, as scikit-learn does)."""
    y, p = _binary(labels, probs, "log_loss")
    if np.any((p < 0) | (p > 1)) or np.isnan(p).any():
        raise ArgumentError("log_loss: probabilities must lie in [0, 1]")
    eps = np.finfo(np.float64).eps
    p = np.clip(p, eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


__all__ = ["recall_at_k", "mean_recall_at_k", "auc", "log_loss"]
