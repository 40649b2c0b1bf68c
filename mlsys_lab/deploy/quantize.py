"""Quantisation (book ch. 10): ``q = clip(round(r / s + z), qmin, qmax)``, back ``r ≈ s (q - z)``.

* the arithmetic — :func:`qrange`, :func:`choose_qparams` (symmetric / asymmetric, per tensor /
  per channel) and :class:`QParams` (quantise, dequantise, fake-quantise a numpy array);
* three registered ops — ``quantize_linear`` and ``dequantize_linear`` (ONNX's QuantizeLinear and
  DequantizeLinear: scale and zero point are tensor inputs, ``axis`` picks the channel axis) and
  ``fake_quant`` (quantise-dequantise in float, with a straight-through gradient, for QAT);
* observers for post-training calibration — :class:`MinMaxObserver` and
  :class:`HistogramObserver` (percentile or KL-divergence clipping over a growing histogram);
* post-training quantisation of a graph — :func:`calibrate` records the activations that feed
  and leave every conv/matmul with a constant weight, :func:`quantize_static` rewrites the graph
  into ONNX's QDQ form (int8 weights per channel, uint8 activations, int32 biases, each with a
  QuantizeLinear/DequantizeLinear pair), optionally with bias correction;
* quantisation-aware training — :func:`prepare_qat` swaps ``Linear``/``Conv2d`` layers for
  fake-quantised ones, :func:`qat_to_qdq` turns the trained model into the same QDQ graph.

:mod:`.int8_kernels` lowers a QDQ graph onto int8 kernels (``qlinear_matmul``, ``qlinear_conv``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import ops
from ..engine import dtypes
from ..engine.dispatch import apply
from ..engine.interpreter import Interpreter
from ..engine.ops_math import ge, le, where
from ..engine.passes.rewrite import Rewriter, graph_pass
from ..engine.registry import REGISTRY, AVal, defop, get
from ..engine.trace import trace
from ..errors import ArgumentError, DTypeError, ShapeError
from ..nn import Module
from ..nn.layers import Conv2d, Linear
from .passes import (
    channel_vector,
    constant_weight,
    output_channel_axis,
    sole_user,
    weight_channel_axis,
)

#: Integer dtypes a quantised tensor is stored in, narrowest first.
QUANT_DTYPES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int32))


# --- ranges and parameters -----------------------------------------------------------------------
def qrange(bits=8, signed=True, narrow=False):
    """The integer range ``(qmin, qmax)`` of a ``bits``-bit type.

    Args:
        bits: 2..32.
        signed: two's complement (``[-2^(b-1), 2^(b-1) - 1]``) or unsigned (``[0, 2^b - 1]``).
        narrow: drop the most negative value of a signed range (``[-127, 127]`` for int8), so
            the range is symmetric about zero (what symmetric weights use).
    """
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 32:
        raise ArgumentError(f"qrange: bits must be an int in [2, 32], got {bits!r}")
    if signed:
        return -(2 ** (bits - 1)) + int(bool(narrow)), 2 ** (bits - 1) - 1
    return 0, 2 ** bits - 1


def storage_dtype(qmin, qmax):
    """The narrowest of int8, uint8, int32 that holds ``[qmin, qmax]``."""
    for dt in QUANT_DTYPES:
        info = np.iinfo(dt)
        if info.min <= qmin and qmax <= info.max:
            return dt
    raise ArgumentError(f"storage_dtype: no int8/uint8/int32 holds [{qmin}, {qmax}]")


def along(a, axis, ndim):
    """A per-channel vector ``a`` shaped to broadcast along ``axis`` of an ``ndim``-d array (a
    scalar stays a scalar)."""
    a = np.asarray(a)
    if a.ndim == 0 or axis is None:
        return a.reshape(()) if a.size == 1 else a
    shape = [1] * ndim
    shape[axis] = a.size
    return a.reshape(shape)


@dataclass(frozen=True)
class QParams:
    """How one tensor is quantised: ``q = clip(round(r / scale) + zero_point, qmin, qmax)``.

    Attributes:
        scale: float64, shape ``()`` (per tensor) or ``(C,)`` (per channel along ``axis``).
        zero_point: int64, the same shape: the integer that stands for real 0 (exactly).
        qmin, qmax: the integer range.
        axis: the channel axis of a per-channel tensor (None: per tensor).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    qmin: int
    qmax: int
    axis: int | None = None

    @property
    def dtype(self):
        """The integer dtype the quantised values are stored in (int8, uint8 or int32)."""
        return storage_dtype(self.qmin, self.qmax)

    @property
    def bits(self):
        return int(np.ceil(np.log2(self.qmax - self.qmin + 1)))

    @property
    def per_channel(self):
        return self.axis is not None

    def _bcast(self, r):
        ndim = np.ndim(r)
        if self.axis is not None and not -ndim <= self.axis < ndim:
            raise ShapeError(f"QParams: axis {self.axis} out of range for a {ndim}-d tensor")
        if self.axis is not None and np.shape(r)[self.axis] != self.scale.size:
            raise ShapeError(f"QParams: {self.scale.size} channel scales but axis {self.axis} "
                             f"of the tensor {np.shape(r)} has {np.shape(r)[self.axis]}")
        axis = None if self.axis is None else self.axis % max(ndim, 1)
        return along(self.scale, axis, ndim), along(self.zero_point, axis, ndim)

    def quantize(self, r):
        """The integers for real values ``r`` (stored in :attr:`dtype`)."""
        s, z = self._bcast(r)
        q = np.rint(np.asarray(r, np.float64) / s) + z
        return np.clip(q, self.qmin, self.qmax).astype(self.dtype)

    def dequantize(self, q, dtype=np.float64):
        """The real values ``scale * (q - zero_point)`` of integers ``q``."""
        s, z = self._bcast(q)
        return ((np.asarray(q, np.int64) - z) * s).astype(dtype)

    def fake_quantize(self, r):
        """``dequantize(quantize(r))`` in ``r``'s dtype: what the quantised model computes."""
        r = np.asarray(r)
        return self.dequantize(self.quantize(r), r.dtype if r.dtype.kind == "f" else np.float64)

    def onnx(self, dtype=np.float32):
        """What a QuantizeLinear/DequantizeLinear node of ONNX takes: ``{"scale": float array,
        "zero_point": array in the storage dtype, "axis": int or None}``."""
        return {"scale": self.scale.astype(dtype), "zero_point": self.zero_point.astype(self.dtype),
                "axis": self.axis}


def choose_qparams(rmin, rmax, bits=8, symmetric=False, signed=None, narrow=None, axis=None):
    """Scale and zero point that map the real range ``[rmin, rmax]`` onto ``bits`` bits.

    The range is first widened to contain 0, so that real 0 (zero padding, ReLU's zeros) is
    represented exactly by the zero point.

    * symmetric: ``s = max(|rmin|, |rmax|) / qmax``, ``z = 0`` (signed types; by default the
      narrow range ``[-qmax, qmax]``);
    * asymmetric: ``s = (rmax - rmin) / (qmax - qmin)``, ``z = round(qmin - rmin / s)``.

    Args:
        rmin, rmax: floats, or arrays of one value per channel (then give ``axis``).
        bits: bits of the integer type.
        symmetric: see above.
        signed: signed integers; default True for symmetric, False (uint8-style) otherwise.
        narrow: drop the most negative integer (default: ``symmetric``).
        axis: the channel axis the per-channel ranges belong to.

    Returns:
        A :class:`QParams`.

    Raises:
        ArgumentError: a range with rmin > rmax or a non-finite bound; a symmetric unsigned
            request; per-channel ranges without an axis.
    """
    lo, hi = np.asarray(rmin, np.float64), np.asarray(rmax, np.float64)
    if lo.shape != hi.shape or not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ArgumentError(f"choose_qparams: rmin {lo} and rmax {hi} must be finite and of "
                            f"one shape")
    if np.any(lo > hi):
        raise ArgumentError(f"choose_qparams: rmin {lo} > rmax {hi}")
    if lo.ndim > 1 or (lo.ndim == 1 and axis is None):
        raise ArgumentError("choose_qparams: per-channel ranges are 1-D and need an axis")
    signed = symmetric if signed is None else bool(signed)
    if symmetric and not signed:
        raise ArgumentError("choose_qparams: symmetric quantisation needs a signed type")
    qmin, qmax = qrange(bits, signed, symmetric if narrow is None else narrow)
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if symmetric:
        scale = np.maximum(-lo, hi) / qmax
        zero = np.zeros(lo.shape, np.int64)
    else:
        scale = (hi - lo) / (qmax - qmin)
    scale = np.where(scale > 0, scale, 1.0)  # an all-zero tensor: any scale represents it
    if not symmetric:
        zero = np.clip(np.rint(qmin - lo / scale), qmin, qmax).astype(np.int64)
    return QParams(scale, zero, qmin, qmax, axis if lo.ndim else None)


def quantize(r, qparams):
    """``clip(round(r / s) + z, qmin, qmax)`` as integers (see :class:`QParams`)."""
    return qparams.quantize(r)


def dequantize(q, qparams, dtype=np.float64):
    """``s * (q - z)``."""
    return qparams.dequantize(q, dtype)


# --- ops: QuantizeLinear / DequantizeLinear ------------------------------------------------------
def _channel_axis(name, x, s, z, axis):
    """The checked axis (None: per tensor) of a Q/DQ node whose data is ``x``."""
    if tuple(s.shape) != tuple(z.shape):
        raise ShapeError(f"{name}: scale {tuple(s.shape)} and zero point {tuple(z.shape)} "
                         f"must have one shape")
    if not dtypes.is_float(s.dtype):
        raise DTypeError(f"{name}: the scale must be floating, got {s.dtype}")
    if len(s.shape) == 0 or tuple(s.shape) == (1,):
        return None
    if len(s.shape) != 1:
        raise ShapeError(f"{name}: the scale must be a scalar or 1-D, got {tuple(s.shape)}")
    n = len(x.shape)
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not -n <= axis < n:
        raise ShapeError(f"{name}: axis {axis!r} out of range for input {tuple(x.shape)}")
    if x.shape[axis] != s.shape[0]:
        raise ShapeError(f"{name}: {s.shape[0]} scales but input {tuple(x.shape)} has "
                         f"{x.shape[axis]} channels on axis {axis}")
    return int(axis) % n


def _q_infer(x, s, z, axis=1):
    if not dtypes.is_float(x.dtype):
        raise DTypeError(f"quantize_linear: expects a floating input, got {x.dtype}")
    if np.dtype(z.dtype) not in QUANT_DTYPES:
        raise DTypeError(f"quantize_linear: the zero point's dtype (the output's) must be one of "
                         f"int8, uint8, int32, got {z.dtype}")
    _channel_axis("quantize_linear", x, s, z, axis)
    return AVal(tuple(x.shape), np.dtype(z.dtype))


def _q_np(x, s, z, axis=1):
    ax = _channel_axis("quantize_linear", x, s, z, axis)
    info = np.iinfo(z.dtype)
    work = np.result_type(x.dtype, s.dtype)
    q = np.rint(x.astype(work) / along(s, ax, x.ndim).astype(work))
    q = q + along(z, ax, x.ndim).astype(np.float64)
    return np.clip(q, info.min, info.max).astype(z.dtype)


def _dq_infer(q, s, z, axis=1):
    if np.dtype(q.dtype) not in QUANT_DTYPES:
        raise DTypeError(f"dequantize_linear: expects int8, uint8 or int32 data, got {q.dtype}")
    if q.dtype != z.dtype:
        raise DTypeError(f"dequantize_linear: data {q.dtype} and zero point {z.dtype} differ")
    _channel_axis("dequantize_linear", q, s, z, axis)
    return AVal(tuple(q.shape), np.dtype(s.dtype))


def _dq_np(q, s, z, axis=1):
    ax = _channel_axis("dequantize_linear", q, s, z, axis)
    diff = q.astype(np.int64) - along(z, ax, q.ndim).astype(np.int64)
    return diff.astype(s.dtype) * along(s, ax, q.ndim)


QUANTIZE_LINEAR = REGISTRY.get("quantize_linear") or defop(
    "quantize_linear", compute=_q_np, infer=_q_infer)
DEQUANTIZE_LINEAR = REGISTRY.get("dequantize_linear") or defop(
    "dequantize_linear", compute=_dq_np, infer=_dq_infer)


def quantize_linear(x, scale, zero_point, axis=1):
    """ONNX QuantizeLinear: ``saturate(round(x / scale) + zero_point)`` in the zero point's
    dtype (round half to even); a 1-D scale quantises per channel along ``axis``."""
    return apply(QUANTIZE_LINEAR, x, scale, zero_point, axis=axis)


def dequantize_linear(q, scale, zero_point, axis=1):
    """ONNX DequantizeLinear: ``(q - zero_point) * scale`` in the scale's dtype."""
    return apply(DEQUANTIZE_LINEAR, q, scale, zero_point, axis=axis)


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


# --- observers ------------------------------------------------------------------------------------
class MinMaxObserver:
    """Records the range of the tensors it sees: global min/max, or an exponential moving
    average of each batch's min/max (``momentum``, as QAT uses for activations).

    Args:
        axis: keep one range per channel along this axis (weights); None: one range.
        momentum: None for the running min/max, else the EMA weight of a new batch.
    """

    def __init__(self, axis=None, momentum=None):
        self.axis, self.momentum = axis, momentum
        self.lo = self.hi = None
        self.count = 0

    def _batch_range(self, x):
        if self.axis is None:
            return np.min(x), np.max(x)
        moved = np.moveaxis(x, self.axis, 0).reshape(x.shape[self.axis], -1)
        return moved.min(axis=1), moved.max(axis=1)

    def update(self, x):
        """Fold the values of ``x`` (array or Tensor) into the recorded range."""
        x = np.asarray(x, np.float64)
        if x.size == 0:
            return self
        if not np.all(np.isfinite(x)):
            raise ArgumentError(f"{type(self).__name__}.update: the tensor has inf or NaN")
        lo, hi = self._batch_range(x)
        if self.lo is None:
            self.lo, self.hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
        elif self.momentum is None:
            self.lo, self.hi = np.minimum(self.lo, lo), np.maximum(self.hi, hi)
        else:
            m = self.momentum
            self.lo, self.hi = (1 - m) * self.lo + m * lo, (1 - m) * self.hi + m * hi
        self.count += 1
        return self

    def range(self, bits=8):
        """The ``(lo, hi)`` range to quantise (``bits`` matters only to subclasses)."""
        if self.lo is None:
            raise ArgumentError(f"{type(self).__name__}: no data observed yet (call update)")
        return self.lo, self.hi

    def qparams(self, bits=8, symmetric=False, signed=None, narrow=None):
        """The :class:`QParams` for the observed range (see :func:`choose_qparams`)."""
        lo, hi = self.range(bits)
        return choose_qparams(lo, hi, bits, symmetric, signed, narrow,
                              self.axis if np.ndim(lo) else None)


class HistogramObserver(MinMaxObserver):
    """Keeps a histogram of the values it sees and clips the range by ``method``:

    * ``"minmax"``: the full range;
    * ``"percentile"``: the ``percentile`` (and ``100 - percentile``) quantile, read from the
      histogram's cumulative counts;
    * ``"kl"``: TensorRT's entropy calibration — the threshold ``t`` on ``|x|`` whose clipped
      distribution, merged into the quantiser's levels, loses the least information (minimum
      KL divergence ``KL(P || Q)``), see :func:`kl_threshold`.

    The histogram covers ``[-A, A]`` with ``bins`` equal bins (``bins`` even, zero on a bin
    edge). When a batch exceeds ``A``, the range grows by an integer factor ``k`` and every ``k``
    old bins merge into one new bin, exactly.
    """

    METHODS = ("minmax", "percentile", "kl")

    def __init__(self, method="kl", bins=2048, percentile=99.99):
        super().__init__()
        if method not in self.METHODS:
            raise ArgumentError(f"HistogramObserver: method must be one of {self.METHODS}, got "
                                f"{method!r}")
        if not isinstance(bins, (int, np.integer)) or bins < 16 or bins % 2:
            raise ArgumentError(f"HistogramObserver: bins must be an even int >= 16, got {bins!r}")
        if not 50.0 < percentile <= 100.0:
            raise ArgumentError(f"HistogramObserver: percentile must be in (50, 100], got "
                                f"{percentile!r}")
        self.method, self.bins, self.percentile = method, int(bins), float(percentile)
        self.counts = np.zeros(self.bins, np.int64)
        self.limit = 0.0  # A

    @property
    def edges(self):
        """The bin edges, ``bins + 1`` values from ``-A`` to ``A``."""
        return np.linspace(-self.limit, self.limit, self.bins + 1)

    def update(self, x):
        x = np.asarray(x, np.float64).ravel()
        super().update(x)
        if x.size == 0:
            return self
        amax = float(np.max(np.abs(x)))
        if amax > self.limit:
            self._grow(amax)
        if self.limit > 0:
            self.counts += np.histogram(x, self.bins, (-self.limit, self.limit))[0]
        return self

    def _grow(self, amax):
        if self.limit == 0.0:
            self.limit = amax
            return
        k = int(np.ceil(amax / self.limit))
        half = self.bins // 2
        # bin i covers [(i - half) w, (i - half + 1) w): the new bin is floor((i - half) / k)
        new = np.zeros_like(self.counts)
        np.add.at(new, half + np.floor_divide(np.arange(self.bins) - half, k), self.counts)
        self.counts, self.limit = new, self.limit * k

    def abs_histogram(self):
        """``(counts, width)``: the histogram of ``|x|`` over ``bins / 2`` bins from 0 to A."""
        half = self.bins // 2
        return self.counts[half:] + self.counts[:half][::-1], self.limit / half

    def range(self, bits=8):
        lo, hi = super().range(bits)
        if self.method == "minmax" or self.limit == 0:
            return lo, hi
        if self.method == "percentile":
            cdf = np.cumsum(self.counts) / self.counts.sum()
            edges = self.edges
            p = self.percentile / 100.0
            top = float(np.interp(p, cdf, edges[1:]))
            bottom = float(np.interp(1.0 - p, cdf, edges[1:]))
            return max(float(lo), bottom), min(float(hi), top)
        counts, width = self.abs_histogram()
        signed = float(lo) < 0
        levels = 2 ** (bits - 1) if signed else 2 ** bits
        t = kl_threshold(counts, width, levels)
        return max(float(lo), -t), min(float(hi), t)


def kl_threshold(counts, width, levels=128):
    """The clipping threshold of minimum KL divergence (TensorRT's entropy calibration).

    For each candidate ``i`` (``levels <= i <= len(counts)`` bins): ``P`` is the first ``i``
    bins with every count beyond added to the last one (clipping), ``Q`` is ``P``'s first ``i``
    bins merged into ``levels`` groups, each group's mass spread evenly over its non-empty bins
    (what the quantiser can represent). The ``i`` of least ``KL(P || Q)`` gives ``t = i * width``.

    Args:
        counts: histogram of ``|x|`` from 0, one count per bin.
        width: the bin width.
        levels: quantisation levels available on ``[0, t]``.

    Returns:
        The threshold ``t`` (a float).
    """
    counts = np.asarray(counts, np.float64)
    n = len(counts)
    if n <= levels or counts.sum() == 0:
        return float(n * width)
    best_i, best_kl = n, np.inf
    tail = np.cumsum(counts[::-1])[::-1]  # tail[i] = sum(counts[i:])
    for i in range(levels, n + 1):
        p = counts[:i].copy()
        if i < n:
            p[-1] += tail[i]
        q = _merged(counts[:i], levels)
        kl = _kl(p, q)
        if kl < best_kl:
            best_i, best_kl = i, kl
    return float(best_i * width)


def _merged(hist, levels):
    """``hist`` merged into ``levels`` groups, each group's mass spread over its non-empty bins."""
    group = (np.arange(len(hist)) * levels) // len(hist)
    nonzero = hist > 0
    mass = np.bincount(group, weights=hist, minlength=levels)
    filled = np.bincount(group, weights=nonzero, minlength=levels)
    per_bin = np.divide(mass, filled, out=np.zeros(levels), where=filled > 0)
    return np.where(nonzero, per_bin[group], 0.0)


def _kl(p, q, eps=1e-4):
    """``KL(p || q)`` of two histograms after normalising; a bin where ``q`` is empty but ``p``
    is not costs as if ``q`` held ``eps`` of its mass there (TensorRT's smoothing)."""
    p = p / p.sum()
    q = q / q.sum()
    q = np.where((q == 0) & (p > 0), eps, q)
    mask = p > 0
    return float(np.sum(p[mask] * np.log(p[mask] / q[mask])))


def observer(method="minmax", axis=None, **options):
    """A fresh observer for calibration: ``"minmax"`` (:class:`MinMaxObserver`, optionally per
    channel along ``axis``), ``"percentile"`` or ``"kl"`` (:class:`HistogramObserver`)."""
    if method == "minmax":
        return MinMaxObserver(axis, options.get("momentum"))
    if axis is not None:
        raise ArgumentError(f"observer: {method!r} calibration is per tensor (axis=None)")
    return HistogramObserver(method, **options)


# --- post-training quantisation of a graph --------------------------------------------------
@dataclass
class LinearSite:
    """A conv2d or matmul with a constant weight, and what the quantiser folds around it.

    Attributes:
        main: the ``conv2d`` / ``matmul`` node.
        root: the activation it reads, before any view ops (``reshape``, ``transpose``).
        views: those view nodes, from ``root`` to ``main``'s input.
        bias_add: the ``add`` of a per-channel constant right after it, or None.
        bias: that constant as one float64 value per output channel, or None.
        relu: a ``relu`` right after (the bias), or None.
    """

    main: object
    root: object
    views: tuple
    bias_add: object
    bias: np.ndarray | None
    relu: object

    @property
    def out(self):
        """The block's result, where its output is quantised."""
        return (self.relu or self.bias_add or self.main).output


def _view_root(value):
    views = []
    while value.producer is not None and get(value.producer.op).view is not None:
        views.insert(0, value.producer)
        value = value.producer.inputs[0]
    return value, tuple(views)


def linear_sites(graph):
    """Every :class:`LinearSite` of ``graph``, in node order."""
    outs = set(map(id, graph.outputs))
    sites = []
    for n in graph.nodes:
        if constant_weight(graph, n) is None:
            continue
        root, views = _view_root(n.inputs[0])
        v, add, bias = n.output, sole_user(n.output, outs), None
        if add is not None and add.op == "add" and add.output.aval == v.aval \
                and add.inputs[0] is not add.inputs[1]:
            other = add.inputs[1] if add.inputs[0] is v else add.inputs[0]
            arr = graph.consts.get(other)
            bias = None if arr is None else channel_vector(arr, v.shape, output_channel_axis(n))
        if bias is None:
            add = None
        else:
            v = add.output
        relu = sole_user(v, outs)
        relu = relu if relu is not None and relu.op == "relu" else None
        sites.append(LinearSite(n, root, views, add, bias, relu))
    return sites


@dataclass
class Calibration:
    """What :func:`calibrate` recorded.

    Attributes:
        observers: value name -> observer of each activation to quantise (every site's input
            root and result).
        input_means: main node's output name -> the mean of its input per channel (for bias
            correction).
        batches: how many batches were seen.
    """

    observers: dict
    input_means: dict
    batches: int = 0


def _channel_mean(x, node):
    axis = 1 if node.op == "conv2d" else x.ndim - 1
    return np.moveaxis(np.asarray(x, np.float64), axis, 0).reshape(x.shape[axis], -1).mean(1)


def calibrate(graph, batches, method="minmax", **options):
    """Run ``graph`` on calibration ``batches`` and record the range of every activation the
    quantiser will quantise.

    Args:
        graph: a float inference graph (after :func:`~.passes.fold_batch_norm`).
        batches: an iterable of inputs (an array, or a tuple of arrays for several inputs).
        method: ``"minmax"``, ``"percentile"`` or ``"kl"`` (see :func:`observer`).
        options: passed to each observer (``bins``, ``percentile``).

    Returns:
        A :class:`Calibration`.
    """
    sites = linear_sites(graph)
    if not sites:
        raise ArgumentError(f"calibrate: {graph.name} has no conv2d/matmul with a constant weight "
                            f"to quantise")
    watched = {}
    for s in sites:
        watched.setdefault(s.root.name, s.root)
        watched.setdefault(s.out.name, s.out)
    cal = Calibration({name: observer(method, **options) for name in watched}, {})
    sums = {}
    run = Interpreter(graph, free=False)
    for batch in batches:
        run.run(*(batch if isinstance(batch, tuple) else (batch,)))
        for name, v in watched.items():
            cal.observers[name].update(run.env[id(v)])
        for s in sites:
            m = _channel_mean(run.env[id(s.main.inputs[0])], s.main)
            total, k = sums.get(s.main.output.name, (0.0, 0))
            sums[s.main.output.name] = (total + m, k + 1)
        cal.batches += 1
    if not cal.batches:
        raise ArgumentError("calibrate: no calibration batches")
    cal.input_means = {k: total / n for k, (total, n) in sums.items()}
    return cal


def weight_qparams(w, node, bits=8, per_channel=True):
    """Symmetric (narrow-range, signed) qparams of a conv/matmul weight ``w``: one scale per
    output channel (axis 0 of OIHW, axis 1 of a (K, N) matmul weight) or one in all."""
    axis = weight_channel_axis(node) if per_channel else None
    return MinMaxObserver(axis).update(w).qparams(bits, symmetric=True)


def bias_shift(w, w_hat, mean, node):
    """How much quantising ``w`` to ``w_hat`` moves the layer's mean output, per channel:
    ``E[x] · (w_hat - w)`` for an input whose per-channel mean is ``mean``. For a convolution,
    the response to a constant image of those means (borders aside)."""
    dw = w_hat.astype(np.float64) - w.astype(np.float64)
    if node.op == "matmul":
        return mean @ dw
    attrs = node.attrs
    dil = attrs.get("dilation", (1, 1))
    size = [d * (k - 1) + 1 for d, k in zip(dil, dw.shape[2:])]
    image = np.broadcast_to(mean[None, :, None, None], (1, len(mean), *size))
    extra = {k: attrs[k] for k in ("dilation", "groups") if k in attrs}
    shift = get("conv2d").compute(np.ascontiguousarray(image), dw, stride=(1, 1),
                                  padding=(0, 0), **extra)
    return np.asarray(shift).reshape(-1)


def quantize_static(graph, calibration=None, weight_bits=8, act_bits=8, per_channel=True,
                    act_symmetric=False, bias_correction=False):
    """Rewrite a float graph into ONNX's QDQ form: each conv/matmul with a constant weight reads
    ``dequantize_linear(int8 weight)``, its activations pass through a ``quantize_linear`` /
    ``dequantize_linear`` pair, and its bias becomes an int32 tensor of scale ``s_x * s_w``.

    The QDQ graph computes in float what the int8 model computes (up to float rounding), so it
    measures the accuracy of quantisation; :func:`~.int8_kernels.lower_qdq` turns it into the
    int8 kernels, and an ONNX exporter writes its Q/DQ nodes as they are.

    Args:
        graph: the float inference graph that was calibrated.
        calibration: a :class:`Calibration` of ``graph`` (needed unless ``act_bits`` is None and
            no bias correction is asked for).
        weight_bits: bits of the symmetric weights.
        act_bits: bits of the activations; None quantises only the weights.
        per_channel: one weight scale per output channel (else one per tensor).
        act_symmetric: signed symmetric activations (int8) instead of asymmetric uint8.
        bias_correction: subtract from each bias the shift ``E[x]·(Ŵ - W)`` that weight
            rounding puts on the mean output (Nagel et al.'s empirical bias correction with the
            calibration means).

    Returns:
        The QDQ :class:`~mlsys_lab.engine.graph.Graph` (the input graph is unchanged).
    """
    if calibration is None and (act_bits is not None or bias_correction):
        raise ArgumentError("quantize_static: activations and bias correction need a "
                            "calibration (see calibrate)")
    sites = linear_sites(graph)
    by_main = {id(s.main): s for s in sites}
    by_add = {id(s.bias_add): s for s in sites if s.bias_add is not None}
    act = {} if act_bits is None else {
        name: ob.qparams(act_bits, act_symmetric) for name, ob in calibration.observers.items()}
    rw = Rewriter(graph)
    done = set()

    def qdq(old):
        if old.name not in act or id(old) in done:
            return
        done.add(id(old))
        rw.bind(old, _emit_qdq(rw, rw[old], act[old.name]))

    for v in graph.inputs:
        qdq(v)
    weights = {}
    for n in graph.nodes:
        site = by_main.get(id(n)) or by_add.get(id(n))
        if site is not None and site.main is n:
            weights[id(n)] = _emit_weight_site(rw, graph, site, weight_bits, per_channel,
                                               act, calibration, bias_correction)
        elif site is not None:
            _emit_bias(rw, site, weights[id(site.main)], act)
        else:
            rw.copy(n)
        for o in n.outputs:
            qdq(o)
    return rw.build()


def _emit_qdq(rw, value, qp):
    """``dequantize_linear(quantize_linear(value))`` with ``qp``; returns the DQ value."""
    p = qp.onnx(value.dtype)
    s, z = rw.const(p["scale"]), rw.const(p["zero_point"])
    axis = {"axis": qp.axis if qp.axis is not None else 1}
    q = rw.emit("quantize_linear", [value, s, z], axis, name=f"{value.name}_q")
    return rw.emit("dequantize_linear", [q, s, z], axis, name=f"{value.name}_dq")


def _dq_const(rw, q_array, qp, dtype, name):
    p = qp.onnx(dtype)
    axis = {"axis": qp.axis if qp.axis is not None else 1}
    return rw.emit("dequantize_linear", [rw.const(q_array, name=f"{name}_q"),
                                         rw.const(p["scale"]), rw.const(p["zero_point"])],
                   axis, name=f"{name}_dq")


def _emit_weight_site(rw, graph, site, bits, per_channel, act, calibration, correct):
    """Emit the weight's DQ and the conv/matmul; returns ``(weight qparams, bias vector)``."""
    n = site.main
    w = graph.consts[n.inputs[1]]
    wq = weight_qparams(w, n, bits, per_channel)
    w_int = wq.quantize(w)
    wd = _dq_const(rw, w_int, wq, w.dtype, n.inputs[1].name)
    rw.maybe_dead(rw[n.inputs[1]])
    y = rw.emit(n.op, [rw[n.inputs[0]], wd], n.attrs, name=n.output.name, source=n.source)
    bias = site.bias
    if correct:
        shift = bias_shift(w, wq.dequantize(w_int), calibration.input_means[n.output.name], n)
        bias = (0.0 if bias is None else bias) - shift
    rw.bind(n.output, y)
    if site.bias_add is None and bias is not None:  # bias correction made a bias
        rw.bind(n.output, _emit_bias_value(rw, site, y, bias, wq, act))
    return wq, bias


def _emit_bias(rw, site, weight_info, act):
    wq, bias = weight_info
    add = site.bias_add
    other = add.inputs[1] if add.inputs[0] is site.main.output else add.inputs[0]
    rw.maybe_dead(rw[other])
    rw.bind(add.output, _emit_bias_value(rw, site, rw[site.main.output], bias, wq, act,
                                         name=add.output.name))


def _bias_shape(node, c):
    return (1, c, 1, 1) if node.op == "conv2d" else (c,)


def _emit_bias_value(rw, site, y, bias, wq, act, name=None):
    """``y + bias``, the bias an int32 tensor of scale ``s_x * s_w`` behind a DQ when the input
    is quantised, else a float constant."""
    n = site.main
    shape = _bias_shape(n, len(bias))
    xq = act.get(site.root.name)
    if xq is None:
        b = rw.const(np.asarray(bias).reshape(shape).astype(y.dtype))
    else:
        bq = bias_qparams(xq, wq, len(bias), axis=1 if n.op == "conv2d" else 0)
        b = _dq_const(rw, bq.quantize(np.asarray(bias).reshape(shape)), bq, y.dtype,
                      f"{n.output.name}_bias")
    return rw.emit("add", [y, b], name=name, source=n.source)


def bias_qparams(x_qparams, w_qparams, channels, axis=0):
    """The int32 qparams of a bias added to a conv/matmul of those input and weight qparams:
    scale ``s_x * s_w`` per channel, zero point 0 — the accumulator's own units."""
    scale = np.broadcast_to(float(x_qparams.scale) * w_qparams.scale, (channels,)).copy()
    qmin, qmax = qrange(32, signed=True)
    return QParams(scale, np.zeros(channels, np.int64), qmin, qmax, axis)


def post_training_quantize(graph, batches, method="minmax", bias_correction=False, **options):
    """:func:`calibrate` on ``batches`` with ``method``, then :func:`quantize_static`
    (``options``: its keyword arguments). Returns the QDQ graph."""
    cal = calibrate(graph, batches, method)
    return quantize_static(graph, cal, bias_correction=bias_correction, **options)


def qdq_tensors(graph):
    """Every quantised tensor of a QDQ (or lowered int8) graph, for an exporter or a table:
    a list of ``{"node", "op", "tensor", "scale", "zero_point", "dtype", "axis"}`` dicts, one
    per ``quantize_linear`` / ``dequantize_linear`` node (``tensor`` is the name of its data
    input; scale and zero point are the constant arrays)."""
    rows = []
    for n in graph.nodes:
        if n.op not in ("quantize_linear", "dequantize_linear"):
            continue
        s, z = graph.consts.get(n.inputs[1]), graph.consts.get(n.inputs[2])
        rows.append({"node": n.output.name, "op": n.op, "tensor": n.inputs[0].name,
                     "scale": s, "zero_point": z, "dtype": np.dtype(n.inputs[2].dtype).name,
                     "axis": n.attrs.get("axis") if s is not None and s.ndim else None})
    return rows


def model_bytes(graph):
    """Bytes of the graph's constants (its weights, quantised or not)."""
    return int(sum(a.nbytes for a in graph.consts.values()))


@graph_pass
def fake_quant_to_qdq(graph):
    """Replace each ``fake_quant`` node by what it means in ONNX: ``dequantize_linear`` of the
    quantised constant (a weight), or a ``quantize_linear`` / ``dequantize_linear`` pair (an
    activation, whose clip range must then be the whole storage type, as ONNX's Q saturates
    there)."""
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op != "fake_quant":
            rw.copy(n)
            continue
        qp = fake_quant_qparams(n.attrs)
        x = n.inputs[0]
        if x in graph.consts:
            rw.maybe_dead(rw[x])
            rw.bind(n.output, _dq_const(rw, qp.quantize(graph.consts[x]), qp, x.dtype,
                                        n.output.name))
            continue
        info = np.iinfo(qp.dtype)
        if (qp.qmin, qp.qmax) != (info.min, info.max):
            raise ArgumentError(f"fake_quant_to_qdq: node {n.output.name} clips to "
                                f"[{qp.qmin}, {qp.qmax}], which a {qp.dtype.name} "
                                f"QuantizeLinear cannot express (use 8-bit activations)")
        rw.bind(n.output, _emit_qdq(rw, rw[x], qp))
    return rw.build()


# --- quantisation-aware training ------------------------------------------------------------
class FakeQuantize(Module):
    """Fake-quantises its input: in training, first records the batch's range (an exponential
    moving average of min/max, ``momentum``), then applies ``fake_quant`` with the qparams of
    the recorded range. In eval mode (and while tracing) it uses the range recorded last.

    Args:
        bits: quantisation bits.
        symmetric: signed symmetric instead of asymmetric unsigned.
        momentum: EMA weight of each new batch's range.
    """

    def __init__(self, bits=8, symmetric=False, momentum=0.1):
        super().__init__()
        self.bits, self.symmetric = bits, symmetric
        self.observer = MinMaxObserver(momentum=momentum)

    def forward(self, x):
        if self.training and not x.is_tracer:
            self.observer.update(x.numpy())
        return fake_quant(x, self.qparams())

    def qparams(self):
        """The qparams of the range recorded so far."""
        return self.observer.qparams(self.bits, self.symmetric)

    def extra_repr(self):
        return f"bits={self.bits}, symmetric={self.symmetric}"


def _weight_fake_quant(weight, node_kind, bits):
    """The weight fake-quantised per output channel, symmetric, from its current range."""
    axis = 0 if node_kind == "conv2d" else 1
    w = weight.numpy()
    qp = MinMaxObserver(axis).update(w).qparams(bits, symmetric=True)
    return fake_quant(weight, qp)


class QATLinear(Module):
    """``Linear`` with fake-quantised input and weight; shares the layer's Parameters.

    While :func:`qat_to_qdq` traces the model (``exporting`` set), the weight stays float and
    is quantised afterwards to int8 with the same qparams, so it leaves as an int8 constant.
    """

    def __init__(self, linear, weight_bits=8, act_bits=8):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        self.weight_bits = weight_bits
        self.act = FakeQuantize(act_bits)
        self.exporting = False

    def forward(self, x):
        w = self.weight if self.exporting else \
            _weight_fake_quant(self.weight, "matmul", self.weight_bits)
        y = ops.matmul(self.act(x), w)
        return y + self.bias if self.bias is not None else y


class QATConv2d(Module):
    """``Conv2d`` with fake-quantised input and weight; shares the layer's Parameters (see
    :class:`QATLinear` for ``exporting``)."""

    def __init__(self, conv, weight_bits=8, act_bits=8):
        super().__init__()
        self.weight, self.bias = conv.weight, conv.bias
        self.stride, self.padding = conv.stride, conv.padding
        self.dilation, self.groups = getattr(conv, "dilation", 1), getattr(conv, "groups", 1)
        self.weight_bits = weight_bits
        self.act = FakeQuantize(act_bits)
        self.exporting = False

    def forward(self, x):
        w = self.weight if self.exporting else \
            _weight_fake_quant(self.weight, "conv2d", self.weight_bits)
        return ops.conv2d(self.act(x), w, self.bias, self.stride, self.padding, self.dilation,
                          self.groups)


class QATModel(Module):
    """A model prepared for QAT, and the fake-quantiser of its output (the logits)."""

    def __init__(self, model, act_bits=8):
        super().__init__()
        self.model = model
        self.output = FakeQuantize(act_bits)

    def forward(self, x):
        return self.output(self.model(x))


def prepare_qat(model, weight_bits=8, act_bits=8):
    """Make ``model`` quantisation-aware: each ``nn.Linear`` / ``nn.Conv2d`` inside it is
    replaced, in place, by :class:`QATLinear` / :class:`QATConv2d` (the same Parameters, so an
    optimiser on ``model.parameters()`` keeps training them), and the returned
    :class:`QATModel` fake-quantises the output too. Fold batch norms first (QAT here has no
    BN of its own).

    Returns:
        The :class:`QATModel` to train (then convert with :func:`qat_to_qdq`).
    """
    replaced = 0
    for parent in list(model.modules()):
        names = [name for name, _ in parent.named_children()]
        for name in names:
            child = getattr(parent, name)
            if isinstance(child, Linear):
                setattr(parent, name, QATLinear(child, weight_bits, act_bits))
                replaced += 1
            elif isinstance(child, Conv2d):
                setattr(parent, name, QATConv2d(child, weight_bits, act_bits))
                replaced += 1
        for name in names:  # re-assign in order: a Sequential runs its children in that order
            setattr(parent, name, getattr(parent, name))
    if not replaced:
        raise ArgumentError(f"prepare_qat: {type(model).__name__} holds no Linear or Conv2d "
                            f"layer inside a container to make quantisation-aware")
    return QATModel(model, act_bits)


def qat_to_qdq(qat_model, *example_inputs):
    """The QDQ inference graph of a trained :class:`QATModel`: traced in eval mode with float
    weights, each activation ``fake_quant`` (with the ranges learned in training) turned into
    a Q/DQ pair (:func:`fake_quant_to_qdq`), then each weight quantised to an int8 constant
    with the qparams training used (per channel, symmetric, from its range)."""
    layers = [m for m in qat_model.modules() if isinstance(m, (QATLinear, QATConv2d))]
    bits = {m.weight_bits for m in layers}
    if len(bits) != 1:
        raise ArgumentError(f"qat_to_qdq: the layers use different weight bits {sorted(bits)}")
    qat_model.eval()
    for m in layers:
        m.exporting = True
    try:
        graph = trace(qat_model, *example_inputs, name="qat")
    finally:
        for m in layers:
            m.exporting = False
    return quantize_static(fake_quant_to_qdq(graph), weight_bits=bits.pop(), act_bits=None)


__all__ = ["QParams", "qrange", "storage_dtype", "choose_qparams", "quantize", "dequantize",
           "quantize_linear", "dequantize_linear", "fake_quant", "fake_quant_qparams",
           "MinMaxObserver", "HistogramObserver", "kl_threshold", "observer", "along",
           "LinearSite", "linear_sites", "Calibration", "calibrate", "weight_qparams",
           "bias_shift", "bias_qparams", "quantize_static", "post_training_quantize",
           "qdq_tensors", "model_bytes", "fake_quant_to_qdq", "FakeQuantize", "QATLinear",
           "QATConv2d", "QATModel", "prepare_qat", "qat_to_qdq"]
