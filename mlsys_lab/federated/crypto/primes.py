"""Randomness and primes for the teaching cryptography: where random numbers come from
(``secrets`` by default, a seeded ``random.Random`` when a notebook or test must be
reproducible), Miller–Rabin primality, random primes of a given size, modular helpers.
"""

from __future__ import annotations

import random
import secrets

from mlsys_lab.errors import ArgumentError

__all__ = ["as_rng", "byte_length", "int_to_bytes", "is_probable_prime", "random_prime"]

_SMALL_PRIMES = [p for p in range(3, 1000, 2) if all(p % d for d in range(3, int(p ** 0.5) + 1, 2))]


def as_rng(rng=None) -> random.Random:
    """The generator behind an ``rng=`` argument.

    Args:
        rng: ``None`` for ``secrets.SystemRandom()`` (what real use needs), an ``int`` seed
            for a reproducible ``random.Random`` (tests and notebooks only: a seeded Mersenne
            Twister is predictable), or a ``random.Random`` to use as is.

    Returns:
        A ``random.Random`` (``randrange``, ``getrandbits``, ``randbytes``).
    """
    if rng is None:
        return secrets.SystemRandom()
    if isinstance(rng, bool):
        raise ArgumentError(f"as_rng: rng must be None, an int seed or a random.Random, "
                            f"got {rng!r}")
    if isinstance(rng, int):
        return random.Random(rng)
    if isinstance(rng, random.Random):
        return rng
    raise ArgumentError(f"as_rng: rng must be None, an int seed or a random.Random, "
                        f"got {type(rng).__name__}")


def is_probable_prime(n: int, rounds: int = 40) -> bool:
    """Miller–Rabin with ``rounds`` bases drawn from a fixed-seed generator (deterministic:
    the same ``n`` always gets the same answer). A composite passes with probability at most
    4^-rounds; trial division by the primes below 1000 first.

    Args:
        n: the integer to test.
        rounds: number of random bases.
    """
    if n < 2:
        return False
    for p in [2] + _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    bases = random.Random(n & 0xFFFFFFFF)
    for _ in range(rounds):
        x = pow(bases.randrange(2, n - 1), d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def random_prime(bits: int, rng=None) -> int:
    """A random prime of exactly ``bits`` bits (the top two bits set, so a product of two has
    exactly ``2 * bits`` bits).

    Args:
        bits: size in bits, at least 8.
        rng: see :func:`as_rng`.
    """
    if not isinstance(bits, int) or bits < 8:
        raise ArgumentError(f"random_prime: bits must be an int >= 8, got {bits!r}")
    r = as_rng(rng)
    while True:
        candidate = r.getrandbits(bits) | (3 << (bits - 2)) | 1
        if is_probable_prime(candidate):
            return candidate


def byte_length(n: int) -> int:
    """Bytes needed to write any integer in ``[0, n)`` (the size of one element on the wire)."""
    return max(1, ((int(n) - 1).bit_length() + 7) // 8)


def int_to_bytes(x: int, length: int) -> bytes:
    """Big-endian bytes of a non-negative ``x`` in exactly ``length`` bytes."""
    return int(x).to_bytes(length, "big")
