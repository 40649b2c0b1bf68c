"""Observers for calibration: :class:`MinMaxObserver` (running or EMA range, per tensor or per
channel) and :class:`HistogramObserver` (percentile or KL-divergence clipping over a growing
histogram, :func:`kl_threshold`)."""

from __future__ import annotations

import numpy as np

from ...errors import ArgumentError
from .params import choose_qparams


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
