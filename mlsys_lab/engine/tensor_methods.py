"""Operator overloading: ``+ - * / ** @``, comparisons, indexing and methods on Tensor
(``.sum()``, ``.backward()``, ...), and how numpy's functions treat a Tensor.

numpy functions on Tensors (``__array_ufunc__`` / ``__array_function__``):

* a numpy function with an ``ml.ops`` counterpart runs that op (``np.exp(t)`` is
  ``ml.ops.exp(t)``, ``np.sum(t, axis=1)`` is ``ml.ops.sum(t, axis=1)``, see ``UFUNCS`` and
  ``FUNCTIONS``): the result is a Tensor, recorded on the tape and in traces, with the ``ml.ops``
  dtype rules (``np.exp`` of float32 stays float32). Where that op refuses the dtype (``np.mean``
  of a bool tensor) and no gradient is involved, numpy computes it, still returned as a Tensor;
* any other numpy function (or one called with arguments the op does not take, such as
  ``dtype=``) runs on the values. That is allowed while no gradient can be lost: no argument is
  being differentiated (requires grad with grad mode on, or carries a ``jvp`` tangent), or the
  result is not floating (``np.allclose``, ``np.isnan``, ``np.shape``). Otherwise it raises
  ``TapeError``, and on a traced tensor ``TraceError``, naming the numpy function and what to use
  instead. numpy ufuncs return a Tensor; other functions return what numpy returns.

``np.asarray(t)`` is the explicit exit: a plain array with no history (see ``Tensor.__array__``).
"""

import inspect

import numpy as np

from .. import ops
from ..errors import DTypeError, TapeError, TraceError
from . import autodiff, dtypes
from .dispatch import MODE
from .tensor import Tensor


def _getitem(self, key):
    """``t[key]``: one integer index array is a ``take`` on the first axis (the index may be a
    traced tensor); anything else numpy accepts, e.g. ``t[[0, 1], [1, 2]]``, is ``getitem``."""
    keys = key if isinstance(key, tuple) else (key,)
    if len(keys) == 1 and isinstance(keys[0], (Tensor, np.ndarray, list)):
        idx = keys[0] if isinstance(keys[0], Tensor) else np.asarray(keys[0])
        if idx.dtype == np.bool_:
            raise TraceError("getitem: boolean-mask indexing gives a data-dependent shape; "
                             "use ml.ops.where(mask, x, 0) instead")
        return ops.take(self, idx, axis=0)
    return ops.getitem(self, key)


# --- numpy interoperability -----------------------------------------------------------------

#: numpy ufunc -> the ml.ops function that runs it (same arguments).
UFUNCS = {
    np.add: ops.add, np.subtract: ops.sub, np.multiply: ops.mul, np.divide: ops.div,
    np.power: ops.pow, np.negative: ops.neg, np.absolute: ops.abs, np.exp: ops.exp,
    np.log: ops.log, np.sqrt: ops.sqrt, np.tanh: ops.tanh, np.sin: ops.sin, np.cos: ops.cos,
    np.sign: ops.sign, np.maximum: ops.maximum, np.minimum: ops.minimum, np.matmul: ops.matmul,
    np.equal: ops.eq, np.not_equal: ops.ne, np.less: ops.lt, np.less_equal: ops.le,
    np.greater: ops.gt, np.greater_equal: ops.ge, np.square: lambda x: ops.mul(x, x),
}

#: Where to point users of numpy functions that have no direct ml.ops counterpart.
HINTS = {"dot": "ml.ops.matmul", "clip": "ml.ops.maximum and ml.ops.minimum",
         "squeeze": "ml.ops.reshape", "expand_dims": "ml.ops.reshape",
         "swapaxes": "ml.ops.transpose", "moveaxis": "ml.ops.transpose",
         "einsum": "ml.ops.matmul", "tensordot": "ml.ops.matmul", "reciprocal": "ml.ops.div",
         "min": "-ml.ops.max(-x)", "amin": "-ml.ops.max(-x)", "var": "ml.ops.mean",
         "std": "ml.ops.mean and ml.ops.sqrt", "log1p": "ml.ops.log", "expm1": "ml.ops.exp"}

_NO = object()  # "argument not given"


class _Unsupported(Exception):
    """The call uses an argument its ml.ops counterpart does not take."""


def _plain(*given):
    if any(g is not _NO and g is not None for g in given):
        raise _Unsupported


def _np_sum(a, axis=None, dtype=None, out=None, keepdims=False, initial=_NO, where=_NO):
    _plain(dtype, out, initial, where)
    return ops.sum(a, axis, keepdims)


def _np_mean(a, axis=None, dtype=None, out=None, keepdims=False, *, where=_NO):
    _plain(dtype, out, where)
    return ops.mean(a, axis, keepdims)


def _np_max(a, axis=None, out=None, keepdims=False, initial=_NO, where=_NO):
    _plain(out, initial, where)
    return ops.max(a, axis, keepdims)


def _np_argmax(a, axis=None, out=None, *, keepdims=False):
    _plain(out, keepdims or None)
    return ops.argmax(a, axis)


def _np_reshape(a, /, shape, order="C", *, copy=None):
    _plain(copy, None if order == "C" else order)
    return ops.reshape(a, shape)


def _np_transpose(a, axes=None):
    return ops.transpose(a, axes)


def _np_broadcast_to(array, shape, subok=False):
    return ops.broadcast_to(array, tuple(shape) if np.iterable(shape) else (shape,))


def _np_concatenate(arrays, /, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _plain(out, dtype, "axis=None" if axis is None else None, casting != "same_kind" or None)
    return ops.concatenate(list(arrays), axis)


def _np_stack(arrays, axis=0, out=None, *, dtype=None, casting="same_kind"):
    _plain(out, dtype, casting != "same_kind" or None)
    return ops.stack(list(arrays), axis)


def _np_where(condition, x=_NO, y=_NO, /):
    if x is _NO or y is _NO:
        raise _Unsupported
    return ops.where(condition, x, y)


def _np_take(a, indices, axis=None, out=None, mode="raise"):
    _plain(out, "axis=None" if axis is None else None, None if mode == "raise" else mode)
    return ops.take(a, indices, axis)


#: numpy function -> (ml.ops name, an adapter with numpy's signature that calls the op).
FUNCTIONS = {
    np.sum: ("sum", _np_sum), np.mean: ("mean", _np_mean), np.max: ("max", _np_max),
    np.amax: ("max", _np_max), np.argmax: ("argmax", _np_argmax),
    np.reshape: ("reshape", _np_reshape), np.transpose: ("transpose", _np_transpose),
    np.broadcast_to: ("broadcast_to", _np_broadcast_to),
    np.concatenate: ("concatenate", _np_concatenate), np.stack: ("stack", _np_stack),
    np.where: ("where", _np_where), np.take: ("take", _np_take),
}
_SIGNATURES = {f: inspect.signature(adapter) for f, (_, adapter) in FUNCTIONS.items()}


def _array_ufunc(self, ufunc, method, *inputs, **kwargs):
    """numpy ufuncs on Tensors: the matching ml.ops op, else numpy on the values (see top)."""
    name = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    op = UFUNCS.get(ufunc)
    if op is not None and method == "__call__" and not kwargs:
        return _run_op(name, lambda: op(*inputs), ufunc, inputs, {})
    call = ufunc if method == "__call__" else getattr(ufunc, method)
    hint = f"ml.ops.{op.__name__}" if op is not None and op.__name__ != "<lambda>" else None
    writes = inputs[0] if method == "at" else None  # ufunc.at updates its first operand
    return _run_numpy(name, call, inputs, kwargs, hint, as_tensor=True, writes=writes)


def _array_function(self, func, types, args, kwargs):
    """numpy functions on Tensors: the matching ml.ops op, else numpy on the values (see top)."""
    name = func.__module__.replace("numpy", "np", 1).split("._")[0] + "." + func.__name__
    if func in FUNCTIONS:
        op_name, adapter = FUNCTIONS[func]
        try:
            _SIGNATURES[func].bind(*args, **kwargs)
        except TypeError:  # not a call the adapter takes: numpy will judge it
            pass
        else:
            try:
                return _run_op(name, lambda: adapter(*args, **kwargs), func, args, kwargs)
            except _Unsupported:
                pass
        return _run_numpy(name, func, args, kwargs, f"ml.ops.{op_name}", as_tensor=True)
    return _run_numpy(name, func, args, kwargs, HINTS.get(func.__name__), as_tensor=False)


def _run_op(name, run, func, args, kwargs):
    """Run the ml.ops counterpart; where it refuses the dtype and no gradient is involved,
    let numpy compute the answer instead (returned as a Tensor)."""
    try:
        return run()
    except DTypeError:
        if any(_on_tape(t) for t in _tensors((args, kwargs))):
            raise
    return _run_numpy(name, func, args, kwargs, None, as_tensor=True)


def _run_numpy(name, func, args, kwargs, hint, as_tensor, writes=None):
    """``func`` on the Tensors' values, refused where that would silently lose gradients.

    ``writes`` (and any ``out=``) are arrays numpy updates in place: checked before it does."""
    tensors = _tensors((args, kwargs))
    tracer = next((t for t in tensors if t.data is None), None)
    if tracer is not None:
        raise TraceError(f"{name} cannot run on traced tensor {tracer._value.name} "
                         f"{tracer.shape}: numpy needs values, which tracing does not have; "
                         f"use {hint or 'ml.ops functions'} instead")
    tracked = [t for t in tensors if _on_tape(t)]
    out = kwargs.get("out")
    if isinstance(out, tuple) and len(out) == 1:  # ufuncs always pass out= as a tuple
        out = out[0]
    for target in (writes, out):
        if target is not None:
            _refuse_tracked(name, tracked, _values(target), hint)
    result = func(*_values(args), **_values(kwargs))
    if out is not None:  # numpy returns the out= arrays: give back the caller's objects
        return out
    _refuse_tracked(name, tracked, result, hint)
    return _as_tensors(result, name) if as_tensor else result


def _refuse_tracked(name, tracked, result, hint=None):
    """Raise TapeError if a tensor being differentiated meets numpy and ``result`` is floating
    or None (a function that returns nothing may have copied the values somewhere)."""
    if not tracked or (result is not None and not _has_float(result)):
        return
    raise TapeError(
        f"{name} was called on a tensor {tracked[0].dtype}{list(tracked[0].shape)} that is being "
        f"differentiated; numpy does not record on the tape, so its gradient would silently be "
        f"zero. Use {hint or 'the ml.ops functions'} instead, or np.asarray(t) to leave the tape "
        f"on purpose")


def _on_tape(t):
    return (t.data is None or (t.requires_grad and MODE.grad_enabled)
            or (t._tangent is not None and MODE.forward_depth > 0))


def _tensors(obj):
    """The Tensors in ``obj`` and in the lists, tuples and dicts it nests."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for x in obj for t in _tensors(x)]
    if isinstance(obj, dict):
        return [t for x in obj.values() for t in _tensors(x)]
    return []


def _values(obj):
    """``obj`` with every Tensor replaced by its numpy array."""
    if isinstance(obj, Tensor):
        return obj.data
    if isinstance(obj, (list, tuple)):
        values = [_values(x) for x in obj]
        return values if isinstance(obj, list) else tuple(values)
    if isinstance(obj, dict):
        return {k: _values(x) for k, x in obj.items()}
    return obj


def _has_float(obj):
    if isinstance(obj, (list, tuple)):
        return any(_has_float(x) for x in obj)
    return isinstance(obj, float) or (hasattr(obj, "dtype") and np.dtype(obj.dtype).kind in "fc")


def _as_tensors(result, name):
    if isinstance(result, tuple):
        return tuple(_as_tensors(r, name) for r in result)
    if isinstance(result, (np.ndarray, np.generic)):
        arr = np.asarray(result)
        dtypes.as_dtype(arr.dtype, name)
        return Tensor._wrap(arr)
    return result


def _any(a, axis=None, keepdims=False):
    """Whether any element is non-zero (over ``axis``); a bool Tensor."""
    return ops.gt(ops.sum(ops.cast(ops.ne(a, 0), "int64"), axis, keepdims), 0)


def _all(a, axis=None, keepdims=False):
    """Whether every element is non-zero (over ``axis``); a bool Tensor."""
    return ops.eq(ops.sum(ops.cast(ops.eq(a, 0), "int64"), axis, keepdims), 0)


def _backward(self, grad=None, retain_graph=False, create_graph=False):
    """Accumulate d(self)/d(leaf) into every leaf's ``.grad`` (reverse mode over the tape)."""
    autodiff.backward(self, grad, retain_graph=retain_graph, create_graph=create_graph)


def _install():
    T = Tensor
    T.backward = _backward
    # Forward operators and methods are the op functions themselves (no wrapper call).
    T.__add__, T.__sub__, T.__mul__, T.__truediv__ = ops.add, ops.sub, ops.mul, ops.div
    T.__pow__, T.__matmul__, T.__neg__, T.__abs__ = ops.pow, ops.matmul, ops.neg, ops.abs
    T.__eq__, T.__ne__, T.__lt__, T.__le__, T.__gt__, T.__ge__ = (
        ops.eq, ops.ne, ops.lt, ops.le, ops.gt, ops.ge)
    T.__radd__ = lambda a, b: ops.add(b, a)
    T.__rsub__ = lambda a, b: ops.sub(b, a)
    T.__rmul__ = lambda a, b: ops.mul(b, a)
    T.__rtruediv__ = lambda a, b: ops.div(b, a)
    T.__rpow__ = lambda a, b: ops.pow(b, a)
    T.__rmatmul__ = lambda a, b: ops.matmul(b, a)
    T.__getitem__ = _getitem
    T.T = property(ops.transpose)
    T.sum, T.mean, T.max, T.argmax = ops.sum, ops.mean, ops.max, ops.argmax
    T.reshape = lambda a, *shape: ops.reshape(
        a, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
    T.transpose = lambda a, *axes: ops.transpose(
        a, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else (axes or None))
    T.exp, T.log, T.sqrt = ops.exp, ops.log, ops.sqrt
    T.relu, T.tanh, T.sigmoid = ops.relu, ops.tanh, ops.sigmoid
    T.cast = T.astype = ops.cast
    T.flatten = lambda a: ops.reshape(a, (-1,))
    T.any, T.all = _any, _all
    T.__array_ufunc__, T.__array_function__ = _array_ufunc, _array_function


_install()
