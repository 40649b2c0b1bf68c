"""The book's GPU matmul table (section 8.4, RTX 3080) and the results files measured beside it.

``benchmarks/matmul_gpu.py`` runs the CUDA ladder of :mod:`.cuda` on a real GPU and writes a JSON
results file; chapter 8 reads it with :func:`load_gpu_results` and shows :func:`results_table`,
the book's numbers next to ours, labelled with :func:`results_header`.
"""

import datetime as _dt
import json
from pathlib import Path
from typing import NamedTuple

# --------------------------------------------------------------------------------------------
# The book's reference numbers
# --------------------------------------------------------------------------------------------


class BookRow(NamedTuple):
    """One row of the book's RTX 3080 table (M = N = 2048, K = 1024)."""

    variant: str
    step: str
    ms: float
    gflops: float


BOOK_RTX3080 = (
    BookRow("naive", "naive", 48.961, 185.313),
    BookRow("thread_tile", "128-bit loads, 4×4 thread tile", 6.232, 1378.317),
    BookRow("block_tile", "bigger thread tile (128×128×16 block tile)", 3.188, 2694.440),
    BookRow("shared", "shared-memory tiling", 0.617, 13925.168),
    BookRow("shared_transposed", "transposed A tile", 0.610, 14083.116),
    BookRow("shared_prefetch", "hide shared-memory latency", 0.585, 14686.179),
    BookRow("double_buffer", "hide global-memory latency (final)", 0.542, 15838.302),
    BookRow("cublas", "cuBLAS", 0.613, 14002.600),
)
"""The book's table, as printed. (Its naive row is not self-consistent: 48.961 ms for
2·2048·2048·1024 flops is 175.4 GFLOPS, not 185.313; the other rows agree to < 0.1 %.)"""

BOOK_RTX3080_PEAK_GFLOPS = 29767.68
"""RTX 3080 FP32 peak, as given by the book."""

BOOK_SHAPE = (2048, 2048, 1024)
"""(M, N, K) of the book's measurements."""


# --------------------------------------------------------------------------------------------
# Measured results beside the book's
# --------------------------------------------------------------------------------------------

RESULTS_KEYS = ("device", "date", "numba_version", "rows")


def load_gpu_results(path):
    """Read a results file written by ``benchmarks/matmul_gpu.py``.

    The file is JSON: ``device`` (name), ``date`` (ISO 8601), ``numba_version``, optional
    ``reference`` (what cuBLAS was reached through, or null), and ``rows``, one per
    (variant, shape): ``variant`` (a ``VARIANTS`` key or ``"cublas"``), ``m``, ``n``, ``k``,
    ``ms`` (median), ``gflops``, ``ratio_to_cublas`` (or null) and ``max_rel_error``.

    Raises:
        ValueError: a required key is missing.
    """
    data = json.loads(Path(path).read_text())
    missing = [key for key in RESULTS_KEYS if key not in data]
    if missing:
        raise ValueError(f"{path}: not a GPU matmul results file (missing {missing})")
    for row in data["rows"]:
        for key in ("variant", "m", "n", "k", "ms", "gflops"):
            if key not in row:
                raise ValueError(f"{path}: row {row} lacks {key!r}")
    return data


def results_table(results=None, shape=BOOK_SHAPE):
    """The book's RTX 3080 table with measured numbers beside it.

    Args:
        results: a dict from ``load_gpu_results`` (or None for the book's columns only).
        shape: the (M, N, K) whose measured rows to show; the book's is (2048, 2048, 1024).

    Returns:
        A list of dicts, one per book row in order: ``variant``, ``step``, ``book_ms``,
        ``book_gflops``, ``book_pct_peak``, and — when ``results`` has that variant at
        ``shape`` — ``ms``, ``gflops``, ``ratio_to_cublas`` (else None).
    """
    measured = {}
    if results is not None:
        m, n, k = shape
        measured = {r["variant"]: r for r in results["rows"]
                    if (r["m"], r["n"], r["k"]) == (m, n, k)}
    rows = []
    for book in BOOK_RTX3080:
        got = measured.get(book.variant, {})
        rows.append({
            "variant": book.variant,
            "step": book.step,
            "book_ms": book.ms,
            "book_gflops": book.gflops,
            "book_pct_peak": round(100 * book.gflops / BOOK_RTX3080_PEAK_GFLOPS, 1),
            "ms": got.get("ms"),
            "gflops": got.get("gflops"),
            "ratio_to_cublas": got.get("ratio_to_cublas"),
        })
    return rows


def results_header(results) -> str:
    """One line naming where and when ``results`` were measured, for a notebook caption."""
    date = results["date"]
    try:
        date = _dt.datetime.fromisoformat(date).date().isoformat()
    except ValueError:
        pass
    return f"measured on {results['device']}, {date}, numba {results['numba_version']}"
