"""Data-graph optimisation: passes over a Pipeline's operator chain.

Each pass is a pure function ``Pipeline -> Pipeline``: it builds new nodes and never changes
the input's. Every rewrite keeps the outputs exactly as they were; when that cannot be shown
from what the operators declare, the pass leaves the graph alone.

* ``fuse_maps`` — two consecutive maps with the same parallelism (degree, ordering, executor,
  per-item or per-batch) become one map running both functions: one queue hop and one
  dispatch per item instead of two. Item indices (hence seeded generators) are unchanged,
  because a map is one-to-one.
* ``vectorize_maps`` — ``map(f).batch(b)`` becomes ``batch(b).map(f_batched)`` when every
  function of the map declares a batched form and the batch uses the default collation (the
  batched form is written against it). Seeded functions get the generators of the items in
  the batch (batch ``k`` holds items ``k*b .. k*b+len-1``), so random results do not change.
* ``push_filters`` — ``map(m).filter(p)`` becomes ``filter(p).map(m)`` (the map then skips
  the items the filter drops) only when all of these hold: the filter declares the fields it
  reads (``reads=``); every function of the map declares that it keeps those fields (it was
  given ``field=`` some other field, or ``preserves=`` those fields); no function of the map is
  seeded (filtering first would renumber the items and change their generators); the map works
  per item, not per batch. Declarations are promises the pass trusts.
"""

from __future__ import annotations

import dataclasses

from .ops import BatchNode, FilterNode, MapNode
from .pipeline import Pipeline

__all__ = ["fuse_maps", "vectorize_maps", "push_filters", "optimize", "DEFAULT_PASSES"]


def _same_parallelism(a: MapNode, b: MapNode) -> bool:
    return (a.num_parallel is b.num_parallel or a.num_parallel == b.num_parallel) and \
        (a.deterministic, a.executor, a.batch_size) == (b.deterministic, b.executor,
                                                         b.batch_size)


def _fused_name(a: MapNode, b: MapNode) -> str:
    return a.name + "+" + b.name.removeprefix("map:")


def fuse_maps(pipe: Pipeline) -> Pipeline:
    """Fuse runs of consecutive maps that share their parallelism into single maps."""
    out = []
    for node in pipe.nodes:
        previous = out[-1] if out else None
        if isinstance(node, MapNode) and isinstance(previous, MapNode) \
                and _same_parallelism(previous, node):
            out[-1] = dataclasses.replace(previous, steps=previous.steps + node.steps,
                                          name=_fused_name(previous, node))
        else:
            out.append(node)
    return Pipeline.from_nodes(out)


def _vectorizable(node, after) -> bool:
    return (isinstance(node, MapNode) and isinstance(after, BatchNode)
            and node.batch_size is None and after.collate_fn is None
            and all(step.batched_fn is not None for step in node.steps))


def vectorize_maps(pipe: Pipeline) -> Pipeline:
    """Rewrite ``map(f).batch(b)`` to ``batch(b).map(batched f)`` where ``f`` has a batched form."""
    nodes = list(pipe.nodes)
    i = 0
    while i + 1 < len(nodes):
        node, after = nodes[i], nodes[i + 1]
        if _vectorizable(node, after):
            nodes[i], nodes[i + 1] = after, dataclasses.replace(
                node, batch_size=after.size, name=f"{node.name}[batched]")
            i = max(i - 1, 0)  # a map above the batch may now be vectorisable too
        else:
            i += 1
    return Pipeline.from_nodes(nodes)


def _can_push(node, after) -> bool:
    return (isinstance(node, MapNode) and isinstance(after, FilterNode)
            and after.reads is not None and node.batch_size is None
            and all(step.keeps(after.reads) for step in node.steps))


def push_filters(pipe: Pipeline) -> Pipeline:
    """Move each filter above the maps that provably keep the fields it reads."""
    nodes = list(pipe.nodes)
    moved = True
    while moved:
        moved = False
        for i in range(len(nodes) - 1):
            if _can_push(nodes[i], nodes[i + 1]):
                nodes[i], nodes[i + 1] = nodes[i + 1], nodes[i]
                moved = True
    return Pipeline.from_nodes(nodes)


DEFAULT_PASSES = (push_filters, fuse_maps, vectorize_maps)


def optimize(pipe: Pipeline, passes=DEFAULT_PASSES, return_steps: bool = False):
    """Apply ``passes`` in order until the graph stops changing (at most 4 rounds).

    Args:
        pipe: The pipeline (unchanged).
        passes: Functions ``Pipeline -> Pipeline``.
        return_steps: Also return ``[(pass name, pipeline after it), ...]`` for every pass
            that changed something, so a notebook can show before and after.
    """
    def signature(p):  # passes reuse every node they do not change
        return tuple(map(id, p.nodes))

    steps = []
    for _ in range(4):
        start = pipe
        for rewrite in passes:
            result = rewrite(pipe)
            if signature(result) != signature(pipe):
                steps.append((rewrite.__name__, result))
            pipe = result
        if signature(pipe) == signature(start):
            break
    return (pipe, steps) if return_steps else pipe
