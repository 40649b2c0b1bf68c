"""Private set intersection by RSA blind signatures (the sample alignment of vertical FL).

Party A (the **signer**) holds ids a_j and an RSA key (n, e, d); party B (the **receiver**)
holds ids b_i and the public key. With a full-domain hash H into Z_n and a second hash H′:

1. A publishes t_j = H′(H(a_j)^d mod n) for its ids.
2. B picks a random R_i ∈ Z_n^* per id and sends the blinded y_i = H(b_i) · R_i^e mod n.
3. A signs blindly: y_i^d = H(b_i)^d · R_i mod n (it sees only random-looking y_i).
4. B unblinds, z_i = y_i^d · R_i^-1 = H(b_i)^d mod n, and keeps b_i when H′(z_i) is among
   the t_j.

B learns which of its ids A has (and nothing about A's other ids: without d it cannot compute
H(x)^d for a guess x); A learns how many ids B has. Comparing raw hashes H(b_i) instead would
let either side test any guessed id against the other's list.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto import rsa
from mlsys_lab.federated.crypto.primes import as_rng, int_to_bytes

__all__ = ["hash_to_ring", "outer_hash", "PSISigner", "PSIReceiver", "PSIResult",
           "private_set_intersection", "blind", "unblind"]


def _item_bytes(item) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, int) and not isinstance(item, bool):
        return str(item).encode("ascii")
    raise ArgumentError(f"psi: ids must be str, bytes or int, got {type(item).__name__}")


def hash_to_ring(item, n: int) -> int:
    """H: a full-domain hash of an id into Z_n (SHAKE-256 of the id, 16 bytes longer than n,
    reduced mod n so the bias is below 2^-128)."""
    length = (n.bit_length() + 7) // 8 + 16
    return int.from_bytes(hashlib.shake_256(b"H|" + _item_bytes(item)).digest(length),
                          "big") % n


def outer_hash(z: int, n: int) -> bytes:
    """H′: SHA-256 of a signature (fixed width), what A publishes and B compares."""
    return hashlib.sha256(b"H'|" + int_to_bytes(z, (n.bit_length() + 7) // 8)).digest()


def blind(h: int, r: int, key: rsa.RSAPublicKey) -> int:
    """y = h · r^e mod n."""
    return h * pow(r, key.e, key.n) % key.n


def unblind(signed: int, r: int, key: rsa.RSAPublicKey) -> int:
    """z = signed · r^-1 mod n."""
    return signed * pow(r, -1, key.n) % key.n


class PSISigner:
    """Party A: its ids and its RSA private key.

    Args:
        items: A's ids (str, bytes or int).
        key: an ``rsa.RSAPrivateKey``.
    """

    def __init__(self, items, key: rsa.RSAPrivateKey):
        self.items, self.key = list(items), key

    @property
    def public_key(self) -> rsa.RSAPublicKey:
        return self.key.public

    def published(self) -> set[bytes]:
        """``{t_j = H′(H(a_j)^d mod n)}``."""
        n = self.key.n
        return {outer_hash(rsa.sign_raw(self.key, hash_to_ring(a, n)), n) for a in self.items}

    def sign_blinded(self, blinded) -> list[int]:
        """``[y_i^d mod n]`` for B's blinded ids."""
        return [rsa.sign_raw(self.key, int(y) % self.key.n) for y in blinded]


class PSIReceiver:
    """Party B: its ids, A's public key, and the blinding factors it keeps secret.

    Args:
        items: B's ids.
        public_key: A's ``rsa.RSAPublicKey``.
        rng: draws the blinding factors R_i (``primes.as_rng``).
    """

    def __init__(self, items, public_key: rsa.RSAPublicKey, rng=None):
        self.items, self.key, self._rng = list(items), public_key, as_rng(rng)
        self._r: list[int] = []

    def blinded(self) -> list[int]:
        """``[y_i = H(b_i) · R_i^e mod n]`` with fresh R_i, coprime to n."""
        n = self.key.n
        self._r = []
        for _ in self.items:
            while True:
                r = self._rng.randrange(2, n - 1)
                if math.gcd(r, n) == 1:
                    break
            self._r.append(r)
        return [blind(hash_to_ring(b, n), r, self.key) for b, r in zip(self.items, self._r)]

    def intersect(self, signed, published) -> list:
        """B's ids whose unblinded signature's H′ is among A's published values (B's order)."""
        if len(signed) != len(self.items) or len(self._r) != len(self.items):
            raise ArgumentError(f"PSIReceiver.intersect: {len(signed)} signatures for "
                                f"{len(self.items)} ids (call blinded() first)")
        n = self.key.n
        published = set(published)
        return [b for b, s, r in zip(self.items, signed, self._r)
                if outer_hash(unblind(int(s), r, self.key), n) in published]


@dataclass
class PSIResult:
    """The intersection (in B's order), and what crossed the wire.

    Attributes:
        intersection: ids both hold.
        messages: number of messages.
        bytes: ``{"A->B": ..., "B->A": ...}``.
    """

    intersection: list
    messages: int
    bytes: dict = field(default_factory=dict)


def private_set_intersection(items_a, items_b, key: rsa.RSAPrivateKey | None = None, *,
                             bits: int = 1024, rng=None) -> PSIResult:
    """Run the protocol between A (``items_a``, signs) and B (``items_b``, learns the result).

    Args:
        items_a: A's ids.
        items_b: B's ids.
        key: A's RSA key; generated with ``bits`` when ``None``.
        bits: modulus size for a generated key.
        rng: key generation and blinding (``primes.as_rng``).
    """
    r = as_rng(rng)
    key = key or rsa.generate(bits, r)
    signer, receiver = PSISigner(items_a, key), PSIReceiver(items_b, key.public, r)
    published = signer.published()
    blinded = receiver.blinded()
    signed = signer.sign_blinded(blinded)
    inter = receiver.intersect(signed, published)
    e = key.public.element_bytes
    return PSIResult(inter, messages=4,
                     bytes={"A->B": e + 4 + 32 * len(published) + e * len(signed),
                            "B->A": e * len(blinded)})
