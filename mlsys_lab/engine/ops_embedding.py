"""Embedding lookups and bags, with the table's gradient dense or row-sparse by an explicit flag.

``embedding_bag(weight, ids, offsets, mode, sparse=False)`` is PyTorch's ``F.embedding_bag``:
bag ``b`` holds ``ids[offsets[b]:offsets[b+1]]`` (the last bag runs to the end), and its output
row is the sum or the mean of those rows of ``weight`` (with ``per_sample_weights``,
``mode="sum"`` only, each row times its id's weight); an empty bag gives a row of zeros.
``embedding(weight, ids, sparse=False)`` is the plain lookup ``weight[ids]`` (``F.embedding``):
an id outside ``[0, num_rows)`` — a negative one included — raises the library's
``ArgumentError`` when the op runs, eagerly or in a traced or compiled graph, as PyTorch raises,
instead of wrapping around as ``take`` (numpy's and PyTorch's ``take`` semantics) does.

The gradient with respect to ``weight`` is zero except in the rows the ids touched. ``sparse``
is an attribute of both ops (it is in every traced node's attrs), and it alone says what that
gradient is, as PyTorch's ``sparse=`` flag does:

* ``sparse=False`` (the default): a dense ``(num_rows, dim)`` Tensor, the op
  ``embedding_bag_grad`` (the adjoint of ``embedding_bag``; a plain lookup is a batch of
  one-id bags). It is an op like any other: traced, compiled, differentiated again.
* ``sparse=True``: a :class:`~.sparse.RowSparse` with one row per distinct id, in order of
  first appearance (:func:`sparse_bag_grad`: a hash table, no sort; the optimisers need merged
  rows for their non-linear updates anyway), from the eager tape (``.backward()``,
  ``ml.gradients``) and ``ml.grad``. Where a row-sparse gradient cannot go, the backward pass
  raises an ``ArgumentError`` naming the op and the flag instead of handing back a dense
  table: a traced gradient (``ml.trace`` / ``ml.compile`` of a gradient, ``grad_graph``:
  graph values are dense arrays), a backward pass that records a graph (``create_graph=True``,
  nested ``ml.grad``, ``ml.hvp``, forward-over-reverse: a RowSparse is not differentiable), and
  a table that is itself computed (its gradient would have to flow back through another op's
  dense VJP). Use ``sparse=False`` there.

Documented densification, as PyTorch's: where the table also gets a dense gradient (it is used
by another op too, or ``.grad`` already holds a dense one), the two add up to a dense Tensor
(:func:`~.sparse.accumulate_grad`); ``np.asarray(grad)`` and ``grad.numpy()`` densify on request.
Optimisers that do not take row-sparse gradients (Adam, RMSProp, SGD with momentum or weight
decay, ...) refuse them (``mlsys_lab.optim``).

``compute`` is the numpy reference (``np.add.at``); eager mode and compiled graphs run the
prefetching Numba gather of :mod:`mlsys_lab.kernels.embedding`, bit-identical to it.

Ids and offsets may be integers of any width (int32 as well as int64, as PyTorch takes).
"""

import numba
import numpy as np

from ..errors import ArgumentError, DTypeError, RankError
from .dispatch import apply, is_grad_enabled
from .numba_cache import CACHE
from .ops_shape import getitem, reshape
from .ops_shape import sum as reduce_sum
from .registry import AVal, defop
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


def _psw_cotangent(table, ids, rows, offsets, sparse):
    """``d/d psw[k] = <table[ids[k]], rows[bag of k]>``: the per-sample weights' cotangent,
    from differentiable lookups (so it has gradients of its own; the table's lookup keeps the
    op's ``sparse`` flag, the cotangent's is dense: a cotangent is never a leaf table)."""
    seg = apply(EMBEDDING_BAG_SEGMENTS, ids, offsets)
    return reduce_sum(embedding(table, ids, sparse=sparse) * embedding(rows, seg), axis=1)


def _row_sparse_grad(op, g, w, ids, offsets, mode="sum", psw=()):
    """The table's gradient of a ``sparse=True`` lookup: a RowSparse of the touched rows.

    Raises:
        ArgumentError: where a row-sparse gradient cannot go (a traced gradient, a backward pass
            that records a graph, a table computed by another op), naming the op and the flag.
    """
    flag = f"{op}(sparse=True)"
    if any(t.is_tracer for t in (g, w, ids, offsets, *psw)):
        raise ArgumentError(
            f"{flag}: the table's gradient is row-sparse, and a traced gradient (ml.trace or "
            f"ml.compile of a gradient, grad_graph) holds dense arrays only; look the table up "
            f"with sparse=False to trace or compile its gradient (a dense embedding_bag_grad)")
    if is_grad_enabled():
        raise ArgumentError(
            f"{flag}: the table's gradient is row-sparse, which is not differentiable, and this "
            f"backward pass records a graph (create_graph=True, nested ml.grad, ml.hvp, forward "
            f"mode over it); look the table up with sparse=False for a differentiable dense "
            f"gradient")
    if w._ctx is not None:
        raise ArgumentError(
            f"{flag}: the table is computed (the output of {w._ctx[0].name}), and its "
            f"row-sparse gradient cannot flow back through that op; look up a leaf table (a "
            f"Parameter) or use sparse=False")
    return sparse_bag_grad(g.numpy().astype(w.dtype, copy=False), ids.numpy(), offsets.numpy(),
                           w.shape[0], mode, psw[0].numpy() if psw else None)


def _bag_vjp(g, xs, y, needs, mode, sparse):
    w, ids, offsets, *psw = xs
    cts = [None] * len(xs)
    if psw and needs[3]:
        cts[3] = _psw_cotangent(w, ids, g, offsets, sparse)
    if not needs[0]:
        return tuple(cts)
    if sparse:
        cts[0] = _row_sparse_grad("embedding_bag", g, w, ids, offsets, mode, psw)
    else:
        cts[0] = embedding_bag_grad(g, ids, offsets, w.shape[0], mode,
                                    per_sample_weights=psw[0] if psw else None)
    return tuple(cts)


def _bag_jvp(ts, xs, y, mode, sparse):
    w, ids, offsets, *psw = xs
    out = None
    if ts[0] is not None:
        out = embedding_bag(ts[0], ids, offsets, mode, sparse,
                            per_sample_weights=psw[0] if psw else None)
    if psw and ts[3] is not None:
        extra = embedding_bag(w, ids, offsets, mode, sparse, per_sample_weights=ts[3])
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
        cts.append(_psw_cotangent(u, ids, g, offsets, False) if needs[3] else None)
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


# --- embedding: the lookup that refuses an id outside the table -------------------------------
def _embedding_infer(w, ids, sparse):
    if len(w.shape) != 2:
        raise RankError(f"embedding: weight must be 2-D (rows, dim), got shape {tuple(w.shape)}")
    if np.dtype(ids.dtype).kind not in "iu":
        raise DTypeError(f"embedding: ids must be integers, got {ids.dtype}")
    return AVal((*ids.shape, w.shape[1]), w.dtype)


def _embedding_compute(w, ids, sparse):
    check_range("embedding", ids, w.shape[0])
    return np.take(w, ids, axis=0)


def _embedding_vjp(g, xs, y, needs, sparse):
    """``sparse=False``: the dense table gradient as one-id bags' ``embedding_bag_grad``, which
    checks the ids itself (a compiled gradient whose forward lookup was dropped as dead code
    still refuses a bad id; ``take_grad`` would add its row at the wrapped-around position).
    ``sparse=True``: the RowSparse of the touched rows (:func:`_row_sparse_grad`)."""
    w, ids = xs
    n = int(np.prod(ids.shape, dtype=np.int64))
    g2, ids1 = reshape(g, (n, w.shape[1])), reshape(ids, (n,))
    if sparse:
        return (_row_sparse_grad("embedding", g2, w, ids1, Tensor._wrap(np.arange(n))), None)
    return (embedding_bag_grad(g2, ids1, np.arange(n), w.shape[0]), None)


def _embedding_jvp(ts, xs, y, sparse):
    return None if ts[0] is None else embedding(ts[0], xs[1], sparse=sparse)


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
        sparse: the table's gradient: ``False``, a dense ``(rows, dim)`` Tensor (the op
            ``embedding_bag_grad``); ``True``, a :class:`~.sparse.RowSparse` with one row per
            distinct id, or an ``ArgumentError`` where one cannot go (a traced gradient,
            ``create_graph=True``, a computed table; see the module docstring).
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
    sparse = _check_sparse("embedding_bag", sparse)
    ids, offsets = _int_tensor(ids), _int_tensor(offsets)
    offsets = _last_offset(ids, offsets, include_last_offset, "embedding_bag")
    psw = () if per_sample_weights is None else (_float_tensor(per_sample_weights),)
    return apply(EMBEDDING_BAG, weight, ids, offsets, *psw, mode=mode, sparse=sparse)


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


def _check_sparse(op, sparse):
    if not isinstance(sparse, (bool, np.bool_)):
        raise DTypeError(f"{op}: sparse must be True or False, got {sparse!r}")
    return bool(sparse)


def embedding(weight, ids, sparse=False):
    """``weight[ids]``: the rows of the ``(rows, dim)`` table for integer ``ids`` of any shape
    (``torch.nn.functional.embedding``); the result has shape ``(*ids.shape, dim)``.

    Unlike ``ops.take``, an id must lie in ``[0, rows)``: a negative id is refused, not
    counted from the end, and the check runs whenever the op does (eager, traced, compiled).

    Args:
        weight: the ``(rows, dim)`` table.
        ids: integer ids of any shape (int32 or int64, a traced tensor too).
        sparse: the table's gradient: ``False``, a dense ``(rows, dim)`` Tensor (the op
            ``embedding_bag_grad``); ``True``, a :class:`~.sparse.RowSparse` of the touched
            rows, or an ``ArgumentError`` where one cannot go (a traced gradient,
            ``create_graph=True``, a computed table; see the module docstring).

    Raises:
        ArgumentError: an id outside ``[0, rows)`` (the message names the id and the rows).
        DTypeError: ids are not integers; sparse is not a bool.
        RankError: weight is not 2-D.
    """
    return apply(EMBEDDING, weight, _int_tensor(ids), sparse=_check_sparse("embedding", sparse))


__all__ = ["embedding", "embedding_bag", "embedding_bag_grad", "bag_segments",
           "check_offsets", "check_range", "sparse_bag_grad"]
