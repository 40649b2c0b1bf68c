"""Dynamics, discretisation and LQR against central differences and committed SciPy /
python-control answers (``tests/data/make_control_reference.py``)."""

import os

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.robotics import dynamics, linalg, lqr

REF = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "control_reference.npz")


@pytest.fixture(scope="module")
def ref():
    with np.load(REF, allow_pickle=False) as z:
        return dict(z)


def central_jacobians(robot, x, u, h=1e-6):
    nx, nu = len(x), len(u)
    a, b = np.zeros((nx, nx)), np.zeros((nx, nu))
    for i in range(nx):
        e = np.zeros(nx)
        e[i] = h
        a[:, i] = (robot.f(x + e, u) - robot.f(x - e, u)) / (2 * h)
    for j in range(nu):
        e = np.zeros(nu)
        e[j] = h
        b[:, j] = (robot.f(x, u + e) - robot.f(x, u - e)) / (2 * h)
    return a, b


@pytest.mark.parametrize("robot", [dynamics.CartPole(), dynamics.CartPole(2.0, 0.5, 0.8),
                                   dynamics.DiffDrive()])
def test_jacobians_match_central_differences(robot):
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.uniform(-2, 2, robot.nx)
        u = rng.uniform(-5, 5, robot.nu)
        a, b = robot.jacobians(x, u)
        an, bn = central_jacobians(robot, x, u)
        np.testing.assert_allclose(a, an, rtol=1e-7, atol=1e-7)
        np.testing.assert_allclose(b, bn, rtol=1e-7, atol=1e-7)


def test_cartpole_upright_is_an_unstable_equilibrium():
    cp = dynamics.CartPole()
    assert np.allclose(cp.f(np.zeros(4), np.zeros(1)), 0)
    a, _ = cp.linearize()
    assert np.linalg.eigvals(a).real.max() > 3  # sqrt(15.8) ≈ 3.97: the pole falls
    # hanging down is an equilibrium too
    assert np.allclose(cp.f(np.array([0, 0, np.pi, 0]), np.zeros(1)), 0, atol=1e-12)


def test_diffdrive_wheels_round_trip():
    dd = dynamics.DiffDrive()
    v, w = dd.wheels_to_twist(*dd.twist_to_wheels(0.4, -1.2))
    assert np.isclose(v, 0.4) and np.isclose(w, -1.2)


def test_expm_against_scipy_and_identities(ref):
    for i in range(4):
        m, e = ref[f"expm/{i}/M"], ref[f"expm/{i}/E"]
        np.testing.assert_allclose(linalg.expm(m), e, rtol=1e-10, atol=1e-12 * np.abs(e).max())
    rng = np.random.default_rng(3)
    m = rng.standard_normal((4, 4))
    np.testing.assert_allclose(linalg.expm(m) @ linalg.expm(-m), np.eye(4), atol=1e-12)
    d = np.diag([0.5, -2.0, 3.0])
    np.testing.assert_allclose(linalg.expm(d), np.diag(np.exp([0.5, -2.0, 3.0])), rtol=1e-13)
    # a rotation generator: expm gives the rotation
    t = 2.5
    np.testing.assert_allclose(linalg.expm([[0, -t], [t, 0]]),
                               [[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]], atol=1e-13)


def test_zoh_against_scipy_and_euler_is_first_order(ref):
    a, b, dt = ref["zoh/A"], ref["zoh/B"], float(ref["zoh/dt"])
    ad, bd = linalg.zoh(a, b, dt)
    np.testing.assert_allclose(ad, ref["zoh/Ad"], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(bd, ref["zoh/Bd"], rtol=1e-12, atol=1e-14)
    errs = []
    for h in (0.02, 0.01):
        ae, _ = linalg.euler(a, b, h)
        errs.append(np.abs(ae - linalg.zoh(a, b, h)[0]).max())
    assert 3.5 < errs[0] / errs[1] < 4.5  # error O(h²) per step: halving h quarters it


def test_zoh_matches_the_nonlinear_plant_for_small_motions():
    cp = dynamics.CartPole()
    ad, bd = cp.discrete(0.01)
    x, u = np.array([0.0, 0.0, 1e-4, 0.0]), np.array([1e-3])
    np.testing.assert_allclose(cp.step(x, u, 0.01), ad @ x + bd @ u, atol=1e-10)


@pytest.mark.parametrize("i", range(12))
def test_lqr_gain_matches_scipy_and_control(ref, i):
    a, b, q, r = (ref[f"lqr/{i}/{k}"] for k in "ABQR")
    res = lqr.dare(a, b, q, r)
    p_ref = ref[f"lqr/{i}/P_scipy"]
    np.testing.assert_allclose(res.P, p_ref, rtol=1e-9, atol=1e-9 * np.abs(p_ref).max())
    for key in ("K_scipy", "K_control"):
        k_ref = ref[f"lqr/{i}/{key}"]
        np.testing.assert_allclose(res.K, k_ref, rtol=1e-9, atol=1e-9 * np.abs(k_ref).max())
    st = lqr.stability(lqr.closed_loop(a, b, res.K))
    assert st.stable
    open_radius = lqr.stability(a).radius
    assert (open_radius > 1) == (i % 2 == 1)  # half the systems are open-loop unstable


def test_riccati_fixed_point_and_one_step_is_not_enough(ref):
    a, b, q, r = (ref[f"lqr/1/{k}"] for k in "ABQR")
    res = lqr.dare(a, b, q, r)
    p_next, _ = lqr.riccati_step(a, b, q, r, res.P)
    np.testing.assert_allclose(p_next, res.P, rtol=1e-10, atol=1e-10)
    _, k1 = lqr.riccati_step(a, b, q, r, q)
    assert np.abs(k1 - res.K).max() > 1e-3


def test_lqr_stabilises_the_nonlinear_cartpole():
    cp = dynamics.CartPole()
    ad, bd = cp.discrete(0.02)
    k, _ = lqr.lqr(ad, bd, np.diag([1.0, 1.0, 10.0, 1.0]), np.array([[0.1]]))
    assert not lqr.stability(ad).stable and lqr.stability(ad - bd @ k).stable
    x = np.array([0.2, 0.0, 0.15, 0.0])
    for _ in range(500):
        x = cp.step(x, -k @ x, 0.02)
    assert np.abs(x).max() < 1e-3


def test_bad_input_errors():
    with pytest.raises(ShapeError, match="dare"):
        lqr.dare(np.eye(2), np.ones((3, 1)), np.eye(2), np.eye(1))
    with pytest.raises(ArgumentError, match="R must be symmetric positive definite"):
        lqr.dare(np.eye(2), np.ones((2, 1)), np.eye(2), np.zeros((1, 1)))
    with pytest.raises(ArgumentError, match="did not converge"):
        # an unstable mode the input cannot reach
        lqr.dare(np.diag([2.0, 0.5]), np.array([[0.0], [1.0]]), np.eye(2), np.eye(1),
                 max_iter=2000)
    with pytest.raises(ShapeError, match="CartPole.f"):
        dynamics.CartPole().f(np.zeros(3), np.zeros(1))
    with pytest.raises(ArgumentError, match="zoh"):
        linalg.zoh(np.eye(2), np.ones((2, 1)), 0.0)
