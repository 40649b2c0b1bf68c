"""RSA blind-signature PSI: textbook RSA against pow, blinding and unblinding, and the
protocol finding exactly the intersection of random sets (the oracle: Python's set &)."""

from __future__ import annotations

import random

import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto import psi, rsa
from mlsys_lab.federated.crypto.primes import is_probable_prime

KEY = rsa.generate(512, rng=1)


def test_rsa_key_and_raw_operations():
    k = KEY
    assert k.n.bit_length() == 512 and k.n == k.p * k.q
    assert is_probable_prime(k.p) and is_probable_prime(k.q)
    rng = random.Random(2)
    for _ in range(50):
        x = rng.randrange(k.n)
        s = rsa.sign_raw(k, x)
        assert s == pow(x, k.d, k.n)  # CRT signing equals one pow mod n
        assert rsa.verify_raw(k.public, s) == x
    with pytest.raises(ArgumentError, match="bits"):
        rsa.generate(63)


def test_blinding_hides_the_hash_and_unblinding_gives_the_plain_signature():
    pub, rng = KEY.public, random.Random(3)
    h = psi.hash_to_ring("alice", pub.n)
    ys = []
    for _ in range(5):
        r = rng.randrange(2, pub.n - 1)
        y = psi.blind(h, r, pub)
        ys.append(y)
        assert y != h
        assert psi.unblind(rsa.sign_raw(KEY, y), r, pub) == pow(h, KEY.d, KEY.n)
        # forgetting R^-1 leaves H(b)^d · R, not the signature A published
        assert rsa.sign_raw(KEY, y) != pow(h, KEY.d, KEY.n)
    assert len(set(ys)) == 5  # the same id blinds differently every time


def test_hash_to_ring_is_deterministic_and_spread_over_z_n():
    n = KEY.n
    values = [psi.hash_to_ring(i, n) for i in range(400)]
    assert values == [psi.hash_to_ring(i, n) for i in range(400)]
    assert len(set(values)) == 400 and all(0 <= v < n for v in values)
    assert sum(v > n // 2 for v in values) in range(160, 241)  # about half above n/2
    assert psi.hash_to_ring("1", n) == psi.hash_to_ring(1, n)  # ints hash as their decimal text
    with pytest.raises(ArgumentError, match="psi"):
        psi.hash_to_ring(1.5, n)


@pytest.mark.parametrize("seed", range(5))
def test_psi_finds_exactly_the_intersection(seed):
    rng = random.Random(seed)
    universe = [f"id-{k}" for k in range(200)] + list(range(1000, 1100))
    a = rng.sample(universe, rng.randrange(0, 80))
    b = rng.sample(universe, rng.randrange(0, 80))
    res = psi.private_set_intersection(a, b, KEY, rng=seed)
    assert res.intersection == [x for x in b if x in set(a)]  # exactly, in B's order
    assert res.messages == 4 and res.bytes["B->A"] == 64 * len(b)


def test_psi_edge_cases_and_a_generated_key():
    assert psi.private_set_intersection([], ["x"], KEY, rng=0).intersection == []
    both = psi.private_set_intersection(["x", "y"], ["y", "x"], KEY, rng=0)
    assert both.intersection == ["y", "x"]
    assert psi.private_set_intersection([b"\x00"], [b"\x00", b"\x01"], bits=256,
                                        rng=1).intersection == [b"\x00"]


def test_the_receiver_must_blind_before_it_can_intersect():
    receiver = psi.PSIReceiver(["a", "b"], KEY.public, rng=0)
    with pytest.raises(ArgumentError, match="blinded"):
        receiver.intersect([1, 2], set())
