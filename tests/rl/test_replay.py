"""ReplayBuffer: ring eviction (oldest first), batch adds equal single adds, and uniform
sampling checked with a chi-square test (with a biased sampler to show the test has power)."""

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.rl.agents import ReplayBuffer

# chi-square critical value at p = 0.001 for 9 degrees of freedom (scipy.stats.chi2.ppf)
CHI2_999_DF9 = 27.877


def fill(buf, n, start=0):
    for i in range(start, start + n):
        buf.add(np.full(3, i, np.float32), i, float(i), np.full(3, i + 1, np.float32), i % 2)


def chi_square(counts):
    expected = counts.sum() / len(counts)
    return float(((counts - expected) ** 2 / expected).sum())


def test_ring_eviction_keeps_the_newest_capacity_transitions():
    buf = ReplayBuffer(5, (3,), seed=0)
    fill(buf, 3)
    assert len(buf) == 3 and sorted(buf.actions[:3]) == [0, 1, 2]
    fill(buf, 5, start=3)  # 8 added in all: 0, 1, 2 evicted, oldest first
    assert len(buf) == 5 and buf.added == 8
    assert sorted(buf.actions.tolist()) == [3, 4, 5, 6, 7]
    # slots are overwritten in ring order: 5, 6, 7 took slots 0, 1, 2
    assert buf.actions.tolist() == [5, 6, 7, 3, 4]
    assert np.array_equal(buf.obs[:, 0], buf.actions.astype(np.float32))
    assert np.array_equal(buf.next_obs[:, 0], buf.actions + 1.0)
    assert np.array_equal(buf.terminated, buf.actions % 2)
    fill(buf, 1, start=8)  # the oldest (3) goes next
    assert sorted(buf.actions.tolist()) == [4, 5, 6, 7, 8]


def test_batch_add_equals_single_adds_and_keeps_only_the_newest():
    rng = np.random.default_rng(1)
    for n_first, n_batch in [(0, 3), (2, 4), (4, 13), (0, 7)]:
        a, b = ReplayBuffer(6, (2,), seed=0), ReplayBuffer(6, (2,), seed=0)
        obs = rng.standard_normal((n_first + n_batch, 2)).astype(np.float32)
        act = rng.integers(0, 4, n_first + n_batch)
        for i in range(n_first + n_batch):
            a.add(obs[i], act[i], i, obs[i] + 1, 0.0)
        for i in range(n_first):
            b.add(obs[i], act[i], i, obs[i] + 1, 0.0)
        s = slice(n_first, None)
        b.add_batch(obs[s], act[s], np.arange(n_first, n_first + n_batch), obs[s] + 1,
                    np.zeros(n_batch))
        for name in ("obs", "next_obs", "actions", "rewards"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
        assert (len(a), a.position, a.added) == (len(b), b.position, b.added)


def test_sampling_is_uniform_over_what_is_held_chi_square():
    buf = ReplayBuffer(10, (3,), seed=7)
    fill(buf, 23)  # wrapped twice: holds 13..22
    draws = np.concatenate([buf.sample(1000)["actions"] for _ in range(60)])
    assert set(np.unique(draws)) == set(range(13, 23))
    counts = np.bincount(draws - 13, minlength=10)
    assert chi_square(counts) < CHI2_999_DF9
    # the same test rejects a sampler that favours recent transitions
    rng = np.random.default_rng(0)
    ages = np.minimum(rng.geometric(0.15, size=60_000) - 1, 9)
    assert chi_square(np.bincount(ages, minlength=10)) > CHI2_999_DF9


def test_a_partly_filled_buffer_samples_only_filled_slots():
    buf = ReplayBuffer(100, (3,), seed=3)
    fill(buf, 4)
    batch = buf.sample(5000)
    assert set(np.unique(batch["actions"])) == {0, 1, 2, 3}
    assert np.array_equal(batch["obs"][:, 0], batch["actions"])
    assert np.array_equal(batch["indices"], batch["actions"])
    assert chi_square(np.bincount(batch["actions"], minlength=4)) < 16.27  # df 3, p 0.001


def test_bad_input_names_the_call():
    with pytest.raises(ArgumentError, match="capacity"):
        ReplayBuffer(0, (3,))
    buf = ReplayBuffer(4, (3,))
    with pytest.raises(ArgumentError, match="empty"):
        buf.sample(2)
    with pytest.raises(ShapeError, match="add_batch"):
        buf.add(np.zeros(4), 0, 0.0, np.zeros(4), 0.0)
    fill(buf, 2)
    with pytest.raises(ArgumentError, match="batch_size"):
        buf.sample(0)
