"""TCAV is significant for a planted concept only; the t-test's p-values; the sanity check."""

import numpy as np
import pytest

from mlsys_lab.explain import cam, concepts, gradients, sanity
from mlsys_lab.nn import Linear, Sequential, Tanh


def planted_model(seed=0):
    """16 inputs -> h (8) -> tanh -> 2 logits. Class 0's logit reads h[0:4] only, positively;
    input direction u drives h[0:4] (the planted concept), u2 drives h[4:8] only (ignored)."""
    rng = np.random.default_rng(seed)
    model = Sequential(Linear(16, 8, rng=seed), Tanh(), Linear(8, 2, rng=seed + 1))
    W1 = rng.normal(size=(16, 8)) * 0.3
    u, u2 = np.zeros(16), np.zeros(16)
    u[:4], u2[4:8] = 1.0, 1.0
    W1[:4, :] = 0.0
    W1[4:8, :] = 0.0
    W1[:4, :4] = np.eye(4)
    W1[4:8, 4:] = np.eye(4)
    W2 = np.zeros((8, 2))
    W2[:4, 0] = 1.0
    W2[:, 1] = rng.normal(size=8)
    for p, v in zip(model.parameters(), (W1, np.zeros(8), W2, np.zeros(2))):
        p.data = v.astype(np.float64)
    return model, u, u2


def test_tcav_is_significant_for_the_planted_concept_only():
    model, u, u2 = planted_model()
    rng = np.random.default_rng(5)

    def noise(n):
        return rng.normal(size=(n, 16)) * 0.5

    inputs = noise(40)
    randoms = [noise(30) for _ in range(8)]
    planted = concepts.tcav(model, 0, inputs, 0, noise(30) + u, randoms)
    ignored = concepts.tcav(model, 0, inputs, 0, noise(30) + 2 * u2, randoms)
    random = concepts.tcav(model, 0, inputs, 0, noise(30), randoms)
    assert planted.significant and planted.score > 0.95, planted
    assert not ignored.significant, ignored
    assert not random.significant, random
    # cost: activations of every set, then one forward + backward per input per CAV
    assert planted.backward == 2 * 7 * 40
    assert planted.forward == 30 + 8 * 30 + 2 * 7 * 40


def test_t_test_p_values_are_students():
    # two-sided p of t with df degrees of freedom: 2 * scipy.stats.t.sf(t, df) (scipy 1.x)
    for t, df, p in ((2.228138851986, 10, 0.050000000000023255),
                     (1.0, 5, 0.3632174676491229), (3.0, 30, 0.005389964065651945),
                     (0.5, 2, 0.6666666666666667)):
        assert concepts.betainc(df / 2, 0.5, df / (df + t * t)) == pytest.approx(p, rel=1e-10)
    a, b = [0.9, 0.95, 1.0, 0.85], [0.4, 0.6, 0.5, 0.55]
    t, p = concepts.t_test(a, b)
    scipy = pytest.importorskip("scipy.stats")
    ref = scipy.ttest_ind(a, b)
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue, rel=1e-9)


def test_t_test_without_scipy_against_a_hand_computation():
    a, b = [1.0, 2.0, 3.0], [4.0, 5.0, 6.0]
    t, p = concepts.t_test(a, b)
    assert t == pytest.approx(-3.0 / np.sqrt(1.0 * (2 / 3)))
    assert concepts.t_test([1, 1], [1, 1]) == (0.0, 1.0)
    assert concepts.t_test([1, 1], [0, 0])[1] == 0.0


def test_spearman_with_ties_and_rankdata():
    np.testing.assert_allclose(sanity.rankdata([3, 1, 3, 2]), [3.5, 1, 3.5, 2])
    assert sanity.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert sanity.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    assert sanity.spearman(a, b) == pytest.approx(np.corrcoef(ra, rb)[0, 1])


def test_randomising_the_weights_breaks_saliency_ig_and_grad_cam(chapter_models):
    """Adebayo et al.'s model-randomisation test: with every layer re-initialised, the signed
    maps of saliency, IG and Grad-CAM keep a Spearman correlation <= 0.5 with the trained
    model's (mean over five digits). Gradient x input-like maps under |.| keep the input's
    shape instead (IG: > 0.7): the reason the test compares signed maps."""
    explainers = {
        "saliency": lambda m, x, t: gradients.saliency(m, x, t),
        "ig": lambda m, x, t: gradients.integrated_gradients(m, x, t, steps=16),
        "grad_cam": lambda m, x, t: cam.grad_cam(m, x, t, 4, relu=False),
    }
    final, abs_ig = {k: [] for k in explainers}, []
    for i in (0, 17, 42, 123, 300):
        x, t = chapter_models.digits_x[i], int(chapter_models.digits_y[i])
        steps, corr = sanity.cascading_randomisation(chapter_models.digits, explainers, x, t,
                                                     seed=1, absolute=False)
        assert steps[0] == "none" and len(steps) == 4
        for k in explainers:
            assert corr[k][0] == 1.0
            final[k].append(corr[k][-1])
        _, c = sanity.cascading_randomisation(chapter_models.digits,
                                              {"ig": explainers["ig"]}, x, t, seed=1)
        abs_ig.append(c["ig"][-1])
    means = {k: float(np.mean(v)) for k, v in final.items()}
    assert all(v <= 0.5 for v in means.values()), means
    assert np.mean(abs_ig) > 0.7, abs_ig


def test_randomised_leaves_the_original_alone(chapter_models):
    before = [np.array(p.data) for p in chapter_models.digits.parameters()]
    rand = sanity.randomised(chapter_models.digits, [7], seed=0)
    for p, b in zip(chapter_models.digits.parameters(), before):
        np.testing.assert_array_equal(p.data, b)
    assert not np.allclose(rand[7].weight.data, before[4])
    np.testing.assert_array_equal(rand[0].weight.data, before[0])
    assert sanity.parameterised_layers(chapter_models.digits) == [0, 3, 7]


def test_logistic_regression_primal_and_dual_forms_agree():
    """More features than rows takes the (n + 1)-dimensional route; padding the same data with
    zero columns, or using the primal on the first columns only, gives the same classifier."""
    rng = np.random.default_rng(4)
    X = rng.normal(size=(30, 8))
    y = (X[:, 0] + 0.5 * rng.normal(size=30) > 0).astype(float)
    w, b = concepts.logistic_regression(X, y, l2=0.05)               # primal: d < n
    wide = np.hstack([X, np.zeros((30, 40))])                          # dual: d = 48 > n = 30
    w2, b2 = concepts.logistic_regression(wide, y, l2=0.05)
    np.testing.assert_allclose(w2[:8], w, atol=1e-7)
    np.testing.assert_allclose(w2[8:], 0, atol=1e-12)
    assert b2 == pytest.approx(b, abs=1e-7)
    # the optimality condition: the gradient of the penalised loss vanishes
    p = 1 / (1 + np.exp(-(X @ w + b)))
    np.testing.assert_allclose(X.T @ (p - y) + 0.05 * 30 * w, 0, atol=1e-8)
    assert abs((p - y).sum()) < 1e-8


def test_tcav_and_spearman_errors():
    from mlsys_lab.errors import ArgumentError, ShapeError

    model, u, _ = planted_model()
    with pytest.raises(ArgumentError, match="tcav: needs at least 3 random sets"):
        concepts.tcav(model, 0, np.zeros((4, 16)), 0, np.zeros((4, 16)), [np.zeros((4, 16))])
    with pytest.raises(ShapeError, match="concept_activation_vector: activations must be"):
        concepts.concept_activation_vector(np.zeros((3, 4)), np.zeros((3, 5)))
    with pytest.raises(ArgumentError, match="t_test: needs two samples of at least 2"):
        concepts.t_test([1.0], [1.0, 2.0])
    with pytest.raises(ShapeError, match="spearman: maps of 3 and 4 values"):
        sanity.spearman([1, 2, 3], [1, 2, 3, 4])
