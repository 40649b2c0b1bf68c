"""Int8 kernels (book ch. 10): integer GEMM with int32 accumulation and requantisation, the
``qlinear_matmul`` / ``qlinear_conv`` ops that run them, and :func:`lower_qdq`, the pass that
puts them into a QDQ graph.

With ``x ≈ s_x (q_x - z_x)`` and ``w ≈ s_w (q_w - z_w)`` (per output channel), one output is

    acc = Σ_k (q_x[k] - z_x)(q_w[k] - z_w) + q_b          (exact, in int32)
        = Σ_k q_x q_w - z_x Σ_k q_w - z_w Σ_k q_x + K z_x z_w + q_b
    q_y = clip(round(acc · s_x s_w / s_y) + z_y, qmin, qmax)   (requantisation)

so the inner loop is a plain integer dot product of the stored bytes; the zero-point terms are a
column sum of the weight (computed once, when the weight is packed) and a row sum of the input.
``q_b`` is the bias quantised with scale ``s_x s_w`` and zero point 0, so it adds straight into
the accumulator. A ReLU after the bias is the lower clip ``q_y >= z_y``.

Error bound (what the tests check against float64): with ``x̂ = s_x (q_x - z_x)``,
``|x - x̂| <= s_x / 2`` and ``|w - ŵ| <= s_w / 2`` when nothing clips, and
``x w - x̂ ŵ = (x - x̂) w + x̂ (w - ŵ)``, so for one output of ``y = Σ_k x_k w_k + b``

    |y - ŷ| <= s_x/2 · Σ_k |w_k| + s_w/2 · Σ_k |x̂_k| + s_x s_w / 2 + s_y / 2

(input rounding, weight rounding, bias rounding, output rounding; the accumulation itself is
exact). A ReLU is 1-Lipschitz, so the bound holds after it too.

The kernels are Numba loops of one shape, the dot-product form ``out[i, j] = Σ_k a[i, k] ·
bt[j, k]`` over rows of A and of the packed (transposed) weight, both walked at unit stride:
:func:`int8_matmul` (int8/uint8 bytes, int32 accumulator) and :func:`float32_matmul` (the
same loops in float32) so that a benchmark compares the data types and nothing else. The int8
kernel widens each row of A to int16 once (it is read N times); the weights stream in as bytes,
a quarter of float32's traffic. On x86, LLVM turns the int16 x int8 dot product into
``vpmaddwd`` (16-bit multiplies summed pairwise into 32-bit lanes, twice the lanes of a float32
FMA) or, with VNNI, ``vpdpwssd`` (the multiply and the accumulate in one instruction); for an
AVX2-only target, where LLVM would pick the 128-bit form, :mod:`.int8_simd` supplies the
256-bit one (``row_dot``).
"""

from __future__ import annotations

import weakref

import numba
import numpy as np
from numba import prange

from ...engine.im2col import im2col
from ...engine.numba_cache import CACHE
from ...engine.ops_nn import conv_out_size
from ...engine.passes.rewrite import Rewriter, graph_pass
from ...engine.registry import REGISTRY, AVal, defop, get, register_impl
from ...errors import DTypeError, ShapeError
from ..passes import sole_user
from .int8_simd import row_dot
from .params import QUANT_DTYPES, along

BYTE_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8))
ACTIVATIONS = (None, "relu")


# --- the loops --------------------------------------------------------------------------------
@numba.njit(parallel=True, fastmath=True, cache=CACHE)
def _float32_dot(a, bt, out):
    """``out[i, j] = Σ_k a[i, k] * bt[j, k]`` in float32, rows in parallel (fastmath lets LLVM
    vectorise the float sum, as integer sums always may be)."""
    m, k = a.shape
    n = bt.shape[0]
    for i in prange(m):
        for j in range(n):
            acc = np.float32(0)
            for p in range(k):
                acc += a[i, p] * bt[j, p]
            out[i, j] = acc


@numba.njit(parallel=True, cache=CACHE)
def _int8_dot(a, bt, out):
    """The same loops on bytes, accumulated in int32. Row ``i`` of A is widened to int16 once
    (it is read ``n`` times); the weight rows stay bytes, sign-extended as they stream in."""
    m, k = a.shape
    n = bt.shape[0]
    for i in prange(m):
        row = np.empty(k, np.int16)
        for p in range(k):
            row[p] = a[i, p]
        for j in range(n):
            out[i, j] = row_dot(row, bt, j)   # Σ_p row[p] * bt[j, p] in int32


@numba.njit(parallel=True, cache=CACHE)
def _qgemm(a, bt, const, w_zp, mult, y_zp, lo, hi, out):
    """Requantised int8 GEMM: the int8 loops above into an int32 row, then per output
    ``rint((acc + const[j] - w_zp[j] * Σ_k a[i, k]) * mult[j]) + y_zp`` clipped to [lo, hi].
    (The epilogue runs as a second loop: inside the dot-product loop nest it stops LLVM from
    vectorising the integer sum.)"""
    m, k = a.shape
    n = bt.shape[0]
    for i in prange(m):
        row = np.empty(k, np.int16)
        for p in range(k):
            row[p] = a[i, p]
        a_sum = np.int64(0)
        for p in range(k):
            a_sum += row[p]
        accs = np.empty(n, np.int32)
        for j in range(n):
            accs[j] = row_dot(row, bt, j)
        for j in range(n):
            total = np.int64(accs[j]) + const[j] - w_zp[j] * a_sum
            v = np.rint(np.float64(total) * mult[j]) + y_zp
            out[i, j] = min(max(v, lo), hi)


def _check_nt(name, a, bt, kinds):
    if a.ndim != 2 or bt.ndim != 2 or a.shape[1] != bt.shape[1]:
        raise ShapeError(f"{name}: expects a (M, K) and bt (N, K), got {a.shape} and {bt.shape}")
    if a.dtype not in kinds or bt.dtype not in kinds:
        raise DTypeError(f"{name}: expects {'/'.join(d.name for d in kinds)} operands, got "
                         f"{a.dtype} and {bt.dtype}")


def int8_matmul(a, bt):
    """``a @ bt.T`` of int8/uint8 matrices, accumulated exactly in int32 (Numba).

    Args:
        a: (M, K) int8 or uint8.
        bt: (N, K) int8 or uint8 — the right operand transposed ("packed"), so both operands
            are read along K at unit stride.

    Returns:
        (M, N) int32.
    """
    _check_nt("int8_matmul", a, bt, BYTE_DTYPES)
    out = np.empty((a.shape[0], bt.shape[0]), np.int32)
    _int8_dot(np.ascontiguousarray(a), np.ascontiguousarray(bt), out)
    return out


def float32_matmul(a, bt):
    """``a @ bt.T`` in float32 by the same loops as :func:`int8_matmul` (the benchmark's
    float32 baseline of identical structure)."""
    f32 = (np.dtype(np.float32),)
    _check_nt("float32_matmul", a, bt, f32)
    out = np.empty((a.shape[0], bt.shape[0]), np.float32)
    _float32_dot(np.ascontiguousarray(a), np.ascontiguousarray(bt), out)
    return out


# --- packed weights (cached per constant array) -----------------------------------------------
_PACKED: dict = {}


def pack_weight(w, w_zp, conv=False):
    """``(bt, w_sum)``: the weight as (N, K) rows per output channel and each row's sum, both
    computed once per weight array (constants of a graph are never modified)."""
    key = (id(w), conv)
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1], hit[2]
    bt = np.ascontiguousarray(w.reshape(w.shape[0], -1) if conv else w.T)
    w_sum = bt.sum(axis=1, dtype=np.int64).astype(np.int32)
    _PACKED[key] = (weakref.ref(w, lambda _, k=key, cache=_PACKED: cache.pop(k, None)), bt, w_sum)
    return bt, w_sum


def _requant_args(xs, xz, ws, wz, ys, yz, n, activation, out_dtype):
    """The kernel's per-channel multiplier, zero points and clip range."""
    mult = (np.float64(xs) * np.broadcast_to(np.asarray(ws, np.float64), (n,))
            / np.float64(ys)).astype(np.float64)
    w_zp = np.ascontiguousarray(np.broadcast_to(np.asarray(wz, np.int32), (n,)))
    info = np.iinfo(out_dtype)
    lo = int(yz) if activation == "relu" else info.min
    return mult, w_zp, int(xz), int(yz), lo, info.max


def qgemm(a, bt, w_sum, xs, xz, ws, wz, ys, yz, bias, activation, out_dtype, out=None):
    """The requantised GEMM of (M, K) ``a`` by packed (N, K) ``bt`` (``w_sum`` its row sums):
    (M, N) of ``out_dtype``, written into ``out`` when given (C-contiguous). The zero-point
    terms that do not depend on the row of ``a`` and the bias are folded into one int64
    constant per output channel first."""
    n, k = bt.shape
    mult, w_zp, a_zp, y_zp, lo, hi = _requant_args(xs, xz, ws, wz, ys, yz, n, activation,
                                                   out_dtype)
    w_zp64 = w_zp.astype(np.int64)
    const = (np.asarray(bias, np.int64).reshape(n) - a_zp * w_sum.astype(np.int64)
             + k * a_zp * w_zp64)
    if out is None or not out.flags.c_contiguous:
        out = np.empty((a.shape[0], n), out_dtype)
    _qgemm(np.ascontiguousarray(a), bt, const, w_zp64, mult, np.float64(y_zp), np.float64(lo),
           np.float64(hi), out)
    return out


# --- the reference arithmetic (numpy, int64) --------------------------------------------------
def requantize_np(acc, xs, ws, ys, yz, activation, out_dtype, axis):
    """``clip(round(acc · s_x s_w / s_y) + z_y)`` in float64, ``s_w`` along ``axis`` of
    ``acc``; a ReLU is the lower clip at ``z_y``."""
    mult = np.float64(xs) * np.asarray(ws, np.float64) / np.float64(ys)
    v = np.rint(acc.astype(np.float64) * along(mult, axis, acc.ndim)) + np.int64(yz)
    info = np.iinfo(out_dtype)
    lo = int(yz) if activation == "relu" else info.min
    return np.clip(v, lo, info.max).astype(out_dtype)


def qmm_accumulator(x, xz, w, wz, bias):
    """The int32 accumulator of ``qlinear_matmul`` (exact, in int64): ``Σ_k (x - x_z)(w - w_z)
    + q_b``, one row per row of ``x``."""
    xi = x.astype(np.int64) - np.int64(xz)
    wi = w.astype(np.int64) - along(np.asarray(wz, np.int64), 1 if np.ndim(wz) else None, 2)
    return xi @ wi + bias.astype(np.int64)


def _qmm_np(x, xs, xz, w, ws, wz, ys, yz, bias, activation=None):
    acc = qmm_accumulator(x, xz, w, wz, bias)
    return requantize_np(acc, xs, ws, ys, yz, activation, yz.dtype, acc.ndim - 1)


def _conv_geometry(x_shape, w_shape, stride, padding, dilation):
    kh, kw = w_shape[2:]
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    oh = conv_out_size(x_shape[2], dh * (kh - 1) + 1, sh, ph)
    ow = conv_out_size(x_shape[3], dw * (kw - 1) + 1, sw, pw)
    return oh, ow


def _window_rows(x, w, stride, padding, dilation, xz):
    """(N·OH·OW, C·kh·kw): one row per window of NCHW ``x`` (im2col's "NPK" order, taps
    (c, i, j) like the OIHW weight), the padding filled with the input's zero point (the
    integer that means real 0); and (OH, OW)."""
    rows, hw = im2col(x, w.shape[2:], stride, padding, dilation, pad_value=int(xz),
                      order="NPK")
    return rows.reshape(-1, rows.shape[2]), hw


def _qconv_np(x, xs, xz, w, ws, wz, ys, yz, bias, stride=(1, 1), padding=(0, 0),
              dilation=(1, 1), groups=1, activation=None):
    n = x.shape[0]
    o, cg = w.shape[:2]
    cols, (oh, ow) = _window_rows(x, w, stride, padding, dilation, xz)
    cols = cols.reshape(cols.shape[0], x.shape[1], -1)
    wzv = np.broadcast_to(np.asarray(wz, np.int64), (o,))
    acc = np.empty((cols.shape[0], o), np.int64)
    og = o // groups
    for g in range(groups):
        a = cols[:, g * cg:(g + 1) * cg].reshape(cols.shape[0], -1).astype(np.int64) - int(xz)
        wg = w[g * og:(g + 1) * og].reshape(og, -1).astype(np.int64) - wzv[g * og:(g + 1) * og,
                                                                            None]
        acc[:, g * og:(g + 1) * og] = a @ wg.T
    acc += bias.astype(np.int64).reshape(1, o)
    y = requantize_np(acc, xs, ws, ys, yz, activation, yz.dtype, 1)
    return np.ascontiguousarray(y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2))


# --- shape rules ------------------------------------------------------------------------------
def _check_q_operands(name, x, xs, xz, w, ws, wz, ys, yz, bias, channels, activation):
    if activation not in ACTIVATIONS:
        raise ShapeError(f"{name}: unknown activation {activation!r} (known: {ACTIVATIONS})")
    for what, v in (("x", x), ("w", w)):
        if np.dtype(v.dtype) not in BYTE_DTYPES:
            raise DTypeError(f"{name}: {what} must be int8 or uint8, got {v.dtype}")
    if xz.dtype != x.dtype or wz.dtype != w.dtype or np.dtype(yz.dtype) not in BYTE_DTYPES:
        raise DTypeError(f"{name}: zero points must have their tensor's dtype (x {x.dtype}/"
                         f"{xz.dtype}, w {w.dtype}/{wz.dtype}) and y_zero_point int8 or uint8 "
                         f"(got {yz.dtype})")
    if np.dtype(bias.dtype) != np.dtype(np.int32):
        raise DTypeError(f"{name}: the bias must be int32 (scale s_x*s_w), got {bias.dtype}")
    for what, s in (("x_scale", xs), ("y_scale", ys), ("w_scale", ws)):
        if not np.dtype(s.dtype).kind == "f":
            raise DTypeError(f"{name}: {what} must be floating, got {s.dtype}")
    for what, s, z in (("x", xs, xz), ("y", ys, yz)):
        if tuple(s.shape) not in ((), (1,)) or tuple(z.shape) != tuple(s.shape):
            raise ShapeError(f"{name}: {what} scale and zero point must be per tensor, got "
                             f"{tuple(s.shape)} and {tuple(z.shape)}")
    if tuple(ws.shape) != tuple(wz.shape) or tuple(ws.shape) not in ((), (1,), (channels,)):
        raise ShapeError(f"{name}: w_scale {tuple(ws.shape)} and w_zero_point "
                         f"{tuple(wz.shape)} must be one scalar or one value per output "
                         f"channel ({channels})")
    if tuple(bias.shape) != (channels,):
        raise ShapeError(f"{name}: bias must have shape ({channels},), got {tuple(bias.shape)}")


def _qmm_infer(x, xs, xz, w, ws, wz, ys, yz, bias, activation=None):
    if len(x.shape) < 1 or len(w.shape) != 2 or x.shape[-1] != w.shape[0]:
        raise ShapeError(f"qlinear_matmul: expects x (..., K) and w (K, N), got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    _check_q_operands("qlinear_matmul", x, xs, xz, w, ws, wz, ys, yz, bias, w.shape[1],
                      activation)
    return AVal(tuple(x.shape[:-1]) + (w.shape[1],), np.dtype(yz.dtype))


def _qconv_infer(x, xs, xz, w, ws, wz, ys, yz, bias, stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1), groups=1, activation=None):
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"qlinear_conv: expects x (N, C, H, W) and w (O, C/groups, kH, kW), got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if groups < 1 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ShapeError(f"qlinear_conv: {x.shape[1]} input channels, weight {tuple(w.shape)} "
                         f"and groups={groups} do not agree")
    for what, pair in (("stride", stride), ("padding", padding), ("dilation", dilation)):
        if len(pair) != 2 or min(pair) < (0 if what == "padding" else 1):
            raise ShapeError(f"qlinear_conv: bad {what} {pair}")
    _check_q_operands("qlinear_conv", x, xs, xz, w, ws, wz, ys, yz, bias, w.shape[0],
                      activation)
    oh, ow = _conv_geometry(x.shape, w.shape, stride, padding, dilation)
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"qlinear_conv: kernel {tuple(w.shape[2:])} larger than the padded "
                         f"input {tuple(x.shape[2:])}")
    return AVal((x.shape[0], w.shape[0], oh, ow), np.dtype(yz.dtype))


QLINEAR_MATMUL = REGISTRY.get("qlinear_matmul") or defop(
    "qlinear_matmul", compute=_qmm_np, infer=_qmm_infer)
QLINEAR_CONV = REGISTRY.get("qlinear_conv") or defop(
    "qlinear_conv", compute=_qconv_np, infer=_qconv_infer)


# --- the Numba implementations of the ops -----------------------------------------------------
def qlinear_matmul_out(out, x, xs, xz, w, ws, wz, ys, yz, bias, activation=None):
    """``qlinear_matmul`` by the Numba GEMM (any leading dims of ``x`` are flattened)."""
    bt, w_sum = pack_weight(w, wz)
    a = x.reshape(-1, x.shape[-1])
    flat = out.reshape(a.shape[0], -1) if out.flags.c_contiguous else None
    y = qgemm(a, bt, w_sum, xs, xz, ws, wz, ys, yz, bias, activation, out.dtype, flat)
    if y is not flat:
        out[...] = y.reshape(out.shape)


def qlinear_conv_out(out, x, xs, xz, w, ws, wz, ys, yz, bias, stride=(1, 1), padding=(0, 0),
                     dilation=(1, 1), groups=1, activation=None):
    """``qlinear_conv`` by im2col (padding with the input's zero point) and the Numba GEMM."""
    n, o = x.shape[0], w.shape[0]
    cols, (oh, ow) = _window_rows(x, w, stride, padding, dilation, xz)
    bt, w_sum = pack_weight(w, wz, conv=True)
    og, cg = o // groups, w.shape[1] * w.shape[2] * w.shape[3]
    wsv = np.broadcast_to(np.asarray(ws), (o,))
    wzv = np.broadcast_to(np.asarray(wz), (o,))
    y = np.empty((cols.shape[0], o), out.dtype)
    for g in range(groups):
        sl = slice(g * og, (g + 1) * og)
        a = cols.reshape(cols.shape[0], x.shape[1], -1)[:, g * w.shape[1]:(g + 1) * w.shape[1]]
        y[:, sl] = qgemm(a.reshape(cols.shape[0], cg), bt[sl], w_sum[sl], xs, xz, wsv[sl],
                         wzv[sl], ys, yz, bias[sl], activation, out.dtype)
    out[...] = y.reshape(n, oh, ow, o).transpose(0, 3, 1, 2)


for _device in ("cpu", "cpu-numba"):
    register_impl("qlinear_matmul", _device, qlinear_matmul_out, name="numba.qgemm_int8")
    register_impl("qlinear_conv", _device, qlinear_conv_out, name="numba.qconv_im2col_int8")


# --- lowering a QDQ graph onto the int8 ops ---------------------------------------------------
def _const_inputs(graph, node):
    arrays = [graph.consts.get(v) for v in node.inputs[1:]]
    return None if any(a is None for a in arrays) else arrays


def _dq_source(graph, value):
    """``(views, dq node)`` when ``value`` is view ops over a per-tensor ``dequantize_linear``
    of an int8/uint8 value with constant scale and zero point; else None."""
    views = []
    while value.producer is not None and get(value.producer.op).view is not None:
        views.insert(0, value.producer)
        value = value.producer.inputs[0]
    p = value.producer
    if p is None or p.op != "dequantize_linear" or p.inputs[0].dtype not in BYTE_DTYPES:
        return None
    params = _const_inputs(graph, p)
    if params is None or params[0].size != 1:
        return None
    return views, p


def _weight_dq(graph, node):
    """The DQ node feeding ``node``'s weight from constants, per channel on the output axis
    (or per tensor); else None."""
    p = node.inputs[1].producer
    if p is None or p.op != "dequantize_linear" or p.inputs[0] not in graph.consts:
        return None
    params = _const_inputs(graph, p)
    if params is None or p.inputs[0].dtype not in BYTE_DTYPES:
        return None
    axis = p.attrs.get("axis", 1) % len(p.inputs[0].shape)
    want = 0 if node.op == "conv2d" else 1
    return p if params[0].size == 1 or axis == want else None


def _tail(graph, site_out, outs):
    """From the block's float result: optional views, then a per-tensor ``quantize_linear``
    of constant params; returns ``(views, q node)`` or None."""
    views, v = [], site_out
    while True:
        user = sole_user(v, outs)
        if user is None:
            return None
        if get(user.op).view is not None:
            views.append(user)
            v = user.output
            continue
        if user.op != "quantize_linear":
            return None
        params = _const_inputs(graph, user)
        ok = params is not None and params[0].size == 1 and user.output.dtype in BYTE_DTYPES
        return (views, user) if ok else None


def _match(graph, node, outs):
    """The int8 pattern around a conv2d/matmul of a QDQ graph, as a dict, or None."""
    if node.op not in ("matmul", "conv2d") or (node.op == "matmul"
                                              and len(node.inputs[1].shape) != 2):
        return None
    src, wdq = _dq_source(graph, node.inputs[0]), _weight_dq(graph, node)
    if src is None or wdq is None:
        return None
    v, bias = node.output, None
    add = sole_user(v, outs)
    if add is not None and add.op == "add" and add.output.aval == v.aval:
        other = add.inputs[1] if add.inputs[0] is v else add.inputs[0]
        bias = _bias_values(graph, other, node)
    if bias is None:
        add = None
    else:
        v = add.output
    relu = sole_user(v, outs)
    relu = relu if relu is not None and relu.op == "relu" else None
    tail = _tail(graph, (relu or add or node).output, outs)
    if tail is None:
        return None
    return dict(main=node, views=src[0], xdq=src[1], wdq=wdq, add=add, bias=bias, relu=relu,
                out_views=tail[0], q=tail[1])


def _bias_values(graph, value, node):
    """The float bias (one value per output channel) that ``value`` holds: a constant, or a
    DQ of constants; else None."""
    from ..passes import channel_vector, output_channel_axis

    arr = graph.consts.get(value)
    if arr is None and value.producer is not None and value.producer.op == "dequantize_linear":
        params = _const_inputs(graph, value.producer)
        if params is not None and value.producer.inputs[0] in graph.consts:
            arr = get("dequantize_linear").compute(graph.consts[value.producer.inputs[0]],
                                                   *params, **value.producer.attrs)
    if arr is None:
        return None
    return channel_vector(arr, node.output.shape, output_channel_axis(node))


@graph_pass
def lower_qdq(graph):
    """Run each quantised conv/matmul of a QDQ graph on the int8 kernels.

    The pattern ``quantize_linear(relu(add(op(views(dequantize_linear(q_x)),
    dequantize_linear(W_q)), bias)))`` (bias, relu and the views optional; ``op`` conv2d or
    matmul) becomes ``views(q_x) -> qlinear_conv / qlinear_matmul -> q_y``: int8 in, int8 out,
    the bias requantised to int32 with scale ``s_x s_w``. What no pattern covers stays in float
    between its DQ and Q nodes. Values that other nodes still read in float keep their DQ.
    """
    outs = set(map(id, graph.outputs))
    plan = {}
    for n in graph.nodes:
        m = _match(graph, n, outs)
        if m is not None:
            plan[id(m["q"])] = m
    rw = Rewriter(graph)
    for n in graph.nodes:
        m = plan.get(id(n))
        if m is None:
            rw.copy(n)
            continue
        rw.bind(n.output, _emit_qlinear(rw, graph, m))
    return rw.build(prune=True)


def _emit_qlinear(rw, graph, m):
    main, xdq, wdq, q = m["main"], m["xdq"], m["wdq"], m["q"]
    x = rw[xdq.inputs[0]]
    for view in m["views"]:
        x = rw.emit(view.op, [x], view.attrs)
    xs = graph.consts[xdq.inputs[1]]
    ws = graph.consts[wdq.inputs[1]]
    c = main.output.shape[1 if main.op == "conv2d" else -1]
    bias = np.zeros(c) if m["bias"] is None else m["bias"]
    w_scale = np.broadcast_to(np.asarray(ws, np.float64).reshape(-1), (c,))
    b_int = np.rint(bias / (float(np.asarray(xs).reshape(())) * w_scale))
    b_int = np.clip(b_int, np.iinfo(np.int32).min, np.iinfo(np.int32).max).astype(np.int32)
    inputs = [x, rw[xdq.inputs[1]], rw[xdq.inputs[2]], rw[wdq.inputs[0]], rw[wdq.inputs[1]],
              rw[wdq.inputs[2]], rw[q.inputs[1]], rw[q.inputs[2]],
              rw.const(b_int, name=f"{main.output.name}_bias_i32")]
    activation = "relu" if m["relu"] is not None else None
    if main.op == "matmul":
        y = rw.emit("qlinear_matmul", inputs, {"activation": activation}, source=main.source)
    else:
        attrs = {"stride": main.attrs["stride"], "padding": main.attrs["padding"],
                 "dilation": main.attrs.get("dilation", (1, 1)),
                 "groups": main.attrs.get("groups", 1), "activation": activation}
        y = rw.emit("qlinear_conv", inputs, attrs, source=main.source)
    for view in m["out_views"]:
        y = rw.emit(view.op, [y], view.attrs)
    return y


__all__ = ["int8_matmul", "float32_matmul", "qgemm", "pack_weight", "qlinear_matmul_out",
           "qlinear_conv_out", "lower_qdq", "QUANT_DTYPES"]
