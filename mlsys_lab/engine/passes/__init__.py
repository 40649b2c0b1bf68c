"""Graph passes: pure ``Graph -> Graph`` functions with a name (book chapters 6 and 7).

    from mlsys_lab.engine.passes import run_pipeline, constant_folding, split_concat
    result = run_pipeline(graph, [constant_folding, "cse", split_concat(max_inputs=63)])
    result.graph; result.stages; print(result.table())

Frontend: constant folding, dead code elimination, common subexpression elimination, algebraic
simplification. Backend: transpose cancelling, Concat splitting, NCHW -> NHWC layout
transformation, precision lowering, elementwise fusion (one generated Numba kernel) and
matmul/conv + bias + activation fusion (all fusion under :mod:`.fusion`). Training graphs:
activation recomputation (``recompute_pass``) and the schedules choosing what it saves
(:mod:`.recompute`).
"""

from .backend import cancel_transposes, layout_transform, lower_precision, split_concat
from .catalog import FRONTEND, PASSES, default_pipeline
from .frontend import (
    algebraic_simplification,
    common_subexpression_elimination,
    constant_folding,
    cse,
    dce,
    dead_code_elimination,
)
from .fusion import fuse_elementwise, fuse_gemm_accumulate, fuse_matmul_bias_act
from .pipeline import PipelineResult, Stage, as_pass, pipeline, run_pipeline
from .recompute import (
    Schedule,
    optimal_schedule,
    peak_memory,
    recompute_pass,
    sqrt_schedule,
)
from .rewrite import Pass, Rewriter, clone, graph_pass

__all__ = [
    "default_pipeline", "FRONTEND", "PASSES", "Pass", "PipelineResult", "Rewriter", "Stage",
    "algebraic_simplification",
    "as_pass", "cancel_transposes", "clone", "common_subexpression_elimination",
    "constant_folding", "cse", "dce", "dead_code_elimination", "fuse_elementwise",
    "fuse_gemm_accumulate", "fuse_matmul_bias_act", "graph_pass", "layout_transform",
    "lower_precision", "pipeline", "run_pipeline", "split_concat",
    "Schedule", "optimal_schedule", "peak_memory", "recompute_pass", "sqrt_schedule",
]
