"""Embedding-table kernels (book chapter 13): the pooled gather of ``embedding_bag`` and the
row updates of the sparse optimisers, as Numba loops that touch only the rows a batch names.

A batch of 10^4 ids reads 10^4 random rows of a table far larger than the caches, so these
loops are bound by memory latency, not bandwidth: each row is a handful of cache misses with
nothing to compute. Two things make them faster than numpy's fancy indexing (``W[ids]``,
``W[ids] -= ...``): one pass with no temporaries, and **software prefetch** — while row ``k`` is
summed, the rows of ids ``k + 16`` are requested (``llvm.prefetch``), so about 16 rows' misses
are in flight at once instead of the few the out-of-order window finds by itself.

* :func:`embedding_bag_out` is registered as the ``cpu`` kernel of the ``embedding_bag`` op,
  ``exact`` and ``eager``: it adds the rows of each bag in the order the reference
  (``np.add.at``) does, so its result is bit-identical, and eager mode runs it.
* :func:`sgd_rows`, :func:`adagrad_rows` and :func:`sparse_adam_rows` update, in place, only
  the rows of a merged (unique-row) :class:`~mlsys_lab.engine.sparse.RowSparse` gradient,
  repeating the dense update's float operations one by one in the parameter's dtype, so a
  touched row ends bit-identical to the dense optimiser's (``optim.SGD``, ``Adagrad`` and
  ``SparseAdam`` call them; ``*_reference`` are the numpy versions they are tested against).

They run serially: on this 2-core machine shared by other jobs a ``prange`` launch cost more
than the whole 0.3 ms gather (``benchmarks/recsys.py`` section 1 prints the floor).
"""

import math

import numba
import numpy as np

from ..engine import ops_embedding
from ..engine.numba_cache import CACHE
from ..engine.registry import register_impl
from ..engine.sparse import PREFETCH_DISTANCE
from ..engine.sparse import prefetch as _prefetch


@numba.njit(cache=CACHE, error_model="numpy")
def _prefetch_row(w, r):
    step = max(1, 64 // w.itemsize)
    for c in range(0, w.shape[1], step):
        _prefetch(w, r, c)


# --- embedding_bag: the pooled gather ------------------------------------------------------------
@numba.njit(cache=CACHE, error_model="numpy")
def _bad_bags(ids, offsets, nb, rows):
    """1 when offsets are bad, 2 when an id is outside ``[0, rows)``, else 0."""
    n = ids.shape[0]
    if nb:
        if offsets[0] != 0 or offsets[nb - 1] > n:
            return 1
        for b in range(1, nb):
            if offsets[b] < offsets[b - 1]:
                return 1
    elif n:
        return 1
    for k in range(n):
        if ids[k] < 0 or ids[k] >= rows:
            return 2
    return 0


@numba.njit(cache=CACHE, error_model="numpy")
def _pool_kernel(w, ids, offsets, psw, use_psw, mean, out, div):
    """Return 0, or 1 (bad offsets) / 2 (an id outside the table) before writing anything."""
    n, nb, dim = ids.shape[0], out.shape[0], w.shape[1]
    code = _bad_bags(ids, offsets, nb, w.shape[0])
    if code:
        return code
    for k in range(min(PREFETCH_DISTANCE, n)):
        _prefetch_row(w, ids[k])
    for b in range(nb):
        start = offsets[b]
        end = n
        if b + 1 < nb:
            end = offsets[b + 1]
        for j in range(dim):
            out[b, j] = 0
        for k in range(start, end):
            if k + PREFETCH_DISTANCE < n:
                _prefetch_row(w, ids[k + PREFETCH_DISTANCE])
            r = ids[k]
            if use_psw:
                p = psw[k]
                for j in range(dim):
                    out[b, j] += w[r, j] * p
            else:
                for j in range(dim):
                    out[b, j] += w[r, j]
    if mean:
        for b in range(nb):
            start = offsets[b]
            end = n
            if b + 1 < nb:
                end = offsets[b + 1]
            div[0] = max(end - start, 1)  # the count in the table's dtype, as the reference
            d = div[0]
            for j in range(dim):
                out[b, j] = out[b, j] / d
    return 0


def embedding_bag_out(out, w, ids, offsets, *psw, mode, sparse):
    """``out[b] = sum (or mean) of w[ids[k]] (* psw[k])`` over bag ``b``, in one prefetching
    pass; raises the op's own errors (bad offsets, an id outside the table)."""
    w = np.ascontiguousarray(w)
    weights = psw[0] if psw else np.zeros(0, w.dtype)
    if w.shape[1] == 0 or _pool_kernel(w, ids, offsets, weights, bool(psw), mode == "mean",
                                       out, np.empty(1, out.dtype)):
        ops_embedding.check_offsets(ids, offsets)  # the reference's checks word the error
        ops_embedding.check_range("embedding_bag", ids, w.shape[0])
        out[...] = 0


def _contiguous_table(avals, out, attrs):
    """a 2-D floating table"""
    return None if len(avals[0].shape) == 2 else f"rank {len(avals[0].shape)} table"


register_impl("embedding_bag", "cpu", embedding_bag_out, name="numba.embedding_bag_prefetch",
              accepts=_contiguous_table, dtypes=("float32", "float64"), exact=True, eager=True)


# --- the sparse optimisers' row updates -----------------------------------------------------------
@numba.njit(cache=CACHE, error_model="numpy")
def _sgd_kernel(p, rows, values, lr):
    n = rows.shape[0]
    for k in range(min(PREFETCH_DISTANCE, n)):
        _prefetch_row(p, rows[k])
    for k in range(n):
        if k + PREFETCH_DISTANCE < n:
            _prefetch_row(p, rows[k + PREFETCH_DISTANCE])
        r = rows[k]
        for j in range(p.shape[1]):
            p[r, j] -= lr * values[k, j]


@numba.njit(cache=CACHE, error_model="numpy")
def _adagrad_kernel(p, acc, rows, values, lr, eps):
    n = rows.shape[0]
    for k in range(min(PREFETCH_DISTANCE, n)):
        _prefetch_row(p, rows[k])
        _prefetch_row(acc, rows[k])
    for k in range(n):
        if k + PREFETCH_DISTANCE < n:
            _prefetch_row(p, rows[k + PREFETCH_DISTANCE])
            _prefetch_row(acc, rows[k + PREFETCH_DISTANCE])
        r = rows[k]
        for j in range(p.shape[1]):
            v = values[k, j]
            s = acc[r, j] + v * v
            acc[r, j] = s
            p[r, j] -= lr * v / (np.sqrt(s) + eps)


@numba.njit(cache=CACHE, error_model="numpy")
def _sparse_adam_kernel(p, m, v2, rows, values, c1, c2, step, eps):
    n = rows.shape[0]
    for k in range(min(PREFETCH_DISTANCE, n)):
        _prefetch_row(p, rows[k])
        _prefetch_row(m, rows[k])
        _prefetch_row(v2, rows[k])
    for k in range(n):
        if k + PREFETCH_DISTANCE < n:
            q = rows[k + PREFETCH_DISTANCE]
            _prefetch_row(p, q)
            _prefetch_row(m, q)
            _prefetch_row(v2, q)
        r = rows[k]
        for j in range(p.shape[1]):
            g = values[k, j]
            mn = m[r, j] + (g - m[r, j]) * c1
            vn = v2[r, j] + (g * g - v2[r, j]) * c2
            m[r, j] = mn
            v2[r, j] = vn
            p[r, j] -= step * mn / (np.sqrt(vn) + eps)


_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _rows2d(a):
    """``a`` as a (rows, -1) view, or None when that would need a copy (non-contiguous) or
    the dtype is not one the kernels take (float32, float64): the numpy reference then."""
    if not a.flags.c_contiguous or a.ndim == 0 or a.dtype not in _KERNEL_DTYPES:
        return None
    return a.reshape(a.shape[0], math.prod(a.shape[1:]))


def _flat(g, dtype):
    """The gradient's values as a contiguous (k, row size) array. The row size is spelled
    out, not ``-1``: a batch whose bags are all empty gives k = 0 rows, which numpy cannot
    infer a ``-1`` from (the kernels then touch nothing, as PyTorch's step does)."""
    values = np.ascontiguousarray(g.values, dtype)
    return values.reshape(g.indices.shape[0], math.prod(values.shape[1:]))


def sgd_rows(p, g, lr):
    """``p[g.indices] -= lr * g.values`` in place, for a RowSparse ``g`` with unique rows
    (float ops as ``optim.SGD``'s dense update: ``p - dtype(lr) * g``)."""
    p2 = _rows2d(p)
    if p2 is None:
        return sgd_rows_reference(p, g, lr)
    _sgd_kernel(p2, g.indices, _flat(g, p.dtype), p.dtype.type(lr))
    return p


def sgd_rows_reference(p, g, lr):
    """The numpy oracle of :func:`sgd_rows`."""
    p[g.indices] -= np.asarray(lr, p.dtype) * g.values.astype(p.dtype, copy=False)
    return p


def adagrad_rows(p, acc, g, lr, eps):
    """Adagrad on the rows of a unique-row RowSparse ``g``: ``acc += g^2``,
    ``p -= lr * g / (sqrt(acc) + eps)`` (float ops as ``optim.Adagrad``'s dense update)."""
    p2, a2 = _rows2d(p), _rows2d(acc)
    if p2 is None or a2 is None:
        return adagrad_rows_reference(p, acc, g, lr, eps)
    t = p.dtype.type
    _adagrad_kernel(p2, a2, g.indices, _flat(g, p.dtype), t(lr), t(eps))
    return p


def adagrad_rows_reference(p, acc, g, lr, eps):
    """The numpy oracle of :func:`adagrad_rows`."""
    rows, v = g.indices, g.values.astype(p.dtype, copy=False)
    acc[rows] += v * v
    p[rows] -= (lr * v / (np.sqrt(acc[rows]) + eps)).astype(p.dtype, copy=False)
    return p


def sparse_adam_rows(p, m, v, g, lr, betas, eps, t):
    """``torch.optim.SparseAdam``'s step ``t`` on the rows of a unique-row RowSparse ``g``:
    ``m += (g - m)(1 - b1)``, ``v += (g^2 - v)(1 - b2)``,
    ``p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``, only in those rows."""
    p2, m2, v2 = _rows2d(p), _rows2d(m), _rows2d(v)
    if p2 is None or m2 is None or v2 is None:
        return sparse_adam_rows_reference(p, m, v, g, lr, betas, eps, t)
    d = p.dtype.type
    step = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)
    _sparse_adam_kernel(p2, m2, v2, g.indices, _flat(g, p.dtype), d(1 - betas[0]),
                        d(1 - betas[1]), d(step), d(eps))
    return p


def sparse_adam_rows_reference(p, m, v, g, lr, betas, eps, t):
    """The numpy oracle of :func:`sparse_adam_rows`."""
    rows, gv = g.indices, g.values.astype(p.dtype, copy=False)
    m_old, v_old = m[rows], v[rows]
    m_new = m_old + (gv - m_old) * (1 - betas[0])
    v_new = v_old + (gv * gv - v_old) * (1 - betas[1])
    m[rows], v[rows] = m_new, v_new
    step = lr * math.sqrt(1 - betas[1] ** t) / (1 - betas[0] ** t)
    p[rows] -= (step * m_new / (np.sqrt(v_new) + eps)).astype(p.dtype, copy=False)
    return p


__all__ = ["embedding_bag_out", "sgd_rows", "adagrad_rows", "sparse_adam_rows",
           "sgd_rows_reference", "adagrad_rows_reference", "sparse_adam_rows_reference",
           "PREFETCH_DISTANCE"]
