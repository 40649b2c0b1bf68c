"""Checks for chapter 4, the computational graph (``solutions/ch04_computational_graph.ipynb``).

4.1 Kahn's topological sort with cycle detection, 4.2 classifying dependencies between nodes of a
traced graph, 4.3 unrolling a loop body into fresh nodes, 4.4 the chain rule by hand on the book's
``X1 = XW, Y = X1 W1`` example. Random graphs are seeded, so every run checks the same cases.
"""

from __future__ import annotations

import contextlib

import numpy as np

from mlsys_lab.grading.checks import Case, Exercise, register

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
    labels = (
        "its printed text",
        "its node list",
        "a node's inputs or outputs",
        "its inputs",
        "its outputs",
        "its constants",
        "a value's name, producer or users",
    )
    for label, x, y in zip(labels, before, after, strict=True):
        if x != y:
            return label
    return ""


def outputs_of(graph, args):
    out = graph(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [np.asarray(o) for o in outs]


# ----------------------------------------------------------------------------- 4.1 topological sort


def _check_order(order, nodes, edges, what):
    if not isinstance(order, (list, tuple)):
        raise AssertionError(f"{what} returned {type(order).__name__}; return a list of nodes")
    order = list(order)
    if len(order) != len(nodes) or set(order) != set(nodes) or len(set(order)) != len(order):
        raise AssertionError(
            f"{what} returned {len(order)} entries; expected each of the {len(nodes)} nodes "
            f"exactly once"
        )
    pos = {n: i for i, n in enumerate(order)}
    for a, b in edges:
        if pos[a] > pos[b]:
            raise AssertionError(
                f"{what}: edge {a!r} -> {b!r} but {b!r} comes before {a!r} in your order"
            )


def _expect_cycle_error(topological_sort, nodes, edges, what):
    import mlsys_lab as ml

    try:
        result = topological_sort(list(nodes), list(edges))
    except (ml.CycleError, ValueError):
        return
    raise AssertionError(
        f"{what} has a cycle, but your function returned {result!r}; raise ml.CycleError "
        f"when fewer nodes than given come out of the queue"
    )


def _topo_book(topological_sort):
    nodes = ["a", "b", "c", "d", "e"]
    edges = [("a", "d"), ("b", "c"), ("c", "d"), ("d", "e")]
    order = topological_sort(list(nodes), list(edges))
    _check_order(order, nodes, edges, "the book's a..e example")
    if list(order) != ["a", "b", "c", "d", "e"]:
        raise AssertionError(
            f"the book's example gave {list(order)}; a FIFO queue seeded with the zero-in-degree "
            f"nodes in the order of `nodes` gives ['a', 'b', 'c', 'd', 'e']"
        )


def _topo_random(topological_sort):
    for seed in range(12):
        nodes, edges = random_dag(seed, n=8 + seed, labels="str" if seed % 2 else "int")
        order = topological_sort(list(nodes), list(edges))
        _check_order(order, nodes, edges, f"random DAG #{seed} ({len(nodes)} nodes)")


def _topo_isolated(topological_sort):
    nodes = ["x", "y", "z", "w"]
    edges = [("z", "x")]
    _check_order(
        topological_sort(list(nodes), list(edges)),
        nodes,
        edges,
        "nodes without edges (x, y, w) plus z -> x",
    )
    _check_order(topological_sort([], []), [], [], "the empty graph")


def _topo_cycles(topological_sort):
    _expect_cycle_error(
        topological_sort, ["a", "b", "c"], [("a", "b"), ("b", "c"), ("c", "a")], "a -> b -> c -> a"
    )
    _expect_cycle_error(
        topological_sort, ["a", "b"], [("a", "b"), ("b", "b")], "the self-loop b -> b"
    )
    for seed in range(8):
        nodes, edges = random_dag(100 + seed, n=10, p=0.35)
        rng = np.random.default_rng(seed)
        a, b = edges[int(rng.integers(len(edges)))]
        _expect_cycle_error(
            topological_sort,
            nodes,
            edges + [(b, a)],
            f"random graph #{seed} with a back edge {b} -> {a}",
        )


def _topo_keeps_input(topological_sort):
    nodes, edges = random_dag(7, n=9)
    nodes_copy, edges_copy = list(nodes), list(edges)
    topological_sort(nodes, edges)
    if nodes != nodes_copy or edges != edges_copy:
        raise AssertionError("topological_sort changed the lists it was given; work on copies")


# ----------------------------------------------------------------------------- 4.2 classify


@contextlib.contextmanager
def _no_builtin_dependency():
    """Make Graph.dependency / Graph.ancestors unavailable while the student's code runs."""
    from mlsys_lab.engine.graph import Graph

    saved = Graph.dependency, Graph.ancestors

    def refuse(*args, **kwargs):
        raise AssertionError(
            "classify used Graph.dependency/ancestors; follow node.inputs and value.producer "
            "yourself"
        )

    Graph.dependency, Graph.ancestors = refuse, refuse
    try:
        yield
    finally:
        Graph.dependency, Graph.ancestors = saved


def _classify_pairs(classify, graph, pairs, what):
    expected = [graph.dependency(a, b) for a, b in pairs]
    with _no_builtin_dependency():
        got = [classify(graph, a, b) for a, b in pairs]
    for (a, b), g, e in zip(pairs, got, expected, strict=True):
        if g != e:
            raise AssertionError(
                f"{what}: classify(graph, {a.outputs[0].name}, {b.outputs[0].name}) returned "
                f"{g!r}, expected {e!r}"
            )


def _classify_chain(classify):
    import mlsys_lab as ml

    def f(x, y):
        t = ml.ops.tanh(x)  # c
        m = t * y  # d
        s = ml.ops.sin(m)  # e
        n = ml.ops.neg(y)  # f
        return s + n  # g

    x = np.zeros(3, np.float32)
    g = ml.trace(f, x, x)
    n = {node.outputs[0].name: node for node in g.nodes}
    pairs = [
        (n["c"], n["d"]),
        (n["d"], n["c"]),
        (n["c"], n["e"]),
        (n["c"], n["f"]),
        (n["g"], n["f"]),
        (n["c"], n["g"]),
        (n["e"], n["f"]),
    ]
    _classify_pairs(classify, g, pairs, "tanh/mul/sin/neg/add example")


def _classify_random(classify):
    import mlsys_lab as ml

    for seed in range(6):
        args = random_inputs(seed)
        g = ml.trace(random_program(seed, n_ops=10), *args)
        pairs = [(a, b) for a in g.nodes for b in g.nodes if a is not b]
        _classify_pairs(classify, g, pairs, f"random traced graph #{seed}")


def _classify_all_three(classify):
    import mlsys_lab as ml

    g = ml.trace(random_program(42, n_ops=14), *random_inputs(42))
    pairs = [(a, b) for a in g.nodes for b in g.nodes if a is not b]
    with _no_builtin_dependency():
        kinds = {classify(g, a, b) for a, b in pairs[:200]}
    expected = {"direct", "indirect", "independent"}
    if kinds != expected:
        raise AssertionError(
            f"on a 14-node random graph your answers were only {sorted(kinds)}; return exactly "
            f"one of the strings 'direct', 'indirect', 'independent'"
        )


# ----------------------------------------------------------------------------- 4.3 unroll


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
        ("h -> tanh(h @ W + b)", rnn_cell, np.ones((2, 4), np.float32)),
        ("x -> x * 0.5 + 1.0", damped, np.full((3,), 8.0, np.float32)),
        ("x -> sin(x) x - 0.25 sum(sin(x) x)", mix, rng.standard_normal((2, 5)).astype(np.float32)),
    ]


def _run_unroll(unroll, body, n, what):
    from mlsys_lab.engine.graph import Graph

    graph = unroll(body, n)
    if not isinstance(graph, Graph):
        raise AssertionError(f"{what}: unroll returned {type(graph).__name__}, expected a Graph")
    return graph


def _unroll_outputs(unroll):
    import mlsys_lab as ml

    for label, fn, x in _bodies():
        body = ml.trace(fn, x)
        for n in (1, 3, 5):
            what = f"unroll({label}, {n})"
            graph = _run_unroll(unroll, body, n, what)
            expected = x
            for _ in range(n):
                expected = np.asarray(fn(ml.tensor(expected)))
            got = outputs_of(graph, [x])
            if len(got) != 1 or got[0].shape != expected.shape:
                raise AssertionError(
                    f"{what}: the graph returns {len(got)} output(s) of shape "
                    f"{[o.shape for o in got]}, expected one of {expected.shape}"
                )
            if not np.allclose(got[0], expected, rtol=1e-5, atol=1e-6):
                raise AssertionError(
                    f"{what}: output differs from running the body {n} times "
                    f"(max error {np.max(np.abs(got[0] - expected)):.3g})"
                )


def _unroll_fresh_nodes(unroll):
    import mlsys_lab as ml

    for label, fn, x in _bodies():
        body = ml.trace(fn, x)
        n = 3
        what = f"unroll({label}, {n})"
        graph = _run_unroll(unroll, body, n, what)
        if len(graph.nodes) != n * len(body.nodes):
            raise AssertionError(
                f"{what} has {len(graph.nodes)} nodes; expected {n} x "
                f"{len(body.nodes)} = {n * len(body.nodes)} (one copy per "
                f"iteration)"
            )
        if len(set(map(id, graph.nodes))) != len(graph.nodes):
            raise AssertionError(
                f"{what} lists the same Node object more than once; create a new "
                f"Node for every iteration"
            )
        body_objs = {id(v) for v in body.values()} | {id(nd) for nd in body.nodes}
        if any(id(nd) in body_objs for nd in graph.nodes) or any(
            id(v) in body_objs for v in graph.values()
        ):
            raise AssertionError(
                f"{what} reuses Nodes or Values (inputs, constants or node "
                f"outputs) of the body graph; the new graph needs its own"
            )
        names = [v.name for v in graph.inputs] + [o.name for nd in graph.nodes for o in nd.outputs]
        names += [v.name for v, arr in graph.consts.items() if np.ndim(arr) > 0]
        dup = sorted({nm for nm in names if names.count(nm) > 1})
        if dup:
            raise AssertionError(
                f"{what}: value names {dup[:4]} are used more than once; give "
                f"each iteration's values fresh names (SSA), distinct from the "
                f"constants' names too"
            )
        try:
            graph.lint()
        except Exception as error:
            raise AssertionError(
                f"{what}: graph.lint() failed: {str(error).splitlines()[0]}"
            ) from None


def _unroll_keeps_body(unroll):
    import mlsys_lab as ml

    for label, fn, x in _bodies():
        body = ml.trace(fn, x)
        before = graph_snapshot(body)
        _run_unroll(unroll, body, 4, f"unroll({label}, 4)")
        changed = first_difference(before, graph_snapshot(body))
        if changed:
            raise AssertionError(
                f"unroll({label}, 4) changed the body graph ({changed}); Graph(...) relinks every "
                f"Value it is given, so build the new graph only from fresh Values"
            )
        if not np.allclose(np.asarray(body(x)), np.asarray(fn(ml.tensor(x))), atol=1e-6):
            raise AssertionError(f"after unroll({label}, 4) the body no longer computes the body")


# ----------------------------------------------------------------------------- 4.4 chain rule


def _chain_reference(X, W, W1, label):
    X1 = X @ W
    Y = X1 @ W1
    d = Y - label
    return X.T @ (d @ W1.T), X1.T @ d


def _chain_problems():
    out = []
    for seed, (n, k, m, p) in enumerate([(4, 3, 5, 2), (6, 2, 3, 4), (1, 5, 5, 1)]):
        rng = np.random.default_rng(seed)
        out.append(
            (
                rng.standard_normal((n, k)),
                rng.standard_normal((k, m)),
                rng.standard_normal((m, p)),
                rng.standard_normal((n, p)),
            )
        )
    return out


def _chain_shapes(chain_rule):
    X, W, W1, label = _chain_problems()[0]
    result = chain_rule(X, W, W1, label)
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError("chain_rule should return a pair (dL_dW, dL_dW1)")
    dW, dW1 = (np.asarray(r) for r in result)
    if dW.shape != W.shape or dW1.shape != W1.shape:
        raise AssertionError(
            f"got shapes {dW.shape} and {dW1.shape}; a gradient has the shape of "
            f"its parameter: {W.shape} and {W1.shape}"
        )


def _chain_values(chain_rule):
    for i, (X, W, W1, label) in enumerate(_chain_problems()):
        dW, dW1 = (np.asarray(r, dtype=np.float64) for r in chain_rule(X, W, W1, label))
        eW, eW1 = _chain_reference(X, W, W1, label)
        shapes = f"X{X.shape}, W{W.shape}, W1{W1.shape}"
        if dW1.shape != eW1.shape or not np.allclose(dW1, eW1, rtol=1e-8, atol=1e-10):
            raise AssertionError(f"problem {i} ({shapes}): dL/dW1 is wrong; it is X1^T (Y - Label)")
        if dW.shape != eW.shape or not np.allclose(dW, eW, rtol=1e-8, atol=1e-10):
            raise AssertionError(f"problem {i} ({shapes}): dL/dW is wrong; chain through X1 = X W")


def _chain_vs_autodiff(chain_rule):
    import mlsys_lab as ml

    X, W, W1, label = _chain_problems()[1]

    def loss(W, W1):
        d = (ml.tensor(X) @ W) @ W1 - ml.tensor(label)
        return (d * d).sum() * 0.5

    gW, gW1 = ml.grad(loss, argnums=(0, 1))(W, W1)
    dW, dW1 = (np.asarray(r, dtype=np.float64) for r in chain_rule(X, W, W1, label))
    if dW.shape != W.shape or dW1.shape != W1.shape:
        raise AssertionError(
            f"got shapes {dW.shape} and {dW1.shape}, expected {W.shape} and {W1.shape}"
        )
    if not (np.allclose(dW, gW.numpy(), atol=1e-9) and np.allclose(dW1, gW1.numpy(), atol=1e-9)):
        raise AssertionError("your gradients disagree with ml.grad on L = 0.5 * sum((Y - Label)^2)")


register(
    Exercise(
        id="4.1",
        title="Kahn's topological sort",
        target="topological_sort",
        cases=(
            Case("book example a..e gives a b c d e", 1, _topo_book),
            Case("valid order on 12 random DAGs", 2, _topo_random),
            Case("isolated nodes and the empty graph", 1, _topo_isolated),
            Case("cycles raise ml.CycleError", 2, _topo_cycles),
            Case("leaves its inputs alone", 0.5, _topo_keeps_input),
        ),
    ),
    Exercise(
        id="4.2",
        title="Direct, indirect or independent",
        target="classify",
        cases=(
            Case("hand-made graph", 1, _classify_chain),
            Case("every pair in 6 random traced graphs", 2, _classify_random),
            Case("returns the three labels", 0.5, _classify_all_three),
        ),
    ),
    Exercise(
        id="4.3",
        title="Unroll a loop into fresh nodes",
        target="unroll",
        cases=(
            Case("outputs equal n runs of the body", 2, _unroll_outputs),
            Case("n copies, fresh nodes and names, lints", 2, _unroll_fresh_nodes),
            Case("the body graph is not changed", 1, _unroll_keeps_body),
        ),
    ),
    Exercise(
        id="4.4",
        title="The chain rule by hand",
        target="chain_rule",
        cases=(
            Case("gradient shapes", 0.5, _chain_shapes),
            Case("dL/dW and dL/dW1 on 3 problems", 1.5, _chain_values),
            Case("agrees with ml.grad", 1, _chain_vs_autodiff),
        ),
    ),
)
