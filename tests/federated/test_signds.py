"""SignDS / EM-MDS: omega by counting, selection frequencies (chi-square), the eps bound."""

import itertools
import math

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.federated import signds


def chi2_bound(df, z=3.719):
    """Wilson-Hilferty upper quantile of chi-square(df) at about 1 - 1e-4."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2(observed, expected):
    keep = expected > 0
    assert np.all(observed[~keep] == 0)
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()), \
        int(keep.sum()) - 1


@pytest.mark.parametrize("k,d,h", [(2, 6, 3), (3, 7, 4), (1, 5, 5)])
def test_omega_counts_the_sets(k, d, h):
    topk = set(range(k))
    counts = [0] * (h + 1)
    for subset in itertools.combinations(range(d), h):
        counts[len(topk & set(subset))] += 1
    assert signds.omega(k, d, h) == counts
    np.testing.assert_allclose(np.exp(signds.log_omega(k, d, h)), counts, rtol=1e-12)


def test_selection_frequencies_match_omega_tau():
    k, d, h, eps, nu_th = 5, 30, 6, 1.5, 2
    rng = np.random.default_rng(0)
    topk = rng.choice(d, k, replace=False)
    draws = 8000
    seen = np.zeros(h + 1)
    for _ in range(draws):
        chosen = signds.em_mds(topk, d, h, eps, nu_th, rng)
        assert len(chosen) == h == len(set(chosen.tolist()))
        seen[len(np.intersect1d(chosen, topk))] += 1
    w = np.array(signds.omega(k, d, h), dtype=float) * np.exp(eps * (np.arange(h + 1) >= nu_th))
    stat, df = chi2(seen, draws * w / w.sum())
    assert stat < chi2_bound(df)
    np.testing.assert_allclose(signds.tau_probabilities(k, d, h, eps, nu_th), w / w.sum(),
                               rtol=1e-12)
    # a wrong idea: tau uniform over 0..h would fail the same test
    stat_u, _ = chi2(seen, np.full(h + 1, draws / (h + 1)))
    assert stat_u > chi2_bound(df)


def test_every_set_is_the_exponential_mechanism():
    d, h, eps, nu_th = 6, 3, 1.0, 1
    topk = np.array([1, 4])
    sets = list(itertools.combinations(range(d), h))
    index = {s: i for i, s in enumerate(sets)}
    rng = np.random.default_rng(1)
    draws = 10000
    seen = np.zeros(len(sets))
    for _ in range(draws):
        seen[index[tuple(signds.em_mds(topk, d, h, eps, nu_th, rng).tolist())]] += 1
    score = np.array([len(set(s) & {1, 4}) >= nu_th for s in sets], dtype=float)
    want = np.exp(eps * score)
    stat, df = chi2(seen, draws * want / want.sum())
    assert stat < chi2_bound(df)


def test_probability_ratio_is_bounded_by_e_to_the_eps():
    k, d, h, eps, nu_th = 3, 8, 4, 0.7, 2
    p_tau = signds.tau_probabilities(k, d, h, eps, nu_th)
    om = np.array(signds.omega(k, d, h), dtype=float)

    def prob(subset, topk):
        t = len(set(subset) & set(topk))
        return p_tau[t] / om[t]

    worst = 0.0
    for subset in itertools.combinations(range(d), h):
        for a, b in [((0, 1, 2), (5, 6, 7)), ((0, 1, 2), (0, 1, 3))]:
            worst = max(worst, prob(subset, a) / prob(subset, b))
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)


def test_client_update_and_aggregate():
    rng = np.random.default_rng(3)
    update = np.array([5.0, -4.0, 0.1, 3.0, -0.2, -6.0])
    signs = set()
    for _ in range(50):
        s, dims = signds.client_update(update, 2, 2, 50.0, 2, rng)     # eps large: the top-k
        signs.add(s)
        assert set(dims.tolist()) == ({0, 3} if s > 0 else {1, 5})
    assert signs == {-1, 1}
    step = signds.aggregate(6, [(1, [0, 3]), (-1, [1, 5]), (1, [0, 1])], lr=0.3)
    np.testing.assert_allclose(step, 0.1 * np.array([2, 0, 0, 1, 0, -1]))


def test_bad_input():
    with pytest.raises(ArgumentError, match="k <= d"):
        signds.omega(7, 5, 2)
    with pytest.raises(ArgumentError, match="nu_th"):
        signds.tau_probabilities(2, 6, 3, 1.0, 4)
    with pytest.raises(ArgumentError, match="0..4"):
        signds.em_mds([0, 9], 5, 2, 1.0, 1, np.random.default_rng(0))
