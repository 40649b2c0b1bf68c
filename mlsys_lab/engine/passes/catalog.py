"""Every pass by name (pipelines accept the names) and the default pipeline of ``ml.compile``."""

from .backend import cancel_transposes, layout_transform, lower_precision, split_concat
from .frontend import (
    algebraic_simplification,
    common_subexpression_elimination,
    constant_folding,
    cse,
    dce,
    dead_code_elimination,
)
from .fusion import fuse_elementwise, fuse_gemm_accumulate, fuse_matmul_bias_act

#: Every pass by name (pipelines accept these names).
PASSES = {p.name: p for p in (
    constant_folding, dead_code_elimination, common_subexpression_elimination,
    algebraic_simplification, cancel_transposes, split_concat, layout_transform,
    lower_precision, fuse_elementwise, fuse_matmul_bias_act, fuse_gemm_accumulate)}
PASSES.update(cse=cse, dce=dce)

#: The frontend clean-up most pipelines start with.
FRONTEND = (constant_folding, algebraic_simplification, common_subexpression_elimination,
            dead_code_elimination)


def default_pipeline():
    """What ``ml.compile`` runs by default: the frontend clean-up, transpose cancelling, then
    matmul/conv + bias + ReLU fusion, GEMM accumulation and elementwise fusion."""
    return [*FRONTEND, cancel_transposes, fuse_matmul_bias_act, fuse_gemm_accumulate,
            fuse_elementwise, dead_code_elimination]
