"""What several exercises of chapter 6 share: the graph passes' probe and judges (6.3 CSE,
6.4 constant folding).

A probe sends ``pass_result(fn, graph)``: the student's result as data, with the evidence of
purity (was the input graph returned, or changed). ``judge_pass`` rebuilds the result and checks
it lints, keeps the inputs, computes what the input graph computes (on the probe's inputs and
on fresh ones) and, given the library's result, has exactly as many nodes; ``judge_pure``
checks the input graph was left alone.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import describe
from mlsys_lab.grading.exercises.fixtures import (
    first_difference,
    graph_data,
    graph_from_data,
    graph_snapshot,
    lint_and_run,
    outputs_of,
)

#: Every graph pass of the frontend (CSE, constant folding, ...): off limits in 6.3 and 6.4.
GRAPH_PASSES = ("mlsys_lab.engine.passes.frontend",)


def pass_result(fn, graph):
    """What a probe sends about ``fn(graph)``: the result as data, and purity evidence."""
    before = graph_snapshot(graph)
    result = fn(graph)
    return {"graph": graph_data(result), "same_object": result is graph, "before": before,
            "after": graph_snapshot(graph)}


def judge_pass(got, graph, args, what, reference=None, verb=""):
    """Rebuild the student's result; check it lints, keeps the inputs, computes what ``graph``
    computes, and (with ``reference``) has exactly as many nodes as the library's pass leaves."""
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: the check got {describe(got)}")
    result = graph_from_data(got.get("graph"), what)
    if len(result.inputs) != len(graph.inputs):
        raise AssertionError(f"{what}: the result takes {len(result.inputs)} inputs, the original "
                             f"{len(graph.inputs)}; keep every input")
    rng = np.random.default_rng(len(graph.nodes))
    fresh = [rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs]
    for xs in (args, fresh):
        expected = outputs_of(graph, xs)
        out = lint_and_run(result, xs, what)
        if len(out) != len(expected):
            raise AssertionError(f"{what}: the result returns {len(out)} outputs, expected "
                                 f"{len(expected)}")
        for i, (o, e) in enumerate(zip(out, expected, strict=True)):
            if o.shape != e.shape or not np.allclose(o, e, rtol=1e-6, atol=1e-6):
                raise AssertionError(f"{what}: output {i} changed")
    if reference is not None:
        expect_count(result, reference, what, verb)
    return result


def expect_count(result, reference, what, verb):
    """Fail unless ``result`` has exactly as many nodes as ``reference`` (the library's pass,
    named ``verb`` in the message)."""
    if len(result.nodes) > len(reference.nodes):
        raise AssertionError(f"{what}: {len(result.nodes)} nodes left, but {verb} gets it down "
                             f"to {len(reference.nodes)}")
    if len(result.nodes) < len(reference.nodes):
        raise AssertionError(f"{what}: only {len(result.nodes)} nodes left, but correct {verb} "
                             f"keeps {len(reference.nodes)}: nodes that compute different values "
                             f"(or draw fresh randomness) must stay")


def judge_pure(got, what):
    """Fail when the pass returned its input graph or changed it (``pass_result``'s evidence),
    or returned no graph."""
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: the check got {describe(got)}")
    if got.get("same_object"):
        raise AssertionError(f"{what}: returned the input graph itself; a pass builds a new Graph")
    changed = first_difference(got.get("before"), got.get("after"))
    if changed:
        raise AssertionError(f"{what}: the input graph was changed ({changed}); a pass must not "
                             f"mutate its input. Graph(...) relinks every Value it is given, so "
                             f"give the new graph fresh Values")
    graph_from_data(got.get("graph"), what)


def count_ops(graph, op):
    """How many nodes of ``graph`` run ``op``."""
    return sum(n.op == op for n in graph.nodes)
