"""Pictures of what the framework does: graphs, schedules, memory lifetimes."""

from .graph_view import draw_matplotlib, has_dot, show_graph
from .memory_view import compare_table, memory_widget, plot_lifetimes
from .stepper import graph_stepper, live_at, show_step
from .timeline import plot_timeline

__all__ = ["show_graph", "draw_matplotlib", "has_dot", "plot_timeline", "plot_lifetimes",
           "memory_widget", "compare_table", "graph_stepper", "show_step", "live_at"]
