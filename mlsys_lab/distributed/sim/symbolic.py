"""Arrays with a shape and a dtype but no values, for timing collectives too big to hold."""

from __future__ import annotations

import numpy as np

from ...errors import ArgumentError, ShapeError

__all__ = ["SymbolicArray"]


class SymbolicArray:
    """Shape and dtype without values: lets the simulator time collectives whose data could
    not fit in memory. Slicing, reshaping, ufuncs and concatenation give symbolic results;
    asking for values raises."""

    __mlsys_symbolic__ = True

    def __init__(self, shape, dtype="float32"):
        self.shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    def __repr__(self):
        return f"SymbolicArray(shape={self.shape}, dtype={self.dtype})"

    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    ndim = property(lambda self: len(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self):
        return self.shape[0]

    def copy(self):
        return SymbolicArray(self.shape, self.dtype)

    def astype(self, dtype):
        return SymbolicArray(self.shape, dtype)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and not np.isscalar(shape[0]) else shape
        return SymbolicArray(_reshaped(self.size, shape), self.dtype)

    def __getitem__(self, index):
        if self.ndim != 1 or not isinstance(index, slice):
            raise ArgumentError("SymbolicArray: only 1-d slices are supported")
        return SymbolicArray(len(range(self.shape[0])[index]), self.dtype)

    def __array__(self, *args, **kwargs):
        raise ArgumentError("SymbolicArray has no values (it models size only)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs:
            return NotImplemented
        shapes = [np.shape(x) if not isinstance(x, SymbolicArray) else x.shape for x in inputs]
        dtypes = [x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype for x in inputs]
        if len(set(shapes)) != 1:
            raise ShapeError(f"{ufunc.__name__}: symbolic operands of shapes {shapes}")
        return SymbolicArray(shapes[0], np.result_type(*dtypes))


def _reshaped(size, shape):
    shape = [int(s) for s in shape]
    if shape.count(-1) == 1:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        shape[shape.index(-1)] = size // known if known else 0
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise ShapeError(f"SymbolicArray.reshape: cannot reshape size {size} into {shape}")
    return tuple(shape)
