"""The ONNX mapping of ``scaled_dot_product_attention`` (chapter 18), both ways.

Export:

* opset >= 23: one ONNX ``Attention`` node (its ``scale`` and ``is_causal`` attributes; GQA
  from the head counts). ``Attention`` takes 4-D ``(batch, heads, length, features)`` tensors
  of one batch size, so other ranks are reshaped to 4-D around it and batch axes that
  broadcast are expanded first;
* opset < 23: the pattern older exporters write — ``MatMul(Q, Transpose(K))``, ``Mul`` by the
  scale, the mask (``Where`` for a bool mask or ``is_causal``, ``Add`` for a float one),
  ``Softmax``, ``MatMul`` with V — and, where a mask may leave a row with no key, the guard
  that makes that row zero (``ReduceMax``, ``Equal -inf``, ``Where``), as the op answers.

Import:

* ``Attention`` (opsets 23-25): 3-D inputs (with ``q_num_heads``/``kv_num_heads``) and 4-D,
  ``attn_mask`` bool or float (also shorter than the keys, padded as ONNX says), ``is_causal``
  (bottom-right aligned after ``past_key``, ``nonpad_kv_seqlen``), ``past_key``/``past_value``
  with the ``present_*`` outputs, sliding windows, GQA: one ``scaled_dot_product_attention``
  node, the causal/window/padding constraints folded into a constant mask. ``softcap``,
  ``softmax_precision`` other than the inputs' and the ``qk_matmul_output`` output, which the
  op has no place for, import as the reference's composition of registry ops instead
  (matmul, tanh, add, softmax, where).
* the MatMul/Softmax pattern (:func:`fold_attention`, called by the ``MatMul`` importer on
  ``MatMul(P, V)``): ``softmax(s)`` with ``s`` the scaled ``MatMul(Q, Transpose(K))`` — scaled
  by ``Mul``/``Div`` on the product or on both operands (the form PyTorch's exporter writes) —
  plus an additive mask or inside a bool ``Where``, with or without this module's row guard,
  becomes one attention node (a constant causal mask becomes ``is_causal``). Anything else
  imports node by node as before.
"""

import math

import numpy as np

from ...engine import dtypes
from ...engine.ops_attention import causal_mask
from .mapping import OnnxImport, register_onnx

OP = "scaled_dot_product_attention"


# --- export --------------------------------------------------------------------------------------
def _reshape(ctx, name, shape):
    return ctx.emit("Reshape", [name, ctx.ints(shape, "shape")])


def _expand(ctx, name, shape):
    return ctx.emit("Expand", [name, ctx.ints(shape, "shape")])


def _four_d(batch, tail):
    """The 4-D shape of a tensor with batch axes ``batch`` and last two axes ``tail``."""
    if len(batch) >= 2:
        return (int(np.prod(batch[:-1], dtype=np.int64)), batch[-1]) + tail
    return (1,) * (2 - len(batch)) + tuple(batch) + tail


def _ex_attention_node(ctx, node):
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    gqa = node.attrs.get("enable_gqa", False)
    out = node.output
    bo = tuple(out.shape[:-2])
    names = []
    for i, x in enumerate((q, k, v)):
        want = bo if (i == 0 or not gqa) else bo[:-1] + (x.shape[-3],)
        name = ctx.name(x)
        if tuple(x.shape[:-2]) != want:
            name = _expand(ctx, name, want + tuple(x.shape[-2:]))
        shape4 = _four_d(want, tuple(x.shape[-2:]))
        if len(x.shape) != 4:
            name = _reshape(ctx, name, shape4)
        names.append(name)
    if mask is not None:
        L, S = q.shape[-2], k.shape[-2]
        name = ctx.name(mask)
        if len(bo) != 2 and len(mask.shape) > 2:  # its batch axes must follow the reshape
            full = bo + (L, S)
            if tuple(mask.shape) != full:
                name = _expand(ctx, name, full)
            name = _reshape(ctx, name, _four_d(bo, (L, S)))
        names.append(name)
    y4 = _four_d(bo, tuple(out.shape[-2:]))
    direct = y4 == tuple(out.shape)
    res = ctx.emit("Attention", names, ctx.name(out) if direct else None,
                   scale=float(node.attrs["scale"]), is_causal=int(node.attrs["is_causal"]))
    if not direct:
        ctx.emit("Reshape", [res, ctx.ints(out.shape, "shape")], ctx.name(out))


def _may_leave_a_row_empty(ctx, mask):
    """False only for a constant mask in which every row keeps a key."""
    arr = ctx.graph.consts.get(mask)
    if arr is None:
        return True
    allowed = arr if arr.dtype == bool else arr != -np.inf
    return not np.all(np.any(allowed, axis=-1))


def _reduce_max_last(ctx, name, rank):
    if ctx.opset >= 18:
        return ctx.emit("ReduceMax", [name, ctx.ints([rank - 1], "axes")], keepdims=1)
    return ctx.emit("ReduceMax", [name], axes=[rank - 1], keepdims=1)


def _ex_heads(ctx, name, shape, hq):
    """K or V with its head axis repeated to ``hq`` heads (GQA), as Reshape/Expand/Reshape."""
    h = shape[-3]
    if h == hq:
        return name
    grouped = tuple(shape[:-3]) + (h, 1) + tuple(shape[-2:])
    wide = tuple(shape[:-3]) + (h, hq // h) + tuple(shape[-2:])
    return _reshape(ctx, _expand(ctx, _reshape(ctx, name, grouped), wide),
                    tuple(shape[:-3]) + (hq,) + tuple(shape[-2:]))


def _ex_composed(ctx, node):
    q, k, v = node.inputs[:3]
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    a = node.attrs
    dt = q.dtype
    kn, vn = ctx.name(k), ctx.name(v)
    if a.get("enable_gqa", False):
        kn = _ex_heads(ctx, kn, k.shape, q.shape[-3])
        vn = _ex_heads(ctx, vn, v.shape, q.shape[-3])
    r = len(k.shape)
    perm = list(range(r - 2)) + [r - 1, r - 2]
    s = ctx.emit("MatMul", [ctx.name(q), ctx.emit("Transpose", [kn], perm=perm)])
    s = ctx.emit("Mul", [s, ctx.const(np.asarray(a["scale"], dt), "scale")])
    rank = len(node.output.shape)
    minus_inf = None
    if mask is not None or a["is_causal"]:
        minus_inf = ctx.const(np.asarray(-np.inf, dt), "minus_inf")
    if mask is not None:
        if mask.dtype == dtypes.bool_:
            s = ctx.emit("Where", [ctx.name(mask), s, minus_inf])
        else:
            s = ctx.emit("Add", [s, ctx.name(mask)])
    if a["is_causal"]:
        tril = ctx.const(causal_mask(q.shape[-2], k.shape[-2]), "causal_mask")
        s = ctx.emit("Where", [tril, s, minus_inf])
    guard = mask is not None and _may_leave_a_row_empty(ctx, mask)
    if guard:
        dead = ctx.emit("Equal", [_reduce_max_last(ctx, s, rank), minus_inf])
        zero = ctx.const(np.asarray(0, dt), "zero")
        s = ctx.emit("Where", [dead, zero, s])
        p = ctx.emit("Where", [dead, zero, ctx.emit("Softmax", [s], axis=-1)])
    else:
        p = ctx.emit("Softmax", [s], axis=-1)
    ctx.emit("MatMul", [p, vn], ctx.name(node.output))


def _ex_attention(ctx, node):
    if ctx.opset >= 23:
        _ex_attention_node(ctx, node)
    else:
        _ex_composed(ctx, node)


# --- import of ONNX Attention --------------------------------------------------------------------
_ATTRS = ("is_causal", "scale", "q_num_heads", "kv_num_heads", "softcap", "softmax_precision",
          "qk_matmul_output_mode", "left_window_size", "right_window_size")


def _to_heads(ctx, x, heads, node, what):
    """A 3-D ``(B, T, heads * D)`` value as ``(B, heads, T, D)``."""
    b, t, hidden = x.shape
    if not heads or hidden % heads:
        ctx.fail(node, f"{what} has {hidden} features, which {heads} heads do not divide")
    x = ctx.emit("reshape", x, shape=(b, t, heads, hidden // heads))
    return ctx.emit("transpose", x, axes=(0, 2, 1, 3))


def _allowed(L, S, offset, causal, left, right, nonpad):
    """The static part of the mask (causal frontier, window, padding) as a bool array of
    shape (L, S) or (B, 1, L, S), or None when nothing constrains the keys."""
    per_batch = np.ndim(offset) > 0
    i = np.arange(L)[:, None]
    j = np.arange(S)[None, :]
    base = (np.reshape(offset, (-1, 1, 1, 1)) if per_batch else offset) + i  # j's frontier
    allowed = None

    def both(a, b):
        return b if a is None else a & b

    if causal:
        allowed = both(allowed, j <= base)
    if left >= 0:
        allowed = both(allowed, base - j <= left)
    if right >= 0:
        allowed = both(allowed, j - base <= right)
    if nonpad is not None:
        allowed = both(allowed, (np.arange(S) < np.reshape(nonpad, (-1, 1)))[:, None, None, :])
    return allowed


def _pad_mask(ctx, mask, S, node):
    short = S - mask.shape[-1]
    if short < 0:
        ctx.fail(node, f"attn_mask has {mask.shape[-1]} keys, more than the {S} keys")
    if short == 0:
        return mask
    fill = False if mask.dtype == dtypes.bool_ else -np.inf
    pad = ctx.full(tuple(mask.shape[:-1]) + (short,), fill, mask.dtype)
    return ctx.emit("concatenate", mask, pad, axis=len(mask.shape) - 1)


def _bias(ctx, mask, allowed, dtype):
    """The mask the op takes: a bool mask and-ed with the static constraints, a float one
    plus their -inf bias, or the constraints alone (bool)."""
    if allowed is None:
        return mask
    if mask is None:
        return ctx.constant(allowed)
    if mask.dtype == dtypes.bool_:
        return ctx.prepare("mul", mask, ctx.constant(allowed))
    return ctx.prepare("add", mask, ctx.constant(np.where(allowed, 0, -np.inf).astype(
        mask.dtype)))


def _expand_heads(ctx, x, hq):
    h = x.shape[1]
    if h == hq:
        return x
    b, _, t, d = x.shape
    x = ctx.emit("reshape", x, shape=(b, h, 1, t, d))
    x = ctx.emit("broadcast_to", x, shape=(b, h, hq // h, t, d))
    return ctx.emit("reshape", x, shape=(b, hq, t, d))


def _composed(ctx, q, k, v, bias, scale, softcap, precision, mode):
    """ONNX's reference computation of Attention in registry ops (for the features the op
    lacks): returns (Y, qk_matmul_output)."""
    dt = q.dtype
    hq = q.shape[1]
    k, v = _expand_heads(ctx, k, hq), _expand_heads(ctx, v, hq)
    root = np.asarray(math.sqrt(scale), dt)
    qk = ctx.emit("matmul", ctx.emit("mul", q, root),
                  ctx.emit("transpose", ctx.emit("mul", k, root), axes=(0, 1, 3, 2)))
    if softcap:
        c = np.asarray(softcap, dt)
        qk = ctx.emit("mul", ctx.emit("tanh", ctx.emit("div", qk, c)), c)
    additive = None
    if bias is not None:
        additive = bias if bias.dtype != dtypes.bool_ else ctx.prepare(
            "where", bias, np.asarray(0, dt), np.asarray(-np.inf, dt))
    s = qk if additive is None else ctx.emit("add", qk, additive)
    shown = s if mode == 2 else qk
    if precision is not None and precision != dt:
        s = ctx.emit("cast", s, dtype=precision)
    minus_inf = np.asarray(-np.inf, s.dtype)
    dead = ctx.emit("eq", ctx.emit("max", s, axis=(3,), keepdims=True), minus_inf)
    if additive is not None:
        dead_bias = ctx.prepare("eq", ctx.prepare("max", additive, axis=(len(additive.shape) - 1,),
                                                  keepdims=True), np.asarray(-np.inf, dt))
        dead = ctx.emit("where", dead_bias, np.asarray(True), dead)
    zero = np.asarray(0, s.dtype)
    p = ctx.emit("where", dead, zero, ctx.emit("softmax", ctx.emit("where", dead, zero, s),
                                               axis=3))
    if p.dtype != dt:
        p = ctx.emit("cast", p, dtype=dt)
    if mode == 3:
        shown = p
    return ctx.emit("matmul", p, v), shown


def _im_attention(ctx, node, a):
    q, k, v = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    mask, pk, pv = ctx.input(node, 3), ctx.input(node, 4), ctx.input(node, 5)
    nonpad = ctx.array(node, 6, "nonpad_kv_seqlen") if len(node.inputs) > 6 else None
    rank = len(q.shape)
    if rank not in (3, 4) or len(k.shape) != rank or len(v.shape) != rank:
        ctx.fail(node, f"Q, K and V must all be 3-D or all 4-D, got {q.shape}, {k.shape}, "
                       f"{v.shape}")
    if (pk is None) != (pv is None):
        ctx.fail(node, "past_key and past_value must be given together")
    if nonpad is not None and pk is not None:
        ctx.fail(node, "nonpad_kv_seqlen cannot be combined with past_key/past_value")
    if rank == 3:
        q = _to_heads(ctx, q, a.get("q_num_heads"), node, "Q")
        k = _to_heads(ctx, k, a.get("kv_num_heads"), node, "K")
        v = _to_heads(ctx, v, a.get("kv_num_heads"), node, "V")
    if pk is not None:
        k = ctx.emit("concatenate", pk, k, axis=2)
        v = ctx.emit("concatenate", pv, v, axis=2)
    present_k, present_v = k, v
    b, hq, L, e = q.shape
    hk, S = k.shape[1], k.shape[2]
    if hq % max(hk, 1) or v.shape[1] != hk:
        ctx.fail(node, f"{hq} query heads and {hk}/{v.shape[1]} key/value heads: the key and "
                       f"value heads must be equal and divide the query heads")
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(e) if scale is None else float(scale)
    offset = 0
    if pk is not None:
        offset = pk.shape[2]
    elif nonpad is not None:
        offset = np.asarray(nonpad, np.int64).reshape(-1) - L
    causal = bool(a.get("is_causal", 0))
    left, right = int(a.get("left_window_size", -1)), int(a.get("right_window_size", -1))
    if mask is not None:
        mask = _pad_mask(ctx, mask, S, node)
    mode = a.get("qk_matmul_output_mode", 0)
    want_qk = len(node.outputs) > 3 and bool(node.outputs[3])
    softcap = a.get("softcap") or 0.0
    precision = a.get("softmax_precision")
    precision = None if precision is None else ctx.numpy_dtype(precision, node.label())
    composed = softcap > 0 or want_qk or (precision is not None and precision != q.dtype)
    plain_causal = causal and np.ndim(offset) == 0 and offset == 0 and mask is None and \
        left < 0 and right < 0 and nonpad is None and not composed
    allowed = None if plain_causal else _allowed(L, S, offset, causal, left, right, nonpad)
    bias = _bias(ctx, mask, allowed, q.dtype)
    if composed:
        y, qk = _composed(ctx, q, k, v, bias, scale, softcap, precision, mode)
    else:
        args = () if bias is None else (bias,)
        y = ctx.emit(OP, q, k, v, *args, is_causal=plain_causal, scale=scale,
                     enable_gqa=hk != hq)
        qk = None
    if rank == 3:
        y = ctx.emit("transpose", y, axes=(0, 2, 1, 3))
        y = ctx.emit("reshape", y, shape=(b, L, hq * y.shape[-1]))
    return [y, present_k, present_v, qk]


# --- import of the MatMul/Softmax pattern --------------------------------------------------------
def _scalar(ctx, value):
    """The value of a constant scalar (any shape of one element), else None."""
    arr = ctx.consts.get(value)
    if arr is None or arr.size != 1 or arr.dtype.kind != "f":
        return None
    return float(arr.reshape(()))


def _node(ctx, value, *ops):
    """The registry node computing ``value`` if its op is one of ``ops`` and nothing else
    reads ``value`` (so the pattern may take it over)."""
    n = ctx.producer(value)
    if n is None or n.op not in ops or ctx.uses(value) > 1:
        return None
    return n


def _scaled(ctx, x, scale=1.0):
    """(scale, node) where ``x`` is ``x' * c`` or ``x' / c`` for a constant scalar c."""
    n = _node(ctx, x, "mul", "div")
    if n is None:
        return scale, x, []
    a, b = n.inputs
    c = _scalar(ctx, b)
    if c is None and n.op == "mul":
        a, c = b, _scalar(ctx, a)
    if c is None or (n.op == "div" and c == 0):
        return scale, x, []
    return (scale * c if n.op == "mul" else scale / c), a, [n]


def _scores(ctx, s):
    """Match ``s = scale * q @ transpose(k)``: returns (q, k, scale, nodes) or None."""
    scale, x, used = _scaled(ctx, s)
    mm = _node(ctx, x, "matmul")
    if mm is None:
        return None
    a, bt = mm.inputs
    sa, q, ua = _scaled(ctx, a)
    sb, kt, ub = _scaled(ctx, bt)
    tr = _node(ctx, kt, "transpose")
    if tr is None:
        return None
    r = len(kt.shape)
    if r < 2 or tuple(tr.attrs["axes"]) != tuple(range(r - 2)) + (r - 1, r - 2):
        return None
    return q, tr.inputs[0], scale * sa * sb, used + [mm] + ua + ub + [tr]


def _is_minus_inf(ctx, value):
    arr = ctx.consts.get(value)
    return arr is not None and arr.size == 1 and np.isneginf(arr.reshape(())).item()


def _unguard(ctx, p):
    """``where(dead, 0, softmax(where(dead, 0, s)))`` (this module's row guard) -> (softmax
    node, nodes); a bare softmax -> (it, [])."""
    sm = _node(ctx, p, "softmax")
    if sm is not None:
        return sm, []
    w = _node(ctx, p, "where")
    if w is None or _scalar(ctx, w.inputs[1]) != 0.0:
        return None, []
    sm = _node(ctx, w.inputs[2], "softmax")
    if sm is None:
        return None, []
    inner = _node(ctx, sm.inputs[0], "where")
    if inner is None or inner.inputs[0] is not w.inputs[0] or _scalar(ctx, inner.inputs[1]) != 0:
        return None, []
    dead = ctx.producer(w.inputs[0])
    mx = ctx.producer(dead.inputs[0]) if dead is not None and dead.op == "eq" else None
    if mx is None or mx.op != "max" or mx.inputs[0] is not inner.inputs[2]:
        return None, []
    return sm, [w, inner, dead, mx]


def fold_attention(ctx, p, v):
    """``MatMul(P, V)`` as one attention node when ``P`` is the softmax of scaled
    ``Q Kᵀ`` (plus a float mask, or in a bool ``Where``, optionally guarded); None otherwise."""
    sm, guard = _unguard(ctx, p)
    if sm is None or sm.attrs.get("axis") not in (-1, len(p.shape) - 1):
        return None
    s = sm.inputs[0]
    if guard:  # the guard's inner where reads the masked scores
        s = guard[1].inputs[2]
    mask, extra, causal = None, [], False
    w = _node(ctx, s, "where", "add") if not guard else ctx.producer(s)
    if w is not None and w.op == "where" and w.inputs[0].dtype == dtypes.bool_ and \
            _is_minus_inf(ctx, w.inputs[2]):
        mask, s, extra = w.inputs[0], w.inputs[1], [w]
    elif w is not None and w.op == "add":
        found = None
        for i in (0, 1):
            found = _scores(ctx, w.inputs[i])
            if found is not None:
                mask, s, extra = w.inputs[1 - i], w.inputs[i], [w]
                break
        if found is None:
            return None
    found = _scores(ctx, s)
    if found is None:
        return None
    q, k, scale, used = found
    if not (q.dtype == k.dtype == v.dtype) or q.dtype.kind != "f" or len(v.shape) < 2:
        return None
    if mask is not None and mask.dtype != dtypes.bool_ and mask.dtype != q.dtype:
        return None
    L, S = q.shape[-2], k.shape[-2]
    if mask is not None and mask.dtype == dtypes.bool_ and mask in ctx.consts:
        m = ctx.consts[mask]
        if m.shape[-2:] == (L, S) and np.array_equal(np.broadcast_to(causal_mask(L, S), m.shape),
                                                     m):
            mask, causal = None, True
    if mask is not None and not _broadcasts(mask.shape, tuple(p.shape)):
        return None
    args = () if mask is None else (mask,)
    try:
        out = ctx.emit(OP, q, k, v, *args, is_causal=causal, scale=scale, enable_gqa=False)
    except Exception:  # noqa: BLE001 - not an attention after all: import node by node
        return None
    if tuple(out.shape) != tuple(p.shape[:-1]) + (v.shape[-1],):
        ctx.nodes.pop()
        return None
    ctx.absorb(sm, *guard, *extra, *used)
    return out


def _broadcasts(shape, to):
    return len(shape) <= len(to) and all(d in (1, t) for d, t in zip(shape[::-1], to[::-1]))


register_onnx(OP, export=_ex_attention, writes=("Attention", "MatMul", "Softmax"),
              imports=(OnnxImport("Attention", _im_attention, _ATTRS),))
