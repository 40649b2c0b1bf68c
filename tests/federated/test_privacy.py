"""Local DP and DP-SGD against direct float64 computations."""

import numpy as np
import pytest

from mlsys_lab import federated as fl
from mlsys_lab.errors import ArgumentError
from tests.federated import reference as ref


def small(seed=0, n=12):
    rng = np.random.default_rng(seed)
    params = fl.model.init_mlp((5, 4, 3), seed=seed)
    params = {k: v + 0.1 * rng.normal(size=v.shape) for k, v in params.items()}
    return params, rng.normal(size=(n, 5)), rng.integers(0, 3, n)


@pytest.mark.parametrize("clip,sigma", [(0.3, 0.0), (0.3, 1.2), (100.0, 0.5)])
def test_dp_sgd_step_against_a_direct_float64_computation(clip, sigma):
    params, x, y = small()
    new, info = fl.privacy.dp_sgd_step(params, x, y, lr=0.5, clip=clip, sigma=sigma,
                                       rng=np.random.default_rng(42), expected_batch=10.0)
    per = ref.per_example_grads(params, x, y)
    keys = sorted(params)
    norms = np.array([np.sqrt(sum((g[k] ** 2).sum() for k in keys)) for g in per])
    np.testing.assert_allclose(info["norms"], norms, rtol=1e-12)
    noise_rng = np.random.default_rng(42)
    for k in keys:
        total = sum(g[k] * min(1.0, clip / n) for g, n in zip(per, norms))
        total = (total + sigma * clip * noise_rng.standard_normal(params[k].shape)) / 10.0
        np.testing.assert_allclose(info["grad"][k], total, rtol=1e-11, atol=1e-14)
        np.testing.assert_allclose(new[k], params[k] - 0.5 * total, rtol=1e-11, atol=1e-14)
    if clip == 0.3:
        assert norms.min() > 0.3          # the case where clipping acts on every example


def test_dp_sgd_train_reports_the_accountants_epsilon():
    params, x, y = small(n=40)
    out, eps = fl.privacy.dp_sgd_train(params, x, y, steps=20, q=0.25, lr=0.1, clip=1.0,
                                       sigma=1.1, delta=1e-5, seed=0)
    assert eps == pytest.approx(fl.accountant.rdp_epsilon(0.25, 1.1, 20, 1e-5)[0], rel=1e-12)
    assert not np.allclose(out["W1"], params["W1"])


def test_local_dp_clips_and_adds_noise_of_the_stated_scale():
    g = {"a": np.zeros((200, 50)), "b": np.zeros(10)}
    t = {"a": np.full((200, 50), 0.5), "b": np.full(10, -0.5)}
    clipped = fl.privacy.LocalDP("gaussian", clip=2.0, noise=0.0)(g, t, np.random.default_rng())
    assert fl.privacy.global_norm(clipped) == pytest.approx(2.0, rel=1e-12)
    assert np.all(clipped["a"] > 0) and np.all(clipped["b"] < 0)
    noisy = fl.privacy.LocalDP("gaussian", clip=2.0, noise=0.5)(g, t, np.random.default_rng(0))
    resid = np.concatenate([(noisy[k] - clipped[k]).ravel() for k in g])
    assert resid.std() == pytest.approx(1.0, rel=0.03)
    lap = fl.privacy.LocalDP("laplace", clip=2.0, noise=0.5)
    out = lap(g, t, np.random.default_rng(0))
    l1 = fl.privacy.LocalDP("laplace", clip=2.0, noise=0.0)(g, t, np.random.default_rng(0))
    assert fl.privacy.global_norm(l1, ord=1) == pytest.approx(2.0, rel=1e-12)
    resid = np.concatenate([(out[k] - l1[k]).ravel() for k in g])
    assert np.abs(resid).mean() == pytest.approx(1.0, rel=0.03)     # Laplace: E|X| = scale
    assert lap.epsilon == 4.0


def test_noise_in_the_average_shrinks_like_one_over_sqrt_n():
    g = {"w": np.zeros(500)}
    t = {"w": np.full(500, 0.01)}
    mech = fl.privacy.LocalDP("gaussian", clip=1.0, noise=1.0)
    rng = np.random.default_rng(5)
    errs = []
    for n in (10, 1000):
        ups = [mech(g, t, rng)["w"] for _ in range(n)]
        errs.append(np.std(np.mean(ups, axis=0) - 0.01))
    assert errs[1] / errs[0] == pytest.approx(0.1, rel=0.1)


def test_bad_input():
    with pytest.raises(ArgumentError, match="LocalDP"):
        fl.privacy.LocalDP("cauchy")
    with pytest.raises(ArgumentError, match="clip"):
        fl.privacy.clip({"a": np.ones(2)}, 0.0)
    params, x, y = small()
    with pytest.raises(ArgumentError, match="dp_sgd_step"):
        fl.privacy.dp_sgd_step(params, x, y, lr=0.1, clip=-1, sigma=1.0,
                               rng=np.random.default_rng())


def test_an_empty_poisson_batch_is_noise_only():
    params, x, y = small()
    new, info = fl.privacy.dp_sgd_step(params, x[:0], y[:0], lr=1.0, clip=0.5, sigma=2.0,
                                       rng=np.random.default_rng(3), expected_batch=4.0)
    noise_rng = np.random.default_rng(3)
    for k in sorted(params):
        want = 2.0 * 0.5 * noise_rng.standard_normal(params[k].shape) / 4.0
        np.testing.assert_allclose(info["grad"][k], want, rtol=1e-14)
        np.testing.assert_allclose(new[k], params[k] - want, rtol=1e-14)
    assert info["norms"].shape == (0,)
