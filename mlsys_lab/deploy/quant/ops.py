"""The quantisation ops on the registry: ``quantize_linear`` / ``dequantize_linear`` (ONNX's
QuantizeLinear / DequantizeLinear: scale and zero point are tensor inputs, ``axis`` picks the
channel axis) and ``fake_quant`` (quantise-dequantise in float with a straight-through
gradient, for QAT)."""

from __future__ import annotations

import numpy as np

from ...engine import dtypes
from ...engine.dispatch import apply
from ...engine.ops_math import ge, le, where
from ...engine.registry import REGISTRY, AVal, defop
from ...errors import ArgumentError, DTypeError, ShapeError
from .params import QParams, along

# --- ops: QuantizeLinear / DequantizeLinear ------------------------------------------------------
#: The integer types a zero point (QuantizeLinear's output, DequantizeLinear's input) may have,
#: with their saturation ranges (int32 only as DequantizeLinear's input: a bias).
INT_QTYPES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
              dtypes.int4, dtypes.uint4, dtypes.int2, dtypes.uint2)
#: The float8 types: QuantizeLinear saturates to their finite range (``saturate=True``) or
#: casts (out of range: NaN or inf); their zero point must be 0.
FLOAT8_QTYPES = (dtypes.float8_e4m3fn, dtypes.float8_e4m3fnuz, dtypes.float8_e5m2,
                 dtypes.float8_e5m2fnuz)
#: Every quantised type.
QTYPES = INT_QTYPES + FLOAT8_QTYPES + (dtypes.float4_e2m1fn,)


def _qrange(dt):
    import ml_dtypes

    info = ml_dtypes.iinfo(dt)
    return int(info.min), int(info.max)


def _channel_axis(name, x, s, z, axis, block_size=0):
    """The checked axis (None: per tensor) of a Q/DQ node whose data is ``x``: a scalar
    scale is per tensor, a 1-D one per channel along ``axis``, and with ``block_size`` > 0
    the scale has ``x``'s shape but ``ceil(n / block_size)`` on ``axis`` (blocked)."""
    if tuple(s.shape) != tuple(z.shape):
        raise ShapeError(f"{name}: scale {tuple(s.shape)} and zero point {tuple(z.shape)} "
                         f"must have one shape")
    if not dtypes.is_float(s.dtype):
        raise DTypeError(f"{name}: the scale must be floating, got {s.dtype}")
    if isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer)) \
            or block_size < 0:
        raise ArgumentError(f"{name}: block_size must be an integer >= 0, got {block_size!r}")
    if (len(s.shape) == 0 or tuple(s.shape) == (1,)) and not block_size:
        return None
    if len(s.shape) != 1 and not block_size:
        raise ShapeError(f"{name}: the scale must be a scalar or 1-D, got {tuple(s.shape)}")
    n = len(x.shape)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -n <= axis < n:
        raise ShapeError(f"{name}: axis {axis!r} out of range for input {tuple(x.shape)}")
    ax = int(axis) % n
    if block_size:
        want = list(x.shape)
        want[ax] = -(-x.shape[ax] // block_size)
        if tuple(s.shape) != tuple(want):
            raise ShapeError(f"{name}: blocks of {block_size} along axis {ax} of input "
                             f"{tuple(x.shape)} need a scale of shape {tuple(want)}, got "
                             f"{tuple(s.shape)}")
        return ax
    if x.shape[axis] != s.shape[0]:
        raise ShapeError(f"{name}: {s.shape[0]} scales but input {tuple(x.shape)} has "
                         f"{x.shape[axis]} channels on axis {axis}")
    return ax


def _expand(a, ax, shape, block_size):
    """Scale or zero point ``a`` broadcastable to ``shape`` (per tensor, per channel along
    ``ax`` or, with ``block_size``, repeated over each block of ``ax``)."""
    if block_size:
        return np.repeat(a, block_size, axis=ax).take(range(shape[ax]), axis=ax)
    return along(a, ax, len(shape))


def _q_infer(x, s, z, axis=1, block_size=0, saturate=True):
    if not dtypes.is_float(x.dtype):
        raise DTypeError(f"quantize_linear: expects a floating input, got {x.dtype}")
    if np.dtype(z.dtype) not in QTYPES or np.dtype(z.dtype) == dtypes.int32:
        names = ", ".join(d.name for d in QTYPES if d != dtypes.int32)
        raise DTypeError(f"quantize_linear: the zero point's dtype (the output's) must be one "
                         f"of {names}, got {z.dtype}")
    _channel_axis("quantize_linear", x, s, z, axis, block_size)
    return AVal(tuple(x.shape), np.dtype(z.dtype))


def _q_np(x, s, z, axis=1, block_size=0, saturate=True):
    ax = _channel_axis("quantize_linear", x, s, z, axis, block_size)
    work = np.result_type(x.dtype, s.dtype)
    t = x.astype(work) / _expand(s, ax, x.shape, block_size).astype(work)
    zq = _expand(z, ax, x.shape, block_size).astype(np.float64)
    if z.dtype in INT_QTYPES:
        lo, hi = _qrange(z.dtype)
        return np.clip(np.rint(t) + zq, lo, hi).astype(z.dtype)
    import ml_dtypes

    t = t.astype(np.float64) + zq
    if z.dtype in FLOAT8_QTYPES and saturate:
        m = float(ml_dtypes.finfo(z.dtype).max)
        t = np.clip(t, -m, m)  # NaN stays NaN
    return t.astype(np.float32).astype(z.dtype)  # float4: ml_dtypes saturates by itself


def _dq_infer(q, s, z, axis=1, block_size=0):
    if np.dtype(q.dtype) not in QTYPES:
        names = ", ".join(d.name for d in QTYPES)
        raise DTypeError(f"dequantize_linear: expects data of {names}, got {q.dtype}")
    if q.dtype != z.dtype:
        raise DTypeError(f"dequantize_linear: data {q.dtype} and zero point {z.dtype} differ")
    _channel_axis("dequantize_linear", q, s, z, axis, block_size)
    return AVal(tuple(q.shape), np.dtype(s.dtype))


def _dq_np(q, s, z, axis=1, block_size=0):
    ax = _channel_axis("dequantize_linear", q, s, z, axis, block_size)
    work = np.int64 if q.dtype in INT_QTYPES else np.float32
    diff = q.astype(work) - _expand(z, ax, q.shape, block_size).astype(work)
    return diff.astype(s.dtype) * _expand(s, ax, q.shape, block_size)


QUANTIZE_LINEAR = REGISTRY.get("quantize_linear") or defop(
    "quantize_linear", compute=_q_np, infer=_q_infer, storage=True)
DEQUANTIZE_LINEAR = REGISTRY.get("dequantize_linear") or defop(
    "dequantize_linear", compute=_dq_np, infer=_dq_infer, storage=True)


def quantize_linear(x, scale, zero_point, axis=1, block_size=0, saturate=True):
    """ONNX QuantizeLinear: ``saturate(round(x / scale) + zero_point)`` in the zero point's
    dtype (round half to even); a 1-D scale quantises per channel along ``axis``, and with
    ``block_size`` > 0 each scale covers a block of that many elements along ``axis``. A
    float8 zero point (it must be 0) makes the output float8: ``x / scale`` rounded to it,
    clamped to its finite range when ``saturate``."""
    extra = {k: v for k, v in (("block_size", block_size), ("saturate", saturate))
             if v != {"block_size": 0, "saturate": True}[k]}
    return apply(QUANTIZE_LINEAR, x, scale, zero_point, axis=axis, **extra)


def dequantize_linear(q, scale, zero_point, axis=1, block_size=0):
    """ONNX DequantizeLinear: ``(q - zero_point) * scale`` in the scale's dtype (blocked as
    :func:`quantize_linear` with ``block_size``)."""
    extra = {"block_size": block_size} if block_size else {}
    return apply(DEQUANTIZE_LINEAR, q, scale, zero_point, axis=axis, **extra)


# --- op: fake_quant with a straight-through estimator ---------------------------------------------
def _fq_params(x_shape, scale, zero_point, qmin, qmax, axis):
    """The checked attrs of a fake_quant node as broadcastable float64 arrays."""
    s, z = np.asarray(scale, np.float64), np.asarray(zero_point, np.float64)
    if s.shape != z.shape or s.ndim > 1:
        raise ShapeError(f"fake_quant: scale {s.shape} and zero_point {z.shape} must be one "
                         f"scalar or one vector each")
    if not np.all(s > 0) or not np.all(np.isfinite(s)):
        raise ArgumentError(f"fake_quant: scales must be positive and finite, got {s}")
    if not (isinstance(qmin, (int, np.integer)) and isinstance(qmax, (int, np.integer))
            and qmin < qmax):
        raise ArgumentError(f"fake_quant: needs integers qmin < qmax, got {qmin!r}, {qmax!r}")
    if np.any(z < qmin) or np.any(z > qmax) or np.any(z != np.rint(z)):
        raise ArgumentError(f"fake_quant: zero points {z} must be integers in [{qmin}, {qmax}]")
    n = len(x_shape)
    if s.ndim == 0:
        return s, z
    if axis is None or not -n <= axis < n or x_shape[axis] != s.size:
        raise ShapeError(f"fake_quant: {s.size} channel scales need an axis of that length; "
                         f"input {tuple(x_shape)}, axis {axis!r}")
    return along(s, axis % n, n), along(z, axis % n, n)


def _fq_infer(x, scale, zero_point, qmin, qmax, axis=None):
    if not dtypes.is_float(x.dtype):
        raise DTypeError(f"fake_quant: expects a floating input, got {x.dtype}")
    _fq_params(x.shape, scale, zero_point, qmin, qmax, axis)
    return AVal(tuple(x.shape), x.dtype)


def _fq_np(x, scale, zero_point, qmin, qmax, axis=None):
    s, z = _fq_params(x.shape, scale, zero_point, qmin, qmax, axis)
    q = np.clip(np.rint(x / s.astype(x.dtype)) + z, qmin, qmax)
    return ((q - z) * s).astype(x.dtype)


def _ste_mask_value(g, x, scale, zero_point, qmin, qmax, axis):
    """``g`` where ``x / s`` lies in ``[qmin - z - 1/2, qmax - z + 1/2]`` (the values the clip
    leaves alone), else 0: the clipped straight-through estimator, in framework ops."""
    s, z = _fq_params(x.shape, scale, zero_point, qmin, qmax, axis)
    t = x / s.astype(x.dtype)
    lo = (qmin - z - 0.5).astype(x.dtype)
    hi = (qmax - z + 0.5).astype(x.dtype)
    return where(ge(t, lo), where(le(t, hi), g, 0.0), 0.0)


def _fq_vjp(g, xs, y, needs, scale, zero_point, qmin, qmax, axis=None):
    return (_ste_mask_value(g, xs[0], scale, zero_point, qmin, qmax, axis),)


def _fq_jvp(ts, xs, y, scale, zero_point, qmin, qmax, axis=None):
    if ts[0] is None:
        return None
    return _ste_mask_value(ts[0], xs[0], scale, zero_point, qmin, qmax, axis)


FAKE_QUANT = REGISTRY.get("fake_quant") or defop(
    "fake_quant", compute=_fq_np, infer=_fq_infer, vjp=_fq_vjp, jvp=_fq_jvp, elementwise=True,
    unfusable_reason="its scale, zero point and clip range are attributes (per channel: "
                     "arrays), which a fused elementwise program cannot carry")


def _attr(a, kind):
    a = np.asarray(a)
    return kind(a) if a.ndim == 0 else tuple(kind(v) for v in a.ravel())


def fake_quant(x, qparams):
    """Quantise and dequantise ``x`` (a Tensor) with ``qparams`` in one differentiable op.

    Forward: ``s * (clip(round(x / s) + z, qmin, qmax) - z)``. Backward: the straight-through
    estimator — the rounding is treated as the identity, so the gradient passes unchanged where
    the clip leaves ``x`` alone (``x / s`` within ``[qmin - z - 1/2, qmax - z + 1/2]``) and is
    zero where the value saturates (PyTorch's ``fake_quantize_per_tensor_affine`` rule).
    """
    return apply(FAKE_QUANT, x, scale=_attr(qparams.scale, float),
                 zero_point=_attr(qparams.zero_point, int), qmin=int(qparams.qmin),
                 qmax=int(qparams.qmax), axis=qparams.axis)


def fake_quant_qparams(attrs):
    """The :class:`QParams` of a ``fake_quant`` node's attrs."""
    s = np.asarray(attrs["scale"], np.float64)
    return QParams(s, np.asarray(attrs["zero_point"], np.int64), int(attrs["qmin"]),
                   int(attrs["qmax"]), attrs.get("axis") if s.ndim else None)
