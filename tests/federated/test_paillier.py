"""Paillier: decryption inverts encryption, Dec(Enc(a)·Enc(b)) = a + b, Dec(Enc(a)^k) = k·a
(mod n, and for negatives in the signed reading), and fixed-point reals."""

from __future__ import annotations

import random

import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto import paillier as pl

SK = pl.generate(256, rng=4)
PK = SK.public


def test_key_and_round_trip():
    assert PK.n.bit_length() == 256 and PK.ciphertext_bytes == 64
    rng = random.Random(0)
    for m in [0, 1, PK.n - 1] + [rng.randrange(PK.n) for _ in range(30)]:
        c = pl.encrypt(PK, m, rng)
        assert 0 < c < PK.n2 and pl.decrypt(SK, c) == m


def test_encryption_is_randomised():
    rng = random.Random(1)
    cs = {pl.encrypt(PK, 42, rng) for _ in range(10)}
    assert len(cs) == 10 and {pl.decrypt(SK, c) for c in cs} == {42}


def test_addition_and_scalar_multiplication_are_homomorphic():
    rng = random.Random(2)
    for _ in range(40):
        a, b = rng.randrange(-2 ** 100, 2 ** 100), rng.randrange(-2 ** 100, 2 ** 100)
        k = rng.randrange(-2 ** 60, 2 ** 60)
        ca, cb = pl.encrypt(PK, a, rng), pl.encrypt(PK, b, rng)
        assert pl.decrypt(SK, pl.add(PK, ca, cb), signed=True) == a + b
        assert pl.decrypt(SK, pl.mul_plain(PK, ca, k), signed=True) == k * a
        assert pl.decrypt(SK, pl.add_plain(PK, ca, b), signed=True) == a + b
    big_a, big_b = PK.n - 5, 9  # wraps mod n
    assert pl.decrypt(SK, pl.add(PK, pl.encrypt(PK, big_a, rng), pl.encrypt(PK, big_b, rng))) == 4
    assert pl.decrypt(SK, pl.mul_plain(PK, pl.encrypt(PK, 7, rng), PK.n - 3), signed=True) == -21


def test_fixed_point_reals_with_negatives():
    rng = random.Random(3)
    fp = pl.FixedPoint(PK.n, 24)
    for _ in range(30):
        x, w = rng.uniform(-50, 50), rng.uniform(-3, 3)
        cx = pl.encrypt_real(PK, x, 24, rng)
        assert abs(pl.decrypt_real(SK, cx, 24) - x) <= 2 ** -25
        prod = pl.mul_plain(PK, cx, fp.encode(w))  # carries 2^48
        exact = round(x * 2 ** 24) * round(w * 2 ** 24)  # the fixed-point product, in integers
        assert pl.decrypt_real(SK, prod, 24, scale=2) == exact / 2 ** 48
        assert abs(pl.decrypt_real(SK, prod, 24, scale=2) - x * w) <= (abs(x) + abs(w)) * 2 ** -24
        total = pl.add(PK, cx, pl.encrypt_real(PK, -2 * x, 24, rng))
        assert abs(pl.decrypt_real(SK, total, 24) + x) <= 2 ** -24
    with pytest.raises(ArgumentError, match="FixedPoint.encode"):
        pl.FixedPoint(2 ** 40 + 15, 24).encode(1e6)


def test_bad_ciphertexts_and_keys_are_refused():
    with pytest.raises(ArgumentError, match="paillier.decrypt"):
        pl.decrypt(SK, 0)
    with pytest.raises(ArgumentError, match="paillier.add"):
        pl.add(PK, PK.n2, 1)
    with pytest.raises(ArgumentError, match="paillier.encrypt"):
        pl.encrypt(PK, 1.5)
    with pytest.raises(ArgumentError, match="paillier.generate"):
        pl.generate(31)


def test_crt_decryption_equals_the_textbook_formula():
    rng = random.Random(6)
    assert SK.p * SK.q == PK.n
    for m in [0, 1, PK.n - 1] + [rng.randrange(PK.n) for _ in range(30)]:
        c = pl.encrypt(PK, m, rng)
        assert pl.decrypt(SK, c, crt=True) == pl.decrypt(SK, c, crt=False) == m
    bare = pl.PaillierPrivateKey(PK, SK.lam, SK.mu)  # without the primes: the formula
    assert pl.decrypt(bare, pl.encrypt(PK, 77, rng)) == 77
