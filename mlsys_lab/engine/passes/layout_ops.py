"""The channels-last ops that :func:`~.backend.layout_transform` switches to (inference only:
``vjp=None``): ``conv2d_nhwc`` (input NHWC, weight HWIO), ``max_pool2d_nhwc``,
``avg_pool2d_nhwc``.
"""

import numpy as np

from ...errors import DTypeError, ShapeError
from .. import dtypes
from ..im2col import windows
from ..registry import REGISTRY, AVal, defop
from ..shapes import conv_out_size

ACTIVATIONS = (None, "relu")


def _register(name, compute, infer, **fields):
    """The op ``name`` (inference only: no VJP), defined once even if this module reloads."""
    return REGISTRY.get(name) or defop(name, compute=compute, infer=infer, **fields)


# --- channels-last convolution and pooling --------------------------------------------------
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
    win = windows(x, w.shape[:2], stride, padding, layout="NHWC")  # (N, OH, OW, C, kh, kw)
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
    return windows(x, kernel, stride, padding, pad_value=-np.inf, layout="NHWC").max(axis=(4, 5))


def _avg_pool_nhwc(x, kernel, stride, padding):
    return windows(x, kernel, stride, padding, layout="NHWC").mean(axis=(4, 5))


CONV2D_NHWC = _register("conv2d_nhwc", _conv_nhwc, _conv_nhwc_infer)
MAX_POOL2D_NHWC = _register("max_pool2d_nhwc", _max_pool_nhwc, _pool_nhwc_infer("max_pool2d_nhwc"))
AVG_POOL2D_NHWC = _register("avg_pool2d_nhwc", _avg_pool_nhwc, _pool_nhwc_infer("avg_pool2d_nhwc"))
