"""SignDS with EM-MDS: local DP by choosing *which dimensions* to report, not their values.

A client sorts its update, keeps the ``k`` dimensions most in the direction of a random sign
``s`` (the top-k of ``s * update``: the most positive for ``s = +1``, the most negative for
``s = -1``), and reports ``s`` and a set ``J`` of ``h`` dimensions chosen by the exponential
mechanism (EM-MDS, exponential-mechanism multi-dimension selection). A candidate set's score is
``u = 1(nu >= nu_th)`` with ``nu = |J ∩ top-k|``; the mechanism picks ``J`` with probability
proportional to ``exp(eps * u)``. Grouping the candidates by ``tau = nu``: there are
``omega_tau = C(k, tau) C(d - k, h - tau)`` sets with ``tau`` top-k dimensions, so

    P(tau) = omega_tau exp(eps 1(tau >= nu_th)) / sum_t omega_t exp(eps 1(t >= nu_th)),

and sampling is: draw ``tau``, then ``tau`` dimensions uniformly from the top-k and ``h - tau``
from the rest. The normaliser depends on ``(d, k, h)`` only, never on the data, so two
clients' probabilities of any ``J`` differ by at most ``e^eps``: each report is ``eps``-LDP
(the score's sensitivity is 1, and the usual factor 2 of the exponential mechanism is not
needed when the normaliser is data-independent). The server adds ``s`` on every reported
dimension and steps in that direction.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError

__all__ = ["aggregate", "client_update", "em_mds", "log_omega", "omega", "tau_probabilities"]


def _check(where, k, d, h, nu_th=0):
    for name, v in (("k", k), ("d", d), ("h", h)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ArgumentError(f"{where}: {name}={v!r} must be an int >= 1")
    if k > d or h > d:
        raise ArgumentError(f"{where}: need k <= d and h <= d, got k={k}, h={h}, d={d}")
    if not 0 <= nu_th <= min(k, h):
        raise ArgumentError(f"{where}: nu_th={nu_th!r} must be in 0..min(k, h)={min(k, h)}")


def omega(k, d, h):
    """``[C(k, tau) C(d - k, h - tau) for tau in 0..h]`` as exact Python ints."""
    _check("signds.omega", k, d, h)
    return [math.comb(k, t) * math.comb(d - k, h - t) for t in range(h + 1)]


def log_omega(k, d, h):
    """``log omega_tau`` (``-inf`` where it is 0), for sizes whose counts overflow floats."""
    _check("signds.log_omega", k, d, h)
    out = np.full(h + 1, -np.inf)
    for t in range(h + 1):
        if t <= k and h - t <= d - k:
            out[t] = (math.lgamma(k + 1) - math.lgamma(t + 1) - math.lgamma(k - t + 1)
                      + math.lgamma(d - k + 1) - math.lgamma(h - t + 1)
                      - math.lgamma(d - k - h + t + 1))
    return out


def tau_probabilities(k, d, h, eps, nu_th):
    """``P(tau)`` for ``tau = 0..h`` (module docstring)."""
    _check("signds.tau_probabilities", k, d, h, nu_th)
    if not eps >= 0:
        raise ArgumentError(f"signds.tau_probabilities: eps={eps!r} must be >= 0")
    logits = log_omega(k, d, h) + eps * (np.arange(h + 1) >= nu_th)
    logits -= logits.max()
    p = np.exp(logits)
    return p / p.sum()


def em_mds(topk, d, h, eps, nu_th, rng):
    """The ``h`` dimensions (sorted) the exponential mechanism reports for top-k set ``topk``."""
    topk = np.unique(np.asarray(topk, dtype=np.int64))
    k = len(topk)
    _check("signds.em_mds", k, d, h, nu_th)
    if topk.min() < 0 or topk.max() >= d:
        raise ArgumentError(f"signds.em_mds: top-k indices must lie in 0..{d - 1}")
    tau = rng.choice(h + 1, p=tau_probabilities(k, d, h, eps, nu_th))
    rest = np.setdiff1d(np.arange(d), topk, assume_unique=True)
    chosen = np.concatenate([rng.choice(topk, size=tau, replace=False),
                             rng.choice(rest, size=h - tau, replace=False)])
    return np.sort(chosen)


def client_update(update, k, h, eps, nu_th, rng):
    """A client's SignDS report ``(sign, dims)`` for its flat update vector."""
    update = np.asarray(update).reshape(-1)
    sign = 1 if rng.random() < 0.5 else -1
    topk = np.argsort(-sign * update, kind="stable")[:k]
    return sign, em_mds(topk, update.size, h, eps, nu_th, rng)


def aggregate(d, uploads, lr):
    """The server's step from ``[(sign, dims), ...]``: ``lr * (sum of signs per dimension) /
    number of clients``."""
    if not uploads:
        raise ArgumentError("signds.aggregate: no uploads")
    votes = np.zeros(d)
    for sign, dims in uploads:
        np.add.at(votes, np.asarray(dims, dtype=np.int64), float(sign))
    return lr * votes / len(uploads)
