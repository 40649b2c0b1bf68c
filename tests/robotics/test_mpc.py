"""MPC's QP solver against SciPy's optimum (committed by ``tests/data/make_control_reference.py``:
SLSQP, then an exact KKT solve on its active set), against LQR when no limit binds, and in
closed loop on the nonlinear cart-pole."""

import os

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.robotics import dynamics, lqr, mpc, qp, simulate

REF = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "control_reference.npz")


@pytest.fixture(scope="module")
def ref():
    with np.load(REF, allow_pickle=False) as z:
        return dict(z)


@pytest.mark.parametrize("i", range(8))
def test_qp_matches_the_reference_optimum(ref, i):
    h, g, c, lo, hi = (ref[f"qp/{i}/{k}"] for k in ("H", "g", "C", "lo", "hi"))
    # the committed QP is the one the library builds (so the MPC formulation is pinned too)
    m = mpc.cartpole_mpc(horizon=20, u_max=float(ref[f"qp/{i}/u_max"]))
    h2, g2, c2, lo2, hi2 = m.qp(ref[f"qp/{i}/x0"])
    for a, b in ((h, h2), (g, g2), (c, c2), (lo, lo2), (hi, hi2)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    res = qp.ADMM(h, c).solve(g, lo, hi)
    assert res.status == "solved" and res.residual <= 1e-6
    assert qp.kkt_residual(h, g, c, lo, hi, res.z, res.y) <= 1e-6
    f_ref = float(ref[f"qp/{i}/f"])
    assert res.objective == pytest.approx(f_ref, rel=1e-9, abs=1e-9)
    np.testing.assert_allclose(res.z, ref[f"qp/{i}/z"], atol=1e-6)


def test_unfactorised_and_unpolished_solvers_agree(ref):
    h, g, c, lo, hi = (ref[f"qp/5/{k}"] for k in ("H", "g", "C", "lo", "hi"))
    a = qp.ADMM(h, c).solve(g, lo, hi)
    b = qp.ADMM(h, c, factorize=False).solve(g, lo, hi)
    d = qp.ADMM(h, c, polish=False, max_iter=20000).solve(g, lo, hi)
    assert not d.polished and d.status == "solved" and d.residual <= 1e-6
    np.testing.assert_allclose(a.z, b.z, atol=1e-8)
    np.testing.assert_allclose(a.z, d.z, atol=1e-4)


def test_random_qps_satisfy_kkt():
    rng = np.random.default_rng(5)
    for _ in range(10):
        n, k = 8, 12
        m = rng.standard_normal((n, n))
        h = m @ m.T + 0.1 * np.eye(n)
        c = rng.standard_normal((k, n))
        g = rng.standard_normal(n) * 3
        lo, hi = -rng.uniform(0.1, 1, k), rng.uniform(0.1, 1, k)
        res = qp.ADMM(h, c).solve(g, lo, hi)
        assert res.residual <= 1e-6
        # optimal against random feasible perturbations (convexity: no better neighbour)
        for _ in range(20):
            z = res.z + rng.standard_normal(n) * 1e-3
            if np.all(c @ z >= lo) and np.all(c @ z <= hi):
                assert 0.5 * z @ h @ z + g @ z >= res.objective - 1e-9


def test_prediction_is_the_linear_model():
    m = mpc.cartpole_mpc(horizon=20)
    rng = np.random.default_rng(0)
    x0, u = rng.standard_normal(4) * 0.1, rng.standard_normal(20)
    x, pred = x0.copy(), m.predict(x0, u)
    for k in range(20):
        x = m.a @ x + m.b[:, 0] * u[k]
        np.testing.assert_allclose(pred[k], x, atol=1e-12)


def test_unconstrained_mpc_is_lqr():
    a, b = dynamics.CartPole().discrete(0.02)
    q, r = np.diag([1.0, 1.0, 10.0, 1.0]), np.array([[0.1]])
    m = mpc.MPC(a, b, q, r, 20, -np.inf, np.inf)
    k = lqr.dare(a, b, q, r).K
    for x0 in ([0.1, 0.0, 0.05, 0.0], [-0.3, 0.2, -0.1, 0.3]):
        np.testing.assert_allclose(m.control(np.array(x0)), -k @ np.array(x0), rtol=1e-8,
                                   atol=1e-10)


@pytest.mark.parametrize("x0", [[0.0, 0.0, 0.3, 0.0], [0.5, 0.0, 0.1, 0.0],
                                [-0.6, 0.3, -0.15, 0.0]])
def test_closed_loop_mpc_respects_limits_and_converges(x0):
    cp = dynamics.CartPole()
    m = mpc.cartpole_mpc(horizon=20, u_max=10.0)
    residuals = []

    def policy(x):
        res = m.solve(x)
        residuals.append(res.residual)
        return res.z[:1]
    run = simulate.closed_loop_sim(cp, policy, x0, 0.02, 250)
    assert max(residuals) <= 1e-6
    assert np.abs(run["u"]).max() <= 10.0 + 1e-9
    assert np.abs(run["x"][:, 0]).max() <= 1.0 + 1e-6
    assert np.abs(run["x"][-1]).max() < 0.05


def test_mpc_keeps_the_cart_inside_the_wall_where_lqr_crosses_it():
    cp = dynamics.CartPole()
    a, b = cp.discrete(0.02)
    k = lqr.dare(a, b, np.diag([1.0, 1.0, 10.0, 1.0]), np.array([[0.1]])).K
    x0 = [0.8, 0.6, -0.05, 0.0]
    lq = simulate.closed_loop_sim(cp, simulate.lqr_policy(k, -10.0, 10.0), x0, 0.02, 200)
    m = mpc.cartpole_mpc(horizon=20, u_max=10.0, max_iter=1000)
    mp = simulate.closed_loop_sim(cp, m.control, x0, 0.02, 200)
    assert np.abs(lq["x"][:, 0]).max() > 1.04
    assert np.abs(mp["x"][:, 0]).max() <= 1.0 + 1e-3  # model mismatch: a hair, at most
    assert np.abs(mp["x"][-1]).max() < 0.1
    assert m.fallbacks < 10  # a few steps where the plant left the model's feasible set


def test_infeasible_qp_is_detected():
    c = np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    res = qp.ADMM(np.eye(2), c).solve(np.zeros(2), np.array([3.0, -1, -1]),
                                      np.array([4.0, 1, 1]))
    assert res.status == "infeasible"


def test_mpc_errors():
    a, b = dynamics.CartPole().discrete(0.02)
    with pytest.raises(ShapeError, match="MPC"):
        mpc.MPC(a, b[:3], np.eye(4), np.eye(1), 10, -1, 1)
    with pytest.raises(ArgumentError, match="horizon"):
        mpc.MPC(a, b, np.eye(4), np.eye(1), 0, -1, 1)
    with pytest.raises(ShapeError, match="x0"):
        mpc.cartpole_mpc().qp(np.zeros(3))
    with pytest.raises(ArgumentError, match="lower bound exceeds"):
        qp.ADMM(np.eye(2), np.eye(2)).solve(np.zeros(2), np.ones(2), np.zeros(2))
