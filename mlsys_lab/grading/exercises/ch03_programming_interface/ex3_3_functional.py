"""Exercise 3.3: the functional style, a pure loss of a parameter dict differentiated with
``ml.grad`` and a pure SGD step.

Wrong ideas rejected: a summed (not averaged) cross-entropy shows in the loss values; numpy
inside loss_fn cuts the tape, so ml.grad gives zeros; an in-place update (params[k] -= ...) or
returning the same dict fails the purity case; hidden state (momentum kept in a global, a step
counter for a decaying lr) makes two calls on the same params disagree and the 40-step run drift
from plain gradient descent; an lr fixed in the code fails because lr is drawn from the seed;
and ml.optim's in-place optimisers (and their kernels) are off limits. The references
``_ref_loss_grad`` and ``_ref_sgd`` are off limits to the student's code automatically.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register
from mlsys_lab.grading.exercises.ch03_programming_interface.common import array_of, expect_array


def _problem(seed, n=30, d=4, c=3):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((c, d)) * 2
    y = rng.integers(0, c, n)
    X = centers[y] + rng.standard_normal((n, d))
    params = {"W": rng.standard_normal((d, c)) * 0.3, "b": rng.standard_normal(c) * 0.1}
    return params, X, y.astype(np.int64)


def _lr(seed):
    return 0.2 + 0.1 * (seed % 4)


def _ref_loss_grad(params, X, y):
    z = X @ params["W"] + params["b"]
    z = z - z.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    n = len(y)
    loss = -logp[np.arange(n), y].mean()
    dz = np.exp(logp)
    dz[np.arange(n), y] -= 1
    dz /= n
    return loss, {"W": X.T @ dz, "b": dz.sum(axis=0)}


def _ref_sgd(params, X, y, lr, steps):
    for _ in range(steps):
        _, g = _ref_loss_grad(params, X, y)
        params = {k: params[k] - lr * g[k] for k in params}
    return params


def _dict_out(value):
    if isinstance(value, dict):
        return {k: array_of(v) for k, v in value.items()}
    return array_of(value)


def _expect_params(raw, like, what) -> dict:
    if not isinstance(raw, dict) or set(raw) != set(like):
        raise AssertionError(f"{what} should be a dict with W and b, got {describe(raw)}")
    return {k: expect_array(raw[k], like[k].shape, f"{what}[{k!r}]") for k in like}


def _scalar(value, what):
    if isinstance(value, (bool, str)) or value is None:
        raise AssertionError(f"{what} returned {describe(value)}; a loss is a number")
    arr = np.asarray(value) if isinstance(value, (int, float, np.ndarray, np.generic)) else None
    if arr is None or arr.dtype.kind not in "iuf":
        raise AssertionError(f"{what} returned {describe(value)}; a loss is a number")
    if arr.size != 1:
        raise AssertionError(f"{what} returned shape {arr.shape}; a loss is a scalar (the mean)")
    return float(arr.reshape(()))


def _loss_probe(loss_fn, sgd_step, seed):
    return [array_of(loss_fn(*_problem(seed * 3 + i))) for i in range(3)]


def _loss_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 3:
        raise AssertionError(f"loss_fn on 3 problems returned {describe(raw)}")
    for i, value in enumerate(raw):
        got = _scalar(value, "loss_fn")
        expected, _ = _ref_loss_grad(*_problem(seed * 3 + i))
        if not np.isclose(got, expected, rtol=1e-9):
            raise AssertionError(
                f"problem {i}: loss_fn gave {got:.6f}, expected {expected:.6f} (the mean "
                f"cross-entropy of softmax(X @ W + b))"
            )


def _loss_grad_probe(loss_fn, sgd_step, seed):
    import mlsys_lab as ml

    return [_dict_out(ml.grad(loss_fn)(*_problem(seed * 3 + 10 + i))) for i in range(3)]


def _loss_grad_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 3:
        raise AssertionError(f"ml.grad(loss_fn) on 3 problems returned {describe(raw)}")
    for i, grads in enumerate(raw):
        _, expected = _ref_loss_grad(*_problem(seed * 3 + 10 + i))
        got = _expect_params(grads, expected, "ml.grad(loss_fn)(params, X, y)")
        for k in ("W", "b"):
            if not np.allclose(got[k], expected[k], rtol=1e-7, atol=1e-10):
                raise AssertionError(f"problem {i}: the gradient with respect to {k} is wrong "
                                     f"(build the loss from ml.ops, not numpy, so ml.grad sees it)")


def _pure_probe(loss_fn, sgd_step, seed):
    params, X, y = _problem(seed + 20)
    new = sgd_step(params, X, y, _lr(seed))
    again = sgd_step(params, X, y, _lr(seed))
    return {"same_dict": new is params, "params": _dict_out(params), "new": _dict_out(new),
            "again": _dict_out(again)}


def _pure_judge(raw, seed):
    params, X, y = _problem(seed + 20)
    lr = _lr(seed)
    if not isinstance(raw, dict):
        raise AssertionError(f"the check got {describe(raw)}")
    if raw.get("same_dict"):
        raise AssertionError("sgd_step returned the dict it was given; build a new one")
    after = _expect_params(raw.get("params"), params, "params")
    if any(not np.array_equal(after[k], params[k]) for k in params):
        raise AssertionError(
            "sgd_step changed the params it was given; a pure function returns new values instead"
        )
    _, g = _ref_loss_grad(params, X, y)
    new = _expect_params(raw.get("new"), params, "sgd_step")
    for k in ("W", "b"):
        if not np.allclose(new[k], params[k] - lr * g[k], rtol=1e-7, atol=1e-10):
            raise AssertionError(f"new {k} should be {k} - lr * dL/d{k} (lr = {lr:g})")
    again = _expect_params(raw.get("again"), params, "sgd_step")
    if any(not np.allclose(again[k], new[k], rtol=1e-12, atol=1e-14) for k in params):
        raise AssertionError(
            "two calls of sgd_step on the same params gave different results; a pure function "
            "keeps no hidden state (no momentum or step counter outside its arguments)"
        )


def _learns_probe(loss_fn, sgd_step, seed):
    params, X, y = _problem(seed + 30, n=60)
    for _ in range(40):
        params = sgd_step(params, X, y, 0.5)
    return _dict_out(params)


def _learns_judge(raw, seed):
    params, X, y = _problem(seed + 30, n=60)
    first, _ = _ref_loss_grad(params, X, y)
    expected = _ref_sgd(params, X, y, 0.5, 40)
    got = _expect_params(raw, params, "40 steps of sgd_step")
    if any(not np.allclose(got[k], expected[k], rtol=1e-6, atol=1e-9) for k in params):
        last, _ = _ref_loss_grad(got, X, y)
        want, _ = _ref_loss_grad(expected, X, y)
        raise AssertionError(
            f"40 steps of sgd_step(lr=0.5) took the loss from {first:.3f} to {last:.3f}; plain "
            f"gradient descent reaches {want:.3f}"
        )


register(
    Exercise(
        id="3.3",
        title="Functional style: loss_fn and sgd_step",
        target=("loss_fn", "sgd_step"),
        task="a pure gradient-descent step",
        forbidden=("mlsys_lab.optim.optimizers", "mlsys_lab.kernels.optim"),
        cases=(
            Case("loss value on 3 problems", 1, probe=_loss_probe, judge=_loss_judge),
            Case("ml.grad(loss_fn) on 3 problems", 1.5, probe=_loss_grad_probe,
                 judge=_loss_grad_judge),
            Case("sgd_step is pure and correct", 1, probe=_pure_probe, judge=_pure_judge),
            Case("40 steps equal plain gradient descent", 0.5, probe=_learns_probe,
                 judge=_learns_judge),
        ),
    ),
)
