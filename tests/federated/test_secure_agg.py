"""Secure aggregation (Bonawitz et al. 2017): the unmasked sum is the plain sum bit for bit for
random client sets and every drop-out pattern the threshold allows, each masked upload is
uniform over the ring (chi-square), shares travel encrypted and authenticated, and the cost
per client is counted."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated.crypto import dh, prg, shamir
from mlsys_lab.federated.crypto import secure_agg as sa


def _inputs(ids, dim, bits, seed):
    rng = np.random.default_rng(seed)
    return {u: rng.integers(0, 2 ** min(bits, 62), dim, dtype=np.uint64) & prg.ring_mask(bits)
            for u in ids}


def _plain_sum(inputs, ids, bits):
    """The oracle: Python integers, mod 2^bits."""
    dim = len(next(iter(inputs.values())))
    return [sum(int(inputs[u][i]) for u in ids) % 2 ** bits for i in range(dim)]


def test_random_client_sets_sum_exactly():
    rng = random.Random(0)
    for trial in range(6):
        n = rng.randrange(2, 9)
        ids = sorted(rng.sample(range(1, 1000), n))
        bits = rng.choice([8, 20, 32, 64])
        t = rng.randrange(1, n + 1)
        inputs = _inputs(ids, rng.randrange(1, 40), bits, trial)
        res = sa.secure_aggregate(inputs, sa.SecAggParams(t, bits, dh.TOY_256), rng=trial)
        assert res.total.dtype == np.uint64
        assert [int(v) for v in res.total] == _plain_sum(inputs, ids, bits)
        assert res.included == ids and res.dropped == []


def test_every_drop_out_pattern_below_the_threshold_recovers_the_survivors_sum():
    """n = 5, t = 3: every set of clients that drop before uploading (their masks are rebuilt
    from shares of their keys) and every set of the remaining that drop before unmasking,
    as long as t answer in the last round; the sum is over exactly the uploaded inputs."""
    ids, t, bits = [1, 2, 3, 4, 5], 3, 16
    inputs = _inputs(ids, 6, bits, 1)
    params = sa.SecAggParams(t, bits, dh.TOY_256)
    runs = 0
    for k in range(len(ids) - t + 1):
        for gone in itertools.combinations(ids, k):
            uploaded = [u for u in ids if u not in gone]
            for j in range(len(uploaded) - t + 1):
                for silent in itertools.combinations(uploaded, j):
                    res = sa.secure_aggregate(inputs, params, drop_before_upload=gone,
                                              drop_before_unmasking=silent, rng=runs)
                    assert res.included == uploaded and res.dropped == list(gone)
                    assert [int(v) for v in res.total] == _plain_sum(inputs, uploaded, bits), \
                        (gone, silent)
                    runs += 1
    assert runs == (1 + 5 + 10) + 5 * (1 + 4) + 10 * 1


def test_drop_outs_before_sharing_are_simply_left_out():
    ids = [2, 4, 6, 8]
    inputs = _inputs(ids, 5, 32, 2)
    res = sa.secure_aggregate(inputs, sa.SecAggParams(2, 32, dh.TOY_256),
                              drop_before_sharing=[4], drop_before_upload=[8], rng=0)
    assert res.included == [2, 6] and res.dropped == [8]
    assert [int(v) for v in res.total] == _plain_sum(inputs, [2, 6], 32)


@pytest.mark.parametrize("where", ["drop_before_sharing", "drop_before_upload",
                                   "drop_before_unmasking"])
def test_fewer_than_threshold_survivors_abort(where):
    inputs = _inputs([1, 2, 3, 4], 3, 16, 3)
    with pytest.raises(sa.SecAggAbort, match="threshold 3"):
        sa.secure_aggregate(inputs, sa.SecAggParams(3, 16, dh.TOY_256), rng=0,
                            **{where: [1, 2]})


def test_the_real_group_sums_exactly_too():
    inputs = _inputs([1, 2, 3], 4, 32, 4)
    res = sa.secure_aggregate(inputs, sa.SecAggParams(2), drop_before_upload=[2], rng=0)
    assert res.cost[1].sent["advertise keys"] == 2 * 256  # two 2048-bit public keys
    assert [int(v) for v in res.total] == _plain_sum(inputs, [1, 3], 32)


def _chi_square_bound(df, z=3.719):
    """Wilson–Hilferty upper quantile of χ²(df) at z standard deviations (p ≈ 1e-4)."""
    c = 2 / (9 * df)
    return df * (1 - c + z * math.sqrt(c)) ** 3


def test_each_masked_upload_is_uniform_over_the_ring():
    """Five clients with constant inputs (the easiest to spot) in Z_2^8: each upload's 8192
    entries fall evenly in the 256 values (chi-square), and so do the differences of two
    uploads (no mask shared in the clear)."""
    bits, dim = 8, 8192
    inputs = {u: np.full(dim, 17 * u % 256, dtype=np.uint64) for u in range(1, 6)}
    res = sa.secure_aggregate(inputs, sa.SecAggParams(3, bits, dh.TOY_256), rng=7)
    expected = dim / 256
    bound = _chi_square_bound(255)
    for u, y in res.uploads.items():
        counts = np.bincount(y.astype(np.int64), minlength=256)
        assert counts.size == 256
        assert ((counts - expected) ** 2 / expected).sum() < bound, u
    diff = prg.ring_sub(res.uploads[1], res.uploads[2], bits).astype(np.int64)
    counts = np.bincount(diff, minlength=256)
    assert ((counts - expected) ** 2 / expected).sum() < bound
    assert [int(v) for v in res.total] == _plain_sum(inputs, range(1, 6), bits)


def test_the_chi_square_check_fails_an_unmasked_upload():
    """The same statistic on uploads that are not uniform (a constant input sent in the clear,
    values that miss part of the ring) is far above the bound: the check can fail."""
    x = np.full(8192, 17, dtype=np.int64)
    counts = np.bincount(x, minlength=256)
    assert ((counts - 32) ** 2 / 32).sum() > _chi_square_bound(255)
    skewed = np.random.default_rng(0).integers(0, 200, 8192)  # misses 56 of the 256 values
    counts = np.bincount(skewed, minlength=256)
    assert ((counts - 32) ** 2 / 32).sum() > _chi_square_bound(255)


def test_pairwise_masks_are_antisymmetric_and_cancel_bit_exactly():
    for bits in (1, 8, 33, 64):
        a = sa.pairwise_mask(b"s" * 32, 3, 9, 100, bits)
        b = sa.pairwise_mask(b"s" * 32, 9, 3, 100, bits)
        assert not np.array_equal(a, b) or bits == 1
        assert np.array_equal(prg.ring_add(a, b, bits), np.zeros(100, dtype=np.uint64))
    with pytest.raises(ArgumentError, match="itself"):
        sa.pairwise_mask(b"s", 3, 3, 4, 8)


def test_mask_input_is_x_plus_the_masks_and_checks_its_input():
    x = np.arange(10, dtype=np.uint64)
    y = sa.mask_input(x, 2, {1: b"a" * 32, 5: b"b" * 32}, b"c" * 32, 16)
    want = (x.astype(object) + prg.expand(b"c" * 32, 10, 16).astype(object)
            - prg.expand(b"a" * 32, 10, 16).astype(object)
            + prg.expand(b"b" * 32, 10, 16).astype(object)) % 2 ** 16
    assert [int(v) for v in y] == [int(v) for v in want]
    with pytest.raises(ArgumentError, match="uint64"):
        sa.mask_input(x.astype(np.float64), 2, {}, None, 16)
    with pytest.raises(ArgumentError, match="2\\^8"):
        sa.mask_input(np.array([300], dtype=np.uint64), 2, {}, None, 8)


def test_shares_travel_encrypted_and_tampering_is_detected():
    key = bytes(range(32))
    payload = b"share of a secret key" * 3
    ct = sa.encrypt_share(key, 1, 2, payload)
    assert payload not in ct and len(ct) == len(payload) + 32
    assert sa.decrypt_share(key, 1, 2, ct) == payload
    bad = bytes([ct[0] ^ 1]) + ct[1:]
    for args in ((key, 1, 2, bad), (key, 2, 1, ct), (bytes(32), 1, 2, ct)):
        with pytest.raises(ArgumentError, match="tag"):
            sa.decrypt_share(*args)


def test_a_client_never_reveals_both_secrets_of_one_peer():
    inputs = _inputs([1, 2, 3, 4], 2, 16, 5)
    params = sa.SecAggParams(2, 16, dh.TOY_256)
    clients = {u: sa.SecAggClient(u, inputs[u], params, rng=u) for u in inputs}
    keys = {u: c.advertise_keys() for u, c in clients.items()}
    out = {u: c.share_keys(keys) for u, c in clients.items()}
    for u, c in clients.items():
        c.receive_shares({v: out[v][u] for v in clients if v != u})
    answer = clients[1].unmask([1, 2, 3, 4], [1, 3])
    assert {v: kind for v, (kind, _) in answer.items()} == {1: "b", 2: "s", 3: "b", 4: "s"}


def test_cost_per_client_grows_with_the_peers_not_the_vector():
    params = sa.SecAggParams(3, 32, dh.TOY_256)
    small = sa.secure_aggregate(_inputs(range(1, 5), 1000, 32, 0), params, rng=0)
    large = sa.secure_aggregate(_inputs(range(1, 9), 1000, 32, 0), params, rng=0)
    for res, n in ((small, 4), (large, 8)):
        cost = res.cost[1]
        assert cost.total_messages == 4 and cost.sent["masked input"] == 1000 * 4
        e = params.element_bytes
        assert cost.sent["share keys"] == (n - 1) * (4 + 2 * e + 32)
        assert cost.sent["unmasking"] == n * (4 + 1 + e)
        assert res.plain_bytes == 4000
    assert large.cost[1].total_sent - 4000 > small.cost[1].total_sent - 4000


def test_bad_inputs_are_refused_with_the_function_named():
    with pytest.raises(ArgumentError, match="SecAggParams"):
        sa.SecAggParams(0)
    with pytest.raises(ArgumentError, match="SecAggParams"):
        sa.SecAggParams(2, bits=65)
    with pytest.raises(ArgumentError, match="different shapes"):
        sa.secure_aggregate({1: np.zeros(2, np.uint64), 2: np.zeros(3, np.uint64)},
                            sa.SecAggParams(1, 8, dh.TOY_256))
    with pytest.raises(ArgumentError, match="unknown clients"):
        sa.secure_aggregate({1: np.zeros(2, np.uint64)}, sa.SecAggParams(1, 8, dh.TOY_256),
                            drop_before_upload=[7])


def test_secure_weighted_average_is_fedavgs_average_within_fixed_point():
    """The securely aggregated FedAvg step against the float64 weighted mean of the clients
    that uploaded (a drop-out's model and count are in neither sum)."""
    rng = np.random.default_rng(6)
    shapes = {"W": (5, 3), "b": (3,)}
    models = [{k: rng.normal(size=s) for k, s in shapes.items()} for _ in range(6)]
    counts = [3, 40, 7, 12, 1, 25]
    params = sa.SecAggParams(4, 48, dh.TOY_256)
    avg, res = sa.secure_weighted_average(models, counts, params, frac_bits=20,
                                          drop_before_upload=[1], rng=0)
    kept = [0, 2, 3, 4, 5]
    total = sum(counts[k] for k in kept)
    for name in shapes:
        want = sum(counts[k] * models[k][name] for k in kept) / total
        assert avg[name].shape == shapes[name]
        assert np.abs(avg[name] - want).max() <= 2.0 ** -20
    assert res.dropped == [2]
    with pytest.raises(ArgumentError, match="does not fit"):
        sa.secure_weighted_average(models, counts, sa.SecAggParams(4, 16, dh.TOY_256), rng=0)


def test_a_late_upload_stays_hidden_by_its_self_mask():
    """Why b_u exists (Bonawitz et al. §4): the server declares client 3 dropped, collects
    shares of its key s_3 and rebuilds its pairwise masks — and then client 3's upload
    arrives after all. Removing the pairwise masks leaves x_3 + PRG(b_3), not x_3."""
    ids, bits = [1, 2, 3, 4], 16
    inputs = _inputs(ids, 64, bits, 8)
    params = sa.SecAggParams(3, bits, dh.TOY_256)
    clients = {u: sa.SecAggClient(u, inputs[u], params, rng=10 + u) for u in ids}
    keys = {u: c.advertise_keys() for u, c in clients.items()}
    out = {u: c.share_keys(keys) for u, c in clients.items()}
    for u, c in clients.items():
        c.receive_shares({v: out[v][u] for v in ids if v != u})
    late = clients[3].masked_input(ids)                      # arrives after the server asked
    answers = {u: clients[u].unmask(ids, [1, 2, 4]) for u in (1, 2, 4)}
    s3 = shamir.reconstruct([(u, answers[u][3][1]) for u in (1, 2, 4)], dh.TOY_256.p, 3)
    rest = late
    for v in (1, 2, 4):
        seed = dh.shared_seed(dh.TOY_256, dh.agree(dh.TOY_256, s3, keys[v][1]), b"pairwise-mask")
        rest = prg.ring_sub(rest, sa.pairwise_mask(seed, 3, v, 64, bits), bits)
    self_mask = prg.expand(clients[3].self_seed_bytes(clients[3]._b), 64, bits)
    assert np.array_equal(rest, prg.ring_add(inputs[3], self_mask, bits))  # x_3 + PRG(b_3)
    assert (rest != inputs[3]).mean() > 0.9                                # not x_3
    assert all(answers[u][3][0] == "s" for u in (1, 2, 4))  # nobody also gave away b_3
