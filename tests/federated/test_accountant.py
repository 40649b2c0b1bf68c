"""The RDP accountant against Opacus's numbers (tests/data/opacus_rdp_reference.npz)."""

import math
import os

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated import accountant

REF = os.path.join(os.path.dirname(__file__), "..", "data", "opacus_rdp_reference.npz")


@pytest.fixture(scope="module")
def ref():
    with np.load(REF, allow_pickle=False) as d:
        return {k: d[k] for k in d.files}


def test_same_orders_as_opacus(ref):
    assert str(ref["opacus_version"]) == "1.6.0"
    np.testing.assert_array_equal(np.array(accountant.DEFAULT_ORDERS), ref["orders"])


def test_epsilon_within_one_percent_of_opacus_over_the_grid(ref):
    worst = 0.0
    for a, q in enumerate(ref["q"]):
        for b, sigma in enumerate(ref["sigma"]):
            rdp1 = accountant.compute_rdp(q, sigma, 1)
            np.testing.assert_allclose(rdp1, ref["rdp"][a, b], rtol=1e-5)
            for c, steps in enumerate(ref["steps"]):
                for d, delta in enumerate(ref["delta"]):
                    eps, order = accountant.rdp_to_epsilon(accountant.DEFAULT_ORDERS,
                                                           rdp1 * steps, delta)
                    want = ref["epsilon"][a, b, c, d]
                    worst = max(worst, abs(eps - want) / want)
                    assert order == ref["best_order"][a, b, c, d] or abs(eps - want) < 1e-9
    assert worst < 0.01


def test_rdp_epsilon_and_the_accountant_agree():
    eps, order = accountant.rdp_epsilon(0.01, 1.1, 1000, 1e-5)
    acc = accountant.RDPAccountant()
    for _ in range(10):
        acc.step(0.01, 1.1, 100)
    assert acc.epsilon(1e-5) == pytest.approx((eps, order), rel=1e-12)
    assert accountant.RDPAccountant().epsilon(1e-5)[0] == 0.0


def test_closed_forms():
    # q = 1 is the Gaussian mechanism: alpha / (2 sigma^2) per step
    np.testing.assert_allclose(accountant.compute_rdp(1.0, 2.0, 3, [2, 3.5]),
                               [3 * 2 / 8, 3 * 3.5 / 8])
    # alpha = 2, any q: A_2 = (1-q)^2 + 2q(1-q) + q^2 e^(1/sigma^2) = 1 + q^2 (e^(1/s^2) - 1)
    q, s = 0.3, 1.7
    assert accountant.compute_rdp(q, s, 1, [2])[0] == pytest.approx(
        math.log1p(q * q * math.expm1(1 / s ** 2)), rel=1e-13)
    assert np.all(accountant.compute_rdp(0.0, 1.0, 10) == 0)
    assert np.all(np.isinf(accountant.compute_rdp(0.5, 0.0, 1)))


def test_monotone_in_the_right_directions():
    base = accountant.rdp_epsilon(0.02, 1.0, 500, 1e-5)[0]
    assert accountant.rdp_epsilon(0.04, 1.0, 500, 1e-5)[0] > base
    assert accountant.rdp_epsilon(0.02, 2.0, 500, 1e-5)[0] < base
    assert accountant.rdp_epsilon(0.02, 1.0, 1000, 1e-5)[0] > base
    assert accountant.rdp_epsilon(0.02, 1.0, 500, 1e-3)[0] < base


def test_bad_input():
    with pytest.raises(ArgumentError, match="compute_rdp: q"):
        accountant.compute_rdp(1.5, 1.0, 1)
    with pytest.raises(ArgumentError, match="order"):
        accountant.compute_rdp(0.1, 1.0, 1, [1.0])
    with pytest.raises(ArgumentError, match="delta"):
        accountant.rdp_epsilon(0.1, 1.0, 1, 0.0)
