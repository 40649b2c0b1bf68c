"""Checks for chapter 8, hardware accelerators (``solutions/ch08_hardware_accelerators.ipynb``).

8.1 a cache-tiled CPU matmul in Numba, scored on correctness and on its speed against the naive
triple loop; 8.2 a shared-memory tiled CUDA kernel, run under Numba's CUDA simulator on tiny odd
sizes; 8.3 compute-intensity and roofline arithmetic; 8.4 Winograd F(2,3) written out by hand,
with its data × filter multiplies counted.

CUDA needs Numba's simulator switched on *before numba is first imported*
(``NUMBA_ENABLE_CUDASIM=1``), so the notebook's first cell sets it. This module imports numba
only inside the cases, so importing it never switches numba into one mode or the other.
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

from mlsys_lab.grading.checks import Case, Exercise, expect_close, register

# ----------------------------------------------------------------------------- shared helpers


def _operands(m, k, n, dtype, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype))


def _expect_product(c, a, b, what, rtol):
    """Assert that ``c`` is ``a @ b``: an ndarray of the right shape and dtype, close in value."""
    expected = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    if not isinstance(c, np.ndarray):
        raise AssertionError(f"{what} returned a {type(c).__name__}; return a numpy array")
    if c.shape != expected.shape:
        raise AssertionError(f"{what} returned shape {c.shape}, expected {expected.shape}")
    if c.dtype != np.asarray(a).dtype:
        raise AssertionError(
            f"{what} returned dtype {c.dtype}; keep the inputs' dtype {np.asarray(a).dtype}"
        )
    scale = rtol * (1 + np.abs(expected).max()) * math.sqrt(max(np.asarray(a).shape[1], 1))
    err = float(np.abs(c.astype(np.float64) - expected).max()) if c.size else 0.0
    if not err <= scale:
        where = np.unravel_index(np.argmax(np.abs(c - expected)), c.shape)
        raise AssertionError(
            f"{what}: off by up to {err:.3g} (worst at c{list(map(int, where))}); "
            f"expected a @ b within {scale:.1g}"
        )


# ----------------------------------------------------------------------------- 8.1 tiled CPU matmul

SPEED_N = 192
SPEED_RATIO = 3.0


def _tiled_float32(matmul_tiled):
    for m, k, n in [(37, 23, 41), (1, 5, 1), (70, 65, 67)]:
        a, b = _operands(m, k, n, np.float32, seed=m)
        a0, b0 = a.copy(), b.copy()
        c = matmul_tiled(a, b)
        _expect_product(c, a, b, f"matmul_tiled on float32 ({m}×{k}) @ ({k}×{n})", rtol=1e-5)
        if not (np.array_equal(a, a0) and np.array_equal(b, b0)):
            raise AssertionError(f"matmul_tiled on ({m}×{k}) @ ({k}×{n}) changed its inputs")


def _tiled_float64_views(matmul_tiled):
    a, b = _operands(29, 31, 17, np.float64, seed=3)
    _expect_product(matmul_tiled(a, b), a, b, "matmul_tiled on float64 (29×31) @ (31×17)",
                    rtol=1e-12)
    rng = np.random.default_rng(4)
    a = rng.standard_normal((31, 29)).T  # (29×31), column-major
    b = rng.standard_normal((31, 34))[:, ::2]  # (31×17), every other column
    _expect_product(matmul_tiled(a, b), a, b,
                    "matmul_tiled on a transposed (29×31) @ a strided (31×17) view", rtol=1e-12)


def _naive_reference():
    """The naive ``i, j, k`` rung of the package's CPU ladder (compiled on first use)."""
    from mlsys_lab.kernels import cpu

    return cpu.matmul_naive


def _time_once(fn, a, b):
    start = time.perf_counter()
    fn(a, b)
    return time.perf_counter() - start


def _tiled_speed(matmul_tiled):
    small = _operands(64, 64, 64, np.float32, seed=5)
    matmul_tiled(*small)  # compile
    took = _time_once(matmul_tiled, *small)
    if took > 0.05:
        raise AssertionError(
            f"one 64×64 product took {took * 1e3:.0f} ms after warm-up: far too slow for "
            "compiled code; is the kernel decorated with @njit?"
        )
    naive = _naive_reference()
    a, b = _operands(SPEED_N, SPEED_N, SPEED_N, np.float32, seed=6)
    naive(a, b), matmul_tiled(a, b)  # compile at this size and dtype, touch the pages
    t_naive = t_tiled = math.inf
    for _ in range(11):  # interleaved, best of 11: noise from other processes hits both
        t_naive = min(t_naive, _time_once(naive, a, b))
        t_tiled = min(t_tiled, _time_once(matmul_tiled, a, b))
    ratio = t_naive / max(t_tiled, 1e-9)
    if ratio < SPEED_RATIO:
        raise AssertionError(
            f"at n = {SPEED_N} (float32) your kernel took {t_tiled * 1e3:.2f} ms and the naive "
            f"triple loop {t_naive * 1e3:.2f} ms: {ratio:.1f}× faster, need ≥ {SPEED_RATIO:g}×. "
            "Walk B and C along rows in the innermost loop (from 0 over row slices, so that it "
            "vectorises), and block i, j and k"
        )


# ----------------------------------------------------------------------------- 8.2 shared memory

CUDA_TILE = 8


def _cuda_ready():
    """Raise AssertionError with advice unless CUDA (real or simulated) can run here."""
    from numba import config

    if config.ENABLE_CUDASIM:
        return True
    from numba import cuda

    try:
        available = cuda.is_available()
    except Exception:  # a broken driver raises
        available = False
    if not available:
        raise AssertionError(
            "no GPU here and Numba's CUDA simulator is off: run the notebook's first cell "
            "(it sets NUMBA_ENABLE_CUDASIM=1 before numba is imported), then restart the kernel"
        )
    return False


def _shared_one_block(matmul_shared):
    _cuda_ready()
    a, b = _operands(5, 7, 3, np.float32, seed=7)
    _expect_product(matmul_shared(a, b), a, b, "matmul_shared on (5×7) @ (7×3)", rtol=1e-5)


def _shared_many_blocks(matmul_shared):
    _cuda_ready()
    for m, k, n in [(11, 13, 9), (3, 17, 10)]:
        a, b = _operands(m, k, n, np.float32, seed=m + n)
        _expect_product(matmul_shared(a, b), a, b, f"matmul_shared on ({m}×{k}) @ ({k}×{n})",
                        rtol=1e-5)


class _SimulatorSpy:
    """While active, record the shapes of ``cuda.shared.array`` calls and count
    ``cuda.syncthreads`` calls made by kernels running in Numba's CUDA simulator."""

    def __init__(self):
        from numba.cuda.simulator import kernelapi

        self.api = kernelapi
        self.shapes: list[tuple] = []
        self.syncs = 0

    def __enter__(self):
        api, spy = self.api, self
        shared, module = api.FakeCUDAShared, api.FakeCUDAModule
        self._saved = (shared.array, module.syncthreads)
        original_array, original_sync = self._saved

        def array(shared_self, shape, dtype, alignment=None):
            spy.shapes.append(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,))
            allocations = getattr(shared_self, "_allocations", None)
            if shape == 0 or allocations is None:
                return original_array(shared_self, shape, dtype, alignment)
            # The simulator tells shared arrays apart by the caller's file and line; keep that.
            frame = sys._getframe(1)
            key = (frame.f_code.co_filename, frame.f_lineno)
            if key not in allocations:
                from numba.core import types
                from numba.np import numpy_support

                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                allocations[key] = np.empty(shape, dtype)
            return allocations[key]

        def syncthreads(module_self):
            spy.syncs += 1
            return original_sync(module_self)

        shared.array, module.syncthreads = array, syncthreads
        return self

    def __exit__(self, *exc):
        self.api.FakeCUDAShared.array, self.api.FakeCUDAModule.syncthreads = self._saved
        return False


def _static_names(matmul_shared):
    """Names used by the kernels that ``matmul_shared`` refers to (for a real GPU)."""
    names = set()
    for name in matmul_shared.__code__.co_names:
        obj = matmul_shared.__globals__.get(name)
        fn = getattr(obj, "py_func", None) or getattr(obj, "fn", None)
        if fn is not None and hasattr(fn, "__code__"):
            names |= set(fn.__code__.co_names)
    return names


def _shared_uses_shared_memory(matmul_shared):
    simulated = _cuda_ready()
    a, b = _operands(9, 10, 11, np.float32, seed=8)
    if not simulated:
        names = _static_names(matmul_shared)
        missing = [n for n in ("shared", "array", "syncthreads") if n not in names]
        if missing:
            raise AssertionError(
                "the kernel should stage its tiles with cuda.shared.array and separate the "
                "load and compute phases with cuda.syncthreads()"
            )
        return
    with _SimulatorSpy() as spy:
        c = matmul_shared(a, b)
    _expect_product(c, a, b, "matmul_shared on (9×10) @ (10×11)", rtol=1e-5)
    blocks = math.ceil(11 / CUDA_TILE) * math.ceil(9 / CUDA_TILE)
    threads = blocks * CUDA_TILE * CUDA_TILE
    k_tiles = math.ceil(10 / CUDA_TILE)
    tiles = [s for s in spy.shapes if s != (0,)]
    if not tiles:
        raise AssertionError("the kernel never calls cuda.shared.array; stage an A tile and a B "
                             "tile in shared memory")
    if len(tiles) < 2 * threads:
        raise AssertionError(
            f"{len(tiles)} cuda.shared.array calls over {threads} threads; every thread should "
            "declare both the A tile and the B tile (two calls, outside the K loop)"
        )
    wrong = sorted({s for s in tiles if s != (CUDA_TILE, CUDA_TILE)})
    if wrong:
        raise AssertionError(
            f"shared tiles should be {CUDA_TILE}×{CUDA_TILE}; got shape(s) {wrong}"
        )
    if spy.syncs == 0:
        raise AssertionError(
            "the kernel never calls cuda.syncthreads(): threads may read a tile before the "
            "others have finished writing it"
        )
    if spy.syncs < 2 * k_tiles * threads:
        raise AssertionError(
            f"the kernel made {spy.syncs} cuda.syncthreads() calls over {threads} threads; each "
            "K-tile needs two barriers per thread (after loading the tiles, and before "
            "overwriting them), or did the launch use fewer than "
            f"{CUDA_TILE}×{CUDA_TILE} threads per block?"
        )


# ----------------------------------------------------------------------------- 8.3 intensity

RTX3080_PEAK = 29767.68e9
RTX3080_BW = 760e9


def _ref_tile_intensity(m, n):
    return 2 * m * n / (m + n)


def _ref_gemm_bytes(m, n, k, dtype_bytes):
    return (m * k + k * n + m * n) * dtype_bytes


def _intensity_tiles(tile_intensity, gemm_bytes, attainable):
    for m, n in [(1, 1), (2, 2), (4, 4), (8, 8), (4, 8), (128, 128), (3, 1)]:
        expect_close(tile_intensity(m, n), _ref_tile_intensity(m, n), f"tile_intensity({m}, {n})",
                     rel=1e-9)


def _intensity_bytes(tile_intensity, gemm_bytes, attainable):
    for args in [(2048, 2048, 1024, 4), (2048, 2048, 1024, 2), (3, 5, 7, 8), (1, 1, 1, 4)]:
        expect_close(gemm_bytes(*args), _ref_gemm_bytes(*args),
                     "gemm_bytes(" + ", ".join(map(str, args)) + ")", rel=1e-12)


def _intensity_roof(tile_intensity, gemm_bytes, attainable):
    ridge = RTX3080_PEAK / RTX3080_BW
    for intensity in (0.25, 1.0, ridge, 100.0):
        expected = min(RTX3080_PEAK, intensity * RTX3080_BW)
        expect_close(attainable(intensity, RTX3080_PEAK, RTX3080_BW), expected,
                     f"attainable({intensity:g}, 29767.68e9, 760e9)", rel=1e-9)
    expect_close(attainable(10.0, 1e12, 2e11), 1e12, "attainable(10, 1e12, 2e11)", rel=1e-9)


def _intensity_book(tile_intensity, gemm_bytes, attainable):
    # An 8×8 float32 thread tile whose every load comes from DRAM, on the book's RTX 3080.
    per_byte = tile_intensity(8, 8) / 4
    expect_close(attainable(per_byte, RTX3080_PEAK, RTX3080_BW), 2.0 * RTX3080_BW,
                 "attainable(tile_intensity(8, 8) / 4, 29767.68e9, 760e9)", rel=1e-9)
    # The whole book GEMM (2048×2048×1024, float32) reading A, B and writing C once.
    flops = 2 * 2048 * 2048 * 1024
    intensity = flops / gemm_bytes(2048, 2048, 1024, 4)
    expect_close(intensity, 256.0, "2·M·N·K / gemm_bytes(2048, 2048, 1024, 4)", rel=1e-9)


# ----------------------------------------------------------------------------- 8.4 Winograd F(2,3)


class _Counted:
    """A number that counts multiplies between two input-dependent values (data × filter)."""

    counter = None  # a one-element list, set by the case

    __array_priority__ = 1000  # numpy hands arithmetic with ndarrays to us

    def __init__(self, value):
        self.value = float(value)

    @staticmethod
    def _value(other):
        if isinstance(other, _Counted):
            return other.value
        if isinstance(other, (int, float, np.integer, np.floating)):
            return float(other)
        return NotImplemented

    def _binary(self, other, op, count=False):
        value = self._value(other)
        if value is NotImplemented:
            return NotImplemented
        if count and isinstance(other, _Counted):
            _Counted.counter[0] += 1
        return _Counted(op(self.value, value))

    def __add__(self, other):
        return self._binary(other, lambda x, y: x + y)

    def __radd__(self, other):
        return self._binary(other, lambda x, y: y + x)

    def __sub__(self, other):
        return self._binary(other, lambda x, y: x - y)

    def __rsub__(self, other):
        return self._binary(other, lambda x, y: y - x)

    def __mul__(self, other):
        return self._binary(other, lambda x, y: x * y, count=True)

    def __rmul__(self, other):
        return self._binary(other, lambda x, y: y * x, count=True)

    def __truediv__(self, other):
        if isinstance(other, _Counted):
            raise TypeError("divide only by constants in Winograd F(2,3)")
        return self._binary(other, lambda x, y: x / y)

    def __neg__(self):
        return _Counted(-self.value)

    def __pos__(self):
        return self

    def __float__(self):
        raise TypeError("the check passes special numbers that count multiplies; do the "
                        "arithmetic on the elements as given (no float(...) or dtype=float)")


def _direct_f23(d, g):
    return [d[0] * g[0] + d[1] * g[1] + d[2] * g[2], d[1] * g[0] + d[2] * g[1] + d[3] * g[2]]


def _two_numbers(result, what):
    try:
        values = list(np.asarray(result, dtype=object).ravel())
    except Exception:
        raise AssertionError(f"{what} returned {type(result).__name__}; return 2 numbers") from None
    if len(values) != 2:
        raise AssertionError(f"{what} returned {len(values)} values; F(2,3) gives 2 outputs")
    return values


def _winograd_values(winograd_f23):
    rng = np.random.default_rng(9)
    cases = [([1.0, 2.0, 3.0, 4.0], [1.0, 0.0, -1.0])]
    cases += [(list(rng.standard_normal(4)), list(rng.standard_normal(3))) for _ in range(20)]
    for d, g in cases:
        got = [float(v) for v in _two_numbers(winograd_f23(d, g), "winograd_f23")]
        expected = _direct_f23(d, g)
        if not np.allclose(got, expected, rtol=1e-9, atol=1e-12):
            shown = [round(x, 4) for x in d], [round(x, 4) for x in g]
            raise AssertionError(
                f"winograd_f23(d={shown[0]}, g={shown[1]}) returned "
                f"{[round(x, 6) for x in got]}, expected {[round(x, 6) for x in expected]} "
                "(the 3-tap correlation at two positions); check your output transform Aᵀ"
            )


def _winograd_multiplies(winograd_f23):
    _Counted.counter = [0]
    d = [_Counted(v) for v in (0.5, -1.25, 2.0, 0.75)]
    g = [_Counted(v) for v in (1.5, -0.5, 0.25)]
    try:
        values = _two_numbers(winograd_f23(d, g), "winograd_f23")
    finally:
        count, _Counted.counter = _Counted.counter[0], None
    got = [v.value if isinstance(v, _Counted) else float(v) for v in values]
    if not np.allclose(got, _direct_f23([0.5, -1.25, 2.0, 0.75], [1.5, -0.5, 0.25])):
        raise AssertionError("winograd_f23 gave wrong outputs on the counting inputs")
    if count != 4:
        raise AssertionError(
            f"winograd_f23 multiplied input-dependent values {count} times; Winograd F(2,3) "
            "needs exactly 4 (the element-wise product of the transformed filter and data; "
            "the transforms themselves only add, subtract or scale by constants)"
        )


# ----------------------------------------------------------------------------- registry

register(
    Exercise(
        id="8.1",
        title="A cache-tiled CPU matmul in Numba",
        target="matmul_tiled",
        cases=(
            Case("float32, odd sizes, inputs untouched", 2, _tiled_float32,
                 "c = a @ b for any (m×k) @ (k×n)"),
            Case("float64 and non-contiguous views", 1, _tiled_float64_views,
                 "keep the dtype; make the operands contiguous first"),
            Case(f"≥ {SPEED_RATIO:g}× faster than the naive loop at n = {SPEED_N}", 2,
                 _tiled_speed, "unit-stride inner loop plus blocking"),
        ),
    ),
    Exercise(
        id="8.2",
        title="A shared-memory tiled CUDA kernel",
        target="matmul_shared",
        cases=(
            Case("(5×7) @ (7×3): one block", 1, _shared_one_block, "c = a @ b, float32"),
            Case("several blocks and K-tiles, clipped edges", 2, _shared_many_blocks,
                 "guard loads and stores at the matrix edges"),
            Case(f"{CUDA_TILE}×{CUDA_TILE} shared tiles and cuda.syncthreads", 1,
                 _shared_uses_shared_memory, "stage tiles in cuda.shared.array"),
        ),
    ),
    Exercise(
        id="8.3",
        title="Compute intensity and the roofline",
        target=("tile_intensity", "gemm_bytes", "attainable"),
        cases=(
            Case("tile_intensity(m, n) = 2mn/(m+n)", 1, _intensity_tiles),
            Case("gemm_bytes: A and B read, C written once", 1, _intensity_bytes),
            Case("attainable = min(peak, I × bandwidth)", 1, _intensity_roof),
            Case("the book's RTX 3080: 8×8 tile and whole GEMM", 1, _intensity_book),
        ),
    ),
    Exercise(
        id="8.4",
        title="Winograd F(2,3) by hand",
        target="winograd_f23",
        cases=(
            Case("equals the direct 3-tap correlation", 2, _winograd_values),
            Case("4 data × filter multiplies (direct: 6)", 1, _winograd_multiplies),
        ),
    ),
)
