"""Shape ops, reductions, indexing and matmul.

Each op is defined once with :func:`~.registry.defop`, its VJP and JVP rules named beside it
(conventions in :mod:`.ops_math`). The view ops (identity, reshape, transpose, broadcast_to)
also give ``view``: the compiled executor then makes a numpy view instead of a copy.
"""

import builtins

import numpy as np

from ..errors import DTypeError, ShapeError
from . import dtypes
from .dispatch import apply, tsum
from .registry import AVal, defop
from .shapes import (
    as_int,
    broadcast_shapes,
    check_axis,
    expect_shape,
    norm_axes,
    reduced_shape,
    unbroadcast,
)
from .tensor import Tensor, zeros_like


# --- identity, reshape, transpose, broadcast_to --------------------------------------------------
def _identity_np(x):
    return x


def _identity_infer(x):
    return x


def _identity_vjp(g, xs, y, needs):
    return (g,)


def _identity_jvp(ts, xs, y):
    return ts[0]


IDENTITY = defop("identity", compute=_identity_np, infer=_identity_infer, vjp=_identity_vjp,
                 jvp=_identity_jvp, view=_identity_np, storage=True)


def _reshape_np(x, shape):
    return x.reshape(shape)


def _reshape_infer(x, shape):
    if any(d < 0 for d in shape):
        raise ShapeError(f"reshape: negative dimension in {tuple(shape)} (only ml.ops.reshape "
                         f"resolves a single -1)")
    if int(np.prod(x.shape, dtype=np.int64)) != int(np.prod(shape, dtype=np.int64)):
        raise ShapeError(f"reshape: cannot reshape {tuple(x.shape)} "
                         f"({int(np.prod(x.shape))} elements) into {tuple(shape)}")
    return AVal(tuple(shape), x.dtype)


def _reshape_vjp(g, xs, y, needs, shape):
    return (reshape(g, xs[0].shape),)


def _reshape_jvp(ts, xs, y, shape):
    return None if ts[0] is None else reshape(ts[0], shape)


RESHAPE = defop("reshape", compute=_reshape_np, infer=_reshape_infer, vjp=_reshape_vjp,
                jvp=_reshape_jvp, view=_reshape_np, storage=True)


def _transpose_np(x, axes):
    return np.transpose(x, axes)


def _transpose_infer(x, axes):
    shape = x.shape
    if sorted(axes) != list(range(len(shape))):
        raise ShapeError(f"transpose: axes {axes} are not a permutation of the {len(shape)} "
                         f"axes of {tuple(shape)}")
    return AVal(tuple([shape[a] for a in axes]), x.dtype)


def _transpose_vjp(g, xs, y, needs, axes):
    return (transpose(g, tuple(np.argsort(axes))),)


def _transpose_jvp(ts, xs, y, axes):
    return None if ts[0] is None else transpose(ts[0], axes)


TRANSPOSE = defop("transpose", compute=_transpose_np, infer=_transpose_infer,
                  vjp=_transpose_vjp, jvp=_transpose_jvp, view=_transpose_np, storage=True)


def _bcast_np(x, shape):
    return np.broadcast_to(x, shape)


def _bcast_infer(x, shape):
    if any(d < 0 for d in shape):
        raise ShapeError(f"broadcast_to: negative dimension in {tuple(shape)}")
    if len(shape) < len(x.shape) or broadcast_shapes("broadcast_to", x.shape, shape) != shape:
        raise ShapeError(f"broadcast_to: cannot broadcast {tuple(x.shape)} to {tuple(shape)}")
    return AVal(tuple(shape), x.dtype)


def _bcast_vjp(g, xs, y, needs, shape):
    return (unbroadcast(g, xs[0].shape),)


def _bcast_jvp(ts, xs, y, shape):
    return None if ts[0] is None else broadcast_to(ts[0], shape)


BROADCAST_TO = defop("broadcast_to", compute=_bcast_np, infer=_bcast_infer, vjp=_bcast_vjp,
                     jvp=_bcast_jvp, view=_bcast_np, storage=True)


# --- reductions -------------------------------------------------------------------------------
def _reduce_infer(name, float_only=False):
    def infer(x, axis, keepdims):
        if float_only and not dtypes.is_float(x.dtype):
            raise DTypeError(f"{name}: expects a floating tensor, got {x.dtype}")
        for a in axis:
            if a >= builtins.max(len(x.shape), 1):
                raise ShapeError(f"{name}: axis {a} out of range for shape {tuple(x.shape)}")
            if name == "max" and a < len(x.shape) and x.shape[a] == 0:
                raise ShapeError(f"max: cannot reduce over axis {a} of length 0 (shape "
                                 f"{tuple(x.shape)}): the maximum of nothing is undefined "
                                 f"(numpy and PyTorch refuse it too)")
        dt = x.dtype if dtypes.is_float(x.dtype) or name == "max" else dtypes.int64
        return AVal(reduced_shape(x.shape, axis, keepdims), dt)
    return infer


def _expand(g, x_shape, axis, keepdims):
    """Reshape a reduced gradient back to rank of ``x`` and broadcast it over the reduced axes."""
    if not keepdims:
        g = reshape(g, reduced_shape(x_shape, axis, True))
    return broadcast_to(g, x_shape)


def _sum_np(x, axis, keepdims):
    return np.add.reduce(x, axis=axis, keepdims=keepdims)  # np.sum's own call, less wrapping


def _sum_vjp(g, xs, y, needs, axis, keepdims):
    return (_expand(g, xs[0].shape, axis, keepdims),)


def _sum_jvp(ts, xs, y, axis, keepdims):
    return None if ts[0] is None else sum(ts[0], axis, keepdims)


SUM = defop("sum", compute=_sum_np, infer=_reduce_infer("sum"), vjp=_sum_vjp, jvp=_sum_jvp)


def _count(shape, axis):
    return int(np.prod([shape[a] for a in axis], dtype=np.int64))


def _mean_np(x, axis, keepdims):
    if _count(x.shape, axis) == 0:  # NaN, as in PyTorch (numpy also warns "Mean of empty slice")
        return np.full(reduced_shape(x.shape, axis, keepdims), np.nan, x.dtype)
    return np.mean(x, axis=axis, keepdims=keepdims)


def _mean_vjp(g, xs, y, needs, axis, keepdims):
    return (_expand(g, xs[0].shape, axis, keepdims) / float(_count(xs[0].shape, axis)),)


def _mean_jvp(ts, xs, y, axis, keepdims):
    return None if ts[0] is None else mean(ts[0], axis, keepdims)


MEAN = defop("mean", compute=_mean_np, infer=_reduce_infer("mean", float_only=True),
             vjp=_mean_vjp, jvp=_mean_jvp)


def _max_np(x, axis, keepdims):
    return np.max(x, axis=axis, keepdims=keepdims)


def _max_mask(x, y, axis, keepdims):
    """Where ``x`` attains its max, split evenly among ties (as a float mask)."""
    hit = (x == _expand(y, x.shape, axis, keepdims)).astype(x.dtype)
    return hit / sum(hit, axis, True)


def _max_vjp(g, xs, y, needs, axis, keepdims):
    return (_expand(g, xs[0].shape, axis, keepdims) * _max_mask(xs[0], y, axis, keepdims),)


def _max_jvp(ts, xs, y, axis, keepdims):
    return sum(ts[0] * _max_mask(xs[0], y, axis, keepdims), axis, keepdims)


MAX = defop("max", compute=_max_np, infer=_reduce_infer("max"), vjp=_max_vjp, jvp=_max_jvp)


def _argmax_infer(x, axis):
    if axis is not None and not -len(x.shape) <= axis < len(x.shape):
        raise ShapeError(f"argmax: axis {axis} out of range for shape {tuple(x.shape)}")
    if (x.shape[axis] == 0) if axis is not None else 0 in x.shape:
        raise ShapeError(f"argmax: cannot search an empty axis (shape {tuple(x.shape)}, axis "
                         f"{axis})")
    shape = () if axis is None else tuple(d for i, d in enumerate(x.shape)
                                         if i != axis % len(x.shape))
    return AVal(shape, dtypes.int64)


def _argmax_np(x, axis):
    return np.argmax(x, axis=axis)


ARGMAX = defop("argmax", compute=_argmax_np, infer=_argmax_infer)


# --- joining ----------------------------------------------------------------------------------
def _concat_infer(*xs, axis):
    if not xs:
        raise ShapeError("concatenate: needs at least one tensor")
    r = len(xs[0].shape)
    if not -r <= axis < r:
        raise ShapeError(f"concatenate: axis {axis} out of range for rank {r}")
    ax = axis % r
    for x in xs:
        if len(x.shape) != r or any(a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape))
                                    if i != ax):
            raise ShapeError(f"concatenate: shapes {[tuple(x.shape) for x in xs]} differ off "
                             f"axis {axis}")
        if x.dtype != xs[0].dtype:
            raise DTypeError(f"concatenate: dtypes differ: {[str(x.dtype) for x in xs]}")
    shape = list(xs[0].shape)
    shape[ax] = builtins.sum(x.shape[ax] for x in xs)
    return AVal(tuple(shape), xs[0].dtype)


def _concat_vjp(g, xs, y, needs, axis):
    ax, start, out = axis % len(g.shape), 0, []
    for x, need in zip(xs, needs):
        size = x.shape[ax]
        idx = (slice(None),) * ax + (slice(start, start + size),)
        out.append(getitem(g, idx) if need else None)
        start += size
    return tuple(out)


def _concat_jvp(ts, xs, y, axis):
    return concatenate([t if t is not None else zeros_like(x) for t, x in zip(ts, xs)], axis)


def _concat_np(*xs, axis):
    return np.concatenate(xs, axis=axis)


CONCATENATE = defop("concatenate", compute=_concat_np, infer=_concat_infer, vjp=_concat_vjp,
                    jvp=_concat_jvp, storage=True)


def _stack_infer(*xs, axis):
    if not xs:
        raise ShapeError("stack: needs at least one tensor")
    for x in xs:
        if tuple(x.shape) != tuple(xs[0].shape):
            raise ShapeError(f"stack: all shapes must be equal, got {[tuple(x.shape) for x in xs]}")
    r = len(xs[0].shape) + 1
    if not -r <= axis < r:
        raise ShapeError(f"stack: axis {axis} out of range for rank {r}")
    shape = list(xs[0].shape)
    shape.insert(axis % r, len(xs))
    return AVal(tuple(shape), dtypes_common(xs, "stack"))


def dtypes_common(xs, op):
    if any(x.dtype != xs[0].dtype for x in xs):
        raise DTypeError(f"{op}: dtypes differ: {[str(x.dtype) for x in xs]}")
    return xs[0].dtype


def _stack_np(*xs, axis):
    return np.stack(xs, axis=axis)


def _stack_vjp(g, xs, y, needs, axis):
    return tuple(getitem(g, (slice(None),) * (axis % len(g.shape)) + (i,)) if need else None
                 for i, need in enumerate(needs))


def _stack_jvp(ts, xs, y, axis):
    return stack([t if t is not None else zeros_like(x) for t, x in zip(ts, xs)], axis)


STACK = defop("stack", compute=_stack_np, infer=_stack_infer, vjp=_stack_vjp, jvp=_stack_jvp,
              storage=True)


# --- indexing ---------------------------------------------------------------------------------
# An index is stored in a canonical form whose parts compare (and print) by value: Python ints,
# slices of ints, None, Ellipsis, and each index array (list, ndarray, Tensor) as a nested tuple
# of Python ints or bools. ``_np_index`` turns it back into what numpy indexes with.
def canonical_index(index):
    """``index`` (anything numpy's ``x[index]`` takes, minus tracers) in canonical form."""
    parts = index if isinstance(index, tuple) else (index,)
    out = []
    for i in parts:
        if i is None or i is Ellipsis:
            out.append(i)
        elif isinstance(i, (bool, np.bool_)):
            out.append(bool(i))
        elif isinstance(i, (int, np.integer)):
            out.append(int(i))
        elif isinstance(i, slice):
            out.append(slice(*(None if v is None else as_int("getitem", "slice bound", v)
                               for v in (i.start, i.stop, i.step))))
        else:
            if isinstance(i, Tensor) and i.is_tracer:
                raise ShapeError("getitem: cannot index with a traced tensor (its values are "
                                 "unknown at trace time); use ml.ops.take(x, indices, axis)")
            a = np.asarray(i)
            if a.size == 0:
                a = a.astype(np.intp)
            if a.dtype.kind not in "biu":
                raise ShapeError(f"getitem: index arrays must hold integers or bools, got "
                                 f"{a.dtype} ({_idx_str((i,))})")
            out.append(_nested_tuple(a.tolist()) if a.ndim else a.item())
    return tuple(out)


def _nested_tuple(v):
    return tuple(_nested_tuple(e) for e in v) if isinstance(v, list) else v


_ARRAYLIKE = (tuple, list, np.ndarray)


def _is_advanced(index):
    return any(isinstance(i, _ARRAYLIKE) for i in index)


def _np_index(index):
    """A canonical index as numpy indexes with (its tuples back to arrays; lists and arrays,
    from a caller of ``apply`` that skipped :func:`canonical_index`, are taken as they are)."""
    if not _is_advanced(index):
        return index
    return tuple(_as_index_array(i) if isinstance(i, _ARRAYLIKE) else i for i in index)


def _as_index_array(t):
    a = np.asarray(t)
    return a if a.dtype.kind in "biu" else a.astype(np.intp)  # () and ((), ()) come back float


def _index_shape(op, shape, index):
    probe = np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape, (0,) * len(shape))
    try:
        return probe[_np_index(index)].shape
    except (IndexError, TypeError, ValueError) as e:
        raise ShapeError(f"{op}: index {_idx_str(index)} is invalid for shape {tuple(shape)}: "
                         f"{e}") from None


def _idx_str(index):
    def one(i):
        if isinstance(i, slice):
            s = f"{'' if i.start is None else i.start}:{'' if i.stop is None else i.stop}"
            return s + (f":{i.step}" if i.step is not None else "")
        if i is Ellipsis:
            return "..."
        a = np.asarray(i) if isinstance(i, (tuple, list, np.ndarray)) else None
        if a is not None and a.size > 8:
            return f"<{a.dtype.name} index array of shape {a.shape}>"
        return repr(i)
    return "[" + ", ".join(one(i) for i in index) + "]"


def _getitem_np(x, index):
    return x[_np_index(index)]


def _getitem_infer(x, index):
    return AVal(_index_shape("getitem", x.shape, index), x.dtype)


def _getitem_vjp(g, xs, y, needs, index):
    return (getitem_grad(g, xs[0].shape, index),)


def _getitem_jvp(ts, xs, y, index):
    return None if ts[0] is None else getitem(ts[0], index)


GETITEM = defop("getitem", compute=_getitem_np, infer=_getitem_infer, vjp=_getitem_vjp,
                jvp=_getitem_jvp, storage=True)


def _getitem_grad_compute(g, shape, index):
    z = np.zeros(shape, g.dtype)
    if _is_advanced(index):  # an index array may repeat a position: add, don't assign
        np.add.at(z, _np_index(index), g)
    else:
        z[_np_index(index)] = g
    return z


def _getitem_grad_infer(g, shape, index):
    y = _getitem_infer(AVal(tuple(shape), g.dtype), index)
    expect_shape("getitem_grad", "the cotangent", g.shape, y.shape)
    return AVal(tuple(shape), g.dtype)


def _getitem_grad_vjp(u, xs, y, needs, shape, index):
    return (getitem(u, index),)


def _getitem_grad_jvp(ts, xs, y, shape, index):
    return None if ts[0] is None else getitem_grad(ts[0], shape, index)


GETITEM_GRAD = defop("getitem_grad", compute=_getitem_grad_compute, infer=_getitem_grad_infer,
                     vjp=_getitem_grad_vjp, jvp=_getitem_grad_jvp)


def _take_infer(x, idx, axis):
    if idx.dtype.kind not in "iu":
        raise DTypeError(f"take: indices must be integers, got {idx.dtype}")
    if not -len(x.shape) <= axis < len(x.shape):
        raise ShapeError(f"take: axis {axis} out of range for shape {tuple(x.shape)}")
    ax = axis % len(x.shape)
    return AVal(tuple(x.shape[:ax]) + tuple(idx.shape) + tuple(x.shape[ax + 1:]), x.dtype)


def _take_compute(x, idx, axis):
    n = x.shape[axis]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        raise ShapeError(f"take: index out of range [{-n}, {n}) on axis {axis} of shape "
                         f"{x.shape} (got min {idx.min()}, max {idx.max()})")
    return np.take(x, idx, axis=axis)


def _take_vjp(g, xs, y, needs, axis):
    return (take_grad(g, xs[1], xs[0].shape, axis), None)


def _take_jvp(ts, xs, y, axis):
    return None if ts[0] is None else take(ts[0], xs[1], axis)


TAKE = defop("take", compute=_take_compute, infer=_take_infer, vjp=_take_vjp, jvp=_take_jvp,
             storage=True)


def _take_grad_compute(g, idx, shape, axis):
    z = np.zeros(shape, g.dtype)
    zm = np.moveaxis(z, axis, 0)
    gm = np.moveaxis(g, list(range(axis, axis + idx.ndim)), list(range(idx.ndim)))
    np.add.at(zm, idx, gm)
    return z


def _take_grad_infer(g, idx, shape, axis):
    y = _take_infer(AVal(tuple(shape), g.dtype), idx, axis)
    expect_shape("take_grad", "the cotangent", g.shape, y.shape)
    return AVal(tuple(shape), g.dtype)


def _take_grad_vjp(u, xs, y, needs, shape, axis):
    return (take(u, xs[1], axis), None)


def _take_grad_jvp(ts, xs, y, shape, axis):
    return None if ts[0] is None else take_grad(ts[0], xs[1], shape, axis)


TAKE_GRAD = defop("take_grad", compute=_take_grad_compute, infer=_take_grad_infer,
                  vjp=_take_grad_vjp, jvp=_take_grad_jvp)


# --- pad --------------------------------------------------------------------------------------
def _pad_infer(x, pad_width, value):
    if len(pad_width) != len(x.shape) or any(a < 0 or b < 0 for a, b in pad_width):
        raise ShapeError(f"pad: pad_width {pad_width} does not fit shape {tuple(x.shape)} "
                         f"(one non-negative (before, after) pair per axis)")
    return AVal(tuple(d + a + b for d, (a, b) in zip(x.shape, pad_width)), x.dtype)


def _pad_np(x, pad_width, value):
    return np.pad(x, pad_width, constant_values=value)


def _pad_vjp(g, xs, y, needs, pad_width, value):
    return (getitem(g, tuple(slice(a, a + d) for d, (a, b) in zip(xs[0].shape, pad_width))),)


def _pad_jvp(ts, xs, y, pad_width, value):
    return None if ts[0] is None else pad(ts[0], pad_width, 0.0)


PAD = defop("pad", compute=_pad_np, infer=_pad_infer, vjp=_pad_vjp, jvp=_pad_jvp)


# --- matmul -----------------------------------------------------------------------------------
def _matmul_infer(a, b):
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ShapeError(f"matmul: expects tensors with at least 2 dims, got {tuple(a.shape)} "
                         f"@ {tuple(b.shape)}; reshape vectors to (1, n) or (n, 1)")
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)} "
                         f"({a.shape[-1]} != {b.shape[-2]})")
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul: dtypes differ: {a.dtype} @ {b.dtype}; cast one with "
                         f"ml.ops.cast")
    if a.dtype == dtypes.bool_:
        raise DTypeError("matmul: bool tensors are not supported")
    if len(a.shape) == len(b.shape) == 2:
        return AVal((a.shape[0], b.shape[1]), a.dtype)
    batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    return AVal(batch + (a.shape[-2], b.shape[-1]), a.dtype)


def _mT(x):
    r = len(x.shape)
    return apply(TRANSPOSE, x, axes=tuple(range(r - 2)) + (r - 1, r - 2))


def _matmul_vjp(g, xs, y, needs):
    return (unbroadcast(matmul(g, _mT(xs[1])), xs[0].shape) if needs[0] else None,
            unbroadcast(matmul(_mT(xs[0]), g), xs[1].shape) if needs[1] else None)


def _matmul_jvp(ts, xs, y):
    return tsum(None if ts[0] is None else matmul(ts[0], xs[1]),
                None if ts[1] is None else matmul(xs[0], ts[1]))


MATMUL = defop("matmul", compute=np.matmul, infer=_matmul_infer, vjp=_matmul_vjp,
               jvp=_matmul_jvp)


# --- public functions -------------------------------------------------------------------------
def _rank(x):
    return len(x.shape) if hasattr(x, "shape") else np.ndim(x)


def _dims(op, shape):
    """A shape argument (an int or a sequence of ints) as a tuple of Python ints."""
    shape = tuple(shape) if hasattr(shape, "__iter__") else (shape,)
    return tuple(as_int(op, "shape", d) for d in shape)


def identity(x):
    """``x`` itself, as a node of its own."""
    return apply(IDENTITY, x)


def reshape(x, shape):
    """Reshape; one dimension may be -1 (inferred from the others), no other may be negative."""
    shape = _dims("reshape", shape)
    xs = x.shape if hasattr(x, "shape") else np.shape(x)
    if any(s < -1 for s in shape) or shape.count(-1) > 1:
        raise ShapeError(f"reshape: cannot reshape {tuple(xs)} into {shape}: dimensions must be "
                         f">= 0, except a single -1")
    if shape.count(-1) == 1:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        total = int(np.prod(xs, dtype=np.int64))
        if known == 0 or total % known:
            raise ShapeError(f"reshape: cannot reshape {tuple(xs)} into {shape}")
        shape = tuple(total // known if s == -1 else s for s in shape)
    return apply(RESHAPE, x, shape=shape)


def transpose(x, axes=None):
    """Permute axes (default: reverse them)."""
    r = _rank(x)
    axes = tuple(reversed(range(r))) if axes is None else tuple(
        check_axis("transpose", a, r) for a in axes)
    return apply(TRANSPOSE, x, axes=axes)


def broadcast_to(x, shape):
    """Broadcast ``x`` to ``shape`` (numpy's rule); the gradient sums back to ``x``'s shape."""
    return apply(BROADCAST_TO, x, shape=_dims("broadcast_to", shape))


def sum(x, axis=None, keepdims=False):  # noqa: A001
    """Sum over ``axis`` (None = all)."""
    return apply(SUM, x, axis=norm_axes("sum", axis, _rank(x)), keepdims=bool(keepdims))


def mean(x, axis=None, keepdims=False):
    """Mean over ``axis`` (None = all); NaN over an axis of length 0, as in PyTorch."""
    return apply(MEAN, x, axis=norm_axes("mean", axis, _rank(x)), keepdims=bool(keepdims))


def max(x, axis=None, keepdims=False):  # noqa: A001
    """Maximum over ``axis`` (like ``torch.amax``; an axis of length 0 is refused).

    The gradient is split evenly among tied maxima, as ``torch.amax`` and ``torch.max()``
    (no dim) do; ``torch.max(x, dim)`` instead sends it all to the one index it returns.
    """
    return apply(MAX, x, axis=norm_axes("max", axis, _rank(x)), keepdims=bool(keepdims))


def argmax(x, axis=None):
    """Index of the maximum along ``axis`` (None: into the flattened tensor); int64."""
    return apply(ARGMAX, x, axis=None if axis is None else check_axis("argmax", axis, _rank(x)))


def concatenate(tensors, axis=0):
    """Join tensors along an existing axis."""
    return apply(CONCATENATE, *tensors, axis=as_int("concatenate", "axis", axis))


def stack(tensors, axis=0):
    """Join tensors along a new axis."""
    return apply(STACK, *tensors, axis=as_int("stack", "axis", axis))


def getitem(x, index):
    """numpy indexing ``x[index]``: ints, slices, None, Ellipsis, and integer or bool index
    arrays (lists, arrays or concrete Tensors); repeated indices accumulate in the gradient."""
    return apply(GETITEM, x, index=canonical_index(index))


def getitem_grad(g, shape, index):
    """The gradient of ``getitem``: ``g`` added into zeros of ``shape`` at ``index``."""
    return apply(GETITEM_GRAD, g, shape=tuple(shape), index=canonical_index(index))


def take(x, indices, axis=0):
    """Gather entries of ``x`` along ``axis`` at integer ``indices`` (duplicates allowed)."""
    return apply(TAKE, x, indices, axis=as_int("take", "axis", axis))


def take_grad(g, indices, shape, axis):
    return apply(TAKE_GRAD, g, indices, shape=tuple(shape), axis=int(axis))


def pad(x, pad_width, value=0.0):
    """Constant padding; ``pad_width`` is an int (every side) or one (before, after) pair of
    ints per axis."""
    r = _rank(x)
    if isinstance(pad_width, (int, np.integer)) and not isinstance(pad_width, (bool, np.bool_)):
        pad_width = ((pad_width, pad_width),) * r
    if not isinstance(pad_width, (tuple, list)) or not all(
            isinstance(p, (tuple, list)) and len(p) == 2 for p in pad_width):
        raise DTypeError(f"pad: pad_width must be an int or one (before, after) pair of ints "
                         f"per axis, got {pad_width!r}")
    pw = tuple((as_int("pad", "pad_width", a), as_int("pad", "pad_width", b))
               for a, b in pad_width)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise DTypeError(f"pad: value must be a number, got {value!r}")
    return apply(PAD, x, pad_width=pw, value=float(value))


def matmul(a, b):
    """Matrix product over the last two axes, batch axes broadcast. As in numpy, a 1-D operand
    is treated as a row (left) or column (right) vector and that axis is dropped afterwards."""
    ra, rb = _rank(a), _rank(b)
    if ra >= 2 and rb >= 2:
        return apply(MATMUL, a, b)
    if ra == 0 or rb == 0:
        raise ShapeError(f"matmul: operands must have at least 1 dimension, got shapes "
                         f"{tuple(np.shape(a))} and {tuple(np.shape(b))}")
    a2 = reshape(a, (1, -1)) if ra == 1 else a
    b2 = reshape(b, (-1, 1)) if rb == 1 else b
    out = apply(MATMUL, a2, b2)
    shape = tuple(out.shape)
    if ra == 1:
        shape = shape[:-2] + shape[-1:]
    if rb == 1:
        shape = shape[:-1]
    return reshape(out, shape)

