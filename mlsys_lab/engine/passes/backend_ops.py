"""Ops that only backend passes create (inference only: ``vjp=None``).

* ``conv2d_nhwc`` (input NHWC, weight HWIO), ``max_pool2d_nhwc``, ``avg_pool2d_nhwc`` — the
  channels-last kernels :func:`~.backend.layout_transform` switches to;
* ``fused_linear`` — ``act(a @ w + b)`` and ``fused_conv`` — ``act(conv2d(x, w) + b)``, made by
  :func:`~.backend.fuse_matmul_bias_act`;
* ``gemm`` — ``beta * c + alpha * (a @ b)``, BLAS's own operation, and ``sum_accumulate`` —
  ``beta * c + alpha * x.sum(axis=0)`` (a bias gradient folded into its update), made by
  :func:`~.backend.fuse_gemm_accumulate`. Their output may take over ``c``'s buffer.
"""

import numpy as np

from ...errors import DTypeError, ShapeError
from .. import dtypes
from ..registry import REGISTRY, AVal, defop, get
from ..shapes import broadcast_shapes, conv_out_size

ACTIVATIONS = (None, "relu")


def _register(name, compute, infer, **fields):
    """The op ``name`` (inference only: no VJP), defined once even if this module reloads."""
    return REGISTRY.get(name) or defop(name, compute=compute, infer=infer, **fields)


# --- channels-last convolution and pooling --------------------------------------------------
def _nhwc_windows(x, kh, kw, stride, padding, fill=0.0):
    """(N, OH, OW, C, kh, kw) view of the padded NHWC input's sliding windows."""
    ph, pw = padding
    if ph or pw:
        x = np.pad(x, ((0, 0), (ph, ph), (pw, pw), (0, 0)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    return win[:, ::stride[0], ::stride[1]]


def _conv_nhwc_infer(x, w, stride, padding):
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise ShapeError(f"conv2d_nhwc: expects input (N, H, W, C) and weight (kH, kW, C, O), "
                         f"got {tuple(x.shape)} and {tuple(w.shape)}")
    if x.shape[3] != w.shape[2]:
        raise ShapeError(f"conv2d_nhwc: input has {x.shape[3]} channels but weight expects "
                         f"{w.shape[2]} (input {tuple(x.shape)}, weight {tuple(w.shape)})")
    if x.dtype != w.dtype or not dtypes.is_float(x.dtype):
        raise DTypeError(f"conv2d_nhwc: expects equal floating dtypes, got {x.dtype} and "
                         f"{w.dtype}")
    oh = conv_out_size(x.shape[1], w.shape[0], stride[0], padding[0])
    ow = conv_out_size(x.shape[2], w.shape[1], stride[1], padding[1])
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"conv2d_nhwc: kernel {tuple(w.shape[:2])} is larger than the padded "
                         f"input {tuple(x.shape[1:3])}")
    return AVal((x.shape[0], oh, ow, w.shape[3]), x.dtype)


def _conv_nhwc(x, w, stride, padding):
    win = _nhwc_windows(x, w.shape[0], w.shape[1], stride, padding)  # (N, OH, OW, C, kh, kw)
    return np.tensordot(win, w, axes=((3, 4, 5), (2, 0, 1)))  # (N, OH, OW, O)


def _pool_nhwc_infer(name):
    def infer(x, kernel, stride, padding):
        if len(x.shape) != 4:
            raise ShapeError(f"{name}: expects (N, H, W, C), got {tuple(x.shape)}")
        if not dtypes.is_float(x.dtype):
            raise DTypeError(f"{name}: expects a floating tensor, got {x.dtype}")
        oh = conv_out_size(x.shape[1], kernel[0], stride[0], padding[0])
        ow = conv_out_size(x.shape[2], kernel[1], stride[1], padding[1])
        if oh <= 0 or ow <= 0:
            raise ShapeError(f"{name}: window {kernel} larger than input {tuple(x.shape[1:3])}")
        return AVal((x.shape[0], oh, ow, x.shape[3]), x.dtype)
    return infer


def _max_pool_nhwc(x, kernel, stride, padding):
    return _nhwc_windows(x, *kernel, stride, padding, -np.inf).max(axis=(4, 5))


def _avg_pool_nhwc(x, kernel, stride, padding):
    return _nhwc_windows(x, *kernel, stride, padding, 0.0).mean(axis=(4, 5))


CONV2D_NHWC = _register("conv2d_nhwc", _conv_nhwc, _conv_nhwc_infer)
MAX_POOL2D_NHWC = _register("max_pool2d_nhwc", _max_pool_nhwc, _pool_nhwc_infer("max_pool2d_nhwc"))
AVG_POOL2D_NHWC = _register("avg_pool2d_nhwc", _avg_pool_nhwc, _pool_nhwc_infer("avg_pool2d_nhwc"))


# --- fused matmul/conv + bias + activation ----------------------------------------------------
def _epilogue_infer(name, main):
    def infer(a, w, b, activation=None, **attrs):
        y = main.infer(a, w, **attrs)
        if activation not in ACTIVATIONS:
            raise ShapeError(f"{name}: unknown activation {activation!r} (known: {ACTIVATIONS})")
        if broadcast_shapes(name, y.shape, b.shape) != tuple(y.shape):
            raise ShapeError(f"{name}: bias {tuple(b.shape)} does not broadcast to the output "
                             f"{tuple(y.shape)} without growing it")
        if dtypes.promote(y.dtype, b.dtype) != y.dtype:
            raise DTypeError(f"{name}: bias dtype {b.dtype} would promote the output "
                             f"{y.dtype}")
        return AVal(tuple(y.shape), y.dtype)
    return infer


def _epilogue(y, b, activation):
    """Bias and activation applied in place on the fresh output: no further buffers."""
    np.add(y, b, out=y, casting="unsafe")
    if activation == "relu":
        np.maximum(y, 0, out=y)
    return y


def _fused_linear(a, w, b, activation=None):
    return _epilogue(np.matmul(a, w), b, activation)


def _fused_conv(x, w, b, activation=None, stride=(1, 1), padding=(0, 0)):
    y = get("conv2d").compute(x, w, stride=stride, padding=padding)
    y = np.asarray(y)
    return _epilogue(y if y.flags.writeable else y.copy(), b, activation)


FUSED_LINEAR = _register("fused_linear", _fused_linear,
                         _epilogue_infer("fused_linear", get("matmul")))
FUSED_CONV = _register("fused_conv", _fused_conv, _epilogue_infer("fused_conv", get("conv2d")))


# --- GEMM with accumulation -------------------------------------------------------------------
def _gemm_infer(c, a, b, alpha=1.0, beta=1.0):
    shapes = f"c {tuple(c.shape)}, a {tuple(a.shape)}, b {tuple(b.shape)}"
    if (len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]
            or tuple(c.shape) != (a.shape[0], b.shape[1])):
        raise ShapeError(f"gemm: expects c (M, N), a (M, K), b (K, N), got {shapes}")
    if not (c.dtype == a.dtype == b.dtype) or not dtypes.is_float(c.dtype):
        raise DTypeError(f"gemm: expects c, a and b of one floating dtype, got {c.dtype}, "
                         f"{a.dtype}, {b.dtype}")
    return AVal(tuple(c.shape), c.dtype)


def _gemm(c, a, b, alpha=1.0, beta=1.0):
    return (beta * c + alpha * np.matmul(a, b)).astype(c.dtype, copy=False)


GEMM = _register("gemm", _gemm, _gemm_infer, inplace=(0,))


def _sum_acc_infer(c, x, alpha=1.0, beta=1.0):
    if len(x.shape) != 2 or tuple(c.shape) != (x.shape[1],):
        raise ShapeError(f"sum_accumulate: expects c (N,) and x (M, N), got c {tuple(c.shape)}, "
                         f"x {tuple(x.shape)}")
    if c.dtype != x.dtype or not dtypes.is_float(c.dtype):
        raise DTypeError(f"sum_accumulate: expects c and x of one floating dtype, got {c.dtype}, "
                         f"{x.dtype}")
    return AVal(tuple(c.shape), c.dtype)


def _sum_acc(c, x, alpha=1.0, beta=1.0):
    return (beta * c + alpha * x.sum(axis=0)).astype(c.dtype, copy=False)


SUM_ACCUMULATE = _register("sum_accumulate", _sum_acc, _sum_acc_infer, inplace=(0,))
