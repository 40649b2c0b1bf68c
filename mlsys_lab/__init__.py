"""mlsys_lab: a small, real ML framework for the openMLsys textbook.

    import mlsys_lab as ml
    x = ml.tensor([[1., 2.]], requires_grad=True)
    (x @ x.T).sum().backward()
"""

__version__ = "0.1.0"

import math as _math  # noqa: E402

import numpy as _np  # noqa: E402

from . import ops  # noqa: E402
from .engine import tensor_methods as _tensor_methods  # noqa: E402,F401
from .engine.autodiff import grad, gradients, hvp, jvp, tape_to_graph, value_and_grad, vjp  # noqa: E402
from .engine.autodiff_graph import grad_graph  # noqa: E402
from .engine.compiler import compile  # noqa: E402,A004
from .engine.dispatch import custom_op  # noqa: E402
from .engine.dtypes import as_dtype as _as_dtype  # noqa: E402
from .engine.dtypes import (  # noqa: E402
    bool_,
    float16,
    float32,
    float64,
    int8,
    int16,
    int32,
    int64,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .engine.graph import Graph  # noqa: E402
from .engine.graph import set_svg_renderer as _set_svg_renderer  # noqa: E402
from .engine.interpreter import MEMORY_LIMIT as _MEMORY_LIMIT  # noqa: E402
from .engine.per_example import per_example_grad  # noqa: E402
from .engine.tensor import Tensor, enable_grad, is_grad_enabled, no_grad, tensor  # noqa: E402
from .engine.threads import limit_threads, num_threads, set_num_threads  # noqa: E402
from .engine.trace import trace  # noqa: E402
from .errors import (  # noqa: E402
    ArgumentError,
    CheckpointError,
    CycleError,
    DTypeError,
    DTypeOverflowError,
    GraphError,
    MLSysError,
    OpError,
    OutOfMemoryError,
    PlanError,
    RankError,
    ShapeError,
    TapeError,
    TraceError,
    UnknownNameError,
)
from .kernels import registration as _registration  # noqa: E402,F401 - Numba kernels as impls
from .nn.train_step import compile_train_step  # noqa: E402
from .span import Span  # noqa: E402

__all__ = [
    "ArgumentError", "CheckpointError", "CycleError", "DTypeError", "DTypeOverflowError", "Graph",
    "GraphError", "MLSysError", "OpError", "OutOfMemoryError", "PlanError", "RankError",
    "ShapeError", "Span", "TapeError", "Tensor", "TraceError", "UnknownNameError", "bfloat16",
    "bool_",
    "compile", "compile_train_step", "custom_op", "enable_grad", "float16", "float32", "float64",
    "grad", "grad_graph", "gradients", "hvp", "int8", "int16", "int32", "int64", "is_grad_enabled",
    "jvp", "limit_threads", "no_grad", "num_threads", "ones", "ops", "per_example_grad", "randn",
    "set_num_threads", "tape_to_graph", "tensor", "trace", "uint8", "uint16", "uint32", "uint64",
    "value_and_grad", "vjp", "zeros",
]


def zeros(shape, dtype="float32", requires_grad=False):
    """A tensor of zeros of ``shape`` (an int or a tuple of ints)."""
    return Tensor(_allocate("zeros", shape, dtype, _np.zeros), requires_grad=requires_grad)


def ones(shape, dtype="float32", requires_grad=False):
    """A tensor of ones of ``shape`` (an int or a tuple of ints)."""
    return Tensor(_allocate("ones", shape, dtype, _np.ones), requires_grad=requires_grad)


def randn(*shape, dtype="float32", requires_grad=False, seed=None):
    """Standard-normal samples, ``randn(2, 3)`` or ``randn((2, 3))`` (seeded by ``seed``)."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    rng = _np.random.default_rng(seed)
    data = _allocate("randn", shape, dtype,
                     lambda dims, dt: rng.standard_normal(dims).astype(dt, copy=False))
    return Tensor(data, requires_grad=requires_grad)


def _allocate(fn, shape, dtype, make):
    """``make(dims, dtype)`` after checking the shape, with allocation failures named.

    Raises:
        ShapeError: a dimension is negative or not an integer.
        OutOfMemoryError: the array does not fit in memory (names the shape and bytes).
    """
    dims = (shape,) if isinstance(shape, (int, _np.integer)) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise ShapeError(f"{fn}: shape must be an int or a tuple of ints, got {shape!r}") from None
    for d in dims:
        if isinstance(d, (bool, _np.bool_)) or not isinstance(d, (int, _np.integer)):
            raise ShapeError(f"{fn}: shape {dims} has a non-integer dimension {d!r}")
        if d < 0:
            raise ShapeError(f"{fn}: shape {dims} has a negative dimension {d}")
    dims, dt = tuple(int(d) for d in dims), _as_dtype(dtype, fn)
    nbytes = _math.prod(dims) * dt.itemsize
    message = (f"{fn}: cannot allocate shape {dims} of {dt}: {nbytes:,} bytes "
               f"({nbytes / 2**30:,.1f} GiB)")
    if _MEMORY_LIMIT and nbytes > _MEMORY_LIMIT:  # would only succeed lazily, then crash
        raise OutOfMemoryError(f"{message}, more than this machine's "
                               f"{_MEMORY_LIMIT / 2**30:,.1f} GiB of memory")
    try:
        return make(dims, dt)
    except (MemoryError, ValueError):  # ValueError: numpy's "array is too big"
        raise OutOfMemoryError(message) from None


def _render_svg(dot_source):
    from .viz.graph_view import render_svg  # imported on first display: viz pulls matplotlib

    return render_svg(dot_source)


_set_svg_renderer(_render_svg)


def __getattr__(name):  # lazy subpackages: ml.nn, ml.optim, ml.viz, ml.compile, ...
    import importlib

    if name in ("nn", "optim", "viz", "kernels", "data", "grading", "deploy", "distributed"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("save", "load"):
        from .nn import checkpoint

        return getattr(checkpoint, name)
    if name == "bfloat16":  # a storage dtype: ml_dtypes is imported on first use (~1 s)
        from .engine import dtypes

        return dtypes.bfloat16
    raise AttributeError(f"module 'mlsys_lab' has no attribute {name!r}")

from .engine.recompute import recompute  # noqa: E402,F401 - in __all__ below

__all__.append("recompute")
