"""Textbook RSA (no padding), enough for blind signatures: key generation from two random
primes, e = 65537, d = e^-1 mod λ(n), and the raw operations x^d mod n (sign) and
x^e mod n (verify). Raw RSA is malleable — that is exactly what blinding uses — so it must
never encrypt or sign messages directly outside a protocol like PSI's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto.primes import as_rng, byte_length, random_prime

__all__ = ["RSAPublicKey", "RSAPrivateKey", "generate", "sign_raw", "verify_raw"]


@dataclass(frozen=True)
class RSAPublicKey:
    """``(n, e)``."""

    n: int
    e: int

    @property
    def bits(self) -> int:
        """Size of the modulus in bits."""
        return self.n.bit_length()

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of Z_n on the wire."""
        return byte_length(self.n)


@dataclass(frozen=True)
class RSAPrivateKey:
    """``(n, e, d)`` with the primes ``p``, ``q`` (for CRT signing)."""

    n: int
    e: int
    d: int
    p: int
    q: int

    @property
    def public(self) -> RSAPublicKey:
        """The public half."""
        return RSAPublicKey(self.n, self.e)


def generate(bits: int = 1024, rng=None, e: int = 65537) -> RSAPrivateKey:
    """An RSA key with a ``bits``-bit modulus.

    Args:
        bits: modulus size (even, ≥ 64; the chapter uses 512–1024, real keys are ≥ 2048).
        rng: see ``primes.as_rng``.
        e: the public exponent.
    """
    if not isinstance(bits, int) or bits < 64 or bits % 2:
        raise ArgumentError(f"rsa.generate: bits must be an even int >= 64, got {bits!r}")
    r = as_rng(rng)
    while True:
        p, q = random_prime(bits // 2, r), random_prime(bits // 2, r)
        lam = math.lcm(p - 1, q - 1)
        if p != q and math.gcd(e, lam) == 1:
            return RSAPrivateKey(p * q, e, pow(e, -1, lam), p, q)


def sign_raw(key: RSAPrivateKey, x: int) -> int:
    """``x^d mod n``, by the Chinese remainder theorem (≈ 3× faster than one pow mod n)."""
    if not 0 <= x < key.n:
        raise ArgumentError("rsa.sign_raw: x must be in [0, n)")
    sp = pow(x % key.p, key.d % (key.p - 1), key.p)
    sq = pow(x % key.q, key.d % (key.q - 1), key.q)
    h = (sp - sq) * pow(key.q, -1, key.p) % key.p
    return sq + h * key.q


def verify_raw(key: RSAPublicKey, s: int) -> int:
    """``s^e mod n`` (equals the signed x when s = x^d)."""
    return pow(s, key.e, key.n)
