"""V-trace against the paper's definition (Espeholt et al. 2018, eq. 1) summed term by term in
float64 — not the backward recursion the library uses — and its on-policy limit."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.rl.distributed import vtrace


def vtrace_by_definition(mu_logp, pi_logp, r, disc, v, boot, rho_bar, c_bar, pg_rho_bar):
    """v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t,
    delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)), for one (T,) trajectory."""
    T = len(r)
    ratio = [np.exp(pi_logp[t] - mu_logp[t]) for t in range(T)]
    rho = [min(rho_bar, x) if rho_bar is not None else x for x in ratio]
    c = [min(c_bar, x) if c_bar is not None else x for x in ratio]
    V = list(v) + [boot]
    vs = []
    for s in range(T):
        total = V[s]
        for t in range(s, T):
            coef = 1.0
            for i in range(s, t):
                coef *= disc[i] * c[i]
            total += coef * rho[t] * (r[t] + disc[t] * V[t + 1] - V[t])
        vs.append(total)
    vs_next = vs[1:] + [boot]
    pg_rho = [min(pg_rho_bar, x) if pg_rho_bar is not None else x for x in ratio]
    adv = [pg_rho[s] * (r[s] + disc[s] * vs_next[s] - V[s]) for s in range(T)]
    return np.array(vs), np.array(adv)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 10), B=st.integers(1, 3), seed=st.integers(0, 2**31 - 1),
       clips=st.sampled_from([(1.0, 1.0, 1.0), (2.0, 0.5, 1.5), (None, None, None),
                              (0.3, 1.0, None)]))
def test_vtrace_equals_the_definition(T, B, seed, clips):
    rng = np.random.default_rng(seed)
    mu, pi = rng.normal(-0.7, 0.5, (T, B)), rng.normal(-0.7, 0.5, (T, B))
    r, v = rng.standard_normal((T, B)), rng.standard_normal((T, B))
    disc = 0.95 * (rng.random((T, B)) > 0.2)
    boot = rng.standard_normal(B)
    out = vtrace(mu, pi, r, disc, v, boot, *clips)
    for b in range(B):
        vs, adv = vtrace_by_definition(mu[:, b], pi[:, b], r[:, b], disc[:, b], v[:, b],
                                       boot[b], *clips)
        np.testing.assert_allclose(out.vs[:, b], vs, rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(out.pg_advantages[:, b], adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(out.rhos, np.exp(pi - mu), rtol=1e-12)


def test_on_policy_vtrace_is_the_n_step_return():
    rng = np.random.default_rng(3)
    T, gamma = 7, 0.9
    logp = rng.normal(-0.5, 0.2, T)
    r, v = rng.standard_normal(T), rng.standard_normal(T)
    out = vtrace(logp, logp, r, np.full(T, gamma), v, 1.3)
    want = [sum(gamma ** (k - s) * r[k] for k in range(s, T)) + gamma ** (T - s) * 1.3
            for s in range(T)]
    np.testing.assert_allclose(out.vs, want, atol=1e-12)


def test_clipping_bounds_the_correction():
    # a far off-policy step: the unclipped ratio is e^3; clipped, it counts as 1
    out = vtrace([-3.0], [0.0], [1.0], [0.0], [0.0], 0.0)
    assert out.rhos[0] == pytest.approx(np.exp(3.0))
    assert out.vs[0] == pytest.approx(1.0)
    out = vtrace([-3.0], [0.0], [1.0], [0.0], [0.0], 0.0, clip_rho=None)
    assert out.vs[0] == pytest.approx(np.exp(3.0))


def test_bad_input():
    with pytest.raises(ShapeError, match="vtrace"):
        vtrace(np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(3), np.zeros(4), 0.0)
    with pytest.raises(ShapeError, match="bootstrap_value"):
        vtrace(*[np.zeros((3, 2))] * 5, np.zeros(3))
    with pytest.raises(ArgumentError, match="clip_rho"):
        vtrace(*[np.zeros(3)] * 5, 0.0, clip_rho=-1.0)
