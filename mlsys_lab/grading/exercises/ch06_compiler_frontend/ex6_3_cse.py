"""Exercise 6.3: common-subexpression elimination as a pure ``Graph -> Graph`` pass.

Wrong ideas rejected: comparing every operand by identity leaves the two `a*5` apart (each 5.0
is its own constant); keying operands before redirecting them misses chains of duplicates, and
the random graphs require the exact node count of correct CSE; ignoring attrs or treating sub as
commutative merges sum(axis=0) with sum(axis=1) or x - y with y - x (outputs change, node count
drops); merging the two dropouts' `rng_seed` nodes (same op, no inputs) fixes one mask for both;
editing the input's nodes in place fails purity. A pass that changes nothing (returns a copy)
fails every case: each also asks for the duplicates to go. The library's CSE (any route, or its
source pasted) is off limits: ``GRAPH_PASSES`` forbids the whole frontend pass module. The
reference is the library's ``passes.common_subexpression_elimination``.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, expect_list, register
from mlsys_lab.grading.exercises.ch06_compiler_frontend.common import (
    GRAPH_PASSES,
    count_ops,
    judge_pass,
    judge_pure,
    pass_result,
)
from mlsys_lab.grading.exercises.fixtures import (
    graph_from_data,
    lint_and_run,
    random_inputs,
    random_program,
)


def _book_graph():
    import mlsys_lab as ml

    def h(a, b):
        return a * 5 + a * 5 * b

    a = np.arange(8, dtype=np.float32)
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    return ml.trace(h, a, b), [a, b]


def _cse_graph(seed: int, i: int):
    """Graph #i of the random case: #0 a chain of duplicates, then random programs."""
    import mlsys_lab as ml

    if i == 0:
        def chain(x, y):
            b1, b2 = ml.ops.tanh(x) * y, ml.ops.tanh(x) * y
            return ml.ops.sin(b1) + ml.ops.sin(b2) * 2.0

        args = random_inputs(seed % 1000)
        return ml.trace(chain, *args), args
    program_seed = int(np.random.default_rng([seed, 63, i]).integers(2**31))
    args = random_inputs(program_seed % 1000)
    return ml.trace(random_program(program_seed, n_ops=14, repeat=0.4), *args), args


def _apart_graph():
    import mlsys_lab as ml

    def k(x, y):
        p = x * 2.0 + x * 3.0 + x * 2.0000002
        q = ml.ops.sum(x, axis=0, keepdims=True) + ml.ops.sum(x, axis=1, keepdims=True)
        r = x - y + (y - x)
        same = ml.ops.neg(y) * ml.ops.neg(y)  # the one common subexpression here
        return p, q + ml.ops.sum(y, axis=0, keepdims=True), r, same

    args = random_inputs(99)
    return ml.trace(k, *args), args


def _impure_graph():
    import mlsys_lab as ml

    def k(x):
        return ml.ops.dropout(x, 0.5) + ml.ops.dropout(x, 0.5) + ml.ops.tanh(x) * ml.ops.tanh(x)

    return ml.trace(k, np.ones((3, 4), np.float32))


def _cse_book_judge(raw):
    graph, args = _book_graph()
    what = "cse(trace(a*5 + a*5*b))"
    result = judge_pass(raw, graph, args, what)
    muls = [n for n in result.nodes if n.op == "mul" and n.inputs[0] is result.inputs[0]]
    if len(result.nodes) != 3 or len(muls) != 1:
        raise AssertionError(
            f"{what}: expected 3 nodes with one shared `a*5`, got {len(result.nodes)} nodes "
            f"({len(muls)} of them a*5); the two 5.0 literals are different Values with the "
            f"same value, so compare scalar constants by value"
        )


def _cse_random_probe(cse, seed):
    return [pass_result(cse, _cse_graph(seed, i)[0]) for i in range(7)]


def _cse_random_judge(raw, seed):
    from mlsys_lab.engine.passes import common_subexpression_elimination

    for i, got in enumerate(expect_list(raw, 7, "7 graphs")):
        graph, args = _cse_graph(seed, i)
        reference = common_subexpression_elimination(graph)
        what = "tanh(x)*y twice, then sin of each" if i == 0 else f"random graph #{i}"
        judge_pass(got, graph, args, f"{what} ({len(graph.nodes)} nodes)", reference, "CSE")


def _cse_apart_judge(raw):
    graph, args = _apart_graph()
    what = "x*2 vs x*3 vs x*2.0000002, sum(axis=0) vs sum(axis=1), x-y vs y-x, neg(y) twice"
    result = judge_pass(raw, graph, args, what)
    if len(result.nodes) != len(graph.nodes) - 1:
        raise AssertionError(f"{what}: only the two neg(y) are the same expression, so "
                             f"{len(graph.nodes) - 1} nodes should stay, not "
                             f"{len(result.nodes)}")


def _cse_impure_judge(raw):
    what = "dropout(x) + dropout(x) + tanh(x) * tanh(x)"
    result = graph_from_data(raw.get("graph") if isinstance(raw, dict) else raw, what)
    lint_and_run(result, [np.ones((3, 4), np.float32)], what)
    if count_ops(result, "rng_seed") != 2 or count_ops(result, "dropout") != 2:
        raise AssertionError(f"{what}: the result has {count_ops(result, 'rng_seed')} rng_seed "
                             f"and {count_ops(result, 'dropout')} dropout nodes, expected 2 of "
                             f"each: every draw of randomness is a different value (skip ops "
                             f"with get(op).impure)")
    if count_ops(result, "tanh") != 1:
        raise AssertionError(f"{what}: the two tanh(x) are one expression; keep one")


def _cse_pure_probe(cse, seed):
    return [pass_result(cse, _cse_graph(seed, 10 + i)[0]) for i in range(2)]


def _cse_pure_judge(raw, seed):
    from mlsys_lab.engine.passes import common_subexpression_elimination

    for i, got in enumerate(expect_list(raw, 2, "2 random graphs")):
        judge_pure(got, f"random graph #{i}")
        graph, args = _cse_graph(seed, 10 + i)
        judge_pass(got, graph, args, f"random graph #{i}",
                    common_subexpression_elimination(graph), "CSE")


register(
    Exercise(
        id="6.3",
        title="Common-subexpression elimination",
        target="cse",
        task="common-subexpression elimination",
        forbidden=GRAPH_PASSES,
        cases=(
            Case("book: a*5 + a*5*b shares a*5", 1.5, feedback="compare scalar literals by value",
                 probe=lambda cse: pass_result(cse, _book_graph()[0]), judge=_cse_book_judge),
            Case("duplicate chains, 6 random graphs: outputs, node count", 2.5,
                 feedback="key operands after redirecting them",
                 probe=_cse_random_probe, judge=_cse_random_judge),
            Case("different attrs/literals stay apart", 1, feedback="attrs and values matter",
                 probe=lambda cse: pass_result(cse, _apart_graph()[0]),
                 judge=_cse_apart_judge),
            Case("two dropouts stay two", 0.5, feedback="never merge impure ops",
                 probe=lambda cse: pass_result(cse, _impure_graph()), judge=_cse_impure_judge),
            Case("pure: the input graph is untouched", 1, feedback="build new Nodes",
                 probe=_cse_pure_probe, judge=_cse_pure_judge),
        ),
    ),
)
