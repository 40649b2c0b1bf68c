"""Pictures of what the framework does: graphs, schedules, memory lifetimes."""

from .graph_view import draw_matplotlib, has_dot, show_graph
from .timeline import plot_timeline

__all__ = ["show_graph", "draw_matplotlib", "has_dot", "plot_timeline"]
