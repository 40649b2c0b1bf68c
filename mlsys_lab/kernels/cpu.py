"""The CPU GEMM ladder: ``c = a @ b`` in Numba, one optimisation per rung.

==============  ==================================================================================
``naive``        the textbook ``i, j, k`` triple loop, one dot product per output element
``loop_order``   ``i, k, j`` order: the inner loop streams rows of B and C (unit stride, SIMD)
``tiled``        cache blocking over ``i``, ``j`` and ``k``: a tile of A, B and C is reused in cache
``parallel``     the tiled kernel with row blocks of C spread over cores (``numba.prange``)
``packed``       BLIS/Goto structure: packed panels of A and B and a register-blocked micro-kernel
==============  ==================================================================================

Every rung is a plain function ``matmul_<name>(a, b)`` taking two 2-D numpy arrays of the same
float dtype (float32 or float64) and returning a new C-contiguous array of that dtype. The Python
wrapper checks shapes and dtypes (raising :class:`~mlsys_lab.errors.ShapeError` /
:class:`~mlsys_lab.errors.DTypeError`) and makes the operands C-contiguous, so transposed or
strided views work; the jitted kernel behind it does the arithmetic. Any sizes work: the blocked
kernels clip their tiles at the matrix edges.

The packed rung's register tile and cache blocks depend on the instruction set Numba compiles for
and on the cache sizes (:mod:`.cpu_config`): :data:`CONFIG` is this process's choice, and
``matmul_packed(a, b, config="avx2")`` forces any configuration on any machine.

Compute intensity in the docstrings is FLOPs per byte moved between main memory (or the cache
level named) and the core, for ``s``-byte elements (``s = 4`` for float32).
"""

from __future__ import annotations

import functools
import re

import numba
import numpy as np
from llvmlite import ir as llvmir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..engine.numba_cache import CACHE
from ..errors import ArgumentError, DTypeError, ShapeError
from . import cpu_config
from .cpu_config import Blocking, PackedConfig

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# Compiled at first call for each dtype. ``cache=CACHE`` keeps compiled code out of the source
# tree; ``fastmath`` lets LLVM reassociate sums so inner loops vectorise (rounding differs from
# numpy's at the level of float round-off).
_JIT = dict(cache=CACHE, fastmath=True)

TILE_I, TILE_J, TILE_K = 64, 256, 128
"""Cache tile of the ``tiled`` and ``parallel`` rungs: C tile TILE_I×TILE_J, K in TILE_K steps
(A tile 32 KiB + B tile 128 KiB in float32: they fit the L2 cache)."""

CONFIG = cpu_config.selected()
"""The packed rung's configuration for the code Numba emits in this process, and why
(:func:`.cpu_config.choose`); ``print(CONFIG)`` describes it."""

_FLOAT32_BLOCKING = CONFIG.blocking(np.float32)
MR, NR = _FLOAT32_BLOCKING.mr, _FLOAT32_BLOCKING.nr
KC, MC, NC = _FLOAT32_BLOCKING.kc, _FLOAT32_BLOCKING.mc, _FLOAT32_BLOCKING.nc
"""The ``packed`` rung's float32 register tile (MR×NR) and cache blocks (KC, MC, NC) on this
machine: an MC×KC block of packed A fills half of L2, KC = 8·MC (:mod:`.cpu_config`)."""


def flops(m: int, n: int, k: int) -> int:
    """FLOPs of an (m×k) @ (k×n) matrix product: one multiply and one add per term, ``2·m·n·k``."""
    return 2 * m * n * k


# ------------------------------------------------------------------------------------------------
# Rungs 1-4: loops over the original row-major arrays
# ------------------------------------------------------------------------------------------------


@njit(**_JIT)
def _naive_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            acc = c[i, j]  # 0: c arrives zero-filled
            for p in range(k):
                acc += a[i, p] * b[p, j]  # b is walked down a column: stride n
            c[i, j] = acc


@njit(**_JIT)
def _loop_order_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    for i in range(m):
        for p in range(k):
            a_ip = a[i, p]
            for j in range(n):  # unit stride through b[p, :] and c[i, :]
                c[i, j] += a_ip * b[p, j]


@njit(**_JIT)
def _tile_update(a, b, c, i0, j0, p0):
    """c[tile] += a[tile] @ b[tile] for the cache tile at (i0, j0, p0), in i, k, j order."""
    i1 = min(i0 + TILE_I, a.shape[0])
    j1 = min(j0 + TILE_J, b.shape[1])
    p1 = min(p0 + TILE_K, a.shape[1])
    for i in range(i0, i1):
        c_row = c[i, j0:j1]
        for p in range(p0, p1):
            a_ip = a[i, p]
            b_row = b[p, j0:j1]
            for j in range(c_row.shape[0]):  # from 0: no negative-index check, so it vectorises
                c_row[j] += a_ip * b_row[j]


@njit(**_JIT)
def _tiled_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    for i0 in range(0, m, TILE_I):
        for j0 in range(0, n, TILE_J):
            for p0 in range(0, k, TILE_K):
                _tile_update(a, b, c, i0, j0, p0)


@njit(parallel=True, **_JIT)
def _parallel_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    n_row_blocks = (m + TILE_I - 1) // TILE_I
    for block in prange(n_row_blocks):  # iteration `block` alone writes rows of this block of C
        i0 = block * TILE_I
        for j0 in range(0, n, TILE_J):
            for p0 in range(0, k, TILE_K):
                _tile_update(a, b, c, i0, j0, p0)


# ------------------------------------------------------------------------------------------------
# Rung 5: packing + register-blocked micro-kernel
# ------------------------------------------------------------------------------------------------


@intrinsic
def _stack_buffer(typingctx, size, dtype):
    """A pointer to ``size`` elements of ``dtype`` on the stack (``size`` a compile-time int)."""
    if not isinstance(size, types.IntegerLiteral):
        return None  # numba retries with the literal value
    count = size.literal_value

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_value_type(dtype.dtype), size=count)

    return types.CPointer(dtype.dtype)(size, dtype), codegen


def _c_matrix(ty, dtype=None):
    return (isinstance(ty, types.Array) and ty.ndim == 2 and ty.layout == "C"
            and (dtype is None or ty.dtype == dtype))


@intrinsic
def _register_tile(typingctx, a_panel, b_panel, c, i0, j0, mr, vectors, lanes, accumulate):
    """``c[i0:i0+MR, j0:j0+NR] (+)= a_panel.T @ b_panel`` in ``MR·vectors`` vector registers.

    ``a_panel`` is (kc, MR) and ``b_panel`` (kc, NR) packed rows, ``NR = vectors·lanes``; the
    tile must lie inside ``c``. ``accumulate`` (a literal 0 or 1) chooses ``+=`` or ``=``: the
    first KC step overwrites C, which therefore need not be zeroed first.

    Written as LLVM vector IR because the auto-vectoriser picks a different shape for every
    tile and target (a 6×16 tile for haswell came out scalar, with the tile in memory): here
    each accumulator *is* one ``<lanes × float>`` value, and per step of k the loop loads
    ``vectors`` vectors of B, broadcasts each of the MR elements of A and does ``MR·vectors``
    multiply-adds, which LLVM fuses into FMA instructions where the target has them.
    """
    literals = (mr, vectors, lanes, accumulate)
    if not all(isinstance(x, types.IntegerLiteral) for x in literals):
        return None
    if not (_c_matrix(a_panel) and _c_matrix(b_panel, a_panel.dtype)
            and _c_matrix(c, a_panel.dtype)):
        return None
    rows, width, count, add = (x.literal_value for x in literals)

    def codegen(context, builder, signature, args):
        a_arr, b_arr, c_arr = (context.make_array(ty)(context, builder, value)
                               for ty, value in zip(signature.args[:3], args[:3]))
        i0_, j0_ = (context.cast(builder, v, ty, types.intp)
                    for v, ty in zip(args[3:5], signature.args[3:5]))
        element = context.get_value_type(signature.args[0].dtype)
        ldc = cgutils.unpack_tuple(builder, c_arr.shape)[1]
        c_rows = [builder.gep(c_arr.data, [builder.add(builder.mul(builder.add(i0_, _i64(i)),
                                                                   ldc), j0_)])
                  for i in range(rows)]
        accs, loop, done = _emit_k_loop(context, builder, element, a_arr, b_arr, rows, width,
                                        count)
        builder.position_at_end(done)
        for i, row in enumerate(c_rows):
            for v in range(width):
                where = builder.bitcast(builder.gep(row, [_i64(v * count)]),
                                        llvmir.VectorType(element, count).as_pointer())
                total = accs[i * width + v]
                if add:
                    old = builder.load(where, align=context.get_abi_sizeof(element))
                    total = builder.fadd(old, total, flags=_FAST)
                builder.store(total, where, align=context.get_abi_sizeof(element))
        return context.get_dummy_value()

    return types.none(a_panel, b_panel, c, i0, j0, mr, vectors, lanes, accumulate), codegen


_FAST = ("fast",)

def _i64(value):
    return llvmir.Constant(llvmir.IntType(64), value)


def _emit_k_loop(context, builder, element, a_arr, b_arr, rows, width, count):
    """Emit ``for p in range(kc)``: the rank-1 update of the accumulators; return them (the
    loop's phi values), the loop block and the exit block (the builder is left in neither)."""
    vector = llvmir.VectorType(element, count)
    align = context.get_abi_sizeof(element)
    kc = cgutils.unpack_tuple(builder, a_arr.shape)[0]
    entry = builder.basic_block
    loop, body, done = (builder.append_basic_block(f"tile.{n}") for n in ("loop", "body", "done"))
    builder.branch(loop)
    builder.position_at_end(loop)
    p = builder.phi(llvmir.IntType(64))
    p.add_incoming(_i64(0), entry)
    zero = llvmir.Constant(vector, [0.0] * count)
    accs = [builder.phi(vector) for _ in range(rows * width)]
    for acc in accs:
        acc.add_incoming(zero, entry)
    builder.cbranch(builder.icmp_signed("<", p, kc), body, done)

    builder.position_at_end(body)
    b_row = builder.gep(b_arr.data, [builder.mul(p, _i64(width * count))])
    b_vectors = [builder.load(builder.bitcast(builder.gep(b_row, [_i64(v * count)]),
                                              vector.as_pointer()), align=align)
                 for v in range(width)]
    a_row = builder.gep(a_arr.data, [builder.mul(p, _i64(rows))])
    undef = llvmir.Constant(vector, llvmir.Undefined)
    lane0 = llvmir.Constant(llvmir.IntType(32), 0)
    splat = llvmir.Constant(llvmir.VectorType(llvmir.IntType(32), count), [0] * count)
    updated = []
    for i in range(rows):
        a_ip = builder.load(builder.gep(a_row, [_i64(i)]))
        a_vec = builder.shuffle_vector(builder.insert_element(undef, a_ip, lane0), undef, splat)
        for v in range(width):
            product = builder.fmul(a_vec, b_vectors[v], flags=_FAST)
            updated.append(builder.fadd(accs[i * width + v], product, flags=_FAST))
    p.add_incoming(builder.add(p, _i64(1)), body)
    for acc, value in zip(accs, updated):
        acc.add_incoming(value, body)
    builder.branch(loop)
    return accs, loop, done


@functools.lru_cache(maxsize=None)
def _micro_kernel(mr, vectors, lanes):
    """The micro-kernel for an ``mr × (vectors·lanes)`` register tile, compiled per tile shape:
    ``micro_kernel(a_panel, b_panel, c, i0, j0, accumulate)``.

    A full tile goes straight into C; a tile that overhangs C's edge is computed into a stack
    buffer and only its inside is stored (or added) into C.
    """
    nr = vectors * lanes
    size = mr * nr

    @njit(**_JIT)
    def micro_kernel(a_panel, b_panel, c, i0, j0, accumulate):
        if i0 + mr <= c.shape[0] and j0 + nr <= c.shape[1]:
            if accumulate:
                _register_tile(a_panel, b_panel, c, i0, j0, mr, vectors, lanes, 1)
            else:
                _register_tile(a_panel, b_panel, c, i0, j0, mr, vectors, lanes, 0)
            return
        edge = numba.carray(_stack_buffer(size, c.dtype), (mr, nr))
        _register_tile(a_panel, b_panel, edge, 0, 0, mr, vectors, lanes, 0)
        for i in range(min(mr, c.shape[0] - i0)):
            for j in range(min(nr, c.shape[1] - j0)):
                c[i0 + i, j0 + j] = (c[i0 + i, j0 + j] + edge[i, j]) if accumulate else edge[i, j]

    return micro_kernel


@njit(**_JIT)
def _pack_a(a, panels, i0, p0, p1):
    """A[i0:i0+MC, p0:p1] → panels[MC/MR, p1-p0, MR]: MR-row panels column by column,
    zero-padded past the last row of A. Packed per block, by the thread that uses it (in L2)."""
    mr = panels.shape[2]
    for r in range(panels.shape[0]):
        for i in range(mr):
            row = i0 + r * mr + i
            if row < a.shape[0]:
                for p in range(p1 - p0):
                    panels[r, p, i] = a[row, p0 + p]
            else:
                for p in range(p1 - p0):
                    panels[r, p, i] = 0


PACK_B_ROWS = 16
"""Rows of B per parallel strip of :func:`_pack_b`."""


@njit(parallel=True, **_JIT)
def _pack_b(b, panels):
    """B (k×n) → panels[n/NR, k, NR]: each NR-column panel row by row, zero-padded.

    Strips of PACK_B_ROWS rows in parallel: a strip of B stays in L1 while it is dealt out to
    every panel, and each full panel's rows are copied with a loop of constant length NR (a few
    vector moves; a loop to ``min(NR, n - j)`` ran 5× slower). Only the last panel can overhang
    B's edge.
    """
    k, n = b.shape
    nr = panels.shape[2]
    full = n // nr
    for strip in prange((k + PACK_B_ROWS - 1) // PACK_B_ROWS):
        p0, p1 = strip * PACK_B_ROWS, min(k, strip * PACK_B_ROWS + PACK_B_ROWS)
        for s in range(full):
            for p in range(p0, p1):
                source, panel_row = b[p, s * nr : s * nr + nr], panels[s, p]
                for j in range(nr):
                    panel_row[j] = source[j]
        if full < panels.shape[0]:
            for p in range(p0, p1):
                for j in range(nr):
                    panels[full, p, j] = b[p, full * nr + j] if full * nr + j < n else 0


@njit(**_JIT)
def _thread_rows(t, threads, m, mr, mc):
    """``(first, last, step)``: rows ``[first, last)`` of C for thread ``t`` of ``threads``, its
    share of the MR-row tiles (within one tile of every other thread's; ``first`` a multiple of
    ``mr``), taken in as few blocks as ``mc`` allows, all of ``step`` rows (a multiple of ``mr``,
    at most ``mc``) but the last: a block of a few tiles would pay a whole sweep of B for them."""
    tiles = (m + mr - 1) // mr
    first, last = t * tiles // threads * mr, min(m, (t + 1) * tiles // threads * mr)
    blocks = max(1, (last - first + mc - 1) // mc)
    return first, last, max(mr, ((last - first + blocks - 1) // blocks + mr - 1) // mr * mr)


@njit(parallel=True, **_JIT)
def _packed_kernel(a, b, c, a_buffers, b_panels, micro_kernel, kc, mc, nc):
    """BLIS loop nest around ``micro_kernel`` (one compiled copy per micro-kernel).

    ``b_panels`` receives all of packed B. Thread ``t`` of ``T = len(a_buffers)`` owns the
    ``t``-th ``1/T`` of the MR-row tiles of C (so no two threads write one element, and none
    has more than one tile more than another) and packs its MC×KC blocks of A into
    ``a_buffers[t]``, which stays in its core's L2. The loops run BLIS's order, NC then KC
    outermost, so the threads sweep one KC×NC panel of packed B (in L3) at the same time.

    Measured on a Zen 5 (AVX-512, float32, one thread, n = 2048; n = 1024 in brackets), against
    the earlier nest (B packed with a loop to ``min(NR, n - j)``, each MC block running all its
    KC steps, C zero-filled and added to): the packing of B took 8.3 ms of 90 (2.8 of 11.4), its
    constant-length copy 1.7; the NC-KC-MC order saved a further 3% (under 1%); storing on the
    first KC step instead of zero-filling C, about 5%. A dynamic schedule over MC blocks
    (``numba.parallel_chunksize(1)``) ran 5% slower on two quiet cores than one share each.
    """
    m, k = a.shape
    n = b.shape[1]
    threads, mr, nr = a_buffers.shape[0], a_buffers.shape[3], b_panels.shape[2]
    _pack_b(b, b_panels)
    for t in prange(threads):
        first, last, step = _thread_rows(t, threads, m, mr, mc)
        for jc in range(0, n, nc):
            for pc in range(0, k, kc):
                pe = min(k, pc + kc)
                for ic in range(first, last, step):
                    a_panels = a_buffers[t, : (min(step, last - ic) + mr - 1) // mr]
                    _pack_a(a, a_panels, ic, pc, pe)
                    for jr in range(jc, min(n, jc + nc), nr):  # a KC×NR panel of B (L1/L2) ...
                        b_panel = b_panels[jr // nr, pc:pe]
                        for r in range(a_panels.shape[0]):  # ... meets the block of A (L2)
                            micro_kernel(a_panels[r, : pe - pc], b_panel, c, ic + r * mr, jr,
                                         pc > 0)


def _ceil_div(x, y):
    return -(-x // y)


# ------------------------------------------------------------------------------------------------
# Public wrappers
# ------------------------------------------------------------------------------------------------


_RUNG_ARGUMENTS = """
    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
"""


def _rung(matmul_rung):
    """Append the arguments, result and errors every plain rung shares to its docstring."""
    matmul_rung.__doc__ = matmul_rung.__doc__.rstrip() + "\n" + _RUNG_ARGUMENTS
    return matmul_rung


def _prepare(a, b, variant, zeroed=True):
    """Check the operands of ``matmul`` and return them C-contiguous with a result array,
    zero-filled (for kernels that add into it) unless ``zeroed`` is False."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ShapeError(
            f"matmul (variant {variant!r}): cannot multiply shapes {a.shape} and {b.shape}; "
            "need 2-D (m, k) @ (k, n)"
        )
    if a.dtype != b.dtype:
        raise DTypeError(
            f"matmul (variant {variant!r}): operand dtypes differ: {a.dtype} and {b.dtype}"
        )
    if a.dtype not in SUPPORTED_DTYPES:
        raise DTypeError(
            f"matmul (variant {variant!r}): dtype {a.dtype} not supported; use float32 or float64"
        )
    c = (np.zeros if zeroed else np.empty)((a.shape[0], b.shape[1]), a.dtype)
    return np.ascontiguousarray(a), np.ascontiguousarray(b), c


@_rung
def matmul_naive(a, b):
    """The ``i, j, k`` triple loop: each output element is one dot product.

    The starting point. The inner loop walks B down a column (stride ``n`` elements), so every
    multiply-add pulls a fresh cache line of B and uses 4 or 8 bytes of it.

    Compute intensity: 2 FLOPs per A element (s bytes) plus a B cache line (64 bytes) moved,
    about ``2 / (s + 64)`` ≈ 0.03 FLOP/byte in float32 once B no longer fits in cache.
    """
    a, b, c = _prepare(a, b, "naive")
    _naive_kernel(a, b, c)
    return c


@_rung
def matmul_loop_order(a, b):
    """Loop order ``i, k, j``: ``c[i, :] += a[i, p] * b[p, :]``.

    Adds over ``naive``: spatial locality. The inner loop streams a row of B and a row of C at
    unit stride, so every byte of each cache line is used and the loop vectorises into SIMD
    multiply-adds; ``a[i, p]`` stays in a register.

    Compute intensity: 2 FLOPs per B element read plus C element read and written,
    ``2 / (3·s)`` ≈ 0.17 FLOP/byte in float32: no reuse yet, but no wasted bytes either.
    """
    a, b, c = _prepare(a, b, "loop_order")
    _loop_order_kernel(a, b, c)
    return c


@_rung
def matmul_tiled(a, b):
    """Cache tiling (blocking) over ``i``, ``j`` and ``k``, ``i, k, j`` order inside a tile.

    Adds over ``loop_order``: temporal locality. A TILE_I×TILE_K tile of A and a TILE_K×TILE_J
    tile of B are loaded into cache once and reused for a whole TILE_I×TILE_J tile of C.

    Compute intensity: a (ti×tj) C tile does ``2·ti·tj·tk`` FLOPs for ``(ti + tj)·tk`` loaded
    elements, ``2·ti·tj / ((ti + tj)·s)`` FLOP/byte: 2·64·256/(320·4) = 25.6 for float32, the
    same ``2mn/(m+n)`` law as the book's thread tile (``roofline.tile_intensity``).
    """
    a, b, c = _prepare(a, b, "tiled")
    _tiled_kernel(a, b, c)
    return c


@_rung
def matmul_parallel(a, b):
    """The tiled kernel with blocks of TILE_I rows of C spread over cores by ``numba.prange``.

    Adds over ``tiled``: thread parallelism, raising the compute roof by the core count. Each
    ``prange`` iteration owns a disjoint row block of C, so no two threads write the same
    element and nothing is shared but the read-only A and B: no race, no locks.

    Compute intensity: per core as ``tiled`` (25.6 FLOP/byte in float32); the cores now share
    the memory bandwidth, so the kernel needs that intensity to stay compute-bound.
    """
    a, b, c = _prepare(a, b, "parallel")
    _parallel_kernel(a, b, c)
    return c


def matmul_packed(a, b, config: str | PackedConfig | None = None,
                  blocking: Blocking | None = None):
    """The BLIS/Goto GEMM: packed panels and an MR×NR register-blocked micro-kernel.

    Adds over ``parallel``: (1) *packing* - A is copied into MR-row panels and B into NR-column
    panels, each stored in the exact order the micro-kernel reads it, so every load is
    contiguous and TLB-friendly and edge tiles are zero-padded; (2) *register blocking* - the
    micro-kernel keeps an MR×NR tile of C in vector registers (``MR · NR/lanes`` accumulators)
    and per step of k loads NR elements of B and broadcasts MR of A for ``2·MR·NR`` FLOPs;
    (3) *cache blocking* - a KC×NR panel of B (in L1 or L2) meets the MR-row panels of an
    MC×KC block of A, which each thread packs into its own buffer and keeps in its core's L2;
    the threads share one packed copy of B (L3) and each owns an equal share of C's MR-row
    tiles, so no element is written by two threads. The first KC step stores into C and the
    later ones add, so C is not zero-filled first. The tile and blocks depend on the
    instruction set Numba compiles for and on the cache sizes (:mod:`.cpu_config`;
    :data:`CONFIG` is this machine's choice).

    Compute intensity: from registers' view ``2·MR·NR / (MR + NR)`` FLOPs per element loaded
    from L1 (12×32 float32: 17.5); from memory, a KC-deep MC×NC block does
    ``2·MC·NC / ((MC + NC)·s)`` FLOP/byte (``s`` bytes an element).

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.
        config: A name in :data:`.cpu_config.CONFIGS` (``"avx512"``, ``"avx2"``,
            ``"portable"``) or a :class:`.cpu_config.PackedConfig`; every one is correct on
            every machine. None: :data:`CONFIG`, the one for this machine.
        blocking: A :class:`.cpu_config.Blocking` with the config's tile for this dtype, to
            override the cache blocks (tests use tiny ones). None: from the cache sizes.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
        UnknownNameError: ``config`` names no configuration.
        ArgumentError: ``blocking`` does not suit the configuration.
    """
    a, b, c = _prepare(a, b, "packed", zeroed=False)
    chosen = CONFIG.config if config is None else cpu_config.get_config(config)
    blocks = chosen.blocking(a.dtype) if blocking is None else blocking
    blocks.check(chosen, a.dtype)
    if c.size == 0 or a.shape[1] == 0:
        return np.zeros_like(c)
    (m, k), n = a.shape, b.shape[1]
    threads = min(numba.get_num_threads(), _ceil_div(m, blocks.mr))  # a tile each at least
    micro_kernel = _micro_kernel(chosen.mr, chosen.vectors, chosen.lanes(a.dtype))
    # numpy allocates the buffers: it asks for huge pages for large arrays (fewer page faults
    # and TLB misses than Numba's allocator).
    b_panels = np.empty((_ceil_div(n, blocks.nr), k, blocks.nr), a.dtype)
    a_buffers = np.empty((threads, blocks.mc // blocks.mr, min(blocks.kc, k), blocks.mr),
                         a.dtype)
    _packed_kernel(a, b, c, a_buffers, b_panels, micro_kernel, blocks.kc, blocks.mc, blocks.nc)
    return c


@functools.lru_cache(maxsize=None)
def _one_tile(mr, vectors, lanes):
    """One register tile alone, compiled as the micro-kernel compiles it (which holds three
    copies: add into C, store into C, into the edge buffer): what :func:`emitted_fmas` reads.
    Never cached: code loaded from Numba's cache cannot be disassembled."""
    @njit(**{**_JIT, "cache": False})
    def one_tile(a_panel, b_panel, c):
        _register_tile(a_panel, b_panel, c, 0, 0, mr, vectors, lanes, 1)

    return one_tile


def emitted_fmas(config: str | PackedConfig | None = None, dtype=np.float32) -> dict[str, int]:
    """Vector multiply-add instructions in one compiled register tile, by register class: one
    per accumulator (``MR × NR / lanes``) per step of k, times however often LLVM unrolled k.

    What LLVM actually emitted for the configuration's tile on this process's target: on
    x86 ``{"zmm": ..., "ymm": ..., "xmm": ...}`` counts ``vfmadd`` (an avx512 tile compiled
    for haswell shows ymm only), on ARM ``{"v": ...}`` counts ``fmla``. Compiles the
    micro-kernel for ``dtype`` if needed.
    """
    chosen = CONFIG.config if config is None else cpu_config.get_config(config)
    kernel = _one_tile(chosen.mr, chosen.vectors, chosen.lanes(dtype))
    mr, nr = chosen.tile(dtype)
    kernel(np.zeros((1, mr), dtype), np.zeros((1, nr), dtype), np.zeros((mr, nr), dtype))
    asm = "\n".join(kernel.inspect_asm().values())
    x86 = re.findall(r"\bvfn?madd\w*\s+([^\n]*)", asm)
    if x86:
        return {reg: sum(f"%{reg}" in line for line in x86) for reg in ("zmm", "ymm", "xmm")}
    return {"v": len(re.findall(r"\bfmla\s+v", asm))}


VARIANTS = {
    "naive": matmul_naive,
    "loop_order": matmul_loop_order,
    "tiled": matmul_tiled,
    "parallel": matmul_parallel,
    "packed": matmul_packed,
}
"""The ladder, slowest rung first: name → ``f(a, b) -> a @ b``."""


def matmul(a, b, variant: str = "packed", config: str | PackedConfig | None = None):
    """``a @ b`` with the named rung of the CPU ladder (see :data:`VARIANTS`).

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.
        variant: a key of :data:`VARIANTS`.
        config: for ``variant="packed"`` only: its configuration (see :func:`matmul_packed`).

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ValueError: unknown ``variant``.
        ArgumentError: ``config`` given for a variant other than ``"packed"``.
        ShapeError, DTypeError, UnknownNameError: as the variant's function.
    """
    try:
        kernel = VARIANTS[variant]
    except KeyError:
        raise ValueError(
            f"matmul: unknown CPU variant {variant!r}; choose one of {list(VARIANTS)}"
        ) from None
    if config is None:
        return kernel(a, b)
    if variant != "packed":
        raise ArgumentError(f"matmul: config={config!r} applies to variant 'packed' only, "
                            f"not {variant!r}")
    return kernel(a, b, config=config)
