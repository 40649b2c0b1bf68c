"""GAE against its definition summed directly in float64: A_t = sum_k (gamma lam)^k
delta_{t+k}, stopping at the end of the episode, and its lambda = 0 / 1 limits."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.rl.agents import gae


def gae_by_definition(rewards, values, dones, last_value, gamma, lam):
    """Direct double sum over one environment's (T,) arrays."""
    T = len(rewards)
    v_next = [values[t + 1] if t + 1 < T else last_value for t in range(T)]
    deltas = [rewards[t] + gamma * (1 - dones[t]) * v_next[t] - values[t] for t in range(T)]
    adv = np.zeros(T)
    for t in range(T):
        total, weight = 0.0, 1.0
        for k in range(t, T):
            total += weight * deltas[k]
            if dones[k]:
                break
            weight *= gamma * lam
        adv[t] = total
    return adv


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 12), N=st.integers(1, 3), seed=st.integers(0, 2**31 - 1),
       gamma=st.floats(0.0, 1.0), lam=st.floats(0.0, 1.0), p_done=st.sampled_from([0, .2, .6]))
def test_gae_equals_the_direct_sum(T, N, seed, gamma, lam, p_done):
    rng = np.random.default_rng(seed)
    r, v = rng.standard_normal((T, N)), rng.standard_normal((T, N))
    d = (rng.random((T, N)) < p_done).astype(float)
    last = rng.standard_normal(N)
    adv, ret = gae(r, v, d, last, gamma, lam)
    for j in range(N):
        want = gae_by_definition(r[:, j], v[:, j], d[:, j], last[j], gamma, lam)
        np.testing.assert_allclose(adv[:, j], want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ret, adv + v, rtol=0, atol=0)


def test_lambda_limits_td_error_and_monte_carlo():
    rng = np.random.default_rng(0)
    T, gamma = 9, 0.9
    r, v = rng.standard_normal(T), rng.standard_normal(T)
    d = np.zeros(T)
    d[4] = 1
    last = 0.7
    adv0, _ = gae(r, v, d, last, gamma, 0.0)
    v_next = np.append(v[1:], last)
    np.testing.assert_allclose(adv0, r + gamma * (1 - d) * v_next - v, atol=1e-12)
    _, ret1 = gae(r, v, d, last, gamma, 1.0)
    mc = np.zeros(T)  # discounted return to the episode's end (bootstrapped after the rollout)
    for t in range(T):
        end = 4 if t <= 4 else T - 1
        mc[t] = sum(gamma ** (k - t) * r[k] for k in range(t, end + 1))
        if t > 4:
            mc[t] += gamma ** (T - t) * last
    np.testing.assert_allclose(ret1, mc, atol=1e-12)


def test_one_dimensional_input_and_float32():
    adv, ret = gae(np.ones(3, np.float32), np.zeros(3, np.float32), np.zeros(3, np.float32),
                   np.float32(0), 0.5, 1.0)
    assert adv.dtype == np.float32
    np.testing.assert_allclose(adv, [1.75, 1.5, 1.0])


def test_bad_input():
    with pytest.raises(ShapeError, match="gae"):
        gae(np.ones(3), np.ones(4), np.ones(3), 0.0)
    with pytest.raises(ShapeError, match="last_value"):
        gae(np.ones((3, 2)), np.ones((3, 2)), np.ones((3, 2)), np.zeros(3))
    with pytest.raises(ArgumentError, match="lam"):
        gae(np.ones(3), np.ones(3), np.ones(3), 0.0, lam=1.5)
