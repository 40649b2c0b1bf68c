"""A toy weight obfuscation (book ch. 10, model security): scramble a model's weights so that the
stored file no longer shows the trained matrices, with the inverse map folded into the next op,
so the outputs do not change.

For hidden units between ``h = relu(x W1 + b1)`` and ``y = h W2 + b2``, take a secret
permutation ``P`` and positive scales ``d`` (powers of two, so scaling is exact in floating
point). Since ``relu(d · z) = d · relu(z)`` for ``d > 0``,

    W1' = W1 P D,   b1' = b1 P D,   W2' = D⁻¹ Pᵀ W2

compute the same function: layer 1 produces its units permuted and scaled, and layer 2's rows
undo exactly that. Every weight moves and changes magnitude; only the key recovers them. The
outputs agree to floating-point rounding (layer 2 sums its products in another order), not bit
for bit. A toy: anyone with the obfuscated model can still run it, and the permutation can be
guessed by matching units — it only shows how a transformation can be folded into the ops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError
from ..nn.layers import Linear, ReLU, Sequential
from ..nn.module import Parameter


@dataclass
class ObfuscationKey:
    """The secret: for each scrambled hidden layer (index of its Linear in the Sequential),
    the permutation of its units and the exponent of each unit's power-of-two scale."""

    layers: dict  # linear index -> (permutation, exponents)


def _linear_pairs(model):
    """Indices ``(i, j)`` of Linear layers with only ReLUs between them."""
    layers = list(model)
    pairs = []
    for i, layer in enumerate(layers):
        if not isinstance(layer, Linear):
            continue
        j = i + 1
        while j < len(layers) and isinstance(layers[j], ReLU):
            j += 1
        if j < len(layers) and isinstance(layers[j], Linear):
            pairs.append((i, j))
    return pairs


def _copy_linear(layer, weight, bias):
    new = Linear(weight.shape[0], weight.shape[1], bias=bias is not None)
    new.weight = Parameter(np.ascontiguousarray(weight))
    if bias is not None:
        new.bias = Parameter(np.ascontiguousarray(bias))
    return new


def obfuscate(model, seed=0, max_exponent=4):
    """Scramble the hidden units of an MLP (a ``Sequential`` of ``Linear`` and ``ReLU``).

    Args:
        model: the model (unchanged).
        seed: seed of the secret permutations and scales.
        max_exponent: scales are ``2**e`` with ``e`` drawn from ``[-max_exponent, max_exponent]``.

    Returns:
        ``(obfuscated Sequential, ObfuscationKey)``.
    """
    if not isinstance(model, Sequential):
        raise ArgumentError(f"obfuscate: expects an nn.Sequential, got {type(model).__name__}")
    pairs = _linear_pairs(model)
    if not pairs:
        raise ArgumentError("obfuscate: no two Linear layers with only ReLUs between them")
    rng = np.random.default_rng(seed)
    layers = list(model)
    weights = {i: (l.weight.numpy().copy(), None if l.bias is None else l.bias.numpy().copy())
               for i, l in enumerate(layers) if isinstance(l, Linear)}
    key = {}
    for i, j in pairs:
        w1, b1 = weights[i]
        w2, b2 = weights[j]
        n = w1.shape[1]
        perm = rng.permutation(n)
        exps = rng.integers(-max_exponent, max_exponent + 1, n)
        d = np.ldexp(np.ones(n, w1.dtype), exps)
        weights[i] = (w1[:, perm] * d, None if b1 is None else b1[perm] * d)
        weights[j] = (w2[perm] / d[:, None], b2)
        key[i] = (perm, exps)
    new = [_copy_linear(l, *weights[i]) if isinstance(l, Linear) else l
           for i, l in enumerate(layers)]
    return Sequential(*new), ObfuscationKey(key)


def deobfuscate(model, key):
    """Undo :func:`obfuscate` with its ``key``: the original weights, bit for bit."""
    layers = list(model)
    weights = {i: (l.weight.numpy().copy(), None if l.bias is None else l.bias.numpy().copy())
               for i, l in enumerate(layers) if isinstance(l, Linear)}
    for i, j in reversed(_linear_pairs(model)):
        if i not in key.layers:
            continue
        perm, exps = key.layers[i]
        inv = np.argsort(perm)
        w1, b1 = weights[i]
        w2, b2 = weights[j]
        d = np.ldexp(np.ones(len(perm), w1.dtype), exps)
        weights[i] = ((w1 / d)[:, inv], None if b1 is None else (b1 / d)[inv])
        weights[j] = ((w2 * d[:, None])[inv], b2)
    return Sequential(*[_copy_linear(l, *weights[i]) if isinstance(l, Linear) else l
                        for i, l in enumerate(layers)])


__all__ = ["ObfuscationKey", "obfuscate", "deobfuscate"]
