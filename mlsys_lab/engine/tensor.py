"""Tensor: an n-dimensional array that can record how it was computed, and how Python values
become one (``tensor``, ``as_tensor``, ``lift``).

Ops run through :func:`~mlsys_lab.engine.dispatch.apply` (eager, tracing, tape, tangents), which
lives in :mod:`.dispatch` with the grad modes; they are re-exported here, so
``from mlsys_lab.engine.tensor import apply, no_grad`` keeps working. Operators and methods
(``+``, ``@``, ``.sum()``, ``.backward()``) are installed by :mod:`.tensor_methods`.
"""

import numpy as np

from ..errors import (
    DTypeError,
    DTypeOverflowError,
    MLSysError,
    RankError,
    ShapeError,
    TraceError,
)
from . import dispatch, dtypes
from .dispatch import (  # noqa: F401 - re-exported: the engine's and notebooks' import path
    MODE,
    apply,
    conform_tangent,
    enable_grad,
    is_grad_enabled,
    no_grad,
    run_kernel,
)
from .registry import AVal
from .source import user_source_line


class Tensor:
    """An n-dimensional array that can record how it was computed.

    Attributes:
        data: the numpy array (``None`` for a tracer, which only knows its shape and dtype).
        requires_grad: whether gradients flow to this tensor.
        grad: the accumulated gradient after ``backward()`` (a Tensor), or None.
        name: optional name, used when printing graphs.

    numpy functions called on a Tensor run the matching ``ml.ops`` op, or refuse where they
    would silently drop gradients; ``np.asarray(t)`` leaves the tape explicitly (see
    ``mlsys_lab.engine.tensor_methods``).
    """

    __slots__ = ("data", "requires_grad", "grad", "name", "_ctx", "_tangent", "_value",
                 "_builder", "_freed", "__weakref__")
    __array_priority__ = 1000

    def __init__(self, data, dtype=None, requires_grad=False, name=None):
        self.data = _to_array(data, dtype)
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self.name = name
        self._ctx = None
        self._tangent = None
        self._value = None
        self._builder = None
        self._freed = False
        if self.requires_grad and not dtypes.is_float(self.data.dtype):
            raise DTypeError(f"tensor: only floating tensors can require grad, "
                                   f"got {self.data.dtype}")

    @classmethod
    def _wrap(cls, array):
        """A Tensor around ``array`` as is (no copy, no checks): how ops return results."""
        t = _new(cls)
        t.data = array
        t.requires_grad = t._freed = False
        t.grad = t.name = t._ctx = t._tangent = t._value = t._builder = None
        return t

    # --- what a tensor is -------------------------------------------------------------------
    @property
    def shape(self):
        return self.data.shape if self.data is not None else self._value.shape

    @property
    def dtype(self):
        return self.data.dtype if self.data is not None else self._value.dtype

    @property
    def aval(self):
        return AVal(self.shape, self.dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def device(self):
        return "cpu"

    @property
    def is_leaf(self):
        return self._ctx is None

    @property
    def is_tracer(self):
        return self.data is None

    def numpy(self):
        """The values as a numpy array (shares memory with the tensor)."""
        if self.data is None:
            raise TraceError(f"cannot read the values of traced tensor {self._value.name} "
                             f"{self.shape}: values exist only when the graph runs")
        return self.data

    def item(self):
        """The value of a one-element tensor as a Python number."""
        return self._number("item()")

    def _number(self, what):
        """The single value as a Python number, or a RankError naming ``what``."""
        a = self.numpy()
        if a.size != 1:
            raise RankError(f"{what}: only a one-element tensor can be converted to a Python "
                            f"number; this one has {a.size} elements (shape {self.shape})")
        return a.item()

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(t)`` / ``np.array(t)``: the values as a plain numpy array.

        This is the explicit exit from the tape: the array has no history, so whatever numpy
        computes from it is a constant to autodiff (like ``t.detach().numpy()`` in PyTorch).
        Calling a numpy function on the Tensor itself instead dispatches to the matching
        ``ml.ops`` op, or refuses if that would silently drop gradients (see
        ``mlsys_lab.engine.tensor_methods``).
        """
        a = self.numpy()
        if dtype is not None:
            return a.astype(dtype, copy=bool(copy))
        return a.copy() if copy else a

    def tolist(self):
        """The values as nested Python lists."""
        return self.numpy().tolist()

    def detach(self):
        """A new tensor sharing the data but cut from the tape."""
        if self.data is None:
            t = Tensor._wrap(None)
            t._value, t._builder = self._value, self._builder
            return t
        return Tensor._wrap(self.data)

    def requires_grad_(self, flag=True):
        """Set ``requires_grad`` in place (floating tensors only); returns self."""
        if flag and not dtypes.is_float(self.dtype):
            raise DTypeError(f"requires_grad_: only floating tensors can require grad, "
                                   f"got {self.dtype}")
        self.requires_grad = bool(flag)
        return self

    def __len__(self):
        if not self.shape:
            raise RankError("len(): a 0-d tensor has no length (use .item() for its value)")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise RankError("iter(): iteration over a 0-d tensor (use .item() for its value)")
        return (self[i] for i in range(self.shape[0]))

    def __bool__(self):
        if self.data is None:
            raise TraceError(
                f"a Python `if`/`while`/`bool()` needs the value of traced tensor "
                f"{self._value.name} {self.shape}, which tracing does not have; use "
                f"ml.ops.cond(pred, true_fn, false_fn, *operands) for data-dependent branches"
                f"{_where(self)}")
        if self.data.size != 1:
            raise RankError(f"bool(): the truth value of a tensor with {self.data.size} elements "
                            f"(shape {self.shape}) is ambiguous; use t.any() or t.all()")
        return bool(self.data.item())

    def __float__(self):
        return float(self._number("float()"))

    def __int__(self):
        return int(self._number("int()"))

    def __index__(self):
        if self.dtype.kind not in "biu":
            raise DTypeError(f"__index__: only an integer tensor can be used as an index, got "
                             f"{self.dtype}")
        return int(self._number("__index__"))

    def __format__(self, spec):
        """``f"{t:.3f}"`` formats a 0-d tensor's value, as numpy does for 0-d arrays."""
        if spec and self.data is not None and self.data.ndim == 0:
            return format(self.data.item(), spec)
        return super().__format__(spec)

    __hash__ = object.__hash__

    def __repr__(self):
        extra = ", requires_grad=True" if self.requires_grad else ""
        if self.data is None:
            return f"Tracer({self._value.name}: {dtypes.short(self.dtype)}{list(self.shape)})"
        body = np.array2string(self.data, precision=4, separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype.name}{extra})"


def _where(t):
    v = getattr(t, "_value", None)
    node = getattr(v, "producer", None)
    here = user_source_line()
    out = f"\n  at {here}" if here else ""
    if node is not None and node.source:
        out += f"\n  (the value was produced at {node.source})"
    return out


def _to_array(data, dtype=None):
    if isinstance(data, Tensor):
        data = data.numpy()
    if isinstance(data, (np.ndarray, np.generic)):
        if dtype is not None:
            return np.array(data, dtype=dtypes.as_dtype(dtype))
        if isinstance(data, np.ndarray):
            dtypes.as_dtype(data.dtype)
        return np.asarray(data)
    arr = _from_python(data, None if dtype is None else dtypes.as_dtype(dtype))
    if dtype is not None:
        return arr
    if arr.dtype.kind in "uOf":
        big = _int_outside_int64(data)
        if big is not None:
            raise DTypeOverflowError(
                f"tensor: the integer {dtypes.show_int(big)} does not fit in int64, the dtype "
                f"Python ints take (range {-2**63}..{2**63 - 1}); pass dtype='float64' to store "
                f"it as a float")
    if arr.dtype.kind == "f":
        arr = arr.astype(np.float32)
    elif arr.dtype.kind in "iu" and arr.dtype != np.uint8:
        arr = arr.astype(np.int64)
    dtypes.as_dtype(arr.dtype)
    return arr


def _from_python(data, dt):
    """``np.array(data, dt)`` with numpy's conversion errors turned into the library's."""
    if dt is not None and dtypes.is_storage(dt):
        dtypes.check_storage_range(data, dt, "tensor")  # ml_dtypes wraps (int4: 9 -> -7)
    try:
        return np.array(data, dtype=dt) if dt is not None else np.asarray(data)
    except OverflowError as e:
        raise DTypeOverflowError(f"tensor: a value does not fit in {dt} ({e})") from None
    except (ValueError, TypeError) as e:
        if "inhomogeneous" in str(e):
            raise ShapeError(f"tensor: the nested sequence is ragged (rows of different "
                             f"lengths), so it is not a rectangular array ({e})") from None
        raise DTypeError(f"tensor: cannot convert {type(data).__name__} data to "
                         f"{dt if dt is not None else 'an array'} ({e})") from None


def _int_outside_int64(data):
    """The first integer in nested lists/tuples outside int64's range, unless a float is also
    present (then a float result is what the data asks for); else None."""
    big, todo = None, [data]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, (float, np.floating)):
            return None
        elif (big is None and isinstance(x, (int, np.integer)) and not isinstance(x, bool)
              and not -2**63 <= int(x) < 2**63):
            big = x
    return big


def tensor(data, dtype=None, requires_grad=False, name=None):
    """Create a Tensor. Python floats become float32; float64 numpy arrays stay float64."""
    return Tensor(data, dtype=dtype, requires_grad=requires_grad, name=name)


def as_tensor(x, like_dtype=None, op="tensor"):
    """``x`` as a Tensor; Python scalars take a dtype next to ``like_dtype`` (weak typing).

    Raises:
        DTypeOverflowError: the scalar does not fit in that dtype (``300`` next to uint8,
            ``2**63`` next to int64). numpy 2 refuses these as well; PyTorch wraps silently.
        MLSysError: ``x`` cannot become a tensor (None, a string, a ragged list); the message
            starts with ``op``.
    """
    if isinstance(x, Tensor):
        return x
    scalar = (bool, int, float, np.bool_, np.integer, np.floating)
    if isinstance(x, scalar) and like_dtype is not None:
        return Tensor._wrap(dtypes.scalar_array(x, dtypes.weak_dtype(x, like_dtype), op))
    try:
        return Tensor(x)
    except MLSysError as e:
        if op == "tensor":
            raise
        reason = str(e).removeprefix("tensor: ")
        raise type(e)(f"{op}: cannot convert an argument of type {type(x).__name__} to a "
                      f"tensor: {reason}") from None


def lift(args, op="tensor"):
    """Turn op arguments into Tensors, giving Python scalars the dtype of their tensor peers."""
    for a in args:  # the common case, every argument a Tensor already, kept fast
        if not isinstance(a, Tensor):
            break
    else:
        return args
    ref = None
    for a in args:
        if isinstance(a, (Tensor, np.ndarray)):
            ref = a.dtype if ref is None else dtypes.promote(ref, np.dtype(a.dtype))
    if ref is None:
        ref = dtypes.float32 if any(isinstance(a, float) for a in args) else None
    return tuple(as_tensor(a, ref if ref is not None else dtypes.default_dtype_for(a), op)
                 for a in args)


_new = object.__new__


def zeros_like(x):
    """A zero Tensor with the shape and dtype of ``x`` (a Tensor, Value or array)."""
    return Tensor._wrap(np.zeros(x.shape, x.dtype))


dispatch.use_tensor_type(lift, Tensor._wrap)
