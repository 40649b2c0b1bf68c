"""ml.per_example_grad against a loop of single-example ml.grad calls (float64)."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError


def mlp_loss(params, x, y):
    h = ml.ops.tanh(ml.ops.matmul(x, params["W1"]) + params["b1"])
    h = ml.ops.relu(ml.ops.matmul(h, params["W2"]) + params["b2"])
    z = ml.ops.matmul(h, params["W3"]) + params["b3"]
    return -(ml.ops.log_softmax(z, axis=-1) * y).sum(axis=-1)


def make(rng, sizes=(7, 5, 4, 3), batch=6):
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]), 1):
        params[f"W{i}"] = rng.normal(size=(a, b))
        params[f"b{i}"] = rng.normal(size=(b,))
    x = rng.normal(size=(batch, sizes[0]))
    y = np.eye(sizes[-1])[rng.integers(0, sizes[-1], batch)]
    return params, x, y


def loop_reference(f, params, *examples):
    batch = examples[0].shape[0]
    g = ml.grad(lambda p, *e: f(p, *e).sum())
    per = [g(params, *(e[i:i + 1] for e in examples)) for i in range(batch)]
    return {k: np.stack([np.asarray(p[k].data) for p in per]) for k in params}


@pytest.mark.parametrize("seed", range(4))
def test_matches_loop_of_single_example_grads(seed):
    rng = np.random.default_rng(seed)
    params, x, y = make(rng, batch=1 + seed * 3)
    got, losses = ml.per_example_grad(mlp_loss, return_loss=True)(params, x, y)
    want = loop_reference(mlp_loss, params, x, y)
    for k in params:
        assert got[k].shape == (x.shape[0],) + params[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-13)
    direct = [float(np.asarray(mlp_loss(params, x[i:i + 1], y[i:i + 1]).data).sum())
              for i in range(x.shape[0])]
    np.testing.assert_allclose(losses, direct, rtol=1e-13)


def test_sum_of_per_example_grads_is_the_batch_grad():
    rng = np.random.default_rng(7)
    params, x, y = make(rng, batch=9)
    got = ml.per_example_grad(mlp_loss)(params, x, y)
    full = ml.grad(lambda p: mlp_loss(p, x, y).sum())(params)
    for k in params:
        np.testing.assert_allclose(got[k].sum(axis=0), np.asarray(full[k].data), rtol=1e-11,
                                   atol=1e-12)


def test_nn_linear_through_functional_call():
    rng = np.random.default_rng(3)
    model = nn.Sequential(nn.Linear(4, 6, rng=rng), nn.ReLU(), nn.Linear(6, 2, rng=rng))
    params = {k: np.asarray(p.data, dtype=np.float64) for k, p in model.named_parameters()}
    x = rng.normal(size=(5, 4))
    t = rng.normal(size=(5, 2))

    def f(p, xb, tb):
        return ((nn.functional_call(model, p, xb) - tb) ** 2).sum(axis=-1)

    got = ml.per_example_grad(f)(params, x, t)
    want = loop_reference(f, params, x, t)
    for k in params:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-12, atol=1e-13)


def test_grad_against_central_differences():
    rng = np.random.default_rng(11)
    params, x, y = make(rng, sizes=(3, 4, 3, 2), batch=3)
    got = ml.per_example_grad(mlp_loss)(params, x, y)
    eps = 1e-6
    for i in range(3):
        for k in params:
            flat = params[k].reshape(-1)
            for j in range(flat.size):
                old = flat[j]
                flat[j] = old + eps
                up = float(np.asarray(mlp_loss(params, x[i:i + 1], y[i:i + 1]).data).sum())
                flat[j] = old - eps
                down = float(np.asarray(mlp_loss(params, x[i:i + 1], y[i:i + 1]).data).sum())
                flat[j] = old
                assert abs(got[k][i].reshape(-1)[j] - (up - down) / (2 * eps)) < 1e-7


def test_a_function_that_mixes_examples_is_refused():
    rng = np.random.default_rng(0)
    params, x, y = make(rng, batch=4)
    with pytest.raises(ShapeError, match="per_example_grad.*one loss per example"):
        ml.per_example_grad(lambda p, a, b: mlp_loss(p, a, b).sum())(params, x, y)
    with pytest.raises(ShapeError, match="per_example_grad"):
        ml.per_example_grad(lambda p, a, b: mlp_loss(p, a, b).mean(axis=0))(params, x, y)


def test_bad_input():
    rng = np.random.default_rng(0)
    params, x, y = make(rng, batch=4)
    with pytest.raises(ArgumentError, match="per_example_grad.*batch size"):
        ml.per_example_grad(mlp_loss)(params, x, y[:3])
    with pytest.raises(ArgumentError, match="per_example_grad"):
        ml.per_example_grad(mlp_loss)(params)
    with pytest.raises(DTypeError, match="per_example_grad.*floating"):
        ml.per_example_grad(mlp_loss)(dict(params, b1=np.arange(4)), x, y)
    with pytest.raises(ShapeError, match="per_example_grad.*leading batch axis"):
        ml.per_example_grad(mlp_loss)(params, np.float64(1.0))


def test_argnums_moves_the_parameters_and_bad_argnums_are_refused():
    params, x, y = make(np.random.default_rng(4))
    first = ml.per_example_grad(mlp_loss)(params, x, y)
    last = ml.per_example_grad(lambda a, b, p: mlp_loss(p, a, b), argnums=2)(x, y, params)
    for k in first:
        np.testing.assert_array_equal(first[k], last[k])
    for bad in (-1, 1.5, True, (0, 1)):
        with pytest.raises(ArgumentError, match="per_example_grad.*argnums"):
            ml.per_example_grad(mlp_loss, argnums=bad)
    with pytest.raises(ArgumentError, match="per_example_grad.*argument 2"):
        ml.per_example_grad(mlp_loss, argnums=2)(params, x)
