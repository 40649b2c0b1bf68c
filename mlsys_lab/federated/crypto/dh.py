"""Diffie–Hellman key agreement over a prime-order subgroup of Z_p^* (p a safe prime).

Two groups are defined: **MODP_2048**, the 2048-bit MODP group 14 of RFC 3526 (p = 2^2048 −
2^1984 − 1 + 2^64·(⌊2^1918·π⌋ + 124476), generator 2), and **TOY_256**, the largest 256-bit
safe prime p ≡ 7 (mod 8), p = 2^256 − 36113, generator 2 — fast, for tests and notebooks, far
too small for real use. In both, p = 2q + 1 with q prime and 2 is a quadratic residue (p ≡ 7
mod 8), so 2 generates the subgroup of order q: a public key is g^s mod p with s ∈ [2, q − 1],
and the shared secret g^(s_u s_v) mod p is hashed (SHA-256) into a seed for the PRG.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto.primes import as_rng, byte_length, int_to_bytes

__all__ = ["DHGroup", "MODP_2048", "TOY_256", "keypair", "agree", "shared_seed", "check_public",
           "jacobi"]


@dataclass(frozen=True)
class DHGroup:
    """A safe-prime group: modulus p = 2q + 1, generator g of the order-q subgroup.

    Attributes:
        name: how the group is stated ("RFC 3526 MODP group 14 (2048-bit)").
        p: the safe prime.
        g: the generator.
        exponent_bits: size of the secret exponents; ``None`` draws them from [2, q − 1].
            RFC 3526 (§8) asks for exponents of at least twice the group's strength: 256 bits
            for the 2048-bit group (≈ 110–160-bit strength) costs 8× less than 2047 bits.
    """

    name: str
    p: int
    g: int
    exponent_bits: int | None = None

    @property
    def q(self) -> int:
        """The prime order of the subgroup g generates, (p - 1) // 2."""
        return (self.p - 1) // 2

    @property
    def element_bytes(self) -> int:
        """Bytes of one group element on the wire (a public key)."""
        return byte_length(self.p)

    @property
    def bits(self) -> int:
        """Size of p in bits."""
        return self.p.bit_length()


_MODP_2048_HEX = (
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74"
    "020BBEA63B139B22514A08798E3404DDEF9519B3CD3A431B302B0A6DF25F1437"
    "4FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B0BFF5CB6F406B7ED"
    "EE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF05"
    "98DA48361C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB"
    "9ED529077096966D670C354E4ABC9804F1746C08CA18217C32905E462E36CE3B"
    "E39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF695581718"
    "3995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF"
)

MODP_2048 = DHGroup("RFC 3526 MODP group 14 (2048-bit)", int(_MODP_2048_HEX, 16), 2, 256)
TOY_256 = DHGroup("toy 256-bit safe prime 2^256 - 36113 (teaching only)", 2 ** 256 - 36113, 2)


def keypair(group: DHGroup, rng=None) -> tuple[int, int]:
    """A secret exponent s and the public key g^s mod p: s uniform in [2, q − 1], or in
    [2, 2^exponent_bits) when the group sets ``exponent_bits``.

    Args:
        group: the group (MODP_2048 or TOY_256).
        rng: see :func:`mlsys_lab.federated.crypto.primes.as_rng`.

    Returns:
        (secret, public).
    """
    top = group.q if group.exponent_bits is None else 1 << group.exponent_bits
    s = as_rng(rng).randrange(2, top)
    return s, pow(group.g, s, group.p)


def check_public(group: DHGroup, public: int, who: str = "agree") -> int:
    """Refuse a public key outside the order-q subgroup (0, 1, p − 1, or a non-residue): a
    small-subgroup element would let the other side learn bits of the secret."""
    if not isinstance(public, int) or not 1 < public < group.p - 1 or \
            jacobi(public, group.p) != 1:
        raise ArgumentError(f"{who}: public key is not an element of the order-q subgroup of "
                            f"{group.name}")
    return public


def jacobi(a: int, n: int) -> int:
    """The Jacobi symbol (a / n) for odd n > 0, by quadratic reciprocity (for a prime n it is
    the Legendre symbol: +1 exactly on the quadratic residues, which for a safe prime are the
    order-q subgroup) — much cheaper than Euler's criterion a^q mod p."""
    if n <= 0 or n % 2 == 0:
        raise ArgumentError(f"jacobi: n must be odd and positive, got {n}")
    a %= n
    result = 1
    while a:
        while a % 2 == 0:
            a //= 2
            if n % 8 in (3, 5):
                result = -result
        a, n = n, a
        if a % 4 == 3 and n % 4 == 3:
            result = -result
        a %= n
    return result if n == 1 else 0


def agree(group: DHGroup, secret: int, other_public: int) -> int:
    """The shared group element other_public^secret mod p (both sides get the same one).

    Raises:
        ArgumentError: other_public is not in the order-q subgroup.
    """
    check_public(group, other_public)
    return pow(other_public, secret, group.p)


def shared_seed(group: DHGroup, shared: int, context: bytes = b"") -> bytes:
    """32 bytes: SHA-256 of the shared element (fixed width) and a context label, the seed a
    PRG expands (different context labels give independent keys from one agreement)."""
    return hashlib.sha256(int_to_bytes(shared, group.element_bytes) + b"|" + context).digest()
