"""Draw a Graph: Graphviz SVG when the ``dot`` program exists, else a matplotlib drawing."""

import shutil

from ..engine.graph import Graph


def has_dot():
    """Whether Graphviz's ``dot`` executable is installed."""
    return shutil.which("dot") is not None


def render_svg(dot_source):
    """SVG text for DOT source, or None when Graphviz is unavailable or fails."""
    if not has_dot():
        return None
    try:
        import graphviz

        return graphviz.Source(dot_source).pipe(format="svg").decode("utf-8")
    except Exception:
        return None


class _SVG:
    def __init__(self, svg):
        self.svg = svg

    def _repr_svg_(self):
        return self.svg

    def __repr__(self):
        return "<graph drawing (SVG)>"


def show_graph(graph, highlight=(), live=(), rankdir="TB"):
    """Display ``graph`` (a Graph or DOT text) in a notebook.

    Uses Graphviz when ``dot`` is installed; otherwise prints a one-line notice and draws the
    graph with matplotlib. Never raises because a renderer is missing.
    """
    dot = graph.to_dot(highlight=highlight, live=live, rankdir=rankdir) \
        if isinstance(graph, Graph) else str(graph)
    svg = render_svg(dot)
    if svg is not None:
        return _SVG(svg)
    print("(Graphviz `dot` not found: drawing with matplotlib; install graphviz for nicer "
          "pictures)")
    if isinstance(graph, Graph):
        return draw_matplotlib(graph, highlight=highlight)
    return None


def _layers(graph):
    """Layer index of each node: 1 + the deepest layer among its producers."""
    layer = {}
    for n in graph.nodes:
        layer[n.id] = 1 + max([layer[v.producer.id] for v in n.inputs
                               if v.producer is not None] + [0])
    return layer


def draw_matplotlib(graph, highlight=(), ax=None):
    """A layered drawing of ``graph`` with matplotlib (inputs at the top); returns the Figure."""
    import matplotlib.pyplot as plt

    layer = _layers(graph)
    rows = {}
    pos = {}
    srcs = list(graph.inputs) + [v for v in graph.consts if graph.consts[v].ndim]
    for i, v in enumerate(srcs):
        pos[("v", id(v))] = (i, 0)
    for n in graph.nodes:
        r = layer[n.id]
        pos[("n", n.id)] = (rows.get(r, 0), -r)
        rows[r] = rows.get(r, 0) + 1
    width = max([len(srcs)] + list(rows.values()) + [1])
    depth = max(list(layer.values()) + [1])
    if ax is None:
        fig, ax = plt.subplots(figsize=(min(2 + 1.6 * width, 14), 1.2 + 0.9 * depth))
    else:
        fig = ax.figure
    for n in graph.nodes:
        x1, y1 = pos[("n", n.id)]
        for v in n.inputs:
            key = ("n", v.producer.id) if v.producer is not None else ("v", id(v))
            if key in pos:
                x0, y0 = pos[key]
                ax.annotate("", (x1, y1 + 0.18), (x0, y0 - 0.18),
                            arrowprops=dict(arrowstyle="->", color="grey"))
    for v in srcs:
        x, y = pos[("v", id(v))]
        ax.text(x, y, f"{v.name}\n{v.type_str()}", ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round", fc="lightblue"))
    hl = set(highlight)
    for n in graph.nodes:
        x, y = pos[("n", n.id)]
        ax.text(x, y, f"{n.op}\n{n.output.name}:{n.output.type_str()}", ha="center",
                va="center", fontsize=8,
                bbox=dict(boxstyle="round", fc="orange" if n.id in hl else "white"))
    ax.set_xlim(-0.8, width - 0.2)
    ax.set_ylim(-depth - 0.6, 0.6)
    ax.axis("off")
    ax.set_title(graph.name)
    return fig
