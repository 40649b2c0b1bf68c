"""Graph stepper: a slider over the schedule that highlights the running node and the tensors
alive at that step. ``show_step`` is the static rendering (for nbconvert and GitHub)."""

from ..engine.memory import lifetimes
from .graph_view import show_graph
from .picture import attach_static


def live_at(graph, step, order=None):
    """Names of the intermediate values alive at ``step`` of the schedule."""
    recs = lifetimes(graph, order, include_inputs=False)
    return {r.id.name for r in recs if r.start <= step <= r.end}


def show_step(graph, step, order=None):
    """The graph with node ``step`` of the schedule highlighted and its live tensors shaded."""
    order = list(graph.nodes if order is None else order)
    node = order[step]
    return show_graph(graph, highlight=[node.id], live=live_at(graph, step, order))


def graph_stepper(graph, order=None):
    """An ipywidgets slider over the schedule; falls back to the static first step when
    ipywidgets is unavailable. The widget's display bundle also holds the picture of step 0
    (PNG), which is what an untrusted notebook, nbconvert and GitHub show."""
    order = list(graph.nodes if order is None else order)
    try:
        import ipywidgets as widgets
        from IPython.display import display
    except ImportError:
        return show_step(graph, 0, order)

    def render(step):
        n = order[step]
        live = live_at(graph, step, order)
        print(f"step {step}: {n.output.name} = {n.op}   live: {', '.join(sorted(live))}")
        display(show_graph(graph, highlight=[n.id], live=live))

    slider = widgets.IntSlider(min=0, max=len(order) - 1, value=0, description="step")
    stepper = widgets.interactive(render, step=slider)
    first = show_step(graph, 0, order)
    if first is not None:
        first.alt = (f"graph stepper over {len(order)} steps of {first.alt} "
                     "(the picture shows step 0; run the cell for the slider)")
        attach_static(stepper, first)
    return stepper
