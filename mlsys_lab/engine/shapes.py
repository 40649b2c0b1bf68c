"""Shape helpers shared by the op definitions: broadcasting, its gradient, axes and integers.

Every function here either computes on plain shapes (tuples of ints) or, for
:func:`unbroadcast`, on a Tensor through its methods, so this module imports no op module and
every op module can import it.
"""

import builtins

import numpy as np

from ..errors import DTypeError, ShapeError


def broadcast_shapes(op, *shapes):
    """numpy's broadcasting rule, raising a ShapeError that names ``op`` and the shapes."""
    first = shapes[0]
    if all(s == first for s in shapes[1:]):  # the common case: nothing broadcasts
        return tuple(first)
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(-ndim, 0):
        dim = 1
        for s in shapes:
            d = s[i] if -i <= len(s) else 1
            if d != 1:
                if dim != 1 and d != dim:
                    shown = " and ".join(str(tuple(s)) for s in shapes)
                    raise ShapeError(f"{op}: cannot broadcast shapes {shown}")
                dim = d
        out.append(dim)
    return tuple(out)


def unbroadcast(g, shape):
    """Sum the Tensor ``g`` back to ``shape`` (the gradient rule of numpy broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    s = g.sum(axes) if axes else g
    return s.reshape(shape) if s.shape != shape else s


def as_int(op, name, v):
    """``v`` as a Python int; a DTypeError naming ``op`` and ``name`` when it is no integer
    (``axis=1.5`` must not silently become 1)."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise DTypeError(f"{op}: {name} must be an integer, got {v!r} ({type(v).__name__})")
    return int(v)


def check_axis(op, axis, ndim):
    """``axis`` (an int, may be negative) as a non-negative axis of a rank-``ndim`` tensor."""
    a = as_int(op, "axis", axis)
    if not -ndim <= a < ndim:
        raise ShapeError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
    return a % ndim


def norm_axes(op, axis, ndim):
    """Canonical reduction axes: a sorted tuple of non-negative ints (None = all axes)."""
    if axis is None:
        return tuple(range(ndim))
    axes = tuple(axis) if isinstance(axis, (tuple, list, np.ndarray)) else (axis,)
    out = []
    for a in axes:
        a = as_int(op, "axis", a)
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ShapeError(f"{op}: axis {a} is out of range for a tensor of rank {ndim}")
        out.append(a % builtins.max(ndim, 1))
    if len(set(out)) != len(out):
        raise ShapeError(f"{op}: repeated axis in {axis}")
    return tuple(sorted(out))


def reduced_shape(shape, axes, keepdims):
    """``shape`` after reducing over ``axes`` (kept as 1s with ``keepdims``)."""
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def conv_out_size(size, k, stride, pad):
    """Output length of a window of size ``k`` sliding with ``stride`` over ``size + 2 pad``."""
    return (size + 2 * pad - k) // stride + 1


def expect_shape(op, what, got, want):
    """ShapeError unless ``got == want``: a gradient op's cotangent must have the shape of the
    forward result it is the gradient of."""
    if tuple(got) != tuple(want):
        raise ShapeError(f"{op}: {what} must have shape {tuple(want)}, got {tuple(got)}")
