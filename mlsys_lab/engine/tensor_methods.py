"""Operator overloading: ``+ - * / ** @``, comparisons, indexing and methods on Tensor."""

import numpy as np

from .. import ops
from ..errors import TraceError
from .tensor import Tensor


def _getitem(self, key):
    keys = key if isinstance(key, tuple) else (key,)
    if any(isinstance(k, (Tensor, np.ndarray, list)) for k in keys):
        if len(keys) == 1:
            idx = keys[0]
            idx = idx if isinstance(idx, Tensor) else np.asarray(idx)
            if idx.dtype == np.bool_:
                raise TraceError("getitem: boolean-mask indexing gives a data-dependent shape; "
                                 "use ml.ops.where(mask, x, 0) instead")
            return ops.take(self, idx, axis=0)
        raise IndexError("getitem: advanced indexing supports one integer array on the first "
                         "axis; use ml.ops.take(x, indices, axis) for other axes")
    return ops.getitem(self, key)


def _install():
    T = Tensor
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


_install()
