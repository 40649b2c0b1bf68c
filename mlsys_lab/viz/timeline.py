"""Schedule timeline (Gantt chart): one row per device/worker, one bar per executed node.

:func:`plot_timeline` draws the static picture; :func:`schedule_widget` is its interactive form
(:mod:`mlsys_lab.viz.timeline_view`)."""

import zlib

from .timeline_view import _TAB10, _unit, timeline_model, timeline_view

_CHAR_WIDTH = 0.0085  # fraction of the axis width one 7-pt character takes on a 9-inch figure


def _kind(node_label):
    """The op of an event's label (``"c = matmul"`` -> ``"matmul"``)."""
    return node_label.split("=")[-1].strip()


def plot_timeline(timeline, ax=None, title=None):
    """Draw ``timeline`` (records with node, device, worker, start, end in seconds) and return
    the matplotlib Figure.

    Bars are coloured by op; a bar is labelled only when its label fits inside it, and a legend
    names the colours, so short kernels never pile unreadable text on each other."""
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
    span = max((e.end for e in events), default=t0 + 1e-3) - t0 or 1e-3
    cmap = plt.get_cmap("tab10")
    colour_of = {}
    for e in events:
        kind = _kind(e.node)
        colour = colour_of.setdefault(kind, cmap(zlib.crc32(kind.encode()) % 10))
        row = row_of[(e.device, e.worker)]
        width = e.end - e.start
        ax.barh(row, width * 1e3, left=(e.start - t0) * 1e3, height=0.6, color=colour,
                edgecolor="black", linewidth=0.5)
        if width >= span * _CHAR_WIDTH * (len(e.node) + 1):
            ax.text((e.start - t0 + width / 2) * 1e3, row, e.node, ha="center", va="center",
                    fontsize=7, clip_on=True)
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
    return fig


def schedule_widget(timeline, title=None, live=None):
    """``timeline`` as an interactive view: hover a bar for the node and its times, click a bar
    or the background for the time cursor (the nodes running then are outlined), wheel to zoom.

    In a live notebook (or with ``live=True``) returns a
    :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a
    :class:`~mlsys_lab.viz.timeline_view.TimelineView` (its PNG: :func:`plot_timeline`'s
    picture); elsewhere that Figure."""
    from .collective_view import want_live
    from .picture import Picture, png_bytes

    events = list(timeline)
    if not want_live(live):
        return plot_timeline(events, title=title)
    lanes = len({(e.device, e.worker) for e in events})
    picture = Picture(png_bytes(plot_timeline(events, title=title)),
                      alt=f"{title or 'schedule timeline'}: {len(events)} nodes on {lanes} "
                          "lane(s) (interactive; run the cell to hover and zoom)")
    return timeline_view(schedule_model(events, title), picture)


def schedule_model(timeline, title=None) -> dict:
    """The data of an engine schedule timeline (``Event`` records: node, device, worker, start,
    end): one lane per ``device/worker``, one bar per event, coloured by op as
    :func:`~mlsys_lab.viz.timeline.plot_timeline` colours them."""

    events = list(timeline)
    lanes = sorted({(e.device, e.worker) for e in events})
    row = {lane: i for i, lane in enumerate(lanes)}
    kinds = sorted({_kind(e.node) for e in events})
    style = {k: i for i, k in enumerate(kinds)}
    styles = [{"name": k, "color": _TAB10[zlib.crc32(k.encode()) % 10]} for k in kinds]
    t0 = min((e.start for e in events), default=0.0)
    span = max((e.end for e in events), default=t0) - t0
    scale, unit = _unit(span or 1e-9)
    bars = []
    for i, e in enumerate(events):
        info = (f"{e.node} on {e.device}/{e.worker}: {(e.start - t0) / scale:.4g}-"
                f"{(e.end - t0) / scale:.4g} {unit} ({(e.end - e.start) / scale:.4g} {unit})")
        bars.append([row[(e.device, e.worker)], 0, e.start, e.end, style[_kind(e.node)], e.node,
                     info, f"e{i}:{e.node}"])
    return timeline_model(title or "schedule timeline", [f"{d}/{w}" for d, w in lanes], bars,
                          styles, unit=unit, scale=scale)
