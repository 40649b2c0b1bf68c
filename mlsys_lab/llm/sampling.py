"""Turning logits into tokens: temperature, top-k and top-p (nucleus) filtering, seeded sampling.

* temperature ``T``: sample from ``softmax(logits / T)``; ``T -> 0`` is greedy (argmax), large
  ``T`` flattens the distribution;
* top-k: keep the ``k`` largest logits (ties with the k-th are kept, as PyTorch's
  ``topk``-threshold), drop the rest;
* top-p (Holtzman et al. 2020): keep the smallest set of most likely tokens whose probability
  reaches ``p`` (the most likely token always stays).

Sampling draws one uniform number per token from a numpy ``Generator`` and inverts the
cumulative distribution, so a seed fixes the tokens, whatever else shares the batch.
"""

import numpy as np

from ..errors import ArgumentError


def softmax(logits):
    """Softmax over the last axis, in float64."""
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k_mask(logits, k):
    """True for the tokens top-k keeps: logits >= the k-th largest (per row)."""
    logits = np.asarray(logits)
    if not 1 <= k:
        raise ArgumentError(f"top_k_mask: k must be >= 1, got {k}")
    if k >= logits.shape[-1]:
        return np.ones(logits.shape, bool)
    kth = -np.partition(-logits, k - 1, axis=-1)[..., k - 1:k]
    return logits >= kth


def top_p_mask(probs, p):
    """True for the tokens top-p keeps: those whose preceding cumulative probability (most
    likely first) is below ``p``, i.e. the smallest prefix reaching ``p``."""
    if not 0.0 < p <= 1.0:
        raise ArgumentError(f"top_p_mask: p must be in (0, 1], got {p}")
    probs = np.asarray(probs, np.float64)
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, -1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p
    keep_sorted = before < p
    keep = np.empty_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, -1)
    return keep


def probabilities(logits, temperature=1.0, top_k=None, top_p=None):
    """The distribution a sampler draws from (float64, last axis), after temperature, top-k and
    top-p; ``temperature=0`` is a one-hot on the argmax."""
    logits = np.asarray(logits, np.float64)
    if temperature < 0:
        raise ArgumentError(f"probabilities: temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return np.eye(logits.shape[-1])[np.argmax(logits, axis=-1)]
    z = logits / temperature
    if top_k is not None:
        z = np.where(top_k_mask(z, top_k), z, -np.inf)
    probs = softmax(z)
    if top_p is not None:
        probs = np.where(top_p_mask(probs, top_p), probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def draw(probs, rng):
    """One token per row of ``probs`` by inverting the CDF at ``rng.random()``."""
    probs = np.asarray(probs, np.float64)
    cdf = np.cumsum(probs, axis=-1)
    u = rng.random(probs.shape[:-1] + (1,)) * cdf[..., -1:]
    idx = (cdf <= u).sum(axis=-1)
    # never land on a zero-probability token through rounding at the top of the CDF
    return np.minimum(idx, probs.shape[-1] - 1 - np.argmax(probs[..., ::-1] > 0, axis=-1))


def sample(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Token ids (int64) for a row or rows of ``logits``; ``temperature=0`` is argmax."""
    if temperature == 0:
        return np.argmax(np.asarray(logits), axis=-1)
    return draw(probabilities(logits, temperature, top_k, top_p), rng)
