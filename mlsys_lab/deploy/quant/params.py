"""Quantisation arithmetic (book ch. 10): ``q = clip(round(r / s) + z, qmin, qmax)`` (round half
to even, then add the zero point, as ONNX's QuantizeLinear) and back ``r ≈ s (q - z)`` —
:func:`qrange`, :func:`choose_qparams` (symmetric / asymmetric, per tensor / per channel) and
:class:`QParams` (quantise, dequantise, fake-quantise a numpy array)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentError, ShapeError

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
    """How one tensor is quantised: ``q = clip(round(r / scale) + zero_point, qmin, qmax)``,
    ``round`` rounding half to even (ONNX's QuantizeLinear).

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
