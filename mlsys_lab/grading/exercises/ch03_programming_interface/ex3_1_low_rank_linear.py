"""Exercise 3.1: a custom layer, a low-rank linear layer as an ``ml.nn.Module``.

Wrong ideas rejected: forming U @ V (in either layout, or by broadcasting) shows as an in x out
node in the traced forward; a weight precomputed in __init__, or a forward in numpy, gets no
gradient and ignores new values written into U, V and bias; an initialisation that ignores rng
(numpy's global generator, constant ones — which keep every rank column identical for ever)
shows when layers built with the same and with different rng are compared; the forward and
gradient cases first write random values into U, V and bias, so a zero factor cannot hide a
wrong formula. Both factors zero is refused, with the true reason; one zero factor (LoRA's
initialisation) is accepted, as V's gradient (xU)ᵀ·dY is then non-zero and training moves it.
``ml.nn.Linear`` is off limits.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    register,
)
from mlsys_lab.grading.exercises.ch03_programming_interface.common import array_of, expect_array

_SIZES = [(8, 6, 2), (5, 7, 3), (10, 4, 1)]


def _layer_info(layer):
    import mlsys_lab as ml

    if not isinstance(layer, ml.nn.Module):
        return {"module": False, "type": type(layer).__name__}
    return {"module": True, "count": layer.num_parameters(),
            "params": {name: tuple(p.shape) for name, p in layer.named_parameters()}}


def _expect_module(info, what) -> dict:
    if not isinstance(info, dict) or not info.get("module"):
        kind = info.get("type") if isinstance(info, dict) else describe(info)
        raise AssertionError(f"{what} is a {kind}; LowRankLinear must subclass ml.nn.Module")
    if set(info["params"]) != {"U", "V", "bias"}:
        raise AssertionError(
            f"{what} has parameters {sorted(info['params'])}; expected exactly U, V and bias "
            f"(assign ml.nn.Parameter objects to self.U, self.V, self.bias)"
        )
    return info


def _params_probe(LowRankLinear):
    return [_layer_info(LowRankLinear(n_in, n_out, rank, rng=0)) for n_in, n_out, rank in _SIZES]


def _params_judge(raw):
    if not isinstance(raw, list) or len(raw) != len(_SIZES):
        raise AssertionError(f"the check got {describe(raw)}")
    for info, (n_in, n_out, rank) in zip(raw, _SIZES, strict=True):
        what = f"LowRankLinear({n_in}, {n_out}, {rank})"
        info = _expect_module(info, what)
        expected = {"U": (n_in, rank), "V": (rank, n_out), "bias": (n_out,)}
        if info["params"] != expected:
            raise AssertionError(f"{what}: parameter shapes {info['params']}, expected {expected}")
        count = n_in * rank + rank * n_out + n_out
        if info["count"] != count:
            raise AssertionError(f"{what}: {info['count']} parameters, expected {count}")


def _factors(seed, n_in, n_out, rank, batch):
    """Random U, V, bias (float32) and an input x for one layer size."""
    rng = np.random.default_rng(seed)
    values = {"U": rng.standard_normal((n_in, rank)), "V": rng.standard_normal((rank, n_out)),
              "bias": rng.standard_normal(n_out)}
    x = rng.standard_normal((batch, n_in))
    return {k: v.astype(np.float32) for k, v in values.items()}, x.astype(np.float32)


def _with_factors(LowRankLinear, seed, n_in, n_out, rank, batch):
    """A layer with the seed's random values written into U, V and bias; and the input."""
    layer = LowRankLinear(n_in, n_out, rank, rng=1)
    values, x = _factors(seed, n_in, n_out, rank, batch)
    for name, value in values.items():
        getattr(layer, name).data = value.copy()
    return layer, x


def _forward_probe(LowRankLinear, seed):
    import mlsys_lab as ml

    out = []
    for i, size in enumerate(_SIZES):
        layer, x = _with_factors(LowRankLinear, seed + i, *size, batch=5)
        out.append(array_of(layer(ml.tensor(x))))
    return out


def _forward_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != len(_SIZES):
        raise AssertionError(f"the check got {describe(raw)}")
    for i, (y, (n_in, n_out, rank)) in enumerate(zip(raw, _SIZES, strict=True)):
        values, x = _factors(seed + i, n_in, n_out, rank, 5)
        U, V, b = (values[k].astype(np.float64) for k in ("U", "V", "bias"))
        expected = (x @ U) @ V + b
        what = f"LowRankLinear({n_in}, {n_out}, {rank}) on x{x.shape}"
        if not isinstance(y, np.ndarray) or y.shape != expected.shape:
            raise AssertionError(f"{what} returned {describe(y)}, expected a {expected.shape} "
                                 f"Tensor")
        if not np.allclose(y, expected, rtol=1e-4, atol=1e-5):
            raise AssertionError(
                f"{what}: the output differs from (x @ U) @ V + bias, with random values written "
                f"into U, V and bias (compute it from the Parameters in forward)"
            )


def _factor_arrays(layer):
    return {k: np.array(getattr(layer, k).numpy(), copy=True) for k in ("U", "V")}


def _init_probe(LowRankLinear):
    return [_factor_arrays(LowRankLinear(8, 6, 2, rng=r)) for r in (3, 3, 4)]


def _init_judge(raw):
    if not isinstance(raw, list) or len(raw) != 3 or not all(isinstance(d, dict) for d in raw):
        raise AssertionError(f"the check got {describe(raw)}")
    (a, b, c) = ({k: expect_array(d.get(k), s, f"{k} of LowRankLinear(8, 6, 2)")
                  for k, s in (("U", (8, 2)), ("V", (2, 6)))} for d in raw)
    if not np.any(a["U"]) and not np.any(a["V"]):
        raise AssertionError(
            "U and V both start at zero: then dL/dU = xᵀ(dY Vᵀ) = 0 and dL/dV = (xU)ᵀ dY = 0, so "
            "gradient descent can never move them; draw at least one factor from rng (both, or "
            "as LoRA does, U random and V zero: V's gradient (xU)ᵀ dY is non-zero)"
        )
    if not (np.array_equal(a["U"], b["U"]) and np.array_equal(a["V"], b["V"])):
        raise AssertionError(
            "two layers built with rng=3 have different weights; draw the initial values from "
            "the rng argument (rng = np.random.default_rng(rng))"
        )
    if np.array_equal(a["U"], c["U"]) and np.array_equal(a["V"], c["V"]):
        raise AssertionError("rng=3 and rng=4 give the same weights; draw them from the rng "
                             "argument")


def _grads_probe(LowRankLinear, seed):
    import mlsys_lab as ml

    layer, x = _with_factors(LowRankLinear, seed, 5, 7, 3, batch=4)
    target = np.random.default_rng(seed + 1).standard_normal((4, 7)).astype(np.float32)
    d = layer(ml.tensor(x)) - ml.tensor(target)
    (d * d).sum().backward()
    return {name: array_of(p.grad) for name, p in layer.named_parameters()}


def _grads_judge(raw, seed):
    values, x = _factors(seed, 5, 7, 3, 4)
    target = np.random.default_rng(seed + 1).standard_normal((4, 7)).astype(np.float32)
    U, V, b = (values[k].astype(np.float64) for k in ("U", "V", "bias"))
    dY = 2 * ((x @ U) @ V + b - target)
    expected = {"U": x.T @ (dY @ V.T), "V": (x @ U).T @ dY, "bias": dY.sum(axis=0)}
    if not isinstance(raw, dict) or set(raw) != set(expected):
        raise AssertionError(f"the layer's parameters are {describe(raw)}; expected U, V, bias")
    for name, want in expected.items():
        if raw[name] is None:
            raise AssertionError(
                f"after backward, {name}.grad is None; gradients do not reach {name} (build the "
                f"output from ml ops on the Parameters)"
            )
        got = expect_array(raw[name], want.shape, f"{name}.grad")
        if not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise AssertionError(f"{name}.grad differs from the gradient of sum((y - t)^2)")


_CHEAP = (12, 10, 2, 3)  # in, out, rank, batch: the full matrix (120) is the largest thing


def _cheap_probe(LowRankLinear):
    import mlsys_lab as ml

    n_in, n_out, rank, batch = _CHEAP
    graph = ml.trace(LowRankLinear(n_in, n_out, rank), np.zeros((batch, n_in), np.float32))
    return [(node.op, [tuple(v.shape) for v in node.outputs]) for node in graph.nodes]


def _cheap_judge(raw):
    n_in, n_out, rank, _ = _CHEAP
    if not isinstance(raw, list):
        raise AssertionError(f"the check got {describe(raw)}")
    for op, shapes in raw:
        for shape in shapes:
            if int(np.prod(shape)) >= n_in * n_out:
                raise AssertionError(
                    f"forward builds a {shape} array ({op}) as large as the full {n_in}x{n_out} "
                    f"matrix; compute (x @ U) @ V so a batch costs (in + out) * rank multiplies "
                    f"per row, not in * out"
                )
    matmuls = sum(op == "matmul" for op, _ in raw)
    if matmuls != 2:
        raise AssertionError(f"the traced forward has {matmuls} matmuls, expected 2: "
                             f"(x @ U) @ V")


_BAD_RANK_CALLS = ((8, 6, 7), (8, 6, 0))


def _bad_rank_probe(LowRankLinear):
    return [attempt(LowRankLinear, *args) for args in _BAD_RANK_CALLS]


def _bad_rank_judge(raw):
    expect_each_raised("LowRankLinear", _BAD_RANK_CALLS, raw, "ValueError",
                       "the rank must lie in 1..min(in_features, out_features)")


register(
    Exercise(
        id="3.1",
        title="A custom layer: LowRankLinear",
        target="LowRankLinear",
        task="a low-rank linear layer",
        forbidden=("mlsys_lab.nn.layers:Linear",),
        cases=(
            Case("parameters U, V, bias: shapes and count", 1,
                 probe=_params_probe, judge=_params_judge),
            Case("forward equals (x @ U) @ V + bias", 1, probe=_forward_probe,
                 judge=_forward_judge),
            Case("seeded initialisation that can train", 0.5, probe=_init_probe,
                 judge=_init_judge),
            Case("gradients reach U, V and bias", 1, probe=_grads_probe, judge=_grads_judge),
            Case("never forms the full in x out matrix", 1, probe=_cheap_probe,
                 judge=_cheap_judge),
            Case("a bad rank raises ValueError", 0.5, probe=_bad_rank_probe,
                 judge=_bad_rank_judge),
        ),
    ),
)
