"""The one Interpreter: every executor runs on it, checks inputs once, frees after the last use,
names a failing node; and every graph traversal handles a 100,000-node chain."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine import runtime, schedule
from mlsys_lab.engine.graph import Graph, Node, Value, find_cycle
from mlsys_lab.engine.interpreter import Interpreter, TensorInterpreter
from mlsys_lab.engine.random_graphs import random_graph
from mlsys_lab.engine.registry import REGISTRY, AVal, Op, register
from mlsys_lab.engine.runtime import run_graph
from mlsys_lab.engine.selection import select
from mlsys_lab.engine.tensor import apply
from mlsys_lab.errors import (
    CycleError,
    DTypeError,
    DTypeOverflowError,
    GraphError,
    OpError,
    ShapeError,
)

F32 = np.float32


def _fail(x):
    raise ZeroDivisionError("division by zero")


FAILING = Op("test_interpreter_failing", _fail, lambda x: AVal(x.shape, x.dtype))


@pytest.fixture(autouse=True, scope="module")
def registered_test_op():
    """The failing test op exists while this module runs, and only then."""
    register(FAILING, replace=True)
    yield
    REGISTRY.pop(FAILING.name, None)


def _executors():
    """Every way of running a graph node by node, each returning a list of arrays."""
    return {
        "Graph.__call__": lambda g, *a: [np.asarray(o) for o in _as_list(g(*a))],
        "run_serial": lambda g, *a: _as_list(runtime.run_serial(g, *a)[0]),
        "run_serial dfs": lambda g, *a: _as_list(runtime.run_serial(g, *a, order="dfs")[0]),
        "run_serial bfs": lambda g, *a: _as_list(runtime.run_serial(g, *a, order="bfs")[0]),
        "run_parallel": lambda g, *a: _as_list(runtime.run_parallel(g, *a, workers=3)[0]),
        "run_heterogeneous": lambda g, *a: _as_list(runtime.run_heterogeneous(g, *a)[0]),
        "run_graph": run_graph,
        "run_graph cpu-numba": lambda g, *a: run_graph(g, *a, device="cpu-numba"),
    }


def _as_list(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _two_branches(x, w):
    return ops.relu(x @ w) + ops.tanh(x), ops.sum(x * 2.0, 0)


# --- every executor is the one interpreter ------------------------------------------------------
@pytest.mark.parametrize("name", list(_executors()))
def test_every_executor_runs_each_node_once_through_the_interpreter(name, monkeypatch):
    calls = []
    real = Interpreter.call
    monkeypatch.setattr(Interpreter, "call",
                        lambda self, node, args: calls.append(node.id) or real(self, node, args))
    for seed in range(4):
        g, args = random_graph(seed, n_nodes=12)
        calls.clear()
        got = _executors()[name](g, *args)
        assert sorted(calls) == list(range(len(g.nodes)))
        want = [np.asarray(o) for o in _as_list(Interpreter(g).run(*args))]
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_run_node_is_the_one_thing_a_subclass_overrides():
    class Tracing(Interpreter):
        def run_node(self, node, args):
            self.ran = [*getattr(self, "ran", []), node.op]
            out = super().run_node(node, args)
            return out + 1 if node.op == "tanh" else out

    x, w = np.ones((2, 3), F32), np.ones((3, 3), F32)
    g = ml.trace(_two_branches, x, w)
    it = Tracing(g)
    a, b = it.run(x, w)
    assert it.ran == [n.op for n in g.nodes]
    np.testing.assert_allclose(a, np.maximum(x @ w, 0) + np.tanh(x) + 1, rtol=1e-6)
    np.testing.assert_allclose(b, (x * 2).sum(0))


def test_graph_call_goes_through_apply_so_the_tape_sees_it():
    x0, w = np.linspace(-1, 1, 6, dtype=F32).reshape(2, 3), np.ones((3, 3), F32)
    g = ml.trace(lambda x: _two_branches(x, w)[0].sum(), x0)
    assert type(TensorInterpreter(g).run(x0)[0]) is ml.Tensor
    got = ml.grad(lambda x: g(x))(x0)
    want = ml.grad(lambda x: _two_branches(x, w)[0].sum())(x0)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    inlined = ml.trace(lambda x: g(x) * 2.0, x0)  # inside a trace, the call emits nodes
    assert [n.op for n in inlined.nodes] == [n.op for n in g.nodes] + ["mul"]


# --- freeing after the last use -----------------------------------------------------------------
class _Watching(Interpreter):
    def step(self, node):
        out = super().step(node)
        self.live = [*getattr(self, "live", []), set(self.env)]
        return out


def test_each_value_is_released_after_its_last_reader():
    x, w = np.ones((2, 3), F32), np.ones((3, 3), F32)
    def f(x, w):
        ops.sin(x)  # read by nobody: released as soon as it is made
        return ops.exp(x) + ops.relu(x @ w), ops.neg(x) * 0.0 + ops.exp(x)

    g = ml.trace(f, x, w)
    assert "sin" in [n.op for n in g.nodes]
    it = _Watching(g)
    it.run(x, w)
    last = {}
    for i, n in enumerate(g.nodes):
        for v in n.inputs:
            last[v.name] = i
    outs = {v.name for v in g.outputs}
    for i, live in enumerate(it.live):
        for v in g.values():
            made = v.producer is None or v.producer.id <= i
            needed = v.name in outs or last.get(v.name, -1) > i
            assert (id(v) in live) == (made and needed), (i, v.name)
    keep = _Watching(g, free=False)
    keep.run(x, w)
    assert keep.live[-1] == {id(v) for v in g.values()}


def test_a_long_chain_keeps_only_a_few_values_alive():
    g = _chain(2_000)
    it = _Watching(g)
    it.run(np.ones(2, F32))
    assert max(map(len, it.live)) <= 3


# --- one input check, one error -----------------------------------------------------------------
@pytest.mark.parametrize("name", list(_executors()))
def test_every_executor_checks_inputs_the_same_way(name):
    run = _executors()[name]
    x, w = np.ones((2, 3), F32), np.ones((3, 3), F32)
    g = ml.trace(_two_branches, x, w)
    with pytest.raises(GraphError, match="expects 2 inputs, got 1"):
        run(g, x)
    with pytest.raises(ShapeError, match=r"input b expects f32\[3,3\], got f32\[3,2\]"):
        run(g, x, np.ones((3, 2), F32))
    with pytest.raises(DTypeError, match=r"input a expects f32\[2,3\], got f64\[2,3\]"):
        run(g, np.ones((2, 3)), w)
    with pytest.raises(DTypeError, match="input a: expected numeric data"):
        run(g, None, w)


@pytest.mark.parametrize("name", [*_executors(), "compiled"])
def test_numbers_are_weakly_typed_by_every_executor(name):
    def f(s, k):
        return s * 2.0 + ops.cast(k, F32)

    examples = np.array(1, F32), np.array(1, np.int64)
    g = ml.trace(f, *examples)
    run = _executors().get(name) or (lambda g, *a: [ml.compile(f, *examples)(*a)])
    for s, k in [(1.5, 3), (np.float64(1.5), np.int64(3)), (np.float32(1.5), True)]:
        assert float(np.asarray(run(g, s, k)[0])) == 3.0 + float(k)
    with pytest.raises(DTypeError, match=r"input b expects i64\[\], got f32\[\]"):
        run(g, 1.0, 2.5)  # refused, not truncated to 2
    with pytest.raises(DTypeOverflowError, match="input b: the value 1180591620717411303424"):
        run(g, 1.0, 2**70)


@pytest.mark.parametrize("name", list(_executors()))
def test_a_kernel_error_is_an_op_error_naming_node_op_and_line(name):
    g = ml.trace(lambda x: apply(FAILING, ops.exp(x)) + 1.0, np.ones((2, 3), F32))
    with pytest.raises(OpError) as e:
        _executors()[name](g, np.ones((2, 3), F32))
    msg = str(e.value)
    assert "test_interpreter_failing: kernel failed on inputs (float32[2, 3])" in msg
    assert "while running node #1 test_interpreter_failing\n  at test_interpreter.py:" in msg
    assert "apply(FAILING" in msg
    assert isinstance(e.value.__cause__, ZeroDivisionError)


def test_a_library_error_keeps_its_type_and_gains_the_node():
    g = ml.trace(lambda x, t: ops.cross_entropy(x * 1.0, t), np.ones((2, 3), F32),
                 np.zeros(2, np.int64))
    for run in (g, lambda *a: runtime.run_serial(g, *a), lambda *a: run_graph(g, *a)):
        with pytest.raises(OpError, match=r"(?s)\[0, 3\).*while running node #1 cross_entropy"
                                          r"\n  at test_interpreter.py:"):
            run(np.ones((2, 3), F32), np.array([0, 9]))


def test_timed_interpreter_takes_the_device_from_the_node():
    x, w = np.ones((4, 8), F32), np.ones((8, 8), F32)
    het = select(ml.trace(_two_branches, x, w), "npu")
    it = runtime.TimedInterpreter(het, device=None, worker="stream7")
    it.run(x, w)
    assert [e.device for e in it.timeline] == [n.meta.get("device", "cpu") for n in het.nodes]
    assert {e.worker for e in it.timeline} == {"stream7"} and "npu" in {e.device for e in
                                                                        it.timeline}
    assert it.timeline.check_dependencies(het)


# --- 100,000 nodes: no traversal recurses -------------------------------------------------------
def _chain(n, cyclic=False):
    """x -> neg -> neg -> ... (n nodes), built directly from Values and Nodes."""
    x = Value("x", (2,), F32)
    vals, nodes = [x], []
    for i in range(n):
        out = Value(f"v{i}", (2,), F32)
        nodes.append(Node("neg", [vals[-1]], {}, [out]))
        vals.append(out)
    if cyclic:  # the first node reads the last one's output instead of x
        nodes[0].inputs = [vals[-1]]
    return Graph([x], nodes, [vals[-1]], name="chain")


# Twenty times Python's default recursion limit (no one raises it): a recursive traversal fails.
N = 20_000


@pytest.fixture(scope="module")
def long_chain():
    return _chain(N)


def test_traversals_of_a_20k_chain(long_chain):
    g = long_chain
    assert g.lint() is g
    for strategy in ("graph", "bfs", "dfs"):
        assert runtime.topological_order(g, strategy) == g.nodes
    assert find_cycle(g.nodes) == []
    assert len(g.ancestors(N - 1)) == N - 1
    assert g.dependency(0, N - 1) == "indirect" and g.dependency(N - 2, N - 1) == "direct"
    assert schedule.kahn(range(N), schedule.graph_edges(g)) == list(range(N))


def test_a_cycle_through_20k_nodes_is_found():
    g = _chain(N, cyclic=True)
    cycle = find_cycle(g.nodes)
    assert len(cycle) == N and {n.id for n in cycle} == set(range(N))
    with pytest.raises(CycleError) as e:
        g.lint()
    assert len(e.value.cycle) == N


def test_running_a_20k_chain(long_chain):
    x = np.array([1.5, -2.0], F32)
    out, tl = runtime.run_serial(long_chain, x, order="dfs")
    np.testing.assert_array_equal(out, x)  # an even number of negations
    assert len(tl) == N
    np.testing.assert_array_equal(long_chain(x).numpy(), x)
