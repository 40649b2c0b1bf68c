"""Primes, Diffie–Hellman, the mask PRG, ring arithmetic and Shamir sharing of
``mlsys_lab.federated.crypto``, each against an independent oracle (a sieve, the RFC's own
formula for its prime, Euler's criterion, exhaustive enumeration over a small field)."""

from __future__ import annotations

import itertools
import random
from decimal import Decimal, getcontext

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError, DTypeError
from mlsys_lab.federated.crypto import dh, prg, primes, shamir


def _sieve(n):
    is_p = np.ones(n, dtype=bool)
    is_p[:2] = False
    for i in range(2, int(n ** 0.5) + 1):
        if is_p[i]:
            is_p[i * i::i] = False
    return is_p


def test_miller_rabin_agrees_with_a_sieve_and_rejects_carmichael_numbers():
    table = _sieve(20_000)
    assert [primes.is_probable_prime(k) for k in range(20_000)] == table.tolist()
    for carmichael in (561, 1105, 1729, 2465, 2821, 6601, 8911, 41041, 825265, 321197185):
        assert not primes.is_probable_prime(carmichael)
    assert primes.is_probable_prime(2 ** 127 - 1) and not primes.is_probable_prime(2 ** 128 + 1)


def test_random_prime_has_the_size_asked_for_and_is_reproducible_by_seed():
    for bits in (16, 64, 200):
        p = primes.random_prime(bits, rng=bits)
        assert p.bit_length() == bits and primes.is_probable_prime(p)
        assert p == primes.random_prime(bits, rng=bits)
    with pytest.raises(ArgumentError, match="random_prime"):
        primes.random_prime(4)
    with pytest.raises(ArgumentError, match="as_rng"):
        primes.as_rng("seed")
    assert isinstance(primes.as_rng(None), random.SystemRandom)  # secrets' generator by default
    assert primes.as_rng(5).random() == random.Random(5).random()
    assert primes.byte_length(256) == 1 and primes.byte_length(257) == 2
    assert primes.byte_length(2 ** 2048) == 256


def _pi(digits):
    getcontext().prec = digits

    def arctan_inv(x):
        x, total, term, k, sign = Decimal(x), Decimal(0), 1 / Decimal(x), 1, 1
        while term > Decimal(10) ** -(digits - 5):
            total += sign * term / k
            term /= x * x
            k, sign = k + 2, -sign
        return total

    return 4 * (4 * arctan_inv(5) - arctan_inv(239))


def test_modp_2048_is_rfc_3526s_formula_and_a_safe_prime():
    pi = _pi(700)
    assert dh.MODP_2048.p == 2 ** 2048 - 2 ** 1984 - 1 + 2 ** 64 * (
        int(Decimal(2) ** 1918 * pi) + 124476)
    for group in (dh.MODP_2048, dh.TOY_256):
        rounds = 4 if group.bits > 1000 else 40  # 4^-4 per composite; the RFC proves it prime
        assert primes.is_probable_prime(group.p, rounds)
        assert primes.is_probable_prime(group.q, rounds)
        assert group.p % 8 == 7 and pow(group.g, group.q, group.p) == 1  # g in the order-q group
    assert dh.MODP_2048.bits == 2048 and dh.TOY_256.p == 2 ** 256 - 36113


def test_both_sides_agree_on_the_same_key_and_third_parties_do_not():
    rng = random.Random(3)
    for group in (dh.TOY_256, dh.MODP_2048):
        (sa, pa), (sb, pb), (sc, pc) = (dh.keypair(group, rng) for _ in range(3))
        assert dh.agree(group, sa, pb) == dh.agree(group, sb, pa) == pow(group.g, sa * sb, group.p)
        assert dh.agree(group, sc, pb) != dh.agree(group, sa, pb)
        ab = dh.shared_seed(group, dh.agree(group, sa, pb), b"mask")
        assert ab == dh.shared_seed(group, dh.agree(group, sb, pa), b"mask") and len(ab) == 32
        assert ab != dh.shared_seed(group, dh.agree(group, sb, pa), b"enc")
    assert dh.keypair(dh.MODP_2048, 1)[0] < 2 ** 256  # RFC 3526's short exponents


def test_public_keys_outside_the_subgroup_are_refused():
    g = dh.TOY_256
    s, _ = dh.keypair(g, 0)
    non_residue = next(a for a in range(2, 100) if pow(a, g.q, g.p) != 1)
    for bad in (0, 1, g.p - 1, g.p, non_residue):
        with pytest.raises(ArgumentError, match="order-q subgroup"):
            dh.agree(g, s, bad)


def test_jacobi_symbol_is_eulers_criterion_on_a_prime():
    rng = random.Random(5)
    for p in (dh.TOY_256.p, 10007, 2 ** 127 - 1):
        for _ in range(200):
            a = rng.randrange(1, p)
            assert dh.jacobi(a, p) == (1 if pow(a, (p - 1) // 2, p) == 1 else -1)


def test_prg_is_deterministic_in_range_and_seed_sensitive():
    a = prg.expand(b"k" * 32, 1000, 20)
    assert a.dtype == np.uint64 and a.shape == (1000,) and int(a.max()) < 2 ** 20
    assert np.array_equal(a, prg.expand(b"k" * 32, 1000, 20))
    assert np.array_equal(prg.expand(b"k" * 32, 10, 20), a[:10])  # a prefix of the stream
    assert (a != prg.expand(b"j" * 32, 1000, 20)).mean() > 0.99
    full = prg.expand(b"k" * 32, 5000, 64)
    assert int(full.max()) > 2 ** 63  # the top bit is used in Z_2^64
    with pytest.raises(DTypeError, match="expand"):
        prg.expand("k", 3)
    with pytest.raises(ArgumentError, match="bits"):
        prg.expand(b"k", 3, 65)


@pytest.mark.parametrize("bits", [8, 32, 63, 64])
def test_ring_arithmetic_matches_python_ints_mod_2_to_the_k(bits):
    rng = np.random.default_rng(bits)
    a = rng.integers(0, 2 ** 62, 500, dtype=np.uint64) & prg.ring_mask(bits)
    b = rng.integers(0, 2 ** 62, 500, dtype=np.uint64) * np.uint64(3) & prg.ring_mask(bits)
    M = 2 ** bits
    pairs = [(int(x), int(y)) for x, y in zip(a, b)]
    assert [int(v) for v in prg.ring_add(a, b, bits)] == [(x + y) % M for x, y in pairs]
    assert [int(v) for v in prg.ring_sub(a, b, bits)] == [(x - y) % M for x, y in pairs]
    assert [int(v) for v in prg.ring_neg(a, bits)] == [(-int(x)) % M for x in a]
    rows = [a, b, a]
    assert [int(v) for v in prg.ring_sum(rows, bits)] == [
        (2 * int(x) + int(y)) % M for x, y in zip(a, b)]


def test_fixed_point_round_trips_negatives_and_sums_in_the_ring():
    x = np.array([-3.75, 0.0, 1e-3, 2.5, -1e-6])
    for bits in (32, 48, 64):
        enc = prg.encode_fixed(x, 16, bits)
        assert np.array_equal(prg.decode_fixed(enc, 16, bits), np.round(x * 2 ** 16) / 2 ** 16)
        total = prg.ring_sum([enc] * 5, bits)
        assert np.allclose(prg.decode_fixed(total, 16, bits), 5 * np.round(x * 2 ** 16) / 2 ** 16,
                           rtol=0, atol=0)
    with pytest.raises(ArgumentError, match="encode_fixed"):
        prg.encode_fixed([40000.0], 16, 32)


def test_shamir_t_minus_one_shares_are_consistent_with_every_secret_exhaustively():
    """Over GF(11), t = 3, five parties: enumerate every polynomial of degree 2 (all secrets,
    all coefficients) through the library's sharing; for every pair of parties and every pair
    of share values seen, each secret occurs exactly once (p^(t-1-(t-1)) = 1 polynomial)."""
    P, t, n = 11, 3, 5
    xs = list(range(1, n + 1))
    views = {}
    for secret, c1, c2 in itertools.product(range(P), repeat=3):
        shares = [(x, shamir.evaluate([secret, c1, c2], x, P)) for x in xs]
        for pair in itertools.combinations(range(n), t - 1):
            views.setdefault((pair, tuple(shares[i][1] for i in pair)), []).append(secret)
        for triple in itertools.combinations(range(n), t):  # and t shares pin it down
            assert shamir.reconstruct([shares[i] for i in triple], P) == secret
    assert len(views) == 10 * P * P
    assert all(sorted(secrets) == list(range(P)) for secrets in views.values())


def test_shamir_share_draws_a_degree_t_minus_1_polynomial_and_any_t_shares_recover():
    P = 2 ** 127 - 1
    rng = random.Random(9)
    for t, n in ((1, 1), (2, 3), (3, 5), (5, 9)):
        secret = rng.randrange(P)
        shares = shamir.share(secret, t, n, P, rng)
        for subset in itertools.combinations(shares, t):
            assert shamir.reconstruct(subset, P, threshold=t) == secret
        if t > 1:  # t - 1 shares interpolate a degree-(t-2) polynomial: not the secret
            assert shamir.reconstruct(shares[:t - 1], P) != secret
            with pytest.raises(ArgumentError, match="threshold"):
                shamir.reconstruct(shares[:t - 1], P, threshold=t)
    with pytest.raises(ArgumentError, match="threshold"):
        shamir.share(1, 4, 3, P)
    with pytest.raises(ArgumentError, match="x-coordinates"):
        shamir.share(1, 2, 3, P, xs=[1, 1, 2])
