"""Schedule timeline (Gantt chart): one row per device/worker, one bar per executed node.

:func:`plot_timeline` draws the static picture (:func:`plot_timelines`: several runs on one time
axis); :func:`schedule_widget` is its interactive form (:mod:`mlsys_lab.viz.timeline_view`), for
one run or several compared in one view."""

import zlib

from ..errors import ArgumentError
from .timeline_view import _TAB10, _unit, timeline_model, timeline_view

_CHAR_WIDTH = 0.0085  # fraction of the axis width one 7-pt character takes on a 9-inch figure


def _kind(node_label):
    """The op of an event's label (``"c = matmul"`` -> ``"matmul"``)."""
    return node_label.split("=")[-1].strip()


def plot_timeline(timeline, ax=None, title=None, span=None):
    """Draw ``timeline`` (records with node, device, worker, start, end in seconds) and return
    the matplotlib Figure.

    Bars are coloured by op; a bar is labelled only when its label fits inside it, and a legend
    names the colours, so short kernels never pile unreadable text on each other. ``span``: the
    seconds the time axis shows (default: the run's own), e.g. to put several runs on one axis."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = list(timeline)
    lanes = sorted({(e.device, e.worker) for e in events})
    row_of = {lane: i for i, lane in enumerate(lanes)}
    if ax is None:
        fig, ax = plt.subplots(figsize=(9, 0.9 + 0.5 * max(len(lanes), 1)))
    else:
        fig = ax.figure
    t0 = min((e.start for e in events), default=0.0)
    span = span or max((e.end for e in events), default=t0 + 1e-3) - t0 or 1e-3
    cmap = plt.get_cmap("tab10")
    colour_of = {}
    labels = ax.__dict__.setdefault("_mlsys_labels", [])
    for e in events:
        kind = _kind(e.node)
        colour = colour_of.setdefault(kind, cmap(zlib.crc32(kind.encode()) % 10))
        row = row_of[(e.device, e.worker)]
        width = e.end - e.start
        ax.barh(row, width * 1e3, left=(e.start - t0) * 1e3, height=0.6, color=colour,
                edgecolor="black", linewidth=0.5)
        if width >= span * _CHAR_WIDTH * (len(e.node) + 1):
            text = ax.text((e.start - t0 + width / 2) * 1e3, row, e.node, ha="center",
                           va="center", fontsize=7, clip_on=True)
            labels.append((text, (e.start - t0) * 1e3, (e.end - t0) * 1e3))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{d}/{w}" for d, w in lanes])
    ax.set_xlim(0, span * 1e3)
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "schedule timeline")
    ax.invert_yaxis()
    if colour_of:
        kinds = sorted(colour_of)[:12]
        ax.legend([Patch(color=colour_of[k]) for k in kinds], kinds, fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.tight_layout()
    _drop_overflowing_labels(fig)
    return fig


def _drop_overflowing_labels(fig):
    """Remove each bar label wider than its bar as laid out (the legend and the other panels
    narrow the axes below what the character estimate assumed)."""
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        kept = []
        for text, left, right in getattr(ax, "_mlsys_labels", []):
            x0, x1 = (ax.transData.transform((t, 0))[0] for t in (left, right))
            if text.get_window_extent(renderer).width + 2 > x1 - x0:
                text.remove()
            else:
                kept.append((text, left, right))
        ax._mlsys_labels = kept


def _runs(timeline):
    """``[(name, events)]``: one unnamed run, or each item of a ``{name: timeline}`` dict."""
    if isinstance(timeline, dict):
        if not timeline:
            raise ArgumentError("schedule timeline: the dict of runs to compare is empty")
        return [(str(name), list(events)) for name, events in timeline.items()]
    return [(None, list(timeline))]


def plot_timelines(timelines, title=None):
    """Several runs' timelines (``{name: timeline}``) one above the other on one time axis, each
    measured from its own start; returns the Figure."""
    import matplotlib.pyplot as plt

    runs = _runs(timelines)
    heights = [max(len({(e.device, e.worker) for e in events}), 1) + 1.2 for _, events in runs]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 0.5 * sum(heights) + 0.4), sharex=True,
                             height_ratios=heights, squeeze=False)
    span = max((max((e.end for e in ev), default=0.0) - min((e.start for e in ev), default=0.0)
                for _, ev in runs), default=1e-3) or 1e-3
    for ax, (name, events) in zip(axes[:, 0], runs):
        plot_timeline(events, ax=ax, title=name, span=span)    # labels fit the common axis
        ax.label_outer()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    _drop_overflowing_labels(fig)
    return fig


def schedule_widget(timeline, title=None, live=None):
    """``timeline`` as an interactive view: hover a bar for the node and its times, click a bar
    or the background for the time cursor (the nodes running then are outlined), wheel to zoom.

    ``timeline`` may be a dict ``{name: timeline}``: the runs are compared in one view, one group
    of lanes per run, each measured from its own start (so makespans line up).

    In a live notebook (or with ``live=True``) returns a
    :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a
    :class:`~mlsys_lab.viz.timeline_view.TimelineView` (its PNG: :func:`plot_timeline`'s
    picture, or :func:`plot_timelines`'); elsewhere that Figure."""
    from .collective_view import want_live
    from .picture import Picture, png_bytes

    runs = _runs(timeline)
    draw = (lambda: plot_timeline(runs[0][1], title=title)) if runs[0][0] is None else \
        (lambda: plot_timelines(dict(runs), title=title))
    if not want_live(live):
        return draw()
    model = schedule_model(timeline, title)
    compared = f" in {len(runs)} runs" if runs[0][0] is not None else ""
    picture = Picture(png_bytes(draw()),
                      alt=f"{model['title']}: {len(model['bars'])} nodes on "
                          f"{len(model['lanes'])} lane(s){compared} (interactive; run the cell "
                          "to hover and zoom)")
    return timeline_view(model, picture)


def schedule_model(timeline, title=None) -> dict:
    """The data of an engine schedule timeline (``Event`` records: node, device, worker, start,
    end): one lane per ``device/worker``, one bar per event, coloured by op as
    :func:`~mlsys_lab.viz.timeline.plot_timeline` colours them.

    With a dict ``{name: timeline}``, one group of lanes per run (headed by its name) and each
    run's times measured from its own first start; keys ``r<run>e<event>:<node>``."""
    runs = _runs(timeline)
    kinds = sorted({_kind(e.node) for _, events in runs for e in events})
    style = {k: i for i, k in enumerate(kinds)}
    styles = [{"name": k, "color": _TAB10[zlib.crc32(k.encode()) % 10]} for k in kinds]
    single = runs[0][0] is None
    firsts = [min((e.start for e in events), default=0.0) for _, events in runs]
    span = max((max((e.end for e in events), default=t) - t
                for t, (_, events) in zip(firsts, runs)), default=0.0)
    scale, unit = _unit(span or 1e-9)
    lanes, bars, groups = [], [], []
    for j, ((name, events), t0) in enumerate(zip(runs, firsts)):
        own = sorted({(e.device, e.worker) for e in events})
        row = {lane: len(lanes) + i for i, lane in enumerate(own)}
        if not single:
            groups.append({"title": name, "first": len(lanes), "count": len(own)})
        lanes += [f"{d}/{w}" for d, w in own]
        shift = 0.0 if single else t0           # one run keeps its clock; compared runs start at 0
        for i, e in enumerate(events):
            info = (("" if single else f"{name}: ") +
                    f"{e.node} on {e.device}/{e.worker}: {(e.start - t0) / scale:.4g}-"
                    f"{(e.end - t0) / scale:.4g} {unit} ({(e.end - e.start) / scale:.4g} {unit})")
            bars.append([row[(e.device, e.worker)], 0, e.start - shift, e.end - shift,
                         style[_kind(e.node)], e.node, info,
                         f"e{i}:{e.node}" if single else f"r{j}e{i}:{e.node}"])
    if single:
        return timeline_model(title or "schedule timeline", lanes, bars, styles, unit=unit,
                              scale=scale)
    return timeline_model(title or "schedule timelines", lanes, bars, styles, groups=groups,
                          unit=unit, scale=scale, t0=0.0, t1=span)
