"""The CPU GEMM ladder against numpy, and the roofline helpers."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import DTypeError, ShapeError
from mlsys_lab.kernels import cpu, roofline

DTYPES = [np.float32, np.float64]
# float32 sums of up to ~130 terms of N(0,1) products, summed in a different order from BLAS.
TOL = {np.float32: dict(rtol=1e-4, atol=1e-4), np.float64: dict(rtol=1e-10, atol=1e-10)}
SHAPES = [(1, 1, 1), (7, 13, 5), (37, 53, 29), (65, 130, 67), (130, 7, 70), (4, 64, 129)]


def operands(m, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))


def test_ladder_order():
    assert list(cpu.VARIANTS) == ["naive", "loop_order", "tiled", "parallel", "packed"]
    assert cpu.VARIANTS["packed"] is cpu.matmul_packed


@pytest.mark.parametrize("variant", list(cpu.VARIANTS))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_numpy(variant, dtype, m, k, n):
    a, b = operands(m, k, n, dtype)
    c = cpu.matmul(a, b, variant=variant)
    assert c.dtype == dtype and c.shape == (m, n)
    np.testing.assert_allclose(c, a @ b, **TOL[dtype])


@pytest.mark.parametrize("variant", list(cpu.VARIANTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_inputs(variant, dtype):
    a, b = operands(40, 30, 50, dtype, seed=1)
    a_t = np.ascontiguousarray(a.T).T  # Fortran-ordered view of a
    b_strided = np.repeat(b, 2, axis=0)[::2]  # every other row of a (60, 50) array
    assert not a_t.flags.c_contiguous and not b_strided.flags.c_contiguous
    f = cpu.VARIANTS[variant]
    np.testing.assert_allclose(f(a_t, b_strided), a @ b, **TOL[dtype])
    np.testing.assert_allclose(f(b[:, ::3].T, a.T[:, ::2]), b[:, ::3].T @ a.T[:, ::2], **TOL[dtype])


@pytest.mark.parametrize("variant", list(cpu.VARIANTS))
def test_empty_dimensions(variant):
    a, b = operands(0, 3, 4, np.float32)
    assert cpu.VARIANTS[variant](a, b).shape == (0, 4)
    a, b = operands(3, 0, 4, np.float64)
    np.testing.assert_array_equal(cpu.VARIANTS[variant](a, b), np.zeros((3, 4)))


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 70), k=st.integers(1, 70), n=st.integers(1, 70),
    dtype=st.sampled_from(DTYPES), variant=st.sampled_from(list(cpu.VARIANTS)),
    seed=st.integers(0, 2**16),
)
def test_random_shapes(m, k, n, dtype, variant, seed):
    a, b = operands(m, k, n, dtype, seed)
    np.testing.assert_allclose(cpu.matmul(a, b, variant), a @ b, **TOL[dtype])


@pytest.mark.parametrize("variant", list(cpu.VARIANTS))
def test_shape_mismatch(variant):
    a, b = np.ones((3, 4), np.float32), np.ones((5, 2), np.float32)
    with pytest.raises(ShapeError, match=r"matmul.*\(3, 4\).*\(5, 2\)"):
        cpu.VARIANTS[variant](a, b)
    with pytest.raises(ShapeError, match="matmul"):
        cpu.VARIANTS[variant](np.ones(3, np.float32), np.ones((3, 2), np.float32))


@pytest.mark.parametrize("variant", list(cpu.VARIANTS))
def test_dtype_mismatch(variant):
    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float64)
    with pytest.raises(DTypeError, match=f"matmul.*{variant}.*float32.*float64") as info:
        cpu.VARIANTS[variant](a, b)
    assert isinstance(info.value, TypeError)
    with pytest.raises(DTypeError, match="int64"):
        cpu.VARIANTS[variant](np.ones((2, 2), np.int64), np.ones((2, 2), np.int64))


def test_unknown_variant():
    with pytest.raises(ValueError, match="packed"):
        cpu.matmul(np.ones((2, 2)), np.ones((2, 2)), variant="magic")


def test_flops():
    assert cpu.flops(2, 3, 4) == 48


# ------------------------------------------------------------------------------------------------
# Roofline
# ------------------------------------------------------------------------------------------------


def test_tile_intensity():
    assert roofline.tile_intensity(1, 1) == 1
    assert roofline.tile_intensity(4, 4) == 4
    assert roofline.tile_intensity(8, 8) == 8
    assert roofline.tile_intensity(4, 12) == 6


def test_matmul_intensity():
    assert roofline.matmul_intensity(2, 2, 2, dtype_bytes=4) == 16 / 48
    # the book's M=N=2048, K=1024 float32: 2·2048²·1024 / ((2·2048·1024 + 2048²)·4) = 256
    assert roofline.matmul_intensity(2048, 2048, 1024) == pytest.approx(256)


def test_attainable_and_ridge():
    peak, bw = 100e9, 10e9
    assert roofline.ridge_point(peak, bw) == 10
    assert roofline.attainable(2, peak, bw) == 20e9  # below the ridge: memory-bound
    assert roofline.attainable(10, peak, bw) == peak
    assert roofline.attainable(50, peak, bw) == peak  # above the ridge: compute-bound
    np.testing.assert_array_equal(roofline.attainable(np.array([1, 100]), peak, bw), [10e9, peak])


def test_known_peaks():
    rtx = roofline.KNOWN_PEAKS["RTX 3080"]
    assert rtx.fp32_flops == 29767.68e9 and rtx.bandwidth == 760e9
    assert roofline.KNOWN_PEAKS["H100 SXM"].bandwidth == 3.35e12
    assert roofline.KNOWN_PEAKS["H200 SXM"].bandwidth == 4.8e12
    assert roofline.KNOWN_PEAKS["H200 SXM"].fp32_flops == 67e12


def test_measurements_are_positive_and_quick():
    flops = roofline.measure_peak_flops(seconds=0.01, n=64)
    bandwidth = roofline.measure_bandwidth(n_elements=1 << 16, repeats=2)
    for value in (flops, bandwidth):
        assert value > 0 and math.isfinite(value)


def test_roofline_plot():
    from matplotlib.figure import Figure

    points = [("naive", 0.03, 0.5e9), ("packed", 51.2, 80e9)]
    fig = roofline.roofline_plot(points, peak_flops=100e9, bandwidth=20e9, title="test")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and ax.get_title() == "test"
    assert {t.get_text() for t in ax.texts} >= {"naive", "packed"}
