"""Vertical logistic regression under Paillier: the encrypted run equals the same integer
arithmetic in the clear bit for bit, and the float64 model within fixed-point precision;
the PSI alignment picks matching rows."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.federated import vertical as V
from mlsys_lab.federated.crypto import paillier, rsa

KEY = paillier.generate(256, rng=0)


def _data(n=40, seed=0):
    X, y = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    idx = np.random.default_rng(seed).permutation(len(y))[:n]
    return X[idx, :3], X[idx, 3:6], 2.0 * y[idx] - 1.0


def test_encrypted_training_equals_the_fixed_point_and_float_models():
    Xa, Xb, y = _data()
    res = V.train_vertical(Xa, Xb, y, lr=0.5, iterations=4, frac_bits=16, key=KEY, rng=1)
    fa, fb = V.train_fixed_point(Xa, Xb, y, lr=0.5, iterations=4, frac_bits=16)
    pa, pb = V.train_plain(Xa, Xb, y, lr=0.5, iterations=4)
    assert np.array_equal(res.theta_a, fa) and np.array_equal(res.theta_b, fb)
    assert res.theta_a.shape == (3,) and res.theta_b.shape == (4,)  # B has the intercept
    assert np.abs(res.theta_a - pa).max() < 1e-4 and np.abs(res.theta_b - pb).max() < 1e-4
    assert len(res.history) == 4 and res.key_bits == 256


def test_the_plain_reference_descends_the_taylor_loss_and_classifies():
    Xa, Xb, y = _data(200, 1)
    losses = [V.taylor_loss(*V.train_plain(Xa, Xb, y, iterations=k), Xa, Xb, y)
              for k in (0, 5, 20, 60)]
    assert losses[0] == pytest.approx(np.log(2)) and np.all(np.diff(losses) < 0)
    ta, tb = V.train_plain(Xa, Xb, y, iterations=60)
    accuracy = ((V.predict_proba(ta, tb, Xa, Xb) > 0.5) == (y > 0)).mean()
    assert accuracy > 0.85


def test_the_plain_gradient_is_the_taylor_losss_gradient():
    """One step of train_plain from zero equals -lr times the central-difference gradient of
    taylor_loss (float64)."""
    Xa, Xb, y = _data(30, 2)
    ta, tb = V.train_plain(Xa, Xb, y, lr=1.0, iterations=1)
    theta = np.zeros(3 + 4)
    h, grad = 1e-6, np.zeros(7)
    for j in range(7):
        e = np.zeros(7)
        e[j] = h
        grad[j] = (V.taylor_loss((theta + e)[:3], (theta + e)[3:], Xa, Xb, y)
                   - V.taylor_loss((theta - e)[:3], (theta - e)[3:], Xa, Xb, y)) / (2 * h)
    assert np.allclose(np.concatenate([ta, tb]), -grad, atol=1e-8)


def test_fewer_fractional_bits_lose_precision_but_stay_exact_to_their_emulation():
    Xa, Xb, y = _data(20, 3)
    res = V.train_vertical(Xa, Xb, y, iterations=2, frac_bits=6, key=KEY, rng=2)
    fa, _ = V.train_fixed_point(Xa, Xb, y, iterations=2, frac_bits=6)
    pa, _ = V.train_plain(Xa, Xb, y, iterations=2)
    assert np.array_equal(res.theta_a, fa)
    assert 1e-5 < np.abs(res.theta_a - pa).max() < 0.05


def test_wire_counts():
    Xa, Xb, y = _data(10, 4)
    res = V.train_vertical(Xa, Xb, y, iterations=2, key=KEY, rng=3)
    assert res.messages == dict.fromkeys(("A->B", "B->A", "A->C", "B->C", "C->A", "C->B"), 2)
    ct = KEY.public.ciphertext_bytes
    assert res.bytes["A->B"] == 2 * 10 * ct and res.bytes["B->C"] == 2 * 4 * ct


def test_align_by_psi_returns_matching_rows():
    ids_a = [f"u{k}" for k in range(0, 60, 2)]
    ids_b = [f"u{k}" for k in range(0, 60, 3)]
    common, ra, rb = V.align(ids_a, ids_b, key=rsa.generate(256, rng=5), rng=5)
    assert common == [v for v in ids_b if v in set(ids_a)]
    assert [ids_a[i] for i in ra] == common == [ids_b[i] for i in rb]


def test_bad_inputs():
    Xa, Xb, y = _data(10, 5)
    with pytest.raises(ArgumentError, match="-1 or \\+1"):
        V.train_plain(Xa, Xb, (y > 0).astype(float))
    with pytest.raises(ShapeError, match="train_vertical"):
        V.train_vertical(Xa, Xb[:5], y, key=KEY)
    with pytest.raises(ArgumentError, match="too small"):
        V.train_vertical(Xa, Xb, y, key=paillier.generate(64, rng=0), frac_bits=30)
