"""Exercise 4.1: Kahn's topological sort, with cycle detection.

Wrong ideas rejected: a DFS (reverse postorder) or a "repeatedly take the first node in `nodes`
with in-degree 0" sort gives a valid order but not the order a FIFO queue gives, which the
queue-order case replays step by step (newly ready nodes may join the back of the queue in any
order); a LIFO stack fails the same way; returning the partial order on a cycle, or detecting
only 2-cycles, fails the cycle cases (a 3-cycle, a self-loop, a cycle with a head and a tail,
random back edges); the DAGs and their labels are drawn fresh each run, so no table of answers
fits; an answer that always raises CycleError fails because each cyclic graph is also asked
without the edge that closes its cycle, and doing nothing at all earns nothing (every case needs
a valid order). graphlib, networkx and the library's own Kahn (`schedule`), `topological_order`
and cycle finder are off limits.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    Raised,
    attempt,
    describe,
    expect_list,
    register,
)
from mlsys_lab.grading.exercises.ch04_computational_graph.common import optional

_BOOK_NODES = ["a", "b", "c", "d", "e"]
_BOOK_EDGES = [("a", "d"), ("b", "c"), ("c", "d"), ("d", "e")]


def _random_dag(seed: int, n: int, p: float = 0.3):
    """(nodes, edges) of a random DAG: nodes in a shuffled order, edges following a hidden
    topological order, so the node list itself is usually *not* a valid order."""
    rng = np.random.default_rng(seed)
    hidden = list(rng.permutation(n))
    edges = [(hidden[i], hidden[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    nodes = [int(x) for x in rng.permutation(n)]
    edges = [(int(a), int(b)) for a, b in edges]
    order = rng.permutation(len(edges))
    return nodes, [edges[i] for i in order]


def _dag(seed: int, i: int, p: float = 0.3):
    """Random DAG #i of a run: 8 + i nodes; edges and labels drawn from ``seed``."""
    rng = np.random.default_rng([seed, i])
    n = 8 + i
    nodes, edges = _random_dag(int(rng.integers(2**31)), n, p)
    names = [int(x) for x in rng.choice(1000, n, replace=False)]
    label = (lambda k: f"v{names[k]}") if i % 2 else (lambda k: names[k])
    return [label(x) for x in nodes], [(label(a), label(b)) for a, b in edges]


def _cyclic(seed: int) -> list[tuple[str, list, list, list]]:
    """(what, nodes, edges with a cycle, the same edges without the edge that closes it): fixed
    shapes, then random DAGs with a back edge (drawn from ``seed``)."""
    graphs = [
        ("a -> b -> c -> a", ["a", "b", "c"], [("a", "b"), ("b", "c")], ("c", "a")),
        ("the self-loop b -> b", ["a", "b"], [("a", "b")], ("b", "b")),
        ("h -> a -> b -> c -> a -> ..., c -> t (a cycle with a head and a tail)",
         ["t", "h", "a", "b", "c"], [("h", "a"), ("a", "b"), ("b", "c"), ("c", "t")],
         ("c", "a")),
        ("an acyclic part x -> y beside a cycle p <-> q", ["x", "y", "p", "q"],
         [("x", "y"), ("p", "q")], ("q", "p")),
    ]
    for i in range(6):
        nodes, edges = _dag(seed, 20 + i, p=0.35)
        rng = np.random.default_rng([seed, 100 + i])
        a, b = edges[int(rng.integers(len(edges)))]
        onward = [d for s, d in edges if s == b]
        back = (onward[int(rng.integers(len(onward)))], a) if onward else (b, a)
        graphs.append((f"random graph #{i} plus the edge {back[0]!r} -> {back[1]!r}", nodes,
                       edges, back))
    return [(what, nodes, edges + [back], edges) for what, nodes, edges, back in graphs]


def _check_order(order, nodes, edges, what):
    if isinstance(order, Raised):
        raise AssertionError(f"{what} has no cycle, but your function raised {order}")
    if not isinstance(order, (list, tuple)):
        raise AssertionError(f"{what}: returned {describe(order)}; return a list of nodes")
    order = list(order)
    if len(order) != len(nodes) or set(order) != set(nodes) or len(set(order)) != len(order):
        raise AssertionError(
            f"{what}: returned {len(order)} entries; expected each of the {len(nodes)} nodes "
            f"exactly once"
        )
    pos = {n: i for i, n in enumerate(order)}
    for a, b in edges:
        if pos[a] > pos[b]:
            raise AssertionError(
                f"{what}: edge {a!r} -> {b!r} but {b!r} comes before {a!r} in your order"
            )


def _check_fifo(order, nodes, edges, what):
    """Replay Kahn's FIFO queue along ``order``; successors made ready together may be queued in
    any order, everything else is fixed."""
    indegree = {n: 0 for n in nodes}
    successors = {n: [] for n in nodes}
    for a, b in edges:
        successors[a].append(b)
        indegree[b] += 1
    queue = deque({n} for n in nodes if indegree[n] == 0)
    for step, n in enumerate(order):
        front = queue[0]
        if n not in front:
            raise AssertionError(
                f"{what}: after {list(order[:step])} the front of a FIFO queue (seeded with the "
                f"zero-in-degree nodes in the order of `nodes`, newly ready nodes appended at the "
                f"back) is {', '.join(sorted(map(repr, front)))}, but your order takes {n!r}"
            )
        front.discard(n)
        if not front:
            queue.popleft()
        ready = []
        for m in successors[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                ready.append(m)
        if ready:
            queue.append(set(ready))


def _topo_book_probe(topological_sort):
    return [attempt(topological_sort, list(_BOOK_NODES), list(_BOOK_EDGES)),
            attempt(topological_sort, _BOOK_NODES[::-1], list(_BOOK_EDGES))]


def _topo_book_judge(raw):
    for order, nodes, expected in zip(expect_list(raw, 2, "the book's example"),
                                      (_BOOK_NODES, _BOOK_NODES[::-1]),
                                      (list("abcde"), list("bacde")), strict=True):
        what = f"the book's example with nodes listed {''.join(nodes)}"
        _check_order(order, nodes, _BOOK_EDGES, what)
        if list(order) != expected:
            raise AssertionError(
                f"{what} gave {list(order)}; a FIFO queue seeded with the zero-in-degree nodes "
                f"in the order of `nodes` gives {expected}"
            )


def _topo_random_probe(topological_sort, seed):
    return [attempt(topological_sort, *_dag(seed, i)) for i in range(12)]


def _topo_valid_judge(raw, seed):
    for i, order in enumerate(expect_list(raw, 12, "12 random DAGs")):
        nodes, edges = _dag(seed, i)
        _check_order(order, nodes, edges, f"random DAG #{i} ({len(nodes)} nodes)")


def _topo_fifo_judge(raw, seed):
    for i, order in enumerate(expect_list(raw, 12, "12 random DAGs")):
        nodes, edges = _dag(seed, i)
        what = f"random DAG #{i} ({len(nodes)} nodes)"
        _check_order(order, nodes, edges, what)
        _check_fifo(list(order), nodes, edges, what)


def _topo_isolated_probe(topological_sort):
    return [attempt(topological_sort, ["x", "y", "z", "w"], [("z", "x")]),
            attempt(topological_sort, [], [])]


def _topo_isolated_judge(raw):
    got = expect_list(raw, 2, "isolated nodes and the empty graph")
    _check_order(got[0], ["x", "y", "z", "w"], [("z", "x")], "nodes without edges plus z -> x")
    _check_order(got[1], [], [], "the empty graph")


def _topo_cycles_probe(topological_sort, seed):
    return [[attempt(topological_sort, list(nodes), list(cyclic)),
             attempt(topological_sort, list(nodes), list(acyclic))]
            for _, nodes, cyclic, acyclic in _cyclic(seed)]


def _topo_cycles_judge(raw, seed):
    graphs = _cyclic(seed)
    for (what, nodes, _, acyclic), got in zip(graphs, expect_list(raw, len(graphs), "cycles"),
                                              strict=True):
        with_cycle, without = expect_list(got, 2, what)
        if not (isinstance(with_cycle, Raised) and with_cycle.is_a("CycleError")
                and with_cycle.is_a("GraphError")):
            shown = (f"raised {with_cycle}" if isinstance(with_cycle, Raised)
                     else f"returned {describe(with_cycle)}")
            raise AssertionError(f"{what} has a cycle, but your function {shown}; raise "
                                 f"ml.CycleError when fewer nodes than given come out of the "
                                 f"queue")
        _check_order(without, nodes, acyclic, f"{what}, without its last edge,")


def _topo_keeps_input_probe(topological_sort, seed):
    nodes, edges = _dag(seed, 3)
    return [attempt(topological_sort, nodes, edges), nodes, edges]


def _topo_keeps_input_judge(raw, seed):
    nodes, edges = _dag(seed, 3)
    order, *after = expect_list(raw, 3, "topological_sort")
    _check_order(order, nodes, edges, f"random DAG ({len(nodes)} nodes)")
    if after != [nodes, edges]:
        raise AssertionError("topological_sort changed the lists it was given; work on copies")


register(
    Exercise(
        id="4.1",
        title="Kahn's topological sort",
        target="topological_sort",
        task="Kahn's algorithm",
        forbidden=(
            "mlsys_lab.engine.schedule",
            "mlsys_lab.engine.runtime:topological_order",
            "mlsys_lab.engine.graph:find_cycle",
            "graphlib",
            *optional("networkx.algorithms.dag", "networkx.algorithms.cycles"),
        ),
        cases=(
            Case("book example: a b c d e (b a c d e listed e..a)", 1,
                 feedback="a FIFO queue seeded in the order of `nodes`",
                 probe=_topo_book_probe, judge=_topo_book_judge),
            Case("valid order on 12 random DAGs", 1.5, feedback="every edge src -> dst in order",
                 probe=_topo_random_probe, judge=_topo_valid_judge),
            Case("the order a FIFO queue gives", 1,
                 feedback="take from the front, append newly ready nodes at the back",
                 probe=_topo_random_probe, judge=_topo_fifo_judge),
            Case("isolated nodes and the empty graph", 0.5, feedback="nodes without edges too",
                 probe=_topo_isolated_probe, judge=_topo_isolated_judge),
            Case("cycles raise ml.CycleError", 2, feedback="raise ml.CycleError on a cycle only",
                 probe=_topo_cycles_probe, judge=_topo_cycles_judge),
            Case("leaves its inputs alone", 0.5, feedback="work on copies",
                 probe=_topo_keeps_input_probe, judge=_topo_keeps_input_judge),
        ),
    ),
)
