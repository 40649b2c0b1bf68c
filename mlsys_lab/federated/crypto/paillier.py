"""The Paillier cryptosystem: additively homomorphic public-key encryption.

Keys: n = pq (p, q primes of equal size), g = n + 1, λ = lcm(p − 1, q − 1),
μ = λ^-1 mod n. Encryption of m ∈ Z_n with a random r ∈ Z_n^*:
Enc(m) = (1 + n)^m · r^n mod n² = (1 + m·n) · r^n mod n². Decryption: m = L(c^λ mod n²) · μ
mod n with L(u) = (u − 1) / n. Homomorphisms (everything mod n):

* Enc(a) · Enc(b) = Enc(a + b) — ``add``;
* Enc(a)^k = Enc(k · a) — ``mul_plain`` (k a known integer; a negative k uses the inverse
  ciphertext, so the exponent stays small).

Reals travel in fixed point: ``encode(x) = round(x · 2^f) mod n``, the top half of Z_n reading
as negative. A product of two encodings carries 2^(2f); ``decrypt_real(c, scale=2)`` divides
it out.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto.primes import as_rng, byte_length, random_prime

__all__ = ["PaillierPublicKey", "PaillierPrivateKey", "generate", "encrypt", "decrypt", "add",
           "add_plain", "mul_plain", "FixedPoint", "encrypt_real", "decrypt_real"]


@dataclass(frozen=True)
class PaillierPublicKey:
    """``n`` (and ``n²``); g = n + 1 is implied."""

    n: int

    @property
    def n2(self) -> int:
        """n², the ciphertext modulus."""
        return self.n * self.n

    @property
    def bits(self) -> int:
        """Size of n in bits."""
        return self.n.bit_length()

    @property
    def ciphertext_bytes(self) -> int:
        """Bytes of one ciphertext on the wire (an element of Z_{n²})."""
        return byte_length(self.n2)


@dataclass(frozen=True)
class PaillierPrivateKey:
    """``λ``, ``μ`` and the public key; with the primes ``p``, ``q`` decryption runs mod p²
    and q² and is combined by the Chinese remainder theorem (about 4× faster)."""

    public: PaillierPublicKey
    lam: int
    mu: int
    p: int | None = None
    q: int | None = None


def generate(bits: int = 1024, rng=None) -> PaillierPrivateKey:
    """A key pair with an n of ``bits`` bits (the chapter uses 512; real keys are ≥ 2048)."""
    if not isinstance(bits, int) or bits < 32 or bits % 2:
        raise ArgumentError(f"paillier.generate: bits must be an even int >= 32, got {bits!r}")
    r = as_rng(rng)
    while True:
        p, q = random_prime(bits // 2, r), random_prime(bits // 2, r)
        n = p * q
        if p != q and math.gcd(n, (p - 1) * (q - 1)) == 1:
            lam = math.lcm(p - 1, q - 1)
            return PaillierPrivateKey(PaillierPublicKey(n), lam, pow(lam, -1, n), p, q)


def _check_ct(pk: PaillierPublicKey, c, who: str) -> int:
    if isinstance(c, bool) or not isinstance(c, int) or not 0 < c < pk.n2:
        raise ArgumentError(f"{who}: a ciphertext is an int in (0, n²)")
    return c


def encrypt(pk: PaillierPublicKey, m: int, rng=None) -> int:
    """Enc(m) = (1 + m·n) · r^n mod n² for m ∈ Z_n (negatives are taken mod n)."""
    if isinstance(m, bool) or not isinstance(m, int):
        raise ArgumentError(f"paillier.encrypt: m must be an int, got {type(m).__name__}")
    rr = as_rng(rng)
    while True:
        r = rr.randrange(1, pk.n)
        if math.gcd(r, pk.n) == 1:
            break
    return (1 + (m % pk.n) * pk.n) * pow(r, pk.n, pk.n2) % pk.n2


def decrypt(sk: PaillierPrivateKey, c: int, signed: bool = False, crt: bool = True) -> int:
    """m = L(c^λ mod n²) · μ mod n; with ``signed``, values above n/2 read as negative.

    With the key's primes (and ``crt``), m mod p = L_p(c^(p−1) mod p²) · h_p mod p, likewise
    mod q, combined by the CRT — the same m from two half-size exponentiations.
    """
    pk = sk.public
    _check_ct(pk, c, "paillier.decrypt")
    if crt and sk.p is not None and sk.q is not None:
        m = _decrypt_crt(sk, c)
    else:
        m = (pow(c, sk.lam, pk.n2) - 1) // pk.n * sk.mu % pk.n
    return m - pk.n if signed and m > pk.n // 2 else m


@functools.lru_cache(maxsize=64)
def _crt_h(r: int, n: int) -> int:
    """h_r = L_r(g^(r−1) mod r²)^-1 mod r for g = n + 1 (once per key and prime)."""
    r2 = r * r
    return pow((pow(n + 1, r - 1, r2) - 1) // r, -1, r)


def _decrypt_crt(sk: PaillierPrivateKey, c: int) -> int:
    parts = []
    for r in (sk.p, sk.q):
        r2 = r * r
        parts.append((pow(c % r2, r - 1, r2) - 1) // r * _crt_h(r, sk.public.n) % r)
    mp, mq = parts
    return mq + (mp - mq) * pow(sk.q, -1, sk.p) % sk.p * sk.q


def add(pk: PaillierPublicKey, c1: int, c2: int) -> int:
    """Enc(a) · Enc(b) mod n² = Enc(a + b)."""
    return _check_ct(pk, c1, "paillier.add") * _check_ct(pk, c2, "paillier.add") % pk.n2


def add_plain(pk: PaillierPublicKey, c: int, k: int) -> int:
    """Enc(a) · (1 + k·n) mod n² = Enc(a + k) for a known k (no randomness needed)."""
    return _check_ct(pk, c, "paillier.add_plain") * (1 + (k % pk.n) * pk.n) % pk.n2


def mul_plain(pk: PaillierPublicKey, c: int, k: int) -> int:
    """Enc(a)^k mod n² = Enc(k · a mod n); a negative k (or one above n/2, an encoded
    negative) inverts the ciphertext first so the exponent stays small."""
    _check_ct(pk, c, "paillier.mul_plain")
    k %= pk.n
    if k > pk.n // 2:  # an encoded negative: invert once, keep the exponent small
        k -= pk.n
    if k < 0:
        return pow(pow(c, -1, pk.n2), -k, pk.n2)
    return pow(c, k, pk.n2)


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point encoding of reals into Z_n with ``frac_bits`` fractional bits.

    Attributes:
        n: the plaintext modulus.
        frac_bits: f; a real x becomes round(x · 2^f) mod n.
    """

    n: int
    frac_bits: int = 24

    def encode(self, x: float, scale: int = 1) -> int:
        """round(x · 2^(f·scale)) mod n; refused when it does not fit in ±n/2."""
        v = round(float(x) * 2.0 ** (self.frac_bits * scale)) if scale else round(float(x))
        if abs(v) >= self.n // 2:
            raise ArgumentError(f"FixedPoint.encode: {x} · 2^{self.frac_bits * scale} does not "
                                f"fit in ±n/2 for a {self.n.bit_length()}-bit n")
        return v % self.n

    def decode(self, m: int, scale: int = 1) -> float:
        """The real that an integer (mod n) carrying 2^(f·scale) stands for."""
        m %= self.n
        if m > self.n // 2:
            m -= self.n
        return m / 2.0 ** (self.frac_bits * scale)


def encrypt_real(pk: PaillierPublicKey, x: float, frac_bits: int = 24, rng=None) -> int:
    """Enc(round(x · 2^frac_bits))."""
    return encrypt(pk, FixedPoint(pk.n, frac_bits).encode(x), rng)


def decrypt_real(sk: PaillierPrivateKey, c: int, frac_bits: int = 24, scale: int = 1) -> float:
    """The real a ciphertext carries at 2^(frac_bits · scale) (scale 2 after a product)."""
    return FixedPoint(sk.public.n, frac_bits).decode(decrypt(sk, c), scale)
