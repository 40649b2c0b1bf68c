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

Compute intensity in the docstrings is FLOPs per byte moved between main memory (or the cache
level named) and the core, for ``s``-byte elements (``s = 4`` for float32).
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import DTypeError, ShapeError

SUPPORTED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# Compiled at first call for each dtype. ``cache=False`` keeps compiled code out of the source
# tree; ``fastmath`` lets LLVM reassociate sums so inner loops vectorise (rounding differs from
# numpy's at the level of float round-off).
_JIT = dict(cache=False, fastmath=True)

TILE_I, TILE_J, TILE_K = 64, 256, 128
"""Cache tile of the ``tiled`` and ``parallel`` rungs: C tile TILE_I×TILE_J, K in TILE_K steps
(A tile 32 KiB + B tile 128 KiB in float32: they fit the L2 cache)."""

MR, NR = 4, 64
"""Register tile of the ``packed`` micro-kernel: MR×NR accumulators. 4×64 float32 is 16 AVX-512
registers (4 rows × 4 vectors of 16 lanes); LLVM's vectoriser handles this shape well."""

KC, MC, NC = 512, 256, 128
"""Cache blocks of the ``packed`` rung. Each ``prange`` iteration owns an MC×NC block of C and
walks K in KC steps: the KC×NC block of packed B (256 KiB float32) stays in L2 while each
MR×KC micro-panel of A (8 KiB) sits in L1 and meets every NR-wide panel of the B block."""

_ACC_SIZE = MR * NR  # a compile-time constant for the stack buffer


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
    """A pointer to ``size`` elements of ``dtype`` on the stack (``size`` a compile-time int).

    A stack buffer of constant size, indexed with constants once its loops are unrolled, is one
    LLVM can promote to registers; a heap array from ``np.zeros`` it cannot.
    """
    if not isinstance(size, types.IntegerLiteral):
        return None  # numba retries with the literal value
    count = size.literal_value

    def codegen(context, builder, signature, args):
        return cgutils.alloca_once(builder, context.get_value_type(dtype.dtype), size=count)

    return types.CPointer(dtype.dtype)(size, dtype), codegen


@njit(parallel=True, **_JIT)
def _pack_a(a):
    """A (m×k) → panels[m/MR, k, MR]: each MR-row panel column-by-column, zero-padded."""
    m, k = a.shape
    panels = np.zeros(((m + MR - 1) // MR, k, MR), a.dtype)
    for r in prange(panels.shape[0]):
        rows = min(MR, m - r * MR)
        panels[r, :, :rows] = a[r * MR : r * MR + rows, :].T
    return panels


@njit(parallel=True, **_JIT)
def _pack_b(b):
    """B (k×n) → panels[n/NR, k, NR]: each NR-column panel row-by-row, zero-padded."""
    k, n = b.shape
    panels = np.zeros(((n + NR - 1) // NR, k, NR), b.dtype)
    for s in prange(panels.shape[0]):
        cols = min(NR, n - s * NR)
        panels[s, :, :cols] = b[:, s * NR : s * NR + cols]
    return panels


@njit(**_JIT)
def _micro_kernel(a_panel, b_panel, c, i0, j0, p0, p1):
    """c[i0:i0+MR, j0:j0+NR] += a_panel[p0:p1].T @ b_panel[p0:p1], clipped to c's edges."""
    acc = numba.carray(_stack_buffer(_ACC_SIZE, c.dtype), (MR, NR))
    for i in range(MR):
        for j in range(NR):
            acc[i, j] = 0
    for p in range(p0, p1):  # one rank-1 update of the MR×NR register tile per step
        for i in range(MR):
            a_ip = a_panel[p, i]
            for j in range(NR):
                acc[i, j] += a_ip * b_panel[p, j]
    rows = min(MR, c.shape[0] - i0)
    cols = min(NR, c.shape[1] - j0)
    if rows == MR and cols == NR:  # full tile: constant trip counts vectorise
        for i in range(MR):
            for j in range(NR):
                c[i0 + i, j0 + j] += acc[i, j]
    else:
        for i in range(rows):
            for j in range(cols):
                c[i0 + i, j0 + j] += acc[i, j]


@njit(parallel=True, **_JIT)
def _packed_kernel(a, b, c):
    m, k = a.shape
    n = b.shape[1]
    a_panels = _pack_a(a)
    b_panels = _pack_b(b)
    col_blocks = (n + NC - 1) // NC
    for block in prange(((m + MC - 1) // MC) * col_blocks):  # one MC×NC block of C each
        ic = (block // col_blocks) * MC
        jc = (block % col_blocks) * NC
        for pc in range(0, k, KC):
            pe = min(k, pc + KC)
            for ir in range(ic, min(m, ic + MC), MR):  # an A micro-panel stays in L1 ...
                for jr in range(jc, min(n, jc + NC), NR):  # ... and meets the L2-resident B block
                    _micro_kernel(a_panels[ir // MR], b_panels[jr // NR], c, ir, jr, pc, pe)


# ------------------------------------------------------------------------------------------------
# Public wrappers
# ------------------------------------------------------------------------------------------------


def _prepare(a, b, variant):
    """Check the operands of ``matmul`` and return them C-contiguous with an empty result."""
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
    c = np.zeros((a.shape[0], b.shape[1]), a.dtype)
    return np.ascontiguousarray(a), np.ascontiguousarray(b), c


def matmul_naive(a, b):
    """The ``i, j, k`` triple loop: each output element is one dot product.

    The starting point. The inner loop walks B down a column (stride ``n`` elements), so every
    multiply-add pulls a fresh cache line of B and uses 4 or 8 bytes of it.

    Compute intensity: 2 FLOPs per A element (s bytes) plus a B cache line (64 bytes) moved,
    about ``2 / (s + 64)`` ≈ 0.03 FLOP/byte in float32 once B no longer fits in cache.

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
    """
    a, b, c = _prepare(a, b, "naive")
    _naive_kernel(a, b, c)
    return c


def matmul_loop_order(a, b):
    """Loop order ``i, k, j``: ``c[i, :] += a[i, p] * b[p, :]``.

    Adds over ``naive``: spatial locality. The inner loop streams a row of B and a row of C at
    unit stride, so every byte of each cache line is used and the loop vectorises into SIMD
    multiply-adds; ``a[i, p]`` stays in a register.

    Compute intensity: 2 FLOPs per B element read plus C element read and written,
    ``2 / (3·s)`` ≈ 0.17 FLOP/byte in float32: no reuse yet, but no wasted bytes either.

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
    """
    a, b, c = _prepare(a, b, "loop_order")
    _loop_order_kernel(a, b, c)
    return c


def matmul_tiled(a, b):
    """Cache tiling (blocking) over ``i``, ``j`` and ``k``, ``i, k, j`` order inside a tile.

    Adds over ``loop_order``: temporal locality. A TILE_I×TILE_K tile of A and a TILE_K×TILE_J
    tile of B are loaded into cache once and reused for a whole TILE_I×TILE_J tile of C.

    Compute intensity: a (ti×tj) C tile does ``2·ti·tj·tk`` FLOPs for ``(ti + tj)·tk`` loaded
    elements, ``2·ti·tj / ((ti + tj)·s)`` FLOP/byte: 2·64·256/(320·4) = 25.6 for float32, the
    same ``2mn/(m+n)`` law as the book's thread tile (``roofline.tile_intensity``).

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
    """
    a, b, c = _prepare(a, b, "tiled")
    _tiled_kernel(a, b, c)
    return c


def matmul_parallel(a, b):
    """The tiled kernel with blocks of TILE_I rows of C spread over cores by ``numba.prange``.

    Adds over ``tiled``: thread parallelism, raising the compute roof by the core count. Each
    ``prange`` iteration owns a disjoint row block of C, so no two threads write the same
    element and nothing is shared but the read-only A and B: no race, no locks.

    Compute intensity: per core as ``tiled`` (25.6 FLOP/byte in float32); the cores now share
    the memory bandwidth, so the kernel needs that intensity to stay compute-bound.

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
    """
    a, b, c = _prepare(a, b, "parallel")
    _parallel_kernel(a, b, c)
    return c


def matmul_packed(a, b):
    """The BLIS/Goto GEMM: packed panels and an MR×NR register-blocked micro-kernel.

    Adds over ``parallel``: (1) *packing* - A is copied into MR-row panels and B into NR-column
    panels, each stored in the exact order the micro-kernel reads it, so every load is
    contiguous and TLB-friendly and edge tiles are zero-padded; (2) *register blocking*
    - the micro-kernel keeps an MR×NR tile of C in registers (a stack buffer LLVM promotes) and
    per step of k loads MR elements of A and NR of B for ``2·MR·NR`` FLOPs; (3) KC×NC blocks of B
    sized for the L2 cache, MR×KC micro-panels of A for L1; ``prange`` over MC×NC blocks of C,
    each written by one thread only.

    Compute intensity: from registers' view ``2·MR·NR / (MR + NR)`` = 7.5 FLOPs per element
    loaded from L1; from memory, a KC-deep MC×NC block does ``2·MC·NC / ((MC + NC)·s)`` =
    2·256·128/(384·4) ≈ 42.7 FLOP/byte in float32.

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ShapeError: the operands are not 2-D or their inner dimensions differ.
        DTypeError: the dtypes differ or are not float32/float64.
    """
    a, b, c = _prepare(a, b, "packed")
    _packed_kernel(a, b, c)
    return c


VARIANTS = {
    "naive": matmul_naive,
    "loop_order": matmul_loop_order,
    "tiled": matmul_tiled,
    "parallel": matmul_parallel,
    "packed": matmul_packed,
}
"""The ladder, slowest rung first: name → ``f(a, b) -> a @ b``."""


def matmul(a, b, variant: str = "packed"):
    """``a @ b`` with the named rung of the CPU ladder (see :data:`VARIANTS`).

    Args:
        a: (m, k) float32 or float64 array.
        b: (k, n) array of the same dtype.
        variant: a key of :data:`VARIANTS`.

    Returns:
        The (m, n) product, same dtype.

    Raises:
        ValueError: unknown ``variant``.
        ShapeError, DTypeError: as the variant's function.
    """
    try:
        kernel = VARIANTS[variant]
    except KeyError:
        raise ValueError(
            f"matmul: unknown CPU variant {variant!r}; choose one of {list(VARIANTS)}"
        ) from None
    return kernel(a, b)
