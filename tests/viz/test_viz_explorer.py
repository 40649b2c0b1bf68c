"""The linked graph/memory explorer's data (issue 17): checked against the graph, the lifetimes
and the planners it summarises."""

import json

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import memory
from mlsys_lab.errors import ArgumentError
from mlsys_lab.viz import explorer_view as ex
from mlsys_lab.viz.stepper import live_at


def _step_graph():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w1 = rng.standard_normal((6, 5)).astype(np.float32)
    w2 = rng.standard_normal((5, 3)).astype(np.float32)
    loss = ml.trace(lambda x, w1, w2: ((ml.ops.relu(x @ w1) @ w2) ** 2).mean(), x, w1, w2)
    return ml.grad_graph(loss, wrt=(1, 2))


def test_model_matches_graph_schedule_and_plans():
    g = _step_graph()
    order = list(g.nodes)
    m = ex.explorer_model(g, order, strategies=["naive", "greedy_by_size"])
    json.dumps(m)                                            # plain data, for the front end
    ops = {n["key"]: n for n in m["nodes"] if n["kind"] == "op"}
    assert m["schedule"] == [f"n:{n.id}" for n in order] and len(ops) == len(g.nodes)
    for step in range(len(order)):                           # the same live sets as the stepper
        assert {k[2:] for k in m["live"][step]} == live_at(g, step, order)
    producer = {id(v): n for n in g.nodes for v in n.outputs}
    for n in g.nodes:
        node = ops[f"n:{n.id}"]
        assert node["inputs"] == sorted({f"n:{producer[id(v)].id}" for v in n.inputs
                                         if id(v) in producer})
        users = {f"n:{u.id}" for u in g.nodes for v in u.inputs if v in n.outputs}
        assert set(node["users"]) == users and node["step"] == order.index(n)
    recs = memory.lifetimes(g, order, include_inputs=False)
    for name in ("naive", "greedy_by_size"):
        made = memory.plan(recs, name, 64)
        planner = m["memory"]["planners"][name]
        assert planner["arena"] == made.arena_size
        by_key = {r["key"]: r for r in planner["rects"]}
        for r in recs:
            if r.size:
                rect = by_key[f"v:{r.id.name}"]
                assert (rect["offset"], rect["size"], rect["start"], rect["end"]) == \
                    (made.offsets[r.id], r.size, r.start, r.end)
                assert rect["producer"].startswith(f"{r.id.name} = ")
    assert m["memory"]["planners"]["naive"]["arena"] >= m["memory"]["lower_bound"]


def test_forward_and_backward_phases():
    g = _step_graph()
    phases = ex.phases_of(g)
    loss_ops = set()
    producer = {id(v): n for n in g.nodes for v in n.outputs}
    stack = [g.outputs[0]]
    while stack:
        n = producer.get(id(stack.pop()))
        if n is not None and n.id not in loss_ops:
            loss_ops.add(n.id)
            stack.extend(n.inputs)
    assert {i for i, p in phases.items() if p == "forward"} == loss_ops
    assert "backward" in phases.values()
    single = ml.trace(lambda a: ml.ops.sin(a) * 2, np.zeros(3, np.float32))
    assert set(ex.phases_of(single).values()) == {"forward"}


def test_keys_are_stable_between_runs():
    assert json.dumps(ex.explorer_model(_step_graph())) == \
        json.dumps(ex.explorer_model(_step_graph()))


def test_bad_arguments_are_named():
    g = _step_graph()
    with pytest.raises(ArgumentError, match="explorer_model"):
        ex.explorer_model("not a graph")
    with pytest.raises(ArgumentError, match="order"):
        ex.explorer_model(g, g.nodes[:-1])


def test_widget_bundle_has_picture_and_data():
    pytest.importorskip("anywidget")
    g = _step_graph()
    w = ex.explorer(g, strategies=["best", "naive"])
    assert isinstance(w, ex.Explorer) and w.planner == "best" and w.step == 0
    source = ex.STATIC.joinpath("explorer.js").read_text()
    assert source.rstrip().endswith("export default { render };")
    bundle = w._repr_mimebundle_()
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    assert data["image/png"] and "application/vnd.jupyter.widget-view+json" in data
    assert data[ex.MIMETYPE]["model"]["schedule"] == w.model["schedule"]
    assert "explorer" in data["text/plain"] and "Explorer(" not in data["text/plain"]
    with pytest.raises(ArgumentError, match="panes"):
        ex.Explorer(g, panes="sideways")
