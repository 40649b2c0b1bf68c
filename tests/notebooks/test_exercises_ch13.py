"""Exercises of chapter 13 test the idea: the references score full marks, the library's own
implementations are refused, and each wrong idea listed in the exercise modules of
``mlsys_lab/grading/exercises/ch13_recommender_systems/`` scores 0 on the cases that name it.

Everything runs in process with ``run_cases`` (the same probe -> wire -> judge round trip as the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import heapq

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.recsys import metrics, sharding

from ..exercise_results import case, fails, feedback, full

SEEDS = [0, 1, 7]


# ============================================================================= 13.1 sparse gradient
def sparse_embedding_grad(ids, offsets, grad_out, num_rows, mode):
    ends = np.append(offsets[1:], len(ids))
    sizes = ends - offsets
    bag_of = np.repeat(np.arange(len(offsets)), sizes)
    per_id = grad_out[bag_of]
    if mode == "mean":
        per_id = per_id / sizes[bag_of][:, None]
    rows, where = np.unique(ids, return_inverse=True)
    values = np.zeros((len(rows), grad_out.shape[1]))
    np.add.at(values, where, per_id)
    return rows, values


def _per_id(ids, offsets, grad_out, mode, divisor=None):
    ends = np.append(offsets[1:], len(ids))
    sizes = ends - offsets
    bag_of = np.repeat(np.arange(len(offsets)), sizes)
    per_id = grad_out[bag_of]
    if mode == "mean":
        d = sizes[bag_of][:, None] if divisor is None else divisor(sizes, bag_of, ids, offsets)
        per_id = per_id / d
    return per_id


def dense_gradient(ids, offsets, grad_out, num_rows, mode):
    dense = np.zeros((num_rows, grad_out.shape[1]))
    np.add.at(dense, ids, _per_id(ids, offsets, grad_out, mode))
    return np.arange(num_rows), dense


def assigns_instead_of_adding(ids, offsets, grad_out, num_rows, mode):
    rows = np.unique(ids)
    pos = {int(r): i for i, r in enumerate(rows)}
    values = np.zeros((len(rows), grad_out.shape[1]))
    for i, g in zip(ids, _per_id(ids, offsets, grad_out, mode)):
        values[pos[int(i)]] = g
    return rows, values


def one_entry_per_lookup(ids, offsets, grad_out, num_rows, mode):
    return ids, _per_id(ids, offsets, grad_out, mode)


def mean_over_number_of_bags(ids, offsets, grad_out, num_rows, mode):
    per_id = _per_id(ids, offsets, grad_out, mode,
                     divisor=lambda sizes, bag_of, ids, offsets: len(offsets))
    rows, where = np.unique(ids, return_inverse=True)
    values = np.zeros((len(rows), grad_out.shape[1]))
    np.add.at(values, where, per_id)
    return rows, values


def mean_without_dividing(ids, offsets, grad_out, num_rows, mode):
    return sparse_embedding_grad(ids, offsets, grad_out, num_rows, "sum")


def last_bag_wrong_end(ids, offsets, grad_out, num_rows, mode):
    """Takes each bag's end as the next offset and the last bag as one id long."""
    ends = np.append(offsets[1:], offsets[-1] + 1)
    values = {}
    for b, (s, e) in enumerate(zip(offsets, ends)):
        for i in ids[s:e]:
            share = grad_out[b] / (1 if mode == "sum" else e - s)
            values[int(i)] = values.get(int(i), 0) + share
    rows = np.array(sorted(values), np.int64)
    return rows, np.array([values[r] for r in rows.tolist()]).reshape(len(rows), -1)


def through_the_library(ids, offsets, grad_out, num_rows, mode):
    w = ml.tensor(np.zeros((num_rows, grad_out.shape[1])), requires_grad=True)
    (ml.ops.embedding_bag(w, ids, offsets, mode, sparse=True) * ml.tensor(grad_out)).sum()\
        .backward()
    g = w.grad.coalesce()
    return g.indices, g.values


@pytest.mark.parametrize("seed", SEEDS)
def test_sparse_grad_reference_scores_full_marks(seed):
    full(run_cases("13.1", sparse_embedding_grad, seed=seed))


def test_sparse_grad_reference_equals_the_library():
    r = np.random.default_rng(0)
    ids, offsets, g = r.integers(0, 9, 12), np.array([0, 3, 3, 8]), r.standard_normal((4, 2))
    for mode in ("sum", "mean"):
        mine, lib = sparse_embedding_grad(ids, offsets, g, 9, mode), \
            through_the_library(ids, offsets, g, 9, mode)
        np.testing.assert_array_equal(mine[0], lib[0])
        np.testing.assert_allclose(mine[1], lib[1])


def test_sparse_grad_library_is_refused():
    result = run_cases("13.1", through_the_library, seed=0)
    assert result.score == 0 and "off limits" in feedback(result), feedback(result)


def through_the_fast_kernels(ids, offsets, grad_out, num_rows, mode):
    """The library's hash-merged backward (or its pieces): refused like the op itself."""
    from mlsys_lab.engine import ops_embedding

    r = ops_embedding.sparse_bag_grad(np.asarray(grad_out), np.asarray(ids, np.int64),
                                   np.asarray(offsets, np.int64), num_rows, mode)
    order = np.argsort(r.indices)
    return r.indices[order], r.values[order]


def test_the_fast_backward_is_refused_too():
    result = run_cases("13.1", through_the_fast_kernels, seed=0)
    assert result.score == 0 and "off limits" in feedback(result), feedback(result)


def test_a_dense_gradient_fails_the_sparse_case():
    result = run_cases("13.1", dense_gradient, seed=1)
    fails(result, "only the touched rows")


def dense_then_sliced(ids, offsets, grad_out, num_rows, mode):
    """The whole (num_rows, dim) gradient, then only the touched rows of it: the right answer
    without the idea (a sparse gradient never builds the table)."""
    rows, dense = dense_gradient(ids, offsets, grad_out, num_rows, mode)
    touched = np.unique(ids)
    return rows[touched], dense[touched]


def test_a_dense_gradient_sliced_to_the_touched_rows_fails_the_big_table():
    # the big table has 2**40 rows: 32 TiB densely, so the dense step cannot run at all
    result = run_cases("13.1", dense_then_sliced, seed=1)
    fails(result, "only the touched rows")
    assert "allocate" in case(result, "only the touched rows").feedback, feedback(result)
    assert all(row.passed for row in result.rows if not row.name.startswith("only")), \
        feedback(result)


def test_forgetting_that_repeats_accumulate_fails():
    fails(run_cases("13.1", assigns_instead_of_adding, seed=2), "sum pooling", "mean pooling")


def test_uncoalesced_rows_are_refused():
    fails(run_cases("13.1", one_entry_per_lookup, seed=3), "sum pooling")


@pytest.mark.parametrize("wrong", [mean_over_number_of_bags, mean_without_dividing,
                                   last_bag_wrong_end])
def test_wrong_mean_divisor_or_bag_bounds_fail_the_mean_case(wrong):
    result = run_cases("13.1", wrong, seed=4)
    fails(result, "mean pooling")


# ============================================================================= 13.2 Recall@k
def recall_at_k(retrieved, relevant, k):
    if k < 1:
        raise ValueError(f"recall_at_k: k must be >= 1, got {k}")
    relevant = set(relevant)
    if not relevant:
        raise ValueError("recall_at_k: no relevant items")
    found = set(retrieved[:k]) & relevant
    return len(found) / min(len(relevant), k)


def _checked(f):
    def g(retrieved, relevant, k):
        if k < 1 or not relevant:
            raise ValueError("bad arguments")
        return f(retrieved, set(relevant), k)
    return g


divide_by_k = _checked(lambda r, s, k: len(set(r[:k]) & s) / k)
divide_by_relevant = _checked(lambda r, s, k: len(set(r[:k]) & s) / len(s))
count_duplicates = _checked(lambda r, s, k: sum(x in s for x in r[:k]) / min(len(s), k))
whole_list = _checked(lambda r, s, k: len(set(r) & s) / min(len(s), k))


def no_checks(retrieved, relevant, k):
    relevant = set(relevant)
    return len(set(retrieved[:k]) & relevant) / max(min(len(relevant), k), 1)


@pytest.mark.parametrize("seed", SEEDS)
def test_recall_reference_scores_full_marks(seed):
    full(run_cases("13.2", recall_at_k, seed=seed))


def test_recall_library_is_refused():
    result = run_cases("13.2", metrics.recall_at_k, seed=0)
    assert result.score == 0 and "off limits" in feedback(result), feedback(result)


def test_dividing_by_k_always_fails_the_few_case():
    result = run_cases("13.2", divide_by_k, seed=1)
    fails(result, "fewer relevant")
    assert case(result, "more relevant").passed


def test_dividing_by_the_relevant_count_always_fails_the_many_case():
    result = run_cases("13.2", divide_by_relevant, seed=1)
    fails(result, "more relevant")
    assert case(result, "fewer relevant").passed


def test_counting_duplicates_fails():
    fails(run_cases("13.2", count_duplicates, seed=2), "an item retrieved twice")


def test_looking_past_k_and_missing_checks_fail():
    fails(run_cases("13.2", whole_list, seed=3), "random lists")
    fails(run_cases("13.2", no_checks, seed=3), "no relevant item")


# ============================================================================= 13.3 shard placement
def place_shards(freq, num_servers, capacity):
    if len(freq) > num_servers * capacity:
        raise ValueError(f"{len(freq)} keys do not fit on {num_servers} x {capacity}")
    heap = [(0.0, s) for s in range(num_servers)]
    held = [0] * num_servers
    out = np.zeros(len(freq), np.int64)
    for key in np.argsort(-np.asarray(freq), kind="stable"):
        load, s = heapq.heappop(heap)
        out[key] = s
        held[s] += 1
        if held[s] < capacity:
            heapq.heappush(heap, (load + freq[key], s))
    return out


def _fits(f):
    def g(freq, num_servers, capacity):
        if len(freq) > num_servers * capacity:
            raise ValueError("do not fit")
        return f(np.asarray(freq), num_servers, capacity)
    return g


round_robin = _fits(lambda f, s, c: np.arange(len(f)) % s)
random_placement = _fits(lambda f, s, c: np.random.default_rng(0).permutation(len(f)) % s)


def _greedy(order_of):
    def place(freq, num_servers, capacity):
        loads = np.zeros(num_servers)
        out = np.zeros(len(freq), np.int64)
        for key in order_of(freq):
            s = int(np.argmin(loads))
            out[key] = s
            loads[s] += freq[key]
        return out
    return _fits(place)


greedy_ignoring_capacity = _greedy(lambda f: np.argsort(-f, kind="stable"))
greedy_in_id_order = _greedy(lambda f: np.arange(len(f)))


def no_fit_check(freq, num_servers, capacity):
    return np.arange(len(freq)) % num_servers


@pytest.mark.parametrize("seed", SEEDS)
def test_placement_reference_scores_full_marks(seed):
    full(run_cases("13.3", place_shards, seed=seed))


def test_placement_library_is_refused():
    result = run_cases("13.3", sharding.balanced_placement, seed=0)
    assert result.score == 0 and "off limits" in feedback(result), feedback(result)


@pytest.mark.parametrize("wrong", [round_robin, random_placement, greedy_in_id_order])
def test_frequency_blind_placements_fail_the_hot_case(wrong):
    fails(run_cases("13.3", wrong, seed=1), "hot keys spread")


def test_greedy_without_capacity_overfills_servers():
    result = run_cases("13.3", greedy_ignoring_capacity, seed=2)
    assert case(result, "hot keys spread").passed
    fails(result, "tight capacity")


def test_placement_without_a_fit_check_fails_the_error_case():
    fails(run_cases("13.3", no_fit_check, seed=0), "keys that do not fit")
