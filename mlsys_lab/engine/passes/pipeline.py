"""Pass pipelines: run passes in order, lint between them, keep every intermediate graph."""

from collections.abc import Iterable
from typing import NamedTuple

from ...errors import DTypeError, GraphError, UnknownNameError
from ..graph import Graph
from .catalog import PASSES
from .rewrite import Pass


class Stage(NamedTuple):
    """One step of a pipeline: the pass's name, the graph after it, and its node count."""

    name: str
    graph: Graph
    n_nodes: int


class PipelineResult:
    """What :func:`run_pipeline` produced.

    Attributes:
        input: the graph the pipeline started from.
        graph: the final graph.
        stages: one :class:`Stage` per pass, in order.
    """

    def __init__(self, graph, stages):
        self.input = graph
        self.stages = list(stages)
        self.graph = self.stages[-1].graph if self.stages else graph

    def table(self):
        """A small text table: node count before the pipeline and after each pass."""
        rows = [("input", len(self.input.nodes))] + [(s.name, s.n_nodes) for s in self.stages]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {n:>4} nodes" for name, n in rows)

    def __repr__(self):
        names = " -> ".join(s.name for s in self.stages) or "(no passes)"
        return (f"<PipelineResult {names}: {len(self.input.nodes)} -> "
                f"{len(self.graph.nodes)} nodes>")


def as_pass(p):
    """A :class:`Pass` from a Pass, a registered pass name, or a plain ``Graph -> Graph``.

    Raises:
        UnknownNameError: no pass has that name; the message lists the known ones.
        DTypeError: ``p`` is neither a name nor callable.
    """
    if isinstance(p, Pass):
        return p
    if isinstance(p, str):
        if p not in PASSES:
            raise UnknownNameError(f"no pass named {p!r}; known passes: {', '.join(PASSES)}")
        return PASSES[p]
    if callable(p):
        return Pass(p, getattr(p, "name", None) or getattr(p, "__name__", "pass"))
    raise DTypeError(f"not a pass: {p!r} ({type(p).__name__}); give a Pass, a pass name or a "
                     f"Graph -> Graph function")


def _as_passes(passes):
    """Every pass resolved up front, so a misspelt name fails before any pass runs."""
    if isinstance(passes, (str, Pass)) or callable(passes):
        passes = [passes]
    elif not isinstance(passes, Iterable):
        raise DTypeError(f"passes must be a list of passes or pass names, got "
                         f"{type(passes).__name__}")
    return [as_pass(p) for p in passes]


def _lint(graph, after):
    try:
        graph.lint()
    except GraphError as e:
        raise type(e)(f"{after}: the graph fails lint: {e}") from None


def run_pipeline(graph, passes):
    """Run ``passes`` in order on ``graph``, linting before the first and after each.

    Args:
        graph: the input graph (left unchanged).
        passes: Pass objects, registered pass names (see ``PASSES``) or ``Graph -> Graph``
            functions (one name or one function alone is also accepted).

    Returns:
        A :class:`PipelineResult` with the final ``graph`` and every ``stage``.

    Raises:
        UnknownNameError: an unknown pass name (before any pass runs).
        GraphError: naming the pass whose output fails ``lint()``, which returned something other
            than a Graph, or which modified its input.
    """
    passes = _as_passes(passes)
    _lint(graph, "pipeline input")
    stages, current = [], graph
    for p in passes:
        before = current.pretty()
        out = p(current)
        if not isinstance(out, Graph):
            raise GraphError(f"pass {p.name} returned {type(out).__name__}, not a Graph")
        if current.pretty() != before:
            raise GraphError(f"pass {p.name} modified its input graph (passes must copy)")
        _lint(out, f"after pass {p.name}")
        stages.append(Stage(p.name, out, len(out.nodes)))
        current = out
    return PipelineResult(graph, stages)


def pipeline(*passes, name="pipeline"):
    """Compose ``passes`` into one :class:`Pass` that runs them with :func:`run_pipeline`."""
    passes = _as_passes(passes)

    def run(graph):
        return run_pipeline(graph, passes).graph

    run.__doc__ = "Runs " + " -> ".join(p.name for p in passes) + "."
    return Pass(run, name)
