"""The roofline model: how fast can a kernel of a given compute intensity run on a machine?

A kernel doing ``I`` FLOPs per byte it moves from memory cannot run faster than the machine's
peak arithmetic rate, nor faster than memory can feed it (``I × bandwidth``)::

    attainable(I) = min(peak_flops, I × bandwidth)

The two roofs meet at the *ridge point* ``peak_flops / bandwidth``: kernels left of it are
memory-bound, kernels right of it compute-bound. This module measures the two roofs of the
machine it runs on, lists the published roofs of a few GPUs, computes the intensities of GEMM
and of the book's m×n thread tile, and draws the roofline chart.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .. import timing
from ..engine.numba_cache import CACHE


class DevicePeak(NamedTuple):
    """Published peak numbers of one device."""

    fp32_flops: float
    """Peak FP32 FLOP/s (non-tensor-core)."""
    bandwidth: float
    """Peak memory bandwidth in bytes/s."""
    source: str
    """Where the numbers come from."""


KNOWN_PEAKS = {
    "RTX 3080": DevicePeak(29767.68e9, 760e9, "openMLsys ch. 8 (FP32); NVIDIA spec (760 GB/s)"),
    "H100 SXM": DevicePeak(67e12, 3.35e12, "NVIDIA H100 datasheet (SXM5)"),
    "H200 SXM": DevicePeak(67e12, 4.8e12, "NVIDIA H200 datasheet (SXM)"),
}
"""Device name → :class:`DevicePeak` (FP32 FLOP/s, bytes/s, source)."""


# ------------------------------------------------------------------------------------------------
# Arithmetic
# ------------------------------------------------------------------------------------------------


def attainable(intensity, peak_flops, bandwidth):
    """The roofline: ``min(peak_flops, intensity × bandwidth)`` FLOP/s.

    Args:
        intensity: FLOPs per byte (a number or a numpy array).
        peak_flops: the compute roof, FLOP/s.
        bandwidth: the memory roof's slope, bytes/s.

    Returns:
        Attainable FLOP/s, same shape as ``intensity``.
    """
    return np.minimum(peak_flops, np.multiply(intensity, bandwidth))


def ridge_point(peak_flops, bandwidth):
    """The intensity (FLOP/byte) where the roofs meet: ``peak_flops / bandwidth``."""
    return peak_flops / bandwidth


def matmul_intensity(m, n, k, dtype_bytes=4):
    """Compute intensity of a whole (m×k) @ (k×n) GEMM that reads A, B and writes C once.

    ``2·m·n·k / ((m·k + k·n + m·n) · dtype_bytes)`` FLOP/byte: the best any GEMM kernel can do
    against main memory.
    """
    return 2 * m * n * k / ((m * k + k * n + m * n) * dtype_bytes)


def tile_intensity(m, n):
    """Compute intensity of an m×n output tile, in FLOPs per loaded element (the book's ch. 8).

    Per step of k the tile loads m elements of A and n of B and does ``2·m·n`` FLOPs (one
    multiply-add per output), so intensity is ``2mn / (m + n)``: 1 for a 1×1 thread, 4 for 4×4,
    8 for 8×8. Divide by the element size for FLOP/byte.
    """
    return 2 * m * n / (m + n)


# ------------------------------------------------------------------------------------------------
# Measuring this machine
# ------------------------------------------------------------------------------------------------


def measure_peak_flops(seconds=1.0, n=1024, dtype=np.float32):
    """Measure practical peak FLOP/s: the best rate of numpy's (BLAS) n×n matrix product.

    BLAS GEMM at n ≥ 1024 runs close to the cores' arithmetic peak with the threads BLAS uses,
    so it stands in for the compute roof.

    Args:
        seconds: how long to keep repeating the product (at least one timed run is made).
        n: matrix size; small values (e.g. 64) give a quick, lower estimate.
        dtype: element type.

    Returns:
        The best observed FLOP/s.
    """
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    # One untimed warm-up (threads started, pages touched), then repeat for `seconds`.
    best = timing.best_of(np.matmul, a, b, repeats=1, warmup=1, budget=seconds)
    return 2 * n**3 / max(best, 1e-9)


@njit(parallel=True, cache=CACHE)
def _triad(a, b, c, scalar):
    for i in prange(a.shape[0]):
        a[i] = b[i] + scalar * c[i]


def measure_bandwidth(n_elements=1 << 24, repeats=5):
    """Measure memory bandwidth with the STREAM *triad* ``a = b + s·c`` on all cores.

    Three float64 arrays of ``n_elements`` each (3 × 128 MiB by default: far larger than any
    cache); each pass moves ``3 × 8 × n_elements`` bytes (read b and c, write a), the STREAM
    convention.

    Args:
        n_elements: array length; small values give a quick (cache-speed) answer.
        repeats: timed passes after one warm-up pass; the best is kept.

    Returns:
        The best observed bytes/s.
    """
    a = np.zeros(n_elements)
    b = np.ones(n_elements)
    c = np.full(n_elements, 2.0)
    # The untimed warm-up compiles the kernel and touches every page.
    best = timing.best_of(_triad, a, b, c, 3.0, repeats=max(1, repeats), warmup=1)
    return 3 * a.itemsize * n_elements / max(best, 1e-9)


# ------------------------------------------------------------------------------------------------
# The chart
# ------------------------------------------------------------------------------------------------


def roofline_plot(points, peak_flops, bandwidth, ax=None, title="Roofline"):
    """Draw the roofline (log-log) and place kernels on it.

    Args:
        points: iterable of ``(label, intensity FLOP/byte, achieved FLOP/s)``.
        peak_flops: the compute roof, FLOP/s.
        bandwidth: the memory roof's slope, bytes/s.
        ax: matplotlib Axes to draw into; a new figure is made when ``None``.
        title: the axes title.

    Returns:
        The matplotlib Figure holding the chart.
    """
    from matplotlib.figure import Figure

    if ax is None:
        fig = Figure(figsize=(7, 4.5))
        ax = fig.add_subplot()
    else:
        fig = ax.figure
    points = list(points)
    ridge = ridge_point(peak_flops, bandwidth)
    xs = [ridge] + [p[1] for p in points if p[1] > 0]
    lo, hi = min(xs) / 10, max(xs) * 10
    x = np.geomspace(lo, hi, 200)
    ax.loglog(x, attainable(x, peak_flops, bandwidth) / 1e9, color="black", lw=2, label="roofline")
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak_flops / 1e9), textcoords="offset points",
                xytext=(4, -14), fontsize=8, color="grey")
    for label, intensity, achieved in points:
        ax.loglog([intensity], [achieved / 1e9], "o")
        ax.annotate(label, (intensity, achieved / 1e9), textcoords="offset points", xytext=(5, 3),
                    fontsize=8)
    ax.set_xlabel("compute intensity (FLOP/byte)")
    ax.set_ylabel("GFLOP/s")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return fig
