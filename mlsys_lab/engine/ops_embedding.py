"""Embedding bags: pooled lookups of variable-length id lists, and their row-sparse gradient.

``embedding_bag(weight, ids, offsets, mode)`` is PyTorch's ``F.embedding_bag``: bag ``b`` holds
``ids[offsets[b]:offsets[b+1]]`` (the last bag runs to the end), and its output row is the sum
or the mean of those rows of ``weight`` (with ``per_sample_weights``, ``mode="sum"`` only, each
row times its id's weight); an empty bag gives a row of zeros. The gradient with respect to
``weight`` is zero except in the rows the ids touched. With ``sparse=True`` the tape hands it
back as a :class:`~.sparse.RowSparse` with one row per distinct id, each id's cotangent added
into it (:func:`sparse_bag_grad`: a hash table, no sort; the optimisers need merged rows for
their non-linear updates anyway): eager ``.backward()`` and ``ml.grad`` when the table is a
leaf and no higher-order graph is being built. Everywhere else — a traced or
compiled gradient, ``create_graph=True``, a table that is itself computed — the same gradient
is the dense op ``embedding_bag_grad`` (the compiler's kernel for it is named
``numpy.embedding_bag_grad[densified]`` so ``explain()`` says the row-sparse gradient became a
dense table).

``compute`` is the numpy reference (``np.add.at``); eager mode and compiled graphs run the
prefetching Numba gather of :mod:`mlsys_lab.kernels.embedding`, bit-identical to it.

Ids and offsets may be integers of any width (int32 as well as int64, as PyTorch takes).

``embedding(weight, ids)`` is the plain dense lookup (``F.embedding``, ``nn.Embedding``'s
``sparse=False`` path): ``weight[ids]`` as its own op, so that an id outside
``[0, num_rows)`` — a negative one included — raises the library's ``ArgumentError`` when the
op runs, eagerly or in a traced or compiled graph, as PyTorch raises, instead of wrapping
around as ``take`` (numpy's and PyTorch's ``take`` semantics) does. Its gradient is the
dense ``embedding_bag_grad`` of one-id bags, which checks the ids too.
"""

import numba
import numpy as np

from ..errors import ArgumentError, DTypeError, RankError
from .dispatch import apply, is_grad_enabled
from .numba_cache import CACHE
from .ops_shape import getitem, reshape
from .ops_shape import sum as reduce_sum
from .registry import AVal, defop, register_impl
from .shapes import expect_shape
from .sparse import RowSparse, scatter_add_rows, unique_first_seen
from .tensor import Tensor

MODES = ("sum", "mean")


def _check_mode(op, mode):
    if mode not in MODES:
        raise ArgumentError(f"{op}: mode must be one of {MODES}, got {mode!r}")


def _check_ids(op, ids, offsets):
    for what, a in (("ids", ids), ("offsets", offsets)):
        if np.dtype(a.dtype).kind not in "iu":
            raise DTypeError(f"{op}: {what} must be integers, got {a.dtype}")
        if len(a.shape) != 1:
            raise RankError(f"{op}: {what} must be 1-D, got shape {tuple(a.shape)}")


def check_offsets(ids, offsets, op="embedding_bag"):
    """Refuse offsets that do not start at 0, decrease, or run past ``len(ids)``.

    Raises:
        ArgumentError: they do.
    """
    n = ids.shape[0]
    if offsets.size:
        if offsets[0] != 0:
            raise ArgumentError(f"{op}: offsets[0] must be 0, got {int(offsets[0])}")
        if np.any(np.diff(offsets) < 0) or offsets[-1] > n:
            raise ArgumentError(f"{op}: offsets must be non-decreasing and at most len(ids)="
                                f"{n}, got {offsets.tolist()[:8]}...")
    elif n:
        raise ArgumentError(f"{op}: {n} ids but no offsets (no bag to put them in)")


def bag_segments(ids, offsets, op="embedding_bag"):
    """``(segment, counts)``: the bag of every id and the size of every bag (offsets checked
    by :func:`check_offsets`)."""
    check_offsets(ids, offsets, op)
    n = ids.shape[0]
    counts = np.diff(np.append(offsets, n)).astype(np.int64)
    return np.repeat(np.arange(offsets.shape[0]), counts), counts


def check_range(op, ids, num_rows):
    """Refuse an id outside ``[0, num_rows)``.

    Raises:
        ArgumentError: one is, named with the table's size.
    """
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        bad = ids[(ids < 0) | (ids >= num_rows)][0]
        raise ArgumentError(f"{op}: id {int(bad)} is outside the table's rows [0, {num_rows})")


_check_range = check_range


def _per_id_scale(rows, counts, seg, mode, psw):
    """Scale the per-id cotangent or table rows: over the bag size (mean), by the sample
    weight (sum with ``per_sample_weights``)."""
    if psw is not None:
        return rows * psw[:, None].astype(rows.dtype, copy=False)
    if mode == "mean" and rows.shape[0]:
        return rows / counts[seg, None].astype(rows.dtype)
    return rows


def _pool(w, ids, offsets, mode, psw=None):
    """The numpy reference: every id's row (times its weight) added into its bag with
    ``np.add.at`` (in id order), then divided by the bag size for ``mean``; empty bags stay
    zero. The ``numba.embedding_bag_prefetch`` kernel adds in the same order (bit-identical)."""
    out = np.zeros((offsets.shape[0], w.shape[1]), w.dtype)
    if ids.size and w.shape[1]:
        seg, counts = bag_segments(ids, offsets)
        rows = w[ids] if psw is None else w[ids] * psw[:, None].astype(w.dtype, copy=False)
        np.add.at(out, seg, rows)
        if mode == "mean":
            out /= np.maximum(counts, 1)[:, None].astype(w.dtype)
    return out


def _check_psw(op, w, ids, psw, mode):
    if mode != "sum":
        raise ArgumentError(f"{op}: per_sample_weights are only supported for mode='sum', "
                            f"got mode={mode!r}")
    if np.dtype(psw.dtype) != np.dtype(w.dtype):
        raise DTypeError(f"{op}: per_sample_weights must have the table's dtype {w.dtype}, "
                         f"got {psw.dtype}")
    if tuple(psw.shape) != tuple(ids.shape):
        raise RankError(f"{op}: per_sample_weights must have the shape of ids "
                        f"{tuple(ids.shape)}, got {tuple(psw.shape)}")


# --- embedding_bag ------------------------------------------------------------------------------
def _bag_infer(w, ids, offsets, *psw, mode, sparse):
    _check_mode("embedding_bag", mode)
    if len(w.shape) != 2:
        raise RankError(f"embedding_bag: weight must be 2-D (rows, dim), got {tuple(w.shape)}")
    if np.dtype(w.dtype).kind != "f":
        raise DTypeError(f"embedding_bag: weight must be floating, got {w.dtype}")
    _check_ids("embedding_bag", ids, offsets)
    if psw:
        _check_psw("embedding_bag", w, ids, psw[0], mode)
    return AVal((offsets.shape[0], w.shape[1]), w.dtype)


def _bag_compute(w, ids, offsets, *psw, mode, sparse):
    check_offsets(ids, offsets)
    check_range("embedding_bag", ids, w.shape[0])
    return _pool(w, ids, offsets, mode, psw[0] if psw else None)


def _per_id_grad(g, ids, offsets, mode, psw=None):
    """The cotangent row each id receives: its bag's row (over the bag size for ``mean``,
    times the id's weight with ``per_sample_weights``)."""
    if psw is None and offsets.shape[0] == ids.shape[0] and \
            np.all(offsets == np.arange(ids.shape[0])):
        return g  # one id per bag (a plain lookup): the cotangent rows as they are
    seg, counts = bag_segments(ids, offsets, "embedding_bag_grad")
    return _per_id_scale(g[seg], counts, seg, mode, psw)


@numba.njit(cache=CACHE)
def _merge_bag_grad(g, offsets, inverse, count, psw, use_psw, mean, div):
    """Each id's cotangent (its bag's row, over the bag size or times its weight) added into
    its unique row, in id order (the order ``embedding_bag_grad`` adds them)."""
    n, nb, dim = inverse.shape[0], offsets.shape[0], g.shape[1]
    values = np.zeros((count, dim), g.dtype)
    for b in range(nb):
        start, end = offsets[b], offsets[b + 1] if b + 1 < nb else n
        div[0] = max(end - start, 1)
        d = div[0]
        for k in range(start, end):
            u = inverse[k]
            if use_psw:
                p = psw[k]
                for j in range(dim):
                    values[u, j] += g[b, j] * p
            elif mean:
                for j in range(dim):
                    values[u, j] += g[b, j] / d
            else:
                for j in range(dim):
                    values[u, j] += g[b, j]
    return values


@numba.njit(cache=CACHE)
def _is_arange(offsets):
    for b in range(offsets.shape[0]):
        if offsets[b] != b:
            return False
    return True


def _one_distinct_id_per_bag(n, unique, offsets):
    return unique.shape[0] == n and offsets.shape[0] == n and _is_arange(offsets)


def sparse_bag_grad(g, ids, offsets, num_rows, mode, psw=None):
    """The table's gradient as a :class:`~.sparse.RowSparse` with one row per distinct id
    (order of first appearance): a hash table finds each id's row (no sort, memory
    O(len(ids)) whatever ``num_rows``), then one Numba pass adds every id's cotangent into it.
    For one distinct id per bag under ``sum`` the rows are the cotangent itself (no copy).
    The rows equal :func:`embedding_bag_grad`'s in those rows (bit for bit, but for the sign
    of a zero in that no-copy case)."""
    unique, inverse = unique_first_seen(ids)
    g = np.ascontiguousarray(g)
    if psw is None and mode == "sum" and _one_distinct_id_per_bag(ids.shape[0], unique, offsets):
        return RowSparse._trusted(unique, g, num_rows, True)
    values = _merge_bag_grad(g, np.ascontiguousarray(offsets, np.int64), inverse,
                             unique.shape[0],
                             np.zeros(0, g.dtype) if psw is None else psw.astype(g.dtype),
                             psw is not None, mode == "mean", np.empty(1, g.dtype))
    return RowSparse._trusted(unique, values, num_rows, True)


def _segments_infer(ids, offsets):
    _check_ids("embedding_bag_segments", ids, offsets)
    return AVal(tuple(ids.shape), np.dtype(np.int64))


def _segments_compute(ids, offsets):
    return bag_segments(ids, offsets, "embedding_bag_segments")[0].astype(np.int64, copy=False)


#: The bag of every id (``[0, 0, 2, 2, 2]`` for offsets ``[0, 2, 2]`` over 5 ids): an op, so
#: the per-sample weights' cotangent can be traced when ids and offsets are graph inputs.
EMBEDDING_BAG_SEGMENTS = defop("embedding_bag_segments", compute=_segments_compute,
                               infer=_segments_infer)


def _psw_cotangent(table, ids, rows, offsets):
    """``d/d psw[k] = <table[ids[k]], rows[bag of k]>``: the per-sample weights' cotangent,
    from differentiable lookups (so it has gradients of its own)."""
    seg = apply(EMBEDDING_BAG_SEGMENTS, ids, offsets)
    return reduce_sum(embedding_lookup(table, ids) * embedding_lookup(rows, seg), axis=1)


def _bag_vjp(g, xs, y, needs, mode, sparse):
    w, ids, offsets, *psw = xs
    cts = [None] * len(xs)
    if psw and needs[3]:
        cts[3] = _psw_cotangent(w, ids, g, offsets)
    if not needs[0]:
        return tuple(cts)
    if sparse and not g.is_tracer and not is_grad_enabled() and w._ctx is None:
        cts[0] = sparse_bag_grad(g.numpy().astype(w.dtype, copy=False), ids.numpy(),
                                 offsets.numpy(), w.shape[0], mode,
                                 psw[0].numpy() if psw else None)
    else:
        cts[0] = embedding_bag_grad(g, ids, offsets, w.shape[0], mode,
                                    per_sample_weights=psw[0] if psw else None)
    return tuple(cts)


def _bag_jvp(ts, xs, y, mode, sparse):
    w, ids, offsets, *psw = xs
    out = None
    if ts[0] is not None:
        out = embedding_bag(ts[0], ids, offsets, mode, per_sample_weights=psw[0] if psw else None)
    if psw and ts[3] is not None:
        extra = embedding_bag(w, ids, offsets, mode, per_sample_weights=ts[3])
        out = extra if out is None else out + extra
    return out


EMBEDDING_BAG = defop("embedding_bag", compute=_bag_compute, infer=_bag_infer, vjp=_bag_vjp,
                      jvp=_bag_jvp)


# --- embedding_bag_grad: the dense gradient (the adjoint of embedding_bag) ----------------------
def _grad_infer(g, ids, offsets, *psw, num_rows, mode):
    _check_mode("embedding_bag_grad", mode)
    _check_ids("embedding_bag_grad", ids, offsets)
    if len(g.shape) != 2:
        raise RankError(f"embedding_bag_grad: the cotangent must be 2-D (bags, dim), got "
                        f"{tuple(g.shape)}")
    expect_shape("embedding_bag_grad", "the cotangent", g.shape[:1], offsets.shape)
    if psw:
        _check_psw("embedding_bag_grad", g, ids, psw[0], mode)
    return AVal((int(num_rows), g.shape[1]), g.dtype)


def _grad_compute(g, ids, offsets, *psw, num_rows, mode):
    check_range("embedding_bag_grad", ids, num_rows)
    out = np.zeros((num_rows, g.shape[1]), g.dtype)
    return scatter_add_rows(out, ids, _per_id_grad(g, ids, offsets, mode,
                                                   psw[0] if psw else None))


def _grad_vjp(u, xs, y, needs, num_rows, mode):
    g, ids, offsets, *psw = xs
    cts = [embedding_bag(u, ids, offsets, mode, per_sample_weights=psw[0] if psw else None),
           None, None]
    if psw:
        cts.append(_psw_cotangent(u, ids, g, offsets) if needs[3] else None)
    return tuple(cts)


def _grad_jvp(ts, xs, y, num_rows, mode):
    g, ids, offsets, *psw = xs
    out = None
    if ts[0] is not None:
        out = embedding_bag_grad(ts[0], ids, offsets, num_rows, mode,
                                 per_sample_weights=psw[0] if psw else None)
    if psw and ts[3] is not None:
        extra = embedding_bag_grad(g, ids, offsets, num_rows, mode, per_sample_weights=ts[3])
        out = extra if out is None else out + extra
    return out


EMBEDDING_BAG_GRAD = defop("embedding_bag_grad", compute=_grad_compute, infer=_grad_infer,
                           vjp=_grad_vjp, jvp=_grad_jvp)
register_impl("embedding_bag_grad", "cpu", _grad_compute,
              name="numpy.embedding_bag_grad[densified]", returns=True)


# --- embedding: the dense lookup that refuses an id outside the table ---------------------------
def _embedding_infer(w, ids):
    if len(w.shape) != 2:
        raise RankError(f"embedding: weight must be 2-D (rows, dim), got shape {tuple(w.shape)}")
    if np.dtype(ids.dtype).kind not in "iu":
        raise DTypeError(f"embedding: ids must be integers, got {ids.dtype}")
    return AVal((*ids.shape, w.shape[1]), w.dtype)


def _embedding_compute(w, ids):
    check_range("embedding", ids, w.shape[0])
    return np.take(w, ids, axis=0)


def _embedding_vjp(g, xs, y, needs):
    """The dense table gradient as one-id bags' ``embedding_bag_grad``, which checks the ids
    itself: a compiled gradient whose forward lookup was dropped as dead code still refuses a
    bad id (``take_grad`` would add its row at the wrapped-around position)."""
    w, ids = xs
    n = int(np.prod(ids.shape, dtype=np.int64))
    return (embedding_bag_grad(reshape(g, (n, w.shape[1])), reshape(ids, (n,)),
                               np.arange(n), w.shape[0]), None)


def _embedding_jvp(ts, xs, y):
    return None if ts[0] is None else embedding(ts[0], xs[1])


EMBEDDING = defop("embedding", compute=_embedding_compute, infer=_embedding_infer,
                  vjp=_embedding_vjp, jvp=_embedding_jvp, storage=True)


# --- the functions ------------------------------------------------------------------------------
def _int_tensor(x):
    return x if isinstance(x, Tensor) else Tensor._wrap(np.asarray(x))


def _float_tensor(x):
    return x if isinstance(x, Tensor) else Tensor._wrap(np.asarray(x))


def _last_offset(ids, offsets, include_last_offset, op):
    """Offsets without the closing ``len(ids)`` entry (CSR style, ``include_last_offset``)."""
    if not isinstance(include_last_offset, (bool, np.bool_)):
        raise DTypeError(f"{op}: include_last_offset must be True or False, got "
                         f"{include_last_offset!r}")
    if not include_last_offset:
        return offsets
    if len(offsets.shape) != 1 or offsets.shape[0] < 1:
        raise ArgumentError(f"{op}: include_last_offset=True needs 1-D offsets with at least "
                            f"one entry (the end of the last bag), got shape "
                            f"{tuple(offsets.shape)}")
    if not offsets.is_tracer and int(offsets.numpy()[-1]) != ids.shape[0]:
        raise ArgumentError(f"{op}: with include_last_offset=True the last offset must be "
                            f"len(ids)={ids.shape[0]}, got {int(offsets.numpy()[-1])}")
    return getitem(offsets, slice(0, offsets.shape[0] - 1))


def embedding_bag(weight, ids, offsets, mode="sum", sparse=False, per_sample_weights=None,
                  include_last_offset=False):
    """Pooled lookups: row ``b`` is the sum (or mean) of ``weight[ids[offsets[b]:offsets[b+1]]]``
    (``torch.nn.functional.embedding_bag``).

    Args:
        weight: the ``(rows, dim)`` table.
        ids: 1-D integer ids, all bags one after another.
        offsets: 1-D integers, where each bag starts (``offsets[0] == 0``); a bag whose start
            equals the next one's is empty and pools to zeros.
        mode: ``"sum"`` or ``"mean"``.
        sparse: hand the table's gradient back as a :class:`~.sparse.RowSparse` of the touched
            rows (eager tape and ``ml.grad``; dense elsewhere, see the module docstring).
        per_sample_weights: ``mode="sum"`` only: a float per id (the table's dtype), each row
            multiplied by it before the sum; differentiable.
        include_last_offset: ``offsets`` has one more entry, ``len(ids)``, the end of the last
            bag (CSR style); there are ``len(offsets) - 1`` bags.

    Returns:
        A ``(bags, dim)`` Tensor.

    Raises:
        ArgumentError: bad mode, offsets, or an id outside the table; per-sample weights with
            ``mode="mean"``; a last offset that is not ``len(ids)``.
        DTypeError / RankError: ids or offsets are not 1-D integers, weight is not a 2-D float,
            per-sample weights not of the ids' shape and the table's dtype.
    """
    _check_mode("embedding_bag", mode)
    if not isinstance(sparse, (bool, np.bool_)):
        raise DTypeError(f"embedding_bag: sparse must be True or False, got {sparse!r}")
    ids, offsets = _int_tensor(ids), _int_tensor(offsets)
    offsets = _last_offset(ids, offsets, include_last_offset, "embedding_bag")
    psw = () if per_sample_weights is None else (_float_tensor(per_sample_weights),)
    return apply(EMBEDDING_BAG, weight, ids, offsets, *psw, mode=mode, sparse=bool(sparse))


def embedding_bag_grad(g, ids, offsets, num_rows, mode="sum", per_sample_weights=None,
                       include_last_offset=False):
    """The dense gradient of :func:`embedding_bag` w.r.t. its table (``num_rows`` rows)."""
    if isinstance(num_rows, (bool, np.bool_)) or not isinstance(num_rows, (int, np.integer)) \
            or num_rows < 0:
        raise ArgumentError(f"embedding_bag_grad: num_rows must be an int >= 0, got "
                            f"{num_rows!r}")
    ids, offsets = _int_tensor(ids), _int_tensor(offsets)
    offsets = _last_offset(ids, offsets, include_last_offset, "embedding_bag_grad")
    psw = () if per_sample_weights is None else (_float_tensor(per_sample_weights),)
    return apply(EMBEDDING_BAG_GRAD, g, ids, offsets, *psw, num_rows=int(num_rows), mode=mode)


def embedding(weight, ids):
    """``weight[ids]``: the rows of the ``(rows, dim)`` table for integer ``ids`` of any shape
    (``torch.nn.functional.embedding``); the result has shape ``(*ids.shape, dim)``.

    Unlike ``ops.take``, an id must lie in ``[0, rows)``: a negative id is refused, not
    counted from the end, and the check runs whenever the op does (eager, traced, compiled).
    The table's gradient is dense (:func:`embedding_lookup` gives a row-sparse one).

    Raises:
        ArgumentError: an id outside ``[0, rows)`` (the message names the id and the rows).
        DTypeError: ids are not integers.
        RankError: weight is not 2-D.
    """
    return apply(EMBEDDING, weight, _int_tensor(ids))


def embedding_lookup(weight, ids, sparse=False):
    """``weight[ids]`` for integer ``ids`` of any shape, as one-id bags (so the table's gradient
    can be row-sparse). ``ids`` may be a traced tensor."""
    ids = _int_tensor(ids)
    if np.dtype(ids.dtype).kind not in "iu":
        raise DTypeError(f"embedding: ids must be integers, got {ids.dtype}")
    shape = tuple(ids.shape)
    n = int(np.prod(shape, dtype=np.int64))
    out = embedding_bag(weight, reshape(ids, (n,)), np.arange(n), "sum", sparse)
    return reshape(out, (*shape, out.shape[-1]))


__all__ = ["embedding", "embedding_bag", "embedding_bag_grad", "embedding_lookup", "bag_segments",
           "check_offsets", "check_range", "sparse_bag_grad"]
