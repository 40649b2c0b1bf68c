"""The CPU GEMM ladder against numpy, the packed rung's configurations, and the roofline."""

import math
import os
import platform
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError, UnknownNameError
from mlsys_lab.kernels import cpu, cpu_config, roofline
from mlsys_lab.kernels.cpu_config import Blocking, CacheSizes, NumbaTarget

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
# The packed rung's configurations: every one forced on this machine, against numpy
# ------------------------------------------------------------------------------------------------

CONFIGS = list(cpu_config.CONFIGS)
AWKWARD = [(1, 1, 1), (5, 3, 7), (13, 17, 33), (37, 65, 29), (97, 130, 101)]


def tiny_blocking(config, dtype, kc=8):
    """Blocks of one or two tiles, so small matrices cross many KC, MC and NC edges."""
    mr, nr = cpu_config.CONFIGS[config].tile(dtype)
    return Blocking(mr, nr, kc=kc, mc=2 * mr, nc=nr)


def test_three_configurations_fit_their_registers():
    assert set(CONFIGS) >= {"avx512", "avx2", "portable"}
    for config in cpu_config.CONFIGS.values():
        assert config.registers_needed <= config.registers, config
    avx2 = cpu_config.CONFIGS["avx2"]
    assert avx2.tile(np.float32) == (6, 16) and avx2.tile(np.float64) == (6, 8)
    assert avx2.accumulators == 12 and avx2.lanes(np.float32) == 8
    assert cpu_config.CONFIGS["avx512"].lanes(np.float32) == 16
    assert cpu_config.CONFIGS["portable"].lanes(np.float64) == 2


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", AWKWARD)
def test_every_config_matches_numpy(config, dtype, m, k, n):
    a, b = operands(m, k, n, dtype, seed=m + n)
    c = cpu.matmul(a, b, variant="packed", config=config)
    assert c.dtype == dtype and c.shape == (m, n) and c.flags.c_contiguous
    np.testing.assert_allclose(c, a @ b, **TOL[dtype])
    small = cpu.matmul_packed(a, b, config=config, blocking=tiny_blocking(config, dtype))
    np.testing.assert_allclose(small, a @ b, **TOL[dtype])


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_config_takes_non_contiguous_views(config, dtype):
    a, b = operands(45, 38, 70, dtype, seed=3)
    a_f = np.asfortranarray(a)
    b_strided = np.repeat(b, 3, axis=1)[:, ::3]
    a_reversed = a[::-1]  # negative row stride
    assert not a_f.flags.c_contiguous and not b_strided.flags.c_contiguous
    assert a_reversed.strides[0] < 0
    for x, y in ((a_f, b_strided), (a_reversed, b), (b_strided.T, a_f.T)):
        np.testing.assert_allclose(cpu.matmul_packed(x, y, config=config), x @ y, **TOL[dtype])


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_config_with_its_cache_blocks_crossing_block_edges(config, dtype):
    b_default = cpu_config.CONFIGS[config].blocking(dtype)
    m, k, n = b_default.mc + 7, b_default.kc + 5, 2 * b_default.nr + 3  # 2 KC steps, 2+ MC blocks
    a, b = operands(m, k, n, dtype, seed=5)
    tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else TOL[dtype]
    np.testing.assert_allclose(cpu.matmul_packed(a, b, config=config), a @ b, **tol)


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 60), k=st.integers(1, 60), n=st.integers(1, 80), kc=st.integers(1, 20),
    dtype=st.sampled_from(DTYPES), config=st.sampled_from(CONFIGS), seed=st.integers(0, 2**16),
)
def test_every_config_any_shape_any_blocks(m, k, n, kc, dtype, config, seed):
    a, b = operands(m, k, n, dtype, seed)
    c = cpu.matmul_packed(a, b, config=config, blocking=tiny_blocking(config, dtype, kc))
    np.testing.assert_allclose(c, a @ b, **TOL[dtype])


def test_inputs_untouched_and_config_object_accepted():
    a, b = operands(30, 20, 40, np.float32, seed=9)
    a0, b0 = a.copy(), b.copy()
    c = cpu.matmul_packed(a, b, config=cpu_config.CONFIGS["avx2"])
    np.testing.assert_array_equal(a, a0)
    np.testing.assert_array_equal(b, b0)
    np.testing.assert_allclose(c, a @ b, **TOL[np.float32])


def test_config_errors():
    a = np.ones((3, 3), np.float32)
    with pytest.raises(UnknownNameError, match=r"matmul_packed.*'sse9'.*avx2"):
        cpu.matmul(a, a, config="sse9")
    with pytest.raises(ArgumentError, match=r"config.*'packed' only.*'tiled'"):
        cpu.matmul(a, a, variant="tiled", config="avx2")
    with pytest.raises(ArgumentError, match=r"tile 4×4.*6×16"):
        cpu.matmul_packed(a, a, config="avx2", blocking=Blocking(4, 4, 8, 8, 8))
    with pytest.raises(ArgumentError, match="multiple of mr"):
        cpu.matmul_packed(a, a, config="avx2", blocking=Blocking(6, 16, 8, 7, 16))
    with pytest.raises(ArgumentError, match="kc, mc, nc"):
        cpu.matmul_packed(a, a, config="avx2", blocking=Blocking(6, 16, 0, 6, 16))


# --- choosing a configuration from the target Numba compiles for ---------------------------------

HOST_ZEN5 = "+avx,+avx2,+fma,+avx512f,+avx512bw,+avx512vl,+sse4.2"


def target(name, features="", machine="x86_64"):
    return NumbaTarget(name, features, "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", machine)


@pytest.mark.parametrize("name,features,machine,expected", [
    ("znver5", HOST_ZEN5, "x86_64", "avx512"),
    ("skylake-avx512", "", "x86_64", "avx512"),
    ("x86-64-v4", "", "AMD64", "avx512"),
    ("haswell", "", "x86_64", "avx2"),
    ("znver3", "", "x86_64", "avx2"),
    ("znver5", HOST_ZEN5 + ",-avx512f", "x86_64", "avx2"),
    ("skylake-avx512", "-avx512f", "x86_64", "avx2"),
    ("some-future-cpu", "+avx2,+fma", "x86_64", "avx2"),
    ("haswell", "-fma", "x86_64", "portable"),
    ("generic", "", "x86_64", "portable"),
    ("sandybridge", "+avx", "x86_64", "portable"),
    ("apple-m1", "+neon", "arm64", "portable"),
    ("neoverse-v2", "+sve2", "aarch64", "portable"),
])
def test_choose(name, features, machine, expected):
    caches = CacheSizes(32 << 10, 256 << 10, 8 << 20, "test")
    choice = cpu_config.choose(target(name, features, machine), caches)
    assert choice.config.name == expected
    assert name in choice.reason and choice.reason.endswith(f"-> {expected}")
    text = choice.describe()
    assert expected in text and "L1d 32 KiB" in text and "float64: register tile" in text


def test_choose_names_where_the_target_came_from():
    reason = cpu_config.choose(target("haswell")).reason
    assert "NUMBA_CPU_NAME" in reason and "NUMBA_CPU_FEATURES is empty" in reason


def test_numba_target_follows_numba_config(monkeypatch):
    from numba.core import config

    monkeypatch.setattr(config, "CPU_NAME", "haswell")
    monkeypatch.setattr(config, "CPU_FEATURES", "")
    got = cpu_config.numba_target()
    assert (got.cpu_name, got.features, got.name_source) == ("haswell", "", "NUMBA_CPU_NAME")
    assert cpu_config.choose(got).config.name == "avx2"
    monkeypatch.setattr(config, "CPU_NAME", None)
    monkeypatch.setattr(config, "CPU_FEATURES", None)
    import llvmlite.binding as llvm

    host = cpu_config.numba_target()
    assert host.cpu_name == llvm.get_host_cpu_name() and "host" in host.name_source


X86 = platform.machine().lower() in ("x86_64", "amd64")


@pytest.mark.skipif(not X86, reason="counts x86 FMA instructions")
def test_emitted_code_uses_the_chosen_vector_width():
    counts = cpu.emitted_fmas()
    widest = {"avx512": "zmm", "avx2": "ymm", "portable": "xmm"}[cpu.CONFIG.config.name]
    accumulators = cpu.CONFIG.config.mr * cpu.CONFIG.config.vectors
    assert counts[widest] > 0 and counts[widest] % accumulators == 0, counts  # whole k steps
    if widest != "zmm":
        assert counts["zmm"] == 0, counts


@pytest.mark.skipif(not X86, reason="NUMBA_CPU_NAME=haswell is an x86 CPU")
def test_haswell_target_selects_avx2_and_emits_no_zmm():
    script = ("from mlsys_lab.kernels import cpu; import numpy as np; "
              "print(cpu.CONFIG.config.name, cpu.emitted_fmas('avx512')['zmm'], "
              "np.allclose(cpu.matmul_packed(np.eye(7, dtype=np.float32), np.eye(7, dtype="
              "np.float32)), np.eye(7)))")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    assert out == ["avx2", "0", "True"]
    env.pop("NUMBA_CPU_FEATURES")  # the host's flags stay: AVX-512 hosts still get zmm code
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    import llvmlite.binding as llvm  # the host's own flags, whatever this process was given
    host = llvm.get_host_cpu_features().flatten()
    assert out[0] == cpu_config.choose(target("haswell", host)).config.name
    assert (out[0] == "avx512") == (int(out[1]) > 0) and out[2] == "True"


# --- cache sizes and blocks ----------------------------------------------------------------------


def fake_sysfs(root, entries):
    for i, (level, kind, size) in enumerate(entries):
        index = root / f"index{i}"
        index.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (index / name).write_text(f"{value}\n")
    return str(root)


def test_cache_sizes_from_sysfs(tmp_path):
    root = fake_sysfs(tmp_path, [(1, "Data", "48K"), (1, "Instruction", "32K"),
                                 (2, "Unified", "1024K"), (3, "Unified", "32M")])
    caches = cpu_config.cache_sizes(root)
    assert (caches.l1d, caches.l2, caches.l3) == (48 << 10, 1 << 20, 32 << 20)
    assert caches.source == root


def test_cache_sizes_fill_missing_levels_with_defaults(tmp_path):
    root = fake_sysfs(tmp_path, [(1, "Data", "64K"), (2, "Unified", "2048K")])
    caches = cpu_config.cache_sizes(root)
    assert (caches.l1d, caches.l2) == (64 << 10, 2 << 20)
    assert caches.l3 == cpu_config.DEFAULT_CACHES.l3 and "l3: default" in caches.source


def test_cache_sizes_of_this_machine_are_plausible():
    caches = cpu_config.cache_sizes()
    assert 8 << 10 <= caches.l1d <= caches.l2 <= max(caches.l3, caches.l2)


def test_blocking_follows_the_caches():
    haswell = CacheSizes(32 << 10, 256 << 10, 8 << 20, "test")
    zen5 = CacheSizes(48 << 10, 1 << 20, 32 << 20, "test")
    avx2 = cpu_config.CONFIGS["avx2"]
    assert cpu_config.blocking_for(avx2, np.float32, haswell) == Blocking(6, 16, 544, 60, 1920)
    assert cpu_config.blocking_for(avx2, np.float32, zen5) == Blocking(6, 16, 1040, 126, 4032)
    tiny, huge = CacheSizes(1 << 10, 4 << 10, 0, "tiny"), CacheSizes(1 << 20, 1 << 30, 1 << 34, "")
    for config in cpu_config.CONFIGS.values():
        for dtype in DTYPES:
            size = np.dtype(dtype).itemsize
            for caches in (haswell, zen5, cpu_config.DEFAULT_CACHES, tiny, huge):
                b = cpu_config.blocking_for(config, dtype, caches)
                assert (b.mr, b.nr) == config.tile(dtype)
                assert b.mc % b.mr == 0 and b.nc % b.nr == 0 and b.kc % 16 == 0
                assert b.nc <= 4096 and b.mc <= 4096 and b.kc <= 4096
                b.check(config, dtype)
                if caches in (haswell, zen5):  # A block: half of L2, deep rather than wide
                    assert 0.4 * caches.l2 <= b.mc * b.kc * size <= caches.l2 / 2
                    assert 5 * b.mc <= b.kc <= 13 * b.mc  # KC ≈ 8·MC, MC rounded to MR
                    assert b.kc * b.nc * size <= caches.l3 / 2


def test_module_constants_are_the_chosen_float32_blocks():
    assert (cpu.MR, cpu.NR, cpu.KC, cpu.MC, cpu.NC) == tuple(
        getattr(cpu.CONFIG.blocking(np.float32), f) for f in ("mr", "nr", "kc", "mc", "nc"))
    assert (cpu.MR, cpu.NR) == cpu.CONFIG.config.tile(np.float32)


@settings(max_examples=80, deadline=None)
@given(m=st.integers(1, 3000), threads=st.integers(1, 8), mr=st.sampled_from([6, 12]),
       mc_tiles=st.integers(1, 40))
def test_thread_rows_split_the_tiles_evenly(m, threads, mr, mc_tiles):
    mc = mc_tiles * mr
    ranges = [cpu._thread_rows(t, threads, m, mr, mc) for t in range(threads)]
    assert ranges[0][0] == 0 and ranges[-1][1] == m
    for (_, last, _), (first, _, _) in zip(ranges, ranges[1:]):
        assert last == first and first % mr == 0  # disjoint, in order, whole tiles
    tiles = [-(-(last - first) // mr) for first, last, _ in ranges]
    assert sum(tiles) == -(-m // mr) and max(tiles) - min(tiles) <= 1
    for first, last, step in ranges:
        assert step % mr == 0 and mr <= step <= mc
        fewest = -(-(last - first) // mc)
        assert -(-(last - first) // step) == fewest  # no more MC blocks than needed ...
        if fewest > 1:  # ... and the last is no more than one tile per block short of the rest
            assert (last - first) - (fewest - 1) * step >= step - fewest * mr


def test_thread_rows_examples():
    assert [cpu._thread_rows(t, 2, 2048, 12, 120) for t in range(2)] == [
        (0, 1020, 120), (1020, 2048, 120)]  # 85 and 86 tiles, 9 blocks each
    assert [cpu._thread_rows(t, 2, 1024, 12, 120) for t in range(2)] == [
        (0, 516, 108), (516, 1024, 108)]  # 43 tiles each: 9 + 9 + 9 + 9 + 7, not 10 × 4 + 3
    assert [cpu._thread_rows(t, 3, 5, 12, 120) for t in range(3)] == [
        (0, 0, 12), (0, 0, 12), (0, 5, 12)]  # one tile: two threads idle


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("threads", [1, 2])
def test_every_config_on_one_and_several_threads(config, threads):
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for m, k, n in ((1, 9, 3), (13, 20, 40), (50, 33, 97)):  # fewer tiles than threads, or not
            a, b = operands(m, k, n, np.float32, seed=m)
            blocks = tiny_blocking(config, np.float32, kc=8)
            c = cpu.matmul_packed(a, b, config=config, blocking=blocks)
            np.testing.assert_allclose(c, a @ b, **TOL[np.float32])
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_first_kc_step_overwrites_whatever_c_held(config, dtype):
    """The result array starts uninitialised: the first KC step must store, not add."""
    chosen = cpu_config.CONFIGS[config]
    mr, nr = chosen.tile(dtype)
    blocks = Blocking(mr, nr, kc=4, mc=mr, nc=2 * nr)
    for m, k, n in ((2 * mr + 1, 3, nr + 5), (mr, 9, 2 * nr)):  # K < KC; several KC steps
        a, b = operands(m, k, n, dtype, seed=k)
        c = np.full((m, n), np.nan, dtype)
        b_panels = np.empty((-(-n // nr), k, nr), dtype)
        a_buffers = np.empty((1, 1, min(blocks.kc, k), mr), dtype)
        kernel = cpu._micro_kernel(chosen.mr, chosen.vectors, chosen.lanes(dtype))
        cpu._packed_kernel(a, b, c, a_buffers, b_panels, kernel, blocks.kc, blocks.mc, blocks.nc)
        np.testing.assert_allclose(c, a @ b, **TOL[dtype])


@pytest.mark.parametrize("k,n,nr", [(1, 1, 16), (17, 40, 16), (33, 64, 32), (40, 75, 8)])
def test_pack_b_deals_b_into_zero_padded_panels(k, n, nr):
    b = np.random.default_rng(k).standard_normal((k, n)).astype(np.float32)
    panels = np.full((-(-n // nr), k, nr), np.nan, np.float32)
    cpu._pack_b(b, panels)
    padded = np.zeros((k, panels.shape[0] * nr), np.float32)
    padded[:, :n] = b
    np.testing.assert_array_equal(panels, padded.reshape(k, -1, nr).transpose(1, 0, 2))


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
