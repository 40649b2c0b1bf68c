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
    T.__add__ = lambda a, b: ops.add(a, b)
    T.__radd__ = lambda a, b: ops.add(b, a)
    T.__sub__ = lambda a, b: ops.sub(a, b)
    T.__rsub__ = lambda a, b: ops.sub(b, a)
    T.__mul__ = lambda a, b: ops.mul(a, b)
    T.__rmul__ = lambda a, b: ops.mul(b, a)
    T.__truediv__ = lambda a, b: ops.div(a, b)
    T.__rtruediv__ = lambda a, b: ops.div(b, a)
    T.__pow__ = lambda a, b: ops.pow(a, b)
    T.__rpow__ = lambda a, b: ops.pow(b, a)
    T.__matmul__ = lambda a, b: ops.matmul(a, b)
    T.__rmatmul__ = lambda a, b: ops.matmul(b, a)
    T.__neg__ = lambda a: ops.neg(a)
    T.__abs__ = lambda a: ops.abs(a)
    T.__eq__ = lambda a, b: ops.eq(a, b)
    T.__ne__ = lambda a, b: ops.ne(a, b)
    T.__lt__ = lambda a, b: ops.lt(a, b)
    T.__le__ = lambda a, b: ops.le(a, b)
    T.__gt__ = lambda a, b: ops.gt(a, b)
    T.__ge__ = lambda a, b: ops.ge(a, b)
    T.__hash__ = object.__hash__
    T.__getitem__ = _getitem
    T.T = property(lambda a: ops.transpose(a))
    T.sum = lambda a, axis=None, keepdims=False: ops.sum(a, axis, keepdims)
    T.mean = lambda a, axis=None, keepdims=False: ops.mean(a, axis, keepdims)
    T.max = lambda a, axis=None, keepdims=False: ops.max(a, axis, keepdims)
    T.argmax = lambda a, axis=None: ops.argmax(a, axis)
    T.reshape = lambda a, *shape: ops.reshape(
        a, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape)
    T.transpose = lambda a, *axes: ops.transpose(
        a, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else (axes or None))
    T.exp = lambda a: ops.exp(a)
    T.log = lambda a: ops.log(a)
    T.relu = lambda a: ops.relu(a)
    T.tanh = lambda a: ops.tanh(a)
    T.sigmoid = lambda a: ops.sigmoid(a)
    T.sqrt = lambda a: ops.sqrt(a)
    T.cast = lambda a, dtype: ops.cast(a, dtype)
    T.astype = T.cast
    T.flatten = lambda a: ops.reshape(a, (-1,))


_install()
