"""The pipeline-schedule view: GPipe and 1F1B as Gantt charts, one row per stage.

:func:`plot_pipeline` draws any
:class:`~mlsys_lab.distributed.parallel.pipeline_parallel.Timeline` (from
``simulate_schedule`` or measured by ``run_pipeline`` on the simulator): forward bars light,
backward bars dark, one colour per micro-batch, idle time left blank. :func:`static` puts the
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
from .timeline_view import _hex, timeline_model, timeline_view

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


def plot_pipeline(timeline, ax=None, title=None, label_limit=24):
    """Draw a pipeline :class:`Timeline` as a Gantt chart; returns the Figure.

    Args:
        timeline: ``spans[(stage, (kind, micro_batch))] = (start, end)``.
        label_limit: write ``F3`` / ``B3`` into the bars when there are at most this many
            micro-batches.
    """
    p = timeline.p
    fresh = ax is None
    fig, ax = (ax.figure, ax) if not fresh else plt.subplots(figsize=(9, 0.5 + 0.45 * p))
    colours = plt.get_cmap("tab20")
    micro = sorted({j for _, (_, j) in timeline.spans})
    for (stage, (kind, j)), (start, end) in sorted(timeline.spans.items()):
        colour = _shade(colours(micro.index(j) % 20), kind == pp.FORWARD)
        ax.barh(stage, end - start, left=start, height=0.8, color=colour, edgecolor="black",
                linewidth=0.4)
        if len(micro) <= label_limit:
            ax.text((start + end) / 2, stage, f"{kind}{j}", ha="center", va="center",
                    fontsize=6 if len(micro) > 8 else 7)
    ax.set_yticks(range(p), [f"stage {s}" for s in range(p)], fontsize=8)
    ax.set_ylim(p - 0.4, -0.6)
    ax.set_xlim(0, timeline.makespan or 1.0)
    if fresh:
        ax.set_xlabel("time")
    ax.set_title(title or f"makespan {timeline.makespan:g}, bubble "
                          f"{timeline.bubble_fraction():.3f}", fontsize=9)
    return fig


def _summary(name, schedule, timeline, p, m):
    peaks = pp.in_flight_peak(schedule)
    return (f"{_NAMES.get(name, name)}: makespan {timeline.makespan:g}, bubble "
            f"{timeline.bubble_fraction():.3f} (standard (p-1)/(m+p-1) = "
            f"{pp.bubble_fraction_standard(p, m):.3f}), in flight per stage {peaks}")


def static(p=4, m=8, schedules=("gpipe", "1f1b"), t_forward=1.0, t_backward=2.0,
           recompute=False):
    """The schedules for ``p`` stages and ``m`` micro-batches, one chart each; returns the
    Figure. Forward takes ``t_forward``, backward ``t_backward`` (+ ``t_forward`` with
    ``recompute``)."""
    fig, axes = plt.subplots(len(schedules), 1, figsize=(9.5, 0.9 + 0.5 * p * len(schedules)),
                             squeeze=False, sharex=True)
    for ax, name in zip(axes[:, 0], schedules):
        ops, timeline = schedule_timeline(name, p, m, t_forward, t_backward, recompute)
        plot_pipeline(timeline, ax, title=_summary(name, ops, timeline, p, m),
                      label_limit=16)
    axes[-1, 0].set_xlabel("time (forward = %g, backward = %g)" % (
        t_forward, t_backward + (t_forward if recompute else 0.0)))
    fig.tight_layout()
    return fig


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
    """The data of the pipeline schedules for ``p`` stages and ``m`` micro-batches: one group of
    ``p`` lanes per schedule (headed by its makespan and bubble), one bar per forward ``F j``
    and backward ``B j``, the times of ``simulate_schedule``; controls ``p``, ``m`` and
    ``recompute``."""
    import matplotlib.pyplot as plt

    from ..distributed.parallel import pipeline_parallel as pp

    colours = plt.get_cmap("tab20")
    styles, style_of, lanes, groups, bars = [], {}, [], [], []
    makespan = 0.0
    for name in schedules:
        ops, timeline = schedule_timeline(name, p, m, t_forward, t_backward, recompute)
        groups.append({"title": _summary(name, ops, timeline, p, m), "first": len(lanes),
                       "count": p})
        micro = sorted({j for _, (_, j) in timeline.spans})
        for (stage, (kind, j)), (start, end) in sorted(timeline.spans.items()):
            forward = kind == pp.FORWARD
            sk = (micro.index(j) % 20, forward)
            if sk not in style_of:
                style_of[sk] = len(styles)
                styles.append({"name": f"{'forward' if forward else 'backward'} of micro-batch "
                               f"{j}", "color": _hex(_shade(colours(sk[0]), forward))})
            what = "forward" if forward else "backward"
            info = (f"{kind}{j}: {_NAMES.get(name, name)} stage {stage}, {what} of micro-batch "
                    f"{j}, {start:g}-{end:g}")
            bars.append([len(lanes) + stage, 0, start, end, style_of[sk], f"{kind}{j}", info,
                         f"{name}:s{stage}:{kind}{j}"])
        makespan = max(makespan, timeline.makespan)
        lanes += [f"stage {s}" for s in range(p)]
    controls = [{"name": "p", "label": "p (stages)", "type": "int", "min": 1, "max": 8,
                 "value": p},
                {"name": "m", "label": "m (micro)", "type": "int", "min": 1, "max": 16,
                 "value": m},
                {"name": "recompute", "label": "recompute", "type": "bool",
                 "value": bool(recompute)}]
    caption = (f"standard bubble (p-1)/(m+p-1) = {pp.bubble_fraction_standard(p, m):.3f}; "
               f"in flight: GPipe {m} per stage, 1F1B min(p - s, m)")
    backward = t_backward + (t_forward if recompute else 0.0)
    return timeline_model(f"pipeline schedules, p = {p}, m = {m}", lanes, bars, styles,
                          groups=groups, controls=controls, caption=caption, unit="", scale=1.0,
                          t0=0.0, t1=makespan,
                          x_label=f"time (forward = {t_forward:g}, backward = {backward:g})")
