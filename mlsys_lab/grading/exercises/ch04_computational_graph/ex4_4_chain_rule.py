"""Exercise 4.4: the chain rule by hand, on a two-layer network with a tanh hidden layer (a
variant the chapter does not work out).

Wrong ideas rejected: the chapter's linear formulas (no tanh), or forgetting the factor
1 - H^2, give wrong values; applying tanh' to H instead of X1, or a transpose in the wrong
place, gives wrong values or shapes (every problem is non-square); the mean instead of the sum
in the loss is off by a constant; finite differences are off by more than the 1e-11 relative
tolerance (one problem has labels of size 1000). Every differentiating function of the library
is off limits (``AUTODIFF``): `ml.grad`, `vjp`, `jvp`, `value_and_grad`, `grad_graph`, the
tape's `backward` and the ops' own VJP/JVP rules.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, expect_list, register
from mlsys_lab.grading.exercises.fixtures import AUTODIFF, as_arrays, from_wire

_CHAIN_SHAPES = ((4, 3, 5, 2), (6, 2, 3, 4), (1, 5, 5, 1), (5, 4, 6, 3))


def _chain_problem(seed: int, i: int):
    """(X, W, W1, label) of problem #i: fixed shapes, values drawn from ``seed``."""
    n, k, m, p = _CHAIN_SHAPES[i]
    rng = np.random.default_rng([seed, i])
    X = rng.standard_normal((n, k))
    W = rng.standard_normal((k, m)) * 0.7
    W1 = rng.standard_normal((m, p))
    label = rng.standard_normal((n, p)) * (1000.0 if i == 3 else 1.0)
    return X, W, W1, label


def _chain_reference(X, W, W1, label):
    """(dL/dW, dL/dW1) from the library's reverse mode (the judge's reference)."""
    import mlsys_lab as ml

    def loss(W, W1):
        d = ml.ops.tanh(ml.tensor(X) @ W) @ W1 - ml.tensor(label)
        return (d * d).sum() * 0.5

    gW, gW1 = ml.grad(loss, argnums=(0, 1))(W, W1)
    return gW.numpy(), gW1.numpy()


def _chain_probe(chain_rule, seed):
    out = []
    for i in range(len(_CHAIN_SHAPES)):
        out.append(as_arrays(chain_rule(*_chain_problem(seed, i))))
    return out


def _chain_pair(got, i):
    X, W, W1, _ = _chain_problem(0, i)
    what = f"problem {i} (X{X.shape}, W{W.shape}, W1{W1.shape})"
    if not isinstance(got, list) or len(got) != 2:
        raise AssertionError(f"{what}: chain_rule should return a pair (dL_dW, dL_dW1), got "
                             f"{describe(got)}")
    got = [from_wire(r) for r in got]
    for r, name in zip(got, ("dL_dW", "dL_dW1"), strict=True):
        if not isinstance(r, np.ndarray):
            raise AssertionError(f"{what}: {name} is {describe(r)}, not a numpy array")
    return what, got


def _chain_close(got, expected, what, hint):
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {expected.shape}")
    scale = max(float(np.max(np.abs(expected))), 1e-300)
    err = float(np.max(np.abs(got.astype(np.float64) - expected)))
    if not err <= 1e-11 * scale:
        raise AssertionError(f"{what} is off by up to {err:.3g} (relative {err / scale:.2g}); "
                             f"{hint}")


def _chain_judge(index: int, name: str, hint: str):
    def judge(raw, seed):
        for i, got in enumerate(expect_list(raw, len(_CHAIN_SHAPES), "chain_rule")):
            what, pair = _chain_pair(got, i)
            problem = _chain_problem(seed, i)
            for r, p, label in zip(pair, problem[1:3], ("dL_dW", "dL_dW1"), strict=True):
                if r.shape != p.shape:
                    raise AssertionError(f"{what}: {label} has shape {r.shape}; a gradient has "
                                         f"the shape of its parameter, {p.shape}")
            expected = _chain_reference(*problem)
            _chain_close(pair[index], expected[index], f"{what}: {name}", hint)

    return judge


register(
    Exercise(
        id="4.4",
        title="The chain rule by hand",
        target="chain_rule",
        task="the backward pass (the chain rule)",
        forbidden=AUTODIFF,
        cases=(
            Case("dL/dW1 on 4 problems", 1, feedback="dL/dW1 = H^T (Y - Label)",
                 probe=_chain_probe,
                 judge=_chain_judge(1, "dL/dW1", "dL/dW1 = H^T (Y - Label) with H = tanh(X W)")),
            Case("dL/dW through tanh on 4 problems", 2,
                 feedback="dL/dW = X^T ((dY W1^T) * (1 - H^2))",
                 probe=_chain_probe,
                 judge=_chain_judge(0, "dL/dW", "chain through H = tanh(X1): dL/dX1 = "
                                                "((Y - Label) W1^T) * (1 - H^2), dL/dW = "
                                                "X^T dL/dX1")),
        ),
    ),
)
