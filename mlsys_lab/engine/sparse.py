"""A row-sparse gradient: the few rows of an embedding table that a batch touched.

An embedding lookup reads a handful of rows of a huge table, so its gradient is zero everywhere
except in those rows. ``RowSparse`` stores only the touched rows (``indices``) and their values,
which is what a parameter server moves over the network instead of the dense table, and what
the tape hands to ``.grad`` for a table looked up with ``sparse=True`` (:mod:`.ops_embedding`:
the flag alone decides; ``sparse=False`` gives a dense Tensor). Optimisers that understand it
update only those rows; the others refuse it.

Densifying is explicit or documented, never a side effect of where the gradient was computed:
``to_dense()``, ``numpy()`` and ``np.asarray(grad)`` ask for it, and a RowSparse added to a
dense gradient of the same table gives a dense one (:func:`accumulate_grad`, ``__add__``, as
PyTorch accumulates a sparse and a dense gradient).
"""

import threading

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import ArgumentError, DTypeError, ShapeError
from .numba_cache import CACHE
from .tensor import Tensor

#: How many rows ahead the row kernels prefetch (16 rows of 256 B: 64 cache lines in flight).
PREFETCH_DISTANCE = 16


@intrinsic
def prefetch(typingctx, arr, row, col):
    """Ask for the cache line holding ``arr[row, col]`` (``llvm.prefetch``; a hint: never
    faults, returns nothing). Row-sparse kernels call it a few rows ahead, so the cache misses
    of random rows overlap instead of queueing. ``row`` and ``col`` may be integers of any
    width or signedness (int32 ids as well as int64): both are widened to ``intp`` first, as
    the pointer arithmetic needs operands of one type."""
    if not isinstance(row, types.Integer) or not isinstance(col, types.Integer):
        return None
    sig = types.void(arr, row, col)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        index = [context.cast(builder, v, t, types.intp)
                 for v, t in zip(args[1:], signature.args[1:])]
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, index)
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        # read (0), high locality (3), data cache (1)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3),
                          ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@numba.njit(cache=CACHE)
def _scatter_add_rows(out, rows, values, scale):
    for k in range(rows.shape[0]):
        r = rows[k]
        for j in range(out.shape[1]):
            out[r, j] += scale * values[k, j]


def scatter_add_rows(out, rows, values, scale=1.0):
    """``out[rows[k]] += scale * values[k]`` for every k, duplicates accumulating (one Numba
    pass; ``np.add.at`` semantics). ``out`` is written in place and returned."""
    if out.size == 0 or len(rows) == 0:
        return out
    if out.flags.c_contiguous:
        flat_values = np.ascontiguousarray(values, dtype=out.dtype).reshape(len(rows), -1)
        _scatter_add_rows(out.reshape(out.shape[0], -1), np.ascontiguousarray(rows, np.int64),
                          flat_values, out.dtype.type(scale))
    else:
        np.add.at(out, rows, values * scale)
    return out


@numba.njit(cache=CACHE)
def _unique_first_seen(ids, table, unique, inverse):
    """Fill ``unique[:count]`` with the distinct ids in order of first appearance and
    ``inverse[k]`` with the position of ``ids[k]`` among them; return ``count``.

    ``table`` is an open-addressing hash table (a power-of-two length >= 2 len(ids)) holding
    positions into ``unique``, whose entries are the keys. It is cleared first with one
    sequential pass, which also brings it into the cache: the random probes that follow then
    hit (probing a cold table costs a cache miss each, about 3x the whole pass)."""
    n = ids.shape[0]
    for i in range(table.shape[0]):
        table[i] = -1
    bits = 0
    while (1 << bits) < table.shape[0]:
        bits += 1
    mask = table.shape[0] - 1
    shift = np.uint64(64 - bits)
    count = 0
    for k in range(n):
        r = np.int64(ids[k])
        h = np.int64((np.uint64(r) * np.uint64(0x9E3779B97F4A7C15)) >> shift)
        while True:
            s = table[h]
            if s == -1:
                table[h] = count
                unique[count] = r
                inverse[k] = count
                count += 1
                break
            if unique[s] == r:
                inverse[k] = s
                break
            h = (h + 1) & mask
    return count


_WORKSPACE = threading.local()


def _hash_table(n):
    """This thread's reusable hash table for ``n`` ids: the smallest power of two >= 2n slots,
    a view of one buffer that grows and is never shrunk (no per-call allocation, and its size
    follows the batch's ids, not the embedding table's rows)."""
    size = 16
    while size < 2 * n:
        size *= 2
    buf = getattr(_WORKSPACE, "table", None)
    if buf is None or buf.shape[0] < size:
        buf = _WORKSPACE.table = np.empty(size, np.int32)
    return buf[:size]


def unique_first_seen(ids):
    """The distinct values of the integer array ``ids`` in order of first appearance, and
    ``inverse`` with ``unique[inverse] == ids`` (a hash table, not ``np.unique``'s sort)."""
    ids = np.asarray(ids)
    n = ids.shape[0]
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    unique, inverse = np.empty(n, np.int64), np.empty(n, np.int64)
    count = _unique_first_seen(ids, _hash_table(n), unique, inverse)
    return unique[:count], inverse


def _check_num_rows(num_rows, owner):
    if isinstance(num_rows, (bool, np.bool_)) or not isinstance(num_rows, (int, np.integer)):
        raise DTypeError(f"{owner}: num_rows must be an int, got {num_rows!r}")
    if num_rows < 0:
        raise ArgumentError(f"{owner}: num_rows must be >= 0, got {num_rows}")
    return int(num_rows)


class RowSparse:
    """Rows ``indices`` of a ``(num_rows, *row_shape)`` array; every other row is zero.

    Duplicate indices are allowed (one per lookup of the same id) and mean their rows add up;
    :meth:`coalesce` merges them into sorted rows, :meth:`merged` into rows in order of first
    appearance (no sort). ``unique`` says the indices are known to be distinct.

    Args:
        indices: 1-D integer array of row numbers in ``[0, num_rows)``, length k.
        values: array of shape ``(k, *row_shape)``, the rows' values.
        num_rows: the number of rows of the dense array this stands for.
        unique: the caller vouches the indices are distinct (as :meth:`merged` makes them).

    Raises:
        DTypeError: indices are not integers, values are not numeric, num_rows is not an int.
        ShapeError: indices are not 1-D, or values' first axis is not len(indices).
        ArgumentError: an index is outside ``[0, num_rows)``.
    """

    __slots__ = ("indices", "values", "num_rows", "unique")

    def __init__(self, indices, values, num_rows, unique=False):
        indices, values = np.asarray(indices), np.asarray(values)
        num_rows = _check_num_rows(num_rows, "RowSparse")
        if indices.size == 0 and indices.dtype.kind not in "iu":
            indices = indices.astype(np.int64)
        if indices.dtype.kind not in "iu":
            raise DTypeError(f"RowSparse: indices must be integers, got {indices.dtype}")
        if indices.ndim != 1:
            raise ShapeError(f"RowSparse: indices must be 1-D, got shape {indices.shape}")
        if values.dtype.kind not in "fiuc":
            raise DTypeError(f"RowSparse: values must be numeric, got {values.dtype}")
        if values.ndim == 0 or values.shape[0] != indices.shape[0]:
            raise ShapeError(f"RowSparse: values must have shape ({indices.shape[0]}, ...) "
                             f"(one row per index), got {values.shape}")
        if indices.size and (indices.min() < 0 or indices.max() >= num_rows):
            bad = indices[(indices < 0) | (indices >= num_rows)][0]
            raise ArgumentError(f"RowSparse: index {int(bad)} is outside [0, {num_rows})")
        self.indices = indices.astype(np.int64, copy=False)
        self.values = values
        self.num_rows = num_rows
        self.unique = bool(unique)

    @classmethod
    def _trusted(cls, indices, values, num_rows, unique):
        """A RowSparse from a kernel that already checked its int64 indices (no checks)."""
        self = object.__new__(cls)
        self.indices, self.values, self.num_rows, self.unique = indices, values, num_rows, unique
        return self

    # --- shape -----------------------------------------------------------------------------------
    @property
    def row_shape(self):
        """The shape of one row."""
        return self.values.shape[1:]

    @property
    def shape(self):
        """The shape of the dense array this stands for."""
        return (self.num_rows, *self.row_shape)

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def nnz_rows(self):
        """Number of stored rows (duplicates counted)."""
        return int(self.indices.shape[0])

    @property
    def nbytes(self):
        """Bytes on the wire: the indices plus the values."""
        return int(self.indices.nbytes + self.values.nbytes)

    def __repr__(self):
        return (f"RowSparse({self.nnz_rows} of {self.num_rows} rows, row_shape={self.row_shape}, "
                f"dtype={self.dtype})")

    # --- conversions -----------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, dense, indices=None):
        """The non-zero rows of ``dense`` (or exactly the rows ``indices``, zero or not).

        Raises:
            ShapeError: ``dense`` is 0-d.
        """
        dense = np.asarray(dense)
        if dense.ndim == 0:
            raise ShapeError("RowSparse.from_dense: needs at least 1 dimension, got a 0-d array")
        if indices is None:
            flat = dense.reshape(dense.shape[0], -1)
            indices = np.flatnonzero(np.any(flat != 0, axis=1))
        check = RowSparse(indices, np.zeros((np.size(indices), 0)), dense.shape[0])
        return cls(check.indices, dense[check.indices].copy(), dense.shape[0])

    def to_dense(self):
        """The dense ``(num_rows, *row_shape)`` array (duplicate rows summed)."""
        return scatter_add_rows(np.zeros(self.shape, dtype=self.dtype), self.indices,
                                self.values)

    def coalesce(self):
        """An equal RowSparse with sorted, unique indices (duplicate rows summed)."""
        if self.is_coalesced():
            return self
        unique, inverse = np.unique(self.indices, return_inverse=True)
        values = np.zeros((unique.shape[0], *self.row_shape), dtype=self.dtype)
        scatter_add_rows(values, inverse.reshape(-1), self.values)
        return RowSparse(unique, values, self.num_rows, unique=True)

    def merged(self):
        """An equal RowSparse whose indices are distinct, in order of first appearance
        (duplicates summed from zero in the order they are stored, as :meth:`coalesce` and
        :meth:`to_dense` sum them, so a repeated row is bit-identical to theirs; when no index
        repeats, the values are kept as they are). No sort: a hash table of the stored
        indices (:func:`unique_first_seen`)."""
        if self.unique:
            return self
        unique, inverse = unique_first_seen(self.indices)
        if unique.shape[0] == self.indices.shape[0]:
            return RowSparse._trusted(self.indices, self.values, self.num_rows, True)
        values = np.zeros((unique.shape[0], *self.row_shape), dtype=self.dtype)
        scatter_add_rows(values, inverse, self.values)
        return RowSparse._trusted(unique, values, self.num_rows, True)

    def is_coalesced(self):
        """Whether indices are strictly increasing (so unique)."""
        return bool(np.all(np.diff(self.indices) > 0))

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(grad)``: the dense array (an explicit, costly densification)."""
        dense = self.to_dense()
        return dense if dtype is None else dense.astype(dtype, copy=False)

    def detach(self):
        """A RowSparse is never on a tape: itself (so gradient code can treat it as a Tensor)."""
        return self

    def numpy(self):
        """The dense array, as ``Tensor.numpy()`` gives (costly for a big table)."""
        return self.to_dense()

    def astype(self, dtype):
        """The same rows with values cast to ``dtype``."""
        return RowSparse._trusted(self.indices, self.values.astype(dtype, copy=False),
                                  self.num_rows, self.unique)

    def concat(self, other):
        """Both sets of rows, not merged (duplicates kept: the cheap sum the tape uses)."""
        self._check_same(other, "concat")
        return RowSparse(np.concatenate([self.indices, other.indices]),
                         np.concatenate([self.values, other.values]), self.num_rows)

    # --- arithmetic ------------------------------------------------------------------------------
    def _check_same(self, other, op):
        if self.num_rows != other.num_rows or self.row_shape != other.row_shape:
            raise ShapeError(f"RowSparse.{op}: shapes {self.shape} and {other.shape} differ")

    def __add__(self, other):
        """RowSparse + RowSparse -> RowSparse (coalesced); RowSparse + dense -> dense (a
        Tensor when ``other`` is a Tensor)."""
        if isinstance(other, RowSparse):
            return self.concat(other).coalesce()
        if isinstance(other, Tensor):
            return Tensor._wrap(self + other.numpy())
        dense = np.asarray(other)
        if dense.shape != self.shape:
            raise ShapeError(f"RowSparse.add: shapes {self.shape} and {dense.shape} differ")
        out = np.array(dense, dtype=np.result_type(dense, self.values), copy=True)
        return scatter_add_rows(out, self.indices, self.values)

    __radd__ = __add__

    def __mul__(self, scalar):
        """Scale every value by a number."""
        if not np.isscalar(scalar):
            raise DTypeError(f"RowSparse.mul: expects a scalar, got {type(scalar).__name__}")
        return RowSparse._trusted(self.indices, self.values * scalar, self.num_rows, self.unique)

    __rmul__ = __mul__

    def add_to(self, dense, scale=1.0):
        """Scatter-add ``scale * self`` into ``dense`` in place (duplicates accumulate).

        Raises:
            ShapeError: ``dense`` does not have this RowSparse's shape.
        """
        if tuple(dense.shape) != self.shape:
            raise ShapeError(f"RowSparse.add_to: target shape {tuple(dense.shape)} is not "
                             f"{self.shape}")
        if isinstance(dense, np.ndarray) and dense.dtype.kind == "f":
            return scatter_add_rows(dense, self.indices, self.values, scale)
        np.add.at(dense, self.indices, self.values * scale)
        return dense

    def select(self, mask):
        """The stored rows where the boolean ``mask`` (one per stored row) is true."""
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != self.indices.shape:
            raise ShapeError(f"RowSparse.select: mask shape {mask.shape} is not "
                             f"{self.indices.shape}")
        return RowSparse._trusted(self.indices[mask], self.values[mask], self.num_rows,
                                  self.unique)


def accumulate_grad(total, g):
    """``total + g`` for cotangents that may be Tensors or RowSparse (``total`` None: ``g``).

    Two RowSparse concatenate (no merge, as PyTorch's uncoalesced sparse gradients); a
    RowSparse meeting a dense Tensor makes a dense Tensor (the documented densification: a
    table looked up with ``sparse=True`` and also used by a dense op gets a dense gradient,
    as in PyTorch)."""
    if total is None:
        return g
    if isinstance(total, RowSparse) and isinstance(g, RowSparse):
        return total.concat(g)
    if isinstance(g, RowSparse):
        return g + total
    return total + g
