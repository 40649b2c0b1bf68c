"""Every fusion of the compiler (book ch. 7), in one place.

* :mod:`.elementwise` — a chain of elementwise ops becomes one ``fused_elementwise`` node run by
  one generated Numba loop (the code generator is there too);
* :mod:`.linear` — ``act(a @ w + b)`` into ``fused_linear`` / ``fused_conv``, and
  ``c +- s * (a @ b)`` into one in-place ``gemm``;
* :mod:`.ops` — the fused ops those passes emit; :mod:`.kernels` — their CPU kernels.
"""

from . import kernels  # noqa: F401  (registers the fused ops' CPU kernels)
from .elementwise import (  # noqa: F401
    FUSED_ELEMENTWISE,
    KERNEL_CACHE,
    compile_kernel,
    expression,
    fuse_elementwise,
    fused_elementwise_into,
    fused_elementwise_numba,
    fusion_groups,
    kernel_source,
    program_aval,
    run_program,
)
from .linear import fuse_gemm_accumulate, fuse_matmul_bias_act  # noqa: F401
