"""Embedding bags: pooled lookups of variable-length id lists, and their row-sparse gradient.

``embedding_bag(weight, ids, offsets, mode)`` is PyTorch's ``F.embedding_bag``: bag ``b`` holds
``ids[offsets[b]:offsets[b+1]]`` (the last bag runs to the end), and its output row is the sum
or the mean of those rows of ``weight``; an empty bag gives a row of zeros. The gradient with
respect to ``weight`` is zero except in the rows the ids touched. With ``sparse=True`` the tape
hands it back as a :class:`~.sparse.RowSparse` (one stored row per id, duplicates not yet
merged, as PyTorch's uncoalesced sparse gradients): eager ``.backward()`` and ``ml.grad`` when
the table is a leaf and no higher-order graph is being built. Everywhere else — a traced or
compiled gradient, ``create_graph=True``, a table that is itself computed — the same gradient
is the dense op ``embedding_bag_grad`` (the compiler's kernel for it is named
``numpy.embedding_bag_grad[densified]`` so ``explain()`` says the row-sparse gradient became a
dense table).
"""

import numba
import numpy as np

from ..errors import ArgumentError, DTypeError, RankError
from .dispatch import apply, is_grad_enabled
from .ops_shape import reshape
from .registry import AVal, defop, register_impl
from .shapes import expect_shape
from .sparse import RowSparse, scatter_add_rows
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


def _check_range(op, ids, num_rows):
    if ids.size and (ids.min() < 0 or ids.max() >= num_rows):
        bad = ids[(ids < 0) | (ids >= num_rows)][0]
        raise ArgumentError(f"{op}: id {int(bad)} is outside the table's rows [0, {num_rows})")


@numba.njit(cache=False)
def _pool_rows(w, ids, offsets, mean, out):
    n, nb = ids.shape[0], offsets.shape[0]
    for b in range(nb):
        start, end = offsets[b], offsets[b + 1] if b + 1 < nb else n
        for k in range(start, end):
            r = ids[k]
            for j in range(w.shape[1]):
                out[b, j] += w[r, j]
        if mean and end > start:
            for j in range(w.shape[1]):
                out[b, j] /= end - start


def _pool(w, ids, offsets, mode):
    """Sum (or mean) of the rows of each bag, in one Numba pass; empty bags stay zero."""
    out = np.zeros((offsets.shape[0], w.shape[1]), w.dtype)
    if ids.size and w.shape[1]:
        _pool_rows(np.ascontiguousarray(w), ids.astype(np.int64, copy=False),
                   offsets.astype(np.int64, copy=False), mode == "mean", out)
    return out


# --- embedding_bag ------------------------------------------------------------------------------
def _bag_infer(w, ids, offsets, mode, sparse):
    _check_mode("embedding_bag", mode)
    if len(w.shape) != 2:
        raise RankError(f"embedding_bag: weight must be 2-D (rows, dim), got {tuple(w.shape)}")
    if np.dtype(w.dtype).kind != "f":
        raise DTypeError(f"embedding_bag: weight must be floating, got {w.dtype}")
    _check_ids("embedding_bag", ids, offsets)
    return AVal((offsets.shape[0], w.shape[1]), w.dtype)


def _bag_compute(w, ids, offsets, mode, sparse):
    check_offsets(ids, offsets)
    _check_range("embedding_bag", ids, w.shape[0])
    return _pool(w, ids, offsets, mode)


def _per_id_grad(g, ids, offsets, mode):
    """The cotangent row each id receives: its bag's row (over the bag size for ``mean``)."""
    if offsets.shape[0] == ids.shape[0] and np.all(offsets == np.arange(ids.shape[0])):
        return g  # one id per bag (a plain lookup): the cotangent rows as they are
    seg, counts = bag_segments(ids, offsets, "embedding_bag_grad")
    rows = g[seg]
    if mode == "mean" and rows.shape[0]:
        rows = rows / counts[seg, None].astype(g.dtype)
    return rows


def _bag_vjp(g, xs, y, needs, mode, sparse):
    w, ids, offsets = xs
    if not needs[0]:
        return (None, None, None)
    if sparse and not g.is_tracer and not is_grad_enabled() and w._ctx is None:
        rows = _per_id_grad(g.numpy(), ids.numpy(), offsets.numpy(), mode)
        return (RowSparse(ids.numpy(), rows.astype(w.dtype, copy=False), w.shape[0]), None,
                None)
    return (embedding_bag_grad(g, ids, offsets, w.shape[0], mode), None, None)


def _bag_jvp(ts, xs, y, mode, sparse):
    return None if ts[0] is None else embedding_bag(ts[0], xs[1], xs[2], mode)


EMBEDDING_BAG = defop("embedding_bag", compute=_bag_compute, infer=_bag_infer, vjp=_bag_vjp,
                      jvp=_bag_jvp)


# --- embedding_bag_grad: the dense gradient (the adjoint of embedding_bag) ----------------------
def _grad_infer(g, ids, offsets, num_rows, mode):
    _check_mode("embedding_bag_grad", mode)
    _check_ids("embedding_bag_grad", ids, offsets)
    if len(g.shape) != 2:
        raise RankError(f"embedding_bag_grad: the cotangent must be 2-D (bags, dim), got "
                        f"{tuple(g.shape)}")
    expect_shape("embedding_bag_grad", "the cotangent", g.shape[:1], offsets.shape)
    return AVal((int(num_rows), g.shape[1]), g.dtype)


def _grad_compute(g, ids, offsets, num_rows, mode):
    _check_range("embedding_bag_grad", ids, num_rows)
    out = np.zeros((num_rows, g.shape[1]), g.dtype)
    return scatter_add_rows(out, ids, _per_id_grad(g, ids, offsets, mode))


def _grad_vjp(u, xs, y, needs, num_rows, mode):
    return (embedding_bag(u, xs[1], xs[2], mode), None, None)


def _grad_jvp(ts, xs, y, num_rows, mode):
    return None if ts[0] is None else embedding_bag_grad(ts[0], xs[1], xs[2], num_rows, mode)


EMBEDDING_BAG_GRAD = defop("embedding_bag_grad", compute=_grad_compute, infer=_grad_infer,
                           vjp=_grad_vjp, jvp=_grad_jvp)
register_impl("embedding_bag_grad", "cpu", _grad_compute,
              name="numpy.embedding_bag_grad[densified]", returns=True)


# --- the functions ------------------------------------------------------------------------------
def _int_tensor(x):
    return x if isinstance(x, Tensor) else Tensor._wrap(np.asarray(x))


def embedding_bag(weight, ids, offsets, mode="sum", sparse=False):
    """Pooled lookups: row ``b`` is the sum (or mean) of ``weight[ids[offsets[b]:offsets[b+1]]]``.

    Args:
        weight: the ``(rows, dim)`` table.
        ids: 1-D integer ids, all bags one after another.
        offsets: 1-D integers, where each bag starts (``offsets[0] == 0``); a bag whose start
            equals the next one's is empty and pools to zeros.
        mode: ``"sum"`` or ``"mean"``.
        sparse: hand the table's gradient back as a :class:`~.sparse.RowSparse` of the touched
            rows (eager tape and ``ml.grad``; dense elsewhere, see the module docstring).

    Returns:
        A ``(len(offsets), dim)`` Tensor.

    Raises:
        ArgumentError: bad mode, offsets, or an id outside the table.
        DTypeError / RankError: ids or offsets are not 1-D integers, or weight is not a 2-D float.
    """
    _check_mode("embedding_bag", mode)
    if not isinstance(sparse, (bool, np.bool_)):
        raise DTypeError(f"embedding_bag: sparse must be True or False, got {sparse!r}")
    return apply(EMBEDDING_BAG, weight, _int_tensor(ids), _int_tensor(offsets), mode=mode,
                 sparse=bool(sparse))


def embedding_bag_grad(g, ids, offsets, num_rows, mode="sum"):
    """The dense gradient of :func:`embedding_bag` w.r.t. its table (``num_rows`` rows)."""
    if isinstance(num_rows, (bool, np.bool_)) or not isinstance(num_rows, (int, np.integer)) \
            or num_rows < 0:
        raise ArgumentError(f"embedding_bag_grad: num_rows must be an int >= 0, got "
                            f"{num_rows!r}")
    return apply(EMBEDDING_BAG_GRAD, g, _int_tensor(ids), _int_tensor(offsets),
                 num_rows=int(num_rows), mode=mode)


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


__all__ = ["embedding_bag", "embedding_bag_grad", "embedding_lookup", "bag_segments",
           "check_offsets"]
