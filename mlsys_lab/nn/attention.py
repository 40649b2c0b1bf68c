"""Attention layers on ``ml.ops.scaled_dot_product_attention`` (chapter 18).

* :class:`MultiheadAttention` — PyTorch's ``nn.MultiheadAttention``: projections of query,
  key and value, ``num_heads`` heads of ``embed_dim / num_heads`` features, the attention op,
  an output projection. Its masks follow PyTorch's *module* convention (a bool ``True`` means
  "may not attend", the opposite of the op's), so code and masks port across unchanged.
* :class:`CausalSelfAttention` — the decoder's self-attention (nanoGPT's layer): one fused
  ``qkv`` projection, causal attention, an output projection; :meth:`CausalSelfAttention.step`
  takes the keys and values of earlier positions (a KV cache) and returns the grown ones.
* :func:`causal_attention` — causal attention of the last ``L`` positions of a sequence of
  ``S`` (bottom-right aligned when a cache holds ``S - L`` earlier positions).

The layers' weights are :class:`~mlsys_lab.nn.Linear` layers, ``(in, out)`` as everywhere in
the library (PyTorch stores ``(out, in)``): ``q_proj.weight`` is ``in_proj_weight[:E].T``.
"""

import math

import numpy as np

from .. import ops
from ..engine.ops_attention import attention_weights, causal_mask
from ..engine.ops_nn import check_dropout_p
from ..engine.tensor import Tensor, as_tensor
from ..errors import DTypeError, ShapeError
from .layers import Linear, check_sizes
from .module import Module


def split_heads(x, heads):
    """``(N, T, heads * D)`` -> ``(N, heads, T, D)``."""
    n, t, e = x.shape
    return ops.transpose(ops.reshape(x, (n, t, heads, e // heads)), (0, 2, 1, 3))


def merge_heads(x):
    """``(N, heads, T, D)`` -> ``(N, T, heads * D)``."""
    n, h, t, d = x.shape
    return ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (n, t, h * d))


def causal_attention(q, k, v, dropout_p=0.0):
    """Causal attention of ``L`` queries that are the *last* ``L`` of ``S`` positions.

    With ``L == S`` it is ``scaled_dot_product_attention(..., is_causal=True)``. With a KV
    cache (``S > L``: the keys and values of ``S - L`` earlier positions come first) query
    ``i`` sees keys ``j <= S - L + i`` (bottom-right aligned), so one new token sees them all.
    """
    L, S = q.shape[-2], k.shape[-2]
    if L == S:
        return ops.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    if L > S:
        raise ShapeError(f"causal_attention: {L} queries but only {S} keys (the queries must "
                         f"be the last of the key positions)")
    if L == 1:  # one new position: every key is in its past
        return ops.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    allowed = np.tril(np.ones((L, S), bool), S - L)
    return ops.scaled_dot_product_attention(q, k, v, allowed, dropout_p=dropout_p)


def _concrete(name, m, layer):
    """A mask as a numpy array (masks are data, not traced values, in these layers)."""
    if isinstance(m, Tensor):
        if m.is_tracer:
            raise DTypeError(f"{layer}: {name} must be a concrete array, not a traced value")
        m = m.numpy()
    m = np.asarray(m)
    if m.dtype != bool and m.dtype.kind != "f":
        raise DTypeError(f"{layer}: {name} must be bool or floating, got {m.dtype}")
    return m


class MultiheadAttention(Module):
    """Multi-head attention as ``torch.nn.MultiheadAttention``, on the attention op.

    Args:
        embed_dim: model width E (the query's features and the output's).
        num_heads: heads; must divide ``embed_dim``.
        dropout: dropout on the attention weights, in training mode only.
        bias: biases on the four projections.
        kdim, vdim: the key's and value's features (default ``embed_dim``).
        batch_first: inputs are ``(N, L, E)``; False: ``(L, N, E)``, PyTorch's default.
            (The default here is True: the library's layers are batch first.)
        rng: seed or Generator for the projections' weights.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None,
                 batch_first=True, rng=None):
        super().__init__()
        check_sizes("MultiheadAttention", positive=True, embed_dim=embed_dim,
                    num_heads=num_heads)
        if embed_dim % num_heads:
            raise ShapeError(f"MultiheadAttention: embed_dim {embed_dim} must be divisible by "
                             f"num_heads {num_heads}")
        kdim = embed_dim if kdim is None else kdim
        vdim = embed_dim if vdim is None else vdim
        check_sizes("MultiheadAttention", positive=True, kdim=kdim, vdim=vdim)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.kdim, self.vdim = kdim, vdim
        self.dropout = check_dropout_p(dropout, "MultiheadAttention")
        self.batch_first = bool(batch_first)
        r = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.q_proj = Linear(embed_dim, embed_dim, bias, rng=r)
        self.k_proj = Linear(kdim, embed_dim, bias, rng=r)
        self.v_proj = Linear(vdim, embed_dim, bias, rng=r)
        self.out_proj = Linear(embed_dim, embed_dim, bias, rng=r)

    def _mask(self, key_padding_mask, attn_mask, is_causal, n, L, S, dtype):
        """The op's mask from PyTorch's module masks: ``(bool_allowed_or_additive, causal)``."""
        layer = "MultiheadAttention"
        parts = []  # (array, is_bool) in the op's shape (n or 1, heads or 1, L, S)
        if key_padding_mask is not None:
            m = _concrete("key_padding_mask", key_padding_mask, layer)
            if m.shape != (n, S):
                raise ShapeError(f"{layer}: key_padding_mask must be (batch, S) = {(n, S)}, got "
                                 f"{m.shape}")
            parts.append(m[:, None, None, :])
        if attn_mask is not None:
            m = _concrete("attn_mask", attn_mask, layer)
            if m.shape == (L, S):
                parts.append(m)
            elif m.shape == (n * self.num_heads, L, S):
                parts.append(m.reshape(n, self.num_heads, L, S))
            else:
                raise ShapeError(f"{layer}: attn_mask must be (L, S) = {(L, S)} or (batch * "
                                 f"num_heads, L, S) = {(n * self.num_heads, L, S)}, got "
                                 f"{m.shape}")
        if not parts:
            return None, is_causal
        if is_causal:
            parts.append(~causal_mask(L, S))
        if all(p.dtype == bool for p in parts):
            blocked = parts[0]
            for p in parts[1:]:
                blocked = blocked | p
            return ~blocked, False
        total = np.zeros((1, 1, L, S), dtype)
        for p in parts:
            total = total + (np.where(p, -np.inf, 0.0) if p.dtype == bool else p).astype(dtype)
        return total, False

    def forward(self, query, key=None, value=None, key_padding_mask=None, need_weights=False,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        """Attend from ``query`` to ``key``/``value`` (self-attention when they are omitted).

        Args:
            query: ``(N, L, E)`` (``(L, N, E)`` unless ``batch_first``), or ``(L, E)``.
            key, value: ``(N, S, kdim)``, ``(N, S, vdim)``; default: ``query``.
            key_padding_mask: ``(N, S)``; bool True = that key is padding (ignored), or a
                float added to the scores.
            need_weights: also return the attention weights (computed explicitly).
            attn_mask: ``(L, S)`` or ``(N * num_heads, L, S)``; bool True = may *not*
                attend (PyTorch's module convention), or a float added to the scores.
            average_attn_weights: average the returned weights over the heads.
            is_causal: mask future positions (query ``i`` sees keys ``j <= i``). Unlike
                PyTorch, where it is only a hint that ``attn_mask`` is causal, it applies the
                causal mask itself (and combines with the other masks).

        Returns:
            ``(output, weights)``: ``output`` shaped like ``query`` with ``embed_dim``
            features; ``weights`` ``(N, L, S)`` (averaged) or ``(N, num_heads, L, S)``, or None
            unless ``need_weights``. A query that may attend to no key gets zeros.
        """
        key = query if key is None else key
        value = key if value is None else value
        query, key, value = (x if isinstance(x, Tensor) else as_tensor(x, op="MultiheadAttention")
                             for x in (query, key, value))
        unbatched = query.ndim == 2
        if unbatched:
            query, key, value = (ops.reshape(x, (1,) + tuple(x.shape)) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = np.asarray(_concrete("key_padding_mask", key_padding_mask,
                                                        "MultiheadAttention"))[None]
        elif not self.batch_first:
            query, key, value = (ops.transpose(x, (1, 0, 2)) for x in (query, key, value))
        for name, x, want in (("query", query, self.embed_dim), ("key", key, self.kdim),
                              ("value", value, self.vdim)):
            if x.ndim != 3 or x.shape[-1] != want:
                raise ShapeError(f"MultiheadAttention: {name} must have {want} features in "
                                 f"(batch, length, features), got {tuple(x.shape)}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ShapeError(f"MultiheadAttention: batch and length must agree: query "
                             f"{tuple(query.shape)}, key {tuple(key.shape)}, value "
                             f"{tuple(value.shape)}")
        n, L, S = query.shape[0], query.shape[1], key.shape[1]
        h = self.num_heads
        q = split_heads(self.q_proj(query), h)
        k = split_heads(self.k_proj(key), h)
        v = split_heads(self.v_proj(value), h)
        mask, causal = self._mask(key_padding_mask, attn_mask, bool(is_causal), n, L, S,
                                  q.dtype)
        p = self.dropout if self.training else 0.0
        weights = None
        if mask is not None:
            mask = as_tensor(mask, op="MultiheadAttention")
        if need_weights:
            w = attention_weights(q, k, mask, is_causal=causal,
                                  scale=1.0 / math.sqrt(self.head_dim))
            y = ops.matmul(ops.dropout(w, p) if p else w, v)
            weights = ops.mean(w, axis=1) if average_attn_weights else w
        else:
            args = () if mask is None else (mask,)
            y = ops.scaled_dot_product_attention(q, k, v, *args, is_causal=causal, dropout_p=p)
        out = self.out_proj(merge_heads(y))
        if unbatched:
            out = ops.reshape(out, tuple(out.shape[1:]))
            weights = None if weights is None else ops.reshape(weights, tuple(weights.shape[1:]))
        elif not self.batch_first:
            out = ops.transpose(out, (1, 0, 2))
        return out, weights

    def extra_repr(self):
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
                f"dropout={self.dropout}, batch_first={self.batch_first}")


class CausalSelfAttention(Module):
    """A decoder's masked self-attention (nanoGPT's ``CausalSelfAttention``).

    ``qkv`` projects ``(B, T, E)`` to queries, keys and values at once, ``num_heads`` heads
    attend causally (``is_causal=True`` on the op), ``proj`` maps the heads back to ``E``.

    Args:
        embed_dim: model width E; num_heads must divide it.
        num_heads: heads.
        dropout: dropout on the attention weights (training only).
        bias: biases on the projections.
        rng: seed or Generator for the weights.
    """

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, rng=None):
        super().__init__()
        check_sizes("CausalSelfAttention", positive=True, embed_dim=embed_dim,
                    num_heads=num_heads)
        if embed_dim % num_heads:
            raise ShapeError(f"CausalSelfAttention: embed_dim {embed_dim} must be divisible by "
                             f"num_heads {num_heads}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.dropout = check_dropout_p(dropout, "CausalSelfAttention")
        r = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.qkv = Linear(embed_dim, 3 * embed_dim, bias, rng=r)
        self.proj = Linear(embed_dim, embed_dim, bias, rng=r)

    def project(self, x):
        """``(B, T, E)`` -> queries, keys, values, each ``(B, heads, T, E / heads)``."""
        x = x if isinstance(x, Tensor) else as_tensor(x, op="CausalSelfAttention")
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ShapeError(f"CausalSelfAttention: input must be (batch, length, "
                             f"{self.embed_dim}), got {tuple(x.shape)}")
        b, t, e = x.shape
        qkv = self.qkv(x)
        return tuple(split_heads(ops.getitem(qkv, (slice(None), slice(None),
                                                   slice(i * e, (i + 1) * e))), self.num_heads)
                     for i in range(3))

    def forward(self, x):
        """``(B, T, E)`` -> ``(B, T, E)``: position ``t`` attends to positions ``<= t``."""
        q, k, v = self.project(x)
        p = self.dropout if self.training else 0.0
        y = ops.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.proj(merge_heads(y))

    def step(self, x, past_k=None, past_v=None):
        """Attend from new positions ``x`` ``(B, T, E)`` to the cached ones and themselves.

        Args:
            x: the new positions.
            past_k, past_v: ``(B, heads, P, E / heads)`` keys and values of the ``P`` earlier
                positions (None: none).

        Returns:
            ``(out, k, v)``: the output for the new positions and the keys and values of all
            ``P + T`` positions (the grown cache). Equals :meth:`forward` on the whole sequence
            restricted to the new positions.
        """
        q, k, v = self.project(x)
        if past_k is not None:
            k = ops.concatenate([past_k, k], axis=2)
            v = ops.concatenate([past_v, v], axis=2)
        p = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, dropout_p=p)
        return self.proj(merge_heads(y)), k, v

    def extra_repr(self):
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


__all__ = ["MultiheadAttention", "CausalSelfAttention", "causal_attention", "split_heads",
           "merge_heads"]
