"""A Rényi-DP accountant for the sampled Gaussian mechanism (DP-SGD's privacy cost).

One DP-SGD step samples each example with probability ``q`` (Poisson sampling), clips each
per-example gradient to norm ``C`` and adds ``N(0, sigma^2 C^2)`` to their sum. Mironov et
al. 2019 ("Rényi Differential Privacy of the Sampled Gaussian Mechanism") give its RDP at
order ``alpha`` as ``log(A_alpha) / (alpha - 1)`` with

* integer ``alpha``: ``A = sum_{k=0}^{alpha} C(alpha, k) (1-q)^(alpha-k) q^k
  exp((k^2 - k) / (2 sigma^2))`` (a finite sum of positive terms);
* fractional ``alpha``: the two infinite series of their Section 3.3, split at
  ``z0 = sigma^2 log(1/q - 1) + 1/2``, with generalised binomial coefficients (alternating
  signs past ``alpha``) weighted by Gaussian tails ``erfc``; summed in chunks of 512 terms (numpy)
  until the last term is ``e^-40`` below the sum so far.

RDP composes by addition over steps (Mironov 2017), and converts to ``(epsilon, delta)``-DP by
Balle et al. 2020's bound ``eps = rdp - (log delta + log alpha) / (alpha - 1) +
log((alpha - 1) / alpha)``, minimised over the orders. The default orders are Opacus's
(``1.1, 1.2, ..., 10.9, 12, 13, ..., 63``), so the numbers can be compared with its
``RDPAccountant`` (``tests/data/opacus_rdp_reference.npz``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ArgumentError

__all__ = ["DEFAULT_ORDERS", "RDPAccountant", "compute_rdp", "rdp_epsilon", "rdp_to_epsilon"]

DEFAULT_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)))


def _logsumexp(values):
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def _log_erfc(x):
    """``log(erfc(x))`` without underflow for large ``x`` (asymptotic series past 25)."""
    if x < 25.0:
        return math.log(math.erfc(x))
    inv = 1.0 / (x * x)
    return -x * x - math.log(x * math.sqrt(math.pi)) + math.log1p(
        -0.5 * inv + 0.75 * inv * inv - 1.875 * inv ** 3)


def _log_a_integer(q, sigma, alpha):
    a = int(alpha)
    terms = [math.log(math.comb(a, k)) + k * math.log(q) + (a - k) * math.log1p(-q)
             + (k * k - k) / (2.0 * sigma * sigma) for k in range(a + 1)]
    return _logsumexp(terms)


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def _log_erfc_array(x):
    """:func:`_log_erfc` over an array."""
    out = np.empty_like(x)
    small = x < 25.0
    out[small] = np.log(_ERFC(x[small]).astype(np.float64))
    big = x[~small]
    inv = 1.0 / (big * big)
    out[~small] = -big * big - np.log(big * math.sqrt(math.pi)) + np.log1p(
        -0.5 * inv + 0.75 * inv * inv - 1.875 * inv ** 3)
    return out


def _log_a_fractional(q, sigma, alpha, chunk=512):
    z0 = sigma * sigma * math.log(1.0 / q - 1.0) + 0.5
    log_q, log_1q = math.log(q), math.log1p(-q)
    root2s, two_s2 = math.sqrt(2.0) * sigma, 2.0 * sigma * sigma
    pos = neg = -math.inf                 # log of the positive and of the negative terms' sums
    log_binom0, sign0 = 0.0, 1.0          # C(alpha, 0) = 1
    for start in range(0, 10_000_000, chunk):
        i = np.arange(start, start + chunk, dtype=np.float64)
        j = alpha - i
        # generalised binomial coefficients: C(alpha, i+1) = C(alpha, i) (alpha - i) / (i + 1)
        factor = (alpha - i) / (i + 1)
        steps = np.log(np.abs(factor))
        log_binom = log_binom0 + np.concatenate([[0.0], np.cumsum(steps[:-1])])
        sign = sign0 * np.concatenate([[1.0], np.cumprod(np.sign(factor[:-1]))])
        log_binom0, sign0 = log_binom[-1] + steps[-1], sign[-1] * np.sign(factor[-1])
        s0 = (log_binom + i * log_q + j * log_1q + (i * i - i) / two_s2 + math.log(0.5)
              + _log_erfc_array((i - z0) / root2s))
        s1 = (log_binom + j * log_q + i * log_1q + (j * j - j) / two_s2 + math.log(0.5)
              + _log_erfc_array((z0 - j) / root2s))
        both = np.logaddexp(s0, s1)
        if np.any(sign > 0):
            pos = np.logaddexp(pos, np.logaddexp.reduce(both[sign > 0]))
        if np.any(sign < 0):
            neg = np.logaddexp(neg, np.logaddexp.reduce(both[sign < 0]))
        tail = np.maximum(s0, s1)[-1]
        if i[-1] > alpha + 1 and tail < pos - 40.0:
            break
    pos, neg = float(pos), float(neg)
    if neg == -math.inf:
        return pos
    if neg >= pos:
        raise ArgumentError(f"compute_rdp: the series for alpha={alpha}, q={q}, sigma={sigma} "
                            f"lost all precision")
    return pos + math.log1p(-math.exp(neg - pos))


def _rdp_one(q, sigma, alpha):
    if q == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if q == 1.0:
        return alpha / (2.0 * sigma * sigma)
    if float(alpha).is_integer():
        return _log_a_integer(q, sigma, alpha) / (alpha - 1)
    return _log_a_fractional(q, sigma, alpha) / (alpha - 1)


def compute_rdp(q, sigma, steps, orders=DEFAULT_ORDERS):
    """RDP of ``steps`` sampled Gaussian steps at each order (a numpy array).

    Args:
        q: sampling probability in ``[0, 1]``.
        sigma: noise multiplier (noise std over the clipping norm), ``>= 0``.
        steps: number of steps (composition adds RDP).
        orders: the orders ``alpha > 1``.
    """
    if not 0.0 <= q <= 1.0:
        raise ArgumentError(f"compute_rdp: q={q!r} must be in [0, 1]")
    if not sigma >= 0:
        raise ArgumentError(f"compute_rdp: sigma={sigma!r} must be >= 0")
    if steps < 0:
        raise ArgumentError(f"compute_rdp: steps={steps!r} must be >= 0")
    orders = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    if np.any(orders <= 1):
        raise ArgumentError("compute_rdp: every order must be > 1")
    return np.array([_rdp_one(float(q), float(sigma), float(a)) for a in orders]) * steps


def rdp_to_epsilon(orders, rdp, delta):
    """``(epsilon, best order)`` from RDP values at ``orders`` for a target ``delta`` (Balle et
    al. 2020's conversion, minimised over the orders)."""
    if not 0 < delta < 1:
        raise ArgumentError(f"rdp_to_epsilon: delta={delta!r} must be in (0, 1)")
    orders = np.atleast_1d(np.asarray(orders, dtype=np.float64))
    rdp = np.atleast_1d(np.asarray(rdp, dtype=np.float64))
    if orders.shape != rdp.shape:
        raise ArgumentError(f"rdp_to_epsilon: {orders.size} orders but {rdp.size} RDP values")
    eps = rdp - (math.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
    if np.all(np.isnan(eps)):
        return math.inf, math.nan
    best = int(np.nanargmin(eps))
    return float(eps[best]), float(orders[best])


def rdp_epsilon(q, sigma, steps, delta, orders=DEFAULT_ORDERS):
    """``(epsilon, best order)`` of ``steps`` DP-SGD steps with sampling rate ``q`` and noise
    multiplier ``sigma`` at ``delta``."""
    return rdp_to_epsilon(orders, compute_rdp(q, sigma, steps, orders), delta)


class RDPAccountant:
    """Keeps the (q, sigma, steps) history of a training run and converts it to epsilon."""

    def __init__(self, orders=DEFAULT_ORDERS):
        self.orders = tuple(orders)
        self.history = []

    def step(self, q, sigma, steps=1):
        """Record ``steps`` steps at sampling rate ``q`` and noise multiplier ``sigma``."""
        if self.history and self.history[-1][:2] == (q, sigma):
            self.history[-1] = (q, sigma, self.history[-1][2] + steps)
        else:
            self.history.append((q, sigma, steps))

    def epsilon(self, delta):
        """``(epsilon, best order)`` spent so far."""
        if not self.history:
            return 0.0, math.nan
        rdp = sum(compute_rdp(q, s, n, self.orders) for q, s, n in self.history)
        return rdp_to_epsilon(self.orders, rdp, delta)
