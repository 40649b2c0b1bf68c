"""Exercise 4.3: unroll a loop body into fresh nodes.

Wrong ideas rejected: listing the body's Node objects n times, or reusing its Values or
constants, fails the fresh-objects case and changes the body (Graph(...) relinks the values it
gets); copying nodes with the body's names fails SSA names; wiring every iteration to the
original input, or unrolling n - 1 times, fails the outputs on n = 3 and 5; a graph of one
constant holding the answer for the example input fails because the judge runs the graph on
fresh inputs; returning nothing fails every case (each one runs the returned graph). `ml.trace`
(which would unroll the loop for you), `Graph.copy`, the passes' Rewriter/clone and the
autodiff transforms are off limits.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, expect_list, register
from mlsys_lab.grading.core.guard import unguarded
from mlsys_lab.grading.exercises.fixtures import (
    as_array,
    first_difference,
    from_wire,
    graph_data,
    graph_from_data,
    graph_snapshot,
    lint_and_run,
)


def _bodies():
    import mlsys_lab as ml

    rng = np.random.default_rng(3)
    W = (rng.standard_normal((4, 4)) * 0.5).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)

    def rnn_cell(h):
        return ml.ops.tanh(h @ W + b)

    def damped(x):
        return x * 0.5 + 1.0

    def mix(x):
        y = ml.ops.sin(x) * x
        return y - ml.ops.sum(y, axis=1, keepdims=True) * 0.25

    return [
        ("h -> tanh(h @ W + b)", rnn_cell, (2, 4)),
        ("x -> x * 0.5 + 1.0", damped, (3,)),
        ("x -> sin(x) x - 0.25 sum(sin(x) x)", mix, (2, 5)),
    ]


def _traced_bodies():
    import mlsys_lab as ml

    with unguarded():  # tracing is off limits to the student's code, not to the check
        return [(label, fn, ml.trace(fn, np.ones(shape, np.float32)))
                for label, fn, shape in _bodies()]


def _unroll_input(seed: int, k: int, shape) -> np.ndarray:
    return np.random.default_rng([seed, k]).uniform(-2, 2, shape).astype(np.float32)


_NS = (1, 3, 5)


def _unroll_outputs_probe(unroll):
    return [graph_data(unroll(body, n)) for _, _, body in _traced_bodies() for n in _NS]


def _unroll_outputs_judge(raw, seed):
    import mlsys_lab as ml

    got = iter(expect_list(raw, len(_bodies()) * len(_NS), "unrolled graphs"))
    for k, (label, fn, shape) in enumerate(_bodies()):
        x = _unroll_input(seed, k, shape)
        for n in _NS:
            what = f"unroll({label}, {n})"
            graph = graph_from_data(next(got), what)
            if len(graph.inputs) != 1 or len(graph.outputs) != 1:
                raise AssertionError(f"{what}: the graph has {len(graph.inputs)} inputs and "
                                     f"{len(graph.outputs)} outputs; expected one of each")
            (out,) = lint_and_run(graph, [x], what)
            expected = x
            for _ in range(n):
                expected = np.asarray(fn(ml.tensor(expected)))
            if out.shape != expected.shape or not np.allclose(out, expected, rtol=1e-5,
                                                               atol=1e-6):
                raise AssertionError(f"{what}: on a random input the graph's output differs from "
                                     f"running the body {n} times")


def _unroll_fresh_probe(unroll):
    return [{"graph": graph_data(unroll(body, 3)), "body": graph_data(body)}
            for _, _, body in _traced_bodies()]


def _unroll_fresh_judge(raw):
    import mlsys_lab as ml

    for (label, fn, shape), got in zip(_bodies(), expect_list(raw, 3, "unrolled graphs"),
                                       strict=True):
        what = f"unroll({label}, 3)"
        data, body_data = got["graph"], got["body"]
        graph = graph_from_data(data, what)
        n_body = len(ml.trace(fn, np.ones(shape, np.float32)).nodes)
        if len(graph.nodes) != 3 * n_body:
            raise AssertionError(f"{what} has {len(graph.nodes)} nodes; expected 3 x {n_body} = "
                                 f"{3 * n_body} (one copy of the body per iteration)")
        if len(set(data["node_ids"])) != len(data["node_ids"]):
            raise AssertionError(f"{what} lists the same Node object more than once; create a "
                                 f"new Node for every iteration")
        shared = set(data["ids"] + data["node_ids"]) & set(body_data["ids"] +
                                                           body_data["node_ids"])
        if shared:
            raise AssertionError(f"{what} reuses Nodes or Values (inputs, constants or node "
                                 f"outputs) of the body graph; the new graph needs its own")
        values = data["values"]
        names = [values[i][0] for i in data["inputs"]]
        names += [values[i][0] for node in data["nodes"] for i in node[3]]
        names += [values[i][0] for i, arr in data["consts"] if np.ndim(from_wire(arr)) > 0]
        dup = sorted({nm for nm in names if names.count(nm) > 1})
        if dup:
            raise AssertionError(f"{what}: value names {dup[:4]} are used more than once; give "
                                 f"each iteration's values fresh names (SSA), distinct from the "
                                 f"constants' names too")
        lint_and_run(graph, [np.ones(shape, np.float32)], what)


def _unroll_keeps_body_probe(unroll, seed):
    out = []
    for k, (_, _, body) in enumerate(_traced_bodies()):
        before = graph_snapshot(body)
        result = graph_data(unroll(body, 4))
        x = _unroll_input(seed, k, body.inputs[0].shape)
        out.append([before, graph_snapshot(body), as_array(body(x)), result])
    return out


def _unroll_keeps_body_judge(raw, seed):
    import mlsys_lab as ml

    for k, ((label, fn, shape), got) in enumerate(zip(_bodies(), expect_list(raw, 3, "bodies"),
                                                      strict=True)):
        what = f"unroll({label}, 4)"
        before, after, y, result = expect_list(got, 4, what)
        y = from_wire(y)
        x = _unroll_input(seed, k, shape)
        expected = x
        for _ in range(4):
            expected = np.asarray(fn(ml.tensor(expected)))
        (out,) = lint_and_run(graph_from_data(result, what), [x], what)
        if out.shape != expected.shape or not np.allclose(out, expected, rtol=1e-5, atol=1e-6):
            raise AssertionError(f"{what}: the graph does not compute the body 4 times")
        changed = first_difference(before, after)
        if changed:
            raise AssertionError(f"unroll({label}, 4) changed the body graph ({changed}); "
                                 f"Graph(...) relinks every Value it is given, so build the new "
                                 f"graph only from fresh Values")
        expected = np.asarray(fn(ml.tensor(_unroll_input(seed, k, shape))))
        if not isinstance(y, np.ndarray) or not np.allclose(y, expected, atol=1e-6):
            raise AssertionError(f"after unroll({label}, 4) the body no longer computes the body")


register(
    Exercise(
        id="4.3",
        title="Unroll a loop into fresh nodes",
        target="unroll",
        task="the unrolling (copying the body's nodes per iteration)",
        forbidden=(
            "mlsys_lab.engine.trace",
            "mlsys_lab.engine.autodiff_graph",
            "mlsys_lab.engine.graph:Graph.copy",
            "mlsys_lab.engine.passes.rewrite:Rewriter",
            "mlsys_lab.engine.passes.rewrite:clone",
        ),
        cases=(
            Case("outputs equal n runs of the body", 2, feedback="chain the iterations",
                 probe=_unroll_outputs_probe, judge=_unroll_outputs_judge),
            Case("n copies, fresh nodes and names, lints", 2, feedback="new Nodes and Values",
                 probe=_unroll_fresh_probe, judge=_unroll_fresh_judge),
            Case("the body graph is not changed", 1, feedback="never reuse the body's Values",
                 probe=_unroll_keeps_body_probe, judge=_unroll_keeps_body_judge),
        ),
    ),
)
