"""Ops that only the fusion passes create (inference only: ``vjp=None``).

* ``fused_linear`` — ``act(a @ w + b)`` and ``fused_conv`` — ``act(conv2d(x, w) + b)``, made by
  :func:`~.linear.fuse_matmul_bias_act`;
* ``gemm`` — ``beta * c + alpha * (a @ b)``, BLAS's own operation, and ``sum_accumulate`` —
  ``beta * c + alpha * x.sum(axis=0)`` (a bias gradient folded into its update), made by
  :func:`~.linear.fuse_gemm_accumulate`. Their output may take over ``c``'s buffer.
"""

import numpy as np

from ....errors import DTypeError, ShapeError
from ... import dtypes
from ...registry import REGISTRY, AVal, defop, get
from ...shapes import broadcast_shapes

ACTIVATIONS = (None, "relu")


def _register(name, compute, infer, **fields):
    """The op ``name`` (inference only: no VJP), defined once even if this module reloads."""
    return REGISTRY.get(name) or defop(name, compute=compute, infer=infer, **fields)


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


def _fused_conv(x, w, b, activation=None, **conv_attrs):
    """``act(conv2d(x, w, **conv_attrs) + b)``: every attr of conv2d (stride, padding and any
    it gains, such as dilation and groups) passes through to it."""
    y = get("conv2d").compute(x, w, **conv_attrs)
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
