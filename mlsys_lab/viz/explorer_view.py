"""Linked graph and memory explorers: the two things this package exists to show, side by side.

:func:`explorer_model` turns a scheduled graph into plain data (a layout of its values and ops,
the schedule, the tensors live at every step, and one memory plan per planner, each tensor with
its producer and last reader). :class:`Explorer` is an anywidget whose JavaScript
(``static/explorer.js``, shipped in this package: nothing is fetched from a CDN) draws it:

* the graph pane: pan (drag) and zoom (wheel); click an op to see its inputs (red), its users
  (blue) and the tensors alive at its step (green); a schedule slider walks the steps; forward
  ops are tinted blue, backward (gradient) ops purple;
* the memory pane: time x address rectangles for the chosen planner (a picker), a line at the
  current step; hovering a rectangle names the tensor, its size, producer and last reader, and the
  graph pane highlights the same value.

Everything interactive runs in the browser from that data, so the same view works in JupyterLab
(with a kernel: ``step``, ``selected`` and ``planner`` are synced traitlets) and in the offline
HTML export (``mlsys-lab export``), without a kernel. Its display bundle also holds a PNG (the
graph at the current step beside the memory chart), which is what GitHub and an untrusted
notebook show.
"""

from __future__ import annotations

import json

from ..engine import memory
from ..engine.graph import Graph
from ..errors import ArgumentError
from .graph_view import _layout, display_name, has_dot
from .picture import Picture, figure_picture
from .view_widget import STATIC, ViewWidget, traitlets

__all__ = ["MIMETYPE", "STATIC", "Explorer", "explorer", "explorer_model", "graph_explorer",
           "memory_explorer", "phases_of", "static_picture"]

MIMETYPE = "application/vnd.mlsys-lab.explorer+json"  # the data, for the offline export
PANES = ("graph", "memory", "both")


def _key(kind, obj):
    """A node's or value's key in the explorer's data: stable from run to run."""
    return f"n:{obj.id}" if kind == "n" else f"v:{obj.name}"


def phases_of(graph) -> dict:
    """``node.id -> "forward" | "backward"``.

    With several outputs whose first is the loss (as ``grad_graph`` and training steps build
    them), the forward ops are those the first output depends on and the rest are backward
    (gradient) ops. A graph with one output is all forward."""
    if len(graph.outputs) < 2:
        return {n.id: "forward" for n in graph.nodes}
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    forward, stack = set(), [graph.outputs[0]]
    while stack:
        n = producer.get(id(stack.pop()))
        if n is not None and n.id not in forward:
            forward.add(n.id)
            stack.extend(n.inputs)
    return {n.id: "forward" if n.id in forward else "backward" for n in graph.nodes}


def _dot_layout(graph, rankdir):
    """Positions (points, y down) and sizes from Graphviz, keyed ("n", node.id) and
    ("v", id(value)); or None."""
    if not has_dot():
        return None
    try:
        import graphviz

        data = json.loads(graphviz.Source(graph.to_dot(rankdir=rankdir)).pipe(format="json0"))
    except Exception:
        return None
    height = float(data["bb"].split(",")[3])
    place = {}
    for obj in data.get("objects", []):
        if "pos" not in obj:
            continue
        kind, _, ident = obj["name"].partition("_")
        x, y = map(float, obj["pos"].split(","))
        place[(kind, int(ident))] = (x, height - y, float(obj["width"]) * 72,
                                     float(obj["height"]) * 72)
    return place


def explorer_model(graph, order=None, strategies=None, alignment=64, rankdir="TB",
                   phases=None) -> dict:
    """The explorer's data for ``graph`` scheduled in ``order`` (default ``graph.nodes``).

    Returns a JSON-able dict: ``title``; ``nodes`` (``key``, ``kind`` "op"/"value", ``label``,
    ``x``, ``y``, ``w``, ``h``, ``role``, ops also ``step``, ``phase``, ``inputs``/``users`` (op
    keys) and ``values_in``/``values_out`` (value keys)); ``edges`` (``[from, to]`` keys);
    ``schedule`` (op keys in order); ``live`` (per step, the value keys alive then); ``memory``
    (``steps``, ``lower_bound``, ``naive``, and per planner its ``arena`` and ``rects``: value
    key, name, start, end, offset, size, producer, last reader).
    """
    if not isinstance(graph, Graph):
        raise ArgumentError(f"explorer_model: expects a Graph, got {type(graph).__name__}")
    order = list(graph.nodes if order is None else order)
    if sorted(n.id for n in order) != sorted(n.id for n in graph.nodes):
        raise ArgumentError("explorer_model: order must hold each node of the graph once")
    step_of = {n.id: i for i, n in enumerate(order)}
    phase = phases or phases_of(graph)
    outs, ins = set(map(id, graph.outputs)), set(map(id, graph.inputs))
    producer = {id(v): n for n in graph.nodes for v in n.outputs}
    users = {}
    for n in graph.nodes:
        for v in n.inputs:
            users.setdefault(id(v), []).append(n)
    values = list(graph.inputs) + [v for v in graph.consts if graph.consts[v].ndim] + \
        [v for n in graph.nodes for v in n.outputs]
    drawn = {id(v) for v in values}
    place = _dot_layout(graph, rankdir)
    if place is None:  # the matplotlib fallback's layered layout, in points
        pos, _, _ = _layout(graph)
        place = {}
        for key, (x, y) in pos.items():
            px, py = (x * 120 + 60, -y * 60 + 30) if rankdir != "LR" else (-y * 120 + 60,
                                                                            x * 60 + 30)
            place[key] = (px, py, 96.0, 40.0)
    nodes = []
    for v in values:
        key = _key("v", v)
        x, y, w, h = place.get(("v", id(v)), (0.0, 0.0, 90.0, 40.0))
        role = "output" if id(v) in outs else "input" if id(v) in ins else \
            "const" if v in graph.consts else "intermediate"
        nodes.append({"key": key, "kind": "value", "label": f"{v.name}\n{v.type_str()}",
                      "name": v.name, "x": x, "y": y, "w": w, "h": h, "role": role})
    edges = []
    for n in graph.nodes:
        key = _key("n", n)
        x, y, w, h = place.get(("n", n.id), (0.0, 0.0, 90.0, 30.0))
        before = [producer[id(v)] for v in n.inputs if id(v) in producer]
        after = [u for v in n.outputs for u in users.get(id(v), [])]
        nodes.append({"key": key, "kind": "op", "label": n.op, "name": f"{n.output.name} = {n.op}",
                      "x": x, "y": y, "w": w, "h": h, "role": "op", "step": step_of[n.id],
                      "phase": phase.get(n.id, "forward"),
                      "inputs": sorted({_key("n", p) for p in before}),
                      "users": sorted({_key("n", u) for u in after}),
                      "values_in": [_key("v", v) for v in n.inputs if id(v) in drawn],
                      "values_out": [_key("v", v) for v in n.outputs]})
        for v in n.inputs:
            if id(v) in drawn:
                edges.append([_key("v", v), key])
        for v in n.outputs:
            edges.append([key, _key("v", v)])
    recs = memory.lifetimes(graph, order, include_inputs=False)
    live = [[_key("v", r.id) for r in recs if r.start <= s <= r.end] for s in range(len(order))]
    names = list(strategies or ["best", *memory.STRATEGIES])
    planners = {}
    for name in names:
        made = memory.plan(recs, name, alignment)
        rects = []
        for r in recs:
            if r.size <= 0:
                continue
            made_by = producer.get(id(r.id))
            last = order[min(r.end, len(order) - 1)]
            if id(r.id) in outs:
                reader = "graph output"
            elif made_by is not None and last.id == made_by.id:
                reader = "(unused)"
            else:
                reader = f"{last.output.name} = {last.op}"
            rects.append({"key": _key("v", r.id), "name": r.id.name, "start": r.start,
                          "end": r.end, "offset": int(made.offsets[r.id]), "size": int(r.size),
                          "producer": f"{made_by.output.name} = {made_by.op}" if made_by else "",
                          "reader": reader})
        planners[name] = {"arena": int(made.arena_size), "rects": rects}
    return {
        "title": display_name(graph), "nodes": nodes, "edges": edges,
        "schedule": [_key("n", n) for n in order], "live": live,
        "memory": {"steps": len(order), "lower_bound": int(memory.lower_bound(recs, alignment)),
                   "naive": int(memory.naive_size(recs, alignment)), "planners": planners},
    }


def static_picture(graph, order, step, planner, panes, strategies=None) -> Picture:
    """The still picture of an explorer's state: the graph at ``step`` and/or the chosen plan."""
    import matplotlib.pyplot as plt

    from .graph_view import draw_matplotlib, render_png, render_svg
    from .memory_view import plot_lifetimes
    from .stepper import live_at

    order = list(graph.nodes if order is None else order)
    node = order[step]
    live = live_at(graph, step, order)
    alt = (f"{panes} explorer of {display_name(graph)} ({len(order)} steps; the picture shows "
           f"step {step}, {node.output.name} = {node.op}, and the {planner!r} plan; run the cell "
           "to explore)")
    recs = memory.lifetimes(graph, order, include_inputs=False)
    if panes == "graph":
        dot = graph.to_dot(highlight=[node.id], live=live)
        png, svg = render_png(dot), render_svg(dot)
        if png is not None:
            return Picture(png, svg, alt)
        return figure_picture(draw_matplotlib(graph, highlight=[node.id], live=live), alt)
    if panes == "memory":
        return figure_picture(plot_lifetimes(recs, memory.plan(recs, planner)), alt)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 6), width_ratios=[1, 1.3])
    draw_matplotlib(graph, highlight=[node.id], live=live, ax=left)
    plot_lifetimes(recs, memory.plan(recs, planner), ax=right)
    right.axvline(step + 0.5, color="black", linewidth=1)
    return figure_picture(fig, alt)


if ViewWidget is None:
    Explorer = None
else:
    class Explorer(ViewWidget):
        """The linked graph/memory explorer (see the module's docstring). Synced state:
        ``step`` (schedule position), ``selected`` (a node or value key, "" for none),
        ``planner`` (the memory plan shown), ``panes`` ("graph", "memory" or "both")."""

        MIMETYPE = MIMETYPE
        _esm = STATIC / "explorer.js"
        _css = STATIC / "explorer.css"
        model = traitlets.Dict().tag(sync=True)
        step = traitlets.Int(0).tag(sync=True)
        selected = traitlets.Unicode("").tag(sync=True)
        planner = traitlets.Unicode("best").tag(sync=True)
        panes = traitlets.Unicode("both").tag(sync=True)

        def __init__(self, graph, order=None, strategies=None, panes="both", **kwargs):
            if panes not in PANES:
                raise ArgumentError(f"Explorer: panes must be one of {PANES}, got {panes!r}")
            self._graph, self._order = graph, list(graph.nodes if order is None else order)
            self._strategies = strategies
            data = explorer_model(graph, self._order, strategies)
            first = next(iter(data["memory"]["planners"]))
            super().__init__(model=data, panes=panes, planner=first, **kwargs)

        def picture(self) -> Picture:
            """The still picture of the current state."""
            return static_picture(self._graph, self._order, self.step, self.planner, self.panes)

        def saved_state(self) -> dict:
            """The data and the state the offline page boots from."""
            return {"model": self.model, "step": self.step, "selected": self.selected,
                    "planner": self.planner, "panes": self.panes}


def explorer(graph, order=None, strategies=None, panes="both"):
    """The linked graph + memory explorer of ``graph`` scheduled in ``order``.

    Returns an :class:`Explorer` widget (needs ``anywidget``; without it, the static picture)."""
    if Explorer is None:
        return static_picture(graph, order, 0, (strategies or ["best"])[0], panes)
    return Explorer(graph, order, strategies, panes)


def graph_explorer(graph, order=None):
    """The graph pane alone: pan/zoom, click a node, the schedule slider."""
    return explorer(graph, order, panes="graph")


def memory_explorer(graph, order=None, strategies=None):
    """The memory pane alone: rectangles per planner, hover for producer and last reader."""
    return explorer(graph, order, strategies, panes="memory")
