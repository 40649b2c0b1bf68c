"""The CUDA GEMM ladder of the book's section 8.4, written with ``numba.cuda``.

Every step computes ``c = a @ b`` for row-major ``a`` (M×K) and ``b`` (K×N) and adds one
optimisation to the step before it, in the book's order:

===================== =====================================================================
``naive``             one thread per output element, operands read from global memory
``thread_tile``       each thread computes a 4×4 output tile from "wide" (float4) loads
``block_tile``        a 128×128 block tile, K-step 16, each of 16×16 threads owns 8×8 outputs
``shared``            the A and B block tiles are staged in shared memory
``shared_transposed`` the A tile is stored transposed so the inner loop reads it contiguously
``shared_prefetch``   the next k-slice of shared memory is read while this one is computed
``double_buffer``     two shared buffers: tile k+1 comes from global memory during tile k
===================== =====================================================================

Each variant is a plain function ``matmul_<name>(a, b, *, out=None, config=None)``: numpy arrays
in → numpy array out; CUDA device arrays in → device array out. Any sizes work: loads outside the
matrices read zeros and stores outside them are skipped.

Tile sizes are compile-time constants captured by a kernel *factory* (a closure), so one
algorithm can be compiled at the book's sizes for a GPU (``DEFAULT_CONFIGS``) and at tiny sizes
for Numba's CUDA simulator (``SIMULATOR_CONFIGS``), where every thread is a Python thread.

A thread's output tile is made of 4×4 pieces spaced ``threads·4`` apart (rows ``ty*4 + r`` and
``64 + ty*4 + r`` for the 8×8 tile of a 16×16 block), as in the book: each piece is one 128-bit
load wide, and neighbouring threads touch neighbouring memory.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from numba import config as _numba_config
from numba import cuda
from numba.np import numpy_support

from ..errors import DTypeError, ShapeError

WIDE = 4
"""Elements per "wide" load: one ``float4`` = 128 bits in the book's CUDA C."""

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

SHARED_ALIGN = None if _numba_config.ENABLE_CUDASIM else 16
"""Byte alignment of shared tiles, so a GPU compiler may merge 4 neighbours into one 128-bit
load (the simulator cannot align arrays)."""


# --------------------------------------------------------------------------------------------
# Tile configurations
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Compile-time tile sizes of one kernel.

    A block of ``threads_y × threads_x`` threads computes a ``block_m × block_n`` tile of C,
    ``thread_m × thread_n`` outputs per thread, walking K in steps of ``block_k``.
    """

    threads_y: int = 16
    threads_x: int = 16
    thread_m: int = 8
    thread_n: int = 8
    block_k: int = 16

    @property
    def block_m(self) -> int:
        return self.threads_y * self.thread_m

    @property
    def block_n(self) -> int:
        return self.threads_x * self.thread_n

    @property
    def threads(self) -> int:
        return self.threads_y * self.threads_x


DEFAULT_CONFIGS = {
    "naive": TileConfig(16, 16, 1, 1, 1),
    "thread_tile": TileConfig(16, 16, 4, 4, 4),
    "block_tile": TileConfig(16, 16, 8, 8, 16),
    "shared": TileConfig(16, 16, 8, 8, 16),
    "shared_transposed": TileConfig(16, 16, 8, 8, 16),
    "shared_prefetch": TileConfig(16, 16, 8, 8, 16),
    "double_buffer": TileConfig(16, 16, 8, 8, 16),
}
"""The book's sizes: what a real GPU should run."""

SIMULATOR_CONFIGS = {
    "naive": TileConfig(4, 4, 1, 1, 1),
    "thread_tile": TileConfig(2, 2, 4, 4, 4),
    "block_tile": TileConfig(2, 2, 8, 8, 4),
    "shared": TileConfig(2, 2, 8, 8, 4),
    "shared_transposed": TileConfig(2, 2, 8, 8, 4),
    "shared_prefetch": TileConfig(2, 2, 8, 8, 4),
    "double_buffer": TileConfig(2, 2, 8, 8, 4),
}
"""The same algorithms at tiny sizes (4 threads a block), fast enough for the CUDA simulator."""


def default_config(variant: str, dtype=np.float32) -> TileConfig:
    """The book's tile sizes for ``variant``; for float64 the double buffer halves its K-step
    so that both buffers still fit in 48 KiB of static shared memory."""
    cfg = DEFAULT_CONFIGS[variant]
    if variant == "double_buffer" and np.dtype(dtype).itemsize == 8:
        cfg = dataclasses.replace(cfg, block_k=cfg.block_k // 2)
    return cfg


def _check_config(variant: str, cfg: TileConfig, itemsize: int = 4) -> None:
    """Raise ValueError if ``cfg`` cannot drive ``variant``'s kernel."""
    problems = []
    if cfg.threads > 1024:
        problems.append(f"{cfg.threads} threads per block > 1024")
    if variant != "naive":
        if cfg.thread_m % WIDE or cfg.thread_n % WIDE or cfg.block_k % WIDE:
            problems.append(f"thread_m, thread_n and block_k must be multiples of {WIDE}")
    if variant not in ("naive", "thread_tile", "block_tile"):
        per_load = WIDE * cfg.threads
        if (cfg.block_m * cfg.block_k) % per_load or (cfg.block_k * cfg.block_n) % per_load:
            problems.append(f"each block tile must split into {WIDE}-wide loads over all threads")
        buffers = 2 if variant == "double_buffer" else 1
        if buffers * cfg.block_k * (cfg.block_m + cfg.block_n) * itemsize > 48 * 1024:
            problems.append("shared tiles exceed 48 KiB")
    if problems:
        raise ValueError(f"matmul_{variant}: bad {cfg}: " + "; ".join(problems))


# --------------------------------------------------------------------------------------------
# Device helpers shared by the tiled kernels
# --------------------------------------------------------------------------------------------


def _device(fn):
    """A device function, inlined into its caller at the Numba IR level."""
    return cuda.jit(device=True, inline="always")(fn)


@functools.lru_cache(maxsize=None)
def _helpers(cfg: TileConfig, dtype: np.dtype):
    """Build the device functions that the tiled kernels share, for one config and dtype.

    Returns a dict of device functions; tile sizes are baked in as constants.
    """
    TY, TX, TM, TN, BK = cfg.threads_y, cfg.threads_x, cfg.thread_m, cfg.thread_n, cfg.block_k
    BM, BN, NT = cfg.block_m, cfg.block_n, cfg.threads
    A_LOADS = max(BM * BK // (WIDE * NT), 1)  # wide loads per thread per A tile
    B_LOADS = max(BK * BN // (WIDE * NT), 1)
    zero = dtype.type(0)

    @_device
    def tile_row(ty, i):
        """Row (inside the block tile) of a thread's i-th output row: 4-row pieces, spaced."""
        return (i // WIDE) * (TY * WIDE) + ty * WIDE + i % WIDE

    @_device
    def tile_col(tx, j):
        """Column (inside the block tile) of a thread's j-th output column."""
        return (j // WIDE) * (TX * WIDE) + tx * WIDE + j % WIDE

    @_device
    def load_a(a, m0, k0, tid, stage):
        """Global → registers: this thread's share of the BM×BK tile of A at (m0, k0)."""
        m, kdim = a.shape
        for q in range(A_LOADS):
            quad = tid + q * NT
            r, kq = quad // (BK // WIDE), (quad % (BK // WIDE)) * WIDE
            for w in range(WIDE):  # one wide load: 4 consecutive k of one row
                row, k = m0 + r, k0 + kq + w
                stage[q * WIDE + w] = a[row, k] if row < m and k < kdim else zero

    @_device
    def load_b(b, k0, n0, tid, stage):
        """Global → registers: this thread's share of the BK×BN tile of B at (k0, n0)."""
        kdim, n = b.shape
        for q in range(B_LOADS):
            quad = tid + q * NT
            r, cq = quad // (BN // WIDE), (quad % (BN // WIDE)) * WIDE
            for w in range(WIDE):  # one wide load: 4 consecutive columns of one k
                k, col = k0 + r, n0 + cq + w
                stage[q * WIDE + w] = b[k, col] if k < kdim and col < n else zero

    @_device
    def store_a(stage, tid, tile):
        """Registers → shared, A tile kept as it is in memory: ``tile[m, k]`` (BM×BK)."""
        for q in range(A_LOADS):
            quad = tid + q * NT
            r, kq = quad // (BK // WIDE), (quad % (BK // WIDE)) * WIDE
            for w in range(WIDE):
                tile[r, kq + w] = stage[q * WIDE + w]

    @_device
    def store_a_transposed(stage, tid, tile):
        """Registers → shared, A tile transposed: ``tile[k, m]`` (BK×BM)."""
        for q in range(A_LOADS):
            quad = tid + q * NT
            r, kq = quad // (BK // WIDE), (quad % (BK // WIDE)) * WIDE
            for w in range(WIDE):
                tile[kq + w, r] = stage[q * WIDE + w]

    @_device
    def store_b(stage, tid, tile):
        """Registers → shared, B tile ``tile[k, n]`` (BK×BN)."""
        for q in range(B_LOADS):
            quad = tid + q * NT
            r, cq = quad // (BN // WIDE), (quad % (BN // WIDE)) * WIDE
            for w in range(WIDE):
                tile[r, cq + w] = stage[q * WIDE + w]

    @_device
    def fragment_a(a_tile, kk, ty, frag):
        """Shared → registers: column kk of this thread's rows of an ``[m, k]`` A tile."""
        for i in range(TM):
            frag[i] = a_tile[tile_row(ty, i), kk]

    @_device
    def fragment_a_transposed(a_tile_t, kk, ty, frag):
        """Shared → registers from a transposed ``[k, m]`` A tile: 4 contiguous reads a piece."""
        for i in range(TM):
            frag[i] = a_tile_t[kk, tile_row(ty, i)]

    @_device
    def fragment_b(b_tile, kk, tx, frag):
        """Shared → registers: row kk of this thread's columns of the B tile."""
        for j in range(TN):
            frag[j] = b_tile[kk, tile_col(tx, j)]

    @_device
    def outer_product(a_frag, b_frag, acc):
        """acc += a_frag ⊗ b_frag: TM·TN fused multiply-adds from TM + TN registers."""
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = cuda.fma(a_frag[i], b_frag[j], acc[i, j])

    @_device
    def compute_tile_prefetched(a_tile_t, b_tile, ty, tx, a0, b0, a1, b1, acc):
        """acc += one shared tile, reading k-slice kk+1 into (a1, b1) while (a0, b0) computes.

        The loop is unrolled by two so each fragment buffer has a fixed name (registers, not
        an array indexed at run time, which would spill to local memory).
        """
        fragment_a_transposed(a_tile_t, 0, ty, a0)
        fragment_b(b_tile, 0, tx, b0)
        for kk in range(0, BK, 2):
            fragment_a_transposed(a_tile_t, kk + 1, ty, a1)
            fragment_b(b_tile, kk + 1, tx, b1)
            outer_product(a0, b0, acc)
            if kk + 2 < BK:
                fragment_a_transposed(a_tile_t, kk + 2, ty, a0)
                fragment_b(b_tile, kk + 2, tx, b0)
            outer_product(a1, b1, acc)

    @_device
    def store_c(c, acc, m0, n0, ty, tx):
        """Registers → global: write this thread's output tile, skipping what lies outside C."""
        m, n = c.shape
        for i in range(TM):
            row = m0 + tile_row(ty, i)
            if row < m:
                for j in range(TN):
                    col = n0 + tile_col(tx, j)
                    if col < n:
                        c[row, col] = acc[i, j]

    return dict(
        load_a=load_a, load_b=load_b, store_a=store_a, store_a_transposed=store_a_transposed,
        store_b=store_b, fragment_a=fragment_a, fragment_a_transposed=fragment_a_transposed,
        fragment_b=fragment_b, outer_product=outer_product, store_c=store_c,
        compute_tile_prefetched=compute_tile_prefetched, tile_row=tile_row, tile_col=tile_col,
        a_loads=A_LOADS, b_loads=B_LOADS, zero=zero,
    )


# --------------------------------------------------------------------------------------------
# Kernel factories, one per step of the ladder
# --------------------------------------------------------------------------------------------


def _naive_kernel(cfg: TileConfig, dtype: np.dtype):
    zero = dtype.type(0)

    @cuda.jit
    def naive(a, b, c):
        m, kdim = a.shape
        n = b.shape[1]
        row = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
        col = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x  # neighbours: coalesced
        if row < m and col < n:
            acc = zero
            for k in range(kdim):
                acc = cuda.fma(a[row, k], b[k, col], acc)
            c[row, col] = acc

    return naive


def _thread_tile_kernel(cfg: TileConfig, dtype: np.dtype):
    """4×4 thread tiles read straight from global memory with wide loads (``thread_tile``)."""
    TM, TN, BK, BM, BN = cfg.thread_m, cfg.thread_n, cfg.block_k, cfg.block_m, cfg.block_n
    h = _helpers(cfg, dtype)
    tile_row, tile_col, store_c = h["tile_row"], h["tile_col"], h["store_c"]
    dt, zero = numpy_support.from_dtype(dtype), h["zero"]

    @cuda.jit
    def thread_tile(a, b, c):
        m, kdim = a.shape
        n = b.shape[1]
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        a_wide = cuda.local.array((TM, WIDE), dt)  # per row of the tile: one wide load of A
        b_wide = cuda.local.array((WIDE, TN), dt)  # per k: TN // 4 wide loads of B
        acc = cuda.local.array((TM, TN), dt)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero
        for k0 in range(0, kdim, BK):
            for k1 in range(k0, k0 + BK, WIDE):
                for i in range(TM):
                    row = m0 + tile_row(ty, i)
                    for w in range(WIDE):
                        k = k1 + w
                        a_wide[i, w] = a[row, k] if row < m and k < kdim else zero
                for w in range(WIDE):
                    k = k1 + w
                    for j in range(TN):
                        col = n0 + tile_col(tx, j)
                        b_wide[w, j] = b[k, col] if k < kdim and col < n else zero
                for i in range(TM):
                    for j in range(TN):
                        for w in range(WIDE):
                            acc[i, j] = cuda.fma(a_wide[i, w], b_wide[w, j], acc[i, j])
        store_c(c, acc, m0, n0, ty, tx)

    return thread_tile


def _block_tile_kernel(cfg: TileConfig, dtype: np.dtype):
    """8×8 thread tiles of a 128×128 block tile, read straight from global memory."""
    TM, TN, BK, BM, BN = cfg.thread_m, cfg.thread_n, cfg.block_k, cfg.block_m, cfg.block_n
    h = _helpers(cfg, dtype)
    tile_row, tile_col = h["tile_row"], h["tile_col"]
    outer_product, store_c = h["outer_product"], h["store_c"]
    dt, zero = numpy_support.from_dtype(dtype), h["zero"]

    @cuda.jit
    def block_tile(a, b, c):
        m, kdim = a.shape
        n = b.shape[1]
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        a_frag = cuda.local.array(TM, dt)  # column k of this thread's rows of A
        b_frag = cuda.local.array(TN, dt)  # row k of its columns of B: TN // 4 wide loads
        acc = cuda.local.array((TM, TN), dt)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero
        for k0 in range(0, kdim, BK):
            for k in range(k0, min(k0 + BK, kdim)):
                for i in range(TM):
                    row = m0 + tile_row(ty, i)
                    a_frag[i] = a[row, k] if row < m else zero
                for j in range(TN):
                    col = n0 + tile_col(tx, j)
                    b_frag[j] = b[k, col] if col < n else zero
                outer_product(a_frag, b_frag, acc)
        store_c(c, acc, m0, n0, ty, tx)

    return block_tile


def _shared_kernel(cfg: TileConfig, dtype: np.dtype, transposed: bool):
    """Block tiles of A and B staged in shared memory (``shared``, ``shared_transposed``)."""
    TM, TN, BK, BM, BN = cfg.thread_m, cfg.thread_n, cfg.block_k, cfg.block_m, cfg.block_n
    h = _helpers(cfg, dtype)
    load_a, load_b, store_b, fragment_b = h["load_a"], h["load_b"], h["store_b"], h["fragment_b"]
    store_a = h["store_a_transposed"] if transposed else h["store_a"]
    fragment_a = h["fragment_a_transposed"] if transposed else h["fragment_a"]
    outer_product, store_c = h["outer_product"], h["store_c"]
    A_SHAPE = (BK, BM) if transposed else (BM, BK)
    A_STAGE, B_STAGE = h["a_loads"] * WIDE, h["b_loads"] * WIDE
    dt, zero = numpy_support.from_dtype(dtype), h["zero"]

    @cuda.jit
    def shared(a, b, c):
        kdim = a.shape[1]
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        tid = ty * cuda.blockDim.x + tx
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        a_tile = cuda.shared.array(A_SHAPE, dt, alignment=SHARED_ALIGN)
        b_tile = cuda.shared.array((BK, BN), dt, alignment=SHARED_ALIGN)
        a_stage = cuda.local.array(A_STAGE, dt)
        b_stage = cuda.local.array(B_STAGE, dt)
        a_frag = cuda.local.array(TM, dt)
        b_frag = cuda.local.array(TN, dt)
        acc = cuda.local.array((TM, TN), dt)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero
        for k0 in range(0, kdim, BK):
            load_a(a, m0, k0, tid, a_stage)
            store_a(a_stage, tid, a_tile)
            load_b(b, k0, n0, tid, b_stage)
            store_b(b_stage, tid, b_tile)
            cuda.syncthreads()  # the whole tile is in shared memory
            for kk in range(BK):
                fragment_a(a_tile, kk, ty, a_frag)
                fragment_b(b_tile, kk, tx, b_frag)
                outer_product(a_frag, b_frag, acc)
            cuda.syncthreads()  # everyone is done reading before the next tile lands
        store_c(c, acc, m0, n0, ty, tx)

    return shared


def _shared_prefetch_kernel(cfg: TileConfig, dtype: np.dtype):
    """Transposed shared tiles plus register prefetch of the next k-slice."""
    TM, TN, BK, BM, BN = cfg.thread_m, cfg.thread_n, cfg.block_k, cfg.block_m, cfg.block_n
    h = _helpers(cfg, dtype)
    load_a, load_b = h["load_a"], h["load_b"]
    store_a, store_b = h["store_a_transposed"], h["store_b"]
    compute_tile, store_c = h["compute_tile_prefetched"], h["store_c"]
    A_STAGE, B_STAGE = h["a_loads"] * WIDE, h["b_loads"] * WIDE
    dt, zero = numpy_support.from_dtype(dtype), h["zero"]

    @cuda.jit
    def shared_prefetch(a, b, c):
        kdim = a.shape[1]
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        tid = ty * cuda.blockDim.x + tx
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        a_tile = cuda.shared.array((BK, BM), dt, alignment=SHARED_ALIGN)
        b_tile = cuda.shared.array((BK, BN), dt, alignment=SHARED_ALIGN)
        a_stage = cuda.local.array(A_STAGE, dt)
        b_stage = cuda.local.array(B_STAGE, dt)
        a0 = cuda.local.array(TM, dt)
        b0 = cuda.local.array(TN, dt)
        a1 = cuda.local.array(TM, dt)
        b1 = cuda.local.array(TN, dt)
        acc = cuda.local.array((TM, TN), dt)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero
        for k0 in range(0, kdim, BK):
            load_a(a, m0, k0, tid, a_stage)
            store_a(a_stage, tid, a_tile)
            load_b(b, k0, n0, tid, b_stage)
            store_b(b_stage, tid, b_tile)
            cuda.syncthreads()
            compute_tile(a_tile, b_tile, ty, tx, a0, b0, a1, b1, acc)
            cuda.syncthreads()
        store_c(c, acc, m0, n0, ty, tx)

    return shared_prefetch


def _double_buffer_kernel(cfg: TileConfig, dtype: np.dtype):
    """Two shared buffers; the next tile travels global → registers while this one computes."""
    TM, TN, BK, BM, BN = cfg.thread_m, cfg.thread_n, cfg.block_k, cfg.block_m, cfg.block_n
    h = _helpers(cfg, dtype)
    load_a, load_b = h["load_a"], h["load_b"]
    store_a, store_b = h["store_a_transposed"], h["store_b"]
    compute_tile, store_c = h["compute_tile_prefetched"], h["store_c"]
    A_STAGE, B_STAGE = h["a_loads"] * WIDE, h["b_loads"] * WIDE
    dt, zero = numpy_support.from_dtype(dtype), h["zero"]

    @cuda.jit
    def double_buffer(a, b, c):
        kdim = a.shape[1]
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        tid = ty * cuda.blockDim.x + tx
        m0, n0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        a_tiles = cuda.shared.array((2, BK, BM), dt, alignment=SHARED_ALIGN)
        b_tiles = cuda.shared.array((2, BK, BN), dt, alignment=SHARED_ALIGN)
        a_stage = cuda.local.array(A_STAGE, dt)
        b_stage = cuda.local.array(B_STAGE, dt)
        a0 = cuda.local.array(TM, dt)
        b0 = cuda.local.array(TN, dt)
        a1 = cuda.local.array(TM, dt)
        b1 = cuda.local.array(TN, dt)
        acc = cuda.local.array((TM, TN), dt)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = zero
        n_tiles = (kdim + BK - 1) // BK
        load_a(a, m0, 0, tid, a_stage)
        load_b(b, 0, n0, tid, b_stage)
        store_a(a_stage, tid, a_tiles[0])
        store_b(b_stage, tid, b_tiles[0])
        cuda.syncthreads()
        for t in range(n_tiles):
            cur = t % 2
            has_next = t + 1 < n_tiles
            if has_next:  # issue the global loads of tile t+1; nothing waits on them yet...
                load_a(a, m0, (t + 1) * BK, tid, a_stage)
                load_b(b, (t + 1) * BK, n0, tid, b_stage)
            compute_tile(a_tiles[cur], b_tiles[cur], ty, tx, a0, b0, a1, b1, acc)
            if has_next:  # ...until they are parked in the other buffer, read last round
                store_a(a_stage, tid, a_tiles[1 - cur])
                store_b(b_stage, tid, b_tiles[1 - cur])
            cuda.syncthreads()  # one barrier per tile: the buffers swap roles
        store_c(c, acc, m0, n0, ty, tx)

    return double_buffer


_FACTORIES = {
    "naive": _naive_kernel,
    "thread_tile": _thread_tile_kernel,
    "block_tile": _block_tile_kernel,
    "shared": functools.partial(_shared_kernel, transposed=False),
    "shared_transposed": functools.partial(_shared_kernel, transposed=True),
    "shared_prefetch": _shared_prefetch_kernel,
    "double_buffer": _double_buffer_kernel,
}


@functools.lru_cache(maxsize=None)
def _kernel(variant: str, cfg: TileConfig, dtype: np.dtype):
    _check_config(variant, cfg, dtype.itemsize)
    return _FACTORIES[variant](cfg, dtype)


# --------------------------------------------------------------------------------------------
# Launching
# --------------------------------------------------------------------------------------------


def _is_device_array(x) -> bool:
    """Numba device arrays (real or simulated) and anything with ``__cuda_array_interface__``."""
    return hasattr(x, "copy_to_host") or hasattr(x, "__cuda_array_interface__")


def _as_operand(x):
    """A numba device array as it is, another CUDA array wrapped, anything else as C numpy."""
    if hasattr(x, "copy_to_host"):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        return cuda.as_cuda_array(x)
    return np.ascontiguousarray(x)


def _check_operands(a, b):
    """Validate shapes and dtypes; return (a, b, on_device) with numpy inputs made C-contiguous."""
    on_device = _is_device_array(a) or _is_device_array(b)
    a, b = _as_operand(a), _as_operand(b)
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"matmul: cannot multiply shapes {tuple(a.shape)} and {tuple(b.shape)}; "
            "need (M, K) @ (K, N)")
    da, db = np.dtype(a.dtype), np.dtype(b.dtype)
    if da != db:
        raise DTypeError(f"matmul: operand dtypes differ: {da} and {db}")
    if da not in SUPPORTED_DTYPES:
        raise DTypeError(f"matmul: dtype {da} is not supported; use float32 or float64")
    for x in (a, b):
        if _is_device_array(x) and not x.is_c_contiguous():
            raise ShapeError(f"matmul: device operand of shape {tuple(x.shape)} "
                             "is not C-contiguous; copy it first")
    return a, b, on_device


def make_launcher(variant, a, b, out, config=None):
    """Return a zero-argument function that enqueues one ``variant`` kernel computing out = a @ b.

    ``a``, ``b`` and ``out`` must be C-contiguous CUDA device arrays. No checks, no copies, no
    synchronisation: this is what the benchmark times.
    """
    cfg = config or default_config(variant, a.dtype)
    kernel = _kernel(variant, cfg, np.dtype(a.dtype))
    m, n = out.shape
    grid = (math.ceil(n / cfg.block_n), math.ceil(m / cfg.block_m))
    configured = kernel[grid, (cfg.threads_x, cfg.threads_y)]
    return lambda: configured(a, b, out)


def _run(variant, a, b, out=None, config=None):
    """Check operands, move them to the device if needed, launch, and return c = a @ b."""
    a, b, on_device = _check_operands(a, b)
    (m, k), n = a.shape, b.shape[1]
    dtype = np.dtype(a.dtype)
    if out is not None:
        if tuple(out.shape) != (m, n) or np.dtype(out.dtype) != dtype:
            raise ShapeError(f"matmul: out has shape {tuple(out.shape)} and dtype {out.dtype}; "
                             f"need {(m, n)} and {dtype}")
        if not _is_device_array(out):
            raise DTypeError("matmul: out must be a CUDA device array")
    if m == 0 or n == 0 or k == 0:  # nothing to launch
        result = np.zeros((m, n), dtype)
        if out is not None:
            out.copy_to_device(result)
            return out
        return cuda.to_device(result) if on_device else result
    d_a = a if _is_device_array(a) else cuda.to_device(a)
    d_b = b if _is_device_array(b) else cuda.to_device(b)
    d_c = out if out is not None else cuda.device_array((m, n), dtype)
    make_launcher(variant, d_a, d_b, d_c, config)()
    return d_c if on_device or out is not None else d_c.copy_to_host()


def matmul_naive(a, b, *, out=None, config=None):
    """Step 1 — naive: one thread per output element.

    Thread (row, col) walks K and reads ``a[row, k]`` and ``b[k, col]`` from global memory: two
    loads per fused multiply-add (compute intensity 2·1·1/(1+1) = 1 flop per load). Threads
    with neighbouring ``threadIdx.x`` own neighbouring columns, so B and C accesses coalesce.

    Args:
        a: (M, K) numpy array or CUDA device array, float32 or float64.
        b: (K, N) array of the same kind and dtype.
        out: optional (M, N) device array to write into (then it is returned).
        config: a ``TileConfig``; only ``threads_y``/``threads_x`` matter here.

    Returns:
        c = a @ b, a numpy array for numpy inputs, a device array for device inputs.

    Raises:
        ShapeError: the shapes do not fit (M, K) @ (K, N).
        DTypeError: the dtypes differ or are not float32/float64.
    """
    return _run("naive", a, b, out, config)


def matmul_thread_tile(a, b, *, out=None, config=None):
    """Step 2 — 4×4 thread tile from 128-bit loads.

    Each thread computes a 4×4 tile of C. Per step of 4 along K it loads 4 consecutive k of
    each of its 4 rows of A and 4 consecutive columns of each of 4 rows of B — in the book's
    CUDA C each is one 128-bit ``float4`` load; Numba has no vector load, so here a "wide load"
    is emulated by 4 consecutive scalar loads into local registers. 32 loads then feed
    64 multiply-adds: compute intensity 2·4·4/(4+4) = 4 flops per load instead of 1.

    Args, returns and raises as ``matmul_naive``; ``config`` defaults to 16×16 threads.
    """
    return _run("thread_tile", a, b, out, config)


def matmul_block_tile(a, b, *, out=None, config=None):
    """Step 3 — bigger thread tile: 128×128 block tile, K-step 16, 8×8 outputs per thread.

    Same global-memory algorithm as ``matmul_thread_tile`` with the book's larger layout:
    16×16 threads each own an 8×8 tile made of four 4×4 pieces spaced 64 rows/columns apart
    (so a warp's wide loads still cover contiguous memory). Intensity rises to
    2·8·8/(8+8) = 8 flops per load, and the block walks K in steps of 16.

    Args, returns and raises as ``matmul_naive``.
    """
    return _run("block_tile", a, b, out, config)


def matmul_shared(a, b, *, out=None, config=None):
    """Step 4 — shared-memory tiling.

    The block's 256 threads cooperatively copy the 128×16 tile of A and the 16×128 tile of B
    into ``cuda.shared.array`` (each thread two wide loads of each), ``cuda.syncthreads()``,
    and then read every operand from shared memory: each value fetched from global memory is
    now reused by 16 threads instead of being fetched by each of them. A second barrier keeps
    the next tile from overwriting data still being read.

    Args, returns and raises as ``matmul_naive``.
    """
    return _run("shared", a, b, out, config)


def matmul_shared_transposed(a, b, *, out=None, config=None):
    """Step 5 — transposed A tile in shared memory.

    The A tile is stored as ``[k, m]`` instead of ``[m, k]``, so in the inner loop a thread's
    rows of A for one k lie next to each other — the same contiguous access B already has
    (one 128-bit shared load per 4-row piece in CUDA C, and no bank conflicts between the two
    halves of a warp, whose rows differ by 4 and would otherwise hit the same bank).

    Args, returns and raises as ``matmul_naive``.
    """
    return _run("shared_transposed", a, b, out, config)


def matmul_shared_prefetch(a, b, *, out=None, config=None):
    """Step 6 — hide shared-memory latency: prefetch the next fragment into registers.

    Two register fragments per operand: while the outer product of k-slice ``kk`` runs, the
    loads of slice ``kk + 1`` from shared memory are already in flight, so the math units do
    not wait for shared memory. (The k loop is unrolled by two so both fragments stay in
    registers.)

    Args, returns and raises as ``matmul_naive``.
    """
    return _run("shared_prefetch", a, b, out, config)


def matmul_double_buffer(a, b, *, out=None, config=None):
    """Step 7 — hide global-memory latency: double-buffered shared tiles (the book's final).

    Two shared buffers per operand. While tile t is computed from one buffer, tile t+1 is
    loaded from global memory into registers (issued first, consumed last), then stored into
    the other buffer; one ``syncthreads`` per tile swaps their roles. Global-memory latency
    overlaps the math, on top of step 6's shared-memory prefetch.

    Args, returns and raises as ``matmul_naive``.
    """
    return _run("double_buffer", a, b, out, config)


VARIANTS = {
    "naive": matmul_naive,
    "thread_tile": matmul_thread_tile,
    "block_tile": matmul_block_tile,
    "shared": matmul_shared,
    "shared_transposed": matmul_shared_transposed,
    "shared_prefetch": matmul_shared_prefetch,
    "double_buffer": matmul_double_buffer,
}
"""The ladder in the book's order."""


def matmul(a, b, variant="double_buffer", *, out=None, config=None):
    """c = a @ b with one step of the CUDA ladder (default: the book's final kernel).

    Args:
        a: (M, K) numpy or CUDA device array.
        b: (K, N) numpy or CUDA device array of the same dtype.
        variant: a key of ``VARIANTS``.
        out: optional device array for the result.
        config: optional ``TileConfig`` (e.g. ``SIMULATOR_CONFIGS[variant]``).

    Returns:
        a @ b, numpy for numpy inputs, on the device for device inputs.
    """
    if variant not in VARIANTS:
        raise ValueError(f"matmul: unknown variant {variant!r}; choose from {list(VARIANTS)}")
    return VARIANTS[variant](a, b, out=out, config=config)


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return bool(_numba_config.ENABLE_CUDASIM)
