"""Tracing, the Graph IR, static inference, dependencies, cycles, cond, interpreters."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.graph import Graph, Node, Value
from mlsys_lab.engine.runtime import run_parallel, run_serial
from mlsys_lab.engine.schedule import in_degrees, kahn
from mlsys_lab.errors import GraphError

F32 = np.float32


def test_trace_prints_like_a_jaxpr():
    def f(a, b):
        return (a + ops.sin(b) * 3).sum()

    g = ml.trace(f, np.zeros(8, F32), np.zeros(8, F32)).lint()
    assert str(g) == (
        "{ lambda ; a:f32[8] b:f32[8]. let\n"
        "    c:f32[8] = sin b\n"
        "    d:f32[8] = mul c 3.0\n"
        "    e:f32[8] = add a d\n"
        "    f:f32[] = sum[axis=(0,)] e\n"
        "  in (f,) }")
    x, y = np.arange(8, dtype=F32), np.ones(8, F32)
    np.testing.assert_allclose(float(g(x, y)), float(f(ml.tensor(x), ml.tensor(y))), rtol=1e-6)
    assert "test_graph.py" in g.nodes[0].source and "ops.sin(b)" in g.nodes[0].source
    assert [n.op for n in g.nodes[2].inputs[0].users] == ["add"]


def test_loops_unroll_into_fresh_nodes():
    def f(x):
        for _ in range(3):
            x = ops.tanh(x @ np.eye(2, dtype=F32))
        return x

    g = ml.trace(f, np.ones((1, 2), F32))
    assert [n.op for n in g.nodes] == ["matmul", "tanh"] * 3
    assert len({v.name for n in g.nodes for v in n.outputs}) == 6


def test_python_if_on_traced_value_points_to_cond():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(ml.TraceError, match="ml.ops.cond"):
        ml.trace(f, np.ones(2, F32))


def test_cond_static_has_both_branches_dynamic_only_one():
    def model(x, flag):
        return ops.cond(flag, lambda a: ops.relu(a), lambda a: ops.tanh(a), x)

    g = ml.trace(model, np.ones(3, F32), np.array(True))
    text = str(g)
    assert "cond" in text and "relu" in text and "tanh" in text
    x = np.array([-1.0, 0.5, 2.0], F32)
    np.testing.assert_allclose(g(x, np.array(False)).numpy(), np.tanh(x), rtol=1e-6)
    np.testing.assert_allclose(g(x, np.array(True)).numpy(), np.maximum(x, 0))
    xt = ml.tensor(x, requires_grad=True)
    dyn = ml.tape_to_graph(model(xt, ml.tensor(True)))
    assert [n.op for n in dyn.nodes] == ["relu"]


def test_cond_branches_must_agree():
    def bad(x, flag):
        return ops.cond(flag, lambda a: a, lambda a: a.sum(), x)

    with pytest.raises(ml.GraphError, match="different types"):
        ml.trace(bad, np.ones(3, F32), np.array(True))


def test_static_inference_names_node_and_user_line():
    w1, w2 = np.ones((4, 8), F32), np.ones((8, 2), F32)

    def mlp(x):
        h = ops.relu(x @ w1)
        return h @ w2

    g = ml.trace(mlp, np.ones((5, 4), F32))
    assert g.infer(((7, 4), "float32"))[0].shape == (7, 2)
    with pytest.raises(ml.ShapeError) as info:
        g.infer(((7, 5), "float32"))
    msg = str(info.value)
    assert "matmul" in msg and "(7, 5)" in msg and "h = ops.relu(x @ w1)" in msg


def test_trace_time_shape_error_names_user_line():
    def f(x):
        return x @ np.ones((3, 3), F32)

    with pytest.raises(ml.ShapeError, match=r"x @ np.ones\(\(3, 3\)"):
        ml.trace(f, np.ones((2, 2), F32))


def test_dependencies():
    def f(x1, w1, x2, w2):
        return ops.relu(x1 @ w1 + x2 @ w2)

    a = np.ones((2, 2), F32)
    g = ml.trace(f, a, a, a, a)
    e, f_, s, r = (n.outputs[0].name for n in g.nodes)
    assert g.dependency(e, f_) == "independent"
    assert g.dependency(e, s) == "direct"
    assert g.dependency(e, r) == "indirect"


def test_cycles_are_rejected_with_their_path():
    a = Value("a", (2,), F32)
    b, c = Value("b", (2,), F32), Value("c", (2,), F32)
    n1 = Node("add", [a, c], {}, [b])
    n2 = Node("relu", [b], {}, [c])
    with pytest.raises(ml.CycleError, match="cycle") as info:
        Graph([a], [n1, n2], [c]).lint()
    assert "#0 b = add" in str(info.value) and "#1 c = relu" in str(info.value)
    with pytest.raises(ml.CycleError, match="c -> d -> c"):
        kahn("abcd", [("a", "b"), ("b", "c"), ("c", "d"), ("d", "c")])


def test_lint_catches_ill_typed_and_non_ssa_graphs():
    a = Value("a", (2,), F32)
    b = Value("b", (3,), F32)
    with pytest.raises(ml.GraphError, match="ill-typed|declares"):
        Graph([a], [Node("relu", [a], {}, [b])], [b]).lint()
    c = Value("c", (2,), F32)
    with pytest.raises(ml.GraphError, match="defined twice"):
        Graph([a], [Node("relu", [a], {}, [c]), Node("exp", [a], {}, [c])], [c]).lint()


def test_kahn_in_degrees_from_the_book():
    edges = [("a", "d"), ("b", "c"), ("c", "d"), ("d", "e")]
    assert in_degrees("abcde", edges) == {"a": 0, "b": 0, "c": 1, "d": 2, "e": 1}
    order = kahn("abcde", edges)
    for s, d in edges:
        assert order.index(s) < order.index(d)


def test_executors_agree_and_respect_dependencies():
    rng = np.random.default_rng(1)

    def f(x1, w1, x2, w2):
        return ops.relu(x1 @ w1 + x2 @ w2)

    args = [rng.standard_normal((30, 30)).astype(F32) for _ in range(4)]
    g = ml.trace(f, *args)
    want = g(*args).numpy()
    for order in ("graph", "bfs", "dfs"):
        out, tl = run_serial(g, *args, order=order)
        np.testing.assert_allclose(out, want, rtol=1e-6)
        tl.check_dependencies(g)
    out, tl = run_parallel(g, *args, workers=2)
    np.testing.assert_allclose(out, want, rtol=1e-6)
    assert tl.check_dependencies(g) and len(tl) == len(g.nodes)


def test_graph_interpreter_reports_the_failing_node():
    def f(x, t):
        return ops.cross_entropy(x, t)

    g = ml.trace(f, np.ones((2, 3), F32), np.zeros(2, np.int64))
    with pytest.raises(ml.OpError, match="while running node #0 .*cross_entropy"):
        g(np.ones((2, 3), F32), np.array([0, 9]))


def test_to_dot_and_show_graph_never_raise(monkeypatch):
    from mlsys_lab.viz import graph_view

    g = ml.trace(lambda x, y: ops.relu(x @ y), np.ones((2, 2), F32), np.ones((2, 2), F32))
    dot = g.to_dot(highlight=[0])
    assert dot.startswith("digraph") and "matmul" in dot and "orange" in dot
    monkeypatch.setattr(graph_view.shutil, "which", lambda name: None)
    import matplotlib

    matplotlib.use("Agg")
    pic = graph_view.show_graph(g)  # the matplotlib fallback: a picture with a PNG
    assert pic.png.startswith(b"\x89PNG") and "image/png" in pic._repr_mimebundle_()


def test_grad_of_traced_function_and_trace_of_grad():
    f = lambda x: (ops.tanh(x) ** 2).sum()
    x = np.linspace(-1, 1, 5)
    g = ml.trace(ml.grad(f), x).lint()
    np.testing.assert_allclose(g(x).numpy(), np.asarray(ml.grad(f)(x)), rtol=1e-12)


# Graph.lint turns an op rule's crash on garbage attributes into a GraphError naming the node
# instead of a raw TypeError.
@pytest.mark.parametrize("attrs", [{"stride": "abc"}, {"bogus": 1}, {"stride": None}])
def test_lint_reports_garbage_attrs_as_a_graph_error(attrs):
    x = np.zeros((1, 1, 5, 5), np.float32)
    w = np.zeros((2, 1, 3, 3), np.float32)
    graph = ml.trace(lambda a, b: ml.ops.conv2d(a, b), x, w)
    node = next(n for n in graph.nodes if n.op == "conv2d")
    node.attrs = dict(node.attrs, **attrs)
    with pytest.raises(GraphError, match="conv2d"):
        graph.lint()
