"""Exercise 7.2: cancel transpose pairs.

A transpose-cancelling pass over the Graph IR, compared with the package's pass on seeded random
traced graphs.

Wrong ideas rejected: cancelling only exact inverse pairs leaves a chain of two transposes
(compose case, random graphs); composing in the wrong order (``q[p[i]]``) gives another
permutation, so the outputs change; dropping an inner transpose that another node reads breaks
that reader; editing the input graph in place or returning it fails the purity check; removing
every transpose changes the outputs.
"""

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

# ----------------------------------------------------------------------------- inputs (both sides)


def _trace(f, *shapes):
    import mlsys_lab as ml

    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return ml.trace(f, *args), args


def _pair_graph():
    import mlsys_lab as ml

    def f(x, y):
        return ml.ops.transpose(ml.ops.transpose(x, (1, 0)), (1, 0)) + y

    return _trace(f, (3, 4), (3, 4))


def _perms(seed):
    """Two permutations p, q whose compositions p∘q and q∘p differ, and neither is the identity."""
    rng = np.random.default_rng(7200 + seed)
    ndim = 3 + seed % 2
    while True:
        p, q = (tuple(int(i) for i in rng.permutation(ndim)) for _ in range(2))
        pq, qp = tuple(p[i] for i in q), tuple(q[i] for i in p)
        if pq != qp and pq != tuple(range(ndim)):
            return p, q, pq


def _compose_graph(seed):
    import mlsys_lab as ml

    p, q, _ = _perms(seed)

    def f(x):
        return ml.ops.transpose(ml.ops.transpose(x, p), q)

    return _trace(f, (2, 3, 4, 5)[: len(p)])


def _shared_graph():
    import mlsys_lab as ml

    def f(x):
        t = ml.ops.transpose(x, (1, 0))
        back = ml.ops.transpose(t, (1, 0))
        same = ml.ops.transpose(x, (0, 1))
        return t * 2.0, back + same

    return _trace(f, (3, 4))


def _random_graphs(seed):
    from mlsys_lab.engine.random_graphs import random_graph

    return [random_graph((seed % 100_000) * 25 + i, n_nodes=14) for i in range(25)]


# ----------------------------------------------------------------------------- probes


def _pass_raw(cancel, graph, args):
    """What the pass returned, as data: its type, nodes, lint verdict and outputs."""
    from mlsys_lab.engine.graph import Graph
    from mlsys_lab.engine.runtime import run_graph

    out = cancel(graph)
    raw = {"input_after": graph.pretty(), "same_object": out is graph, "type": type(out).__name__}
    if not isinstance(out, Graph):
        return raw
    lint = attempt(out.lint)
    raw["lint"] = lint if isinstance(lint, Raised) else None
    raw["nodes"] = [(n.op, tuple(n.attrs.get("axes", ())) if n.op == "transpose" else ())
                    for n in out.nodes]
    outputs = attempt(run_graph, out, *args)
    if isinstance(outputs, list):  # (shape, values) pairs: 0-d arrays keep their shape
        outputs = [(tuple(np.shape(o)), np.asarray(o).reshape(-1)) for o in outputs]
    raw["outputs"] = outputs
    return raw


def _ct_pair_probe(cancel):
    return _pass_raw(cancel, *_pair_graph())


def _ct_compose_probe(cancel, seed):
    return _pass_raw(cancel, *_compose_graph(seed))


def _ct_shared_probe(cancel):
    return _pass_raw(cancel, *_shared_graph())


def _ct_random_probe(cancel, seed):
    return [_pass_raw(cancel, g, args) for g, args in _random_graphs(seed)]


# ----------------------------------------------------------------------------- judges


def _judge_pass(raw, graph, args, what):
    """Check one pass result; return its node list [(op, axes)]."""
    from mlsys_lab.engine.runtime import run_graph

    if not isinstance(raw, dict) or "type" not in raw:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    if raw["type"] != "Graph" or "nodes" not in raw:
        raise AssertionError(f"{what}: the pass should return a Graph, got a {raw['type']}")
    if raw["input_after"] != graph.pretty():
        raise AssertionError(f"{what}: the pass modified its input graph; build a new one "
                             "(e.g. with Rewriter)")
    if raw["same_object"]:
        raise AssertionError(f"{what}: the pass returned its input graph itself; return a new "
                             "Graph (passes never share nodes between graphs)")
    if isinstance(raw["lint"], Raised):
        raise AssertionError(f"{what}: the result fails lint(): {raw['lint'].message}")
    got = raw["outputs"]
    if isinstance(got, Raised):
        raise AssertionError(f"{what}: running the new graph raised {got}")
    want = run_graph(graph, *args)
    if not isinstance(got, list) or len(got) != len(want):
        raise AssertionError(f"{what}: the graph had {len(want)} outputs, yours gives "
                             f"{describe(got)}")
    for i, (a, (shape, b)) in enumerate(zip(want, got)):
        if (shape != a.shape or not isinstance(b, np.ndarray) or b.size != a.size
                or not np.allclose(a.reshape(-1), b, rtol=1e-5, atol=1e-6, equal_nan=True)):
            raise AssertionError(f"{what}: output {i} changed (shape {a.shape} -> {shape}); "
                                 "cancelling transposes must not change results")
    return raw["nodes"]


def _n(nodes, op):
    return sum(node[0] == op for node in nodes)


def _ct_pair_judge(raw):
    what = "transpose(transpose(x, (1,0)), (1,0)) + y"
    nodes = _judge_pass(raw, *_pair_graph(), what)
    if _n(nodes, "transpose") or len(nodes) != 1:
        raise AssertionError(f"{what}: expected only the add to remain, got "
                             f"{[op for op, _ in nodes]}")


def _ct_compose_judge(raw, seed):
    p, q, pq = _perms(seed)
    what = f"transpose(transpose(x, {p}), {q})"
    nodes = _judge_pass(raw, *_compose_graph(seed), what)
    perms = [axes for op, axes in nodes if op == "transpose"]
    if len(nodes) != 1 or perms != [pq]:
        raise AssertionError(f"{what}: expected one transpose with the composed axes {pq} "
                             f"(position i reads axis p[q[i]]), got {[op for op, _ in nodes]} "
                             f"with axes {perms}")


def _ct_shared_judge(raw):
    what = "t = transpose(x) read twice, plus an identity transpose"
    nodes = _judge_pass(raw, *_shared_graph(), what)
    if _n(nodes, "transpose") != 1:
        raise AssertionError(f"{what}: expected exactly one transpose left (t, which `t * 2` still "
                             f"reads); got {_n(nodes, 'transpose')}: {[op for op, _ in nodes]}")


def _ct_random_judge(raw, seed):
    from mlsys_lab.engine.passes import cancel_transposes

    graphs = _random_graphs(seed)
    raw = expect_list(raw, len(graphs), "25 random graphs")
    for i, ((g, args), one) in enumerate(zip(graphs, raw)):
        what = f"random graph #{i} ({g.name})"
        nodes = _judge_pass(one, g, args, what)
        reference = cancel_transposes(g)
        others_before = sum(n.op != "transpose" for n in g.nodes)
        others_after = len(nodes) - _n(nodes, "transpose")
        # Rewriter.build() prunes nodes that only dropped transposes read: fewer is fine.
        others_least = sum(n.op != "transpose" for n in reference.nodes)
        if not others_least <= others_after <= others_before:
            raise AssertionError(f"{what}: {others_before} non-transpose nodes before, "
                                 f"{others_after} after; leave the other nodes alone")
        want = _n([(n.op,) for n in reference.nodes], "transpose")
        if _n(nodes, "transpose") > want:
            raise AssertionError(f"{what}: {_n(nodes, 'transpose')} transposes left, but {want} "
                                 "suffice (compose chains, drop identity permutations)")


register(
    Exercise(
        id="7.2",
        title="Cancel transpose pairs",
        target="cancel_transpose_pairs",
        task="the transpose-cancelling pass",
        forbidden=(
            "mlsys_lab.engine.passes.backend:cancel_transposes.fn",  # a Pass: guard its function
            "mlsys_lab.engine.passes.backend:layout_transform.fn",
            "mlsys_lab.engine.passes.frontend:algebraic_simplification.fn",
        ),
        cases=(
            Case("a back-and-forth pair disappears", 2, feedback="the pair composes to identity",
                 probe=_ct_pair_probe, judge=_ct_pair_judge),
            Case("a chain becomes one transpose with the composed axes", 2,
                 feedback="position i reads axis p[q[i]]",
                 probe=_ct_compose_probe, judge=_ct_compose_judge),
            Case("a transpose still read elsewhere stays; identity goes", 2,
                 feedback="keep what other nodes read", probe=_ct_shared_probe,
                 judge=_ct_shared_judge),
            Case("25 random graphs: pure, same outputs, fewest transposes", 3,
                 feedback="compose chains, drop identities, copy the rest",
                 probe=_ct_random_probe, judge=_ct_random_judge),
        ),
    ),
)
