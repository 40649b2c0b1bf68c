"""Shamir's t-out-of-n secret sharing over a prime field GF(P).

The dealer picks a random polynomial f of degree t − 1 with f(0) = secret and hands party i
the share (i, f(i)). Any t shares determine f, hence f(0), by Lagrange interpolation at 0; any
t − 1 shares are consistent with every secret equally often (for each candidate secret there
is exactly one polynomial through those t − 1 points and (0, secret)), so they reveal nothing.
"""

from __future__ import annotations

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto.primes import as_rng

__all__ = ["evaluate", "share", "reconstruct", "lagrange_at_zero"]


def evaluate(coefficients, x: int, prime: int) -> int:
    """``f(x) mod prime`` for ``f = c0 + c1 x + ... `` (Horner)."""
    y = 0
    for c in reversed(list(coefficients)):
        y = (y * x + c) % prime
    return y


def share(secret: int, threshold: int, n: int, prime: int, rng=None,
          xs=None) -> list[tuple[int, int]]:
    """Split ``secret`` into ``n`` shares, any ``threshold`` of which recover it.

    Args:
        secret: an integer in ``[0, prime)``.
        threshold: t, shares needed (1 ≤ t ≤ n).
        n: number of shares.
        prime: the field's modulus (a prime larger than the secret and than ``n``).
        rng: draws the t − 1 random coefficients (see ``primes.as_rng``).
        xs: the x-coordinates (distinct, non-zero mod prime); default ``1..n``.

    Returns:
        ``[(x, f(x)), ...]``, one per party.
    """
    if not 1 <= threshold <= n:
        raise ArgumentError(f"share: need 1 <= threshold <= n, got threshold={threshold}, n={n}")
    if not 0 <= secret < prime:
        raise ArgumentError(f"share: secret must be in [0, prime), prime has "
                            f"{prime.bit_length()} bits, secret {secret.bit_length()}")
    xs = list(range(1, n + 1)) if xs is None else [int(x) for x in xs]
    if len(xs) != n or len({x % prime for x in xs}) != n or any(x % prime == 0 for x in xs):
        raise ArgumentError(f"share: need {n} distinct non-zero x-coordinates mod prime, "
                            f"got {xs}")
    r = as_rng(rng)
    coefficients = [secret] + [r.randrange(prime) for _ in range(threshold - 1)]
    return [(x, evaluate(coefficients, x, prime)) for x in xs]


def lagrange_at_zero(xs, prime: int) -> list[int]:
    """The weights ``λ_j = Π_{m≠j} x_m / (x_m − x_j) mod prime`` with ``f(0) = Σ λ_j f(x_j)``."""
    xs = [int(x) % prime for x in xs]
    if len(set(xs)) != len(xs) or 0 in xs:
        raise ArgumentError(f"lagrange_at_zero: x-coordinates must be distinct and non-zero "
                            f"mod prime, got {xs}")
    weights = []
    for j, xj in enumerate(xs):
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num = num * xm % prime
                den = den * (xm - xj) % prime
        weights.append(num * pow(den, -1, prime) % prime)
    return weights


def reconstruct(shares, prime: int, threshold: int | None = None) -> int:
    """The secret ``f(0)`` from shares ``[(x, y), ...]`` (Lagrange interpolation at 0).

    Args:
        shares: at least ``threshold`` shares with distinct x.
        prime: the field's modulus.
        threshold: when given, fewer shares raise instead of returning a wrong value
            (with t − 1 shares the interpolation gives a value unrelated to the secret).
    """
    shares = [(int(x), int(y)) for x, y in shares]
    if threshold is not None and len(shares) < threshold:
        raise ArgumentError(f"reconstruct: {len(shares)} shares, the threshold is {threshold}")
    if not shares:
        raise ArgumentError("reconstruct: no shares")
    weights = lagrange_at_zero([x for x, _ in shares], prime)
    return sum(w * y for w, (_, y) in zip(weights, shares)) % prime
