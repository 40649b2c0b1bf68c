"""The cluster timeline: what every simulated rank did when, from ``sim.run``'s trace.

The trace is a list of :class:`~mlsys_lab.span.Span` records (lane ``rank N``, kind compute /
send / recv, details rank, bytes, src, dst, link), drawn by the one timeline path
(:mod:`mlsys_lab.viz.timeline`). Each rank gets one row with three thin lanes: ``compute``
(its ``comm.compute`` calls), ``send`` (a transfer from its start on the link to its arrival)
and ``recv`` (from posting the receive to its completion, so waiting for a late sender shows as
a long bar). :func:`rank_summary` adds the lanes up per rank; :func:`plot_cluster_timeline`
draws them (the static picture); :func:`timeline_widget` is the interactive view (hover, time
cursor, zoom) in a live notebook.
"""

from __future__ import annotations

from ..errors import ArgumentError
from .collective_view import want_live
from .timeline import plot_spans, spans_model, spans_widget
from .timeline_view import _unit

__all__ = ["KINDS", "plot_cluster_timeline", "rank_summary", "static", "timeline_widget"]

KINDS = ("compute", "send", "recv")
_COLOURS = {"compute": "tab:blue", "send": "tab:orange", "recv": "tab:green"}


def _events(trace):
    """The trace's spans (of a ``sim.Result`` or a list), checked."""
    events = getattr(trace, "trace", trace)
    if events is None:
        raise ArgumentError("cluster timeline: the run has no trace (run with trace=True)")
    events = list(events)
    for e in events:
        if getattr(e, "kind", None) not in KINDS or "rank" not in getattr(e, "detail", ()):
            raise ArgumentError(f"cluster timeline: {e!r:.80} is not a span of a simulator "
                                f"trace (sim.run(..., trace=True))")
    return events


def rank_summary(trace, p=None):
    """Per rank: seconds in each lane, bytes sent and messages sent.

    Args:
        trace: a ``sim.Result`` or its ``trace`` (a list of :class:`~mlsys_lab.span.Span`).
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


def _title(events, title):
    p = 1 + max((e.rank for e in events), default=0)
    end = max((e.end for e in events), default=0.0)
    whole, whole_unit = _unit(end or 1e-9)
    return title or f"{p} ranks, makespan {end / whole:.4g} {whole_unit}"


def _options(events, ranks=None, kinds=KINDS):
    p = 1 + max((e.rank for e in events), default=0)
    lo, hi = ranks if ranks is not None else (0, p - 1)
    return {"lanes": [f"rank {r}" for r in range(lo, hi + 1)], "subs": tuple(kinds),
            "style": _COLOURS, "origin": 0.0}


def plot_cluster_timeline(trace, ax=None, ranks=None, window=None, title=None, kinds=KINDS):
    """Draw per-rank compute / send / recv bars (:func:`~mlsys_lab.viz.timeline.plot_spans`
    with one thin sub-lane per kind); returns the Figure.

    Args:
        trace: a ``sim.Result`` or a list of its spans.
        ranks: ``(first, last)`` ranks to show (inclusive); default all.
        window: ``(t0, t1)`` simulated seconds to show; default the whole run.
        kinds: which lanes to draw.
    """
    events = _events(trace)
    return plot_spans(events, ax, title=_title(events, title), labels=False, legend="top",
                      window=window, x_label="simulated time ({unit})",
                      **_options(events, ranks, kinds))


static = plot_cluster_timeline


def timeline_widget(trace, title=None, live=None):
    """The cluster timeline as an interactive view: hover a bar for the compute or message
    (ranks, bytes), click for the time cursor, wheel to zoom in time, drag to pan.

    In a live notebook (or with ``live=True``) returns a
    :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a
    :class:`~mlsys_lab.viz.timeline_view.TimelineView` whose static picture is the whole run
    (:func:`~mlsys_lab.viz.timeline.spans_widget`); elsewhere returns that Figure.
    """
    events = _events(trace)
    if not want_live(live):
        return plot_cluster_timeline(events, title=title)
    return spans_widget(events, _title(events, title), live, labels=False, legend="top",
                        info=False, x_label="simulated time ({unit})", **_options(events))


def trace_model(trace, title=None) -> dict:
    """The data of a simulator trace (``sim.Result`` or its spans): one row per rank with
    sub-lanes compute / send / recv, one bar per span (a message is its send on the sender's row
    and its receive on the receiver's row), in trace order
    (:func:`~mlsys_lab.viz.timeline.spans_model`)."""
    events = _events(trace)
    return spans_model(events, _title(events, title), info=False,
                       x_label="simulated time ({unit})", **_options(events))
