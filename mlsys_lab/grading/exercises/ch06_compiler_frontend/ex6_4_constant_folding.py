"""Exercise 6.4: constant folding as a pure ``Graph -> Graph`` pass.

Wrong ideas rejected: folding only nodes whose inputs were constants from the start (no
propagation) leaves nodes that read only constants and misses the exact node count; folding a
node with any constant input changes the outputs; baking the outputs for one input into
constants fails on fresh inputs; folding `rng_seed` (a node with no inputs at all) freezes the
dropout mask; a Python float or a float64 array as a constant of a float32 value fails the
typed-constants case; a pass that folds nothing fails every case, each of which also asks for
the folding. The library's folding (any route, or its source pasted: ``GRAPH_PASSES``) and
re-tracing the graph (the tracer folds constants: ``mlsys_lab.engine.trace``) are off limits.
The reference is the library's ``passes.constant_folding``.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, expect_list, register
from mlsys_lab.grading.core.guard import unguarded
from mlsys_lab.grading.exercises.ch06_compiler_frontend.common import (
    GRAPH_PASSES,
    count_ops,
    expect_count,
    judge_pass,
    judge_pure,
    pass_result,
)
from mlsys_lab.grading.exercises.fixtures import (
    from_wire,
    graph_data,
    graph_from_data,
    lint_and_run,
    random_inputs,
    random_program,
)


def _frozen(graph_fn, seed_inputs, values):
    import mlsys_lab as ml
    from mlsys_lab.engine.random_graphs import bind_inputs

    with unguarded():  # tracing is off limits to the student's code, not to the check
        graph = ml.trace(graph_fn, *seed_inputs)
    return bind_inputs(graph, values)


def _folded_graphs(seed: int):
    """(label, graph with frozen inputs, the remaining inputs): a small one, random ones."""
    import mlsys_lab as ml

    def small(x, w):
        return x * (w * 2.0 + 1.0)

    x, w = random_inputs(5)
    rng = np.random.default_rng([seed, 64])
    w = (w + rng.standard_normal(w.shape)).astype(np.float32)
    out = [("x * (w*2 + 1), w frozen", _frozen(small, [x, w], {1: w}), [x])]
    for i in range(5):
        program_seed = int(rng.integers(2**31))
        args = random_inputs(program_seed % 1000, n_inputs=3)
        fn = random_program(program_seed, n_inputs=3, n_ops=14, repeat=0.2)
        frozen = _frozen(fn, args, {1: args[1], 2: args[2]})
        out.append((f"random graph #{i}, 2 of 3 inputs frozen", frozen, [args[0]]))

    def noisy(x, w):
        return x + ml.ops.dropout(w * 2.0, 0.5)

    out.append(("x + dropout(w*2), w frozen", _frozen(noisy, [x, w], {1: w}), [x]))
    return out


def _fold_probe(fold_constants, seed):
    return [graph_data(fold_constants(graph)) for _, graph, _ in _folded_graphs(seed)]


def _fold_small_judge(raw, seed):
    label, graph, args = _folded_graphs(seed)[0]
    result = judge_pass({"graph": expect_list(raw, 7, "folded graphs")[0]}, graph, args, label)
    if len(result.nodes) != 1:
        raise AssertionError(f"{label}: expected 1 node left (x * c), got {len(result.nodes)}")


def _fold_random_judge(raw, seed):
    from mlsys_lab.engine.passes import constant_folding

    graphs = _folded_graphs(seed)
    for (label, graph, args), data in zip(graphs[1:6], expect_list(raw, 7, "folded graphs")[1:6],
                                          strict=True):
        result = judge_pass({"graph": data}, graph, args, label)
        for n in result.nodes:
            if n.inputs and all(v in result.consts for v in n.inputs):
                raise AssertionError(f"{label}: node {n!r} reads only constants; fold it")
        expect_count(result, constant_folding(graph), label, "folding")


def _fold_impure_judge(raw, seed):
    label, graph, args = _folded_graphs(seed)[6]
    result = graph_from_data(expect_list(raw, 7, "folded graphs")[6], label)
    lint_and_run(result, args, label)
    if count_ops(result, "rng_seed") != 1 or count_ops(result, "dropout") != 1:
        raise AssertionError(f"{label}: the rng_seed and dropout nodes must stay (got "
                             f"{count_ops(result, 'rng_seed')} and "
                             f"{count_ops(result, 'dropout')}): rng_seed has no inputs but "
                             f"draws fresh randomness on every run, so it is not a constant")
    if count_ops(result, "mul") != 0:
        raise AssertionError(f"{label}: w*2 reads only constants; fold it")


def _fold_typed_judge(raw, seed):
    from mlsys_lab.engine.passes import constant_folding

    for (what, graph, args), data in zip(_folded_graphs(seed), expect_list(raw, 7, "folded graphs"),
                                         strict=True):
        if not isinstance(data, dict) or not data.get("is_graph"):
            graph_from_data(data, what)  # fails with the reason
        for k, arr in data["consts"]:
            arr = from_wire(arr)
            name, shape, dtype = data["values"][k]
            if not isinstance(arr, np.ndarray):
                raise AssertionError(f"{what}: constant {name} holds {describe(arr)}; store "
                                     f"numpy arrays in graph.consts")
            if list(arr.shape) != list(shape) or arr.dtype != np.dtype(dtype):
                raise AssertionError(f"{what}: constant {name} is declared "
                                     f"{np.dtype(dtype)}{list(shape)} but holds an array "
                                     f"{arr.dtype}{list(arr.shape)}; they must agree")
        reference = constant_folding(graph)
        if count_ops(graph, "dropout"):  # random outputs: compare the structure only
            expect_count(graph_from_data(data, what), reference, what, "folding")
        else:
            judge_pass({"graph": data}, graph, args, what, reference, "folding")


def _fold_pure_probe(fold_constants, seed):
    return [pass_result(fold_constants, graph) for _, graph, _ in _folded_graphs(seed)[:3]]


def _fold_pure_judge(raw, seed):
    from mlsys_lab.engine.passes import constant_folding

    for (label, graph, args), got in zip(_folded_graphs(seed)[:3],
                                         expect_list(raw, 3, "3 folded graphs"), strict=True):
        judge_pure(got, label)
        judge_pass(got, graph, args, label, constant_folding(graph), "folding")


register(
    Exercise(
        id="6.4",
        title="Constant folding",
        target="fold_constants",
        task="constant folding",
        forbidden=(*GRAPH_PASSES, "mlsys_lab.engine.trace", "mlsys_lab.engine.autodiff_graph"),
        cases=(
            Case("x * (w*2 + 1) folds to one node", 1, feedback="fold along chains",
                 probe=_fold_probe, judge=_fold_small_judge),
            Case("5 random frozen graphs", 2, feedback="fold every all-constant node",
                 probe=_fold_probe, judge=_fold_random_judge),
            Case("rng_seed and dropout are never folded", 0.5, feedback="skip impure ops",
                 probe=_fold_probe, judge=_fold_impure_judge),
            Case("folded constants are typed arrays", 0.5, feedback="numpy arrays, right dtype",
                 probe=_fold_probe, judge=_fold_typed_judge),
            Case("pure: the input graph is untouched", 0.5, feedback="build new Nodes",
                 probe=_fold_pure_probe, judge=_fold_pure_judge),
        ),
    ),
)
