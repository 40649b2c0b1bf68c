"""Draw a Graph: Graphviz (SVG and PNG) when the ``dot`` program exists, else a matplotlib drawing.

Either way the result is a :class:`~.picture.Picture`, whose display bundle holds a PNG, so the
drawing shows in an untrusted notebook and on GitHub, and is drawn exactly once.
"""

import shutil

from ..engine.graph import Graph
from .picture import Picture, figure_picture

__all__ = ["has_dot", "render_svg", "render_png", "show_graph", "draw_matplotlib", "display_name"]

LIVE_FILL = "palegreen"  # the colour of live tensors, in both renderers (as in Graph.to_dot)
HIGHLIGHT_FILL = "orange"


def has_dot():
    """Whether Graphviz's ``dot`` executable is installed."""
    return shutil.which("dot") is not None


def _pipe(dot_source, fmt):
    if not has_dot():
        return None
    try:
        import graphviz

        return graphviz.Source(dot_source).pipe(format=fmt)
    except Exception:
        return None


def render_svg(dot_source):
    """SVG text for DOT source, or None when Graphviz is unavailable or fails."""
    out = _pipe(dot_source, "svg")
    return None if out is None else out.decode("utf-8")


def render_png(dot_source):
    """PNG bytes for DOT source, or None when Graphviz is unavailable or fails."""
    return _pipe(dot_source, "png")


def display_name(graph):
    """A readable name for ``graph``'s title: ``<lambda>@cpu`` reads ``lambda (for cpu)``."""
    name = str(getattr(graph, "name", "graph") or "graph")
    base, _, device = name.partition("@")
    base = base.replace("<lambda>", "lambda").replace("<", "").replace(">", "") or "graph"
    return f"{base} (for {device})" if device else base


def _describe(graph):
    if not isinstance(graph, Graph):
        return "graph drawing (from DOT text)"
    return (f"graph {display_name(graph)}: {len(graph.inputs)} input(s), {len(graph.nodes)} op(s), "
            f"{len(graph.outputs)} output(s)")


def show_graph(graph, highlight=(), live=(), rankdir="TB"):
    """A picture of ``graph`` (a Graph or DOT text) for a notebook output.

    ``highlight`` holds node ids to fill orange, ``live`` value names to fill green. Uses Graphviz
    when ``dot`` is installed; otherwise prints a one-line notice and draws the graph with
    matplotlib (values, ops, the same colours). Returns a :class:`~.picture.Picture` (PNG, and SVG
    from Graphviz), or None for DOT text without Graphviz. Never raises because a renderer is
    missing.
    """
    dot = graph.to_dot(highlight=highlight, live=live, rankdir=rankdir) \
        if isinstance(graph, Graph) else str(graph)
    svg, png = render_svg(dot), render_png(dot)
    if svg is not None and png is not None:
        return Picture(png, svg, _describe(graph))
    print("(Graphviz `dot` not found: drawing with matplotlib; install graphviz for nicer "
          "pictures)")
    if isinstance(graph, Graph):
        fig = draw_matplotlib(graph, highlight=highlight, live=live, rankdir=rankdir)
        return figure_picture(fig, _describe(graph))
    return None


def _layout(graph):
    """Layer and column of every drawn item: ("v", id(value)) for values, ("n", node.id) for ops.

    Graph inputs and array constants sit on layer 0; an op one layer below its deepest input
    value; each output value one layer below its op."""
    layer = {}
    srcs = list(graph.inputs) + [v for v in graph.consts if graph.consts[v].ndim]
    for v in srcs:
        layer[("v", id(v))] = 0
    for n in graph.nodes:
        deepest = max([layer.get(("v", id(v)), 0) for v in n.inputs] + [0])
        layer[("n", n.id)] = deepest + 1
        for v in n.outputs:
            layer[("v", id(v))] = deepest + 2
    column, pos = {}, {}
    for key, r in layer.items():
        pos[key] = (column.get(r, 0), -r)
        column[r] = column.get(r, 0) + 1
    return pos, srcs, column


def draw_matplotlib(graph, highlight=(), live=(), ax=None, rankdir="TB"):
    """A layered drawing of ``graph`` with matplotlib; returns the Figure.

    Values are rounded light boxes (inputs blue, outputs khaki, ``live`` names green), ops are
    square boxes (``highlight`` ids orange), edges run value -> op -> value. ``rankdir="LR"``
    lays the layers out left to right."""
    import matplotlib.pyplot as plt

    pos, srcs, column = _layout(graph)
    if rankdir == "LR":
        pos = {k: (-y, -x) for k, (x, y) in pos.items()}
    xs = [x for x, _ in pos.values()] or [0]
    ys = [y for _, y in pos.values()] or [0]
    span_x, span_y = max(xs) - min(xs) + 1, max(ys) - min(ys) + 1
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(1.5 + 1.7 * span_x, 16), min(1.0 + 0.75 * span_y, 14)))
    else:
        fig = ax.figure
    live, hl = set(live), set(highlight)
    outs = set(map(id, graph.outputs))
    ins = set(map(id, graph.inputs))
    for n in graph.nodes:
        x1, y1 = pos[("n", n.id)]
        for v in n.inputs:
            key = ("v", id(v))
            if key in pos:
                x0, y0 = pos[key]
                skips = abs(x1 - x0) + abs(y1 - y0) > 1.5  # bend edges that jump over layers
                ax.annotate("", (x1, y1), (x0, y0),
                            arrowprops=dict(arrowstyle="->", color="grey", shrinkA=12, shrinkB=12,
                                            connectionstyle=f"arc3,rad={0.35 if skips else 0}"))
        for v in n.outputs:
            x2, y2 = pos[("v", id(v))]
            ax.annotate("", (x2, y2), (x1, y1),
                        arrowprops=dict(arrowstyle="->", color="grey", shrinkA=12, shrinkB=12))
    values = list(srcs) + [v for n in graph.nodes for v in n.outputs]
    for v in values:
        x, y = pos[("v", id(v))]
        if v.name in live:
            fill = LIVE_FILL
        elif id(v) in outs:
            fill = "khaki"
        elif id(v) in ins:
            fill = "lightblue"
        elif v in graph.consts:
            fill = "lightgrey"
        else:
            fill = "white"
        ax.text(x, y, f"{v.name}\n{v.type_str()}", ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round,pad=0.4", fc=fill, ec="grey"))
    for n in graph.nodes:
        x, y = pos[("n", n.id)]
        ax.text(x, y, n.op, ha="center", va="center", fontsize=8, fontweight="bold",
                bbox=dict(boxstyle="square,pad=0.4", fc=HIGHLIGHT_FILL if n.id in hl else "white"))
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)
    ax.set_ylim(min(ys) - 0.6, max(ys) + 0.6)
    ax.axis("off")
    ax.set_title(display_name(graph))
    return fig
