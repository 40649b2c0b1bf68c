"""The data pipeline (tf.data / MindSpore style): an immutable chain of operator nodes with
per-operator parallelism, a profiler, graph passes, an autotuner and a simulator (book
chapter 9). The modules, one idea each:

    pipeline   Pipeline (from_*, map, filter, shuffle, batch, prefetch, cache, shard, ...),
               with_degrees, measure_costs, autotune (measure, choose, apply)
    ops        the operator nodes and how each one runs (inline map, prefetch thread, cache)
    pools      a parallel map's workers: threads or forked processes, ordered or not
    runtime    the run's context, clock, queue helpers and PipelineTimeout
    report     what a profiled run records (a Span per item, mlsys_lab.span) and the
               per-operator Report
    passes     data-graph passes: fuse_maps, vectorize_maps, push_filters, optimize
    autotune   choosing per-operator degrees from measured costs (pure functions)
    sim        a discrete-event simulation of a pipeline (throughput, idle, timeline)

The ``autotune`` *function* (measure, then choose) is ``pipeline.autotune``, re-exported by
:mod:`mlsys_lab.data`; here ``autotune`` names the module of the choosing rules.
"""

from .autotune import AUTOTUNE, choose_degrees, refine_degrees
from .passes import fuse_maps, optimize, push_filters, vectorize_maps
from .pipeline import (
    Pipeline,
    PipelineError,
    PipelineTimeout,
    measure_costs,
    measured_rate,
    with_degrees,
)
from .report import Report, StageReport

__all__ = [
    "AUTOTUNE", "Pipeline", "PipelineError", "PipelineTimeout", "Report", "StageReport",
    "choose_degrees", "fuse_maps", "measure_costs", "measured_rate", "optimize", "push_filters",
    "refine_degrees", "vectorize_maps", "with_degrees",
]
