"""Scaled dot-product attention as one op (chapter 18): ``softmax(q kᵀ · scale + bias) v``.

``scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None,
dropout_p=0.0, enable_gqa=False)`` follows PyTorch's ``F.scaled_dot_product_attention``:

* shapes: ``q (..., L, E)``, ``k (..., S, E)``, ``v (..., S, Ev)``, output ``(..., L, Ev)``;
  the batch axes broadcast (numpy's rule), and with ``enable_gqa`` the head axis (-3) of ``k``
  and ``v`` may divide ``q``'s (grouped-query attention: query head ``h`` reads key/value head
  ``h // (Hq / Hkv)``, PyTorch's ``repeat_interleave``);
* ``attn_mask``: bool (True = the key takes part) or a float of the query's dtype added to the
  scores, broadcastable to ``(..., L, S)``; ``is_causal``: key ``j`` takes part in row ``i``
  when ``j <= i`` (upper-left aligned, ``torch.ones(L, S).tril()``); both at once is an error;
* ``scale`` defaults to ``1 / sqrt(E)``;
* a row in which no key takes part (fully masked, or ``S == 0``) gives zeros and a zero
  gradient: what PyTorch (>= 2.5, its ``_safe_softmax``) answers, checked against torch 2.14;
* ``dropout_p > 0`` drops attention weights with the library's generator (``ops.dropout``, so
  ``manual_seed`` makes it reproducible; masks are not PyTorch's). As in PyTorch the function
  applies it whenever ``dropout_p > 0``; the ``nn`` layers pass it in training only. That path
  is the composed form (weights, dropout, matmul), not the op: the op is a pure function.

The op record
-------------
One :func:`~.registry.defop`, ``"scaled_dot_product_attention"``: inputs ``(q, k, v)`` or
``(q, k, v, mask)``, attributes (plain Python values, what a kernel's ``accepts`` reads):

* ``is_causal``: bool;
* ``scale``: float, always a number (the default is resolved when the op is called);
* ``enable_gqa``: bool.

``compute`` is the numpy reference (:func:`attention_reference`, a stable softmax in the inputs'
dtype). The JVP is written in framework ops (matmul, softmax, where), recomputing the weights
from ``q``, ``k`` and the mask; the VJP is the gradient op below.

The gradient is an op too, ``"scaled_dot_product_attention_grad"``: inputs ``(g, q, k, v[,
mask])``, the same attributes, output the packed vector ``concat(dq.ravel(), dk.ravel(),
dv.ravel())`` (each summed back to its input's shape: broadcast batch axes, GQA groups);
:func:`unpack` takes one gradient out. The forward op's VJP is that op (a float mask that
needs a gradient takes the composed rule instead). Its own VJP and JVP are framework ops: it
is ``∇_{q,k,v} <g, A>`` for attention ``A``, so its JVP is a Hessian-vector product of
``<g, A>`` and its VJP is that product (for q, k, v, the mask) and A's JVP (for g). Gradients
of any order therefore work on every path, and a backward kernel still serves the first.

Contract with the kernels (``mlsys_lab/kernels/attention*.py``)
---------------------------------------------------------------
Tiled kernels register with ``register_impl("scaled_dot_product_attention", device, ...)``:
``out_fn(out, q, k, v[, mask], is_causal=..., scale=..., enable_gqa=...)``. A mask is there
when four arrays come (``len(avals) == 4`` in ``accepts``); its dtype says bool or additive.
A backward kernel registers on ``"scaled_dot_product_attention_grad"``:
``out_fn(out, g, q, k, v[, mask], **attrs)`` writes the packed ``(dq, dk, dv)`` into the 1-D
``out``; it has no saved forward to read, so it recomputes ``out`` and the log-sum-exp (one
tiled forward) before the FlashAttention-2 sweep.
The float64 answers to hold them to are :func:`attention_reference` with ``return_lse=True``,
which also returns the row log-sum-exp ``lse[..., i] = log Σ_j exp(s_ij)`` over the keys that
take part (``s`` the scaled, biased scores; ``-inf`` in a fully masked row), the quantity a
FlashAttention forward saves, and :func:`attention_backward_reference`, the FlashAttention-2
backward that recomputes ``P = exp(s - lse)`` from it.
"""

import math

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from . import dtypes
from .dispatch import apply
from .ops_math import eq, where
from .ops_nn import check_dropout_p, dropout, softmax
from .ops_shape import _mT, broadcast_to, concatenate, getitem, matmul, reshape
from .ops_shape import max as reduce_max
from .ops_shape import sum as reduce_sum
from .registry import AVal, defop
from .shapes import broadcast_shapes, expect_shape, unbroadcast
from .tensor import Tensor, lift

OP = "scaled_dot_product_attention"


# --- shape and dtype rule ---------------------------------------------------------------------
def _shapes(*avals):
    return ", ".join(f"{n} {tuple(a.shape)}" for n, a in zip(("q", "k", "v", "attn_mask"), avals))


def _gqa_heads(q, k, v):
    """(Hq, Hkv): the head counts of grouped-query attention, checked."""
    if min(len(q.shape), len(k.shape), len(v.shape)) < 3:
        raise ShapeError(f"{OP}: enable_gqa needs a head axis (-3) on q, k and v, got "
                         f"{_shapes(q, k, v)}")
    hq, hk, hv = q.shape[-3], k.shape[-3], v.shape[-3]
    if hk != hv or hk == 0 or hq % hk:
        raise ShapeError(f"{OP}: with enable_gqa the key and value heads must be equal and "
                         f"divide the query heads, got {_shapes(q, k, v)}")
    return hq, hk


def _expanded(shape, hq):
    """The shape of a key/value tensor after its heads are repeated to ``hq``."""
    return tuple(shape[:-3]) + (hq,) + tuple(shape[-2:])


def _infer(q, k, v, *mask, is_causal, scale, enable_gqa):
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not dtypes.is_float(a.dtype):
            raise DTypeError(f"{OP}: {name} must be floating, got {a.dtype}")
        if len(a.shape) < 2:
            raise ShapeError(f"{OP}: q, k and v need at least 2 dims (..., length, features), "
                             f"got {_shapes(q, k, v)}")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"{OP}: q, k and v must have one dtype, got {q.dtype}, {k.dtype} and "
                         f"{v.dtype}")
    if k.shape[-1] != q.shape[-1]:
        raise ShapeError(f"{OP}: q and k must have the same feature size E, got "
                         f"{_shapes(q, k, v)}")
    if k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{OP}: k and v must have the same length S, got {_shapes(q, k, v)}")
    ks, vs = tuple(k.shape), tuple(v.shape)
    if enable_gqa:
        hq, _ = _gqa_heads(q, k, v)
        ks, vs = _expanded(ks, hq), _expanded(vs, hq)
    try:
        batch = broadcast_shapes(OP, tuple(q.shape[:-2]), ks[:-2], vs[:-2])
    except ShapeError:
        raise ShapeError(f"{OP}: the batch axes of q, k and v do not broadcast, got "
                         f"{_shapes(q, k, v)}") from None
    L, S = q.shape[-2], k.shape[-2]
    if mask:
        m = mask[0]
        if is_causal:
            raise ArgumentError(f"{OP}: pass attn_mask or is_causal=True, not both (as "
                                f"PyTorch)")
        if m.dtype != dtypes.bool_ and m.dtype != q.dtype:
            raise DTypeError(f"{OP}: attn_mask must be bool or q's dtype {q.dtype}, got "
                             f"{m.dtype}")
        want = batch + (L, S)
        ok = len(m.shape) <= len(want) and all(
            d in (1, w) for d, w in zip(tuple(m.shape)[::-1], want[::-1]))
        if not ok:
            raise ShapeError(f"{OP}: attn_mask {tuple(m.shape)} does not broadcast to the "
                             f"scores' shape {want} (batch, L, S) of {_shapes(q, k, v)}")
    return AVal(batch + (L, v.shape[-1]), q.dtype)


# --- numpy reference --------------------------------------------------------------------------
def _repeat_heads(x, hq):
    return np.repeat(x, hq // x.shape[-3], axis=-3)


def causal_mask(L, S):
    """``(L, S)`` bool: key ``j`` takes part in row ``i`` when ``j <= i`` (PyTorch's
    ``is_causal``, upper-left aligned)."""
    return np.tril(np.ones((L, S), dtype=bool))


def attention_scores(q, k, mask=None, *, is_causal=False, scale=None, enable_gqa=False):
    """``scale · q kᵀ`` plus the bias (numpy): ``-inf`` where a key takes no part, the float
    mask added elsewhere."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if enable_gqa:
        k = _repeat_heads(k, q.shape[-3])
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= np.asarray(scale, s.dtype)
    if mask is not None:
        if mask.dtype != bool:
            s = s + mask
        elif np.broadcast_shapes(mask.shape, s.shape) == s.shape:
            np.copyto(s, s.dtype.type(-np.inf), where=~mask)  # s is fresh: mask in place
        else:  # a mask with more batch than q and k (v's)
            s = np.where(mask, s, -np.inf)
    if is_causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    return s.astype(q.dtype, copy=False)


def _row_softmax(s):
    """Stable softmax over the last axis, zeros in a row with no finite score; and the row
    log-sum-exp (``-inf`` there). Two passes over the scores after the max (``exp`` in place,
    one division): a dead row's ``exp`` is all zeros, so dividing it by 1 keeps it zero."""
    with np.errstate(invalid="ignore", divide="ignore"):
        if s.shape[-1] == 0:
            m = np.full(s.shape[:-1] + (1,), -np.inf, s.dtype)
        else:
            m = np.max(s, axis=-1, keepdims=True)
        shift = np.where(np.isneginf(m), s.dtype.type(0), m)  # a dead row: exp(-inf) = 0
        p = np.subtract(s, shift, dtype=s.dtype)
        np.exp(p, out=p)
        total = np.sum(p, axis=-1, keepdims=True)
        p /= np.where(total == 0, total.dtype.type(1), total)
        lse = (shift + np.log(total))[..., 0].astype(s.dtype, copy=False)
    return p, lse


def attention_reference(q, k, v, mask=None, *, is_causal=False, scale=None, enable_gqa=False,
                        return_lse=False):
    """Exact attention in numpy (the op's ``compute``), in the inputs' dtype.

    Args:
        q, k, v: ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)`` arrays.
        mask: None, bool (True = takes part) or additive float, broadcastable to (..., L, S).
        is_causal, scale, enable_gqa: as for :func:`scaled_dot_product_attention`.
        return_lse: also return the row log-sum-exp ``(..., L)`` of the biased scores
            (``-inf`` in a row where no key takes part).

    Returns:
        The output ``(..., L, Ev)``, or ``(output, lse)``.
    """
    s = attention_scores(q, k, mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    p, lse = _row_softmax(s)
    if enable_gqa:
        v = _repeat_heads(v, q.shape[-3])
    out = np.matmul(p, v).astype(q.dtype, copy=False)
    return (out, lse) if return_lse else out


def attention_backward_reference(g, q, k, v, out, lse, mask=None, *, is_causal=False,
                                 scale=None, enable_gqa=False):
    """FlashAttention-2's backward from the saved log-sum-exp, in numpy: the answers a tiled
    backward kernel must give.

    ``P = exp(s - lse)`` (0 in a fully masked row), ``dV = Pᵀ g``, ``dP = g Vᵀ``,
    ``D = rowsum(g ∘ out)``, ``dS = P ∘ (dP - D)``, ``dQ = scale · dS K``, ``dK = scale · dSᵀ Q``.
    With ``enable_gqa`` the key/value gradients are summed over each group of query heads;
    batch axes that broadcast are summed back to the inputs' shapes.

    Returns:
        ``(dq, dk, dv)`` shaped like ``q``, ``k``, ``v``.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = attention_scores(q, k, mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    with np.errstate(invalid="ignore"):
        p = np.where(np.isneginf(lse)[..., None], 0, np.exp(s - lse[..., None]))
    hq = q.shape[-3] if enable_gqa else None
    kk = _repeat_heads(k, hq) if enable_gqa else k
    vv = _repeat_heads(v, hq) if enable_gqa else v
    dv = np.matmul(np.swapaxes(p, -1, -2), g)
    dp = np.matmul(g, np.swapaxes(vv, -1, -2))
    delta = np.sum(g * out, axis=-1, keepdims=True)
    ds = p * (dp - delta)
    dq = np.matmul(ds, kk) * scale
    dk = np.matmul(np.swapaxes(ds, -1, -2), q) * scale

    def back(d, like):
        if enable_gqa:
            d = d.reshape(d.shape[:-3] + (like.shape[-3], hq // like.shape[-3]) + d.shape[-2:])
            d = d.sum(axis=-3)
        lead = d.ndim - like.ndim
        d = d.sum(axis=tuple(range(lead))) if lead else d
        axes = tuple(i for i, n in enumerate(like.shape) if n == 1 and d.shape[i] != 1)
        return (d.sum(axis=axes, keepdims=True) if axes else d).astype(like.dtype)

    return back(dq, q), back(dk, k), back(dv, v)


def _compute(q, k, v, *mask, is_causal, scale, enable_gqa):
    return attention_reference(q, k, v, mask[0] if mask else None, is_causal=is_causal,
                               scale=scale, enable_gqa=enable_gqa)


# --- the rules, in framework ops ----------------------------------------------------------------
def _expand_heads(x, hq):
    """Repeat the head axis (-3) of ``x`` to ``hq`` heads, each ``hq / H`` times in a row
    (``repeat_interleave``), in framework ops."""
    shape = tuple(x.shape)
    h = shape[-3]
    if h == hq:
        return x
    grouped = shape[:-3] + (h, 1) + shape[-2:]
    wide = shape[:-3] + (h, hq // h) + shape[-2:]
    return reshape(broadcast_to(reshape(x, grouped), wide), _expanded(shape, hq))


def _reduce_heads(d, like_shape, enable_gqa):
    """Sum a gradient of the expanded (and broadcast) tensor back to ``like_shape``."""
    if enable_gqa:
        h = like_shape[-3]
        hq = d.shape[-3]
        if h != hq:
            d = reduce_sum(reshape(d, tuple(d.shape[:-3]) + (h, hq // h) + tuple(d.shape[-2:])),
                           -3)
    return unbroadcast(d, like_shape)


def attention_weights(q, k, mask=None, *, is_causal=False, scale, enable_gqa=False):
    """``softmax(scale · q kᵀ + bias)`` in framework ops (differentiable to any order), with
    zeros (and zero gradients) in a row where no key takes part."""
    kk = _expand_heads(k, q.shape[-3]) if enable_gqa else k
    s = matmul(q, _mT(kk)) * scale
    L, S = q.shape[-2], kk.shape[-2]
    if is_causal:  # row i keeps key 0: no row is empty
        s = where(Tensor._wrap(causal_mask(L, S)), s, -np.inf)
    if mask is None:
        return softmax(s, -1)
    s = where(mask, s, -np.inf) if mask.dtype == dtypes.bool_ else s + mask
    dead = eq(reduce_max(s, -1, keepdims=True), -np.inf)  # no gradient flows through eq
    p = softmax(where(dead, 0.0, s), -1)
    return where(dead, 0.0, p)


def _split(xs):
    q, k, v, *m = xs
    return q, k, v, (m[0] if m else None)


def _zeros_like(x):
    return Tensor._wrap(np.zeros(x.shape, x.dtype))


def _add(*terms):
    """The sum of the terms that are not None (None: a zero term)."""
    terms = [t for t in terms if t is not None]
    out = terms[0] if terms else None
    for t in terms[1:]:
        out = out + t
    return out


def _mm_sum(*pairs):
    """Σ a @ b over the pairs whose ``a`` and ``b`` are not None (None if there is none). Two
    products of one shape are one GEMM: ``[a1, a2] @ [b1; b2] = a1 b1 + a2 b2``."""
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if len(pairs) == 2:
        (a1, b1), (a2, b2) = pairs
        if a1.shape[:-1] == a2.shape[:-1] and b1.shape[:-2] == b2.shape[:-2] and \
                b1.shape[-1] == b2.shape[-1]:
            return matmul(concatenate([a1, a2], len(a1.shape) - 1),
                          concatenate([b1, b2], len(b1.shape) - 2))
    return _add(*[matmul(a, b) for a, b in pairs])


def _is_float_mask(mask):
    return mask is not None and mask.dtype != dtypes.bool_


class _Parts:
    """The pieces every rule recomputes: the weights ``p`` and the (head-expanded) keys and
    values of one call."""

    def __init__(self, q, k, v, mask, is_causal, scale, enable_gqa):
        self.q, self.k, self.v, self.mask = q, k, v, mask
        self.scale, self.gqa = scale, enable_gqa
        self.hq = q.shape[-3] if enable_gqa else None
        self.p = attention_weights(q, k, mask, is_causal=is_causal, scale=scale,
                                   enable_gqa=enable_gqa)
        self.kk, self.vv = self.heads(k), self.heads(v)

    def heads(self, x):
        return None if x is None else (_expand_heads(x, self.hq) if self.gqa else x)

    def score_tangent(self, tq, tk, tm):
        """The scores' tangent ``scale (q̇ kᵀ + q k̇ᵀ) + ṁ`` (None: zero)."""
        return _add(None if tq is None else matmul(tq, _mT(self.kk)) * self.scale,
                    None if tk is None else matmul(self.q, _mT(self.heads(tk))) * self.scale,
                    tm if _is_float_mask(self.mask) else None)

    def weight_tangent(self, ts):
        """Ṗ = P ∘ (Ṡ - rowsum(P ∘ Ṡ)) for the scores' tangent ``ts``."""
        p = self.p
        return None if ts is None else p * (ts - reduce_sum(p * ts, -1, keepdims=True))

    def out_tangent(self, tq, tk, tv, tm):
        """The output's tangent: Ṗ v + P v̇."""
        dp = self.weight_tangent(self.score_tangent(tq, tk, tm))
        return _mm_sum((dp, self.vv), (self.p, self.heads(tv)))

    def back(self, d, like):
        """A gradient of the expanded, broadcast tensor summed back to ``like``'s shape."""
        return _reduce_heads(d, tuple(like.shape), self.gqa)


def _grads(parts, g, tangents=None):
    """Reverse mode of attention for the cotangent ``g``: ``(dq, dk, dv, dS)`` (dS: the
    scores' gradient, the float mask's before unbroadcasting). With ``tangents`` (ġ, q̇, k̇, v̇,
    ṁ), their directional derivative along them instead: the Hessian-vector product of
    ``<g, attention>`` (terms that are zero are None)."""
    c, p, q, kk, vv = parts.scale, parts.p, parts.q, parts.kk, parts.vv
    dp = matmul(g, _mT(vv))
    delta = reduce_sum(p * dp, -1, keepdims=True)
    ds = p * (dp - delta)
    if tangents is None:
        return (matmul(ds, kk) * c, matmul(_mT(ds), q) * c, matmul(_mT(p), g), ds)
    tg, tq, tk, tv, tm = tangents
    tkk, tvv = parts.heads(tk), parts.heads(tv)
    tp = parts.weight_tangent(parts.score_tangent(tq, tk, tm))
    tdp = _mm_sum((tg, _mT(vv)), (g, None if tvv is None else _mT(tvv)))
    tdelta = _add(None if tdp is None else p * tdp, None if tp is None else dp * tp)
    tdelta = None if tdelta is None else reduce_sum(tdelta, -1, keepdims=True)
    tds = _add(None if tp is None else tp * (dp - delta),
               None if tdp is None and tdelta is None else
               p * _add(tdp, None if tdelta is None else -tdelta))
    dq = _mm_sum((tds, kk), (ds, tkk))
    dk = _mm_sum((None if tds is None else _mT(tds), q), (None if tq is None else _mT(ds), tq))
    dv = _mm_sum((None if tp is None else _mT(tp), g), (None if tg is None else _mT(p), tg))
    return (None if dq is None else dq * c, None if dk is None else dk * c, dv, tds)


def _vjp(g, xs, y, needs, is_causal, scale, enable_gqa):
    q, k, v, mask = _split(xs)
    if k.shape[-2] == 0:  # no keys: the output is a constant zero
        return tuple(_zeros_like(x) if n else None for x, n in zip(xs, needs))
    attrs = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    cts = [None] * len(xs)
    if _is_float_mask(mask) and needs[3]:  # the mask's gradient: the composed rule
        parts = _Parts(q, k, v, mask, **attrs)
        dq, dk, dv, ds = _grads(parts, g)
        cts[:3] = [parts.back(d, x) if n else None for d, x, n in zip((dq, dk, dv), xs, needs)]
        cts[3] = unbroadcast(ds, tuple(mask.shape))
        return tuple(cts)
    if any(needs[:3]):
        flat = apply(SCALED_DOT_PRODUCT_ATTENTION_GRAD, g, q, k, v, *xs[3:], **attrs)
        cts[:3] = [unpack(flat, i, xs[:3]) if needs[i] else None for i in range(3)]
    return tuple(cts)


def _jvp(ts, xs, y, is_causal, scale, enable_gqa):
    q, k, v, mask = _split(xs)
    tq, tk, tv, tm = _split(ts)
    if k.shape[-2] == 0:
        return None
    return _Parts(q, k, v, mask, is_causal, scale, enable_gqa).out_tangent(tq, tk, tv, tm)


SCALED_DOT_PRODUCT_ATTENTION = defop(OP, compute=_compute, infer=_infer, vjp=_vjp, jvp=_jvp)


# --- the gradient as an op of its own (where a tiled backward kernel plugs in) ------------------
GRAD_OP = OP + "_grad"


def unpack(flat, i, like):
    """Input ``i``'s gradient (q, k or v) out of the packed gradient ``flat``."""
    sizes = [int(np.prod(x.shape, dtype=np.int64)) for x in like]
    start = sum(sizes[:i])
    return reshape(getitem(flat, slice(start, start + sizes[i])), tuple(like[i].shape))


def _pack(parts):
    return concatenate([reshape(d, (-1,)) for d in parts], 0)


def _grad_infer(g, q, k, v, *mask, is_causal, scale, enable_gqa):
    y = _infer(q, k, v, *mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    expect_shape(GRAD_OP, "the cotangent", g.shape, y.shape)
    if g.dtype != q.dtype:
        raise DTypeError(f"{GRAD_OP}: the cotangent must be {q.dtype}, got {g.dtype}")
    n = sum(int(np.prod(x.shape, dtype=np.int64)) for x in (q, k, v))
    return AVal((n,), q.dtype)


def _grad_compute(g, q, k, v, *mask, is_causal, scale, enable_gqa):
    m = mask[0] if mask else None
    attrs = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    out, lse = attention_reference(q, k, v, m, return_lse=True, **attrs)
    d = attention_backward_reference(g, q, k, v, out, lse, m, **attrs)
    return np.concatenate([x.reshape(-1) for x in d])


def _grad_jvp(ts, xs, y, is_causal, scale, enable_gqa):
    g, q, k, v, *m = xs
    tg, tq, tk, tv, *tm = ts
    if k.shape[-2] == 0:
        return None
    parts = _Parts(q, k, v, m[0] if m else None, is_causal, scale, enable_gqa)
    d = _grads(parts, g, (tg, tq, tk, tv, tm[0] if tm else None))[:3]
    if all(x is None for x in d):
        return None
    return _pack([_zeros_like(x) if dx is None else parts.back(dx, x)
                  for dx, x in zip(d, (q, k, v))])


def _grad_vjp(u, xs, y, needs, is_causal, scale, enable_gqa):
    """The packed gradient is ``∇_{q,k,v} <g, A>`` for attention A, so its VJP with ``U``:
    for ``g``, the output's tangent along U (forward mode); for q, k, v and a float mask,
    the Hessian of ``<g, A>`` times U, which is the gradient's own tangent along U."""
    g, q, k, v, *m = xs
    mask = m[0] if m else None
    cts = [None] * len(xs)
    if k.shape[-2] == 0:
        return tuple(_zeros_like(x) if n else None for x, n in zip(xs, needs))
    parts = _Parts(q, k, v, mask, is_causal, scale, enable_gqa)
    uq, uk, uv = (unpack(u, i, (q, k, v)) for i in range(3))
    if needs[0]:
        cts[0] = unbroadcast(parts.out_tangent(uq, uk, uv, None), tuple(g.shape))
    if any(needs[1:]):
        d = _grads(parts, g, (None, uq, uk, uv, None))
        for i, x in enumerate((q, k, v), 1):
            if needs[i]:
                cts[i] = _zeros_like(x) if d[i - 1] is None else parts.back(d[i - 1], x)
        if _is_float_mask(mask) and needs[4]:
            cts[4] = unbroadcast(d[3], tuple(mask.shape))
    return tuple(cts)


SCALED_DOT_PRODUCT_ATTENTION_GRAD = defop(GRAD_OP, compute=_grad_compute, infer=_grad_infer,
                                          vjp=_grad_vjp, jvp=_grad_jvp)


# --- the function -------------------------------------------------------------------------------
def _flag(name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise DTypeError(f"{OP}: {name} must be True or False, got {v!r}")
    return bool(v)


def _as_mask(mask, like):
    if isinstance(mask, Tensor):
        return mask
    m = np.asarray(mask)
    if not isinstance(mask, np.ndarray) and m.dtype.kind in "iuf":  # a list or a number
        m = m.astype(like.dtype)
    return Tensor._wrap(m)


def scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=False, scale=None,
                                 dropout_p=0.0, enable_gqa=False):
    """``softmax(q kᵀ · scale + bias) v``, PyTorch's ``F.scaled_dot_product_attention``.

    Args:
        q: queries ``(..., L, E)``.
        k: keys ``(..., S, E)``.
        v: values ``(..., S, Ev)``.
        attn_mask: None; bool, True where the key takes part; or a float of ``q``'s dtype
            added to the scores (``-inf`` to exclude). Broadcastable to ``(..., L, S)``.
        is_causal: row ``i`` sees keys ``j <= i`` (upper-left aligned, as PyTorch); not
            together with ``attn_mask``.
        scale: the factor of ``q kᵀ``; default ``1 / sqrt(E)``.
        dropout_p: drop each attention weight with this probability (the library's generator,
            ``ops.manual_seed``; masks are not PyTorch's), applied whenever ``dropout_p > 0``
            as in PyTorch (``nn.MultiheadAttention`` passes it in training only).
        enable_gqa: let ``k`` and ``v`` have fewer heads (axis -3) than ``q``, a divisor of
            them (grouped-query attention).

    Returns:
        ``(..., L, Ev)`` in ``q``'s dtype. A row in which no key takes part is zero, with a
        zero gradient (PyTorch's answer since 2.5).

    Raises:
        ShapeError: feature sizes or lengths disagree, batch axes or the mask do not
            broadcast, bad head counts for ``enable_gqa`` (the message names the shapes).
        DTypeError: q, k, v not one floating dtype; a mask neither bool nor q's dtype.
        ArgumentError: both ``attn_mask`` and ``is_causal``; ``dropout_p`` outside [0, 1].
    """
    is_causal, enable_gqa = _flag("is_causal", is_causal), _flag("enable_gqa", enable_gqa)
    p = check_dropout_p(dropout_p, OP)
    if attn_mask is not None and is_causal:
        raise ArgumentError(f"{OP}: pass attn_mask or is_causal=True, not both (as PyTorch)")
    q, k, v = lift((q, k, v), OP)
    if scale is None:
        e = q.shape[-1] if len(q.shape) else 0
        scale = 1.0 / math.sqrt(e) if e else 1.0
    elif isinstance(scale, (bool, np.bool_)) or not isinstance(
            scale, (int, float, np.integer, np.floating)):
        raise DTypeError(f"{OP}: scale must be a number, got {scale!r}")
    attrs = dict(is_causal=is_causal, scale=float(scale), enable_gqa=enable_gqa)
    mask = () if attn_mask is None else (_as_mask(attn_mask, q),)
    if p == 0.0 or k.shape[-2] == 0:  # no keys: no weights to drop
        return apply(SCALED_DOT_PRODUCT_ATTENTION, q, k, v, *mask, **attrs)
    SCALED_DOT_PRODUCT_ATTENTION.infer(q, k, v, *mask, **attrs)  # the op's checks
    w = attention_weights(q, k, mask[0] if mask else None, **attrs)
    return matmul(dropout(w, p), _expand_heads(v, q.shape[-3]) if enable_gqa else v)


__all__ = ["scaled_dot_product_attention", "attention_reference", "attention_backward_reference",
           "attention_scores", "attention_weights", "causal_mask", "unpack"]
