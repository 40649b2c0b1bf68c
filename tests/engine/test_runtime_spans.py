"""The runtime's executors emit ml.Span records (issue 28 item 3): one per executed node, on lane
``device/worker``, kind the op, with the node's id; the heterogeneous executor adds the host's
launches. The timeline's makespan is the spans' own extent and the outputs do not change."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import runtime
from mlsys_lab.engine.selection import select

RNG = np.random.default_rng(7)
F32 = np.float32


def _head(x, w1, b1, w2):
    h = ml.ops.relu(x @ w1 + b1)
    return ml.ops.softmax(ml.ops.tanh(h) @ w2, axis=-1)


def _args():
    return (RNG.standard_normal((8, 6)).astype(F32), RNG.standard_normal((6, 5)).astype(F32),
            np.zeros(5, F32), RNG.standard_normal((5, 3)).astype(F32))


def _check_node_spans(timeline, graph, lanes):
    nodes = [s for s in timeline if s.node_id >= 0]
    assert all(isinstance(s, ml.Span) and s.start <= s.end for s in timeline)
    assert sorted(s.node_id for s in nodes) == [n.id for n in graph.nodes]   # each node once
    by_id = {n.id: n for n in graph.nodes}
    for s in nodes:
        n = by_id[s.node_id]
        assert (s.name, s.kind) == (f"{n.outputs[0].name}={n.op}", n.op)
        assert s.lane == f"{s.device}/{s.worker}" and s.lane in lanes
    assert timeline.makespan == max(s.end for s in timeline) - min(s.start for s in timeline)


@pytest.mark.parametrize("order", ["graph", "bfs", "dfs"])
def test_serial_run_emits_one_span_per_node_back_to_back(order):
    args = _args()
    g = ml.trace(_head, *args)
    out, tl = runtime.run_serial(g, *args, order=order)
    np.testing.assert_array_equal(out, runtime.run_graph(g, *args)[0])
    _check_node_spans(tl, g, {"cpu/worker0"})
    assert [s.node_id for s in tl] == [n.id for n in runtime.topological_order(g, order)]
    assert all(a.end <= b.start for a, b in zip(tl, tl[1:]))
    assert tl.check_dependencies(g)


def test_parallel_run_emits_spans_on_its_workers_in_dependency_order():
    args = _args()
    g = ml.trace(_head, *args)
    out, tl = runtime.run_parallel(g, *args, workers=2)
    np.testing.assert_array_equal(out, runtime.run_graph(g, *args)[0])
    _check_node_spans(tl, g, {"cpu/worker0", "cpu/worker1"})
    assert [s.start for s in tl] == sorted(s.start for s in tl)
    assert tl.check_dependencies(g)
    for lane in {s.lane for s in tl}:                     # a worker runs one node at a time
        mine = sorted((s.start, s.end) for s in tl if s.lane == lane)
        assert all(a[1] <= b[0] for a, b in zip(mine, mine[1:]))


@pytest.mark.parametrize("mode", ["split", "merged", "sunk"])
def test_heterogeneous_run_emits_node_spans_and_the_hosts_launches(mode):
    args = _args()
    het = select(ml.trace(_head, *args), "npu")
    out, tl = runtime.run_heterogeneous(het, *args, mode=mode)
    np.testing.assert_allclose(out, runtime.run_graph(het, *args)[0], atol=1e-2)
    devices = {n.meta.get("device", "cpu") for n in het.nodes}
    _check_node_spans(tl, het, {f"{d}/stream" for d in devices})
    launches = [s for s in tl if s.kind == "launch"]
    assert all(s.lane == "host/cpu" and s.device == "host" and s.node_id == -1
               for s in launches)
    want = {"sunk": 1, "split": len(runtime.partition(het)), "merged": len(het.nodes)}[mode]
    assert len(launches) == want and len(tl) == len(het.nodes) + want
    assert tl.check_dependencies(het)


def test_the_exercise_constructor_makes_a_span():
    """``Event(node, device, worker, start, end)``: what exercise 7's answer builds by hand."""
    e = runtime.Event("c=matmul", "sim", "worker1", 0.5, 1.5)
    assert e == ml.Span("sim/worker1", "c=matmul", 0.5, 1.5, "matmul",
                        {"device": "sim", "worker": "worker1", "node_id": -1})
    assert (e.device, e.worker, e.duration) == ("sim", "worker1", 1.0)
    with pytest.raises(AttributeError, match="no field or detail 'rank'"):
        getattr(e, "rank")  # noqa: B009 - the attribute lookup is what is tested
