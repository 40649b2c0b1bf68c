"""mlsys_lab: a small, real ML framework for the openMLsys textbook.

    import mlsys_lab as ml
    x = ml.tensor([[1., 2.]], requires_grad=True)
    (x @ x.T).sum().backward()
"""

__version__ = "0.1.0"

import numpy as _np  # noqa: E402

from . import ops  # noqa: E402
from .engine import tensor_methods as _tensor_methods  # noqa: E402,F401
from .engine.autodiff import grad, gradients, hvp, jvp, tape_to_graph, value_and_grad, vjp  # noqa: E402
from .engine.compiler import compile, compile_train_step  # noqa: E402,A004
from .engine.dtypes import bool_, float16, float32, float64, int32, int64, uint8  # noqa: E402
from .engine.graph import Graph  # noqa: E402
from .engine.tensor import Tensor, enable_grad, is_grad_enabled, no_grad, tensor  # noqa: E402
from .engine.trace import trace  # noqa: E402
from .engine.transform import grad_graph  # noqa: E402
from .errors import (  # noqa: E402
    CheckpointError,
    CycleError,
    DTypeError,
    GraphError,
    MLSysError,
    OpError,
    ShapeError,
    TraceError,
)

__all__ = [
    "CheckpointError", "CycleError", "DTypeError", "Graph", "GraphError", "MLSysError", "OpError",
    "ShapeError", "Tensor", "TraceError", "bool_", "compile", "compile_train_step",
    "enable_grad", "float16", "float32", "float64", "grad", "grad_graph", "gradients", "hvp",
    "int32", "int64", "is_grad_enabled", "jvp", "no_grad", "ones", "ops", "randn",
    "tape_to_graph", "tensor", "trace", "uint8", "value_and_grad", "vjp", "zeros",
]


def zeros(shape, dtype="float32", requires_grad=False):
    """A tensor of zeros."""
    return Tensor(_np.zeros(shape, dtype), requires_grad=requires_grad)


def ones(shape, dtype="float32", requires_grad=False):
    """A tensor of ones."""
    return Tensor(_np.ones(shape, dtype), requires_grad=requires_grad)


def randn(*shape, dtype="float32", requires_grad=False, seed=None):
    """Standard-normal samples (seeded by ``seed`` for reproducibility)."""
    rng = _np.random.default_rng(seed)
    return Tensor(rng.standard_normal(shape).astype(dtype), requires_grad=requires_grad)


def __getattr__(name):  # lazy subpackages: ml.nn, ml.optim, ml.viz, ml.compile, ...
    import importlib

    if name in ("nn", "optim", "viz", "kernels", "data", "grading", "deploy", "distributed"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("save", "load"):
        from .nn import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'mlsys_lab' has no attribute {name!r}")
