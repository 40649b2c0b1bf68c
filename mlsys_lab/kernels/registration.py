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


register_impl("matmul", "cpu-numba", _cpu_matmul, dtypes=("float32", "float64"), max_ndim=2,
              name="numba.matmul_packed")
register_impl("matmul", "cuda", _cuda_matmul, dtypes=("float32",), max_ndim=2,
              name="cuda.matmul_double_buffer")


