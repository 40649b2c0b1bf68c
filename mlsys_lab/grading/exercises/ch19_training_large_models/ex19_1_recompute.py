"""Exercise 19.1: backpropagation through a chain with recomputation (activation checkpointing).

The student writes ``backward_with_recompute(layers, x, grad_out, keep)``: ``layers`` is a
chain; ``layer.forward(a)`` returns the next activation and ``layer.backward(a, g)`` the
gradient with respect to the layer's input ``a`` given the gradient ``g`` of its output. Run the
forward pass keeping only the activations that enter the layers whose indices are in ``keep``
(always including layer 0's input ``x``); in the backward pass, for each segment between two
kept activations (last segment first), re-run its forward from the kept activation, then
backpropagate through it. Return the gradient with respect to ``x``.

The probe hands out activations as objects it counts while they are alive, and counts every
forward call: the judge checks the gradient, that no layer runs forward more than twice in all
(once in the forward pass, at most once again in backward: at most 2n calls) and that every
layer's input but x came from a forward call (at least n - 1), and the peak number of live
activations against ``len(keep) + the longest segment + 2``.

Wrong ideas rejected: keeping every activation (the peak grows with n: 16 layers here); re-running
the forward from ``x`` for every layer (forward calls grow as n²); recomputing a segment from
the wrong kept activation or one layer short (the gradient is wrong); forgetting the last
segment's own forward (too few calls or a wrong gradient); a segment recomputed more than once;
computing the chain beside the layers instead of through them (the weights are not attributes of
a layer, and fewer than n - 1 forward calls fail the calls case).
"""

from __future__ import annotations

import gc

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


def _chain(seed: int, n: int):
    """Per layer a weight matrix (tanh(W a) layers), the input and the output gradient."""
    rng = np.random.default_rng(19100 + seed + n)
    width = int(rng.integers(3, 6))
    weights = [rng.standard_normal((width, width)) / np.sqrt(width) for _ in range(n)]
    x = rng.standard_normal(width)
    g = rng.standard_normal(width)
    return weights, x, g


def _keep(seed: int, n: int, kind: str) -> list[int]:
    if kind == "sqrt":
        step = max(1, int(round(np.sqrt(n))))
        return list(range(0, n, step))
    if kind == "all":
        return list(range(n))
    rng = np.random.default_rng(19150 + seed + n)
    inner = sorted(rng.choice(np.arange(1, n), size=min(n - 1, 3), replace=False).tolist())
    return [0] + [int(i) for i in inner]


def _reference_grad(weights, x, g):
    acts = [x]
    for W in weights:
        acts.append(np.tanh(W @ acts[-1]))
    for W, out in zip(reversed(weights), reversed(acts[1:])):
        g = W.T @ ((1.0 - out ** 2) * g)
    return g


def _peak_bound(n: int, keep: list[int]) -> int:
    bounds = sorted(set(keep) | {0}) + [n]
    longest = max(b - a for a, b in zip(bounds, bounds[1:]))
    return len(set(keep) | {0}) + longest + 2


# ----------------------------------------------------------------------------- probes


class _Activation:
    """An activation the probe counts while it is alive."""

    __slots__ = ("value", "_tally", "__weakref__")

    def __init__(self, value, tally):
        self.value = value
        self._tally = tally
        tally["alive"] += 1
        tally["peak"] = max(tally["peak"], tally["alive"])

    def __del__(self):
        self._tally["alive"] -= 1


class _Layer:
    """``tanh(W a)``: forward takes and returns counted activations; backward takes the
    layer's input activation and the output gradient (a plain array). ``W`` lives in the two
    methods' closure, not in an attribute: the answer computes through the layers, not beside
    them."""

    __slots__ = ("forward", "backward")

    def __init__(self, W, tally):
        def forward(a):
            if not isinstance(a, _Activation):
                raise TypeError("forward takes an activation that a layer (or the input) gave")
            tally["forward"] += 1
            return _Activation(np.tanh(W @ a.value), tally)

        def backward(a, grad):
            if not isinstance(a, _Activation):
                raise TypeError("backward takes the layer's input activation")
            out = np.tanh(W @ a.value)
            return W.T @ ((1.0 - out ** 2) * np.asarray(grad, dtype=np.float64))

        self.forward, self.backward = forward, backward


def _probe(n: int, kind: str):
    def probe(backward_with_recompute, seed):
        def run():
            weights, x, g = _chain(seed, n)
            tally = {"alive": 0, "peak": 0, "forward": 0}
            layers = [_Layer(W, tally) for W in weights]
            gc.collect()
            grad = backward_with_recompute(layers, _Activation(x, tally), g.copy(),
                                           list(_keep(seed, n, kind)))
            grad = np.array(grad.value if isinstance(grad, _Activation) else grad,
                            dtype=np.float64)
            return {"grad": grad, "forward": tally["forward"], "peak": tally["peak"]}
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _judge(n: int, kind: str, check_calls: bool, check_peak: bool):
    def judge(raw, seed):
        if not isinstance(raw, dict) or "grad" not in raw:
            raise AssertionError(f"{n} layers: the backward pass did not run through: "
                                 f"{describe(raw)}")
        weights, x, g = _chain(seed, n)
        keep = _keep(seed, n, kind)
        want = _reference_grad(weights, x, g)
        got = np.asarray(raw["grad"])
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-10, atol=1e-12):
            raise AssertionError(f"{n} layers, kept {keep}: the gradient is {describe(got)}, "
                                 f"backpropagation gives {describe(want)}")
        if check_calls and raw["forward"] < n - 1:
            raise AssertionError(
                f"{n} layers, kept {keep}: {raw['forward']} forward calls; every layer's input "
                f"but x comes from the layer before it running forward: at least {n - 1}")
        if check_calls and raw["forward"] > 2 * n:
            raise AssertionError(
                f"{n} layers, kept {keep}: {raw['forward']} forward calls; the forward pass "
                f"runs each layer once and the backward pass re-runs each layer at most once, "
                f"from the kept activation of its segment: at most {2 * n}")
        if check_peak and raw["peak"] > _peak_bound(n, keep):
            raise AssertionError(
                f"{n} layers, kept {keep}: {raw['peak']} activations alive at once; keeping "
                f"only the kept ones plus one segment's needs at most {_peak_bound(n, keep)}")
    return judge


register(
    Exercise(
        id="19.1",
        title="Backpropagation with recomputation",
        target="backward_with_recompute",
        task="the recomputation schedule",
        forbidden=("mlsys_lab.engine.recompute", "mlsys_lab.engine.passes.recompute"),
        cases=(
            Case("the gradient equals plain backpropagation", 2,
                 feedback="recompute each segment from its kept activation, then backpropagate",
                 probe=_probe(7, "random"), judge=_judge(7, "random", False, False)),
            Case("each layer runs forward once more, no more", 2,
                 feedback="re-run a segment once, from its own kept activation",
                 probe=_probe(16, "sqrt"), judge=_judge(16, "sqrt", True, False)),
            Case("only the kept activations and one segment are alive", 2,
                 feedback="drop the activations inside a segment after the forward pass",
                 probe=_probe(16, "sqrt"), judge=_judge(16, "sqrt", False, True)),
        ),
    ),
)
