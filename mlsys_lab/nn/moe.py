"""Mixture of experts: a gate routes each token to ``k`` of ``E`` expert MLPs (GShard, Switch).

``out, aux = MoE(d_model, d_hidden, num_experts, k=2)(x)``. The layer:

* **gate** — ``probs = softmax(x @ W_gate)`` (a ``Linear(d_model, E, bias=False)``); each
  token's ``k`` experts are its ``k`` largest probabilities (ties: the lower expert index).
* **capacity** — each expert takes at most ``capacity = ceil(C * k * T / E)`` tokens of a group
  of ``T`` tokens (``C``: ``capacity_factor``). Tokens claim slots in GShard's order: every
  token's *first* choice, in token order, before any token's second choice, and so on. A choice
  that finds its expert full is **dropped**: it contributes zero to the output (the caller's
  residual connection carries the token on, as in GShard and Switch).
* **weights** — the combine weight of a choice is its gate probability renormalised over the
  token's ``k`` chosen experts, ``p_j / sum_i p_i`` (GShard's top-2), computed before any drop;
  with ``k = 1`` it is the raw softmax probability (Switch: renormalising would give 1 and no
  gradient to the gate). ``normalize=`` overrides the choice.
* **output** — ``out[t] = sum_j weight[t, j] * expert_{e_j(t)}(x[t])`` over the kept choices.
* **auxiliary loss** — Switch's load-balancing loss ``E * sum_i f_i * P_i``: ``f_i`` the fraction
  of the group's tokens whose *first* choice is expert ``i`` (before capacity; a count, so no
  gradient), ``P_i`` the mean gate probability of expert ``i`` (differentiable). It is 1 for a
  perfectly uniform router; scale it by a coefficient (Switch: 0.01) when adding it to the loss.
* **groups** — ``groups=G`` splits the ``T`` tokens into ``G`` equal consecutive groups, each
  routed on its own with its own capacity (GShard's local groups: one group per device under
  expert parallelism, :mod:`mlsys_lab.distributed.parallel.expert`). The auxiliary loss is the
  mean of the groups' losses. ``groups=1`` (the default) routes the whole batch together.

Everything is ordinary ``ml.ops`` on the tape, so the gate and every expert that received a
token get gradients. :attr:`MoE.routing` holds the last call's :class:`Routing` (which token
went to which expert and slot, which choices were dropped) for tests and the chapter;
:func:`route_top_k` is the routing rule alone, on numpy probabilities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import ops
from ..engine.tensor import Tensor, as_tensor
from ..errors import ArgumentError, ShapeError
from .layers import Linear, ReLU, Sequential, check_sizes
from .module import Module

__all__ = ["MoE", "Routing", "capacity", "route_top_k"]


@dataclass
class Routing:
    """Where one call of :class:`MoE` sent its tokens.

    Attributes:
        expert: ``(T, k)`` int64, the expert of each token's ``j``-th choice.
        slot: ``(T, k)`` int64, its position in that expert's buffer of its group (``-1``:
            dropped, the expert was full).
        weight: ``(T, k)`` the combine weights (numpy copy; dropped choices keep theirs).
        probs: ``(T, E)`` the gate probabilities (numpy copy).
        capacity: slots per expert per group. groups: the number of groups.
    """

    expert: np.ndarray
    slot: np.ndarray
    weight: np.ndarray
    probs: np.ndarray
    capacity: int
    groups: int

    @property
    def kept(self):
        """``(T, k)`` bool: the choices that got a slot."""
        return self.slot >= 0

    @property
    def dropped(self):
        """``(T, k)`` bool: the choices past capacity."""
        return self.slot < 0

    @property
    def num_experts(self):
        return self.probs.shape[1]

    def tokens_per_expert(self):
        """``(E,)`` how many (token, choice) pairs each expert processes (all groups)."""
        return np.bincount(self.expert[self.kept], minlength=self.num_experts)

    def expert_tokens(self, e):
        """The token indices expert ``e`` processes, in buffer order (group, then slot)."""
        t, j = np.nonzero((self.expert == e) & self.kept)
        group = t // (len(self.expert) // self.groups)
        order = np.lexsort((self.slot[t, j], group))
        return t[order], j[order]


def capacity(tokens, num_experts, k, capacity_factor):
    """Slots per expert for a group of ``tokens``: ``ceil(C * k * tokens / E)``."""
    return int(math.ceil(capacity_factor * k * tokens / num_experts - 1e-9))


def route_top_k(probs, k, cap):
    """GShard's top-k routing with capacity on a ``(T, E)`` array of gate probabilities.

    Each token's ``k`` largest probabilities pick its experts (ties: lower index). Choice level
    ``j = 0`` claims slots first, in token order, then level 1, ...; a choice whose expert
    already holds ``cap`` tokens is dropped.

    Returns:
        ``(expert, slot)``: ``(T, k)`` int64 arrays; ``slot`` is ``-1`` where dropped.
    """
    probs = np.asarray(probs)
    if probs.ndim != 2:
        raise ShapeError(f"route_top_k: probs must be (tokens, experts), got shape "
                         f"{probs.shape}")
    t, e = probs.shape
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= e):
        raise ArgumentError(f"route_top_k: k={k!r} must be an int in 1..{e} (experts)")
    expert = np.argsort(-probs, axis=1, kind="stable")[:, :k].astype(np.int64)
    slot = np.full((t, k), -1, np.int64)
    filled = np.zeros(e, np.int64)
    for j in range(k):
        onehot = np.zeros((t, e), np.int64)
        onehot[np.arange(t), expert[:, j]] = 1
        position = filled[expert[:, j]] + np.cumsum(onehot, axis=0)[np.arange(t),
                                                                     expert[:, j]] - 1
        keep = position < cap
        slot[keep, j] = position[keep]
        filled = np.minimum(filled + onehot.sum(axis=0), cap)
    return expert, slot


def expert_mlp(d_model, d_hidden, rng=None):
    """One expert: ``Linear(d_model, d_hidden) -> ReLU -> Linear(d_hidden, d_model)``."""
    return Sequential(Linear(d_model, d_hidden, rng=rng), ReLU(), Linear(d_hidden, d_model,
                                                                         rng=rng))


class MoE(Module):
    """A mixture-of-experts layer (module docstring: routing, capacity, weights, aux loss).

    Args:
        d_model: token features. d_hidden: each expert's hidden width.
        num_experts: ``E``. k: experts per token (1: Switch, 2: GShard).
        capacity_factor: ``C`` in ``capacity = ceil(C * k * T / E)`` (per group).
        groups: route the tokens in this many equal consecutive groups.
        normalize: renormalise the weights over the chosen ``k`` (default: ``k > 1``).
        rng: seed or Generator of the initial weights. dtype: of the parameters.

    Call: ``out, aux = moe(x)`` with ``x`` of shape ``(..., d_model)``; ``out`` has ``x``'s
    shape, ``aux`` is the scalar load-balancing loss. ``moe.routing`` is the last
    :class:`Routing`; ``moe.experts`` lists the experts (registered as ``expert0``, ...).
    """

    def __init__(self, d_model, d_hidden, num_experts, k=1, capacity_factor=1.0, groups=1,
                 normalize=None, rng=None, dtype="float32"):
        super().__init__()
        check_sizes("MoE", positive=True, d_model=d_model, d_hidden=d_hidden,
                    num_experts=num_experts, k=k, groups=groups)
        if k > num_experts:
            raise ArgumentError(f"MoE: k={k} exceeds num_experts={num_experts}")
        if not (isinstance(capacity_factor, (int, float)) and capacity_factor > 0):
            raise ArgumentError(f"MoE: capacity_factor must be a number > 0, got "
                                f"{capacity_factor!r}")
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.d_model, self.d_hidden, self.num_experts, self.k = d_model, d_hidden, num_experts, k
        self.capacity_factor, self.groups = float(capacity_factor), groups
        self.normalize = k > 1 if normalize is None else bool(normalize)
        self.gate = Linear(d_model, num_experts, bias=False, rng=rng)
        for i in range(num_experts):
            setattr(self, f"expert{i}", expert_mlp(d_model, d_hidden, rng))
        for p in self.parameters():
            p.data = p.data.astype(dtype)
        self.routing = None

    @property
    def experts(self):
        return [getattr(self, f"expert{i}") for i in range(self.num_experts)]

    def extra_repr(self):
        return (f"{self.d_model}, {self.d_hidden}, experts={self.num_experts}, k={self.k}, "
                f"capacity_factor={self.capacity_factor}, groups={self.groups}")

    # -- the pieces (expert parallelism reuses them) --------------------------------------------
    def route(self, x2, groups=None):
        """Gate and route ``(T, d_model)`` tokens.

        Returns:
            ``(probs, weights, routing)``: the ``(T, E)`` gate probabilities and ``(T, k)``
            combine weights as Tensors on the tape, and the :class:`Routing`.
        """
        groups = self.groups if groups is None else groups
        t = x2.shape[0]
        if t % groups:
            raise ShapeError(f"MoE: {t} tokens do not split into groups={groups} equal groups")
        probs = ops.softmax(self.gate(x2), axis=-1)
        p = probs.numpy()
        size = t // groups
        cap = capacity(size, self.num_experts, self.k, self.capacity_factor)
        expert = np.zeros((t, self.k), np.int64)
        slot = np.zeros((t, self.k), np.int64)
        for g in range(groups):
            rows = slice(g * size, (g + 1) * size)
            expert[rows], slot[rows] = route_top_k(p[rows], self.k, cap)
        chosen = probs[np.arange(t)[:, None], expert]
        weights = chosen / ops.sum(chosen, axis=1, keepdims=True) if self.normalize else chosen
        routing = Routing(expert, slot, weights.numpy().copy(), p.copy(), cap, groups)
        return probs, weights, routing

    def aux_loss(self, probs, routing):
        """Switch's load-balancing loss, the mean over groups of ``E * sum_i f_i * P_i``."""
        t, e = probs.shape
        g = routing.groups
        first = routing.expert[:, 0].reshape(g, t // g)
        f = np.stack([np.bincount(row, minlength=e) for row in first]) / (t // g)
        mean_p = ops.mean(ops.reshape(probs, (g, t // g, e)), axis=1)
        return ops.sum(mean_p * as_tensor(f.astype(probs.dtype))) * (e / g)

    @staticmethod
    def combine(outputs, weights, routing):
        """``out[t] = sum_j weights[t, j] * y`` where ``y`` is the row of ``outputs[e_j(t)]``
        (each expert's outputs in :meth:`Routing.expert_tokens` order) that token ``t``'s
        ``j``-th choice produced; dropped choices add zero."""
        t, k = routing.expert.shape
        d = next(o.shape[1] for o in outputs if o is not None)
        rows, offset = [], 0
        position = np.full((t, k), -1, np.int64)
        for e, out in enumerate(outputs):
            if out is None or out.shape[0] == 0:
                continue
            tok, j = routing.expert_tokens(e)
            position[tok, j] = offset + np.arange(len(tok))
            rows.append(out)
            offset += len(tok)
        rows.append(as_tensor(np.zeros((1, d), weights.dtype)))
        table = ops.concatenate(rows, axis=0) if len(rows) > 1 else rows[0]
        position[position < 0] = offset  # the zero row
        total = None
        for j in range(k):
            term = ops.take(table, position[:, j], axis=0) * weights[:, j:j + 1]
            total = term if total is None else total + term
        return total

    def forward(self, x):
        x = x if isinstance(x, Tensor) else as_tensor(x, op="MoE")
        if x.ndim < 1 or x.shape[-1] != self.d_model:
            raise ShapeError(f"MoE(d_model={self.d_model}): input has shape {tuple(x.shape)}; "
                             f"the last axis must hold the {self.d_model} features")
        shape = tuple(x.shape)
        x2 = ops.reshape(x, (-1, self.d_model)) if x.ndim != 2 else x
        probs, weights, routing = self.route(x2)
        outputs = []
        for e, expert in enumerate(self.experts):
            tok, _ = routing.expert_tokens(e)
            outputs.append(expert(ops.take(x2, tok, axis=0)) if len(tok) else None)
        if all(o is None for o in outputs):
            out = x2 * 0.0
        else:
            out = self.combine(outputs, weights, routing)
        self.routing = routing
        out = ops.reshape(out, shape) if len(shape) != 2 else out
        return out, self.aux_loss(probs, routing)
