"""The cluster timeline: what every simulated rank did when, from ``sim.run``'s trace.

Each rank gets one row with three thin lanes: ``compute`` (its ``comm.compute`` calls), ``send``
(a transfer from its start on the link to its arrival) and ``recv`` (from posting the receive to
its completion, so waiting for a late sender shows as a long bar). :func:`rank_summary` adds the
lanes up per rank; :func:`plot_cluster_timeline` draws them (the static picture);
:func:`timeline_widget` is the interactive view (hover, time cursor, zoom) in a live notebook.
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..errors import ArgumentError
from .collective_view import png_bytes, want_live
from .timeline_view import _hex, _unit, timeline_model, timeline_view

__all__ = ["KINDS", "plot_cluster_timeline", "rank_summary", "static", "timeline_widget"]

KINDS = ("compute", "send", "recv")
_COLOURS = {"compute": "tab:blue", "send": "tab:orange", "recv": "tab:green"}
_OFFSET = {"compute": -0.27, "send": 0.0, "recv": 0.27}
_ROWS = 48      # the static picture grows up to this many ranks and labels each of them


def _events(trace):
    events = getattr(trace, "trace", trace)
    if events is None:
        raise ArgumentError("cluster timeline: the run has no trace (run with trace=True)")
    events = list(events)
    for e in events:
        if getattr(e, "kind", None) not in KINDS:
            raise ArgumentError(f"cluster timeline: {e!r:.80} is not a sim.TraceEvent")
    return events


def rank_summary(trace, p=None):
    """Per rank: seconds in each lane, bytes sent and messages sent.

    Args:
        trace: a ``sim.Result`` or its ``trace`` (a list of ``TraceEvent``).
        p: number of ranks (default: the highest rank seen + 1).

    Returns:
        a list of dicts ``{rank, compute, send, recv, bytes_sent, messages}``.
    """
    events = _events(trace)
    p = p if p is not None else 1 + max((e.rank for e in events), default=-1)
    rows = [{"rank": r, "compute": 0.0, "send": 0.0, "recv": 0.0, "bytes_sent": 0,
             "messages": 0} for r in range(p)]
    for e in events:
        row = rows[e.rank]
        row[e.kind] += e.end - e.start
        if e.kind == "send":
            row["bytes_sent"] += e.bytes
            row["messages"] += 1
    return rows


def plot_cluster_timeline(trace, ax=None, ranks=None, window=None, title=None, kinds=KINDS):
    """Draw per-rank compute / send / recv bars; returns the Figure.

    Args:
        trace: a ``sim.Result`` or a list of ``TraceEvent``.
        ranks: ``(first, last)`` ranks to show (inclusive); default all.
        window: ``(t0, t1)`` simulated seconds to show; default the whole run.
        kinds: which lanes to draw.
    """
    events = _events(trace)
    p = 1 + max((e.rank for e in events), default=0)
    lo, hi = ranks if ranks is not None else (0, p - 1)
    end = max((e.end for e in events), default=0.0)
    t0, t1 = window if window is not None else (0.0, end)
    if not t1 > t0:
        t1 = t0 + 1e-9
    scale, unit = _unit(t1 - t0)
    shown = hi - lo + 1
    many = shown > 16               # thinner rows and a smaller font: a 32-rank run stays compact
    fig, ax = (ax.figure, ax) if ax is not None else \
        plt.subplots(figsize=(9, 0.9 + (0.17 if many else 0.32) * min(shown, _ROWS)))
    for kind in kinds:
        bars = {}
        for e in events:
            if e.kind == kind and lo <= e.rank <= hi and e.end >= t0 and e.start <= t1:
                bars.setdefault(e.rank, []).append(((e.start - t0) / scale,
                                                    max(e.end - e.start, 0.0) / scale))
        for rank, spans in bars.items():
            ax.broken_barh(spans, (rank + _OFFSET[kind] - 0.12, 0.24), color=_COLOURS[kind],
                           edgecolor="black", linewidth=0.2)
    ax.set_xlim(0, (t1 - t0) / scale)
    ax.set_ylim(hi + 0.6, lo - 0.6)
    step = -(-shown // _ROWS)       # every rank labelled up to _ROWS ranks
    ax.set_yticks(range(lo, hi + 1, step), [f"rank {r}" for r in range(lo, hi + 1, step)],
                  fontsize=6 if many else 7)
    ax.set_xlabel(f"simulated time ({unit})" + (f" from {t0 / scale:g} {unit}" if t0 else ""))
    handles = [Patch(color=_COLOURS[kind], label=kind) for kind in kinds]
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7,
              ncol=len(kinds), frameon=False)
    whole, whole_unit = _unit(end or 1e-9)
    ax.set_title(title or f"{p} ranks, makespan {end / whole:.4g} {whole_unit}", fontsize=9,
                 loc="left")
    fig.tight_layout()
    return fig


static = plot_cluster_timeline


def timeline_widget(trace, title=None, live=None):
    """The cluster timeline as an interactive view: hover a bar for the compute or message
    (ranks, bytes, link), click for the time cursor, wheel to zoom in time, drag to pan.

    In a live notebook (or with ``live=True``) returns a
    :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a
    :class:`~mlsys_lab.viz.timeline_view.TimelineView` whose static picture is the whole run;
    elsewhere returns that Figure.
    """
    events = _events(trace)
    if not want_live(live):
        return plot_cluster_timeline(events, title=title)
    from .picture import Picture

    model = trace_model(events, title)
    picture = Picture(png_bytes(plot_cluster_timeline(events, title=title)),
                      alt=f"cluster timeline, {len(model['lanes'])} ranks, {len(events)} events "
                          "(interactive; run the cell to hover and zoom)")
    return timeline_view(model, picture)


def trace_model(trace, title=None) -> dict:
    """The data of a simulator trace (``sim.Result`` or its ``TraceEvent`` list): one row per
    rank with sub-lanes compute / send / recv, one bar per event (a message is its send on the
    sender's row and its receive on the receiver's row), in trace order."""
    from matplotlib.colors import to_rgb


    events = _events(trace)
    p = 1 + max((e.rank for e in events), default=0)
    end = max((e.end for e in events), default=0.0)
    scale, unit = _unit(end or 1e-9)
    sub = {k: i for i, k in enumerate(KINDS)}
    bars = []
    for i, e in enumerate(events):    # info "" : the front end writes "label on lane, start-end"
        label = "compute" if e.kind == "compute" else f"{e.kind} {e.src}->{e.dst}, {e.bytes} B"
        bars.append([e.rank, sub[e.kind], e.start, e.end, sub[e.kind], label, "", str(i)])
    whole, whole_unit = _unit(end or 1e-9)
    styles = [{"name": k, "color": _hex(to_rgb(_COLOURS[k]))} for k in KINDS]
    return timeline_model(title or f"{p} ranks, makespan {end / whole:.4g} {whole_unit}",
                          [f"rank {r}" for r in range(p)], bars, styles, subs=KINDS,
                          unit=unit, scale=scale, t0=0.0, t1=end,
                          x_label=f"simulated time ({unit})")
