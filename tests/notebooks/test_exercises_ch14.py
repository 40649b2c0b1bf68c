"""Exercises of chapter 14 test the idea: the references score full marks on every seed, the
library's own implementations are refused, and each wrong idea listed in the exercise modules
of ``mlsys_lab/grading/exercises/ch14_federated_learning/`` scores 0 on the cases that name it.

Everything runs in process with ``run_cases`` (the probe -> wire -> judge round trip of the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from mlsys_lab.grading.core.check import run_cases

from ..exercise_results import fails, fails_only, full, refused

SEEDS = [0, 1, 7, 12345]


# ============================================================================= 14.1 aggregation
def aggregate(current, results, sampled):
    if not results:
        return {k: np.array(v, copy=True) for k, v in current.items()}
    total = sum(r["num_examples"] for r in results)
    return {k: sum(r["num_examples"] / total * r["parameters"][k] for r in results)
            for k in current}


def unweighted(current, results, sampled):
    if not results:
        return current
    return {k: sum(r["parameters"][k] for r in results) / len(results) for k in current}


def by_steps(current, results, sampled):
    if not results:
        return current
    total = sum(r["num_steps"] for r in results)
    return {k: sum(r["num_steps"] * r["parameters"][k] for r in results) / total
            for k in current}


def unnormalised(current, results, sampled):
    if not results:
        return current
    return {k: sum(r["num_examples"] * r["parameters"][k] for r in results) for k in current}


def over_all_sampled(current, results, sampled):
    if not results:
        return current
    total = sum(sampled.values())
    return {k: sum(r["num_examples"] * r["parameters"][k] for r in results) / total
            for k in current}


def dropped_as_current(current, results, sampled):
    returned = {r["cid"] for r in results}
    models = [(r["num_examples"], r["parameters"]) for r in results]
    models += [(n, current) for cid, n in sampled.items() if cid not in returned]
    total = sum(n for n, _ in models)
    return {k: sum(n * m[k] for n, m in models) / total for k in current}


def none_when_empty(current, results, sampled):
    return aggregate(current, results, sampled) if results else None


def first_array_only(current, results, sampled):
    out = {k: np.array(v, copy=True) for k, v in current.items()}
    if results:
        k = next(iter(current))
        out[k] = aggregate(current, results, sampled)[k]
    return out


def in_place(current, results, sampled):
    if not results:
        return current
    total = sum(r["num_examples"] for r in results)
    acc = results[0]["parameters"]
    for k in acc:
        acc[k] *= results[0]["num_examples"] / total
        for r in results[1:]:
            acc[k] += r["num_examples"] / total * r["parameters"][k]
    return acc


@pytest.mark.parametrize("seed", SEEDS)
def test_aggregation_reference_scores_full_marks(seed):
    full(run_cases("14.1", aggregate, seed=seed))


@pytest.mark.parametrize("wrong, failing", [
    (unweighted, ("two clients", "weights are examples", "a dropped client")),
    (by_steps, ("weights are examples",)),
    (unnormalised, ("two clients", "weights are examples", "a dropped client")),
    (over_all_sampled, ("a dropped client",)),
    (dropped_as_current, ("a dropped client",)),
    (none_when_empty, ("nobody returned",)),
    (first_array_only, ("two clients", "weights are examples", "a dropped client")),
    (in_place, ("two clients", "weights are examples", "a dropped client")),
], ids=lambda v: v.__name__ if callable(v) else "")
def test_aggregation_wrong_ideas_fail(wrong, failing):
    fails(run_cases("14.1", wrong, seed=3), *failing)


def test_aggregation_through_the_library_is_refused():
    from mlsys_lab.federated import strategies

    def through_the_library(current, results, sampled):
        models = [r["parameters"] for r in results] or [current]
        return strategies.weighted_average(models, [r["num_examples"] for r in results] or [1])

    assert refused(run_cases("14.1", through_the_library, seed=0)), "the library ran"


def test_aggregation_through_a_strategy_method_is_refused():
    from mlsys_lab.federated import strategies

    def through_fedavg(current, results, sampled):
        s = strategies.FedAvg()
        s.current = current
        res = [strategies.FitRes(r["cid"], r["parameters"], r["num_examples"]) for r in results]
        return s.aggregate_fit(1, res, [])

    assert refused(run_cases("14.1", through_fedavg, seed=0)), "FedAvg.aggregate_fit ran"


# ============================================================================= 14.2 masks
def masked_upload(u, x, seeds, bits, prg, *, sign=1, same_sign=False, wrap=True,
                  floats=False, by_position=False, in_place=False, some_peers=False):
    m = np.uint64((1 << bits) - 1) if bits < 64 else np.uint64(2 ** 64 - 1)
    y = x if in_place else x.copy()
    if floats:
        y = y.astype(np.float64)
    items = list(seeds.items())
    if some_peers:
        items = items[:1]
    for k, (v, s) in enumerate(items):
        mask = prg(s, x.size)
        if floats:
            mask = mask.astype(np.float64)
        plus = (k % 2 == 0) if by_position else (u < v)
        if same_sign or plus == (sign > 0):
            y += mask
        else:
            y -= mask
    if floats:
        return y
    return y & m if wrap else y


def _mv(**how):
    return lambda *args: masked_upload(*args, **how)


def python_ints_no_wrap(u, x, seeds, bits, prg):
    y = [int(v) for v in x]
    for v, s in seeds.items():
        mask = [int(w) for w in prg(s, len(x))]
        y = [a + b if u < v else a - b for a, b in zip(y, mask)]
    return y


@pytest.mark.parametrize("seed", SEEDS)
def test_masks_reference_scores_full_marks(seed):
    full(run_cases("14.2", masked_upload, seed=seed))


def test_the_opposite_sign_convention_is_accepted():
    full(run_cases("14.2", _mv(sign=-1), seed=2))


@pytest.mark.parametrize("how, failing", [
    ({"same_sign": True}, ("the masks cancel", "each upload", "an 8-bit", "a 64-bit", "large")),
    ({"wrap": False}, ("an 8-bit",)),
    ({"floats": True}, ("the masks cancel", "each upload", "an 8-bit", "a 64-bit", "large")),
    ({"by_position": True}, ("the masks cancel", "each upload", "an 8-bit", "a 64-bit",
                             "large")),
    ({"in_place": True}, ("each upload", "an 8-bit", "a 64-bit", "large")),
    ({"some_peers": True}, ("the masks cancel", "each upload", "an 8-bit", "a 64-bit",
                            "large")),
], ids=lambda v: "-".join(v) if isinstance(v, dict) else "")
def test_masks_wrong_ideas_fail(how, failing):
    fails(run_cases("14.2", _mv(**how), seed=5), *failing)


def test_python_ints_without_the_wrap_fail_the_ring_cases_but_cancel():
    result = run_cases("14.2", python_ints_no_wrap, seed=5)
    fails_only(result, "each upload", "an 8-bit", "a 64-bit", "large")


def test_masks_through_the_library_are_refused():
    from mlsys_lab.federated.crypto import secure_agg

    def through_the_library(u, x, seeds, bits, prg):
        return secure_agg.mask_input(x, u, seeds, None, bits)

    assert refused(run_cases("14.2", through_the_library, seed=0)), "the library ran"


def test_the_exercise_prg_is_the_librarys():
    """The exercise's PRG is SHAKE-256 like the library's: a reference answer built on the
    library's pairwise_mask gives the same uploads (outside the guard)."""
    from mlsys_lab.federated.crypto import prg, secure_agg
    from mlsys_lab.grading.exercises.ch14_federated_learning import ex14_2_pairwise_masks as ex

    for bits in (8, 32, 64):
        assert np.array_equal(ex._expand(b"s" * 32, 50, bits), prg.expand(b"s" * 32, 50, bits))
    x = np.arange(6, dtype=np.uint64)
    seeds = {3: b"a" * 32, 9: b"b" * 32}
    assert np.array_equal(masked_upload(5, x, seeds, 16, lambda s, n: prg.expand(s, n, 16)),
                          secure_agg.mask_input(x, 5, seeds, None, 16))


# ============================================================================= 14.3 PSI
def blind_psi(items, n, e, published, sign_blinded, H, H_prime, rng, *, blind=True,
              unblind="inverse", one_r=False, compare="outer", reorder=False):
    rs, ys = [], []
    shared = rng.randrange(2, n - 1)
    for b in items:
        r = shared if one_r else rng.randrange(2, n - 1)
        rs.append(r)
        ys.append(H(b) * pow(r, e, n) % n if blind else H(b))
    signed = sign_blinded(ys)
    out = []
    for b, s, r in zip(items, signed, rs):
        if not blind:
            z = s
        elif unblind == "inverse":
            z = s * pow(r, -1, n) % n
        elif unblind == "times":
            z = s * r % n
        elif unblind == "none":
            z = s
        else:  # "inverse-e"
            z = s * pow(r, -e, n) % n
        key = {"outer": H_prime(z), "raw": z, "hash": H(b)}[compare]
        if key in published:
            out.append(b)
    return sorted(out, key=str) if reorder else out


def _pv(**how):
    return lambda *args: blind_psi(*args, **how)


@pytest.mark.parametrize("seed", SEEDS)
def test_psi_reference_scores_full_marks(seed):
    full(run_cases("14.3", blind_psi, seed=seed))


def test_plain_hashes_find_the_intersection_but_fail_the_blinding_case():
    fails_only(run_cases("14.3", _pv(blind=False), seed=4), "A sees only blinded values")


def test_one_r_for_every_id_fails_the_blinding_case():
    fails_only(run_cases("14.3", _pv(one_r=True), seed=4), "A sees only blinded values")


@pytest.mark.parametrize("how", [{"unblind": "none"}, {"unblind": "times"},
                                 {"unblind": "inverse-e"}, {"compare": "raw"},
                                 {"compare": "hash"}],
                         ids=lambda v: "-".join(map(str, v.values())))
def test_psi_wrong_unblinding_or_comparison_finds_nothing(how):
    result = run_cases("14.3", _pv(**how), seed=4)
    fails(result, "finds exactly", "B's ids all in A")


def test_losing_bs_order_fails():
    fails(run_cases("14.3", _pv(reorder=True), seed=4), "finds exactly")


def test_a_fixed_r_across_runs_fails():
    def fixed_rng(items, n, e, published, sign_blinded, H, H_prime, rng):
        return blind_psi(items, n, e, published, sign_blinded, H, H_prime, random.Random(0))

    fails_only(run_cases("14.3", fixed_rng, seed=4), "A sees only blinded values")


def test_psi_through_the_library_is_refused():
    from mlsys_lab.federated.crypto import psi

    def through_the_library(items, n, e, published, sign_blinded, H, H_prime, rng):
        psi.blind(H(items[0]), 3, psi.rsa.RSAPublicKey(n, e))
        return blind_psi(items, n, e, published, sign_blinded, H, H_prime, rng)

    assert refused(run_cases("14.3", through_the_library, seed=0)), "the library ran"


def test_the_exercise_key_is_a_working_rsa_key():
    from mlsys_lab.federated.crypto.primes import is_probable_prime
    from mlsys_lab.grading.exercises.ch14_federated_learning import ex14_3_blind_psi as ex

    n, e, d = ex._key()
    assert n.bit_length() == 256
    assert all(pow(pow(x, e, n), d, n) == x for x in (2, 12345, n - 2))
    assert not is_probable_prime(n)


# ============================================================================= independent answers
def aggregate_with_np_average(current, results, sampled):
    if len(results) == 0:
        return dict(current)
    w = np.array([r["num_examples"] for r in results], dtype=float)
    return {k: np.average(np.stack([r["parameters"][k] for r in results]), axis=0, weights=w)
            for k in current}


def masked_upload_in_python_ints(u, x, seeds, bits, prg):
    ring = 1 << bits
    y = [int(v) for v in x]
    for v in sorted(seeds):
        sign = 1 if u < v else -1
        y = [(a + sign * int(m)) % ring for a, m in zip(y, prg(seeds[v], len(y)))]
    return np.array(y, dtype=np.uint64)


def blind_psi_one_message_per_id(items, n, e, published, sign_blinded, H, H_prime, rng):
    def inverse(a, m):  # extended Euclid
        r0, r1, s0, s1 = m, a % m, 0, 1
        while r1:
            q = r0 // r1
            r0, r1, s0, s1 = r1, r0 - q * r1, s1, s0 - q * s1
        return s0 % m

    kept = []
    for b in items:
        r = rng.randrange(2, n - 1)
        (signed,) = sign_blinded([H(b) * pow(r, e, n) % n])
        if H_prime(signed * inverse(r, n) % n) in published:
            kept.append(b)
    return kept


@pytest.mark.parametrize("ex_id, answer", [
    ("14.1", aggregate_with_np_average), ("14.2", masked_upload_in_python_ints),
    ("14.3", blind_psi_one_message_per_id),
], ids=["14.1 np.average", "14.2 python ints", "14.3 one message per id"])
@pytest.mark.parametrize("seed", [2, 9])
def test_independent_answers_score_full_marks(ex_id, answer, seed):
    full(run_cases(ex_id, answer, seed=seed))


def test_blinding_factors_from_secrets_are_accepted():
    """Real code draws R from the operating system's generator; 14.3 allows ``secrets``."""
    import secrets

    def with_secrets(items, n, e, published, sign_blinded, H, H_prime, rng):
        rs = [secrets.randbelow(n - 3) + 2 for _ in items]
        signed = sign_blinded([H(b) * pow(r, e, n) % n for b, r in zip(items, rs)])
        return [b for b, s, r in zip(items, signed, rs)
                if H_prime(s * pow(r, -1, n) % n) in published]

    full(run_cases("14.3", with_secrets, seed=1))
