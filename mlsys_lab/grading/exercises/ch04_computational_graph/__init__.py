"""Checks for chapter 4, the computational graph (``solutions/ch04_computational_graph.ipynb``).

4.1 Kahn's topological sort with cycle detection, 4.2 classifying dependencies between nodes of a
traced graph, 4.3 unrolling a loop body into fresh nodes, 4.4 the chain rule by hand on a
two-layer network with a tanh hidden layer (a variant the chapter does not work out).

Probes run the student's code and return plain data: orders, labels, and graphs as tables of
values and nodes (``graph_data``). Judges rebuild the inputs from the seed, compute the reference
with the library (``kahn``, ``Graph.dependency``, ``ml.grad``) and rebuild the student's graph
(``graph_from_data``) to lint and run it themselves. The graph helpers serve chapter 6 too.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from collections import deque

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, Raised, attempt, describe, register
from mlsys_lab.grading.core.guard import unguarded

# ----------------------------------------------------------------------------- forbidden sets


def optional(*specs: str) -> tuple[str, ...]:
    """The specs whose top-level package is installed (networkx is not a dependency)."""
    return tuple(s for s in specs if importlib.util.find_spec(s.split(".")[0]) is not None)


def _rule_specs() -> tuple[str, ...]:
    """Every op's VJP and JVP rule, as guard specs (``"mlsys_lab.engine.ops_math:MUL.vjp"``)."""
    from mlsys_lab.engine.registry import Op

    specs = set()
    for name in ("ops_math", "ops_shape", "ops_nn", "control", "selection"):
        module = importlib.import_module(f"mlsys_lab.engine.{name}")
        for attr, obj in vars(module).items():
            if isinstance(obj, Op):
                for rule in ("vjp", "jvp"):
                    if isinstance(getattr(obj, rule), types.FunctionType):
                        specs.add(f"mlsys_lab.engine.{name}:{attr}.{rule}")
    return tuple(sorted(specs))


#: Everything in the library that differentiates: the functional API and the tape
#: (``grad``, ``vjp``, ``jvp``, ``value_and_grad``, ``gradients``, ``hvp``, ``backward``), the
#: graph transforms (``grad_graph``, ``vjp_graph``, ``jvp_graph``), ``Tensor.backward``, every
#: op's VJP/JVP rule and the broadcasting rule ``unbroadcast``.
AUTODIFF = (
    "mlsys_lab.engine.autodiff",
    "mlsys_lab.engine.autodiff_graph",
    "mlsys_lab.engine.tensor:Tensor.backward",
    "mlsys_lab.engine.ops_math:unbroadcast",
    *_rule_specs(),
)

# ----------------------------------------------------------------------------- shared helpers


def random_dag(seed: int, n: int, p: float = 0.3, labels: str = "int"):
    """(nodes, edges) of a random DAG: nodes in a shuffled order, edges following a hidden
    topological order, so the node list itself is usually *not* a valid order."""
    rng = np.random.default_rng(seed)
    hidden = list(rng.permutation(n))
    edges = [(hidden[i], hidden[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < p]
    nodes = [int(x) for x in rng.permutation(n)]
    edges = [(int(a), int(b)) for a, b in edges]
    order = rng.permutation(len(edges))
    edges = [edges[i] for i in order]
    if labels == "str":
        name = {i: f"n{i}" for i in range(n)}
        nodes = [name[x] for x in nodes]
        edges = [(name[a], name[b]) for a, b in edges]
    return nodes, edges


def random_program(seed: int, n_inputs: int = 2, n_ops: int = 12, repeat: float = 0.3):
    """A random straight-line function of ``n_inputs`` (3, 4) tensors, for tracing.

    It mixes unary ops, binary ops with broadcasting, products with scalar literals and
    reductions with attrs; with probability ``repeat`` an op repeats an earlier one on the same
    operands (a common subexpression). It returns every value no op reads (no dead code).
    """
    import mlsys_lab as ml

    def program(*xs):
        rng = np.random.default_rng(seed)
        vals, used, history = list(xs), set(), []
        for _ in range(n_ops):
            if history and rng.random() < repeat:
                kind, args = history[int(rng.integers(len(history)))]
            else:
                r = rng.random()
                pick = lambda: int(rng.integers(len(vals)))  # noqa: E731
                if r < 0.25:
                    kind, args = str(rng.choice(["tanh", "sin", "neg"])), (pick(),)
                elif r < 0.7:
                    kind, args = str(rng.choice(["add", "mul", "sub"])), (pick(), pick())
                elif r < 0.85:
                    kind, args = "scale", (pick(), float(rng.choice([2.0, 3.0])))
                else:
                    kind, args = "sum", (pick(), int(rng.integers(2)))
            history.append((kind, args))
            x = vals[args[0]]
            used.add(args[0])
            if kind in ("tanh", "sin", "neg"):
                out = getattr(ml.ops, kind)(x)
            elif kind in ("add", "mul", "sub"):
                used.add(args[1])
                out = getattr(ml.ops, kind)(x, vals[args[1]])
            elif kind == "scale":
                out = x * args[1]
            else:
                out = ml.ops.sum(x, axis=args[1], keepdims=True)
            vals.append(out)
        sinks = [v for i, v in enumerate(vals) if i >= len(xs) and i not in used]
        return tuple(sinks) if len(sinks) > 1 else sinks[0]

    program.__name__ = f"program{seed}"
    return program


def random_inputs(seed: int, n_inputs: int = 2, dtype=np.float32):
    """``n_inputs`` random (3, 4) arrays drawn from ``seed``."""
    rng = np.random.default_rng(seed + 1000)
    return [rng.standard_normal((3, 4)).astype(dtype) for _ in range(n_inputs)]


def graph_snapshot(graph):
    """Everything a pass could change in place: text, node list, links of every value."""
    values = graph.values()
    return (
        str(graph),
        [id(n) for n in graph.nodes],
        [(id(n), [id(v) for v in n.inputs], [id(v) for v in n.outputs]) for n in graph.nodes],
        [id(v) for v in graph.inputs],
        [id(v) for v in graph.outputs],
        [id(v) for v in graph.consts],
        [(id(v), v.name, id(v.producer), [id(u) for u in v.users]) for v in values],
    )


def first_difference(before, after) -> str:
    """What differs between two ``graph_snapshot``s, in words ('' when nothing does)."""
    labels = (
        "its printed text",
        "its node list",
        "a node's inputs or outputs",
        "its inputs",
        "its outputs",
        "its constants",
        "a value's name, producer or users",
    )
    if not isinstance(before, (list, tuple)) or not isinstance(after, (list, tuple)):
        return "its structure"
    for label, x, y in zip(labels, before, after, strict=False):
        if x != y:
            return label
    return "" if len(before) == len(after) else "its structure"


def outputs_of(graph, args):
    """The graph's outputs on ``args`` as a list of numpy arrays."""
    out = graph(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [np.asarray(o) for o in outs]


def graph_data(graph) -> dict:
    """A graph as plain data for the wire: a table of its values and its nodes over their indices.

    Values are numbered by identity, so one Value object used twice stays one entry and two
    objects with one name stay two; ``graph_from_data`` rebuilds exactly that structure.
    ``ids`` and ``node_ids`` carry the objects' identities, to compare with another graph's.
    """
    from mlsys_lab.engine.graph import Graph

    data = {"type": type(graph).__name__, "is_graph": isinstance(graph, Graph)}
    if not data["is_graph"]:
        return data
    index: dict[int, int] = {}
    values: list = []

    def ref(v) -> int:
        if id(v) not in index:
            index[id(v)] = len(values)
            values.append(v)
        return index[id(v)]

    inputs = [ref(v) for v in graph.inputs]
    consts = [[ref(v), to_wire(arr)] for v, arr in graph.consts.items()]
    nodes = [[n.op, [ref(v) for v in n.inputs], dict(n.attrs), [ref(o) for o in n.outputs],
              str(n.source or "")] for n in graph.nodes]
    outputs = [ref(v) for v in graph.outputs]
    data.update(
        values=[[str(v.name), [int(s) for s in v.shape], np.dtype(v.dtype).str] for v in values],
        inputs=inputs, consts=consts, nodes=nodes, outputs=outputs,
        ids=[id(v) for v in values], node_ids=[id(n) for n in graph.nodes],
    )
    return data


def graph_from_data(data, what: str):
    """Rebuild a real ``Graph`` from ``graph_data`` (in the judge), or fail with a message."""
    from mlsys_lab.engine.graph import Graph, Node, Value

    if not isinstance(data, dict) or not data.get("is_graph"):
        got = data.get("type") if isinstance(data, dict) else describe(data)
        raise AssertionError(f"{what} returned a {got}, expected a new Graph")
    try:
        values = [Value(name, shape, dtype) for name, shape, dtype in data["values"]]
        consts = {}
        for i, arr in data["consts"]:
            arr = from_wire(arr)
            if not isinstance(arr, (np.ndarray, np.generic)):
                raise AssertionError(f"{what}: constant {values[i].name} holds {describe(arr)}; "
                                     f"graph.consts maps each constant Value to a numpy array")
            consts[values[i]] = np.asarray(arr)
        nodes = [Node(op, [values[i] for i in ins], attrs, [values[i] for i in outs], source)
                 for op, ins, attrs, outs, source in data["nodes"]]
        return Graph([values[i] for i in data["inputs"]], nodes,
                     [values[i] for i in data["outputs"]], consts, name="result")
    except AssertionError:
        raise
    except Exception as error:
        raise AssertionError(f"{what}: the returned graph is malformed ({type(error).__name__}: "
                             f"{error})") from None


def lint_and_run(graph, args, what: str) -> list[np.ndarray]:
    """Lint a rebuilt graph and run it on ``args``, failing with the first line of any error."""
    try:
        graph.lint()
    except Exception as error:
        raise AssertionError(f"{what}: lint() failed: {str(error).splitlines()[0]}") from None
    try:
        return outputs_of(graph, args)
    except Exception as error:
        raise AssertionError(f"{what}: running the graph failed: "
                             f"{type(error).__name__}: {str(error).splitlines()[0]}") from None


_ZERO_D = "0-d array"


def to_wire(x):
    """``x`` ready for the wire: a 0-d array travels as ``{"0-d array": <its 1-element copy>}``
    (the wire's encoder would flatten it to shape (1,)); anything else unchanged."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return {_ZERO_D: x.reshape(1)}
    return x


def from_wire(x):
    """The inverse of ``to_wire``, for judges."""
    if isinstance(x, dict) and set(x) == {_ZERO_D}:
        inner = x[_ZERO_D]
        if isinstance(inner, np.ndarray) and inner.shape == (1,):
            return inner.reshape(())
    return x


def as_array(x):
    """A student's array-like result as a numpy array, ready for the wire (see ``to_wire``);
    anything else unchanged. For probes."""
    if isinstance(x, (int, float, np.generic, np.ndarray)) and not isinstance(x, bool):
        return to_wire(np.asarray(x))
    if hasattr(x, "__array__"):
        return to_wire(np.asarray(x))
    return x


def results(raw, count: int, what: str) -> list:
    """``raw`` as a list of ``count`` probe results, or fail."""
    if not isinstance(raw, list) or len(raw) != count:
        raise AssertionError(f"{what}: expected {count} results, got {describe(raw)}")
    return raw


# ----------------------------------------------------------------------------- 4.1 topological sort
# A wrong idea that still produces plausible output would fail because: a DFS (reverse postorder)
# or a "repeatedly take the first node in `nodes` with in-degree 0" sort gives a valid order but
# not the order a FIFO queue gives, which the queue-order case replays step by step (newly ready
# nodes may join the back of the queue in any order); a LIFO stack fails the same way; returning
# the partial order on a cycle, or detecting only 2-cycles, fails the cycle cases (a 3-cycle, a
# self-loop, a cycle with a head and a tail, random back edges); the DAGs and their labels are
# drawn fresh each run, so no table of answers fits; an answer that always raises CycleError fails
# because each cyclic graph is also asked without the edge that closes its cycle, and doing
# nothing at all earns nothing (every case needs a valid order). graphlib, networkx and the
# library's own Kahn (`schedule`), `topological_order` and cycle finder are off limits.

_BOOK_NODES = ["a", "b", "c", "d", "e"]
_BOOK_EDGES = [("a", "d"), ("b", "c"), ("c", "d"), ("d", "e")]


def _dag(seed: int, i: int, p: float = 0.3):
    """Random DAG #i of a run: 8 + i nodes; edges and labels drawn from ``seed``."""
    rng = np.random.default_rng([seed, i])
    n = 8 + i
    nodes, edges = random_dag(int(rng.integers(2**31)), n, p)
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
    for order, nodes, expected in zip(results(raw, 2, "the book's example"),
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
    for i, order in enumerate(results(raw, 12, "12 random DAGs")):
        nodes, edges = _dag(seed, i)
        _check_order(order, nodes, edges, f"random DAG #{i} ({len(nodes)} nodes)")


def _topo_fifo_judge(raw, seed):
    for i, order in enumerate(results(raw, 12, "12 random DAGs")):
        nodes, edges = _dag(seed, i)
        what = f"random DAG #{i} ({len(nodes)} nodes)"
        _check_order(order, nodes, edges, what)
        _check_fifo(list(order), nodes, edges, what)


def _topo_isolated_probe(topological_sort):
    return [attempt(topological_sort, ["x", "y", "z", "w"], [("z", "x")]),
            attempt(topological_sort, [], [])]


def _topo_isolated_judge(raw):
    got = results(raw, 2, "isolated nodes and the empty graph")
    _check_order(got[0], ["x", "y", "z", "w"], [("z", "x")], "nodes without edges plus z -> x")
    _check_order(got[1], [], [], "the empty graph")


def _topo_cycles_probe(topological_sort, seed):
    return [[attempt(topological_sort, list(nodes), list(cyclic)),
             attempt(topological_sort, list(nodes), list(acyclic))]
            for _, nodes, cyclic, acyclic in _cyclic(seed)]


def _topo_cycles_judge(raw, seed):
    graphs = _cyclic(seed)
    for (what, nodes, _, acyclic), got in zip(graphs, results(raw, len(graphs), "cycles"),
                                              strict=True):
        with_cycle, without = results(got, 2, what)
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
    order, *after = results(raw, 3, "topological_sort")
    _check_order(order, nodes, edges, f"random DAG ({len(nodes)} nodes)")
    if after != [nodes, edges]:
        raise AssertionError("topological_sort changed the lists it was given; work on copies")


# ----------------------------------------------------------------------------- 4.2 classify
# A wrong idea that still produces plausible output would fail because: checking a path in one
# direction only fails the pairs asked both ways round; calling two nodes that read the same
# input (siblings) "indirect" fails the sibling pairs; looking only two hops back fails the
# 30-node chain; judging by positions in the node list fails the random graphs, where every
# ordered pair is asked. `Graph.dependency` and `Graph.ancestors` (also through a reference saved
# before the check) and networkx are off limits.


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
    got = results(got, len(pairs), what)
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
    for i, got in enumerate(results(raw, 6, "6 random traced graphs")):
        graph = _random_graph(seed, i)
        _expect_labels(got, graph, _all_pairs(graph), f"random traced graph #{i}")


# ----------------------------------------------------------------------------- 4.3 unroll
# A wrong idea that still produces plausible output would fail because: listing the body's Node
# objects n times, or reusing its Values or constants, fails the fresh-objects case and changes
# the body (Graph(...) relinks the values it gets); copying nodes with the body's names fails SSA
# names; wiring every iteration to the original input, or unrolling n - 1 times, fails the
# outputs on n = 3 and 5; a graph of one constant holding the answer for the example input fails
# because the judge runs the graph on fresh inputs; returning nothing fails every case (each one
# runs the returned graph). `ml.trace` (which would unroll the loop for
# you), `Graph.copy`, the passes' Rewriter/clone and the autodiff transforms are off limits.


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

    got = iter(results(raw, len(_bodies()) * len(_NS), "unrolled graphs"))
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

    for (label, fn, shape), got in zip(_bodies(), results(raw, 3, "unrolled graphs"),
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

    for k, ((label, fn, shape), got) in enumerate(zip(_bodies(), results(raw, 3, "bodies"),
                                                      strict=True)):
        what = f"unroll({label}, 4)"
        before, after, y, result = results(got, 4, what)
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


# ----------------------------------------------------------------------------- 4.4 chain rule
# A wrong idea that still produces plausible output would fail because: the chapter's linear
# formulas (no tanh), or forgetting the factor 1 - H^2, give wrong values; applying tanh' to H
# instead of X1, or a transpose in the wrong place, gives wrong values or shapes (every problem is
# non-square); the mean instead of the sum in the loss is off by a constant; finite differences
# are off by more than the 1e-11 relative tolerance (one problem has labels of size 1000). Every
# differentiating function of the library is off limits: `ml.grad`, `vjp`, `jvp`,
# `value_and_grad`, `grad_graph`, the tape's `backward` and the ops' own VJP/JVP rules.

_CHAIN_SHAPES = ((4, 3, 5, 2), (6, 2, 3, 4), (1, 5, 5, 1), (5, 4, 6, 3))


def _chain_problem(seed: int, i: int):
    """(X, W, W1, label) of problem #i: fixed shapes, values drawn from ``seed``."""
    n, k, m, p = _CHAIN_SHAPES[i]
    rng = np.random.default_rng([seed, i])
    X = rng.standard_normal((n, k))
    W = rng.standard_normal((k, m)) * 0.7
    W1 = rng.standard_normal((m, p))
    label = rng.standard_normal((n, p)) * (1000.0 if i == 3 else 1.0)
    return X, W, W1, label


def _chain_reference(X, W, W1, label):
    """(dL/dW, dL/dW1) from the library's reverse mode (the judge's reference)."""
    import mlsys_lab as ml

    def loss(W, W1):
        d = ml.ops.tanh(ml.tensor(X) @ W) @ W1 - ml.tensor(label)
        return (d * d).sum() * 0.5

    gW, gW1 = ml.grad(loss, argnums=(0, 1))(W, W1)
    return gW.numpy(), gW1.numpy()


def _chain_probe(chain_rule, seed):
    out = []
    for i in range(len(_CHAIN_SHAPES)):
        result = chain_rule(*_chain_problem(seed, i))
        out.append([as_array(r) for r in result] if isinstance(result, (tuple, list))
                   else as_array(result))
    return out


def _chain_pair(got, i):
    X, W, W1, _ = _chain_problem(0, i)
    what = f"problem {i} (X{X.shape}, W{W.shape}, W1{W1.shape})"
    if not isinstance(got, list) or len(got) != 2:
        raise AssertionError(f"{what}: chain_rule should return a pair (dL_dW, dL_dW1), got "
                             f"{describe(got)}")
    got = [from_wire(r) for r in got]
    for r, name in zip(got, ("dL_dW", "dL_dW1"), strict=True):
        if not isinstance(r, np.ndarray):
            raise AssertionError(f"{what}: {name} is {describe(r)}, not a numpy array")
    return what, got


def _chain_close(got, expected, what, hint):
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: shape {got.shape}, expected {expected.shape}")
    scale = max(float(np.max(np.abs(expected))), 1e-300)
    err = float(np.max(np.abs(got.astype(np.float64) - expected)))
    if not err <= 1e-11 * scale:
        raise AssertionError(f"{what} is off by up to {err:.3g} (relative {err / scale:.2g}); "
                             f"{hint}")


def _chain_judge(index: int, name: str, hint: str):
    def judge(raw, seed):
        for i, got in enumerate(results(raw, len(_CHAIN_SHAPES), "chain_rule")):
            what, pair = _chain_pair(got, i)
            problem = _chain_problem(seed, i)
            for r, p, label in zip(pair, problem[1:3], ("dL_dW", "dL_dW1"), strict=True):
                if r.shape != p.shape:
                    raise AssertionError(f"{what}: {label} has shape {r.shape}; a gradient has "
                                         f"the shape of its parameter, {p.shape}")
            expected = _chain_reference(*problem)
            _chain_close(pair[index], expected[index], f"{what}: {name}", hint)

    return judge


# ----------------------------------------------------------------------------- registration

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
    Exercise(
        id="4.4",
        title="The chain rule by hand",
        target="chain_rule",
        task="the backward pass (the chain rule)",
        forbidden=AUTODIFF,
        cases=(
            Case("dL/dW1 on 4 problems", 1, feedback="dL/dW1 = H^T (Y - Label)",
                 probe=_chain_probe,
                 judge=_chain_judge(1, "dL/dW1", "dL/dW1 = H^T (Y - Label) with H = tanh(X W)")),
            Case("dL/dW through tanh on 4 problems", 2,
                 feedback="dL/dW = X^T ((dY W1^T) * (1 - H^2))",
                 probe=_chain_probe,
                 judge=_chain_judge(0, "dL/dW", "chain through H = tanh(X1): dL/dX1 = "
                                                "((Y - Label) W1^T) * (1 - H^2), dL/dW = "
                                                "X^T dL/dX1")),
        ),
    ),
)
