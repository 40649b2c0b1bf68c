"""A seeded pseudo-random generator for masks: a 32-byte seed expanded with SHAKE-256 into
``n`` elements of the ring Z_{2^k} (k ≤ 64), as ``uint64`` arrays. Expanding the same seed
gives the same mask on every machine, which is what lets two clients who agreed on a seed
cancel each other's masks bit for bit. Ring arithmetic on ``uint64`` wraps mod 2^64; the
helpers here reduce mod 2^k.
"""

from __future__ import annotations

import hashlib

import numpy as np

from mlsys_lab.errors import ArgumentError, DTypeError

__all__ = ["expand", "ring_mask", "ring_add", "ring_sub", "ring_neg", "ring_sum", "check_bits",
           "encode_fixed", "decode_fixed"]


def check_bits(bits: int, who: str) -> int:
    """``bits`` as the ring's k, refused unless an int in [1, 64]."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 1 <= bits <= 64:
        raise ArgumentError(f"{who}: bits must be an int in [1, 64] (the ring Z_2^bits), "
                            f"got {bits!r}")
    return int(bits)


def ring_mask(bits: int) -> np.uint64:
    """``2^bits - 1`` as a ``uint64`` (AND with it reduces mod 2^bits)."""
    return np.uint64((1 << check_bits(bits, "ring_mask")) - 1)


def expand(seed: bytes, n: int, bits: int = 32) -> np.ndarray:
    """``n`` pseudo-random elements of Z_{2^bits}: SHAKE-256(seed) read as little-endian
    ``uint64`` words, each reduced mod 2^bits.

    Args:
        seed: the key (bytes, typically 32 from :func:`dh.shared_seed`).
        n: number of elements.
        bits: the ring's k, 1..64.

    Returns:
        ``uint64`` array of shape ``(n,)``, every entry below 2^bits.
    """
    if not isinstance(seed, (bytes, bytearray)):
        raise DTypeError(f"expand: seed must be bytes, got {type(seed).__name__}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ArgumentError(f"expand: n must be a non-negative int, got {n!r}")
    bits = check_bits(bits, "expand")
    words = np.frombuffer(hashlib.shake_256(bytes(seed)).digest(8 * int(n)), dtype="<u8")
    return (words & ring_mask(bits)).astype(np.uint64)


def _as_ring(x, bits: int, who: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != np.uint64:
        if not np.issubdtype(x.dtype, np.integer):
            raise DTypeError(f"{who}: ring elements must be integer arrays, got dtype {x.dtype}")
        x = x.astype(np.uint64)  # negative ints wrap to two's complement mod 2^64
    return x & ring_mask(bits)


def ring_add(a, b, bits: int) -> np.ndarray:
    """``(a + b) mod 2^bits`` element-wise."""
    return (_as_ring(a, bits, "ring_add") + _as_ring(b, bits, "ring_add")) & ring_mask(bits)


def ring_sub(a, b, bits: int) -> np.ndarray:
    """``(a - b) mod 2^bits`` element-wise."""
    return (_as_ring(a, bits, "ring_sub") - _as_ring(b, bits, "ring_sub")) & ring_mask(bits)


def ring_neg(a, bits: int) -> np.ndarray:
    """``-a mod 2^bits`` element-wise."""
    return (np.uint64(0) - _as_ring(a, bits, "ring_neg")) & ring_mask(bits)


def ring_sum(rows, bits: int) -> np.ndarray:
    """Sum of a sequence of ring vectors mod 2^bits."""
    rows = [_as_ring(r, bits, "ring_sum") for r in rows]
    if not rows:
        raise ArgumentError("ring_sum: no vectors to add")
    total = np.zeros_like(rows[0])
    for r in rows:
        if r.shape != total.shape:
            raise ArgumentError(f"ring_sum: shapes differ, {r.shape} and {total.shape}")
        total = total + r
    return total & ring_mask(bits)


def encode_fixed(x, frac_bits: int, bits: int) -> np.ndarray:
    """Reals to Z_{2^bits}: ``round(x * 2^frac_bits)`` in two's complement (negatives wrap to
    the top half of the ring). A sum of n encodings decodes correctly while the true sum stays
    within ±2^(bits-1) / 2^frac_bits.

    Raises:
        ArgumentError: a value does not fit in half the ring.
    """
    bits = check_bits(bits, "encode_fixed")
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise ArgumentError("encode_fixed: values must be finite")
    q = np.round(x * float(2 ** frac_bits))
    limit = float(2 ** (bits - 1))
    if (np.abs(q) >= limit).any():
        raise ArgumentError(f"encode_fixed: |x| * 2^{frac_bits} must stay below 2^{bits - 1}; "
                            f"largest |x| is {np.abs(x).max():.4g}")
    return q.astype(np.int64).astype(np.uint64) & ring_mask(bits)


def decode_fixed(v, frac_bits: int, bits: int) -> np.ndarray:
    """Inverse of :func:`encode_fixed` (the top half of the ring reads as negative)."""
    bits = check_bits(bits, "decode_fixed")
    v = _as_ring(v, bits, "decode_fixed")
    shift = np.uint64(64 - bits)  # sign-extend: move bit k-1 to bit 63, shift back arithmetically
    signed = (v << shift).astype(np.int64) >> np.int64(64 - bits)
    return signed.astype(np.float64) / float(2 ** frac_bits)
