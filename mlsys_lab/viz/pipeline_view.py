"""The pipeline-schedule view: GPipe and 1F1B as Gantt charts, one row per stage.

:func:`plot_pipeline` draws any
:class:`~mlsys_lab.distributed.parallel.pipeline_parallel.Timeline` (its spans, from
``simulate_schedule`` or measured by ``run_pipeline`` on the simulator) through the one timeline
path, :func:`~mlsys_lab.viz.timeline.plot_spans`: forward bars light, backward bars dark, one
colour per micro-batch, idle time left blank. :func:`static` puts the
schedules side by side for given ``p`` and ``m`` with their bubble fraction next to the standard
result ``(p - 1) / (m + p - 1)`` and the micro-batches each stage keeps in flight;
:func:`pipeline_widget` is the interactive timeline of both, with ``p`` and ``m`` sliders, in a
live notebook.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.colors import to_rgb

from ..distributed.parallel import pipeline_parallel as pp
from ..errors import ArgumentError
from .collective_view import png_bytes, want_live
from .timeline import plot_spans, spans_model
from .timeline_view import timeline_view

__all__ = ["pipeline_widget", "plot_pipeline", "schedule_timeline", "static"]

_NAMES = {"gpipe": "GPipe", "1f1b": "1F1B"}


def schedule_timeline(schedule, p, m, t_forward=1.0, t_backward=2.0, recompute=False):
    """``(schedule, timeline)``: a named schedule (``"gpipe"``, ``"1f1b"``) or per-stage
    operation lists, timed by ``simulate_schedule``."""
    ops = pp.make_schedule(schedule, p, m) if isinstance(schedule, str) else schedule
    if len(ops) != p:
        raise ArgumentError(f"schedule_timeline: the schedule has {len(ops)} stages, p={p}")
    return ops, pp.simulate_schedule(ops, t_forward, t_backward, recompute=recompute)


def _shade(colour, forward):
    r, g, b = to_rgb(colour)
    return (r + (1 - r) * 0.55, g + (1 - g) * 0.55, b + (1 - b) * 0.55) if forward else (r, g, b)


def _style(span):
    """One colour per micro-batch, forward light and backward dark."""
    forward = span.kind == pp.FORWARD
    return (f"{'forward' if forward else 'backward'} of micro-batch {span.micro_batch}",
            _shade(plt.get_cmap("tab20")(span.micro_batch % 20), forward))


def _lanes(p):
    return [f"stage {s}" for s in range(p)]


def plot_pipeline(timeline, ax=None, title=None, label_limit=24):
    """Draw a pipeline :class:`Timeline` (its spans, lane ``stage s``) as a Gantt chart with
    :func:`~mlsys_lab.viz.timeline.plot_spans`: one colour per micro-batch, forward bars light,
    backward bars dark; returns the Figure.

    Args:
        timeline: a ``Timeline`` from ``simulate_schedule`` or ``run_pipeline``.
        label_limit: write ``F3`` / ``B3`` into the bars (where they fit) when there are at
            most this many micro-batches.
    """
    micro = {span.micro_batch for span in timeline}
    return plot_spans(timeline, ax, lanes=_lanes(timeline.p), style=_style,
                      labels=len(micro) <= label_limit, legend=False, unit="", origin=0.0,
                      window=(0.0, timeline.makespan or 1.0), x_label="time" if ax is None else "",
                      title=title or f"makespan {timeline.makespan:g}, bubble "
                                     f"{timeline.bubble_fraction():.3f}")


def _summary(name, schedule, timeline, p, m):
    peaks = pp.in_flight_peak(schedule)
    return (f"{_NAMES.get(name, name)}: makespan {timeline.makespan:g}, bubble "
            f"{timeline.bubble_fraction():.3f} (standard (p-1)/(m+p-1) = "
            f"{pp.bubble_fraction_standard(p, m):.3f}), in flight per stage {peaks}")


def static(p=4, m=8, schedules=("gpipe", "1f1b"), t_forward=1.0, t_backward=2.0,
           recompute=False):
    """The schedules for ``p`` stages and ``m`` micro-batches, one chart each (headed by its
    makespan, bubble and micro-batches in flight) on one time axis; returns the Figure. Forward
    takes ``t_forward``, backward ``t_backward`` (+ ``t_forward`` with ``recompute``)."""
    runs = _runs(p, m, schedules, t_forward, t_backward, recompute)
    backward = t_backward + (t_forward if recompute else 0.0)
    return plot_spans(runs, lanes=_lanes(p), style=_style, labels=m <= 16, legend=False,
                      unit="", x_label=f"time (forward = {t_forward:g}, backward = "
                                       f"{backward:g})")


def _runs(p, m, schedules, t_forward, t_backward, recompute):
    """``{summary: Timeline}`` of each named schedule."""
    runs = {}
    for name in schedules:
        ops, timeline = schedule_timeline(name, p, m, t_forward, t_backward, recompute)
        runs[_summary(name, ops, timeline, p, m)] = timeline
    return runs


def pipeline_widget(p=4, m=8, t_forward=1.0, t_backward=2.0, live=None):
    """The GPipe and 1F1B schedules as an interactive timeline with ``p`` and ``m`` sliders and a
    recomputation switch (hover a bar: which stage, pass and micro-batch; click: select it and
    see what else runs then).

    In a live notebook (or with ``live=True``) returns a
    :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a
    :class:`~mlsys_lab.viz.timeline_view.TimelineView` (its PNG: :func:`static` for the given
    ``p`` and ``m``), elsewhere the static Figure.
    """
    if not want_live(live):
        return static(p, m, t_forward=t_forward, t_backward=t_backward)
    from .picture import Picture

    def rebuild(p=p, m=m, recompute=False):
        return pipeline_model(p, m, t_forward=t_forward, t_backward=t_backward,
                              recompute=recompute)

    picture = Picture(png_bytes(static(p, m, t_forward=t_forward, t_backward=t_backward)),
                      alt=f"pipeline schedules GPipe and 1F1B, p = {p}, m = {m} (interactive "
                          "timeline; run the cell for the p and m sliders)")
    return timeline_view(rebuild(), picture, rebuild,
                         params={"p": p, "m": m, "recompute": False})


def pipeline_model(p=4, m=8, schedules=("gpipe", "1f1b"), t_forward=1.0, t_backward=2.0,
                   recompute=False) -> dict:
    """The data of the pipeline schedules for ``p`` stages and ``m`` micro-batches
    (:func:`~mlsys_lab.viz.timeline.spans_model`): one group of ``p`` lanes per schedule (headed
    by its makespan and bubble), one bar per forward ``F j`` and backward ``B j`` at the times of
    ``simulate_schedule``; controls ``p``, ``m`` and ``recompute``."""
    runs = _runs(p, m, schedules, t_forward, t_backward, recompute)

    def info(span):
        what = "forward" if span.kind == pp.FORWARD else "backward"
        return (f"{span.name}: stage {span.stage}, {what} of micro-batch {span.micro_batch}, "
                f"{span.start:g}-{span.end:g}")

    controls = [{"name": "p", "label": "p (stages)", "type": "int", "min": 1, "max": 8,
                 "value": p},
                {"name": "m", "label": "m (micro)", "type": "int", "min": 1, "max": 16,
                 "value": m},
                {"name": "recompute", "label": "recompute", "type": "bool",
                 "value": bool(recompute)}]
    caption = (f"standard bubble (p-1)/(m+p-1) = {pp.bubble_fraction_standard(p, m):.3f}; "
               f"in flight: GPipe {m} per stage, 1F1B min(p - s, m)")
    backward = t_backward + (t_forward if recompute else 0.0)
    return spans_model(runs, f"pipeline schedules, p = {p}, m = {m}", lanes=_lanes(p),
                       style=_style, info=info, unit="", controls=controls, caption=caption,
                       x_label=f"time (forward = {t_forward:g}, backward = {backward:g})")
