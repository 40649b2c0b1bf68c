"""Neural-network ops: softmax family, losses, convolution, pooling, dropout.

Each op is defined once with :func:`~.registry.defop`, its VJP and JVP rules named beside it
(conventions in :mod:`.ops_math`).
"""

import numpy as np

from ..errors import ArgumentError, DTypeError, OpError, ShapeError
from . import dtypes
from .dispatch import apply, tsum
from .im2col import col2im, windows
from .ops_math import cast, exp, sqrt
from .ops_shape import mean, reshape, sum
from .registry import AVal, defop
from .shapes import as_int, conv_out_size, expect_shape
from .tensor import Tensor, as_tensor


def _float_infer(name):
    def infer(x, **attrs):
        if not dtypes.is_float(x.dtype):
            raise DTypeError(f"{name}: expects a floating tensor, got {x.dtype}")
        if "axis" in attrs and not -len(x.shape) <= attrs["axis"] < len(x.shape):
            raise ShapeError(f"{name}: axis {attrs['axis']} out of range for {tuple(x.shape)}")
        return AVal(x.shape, x.dtype)
    return infer


# --- softmax family ---------------------------------------------------------------------------
def _softmax_np(x, axis):
    if x.size == 0:  # nothing to normalise (np.max would refuse a length-0 axis)
        return np.empty_like(x)
    e = np.subtract(x, np.maximum.reduce(x, axis=axis, keepdims=True))  # fresh: work in place
    np.exp(e, out=e)
    e /= np.add.reduce(e, axis=axis, keepdims=True)
    return e


def _log_softmax_np(x, axis):
    if x.size == 0:
        return np.empty_like(x)
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def _softmax_vjp(g, xs, y, needs, axis):
    return (y * (g - sum(g * y, axis, True)),)


def _softmax_jvp(ts, xs, y, axis):
    return y * (ts[0] - sum(ts[0] * y, axis, True))


SOFTMAX = defop("softmax", compute=_softmax_np, infer=_float_infer("softmax"), vjp=_softmax_vjp,
                jvp=_softmax_jvp)


def _log_softmax_vjp(g, xs, y, needs, axis):
    return (g - exp(y) * sum(g, axis, True),)


def _log_softmax_jvp(ts, xs, y, axis):
    return ts[0] - sum(exp(y) * ts[0], axis, True)


LOG_SOFTMAX = defop("log_softmax", compute=_log_softmax_np, infer=_float_infer("log_softmax"),
                    vjp=_log_softmax_vjp, jvp=_log_softmax_jvp)


# --- losses -----------------------------------------------------------------------------------
def _one_hot_infer(t, num_classes, dtype):
    if t.dtype.kind not in "iu":
        raise DTypeError(f"one_hot: labels must be integers, got {t.dtype}")
    return AVal(tuple(t.shape) + (num_classes,), dtypes.as_dtype(dtype))


def _one_hot_np(t, num_classes, dtype):
    if t.size and (t.min() < 0 or t.max() >= num_classes):
        raise OpError(f"one_hot: labels must lie in [0, {num_classes}), got min {t.min()} "
                      f"max {t.max()}")
    return (t[..., None] == np.arange(num_classes)).astype(dtype)


ONE_HOT = defop("one_hot", compute=_one_hot_np, infer=_one_hot_infer)


def _ce_infer(x, t):
    if not dtypes.is_float(x.dtype):
        raise DTypeError(f"cross_entropy: logits must be floating, got {x.dtype}")
    if t.dtype.kind not in "iu":
        raise DTypeError(f"cross_entropy: targets must be integer class ids, got {t.dtype}")
    if len(x.shape) != 2 or tuple(t.shape) != (x.shape[0],):
        raise ShapeError(f"cross_entropy: expects logits (N, C) and targets (N,), got "
                         f"{tuple(x.shape)} and {tuple(t.shape)}")
    return AVal((), x.dtype)


def _check_classes(op, t, c):
    # Read as unsigned (a view, no copy), a negative id is at least 2**(bits - 1), so one max
    # finds ids too large and negative ones alike, unless c itself is that large.
    bits = 8 * t.dtype.itemsize
    if t.dtype.kind == "u" or c <= 2 ** (bits - 1):
        bad = t.size and t.view(f"u{t.dtype.itemsize}").max() >= c
    else:
        bad = (t < 0).any() or (t >= c).any()
    if bad:
        raise OpError(f"{op}: targets must lie in [0, {c}), got min {t.min()} max {t.max()}")


def _ce_np(x, t):
    n, c = x.shape
    _check_classes("cross_entropy", t, c)
    m = np.maximum.reduce(x, axis=1)
    z = np.subtract(x, m[:, None])  # fresh: exp, sum and log reuse it or its row sums
    zt = z[np.arange(n), t]  # the targets' shifted logits (a copy), before exp overwrites z
    np.exp(z, out=z)
    lse = np.add.reduce(z, axis=1)
    np.log(lse, out=lse)
    lse -= zt
    if n and lse.dtype.itemsize >= 4:  # np.mean's own sum and division, without its wrapping
        return np.add.reduce(lse) / n
    return lse.mean()  # float16 (np.mean sums it in float32) and N = 0 (NaN, with a warning)


def _ce_grad_np(x, t):
    n = x.shape[0]
    p = _softmax_np(x, 1)
    p[np.arange(n), t] -= 1.0
    p /= n
    return p


def _ce_grad_infer(x, t):
    _ce_infer(x, t)  # the forward op's rule: (N, C) logits, N integer targets
    return AVal(tuple(x.shape), x.dtype)


def _ce_grad_vjp(u, xs, y, needs):
    """d/dx of (softmax(x) - onehot(t)) / N, applied to ``u``: the softmax rule, scaled."""
    p = softmax(xs[0], 1)
    return (p * (u - sum(u * p, 1, True)) / float(xs[0].shape[0]), None)


def _ce_grad_jvp(ts, xs, y):
    return None if ts[0] is None else _ce_grad_vjp(ts[0], xs, y, (True, False))[0]


CROSS_ENTROPY_GRAD = defop("cross_entropy_grad", compute=_ce_grad_np, infer=_ce_grad_infer,
                           vjp=_ce_grad_vjp, jvp=_ce_grad_jvp)


def _ce_dlogits(x, t):
    """d cross_entropy / d logits = (softmax(x) - onehot(t)) / N, as one op."""
    return apply(CROSS_ENTROPY_GRAD, x, t)


def _ce_vjp(g, xs, y, needs):
    d = _ce_dlogits(*xs)
    one = (g.data is not None and not g.requires_grad and g.data.shape == ()
           and g.data == 1)  # skip a multiply by 1
    return (d if one else d * g, None)


def _ce_jvp(ts, xs, y):
    return None if ts[0] is None else sum(_ce_dlogits(*xs) * ts[0])


CROSS_ENTROPY = defop("cross_entropy", compute=_ce_np, infer=_ce_infer, vjp=_ce_vjp,
                      jvp=_ce_jvp)


def _mse_infer(p, t):
    if tuple(p.shape) != tuple(t.shape):
        raise ShapeError(f"mse_loss: prediction {tuple(p.shape)} and target {tuple(t.shape)} "
                         f"must have the same shape")
    if not dtypes.is_float(p.dtype) or p.dtype != t.dtype:
        raise DTypeError(f"mse_loss: expects equal floating dtypes, got {p.dtype} and {t.dtype}")
    return AVal((), p.dtype)


def _mse_dpred(p, t):
    """d mse_loss / d prediction = 2 (p - t) / N."""
    return (p - t) * (2.0 / max(p.size, 1))


def _mse_np(p, t):
    return np.mean((p - t) ** 2)


def _mse_vjp(g, xs, y, needs):
    d = _mse_dpred(*xs) * g
    return (d if needs[0] else None, -d if needs[1] else None)


def _mse_jvp(ts, xs, y):
    return sum(_mse_dpred(*xs) * tsum(ts[0], None if ts[1] is None else -ts[1]))


MSE_LOSS = defop("mse_loss", compute=_mse_np, infer=_mse_infer, vjp=_mse_vjp, jvp=_mse_jvp)


# --- convolution (NCHW input, OIHW weight) ----------------------------------------------------
# Attributes: stride, padding, and dilation and groups only where they differ from (1, 1) and 1,
# so the graphs of ordinary convolutions read (and print) as they always have. Every rule takes
# dilation and groups as keywords with those defaults.
def _pair(op, name, v):
    """An int or a pair of ints as a pair of Python ints (else a library error naming ``op``)."""
    pair = (v, v) if np.isscalar(v) else tuple(v)
    if len(pair) != 2:
        raise ShapeError(f"{op}: {name} must be an int or a pair of ints, got {v!r}")
    return tuple(as_int(op, name, e) for e in pair)


def _check_window(op, stride, padding, kernel=None):
    """Refuse strides < 1, negative padding and (pooling) kernels < 1 or padding more than half
    the kernel, naming ``op`` and the value, before any size is divided by the stride."""
    if kernel is not None and min(kernel) < 1:
        raise ShapeError(f"{op}: kernel_size must be positive, got {kernel}")
    if min(stride) < 1:
        raise ShapeError(f"{op}: stride must be positive, got {stride}")
    if min(padding) < 0:
        raise ShapeError(f"{op}: padding must be non-negative, got {padding}")
    if kernel is not None and any(2 * p > k for p, k in zip(padding, kernel)):
        raise ShapeError(f"{op}: padding {padding} must be at most half of kernel_size {kernel} "
                         f"(as in PyTorch: a window could otherwise hold only padding)")


def conv_attrs(op, stride, padding, dilation=1, groups=1):
    """The attributes of a ``conv2d`` node: ``stride`` and ``padding`` as pairs, plus
    ``dilation`` (a pair) and ``groups`` (an int) where they are not the defaults."""
    attrs = dict(stride=_pair(op, "stride", stride), padding=_pair(op, "padding", padding))
    dilation = _pair(op, "dilation", dilation)
    groups = as_int(op, "groups", groups)
    if dilation != (1, 1):
        attrs["dilation"] = dilation
    if groups != 1:
        attrs["groups"] = groups
    return attrs


def _conv_infer(x, w, stride, padding, dilation=(1, 1), groups=1, op="conv2d"):
    _check_window(op, stride, padding)
    if min(dilation) < 1:
        raise ShapeError(f"{op}: dilation must be positive, got {dilation}")
    if groups < 1:
        raise ShapeError(f"{op}: groups must be positive, got {groups}")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"{op}: expects input (N, C, H, W) and weight (O, C/groups, kH, kW), "
                         f"got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[1] != w.shape[1] * groups:
        each = "" if groups == 1 else f" per group x {groups} groups = {w.shape[1] * groups}"
        raise ShapeError(f"{op}: input has {x.shape[1]} channels but weight expects "
                         f"{w.shape[1]}{each} (input {tuple(x.shape)}, weight "
                         f"{tuple(w.shape)})")
    if w.shape[0] % groups:
        raise ShapeError(f"{op}: {w.shape[0]} output channels do not split into {groups} "
                         f"groups (weight {tuple(w.shape)})")
    if x.dtype != w.dtype or not dtypes.is_float(x.dtype):
        raise DTypeError(f"{op}: expects equal floating dtypes, got {x.dtype} and {w.dtype}")
    if 0 in w.shape[2:]:
        raise ShapeError(f"{op}: kernel size must be greater than zero, got weight "
                         f"{tuple(w.shape)}")
    span = [d * (k - 1) + 1 for d, k in zip(dilation, w.shape[2:])]
    oh = conv_out_size(x.shape[2], span[0], stride[0], padding[0])
    ow = conv_out_size(x.shape[3], span[1], stride[1], padding[1])
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"{op}: kernel {tuple(w.shape[2:])} (dilation {dilation}: spans "
                         f"{tuple(span)}) is larger than the padded input {tuple(x.shape[2:])} "
                         f"(padding {padding})")
    return AVal((x.shape[0], w.shape[0], oh, ow), x.dtype)


def _grouped_columns(x, kernel, stride, padding, dilation, groups):
    """im2col's "NKP" matrix split into groups, (N, groups, C/groups * kh * kw, OH * OW), rows
    ordered (c, i, j) like a weight's (C/groups, kh, kw), and (OH, OW). Reshaped straight from
    the :func:`~.im2col.windows` view, numpy copies only where it must: where it need not (a
    kernel one column wide, say) the GEMM gets the strided view, as it always has, and its
    rounding stays the reference's."""
    win = windows(x, kernel, stride, padding, dilation)  # (N, C, OH, OW, kh, kw)
    n, c, oh, ow, kh, kw = win.shape
    cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, groups, c // groups * kh * kw, oh * ow)
    return cols, (oh, ow)


def _conv_np(x, w, stride, padding, dilation=(1, 1), groups=1):
    o, cg, kh, kw = w.shape
    cols, (oh, ow) = _grouped_columns(x, (kh, kw), stride, padding, dilation, groups)
    y = np.matmul(w.reshape(groups, o // groups, cg * kh * kw), cols)  # (N, groups, O/g, P)
    return y.reshape(x.shape[0], o, oh, ow)


def _conv_grad_input_np(g, w, x_shape, stride, padding, dilation=(1, 1), groups=1):
    n, c = x_shape[:2]
    o, cg, kh, kw = w.shape
    oh, ow = g.shape[2:]
    wt = w.reshape(groups, o // groups, cg * kh * kw).transpose(0, 2, 1)
    cols = np.matmul(wt, g.reshape(n, groups, o // groups, oh * ow))  # (N, groups, K, P)
    return col2im(cols.reshape(n, c, kh, kw, oh, ow), x_shape, (kh, kw), stride, padding,
                  dilation)


def _conv_grad_weight_np(x, g, w_shape, stride, padding, dilation=(1, 1), groups=1):
    o, cg, kh, kw = w_shape
    cols, (oh, ow) = _grouped_columns(x, (kh, kw), stride, padding, dilation, groups)
    gg = g.reshape(x.shape[0], groups, o // groups, oh * ow)
    return np.matmul(gg, cols.transpose(0, 1, 3, 2)).sum(axis=0).reshape(w_shape)


def _conv_vjp(g, xs, y, needs, **attrs):
    return (conv2d_grad_input(g, xs[1], xs[0].shape, **attrs) if needs[0] else None,
            conv2d_grad_weight(xs[0], g, xs[1].shape, **attrs) if needs[1] else None)


def _conv_jvp(ts, xs, y, **attrs):
    return tsum(None if ts[0] is None else _conv(ts[0], xs[1], **attrs),
                None if ts[1] is None else _conv(xs[0], ts[1], **attrs))


CONV2D = defop("conv2d", compute=_conv_np, infer=_conv_infer, vjp=_conv_vjp, jvp=_conv_jvp)


def _conv_grad_input_infer(g, w, x_shape, stride, padding, dilation=(1, 1), groups=1):
    y = _conv_infer(AVal(tuple(x_shape), g.dtype), w, stride, padding, dilation, groups,
                    op="conv2d_grad_input")
    expect_shape("conv2d_grad_input", "the cotangent", g.shape, y.shape)
    return AVal(tuple(x_shape), g.dtype)


def _conv_grad_input_vjp(u, xs, y, needs, x_shape, **attrs):
    return (_conv(u, xs[1], **attrs) if needs[0] else None,
            conv2d_grad_weight(u, xs[0], xs[1].shape, **attrs) if needs[1] else None)


def _conv_grad_input_jvp(ts, xs, y, x_shape, **attrs):
    return tsum(None if ts[0] is None else conv2d_grad_input(ts[0], xs[1], x_shape, **attrs),
                None if ts[1] is None else conv2d_grad_input(xs[0], ts[1], x_shape, **attrs))


CONV2D_GRAD_INPUT = defop("conv2d_grad_input", compute=_conv_grad_input_np,
                          infer=_conv_grad_input_infer, vjp=_conv_grad_input_vjp,
                          jvp=_conv_grad_input_jvp)


def _conv_grad_weight_infer(x, g, w_shape, stride, padding, dilation=(1, 1), groups=1):
    y = _conv_infer(x, AVal(tuple(w_shape), x.dtype), stride, padding, dilation, groups,
                    op="conv2d_grad_weight")
    expect_shape("conv2d_grad_weight", "the cotangent", g.shape, y.shape)
    return AVal(tuple(w_shape), x.dtype)


def _conv_grad_weight_vjp(u, xs, y, needs, w_shape, **attrs):
    return (conv2d_grad_input(xs[1], u, xs[0].shape, **attrs) if needs[0] else None,
            _conv(xs[0], u, **attrs) if needs[1] else None)


def _conv_grad_weight_jvp(ts, xs, y, w_shape, **attrs):
    return tsum(None if ts[0] is None else conv2d_grad_weight(ts[0], xs[1], w_shape, **attrs),
                None if ts[1] is None else conv2d_grad_weight(xs[0], ts[1], w_shape, **attrs))


CONV2D_GRAD_WEIGHT = defop("conv2d_grad_weight", compute=_conv_grad_weight_np,
                           infer=_conv_grad_weight_infer, vjp=_conv_grad_weight_vjp,
                           jvp=_conv_grad_weight_jvp)


def _conv(x, w, **attrs):
    return apply(CONV2D, x, w, **attrs)


def conv2d_grad_input(g, w, x_shape, stride, padding, dilation=(1, 1), groups=1):
    """The input gradient of ``conv2d(x, w)`` (``x`` of shape ``x_shape``) for cotangent ``g``:
    the transposed convolution of ``g`` with ``w``."""
    return apply(CONV2D_GRAD_INPUT, g, w, x_shape=tuple(x_shape),
                 **conv_attrs("conv2d_grad_input", stride, padding, dilation, groups))


def conv2d_grad_weight(x, g, w_shape, stride, padding, dilation=(1, 1), groups=1):
    """The weight gradient of ``conv2d(x, w)`` (``w`` of shape ``w_shape``) for cotangent
    ``g``: the correlation of ``x`` with ``g``."""
    return apply(CONV2D_GRAD_WEIGHT, x, g, w_shape=tuple(w_shape),
                 **conv_attrs("conv2d_grad_weight", stride, padding, dilation, groups))


# --- pooling ----------------------------------------------------------------------------------
def _pool_infer(name):
    def infer(x, kernel, stride, padding):
        _check_window(name, stride, padding, kernel)
        if len(x.shape) != 4:
            raise ShapeError(f"{name}: expects (N, C, H, W), got {tuple(x.shape)}")
        if not dtypes.is_float(x.dtype):
            raise DTypeError(f"{name}: expects a floating tensor, got {x.dtype}")
        oh = conv_out_size(x.shape[2], kernel[0], stride[0], padding[0])
        ow = conv_out_size(x.shape[3], kernel[1], stride[1], padding[1])
        if oh <= 0 or ow <= 0:
            raise ShapeError(f"{name}: window {kernel} larger than input {tuple(x.shape[2:])}")
        return AVal((x.shape[0], x.shape[1], oh, ow), x.dtype)
    return infer


def _pool_taps(x, kernel, stride, padding, fill):
    """For each tap (i, j) of the window in row-major order, its (N, C, OH, OW) strided view of
    the input padded with ``fill``: what that tap reads at every output."""
    win = windows(x, kernel, stride, padding, pad_value=fill)
    return [win[..., i, j] for i in range(kernel[0]) for j in range(kernel[1])]


def _first_max(x, kernel, stride, padding):
    """Each window's maximum (-inf in the padding) and the index of its first maximum among
    the taps (a NaN beats everything, the first NaN winning: np.argmax's choice), taking the
    taps in row-major order."""
    taps = _pool_taps(x, kernel, stride, padding, -np.inf)
    best, first = taps[0].copy(), np.zeros(taps[0].shape, np.intp)
    for k, v in enumerate(taps[1:], 1):
        take = (v > best) | (np.isnan(v) & ~np.isnan(best))
        first += take * (k - first)  # k where the tap takes over, else unchanged
        np.maximum(best, v, out=best)  # the new maximum (NaN sticks)
    return best, first


def _maxpool_np(x, kernel, stride, padding):
    taps = _pool_taps(x, kernel, stride, padding, -np.inf)
    out = taps[0].copy()
    for v in taps[1:]:
        np.maximum(out, v, out=out)  # NaN propagates, as in a max
    return out


def _maxpool_select_np(u, x, kernel, stride, padding):
    taps = _pool_taps(u, kernel, stride, padding, 0.0)
    first = _first_max(x, kernel, stride, padding)[1]
    out = np.zeros(first.shape, u.dtype)
    for k, tap in enumerate(taps):
        out = np.where(first == k, tap, out)
    return out


def _maxpool_scatter_np(g, x, kernel, stride, padding):
    first = _first_max(x, kernel, stride, padding)[1]
    # each window sends g to the pixel it read at its winning tap, 0 from the others
    return col2im(lambda i, j: np.where(first == i * kernel[1] + j, g, 0), x.shape, kernel,
                  stride, padding)


_maxpool_infer = _pool_infer("max_pool2d")
def _maxpool_vjp(g, xs, y, needs, kernel, stride, padding):
    return (apply(MAX_POOL2D_SCATTER, g, xs[0], kernel=kernel, stride=stride, padding=padding),)


def _maxpool_jvp(ts, xs, y, kernel, stride, padding):
    return None if ts[0] is None else apply(
        MAX_POOL2D_SELECT, ts[0], xs[0], kernel=kernel, stride=stride, padding=padding)


MAX_POOL2D = defop("max_pool2d", compute=_maxpool_np, infer=_maxpool_infer, vjp=_maxpool_vjp,
                   jvp=_maxpool_jvp)


def _maxpool_select_infer(u, x, kernel, stride, padding):
    expect_shape("max_pool2d_select", "the tangent", u.shape, x.shape)
    return _maxpool_infer(x, kernel, stride, padding)


def _maxpool_select_vjp(g, xs, y, needs, kernel, stride, padding):
    return (apply(MAX_POOL2D_SCATTER, g, xs[1], kernel=kernel, stride=stride, padding=padding),
            None)


def _maxpool_select_jvp(ts, xs, y, kernel, stride, padding):
    return None if ts[0] is None else apply(
        MAX_POOL2D_SELECT, ts[0], xs[1], kernel=kernel, stride=stride, padding=padding)


MAX_POOL2D_SELECT = defop("max_pool2d_select", compute=_maxpool_select_np,
                          infer=_maxpool_select_infer, vjp=_maxpool_select_vjp,
                          jvp=_maxpool_select_jvp)


def _maxpool_scatter_infer(g, x, kernel, stride, padding):
    y = _maxpool_infer(x, kernel, stride, padding)
    expect_shape("max_pool2d_scatter", "the cotangent", g.shape, y.shape)
    return AVal(tuple(x.shape), g.dtype)


def _maxpool_scatter_vjp(u, xs, y, needs, kernel, stride, padding):
    return (apply(MAX_POOL2D_SELECT, u, xs[1], kernel=kernel, stride=stride, padding=padding),
            None)


def _maxpool_scatter_jvp(ts, xs, y, kernel, stride, padding):
    return None if ts[0] is None else apply(
        MAX_POOL2D_SCATTER, ts[0], xs[1], kernel=kernel, stride=stride, padding=padding)


MAX_POOL2D_SCATTER = defop("max_pool2d_scatter", compute=_maxpool_scatter_np,
                           infer=_maxpool_scatter_infer, vjp=_maxpool_scatter_vjp,
                           jvp=_maxpool_scatter_jvp)


def _avgpool_np(x, kernel, stride, padding):
    taps = _pool_taps(x, kernel, stride, padding, 0.0)
    return np.add.reduce(taps) / (kernel[0] * kernel[1])  # NaN in, NaN out; padding adds 0


def _avgpool_grad_np(g, x_shape, kernel, stride, padding):
    share = g / (kernel[0] * kernel[1])  # every tap of a window gets the same share
    return col2im(lambda i, j: share, x_shape, kernel, stride, padding)


def _avgpool_vjp(g, xs, y, needs, kernel, stride, padding):
    return (apply(AVG_POOL2D_GRAD, g, x_shape=tuple(xs[0].shape), kernel=kernel, stride=stride,
                  padding=padding),)


def _avgpool_jvp(ts, xs, y, kernel, stride, padding):
    return None if ts[0] is None else apply(
        AVG_POOL2D, ts[0], kernel=kernel, stride=stride, padding=padding)


AVG_POOL2D = defop("avg_pool2d", compute=_avgpool_np, infer=_pool_infer("avg_pool2d"),
                   vjp=_avgpool_vjp, jvp=_avgpool_jvp)


def _avgpool_grad_infer(g, x_shape, kernel, stride, padding):
    y = _pool_infer("avg_pool2d")(AVal(tuple(x_shape), g.dtype), kernel, stride, padding)
    expect_shape("avg_pool2d_grad", "the cotangent", g.shape, y.shape)
    return AVal(tuple(x_shape), g.dtype)


def _avgpool_grad_vjp(u, xs, y, needs, x_shape, kernel, stride, padding):
    return (apply(AVG_POOL2D, u, kernel=kernel, stride=stride, padding=padding),)


def _avgpool_grad_jvp(ts, xs, y, x_shape, kernel, stride, padding):
    return None if ts[0] is None else apply(
        AVG_POOL2D_GRAD, ts[0], x_shape=x_shape, kernel=kernel, stride=stride, padding=padding)


AVG_POOL2D_GRAD = defop("avg_pool2d_grad", compute=_avgpool_grad_np, infer=_avgpool_grad_infer,
                        vjp=_avgpool_grad_vjp, jvp=_avgpool_grad_jvp)


# --- dropout ----------------------------------------------------------------------------------
# Randomness is an input: ``rng_seed`` (impure: every run draws a fresh seed from the generator
# that ``manual_seed`` resets) feeds dropout's ``seed`` input, and dropout is a pure function of
# (x, seed). So a traced or compiled graph draws a new mask per call, and the VJP, which reads
# the same seed value, reuses the forward mask.
_rng = np.random.default_rng(0)


def _rng_seed_np():
    return np.asarray(_rng.integers(2**31), dtype=np.int64)


def _rng_seed_infer():
    return AVal((), dtypes.int64)


RNG_SEED = defop("rng_seed", compute=_rng_seed_np, infer=_rng_seed_infer, impure=True)


def _dropout_np(x, seed, p):
    if p >= 1.0:  # every element dropped (PyTorch's answer; no 1/(1-p) scale to divide by)
        return np.zeros_like(x)
    keep = np.random.default_rng(int(seed)).random(x.shape) >= p
    return np.where(keep, x / (1.0 - p), 0).astype(x.dtype)


def _dropout_infer(x, seed, p):
    if not dtypes.is_float(x.dtype):
        raise DTypeError(f"dropout: expects a floating tensor, got {x.dtype}")
    if seed.dtype.kind not in "iu" or tuple(seed.shape) != ():
        raise DTypeError(f"dropout: seed must be an integer scalar, got "
                         f"{seed.dtype}{list(seed.shape)}")
    return AVal(x.shape, x.dtype)


def _dropout_vjp(g, xs, y, needs, p):
    return (apply(DROPOUT, g, xs[1], p=p), None)


def _dropout_jvp(ts, xs, y, p):
    return None if ts[0] is None else apply(DROPOUT, ts[0], xs[1], p=p)


DROPOUT = defop("dropout", compute=_dropout_np, infer=_dropout_infer, vjp=_dropout_vjp,
                jvp=_dropout_jvp, inplace=(0,))


def manual_seed(seed):
    """Reset the generator that ``rng_seed`` (and so every dropout mask) draws from: the same
    sequence of calls then gives the same masks, eagerly, traced or compiled.

    ``seed`` is an int in [-2**63, 2**64), as in PyTorch; a negative seed is read as its
    two's-complement uint64 (``-1`` is ``2**64 - 1``).
    """
    global _rng
    s = as_int("manual_seed", "seed", seed)
    if not -2**63 <= s < 2**64:
        raise ArgumentError(f"manual_seed: seed must lie in [-2**63, 2**64), got {s}")
    _rng = np.random.default_rng(s % 2**64)


def get_rng_state():
    """The state of the generator ``manual_seed`` resets, as a dict of plain ints and strings
    (``ml.save`` stores it), for checkpoints that must resume the same dropout masks."""
    return _rng.bit_generator.state


def set_rng_state(state):
    """Restore a state from :func:`get_rng_state`.

    Raises:
        ArgumentError: ``state`` is not a state of numpy's PCG64 generator.
    """
    global _rng
    rng = np.random.default_rng()
    try:
        rng.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as e:
        raise ArgumentError(f"set_rng_state: not a PCG64 generator state ({e})") from None
    _rng = rng


def rng_seed():
    """A fresh int64 seed from the generator ``manual_seed`` resets.

    The op is impure: in a traced or compiled graph it draws a new seed on every run (passes
    never fold, merge or drop it)."""
    return apply(RNG_SEED)


# --- public functions -------------------------------------------------------------------------
def softmax(x, axis=-1):
    """exp(x) / sum(exp(x)) along ``axis`` (numerically stable)."""
    return apply(SOFTMAX, x, axis=as_int("softmax", "axis", axis))


def log_softmax(x, axis=-1):
    """log(softmax(x)) computed stably."""
    return apply(LOG_SOFTMAX, x, axis=as_int("log_softmax", "axis", axis))


def one_hot(labels, num_classes, dtype="float32"):
    """Integer ``labels`` as one-hot vectors of length ``num_classes`` (a new last axis)."""
    return apply(ONE_HOT, labels, num_classes=as_int("one_hot", "num_classes", num_classes),
                 dtype=dtypes.as_dtype(dtype, "one_hot"))


def cross_entropy(logits, targets):
    """Mean negative log-likelihood of integer ``targets`` under softmax(``logits``)."""
    return apply(CROSS_ENTROPY, logits, targets)


def mse_loss(pred, target):
    """Mean squared error."""
    return apply(MSE_LOSS, pred, target)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """2-D convolution (cross-correlation), NCHW input and OIHW weight, optional bias (O,).

    As in PyTorch: ``dilation`` spaces the kernel's taps (a 3x3 kernel with dilation 2 spans
    5x5 pixels) and ``groups`` splits the channels into that many independent convolutions,
    the weight then being (O, C / groups, kH, kW) (``groups = C`` is a depthwise convolution).
    """
    y = _conv(x, weight, **conv_attrs("conv2d", stride, padding, dilation, groups))
    if bias is not None:
        bias = as_tensor(bias, y.dtype, "conv2d")
        if tuple(bias.shape) != (y.shape[1],):
            raise ShapeError(f"conv2d: bias must have shape (O,) = ({y.shape[1]},), one value "
                             f"per output channel, got {tuple(bias.shape)}")
        y = y + reshape(bias, (1, -1, 1, 1))
    return y


def _pool_args(op, kernel_size, stride, padding):
    k = _pair(op, "kernel_size", kernel_size)
    s = k if stride is None else _pair(op, "stride", stride)
    return dict(kernel=k, stride=s, padding=_pair(op, "padding", padding))


def max_pool2d(x, kernel_size, stride=None, padding=0):
    """Max over each ``kernel_size`` window (stride defaults to the window size).

    ``padding`` may be at most half the kernel, as in PyTorch. The gradient goes to the first
    maximum of each window (PyTorch's choice too), not split among ties as :func:`max` does.
    """
    return apply(MAX_POOL2D, x, **_pool_args("max_pool2d", kernel_size, stride, padding))


def avg_pool2d(x, kernel_size, stride=None, padding=0):
    """Mean over each window (zero padding counts towards the mean, as PyTorch's default
    ``count_include_pad=True``); ``padding`` may be at most half the kernel."""
    return apply(AVG_POOL2D, x, **_pool_args("avg_pool2d", kernel_size, stride, padding))


def check_dropout_p(p, op="dropout"):
    """``p`` as a float in [0, 1], else a library error naming ``op`` (``nn.Dropout`` shares it).

    Raises:
        DTypeError: ``p`` is not a real number.
        ArgumentError: ``p`` lies outside [0, 1] (or is NaN).
    """
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer,
                                                               np.floating)):
        raise DTypeError(f"{op}: p must be a number in [0, 1], got {p!r} ({type(p).__name__})")
    if not 0.0 <= p <= 1.0:
        raise ArgumentError(f"{op}: dropout probability p must lie in [0, 1], got {p!r}")
    return float(p)


def dropout(x, p=0.5, training=True, seed=None):
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p); ``p=1`` gives
    zeros (and a zero gradient), as in PyTorch.

    The mask is a function of ``seed``, an int or an integer scalar tensor; when None it is a
    fresh :func:`rng_seed`, so a traced or compiled graph draws a new mask on every call
    (reproducibly after :func:`manual_seed`). The seed is an input of the op, so the backward
    pass reuses exactly the forward mask. Masks are not PyTorch's (another generator).
    """
    p = check_dropout_p(p)
    if not training or p == 0.0:
        return x
    if seed is None:
        seed = rng_seed()
    elif not isinstance(seed, Tensor):
        seed = Tensor._wrap(np.asarray(as_int("dropout", "seed", seed), dtype=np.int64))
    return apply(DROPOUT, x, seed, p=float(p))


def layer_norm(x, weight=None, bias=None, eps=1e-5, axis=-1):
    """Normalise over ``axis`` to zero mean and unit variance, then scale and shift
    (a composite of primitive ops)."""
    mu = mean(x, axis, keepdims=True)
    d = x - mu
    var = mean(d * d, axis, keepdims=True)
    y = d / sqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def batch_norm(x, mean_, var, weight=None, bias=None, eps=1e-5):
    """Normalise NCHW ``x`` with per-channel statistics, then scale and shift (composite)."""
    shape = (1, -1) + (1,) * (len(x.shape) - 2)
    y = (x - reshape(mean_, shape)) / sqrt(reshape(var, shape) + eps)
    if weight is not None:
        y = y * reshape(weight, shape)
    if bias is not None:
        y = y + reshape(bias, shape)
    return y


__all__ = ["softmax", "log_softmax", "one_hot", "cross_entropy", "mse_loss", "conv2d",
           "max_pool2d", "avg_pool2d", "dropout", "rng_seed", "layer_norm", "batch_norm",
           "manual_seed", "cast"]
