"""Exercise 4.2: direct, indirect or independent, between two nodes of a traced graph.

Wrong ideas rejected: checking a path in one direction only fails the pairs asked both ways
round; calling two nodes that read the same input (siblings) "indirect" fails the sibling pairs;
looking only two hops back fails the 30-node chain; judging by positions in the node list fails
the random graphs, where every ordered pair is asked. `Graph.dependency` and `Graph.ancestors`
(also through a reference saved before the check) and networkx are off limits.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, expect_list, register
from mlsys_lab.grading.exercises.ch04_computational_graph.common import optional
from mlsys_lab.grading.exercises.fixtures import random_inputs, random_program


def _hand_graph():
    import mlsys_lab as ml

    def f(x, y):
        t = ml.ops.tanh(x)  # c
        m = t * y  # d
        s = ml.ops.sin(m)  # e
        n = ml.ops.neg(y)  # f
        side = ml.ops.exp(y)  # g: reads y, like f
        return s + n, side  # h = add e f

    x = np.zeros(3, np.float32)
    return ml.trace(f, x, x)


#: Node index pairs of ``_hand_graph``: direct and indirect both ways, siblings, strangers.
_HAND_PAIRS = [(0, 1), (1, 0), (0, 2), (2, 0), (0, 3), (3, 4), (4, 3), (5, 3), (0, 5), (5, 0),
               (2, 3), (1, 5), (4, 5), (2, 4)]


def _chain_graph():
    import mlsys_lab as ml

    def f(x):
        y = x
        for k in range(30):
            y = ml.ops.sin(y) if k % 2 else ml.ops.tanh(y)
        return y, ml.ops.neg(x)

    return ml.trace(f, np.zeros(3, np.float32))


_CHAIN_PAIRS = [(0, 29), (29, 0), (5, 20), (20, 5), (28, 29), (29, 28), (0, 30), (30, 15),
                (27, 29)]


def _random_graph(seed: int, i: int):
    import mlsys_lab as ml

    program_seed = int(np.random.default_rng([seed, i]).integers(2**31))
    return ml.trace(random_program(program_seed, n_ops=10), *random_inputs(i))


def _ask(classify, graph, pairs):
    nodes = list(graph.nodes)
    return [classify(graph, nodes[i], nodes[j]) for i, j in pairs]


def _all_pairs(graph):
    n = len(graph.nodes)
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def _expect_labels(got, graph, pairs, what):
    got = expect_list(got, len(pairs), what)
    nodes = graph.nodes
    for (i, j), answer in zip(pairs, got, strict=True):
        expected = graph.dependency(nodes[i], nodes[j])
        if answer != expected:
            a, b = nodes[i].outputs[0].name, nodes[j].outputs[0].name
            raise AssertionError(f"{what}: classify(graph, {a}, {b}) returned "
                                 f"{describe(answer)}, expected {expected!r}")


def _classify_hand_judge(raw):
    graph = _hand_graph()
    _expect_labels(raw, graph, _HAND_PAIRS, "tanh/mul/sin/neg/exp/add example")


def _classify_chain_judge(raw):
    graph = _chain_graph()
    _expect_labels(raw, graph, _CHAIN_PAIRS, "a chain of 30 ops beside neg(x)")


def _classify_random_probe(classify, seed):
    out = []
    for i in range(6):
        graph = _random_graph(seed, i)
        out.append(_ask(classify, graph, _all_pairs(graph)))
    return out


def _classify_random_judge(raw, seed):
    for i, got in enumerate(expect_list(raw, 6, "6 random traced graphs")):
        graph = _random_graph(seed, i)
        _expect_labels(got, graph, _all_pairs(graph), f"random traced graph #{i}")


register(
    Exercise(
        id="4.2",
        title="Direct, indirect or independent",
        target="classify",
        task="the walk over node.inputs and value.producer",
        forbidden=(
            "mlsys_lab.engine.graph:Graph.dependency",
            "mlsys_lab.engine.graph:Graph.ancestors",
            *optional("networkx.algorithms.dag", "networkx.algorithms.shortest_paths.generic",
                      "networkx.algorithms.traversal.depth_first_search",
                      "networkx.algorithms.traversal.breadth_first_search"),
        ),
        cases=(
            Case("hand-made graph: both directions, siblings", 1,
                 feedback="direct, indirect (a longer path either way) or independent",
                 probe=lambda classify: _ask(classify, _hand_graph(), _HAND_PAIRS),
                 judge=_classify_hand_judge),
            Case("every pair in 6 random traced graphs", 2, feedback="follow producers",
                 probe=_classify_random_probe, judge=_classify_random_judge),
            Case("a 30-node chain: paths of any length", 0.5, feedback="walk the whole path",
                 probe=lambda classify: _ask(classify, _chain_graph(), _CHAIN_PAIRS),
                 judge=_classify_chain_judge),
        ),
    ),
)
