"""Partitions: every sample on exactly one client; skew where it should be."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab import federated as fl
from mlsys_lab.errors import ArgumentError


def assert_exact_cover(parts, n):
    joined = np.concatenate(parts)
    assert joined.dtype == np.int64
    assert np.array_equal(np.sort(joined), np.arange(n))      # each sample exactly once
    assert all(np.all(np.diff(p) > 0) for p in parts)         # sorted, no repeats


@settings(max_examples=60, deadline=None)
@given(n=st.integers(10, 400), clients=st.integers(1, 10), classes=st.integers(1, 6),
       alpha=st.sampled_from([0.1, 0.5, 1.0, 10.0, 100.0]), seed=st.integers(0, 10**6))
def test_dirichlet_is_an_exact_cover(n, clients, classes, alpha, seed):
    labels = np.random.default_rng(seed).integers(0, classes, n)
    parts = fl.partition.dirichlet(labels, clients, alpha=alpha, seed=seed)
    assert len(parts) == clients and min(len(p) for p in parts) >= 1
    assert_exact_cover(parts, n)
    counts = fl.partition.label_counts(labels, parts, classes)
    assert np.array_equal(counts.sum(0), np.bincount(labels, minlength=classes))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), clients=st.integers(1, 30), beta=st.floats(0.05, 50),
       seed=st.integers(0, 10**6))
def test_iid_and_quantity_skew_are_exact_covers(n, clients, beta, seed):
    if clients > n:
        with pytest.raises(ArgumentError, match="every client needs at least one"):
            fl.partition.iid(n, clients, seed=seed)
        return
    parts = fl.partition.iid(n, clients, seed=seed)
    assert_exact_cover(parts, n)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    parts = fl.partition.quantity_skew(n, clients, beta=beta, seed=seed)
    assert_exact_cover(parts, n)
    assert min(map(len, parts)) >= 1


def label_entropy(labels, parts):
    counts = fl.partition.label_counts(labels, parts, 10).astype(float)
    p = counts / counts.sum(1, keepdims=True)
    return float(np.mean([-(q[q > 0] * np.log(q[q > 0])).sum() for q in p]))


def test_small_alpha_skews_labels_and_large_alpha_is_near_iid():
    _, y, _, _ = fl.load_digits()
    low = label_entropy(y, fl.partition.dirichlet(y, 20, alpha=0.1, seed=0))
    high = label_entropy(y, fl.partition.dirichlet(y, 20, alpha=100.0, seed=0))
    iid = label_entropy(y, fl.partition.iid(len(y), 20, seed=0))
    assert low < 1.2 < 2.1 < high and abs(high - iid) < 0.1     # log(10) = 2.30


def test_quantity_skew_makes_unequal_sizes():
    sizes = np.array([len(p) for p in fl.partition.quantity_skew(1000, 20, beta=0.3, seed=1)])
    assert sizes.max() > 5 * np.median(sizes)


def test_seeded():
    y = np.arange(200) % 7
    a = fl.partition.dirichlet(y, 5, alpha=0.5, seed=3)
    b = fl.partition.dirichlet(y, 5, alpha=0.5, seed=3)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


def test_bad_input():
    with pytest.raises(ArgumentError, match="dirichlet.*1-D int"):
        fl.partition.dirichlet(np.zeros(5), 2)
    with pytest.raises(ArgumentError, match="alpha"):
        fl.partition.dirichlet(np.zeros(5, dtype=int), 2, alpha=0)
    with pytest.raises(ArgumentError, match="num_clients"):
        fl.partition.iid(5, 0)
