"""Pictures of what the framework does: graphs, schedules, memory lifetimes, collectives,
pipeline schedules and cluster timelines (interactive timelines on the explorer's machinery),
and the linked graph/memory explorer. Every picture's
display bundle carries a PNG, so it shows on GitHub and in an untrusted notebook too.

Every timeline is a list of :class:`Span` records (``ml.Span``, defined in
:mod:`mlsys_lab.span`), whoever emitted it, and one path draws them all: :func:`plot_spans`
(the picture), :func:`spans_widget` (the interactive view), :func:`spans_model` (its data)."""

from ..span import Span
from .cluster_timeline import plot_cluster_timeline, rank_summary, timeline_widget, trace_model
from .collective_view import collective_stepper, plot_ring_step, ring_allreduce_steps
from .explorer_view import explorer, explorer_model, graph_explorer, memory_explorer
from .graph_view import draw_matplotlib, has_dot, show_graph
from .memory_view import compare_table, memory_widget, plot_lifetimes
from .picture import Picture
from .pipeline_view import pipeline_model, pipeline_widget, plot_pipeline
from .stepper import graph_stepper, live_at, show_step
from .timeline import (
    plot_spans,
    plot_timeline,
    plot_timelines,
    schedule_model,
    schedule_widget,
    spans_model,
    spans_widget,
)
from .timeline_view import timeline_model

__all__ = ["show_graph", "draw_matplotlib", "has_dot", "plot_timeline", "plot_lifetimes",
           "memory_widget", "compare_table", "graph_stepper", "show_step", "live_at",
           "collective_stepper", "plot_ring_step", "ring_allreduce_steps", "pipeline_widget",
           "plot_pipeline", "plot_cluster_timeline", "rank_summary", "timeline_widget",
           "explorer", "explorer_model", "graph_explorer", "memory_explorer", "Picture",
           "schedule_widget", "timeline_model", "schedule_model", "pipeline_model", "trace_model",
           "plot_timelines", "Span", "plot_spans", "spans_model", "spans_widget"]
