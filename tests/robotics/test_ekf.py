"""EKF localisation: the measurement Jacobian against central differences, consistency (NEES)
over seeded runs, and accuracy against dead reckoning."""

import numpy as np
import pytest

from mlsys_lab.errors import ShapeError
from mlsys_lab.robotics import ekf


def test_measurement_jacobian_matches_central_differences():
    rng = np.random.default_rng(0)
    for _ in range(20):
        pose, lm = rng.uniform(-3, 3, 3), rng.uniform(-5, 5, 2)
        j = ekf.measurement_jacobian(pose, lm)
        num = np.zeros((2, 3))
        for i in range(3):
            e = np.zeros(3)
            e[i] = 1e-6
            d = ekf.measure(pose + e, lm) - ekf.measure(pose - e, lm)
            d[1] = ekf.wrap(d[1])
            num[:, i] = d / 2e-6
        np.testing.assert_allclose(j, num, rtol=1e-6, atol=1e-7)


def test_filter_is_consistent_and_beats_dead_reckoning():
    nees, ekf_err, dead_err = [], [], []
    for seed in range(12):
        run = ekf.simulate_run(seed, steps=300)
        nees.append(run.nees.mean())
        ekf_err.append(np.hypot(*(run.ekf[:, :2] - run.truth[:, :2]).T).mean())
        dead_err.append(np.hypot(*(run.dead[:, :2] - run.truth[:, :2]).T).mean())
        assert np.all(np.linalg.eigvalsh(run.cov[-1]) > 0)
    # NEES of a consistent filter averages the state dimension, 3
    assert 2.5 < np.mean(nees) < 3.6
    assert np.mean(ekf_err) < 0.5 * np.mean(dead_err)


def test_without_landmarks_the_filter_is_dead_reckoning():
    run = ekf.simulate_run(3, steps=100, landmarks=np.array([[100.0, 100.0]]))
    assert run.seen.sum() == 0
    np.testing.assert_allclose(run.ekf, run.dead, atol=1e-12)
    assert np.all(np.diff([np.trace(p) for p in run.cov]) > 0)  # uncertainty only grows


def test_update_wraps_the_bearing():
    f = ekf.EKF([0.0, 0.0, np.pi - 0.01], np.eye(3) * 0.01)
    # a landmark behind-left: the bearing innovation crosses ±π
    lm = np.array([-1.0, -0.02])
    z = ekf.measure(np.array([0.0, 0.0, -np.pi + 0.01]), lm)
    f.update(z, lm)
    assert abs(ekf.wrap(f.x[2] - np.pi)) < 0.05


def test_ekf_errors():
    with pytest.raises(ShapeError, match="EKF"):
        ekf.EKF(np.zeros(2), np.eye(3))
