"""Exercise 8.3: compute intensity and the roofline.

Wrong ideas rejected: forgetting the 2 FLOPs per multiply-add halves ``tile_intensity``;
counting C as read and written doubles its bytes; ``max`` instead of ``min``, or peak /
intensity, breaks ``attainable`` on one side of the ridge; fixed answers fail the random sizes
drawn each run.
"""

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    expect_close,
    expect_list,
    plain,
    register,
)

RTX3080_PEAK = 29767.68e9
RTX3080_BW = 760e9


def _tile_sizes(seed):
    rng = np.random.default_rng(8300 + seed)
    return [(1, 1), (4, 4), (8, 8), (4, 8), (3, 1)] + [
        (int(a), int(b)) for a, b in rng.integers(1, 257, size=(4, 2))]


def _gemm_args(seed):
    rng = np.random.default_rng(8310 + seed)
    return [(2048, 2048, 1024, 4), (2048, 2048, 1024, 2), (1, 1, 1, 4)] + [
        (int(m), int(n), int(k), int(rng.choice([1, 2, 4, 8])))
        for m, n, k in rng.integers(1, 5000, size=(4, 3))]


def _roof_args(seed):
    rng = np.random.default_rng(8320 + seed)
    ridge = RTX3080_PEAK / RTX3080_BW
    out = [(i, RTX3080_PEAK, RTX3080_BW) for i in (0.25, 1.0, ridge, 100.0)]
    out.append((10.0, 1e12, 2e11))
    for _ in range(4):
        peak, bw = float(rng.uniform(1e12, 1e14)), float(rng.uniform(1e11, 5e12))
        out.append((float(peak / bw * rng.choice([0.1, 0.5, 2.0, 10.0])), peak, bw))
    return out


def _intensity_tiles_probe(tile_intensity, gemm_bytes, attainable, seed):
    return [plain(tile_intensity(m, n)) for m, n in _tile_sizes(seed)]


def _intensity_bytes_probe(tile_intensity, gemm_bytes, attainable, seed):
    return [plain(gemm_bytes(*args)) for args in _gemm_args(seed)]


def _intensity_roof_probe(tile_intensity, gemm_bytes, attainable, seed):
    return [plain(attainable(*args)) for args in _roof_args(seed)]


def _intensity_book_probe(tile_intensity, gemm_bytes, attainable):
    # An 8×8 float32 thread tile whose every load comes from DRAM, on the book's RTX 3080, and
    # the whole book GEMM (2048×2048×1024, float32) reading A, B and writing C once.
    return plain([attainable(tile_intensity(8, 8) / 4, RTX3080_PEAK, RTX3080_BW),
                   2 * 2048 * 2048 * 1024 / gemm_bytes(2048, 2048, 1024, 4)])


def _intensity_tiles_judge(raw, seed):
    sizes = _tile_sizes(seed)
    for (m, n), got in zip(sizes, expect_list(raw, len(sizes), "tile_intensity")):
        expect_close(got, 2 * m * n / (m + n), f"tile_intensity({m}, {n})", rel=1e-9)


def _intensity_bytes_judge(raw, seed):
    args = _gemm_args(seed)
    for (m, n, k, size), got in zip(args, expect_list(raw, len(args), "gemm_bytes")):
        expect_close(got, (m * k + k * n + m * n) * size, f"gemm_bytes({m}, {n}, {k}, {size})",
                     rel=1e-12)


def _intensity_roof_judge(raw, seed):
    args = _roof_args(seed)
    for (i, peak, bw), got in zip(args, expect_list(raw, len(args), "attainable")):
        expect_close(got, min(peak, i * bw), f"attainable({i:g}, {peak:g}, {bw:g})", rel=1e-9)


def _intensity_book_judge(raw):
    got = expect_list(raw, 2, "the book's numbers")
    expect_close(got[0], 2.0 * RTX3080_BW,
                 "attainable(tile_intensity(8, 8) / 4, 29767.68e9, 760e9)", rel=1e-9)
    expect_close(got[1], 256.0, "2·M·N·K / gemm_bytes(2048, 2048, 1024, 4)", rel=1e-9)


register(
    Exercise(
        id="8.3",
        title="Compute intensity and the roofline",
        target=("tile_intensity", "gemm_bytes", "attainable"),
        task="the roofline arithmetic",
        forbidden=("mlsys_lab.kernels.roofline",),
        cases=(
            Case("tile_intensity(m, n) = 2mn/(m+n)", 1, feedback="2·m·n FLOPs per m + n loads",
                 probe=_intensity_tiles_probe, judge=_intensity_tiles_judge),
            Case("gemm_bytes: A and B read, C written once", 1, feedback="(mk + kn + mn) × bytes",
                 probe=_intensity_bytes_probe, judge=_intensity_bytes_judge),
            Case("attainable = min(peak, I × bandwidth)", 1, feedback="the lower of the two roofs",
                 probe=_intensity_roof_probe, judge=_intensity_roof_judge),
            Case("the book's RTX 3080: 8×8 tile and whole GEMM", 1,
                 feedback="1520 GFLOP/s and 256 FLOP/byte",
                 probe=_intensity_book_probe, judge=_intensity_book_judge),
        ),
    ),
)
