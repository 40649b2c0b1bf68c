"""Register the Numba kernels as operator implementations, so operator selection can pick them.

Imported by :func:`mlsys_lab.engine.selection.device` the first time a device is looked up
(importing numba.cuda is not free, so ``import mlsys_lab`` does not do it).
"""

from ..engine.registry import register_impl


def _cpu_matmul(a, b):
    from . import cpu

    return cpu.matmul(a, b, variant="packed")


def _cuda_matmul(a, b):
    from numba.core import config

    from . import cuda

    config_ = cuda.SIMULATOR_CONFIGS["double_buffer"] if config.ENABLE_CUDASIM else None
    return cuda.matmul(a, b, variant="double_buffer", config=config_)


def _two_matrices(avals, out, attrs):
    """The ladders multiply two matrices of one floating dtype."""
    a, b = avals
    if len(a.shape) != 2 or len(b.shape) != 2:
        return f"rank {len(a.shape)} @ rank {len(b.shape)}, not two matrices"
    if a.dtype != b.dtype or a.dtype.kind != "f":
        return f"dtypes {a.dtype} and {b.dtype}, not one floating dtype"
    return None


register_impl("matmul", "cpu-numba", _cpu_matmul, name="numba.matmul_packed", returns=True,
              dtypes=("float32", "float64"), max_ndim=2, accepts=_two_matrices)
register_impl("matmul", "cuda", _cuda_matmul, name="cuda.matmul_double_buffer", returns=True,
              dtypes=("float32",), max_ndim=2, accepts=_two_matrices)
