"""Timelines of :class:`~mlsys_lab.span.Span` records: one drawing path for every part.

The runtime's schedule, the data pipeline's profile, pipeline-parallel schedules and the
simulator's trace all record spans (``ml.Span``: lane, name, start, end, kind, detail), and these
functions draw any list of them (or ``{name: spans}``, several runs compared on one time axis):

* :func:`plot_spans` — the static matplotlib Gantt chart: one row per lane (optionally split
  into thin sub-lanes by kind), one bar per span coloured by its kind, a bar labelled only when
  its name fits inside it;
* :func:`spans_model` — the same data for the interactive view (:mod:`.timeline_view`);
* :func:`spans_widget` — the interactive view with the static picture as its PNG (in a live
  notebook), or that picture.

The parts' own views are thin callers: :func:`plot_timeline` / :func:`schedule_widget` (an engine
``Timeline``), :mod:`.pipeline_view` (GPipe and 1F1B) and :mod:`.cluster_timeline` (a simulator
trace).
"""

from __future__ import annotations

import re
import zlib

from ..errors import ArgumentError
from ..span import Span
from .timeline_view import _TAB10, _hex, _unit, timeline_model, timeline_view

__all__ = ["lane_order", "plot_spans", "plot_timeline", "plot_timelines", "schedule_model",
           "schedule_widget", "spans_model", "spans_widget"]

_CHAR_WIDTH = 0.0085  # fraction of the axis width one 7-pt character takes on a 9-inch figure
_ROWS = 48            # a picture labels every lane up to this many, then every n-th
_UNITS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9, "": 1.0}


# ------------------------------------------------------------------------------------ the data
def _check(spans, owner="timeline"):
    spans = list(spans)
    for s in spans:
        if not isinstance(s, Span):
            raise ArgumentError(f"{owner}: {s!r:.80} is not an ml.Span")
    return spans


def _runs(spans, owner="timeline"):
    """``[(name, spans)]``: one unnamed run, or each item of a ``{name: spans}`` dict."""
    if isinstance(spans, dict):
        if not spans:
            raise ArgumentError(f"{owner}: the dict of runs to compare is empty")
        return [(str(name), _check(run, owner)) for name, run in spans.items()]
    return [(None, _check(spans, owner))]


def _natural(text):
    """Sort key: ``"rank 2"`` before ``"rank 10"``."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(text))]


def lane_order(spans, lanes=None):
    """The lanes in drawing order: ``lanes`` as given; else lanes that differ only in their
    numbers (``"rank 2"``, ``"rank 10"``; ``"decode 0"``, ``"decode 1"``) form a group, the groups
    in the order they first start (the data pipeline's operators in pipeline order, the host's
    launches above the device streams) and each group's lanes in numeric order."""
    if lanes is not None:
        return list(lanes)
    first = {}
    for s in spans:
        group = re.sub(r"\d+", "#", str(s.lane))
        first[group] = min(first.get(group, s.start), s.start)
    return sorted({s.lane for s in spans},
                  key=lambda lane: (first[re.sub(r"\d+", "#", str(lane))], _natural(lane)))


def _styler(style, runs):
    """``span -> (legend name, colour)`` from ``style``: None (the kind, a tab10 colour hashed
    from it, so an op keeps its colour from picture to picture; a kind whose colour another
    kind of the picture took gets the next free one), a dict ``{kind: colour}``, or a function
    of the span."""
    if callable(style):
        return style
    if isinstance(style, dict):
        return lambda s: (s.kind, style.get(s.kind, "#7f7f7f"))
    taken, colour = set(), {}
    for kind in sorted({s.kind for _, run in runs for s in run}, key=_natural):
        i = zlib.crc32(kind.encode()) % 10
        while i in taken and len(taken) < 10:
            i = (i + 1) % 10
        taken.add(i)
        colour[kind] = _TAB10[i]
    return lambda s: (s.kind, colour[s.kind])


def _scale(unit, width):
    if unit is None:
        return _unit(width or 1e-9)
    if unit not in _UNITS:
        raise ArgumentError(f"timeline: unknown unit {unit!r}; known: {', '.join(_UNITS)}")
    return _UNITS[unit], unit


def _window(spans, origin, window):
    """``(origin, t0, t1)``: the time shown as 0 and the range shown."""
    first = min((s.start for s in spans), default=0.0)
    origin = first if origin is None else origin
    if window is None:
        window = (origin, max((s.end for s in spans), default=origin))
    t0, t1 = window
    return origin, t0, (t1 if t1 > t0 else t0 + 1e-9)


# ------------------------------------------------------------------------------ the static picture
def plot_spans(spans, ax=None, *, title=None, lanes=None, subs=(), style=None, labels=True,
               legend=True, unit=None, origin=None, window=None, x_label=None):
    """Draw spans as a Gantt chart and return the matplotlib Figure.

    Args:
        spans: :class:`~mlsys_lab.span.Span` records, or ``{name: spans}`` for several runs one
            above the other on one time axis (each measured from its own first start).
        ax: draw into these axes (one run only).
        lanes: the rows, top to bottom (default: :func:`lane_order`: lanes differing only in
            their numbers in numeric order, such groups in the order they start); spans on other
            lanes are left out.
        subs: kinds drawn as thin sub-lanes of every row (e.g. compute / send / recv); spans of
            other kinds are left out. Empty: one bar per row.
        style: a bar's legend name and colour: None (its kind, a colour hashed from it), a dict
            ``{kind: colour}`` or a function ``span -> (name, colour)``.
        labels: write each span's name into its bar where it fits.
        legend: the legend of the colours (True: right of the chart, "top": above it, False).
        unit: "s", "ms", "µs", "ns" (default: from the time shown) or "" (the times' own units).
        origin: the time shown as 0 (default: the first start). window: ``(t0, t1)`` shown.
        x_label: the axis label; ``{unit}`` is replaced by the unit (default ``time ({unit})``).
    """
    import matplotlib.pyplot as plt

    runs = _runs(spans)
    if runs[0][0] is not None:
        return _plot_runs(runs, title=title, lanes=lanes, subs=subs, style=style, labels=labels,
                          legend=legend, unit=unit, x_label=x_label)
    spans = runs[0][1]
    order = lane_order(spans, lanes)
    fresh = ax is None
    if fresh:
        many = len(order) > 16
        _, ax = plt.subplots(figsize=(9, 0.9 + (0.17 if many else 0.32) * min(len(order), _ROWS)
                                      + (0.25 if labels else 0.0)))
    _draw(ax, spans, order, title=title, subs=subs, style=style, labels=labels, legend=legend,
          unit=unit, origin=origin, window=window, x_label=x_label)
    if fresh:
        ax.figure.tight_layout()
        _drop_overflowing_labels(ax.figure)
    return ax.figure


def _draw(ax, spans, order, *, title, subs, style, labels, legend, unit, origin, window,
          x_label, styler=None):
    from matplotlib.patches import Patch

    origin, t0, t1 = _window(spans, origin, window)
    scale, unit = _scale(unit, t1 - t0)
    row_of = {lane: i for i, lane in enumerate(order)}
    subs = list(subs)
    height = 0.72 / len(subs) if subs else 0.6
    styler = styler or _styler(style, [(None, spans)])
    groups, colours = {}, {}
    span_width = (t1 - t0) or 1e-9
    texts = ax.__dict__.setdefault("_mlsys_labels", [])
    for s in spans:
        row = row_of.get(s.lane)
        if row is None or s.end < t0 or s.start > t1 or (subs and s.kind not in subs):
            continue
        name, colour = styler(s)
        colours.setdefault(name, colour)
        y = row - 0.36 + height * subs.index(s.kind) if subs else row - height / 2
        wide = s.end - s.start > 0.004 * span_width  # narrow: outlined in its own colour (a
        # black outline would hide it; none would hide a zero-length launch)
        groups.setdefault((y, colour, wide), []).append(((s.start - origin) / scale,
                                                         max(s.end - s.start, 0.0) / scale))
        if labels and s.name and s.end - s.start >= span_width * _CHAR_WIDTH * (len(s.name) + 1):
            left, right = (s.start - origin) / scale, (s.end - origin) / scale
            text = ax.text((left + right) / 2, row, s.name, ha="center", va="center",
                           fontsize=7, clip_on=True)
            texts.append((text, left, right))
    thin = len(order) > 16 or subs
    for (y, colour, wide), bars in groups.items():
        ax.broken_barh(bars, (y, height), facecolor=colour,
                       edgecolor="black" if wide else colour, linewidth=0.2 if thin else 0.5)
    step = -(-len(order) // _ROWS)
    ax.set_yticks(range(0, len(order), step), [str(lane) for lane in order[::step]],
                  fontsize=6 if len(order) > 16 else 7)
    ax.set_ylim(len(order) - 0.4, -0.6)
    ax.set_xlim((t0 - origin) / scale, (t1 - origin) / scale)
    label = (x_label if x_label is not None else "time ({unit})" if unit else "time")
    ax.set_xlabel(label.replace("{unit}", unit))
    ax.set_title(title or "timeline", fontsize=9, loc="left" if legend == "top" else "center")
    if legend and colours:
        names = _legend_order(colours, style)[:12]
        handles = [Patch(color=colours[n], label=n) for n in names]
        if legend == "top":
            ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=7,
                      ncol=len(names), frameon=False)
        else:
            ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                      frameon=False)


def _legend_order(named, style):
    """The legend's names: a style dict's order, else sorted naturally."""
    if isinstance(style, dict):
        return [k for k in style if k in named] + sorted(set(named) - set(style), key=_natural)
    return sorted(named, key=_natural)


def _plot_runs(runs, *, title, lanes, subs, style, labels, legend, unit, x_label):
    import matplotlib.pyplot as plt

    orders = [lane_order(run, lanes) for _, run in runs]
    heights = [max(len(order), 1) + 1.2 for order in orders]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 0.5 * sum(heights) + 0.4), sharex=True,
                             height_ratios=heights, squeeze=False)
    firsts = [min((s.start for s in run), default=0.0) for _, run in runs]
    width = max((max((s.end for s in run), default=t) - t for t, (_, run) in zip(firsts, runs)),
                default=0.0) or 1e-9
    unit, styler = _scale(unit, width)[1], _styler(style, runs)
    for ax, (name, run), order, t in zip(axes[:, 0], runs, orders, firsts):
        _draw(ax, run, order, title=name, subs=subs, style=style, labels=labels,
              legend=legend, unit=unit, origin=t, window=(t, t + width), x_label=x_label,
              styler=styler)
        ax.label_outer()
    if title:
        fig.suptitle(title, fontsize=10)
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


# ------------------------------------------------------------------------ the interactive view
def spans_model(spans, title=None, *, lanes=None, subs=(), style=None, info=True, unit=None,
                origin=None, window=None, **options) -> dict:
    """The data of the interactive timeline (:func:`~.timeline_view.timeline_model`) of spans.

    Args:
        spans: spans, or ``{name: spans}``: one group of lanes per run (headed by its name), each
            run measured from its own first start.
        lanes, subs, style, unit, origin, window: as :func:`plot_spans` (``window`` for one run).
        info: the hover text: True (``"name on lane: start-end unit (duration)"``), False (the
            front end's own ``"name on lane, start-end"``, less to store for big traces) or a
            function of the span.
        options: passed to :func:`~.timeline_view.timeline_model` (``controls``, ``caption``,
            ``x_label``, where ``{unit}`` is replaced by the unit).

    A bar is ``[lane, sub, start, end, style, name, info, key]`` with the span's own times (for
    compared runs, shifted to start at 0); keys are the bars' positions.
    """
    runs = _runs(spans)
    single = runs[0][0] is None
    styler = _styler(style, runs)
    firsts = [min((s.start for s in run), default=0.0) for _, run in runs]
    if single:
        first, t0, t1 = _window(runs[0][1], origin, window)
        shifts = [0.0]
    else:
        first, t0 = 0.0, 0.0
        t1 = max((max((s.end for s in run), default=t) - t
                  for t, (_, run) in zip(firsts, runs)), default=0.0)
        shifts = firsts
    scale, unit = _scale(unit, t1 - t0)
    subs = list(subs)
    orders = [lane_order(run, lanes) for _, run in runs]
    runs = [(name, [s for s in run if s.lane in shown and (not subs or s.kind in subs)])
            for (name, run), shown in zip(runs, map(set, orders))]
    named, styles, style_of = {}, [], {}
    for _, run in runs:
        for s in run:
            name, colour = styler(s)
            named.setdefault(name, colour)
    for name in _legend_order(named, style):
        style_of[name] = len(styles)
        styles.append({"name": name, "color": named[name] if str(named[name]).startswith("#")
                       else _hex(_rgb(named[name]))})
    all_lanes, bars, groups = [], [], []
    for (name, run), shift, order in zip(runs, shifts, orders):
        row = {lane: len(all_lanes) + i for i, lane in enumerate(order)}
        if not single:
            groups.append({"title": name, "first": len(all_lanes), "count": len(order)})
        all_lanes += [str(lane) for lane in order]
        base = first if single else shift
        for s in run:
            if callable(info):
                text = info(s)
            elif info:
                text = (("" if single else f"{name}: ") +
                        f"{s.name} on {s.lane}: {(s.start - base) / scale:.4g}-"
                        f"{(s.end - base) / scale:.4g} {unit} "
                        f"({(s.end - s.start) / scale:.4g} {unit})")
            else:
                text = ""
            bars.append([row[s.lane], subs.index(s.kind) if subs else 0, s.start - shift,
                         s.end - shift, style_of[styler(s)[0]], s.name, text, str(len(bars))])
    if options.get("x_label"):
        options["x_label"] = options["x_label"].replace("{unit}", unit)
    return timeline_model(title or ("timeline" if single else "timelines"), all_lanes, bars,
                          styles, subs=subs, groups=groups, unit=unit, scale=scale,
                          t0=t0 if single else 0.0, t1=t1, **options)


def _rgb(colour):
    from matplotlib.colors import to_rgb

    return to_rgb(colour)


def spans_widget(spans, title=None, live=None, **options):
    """Spans (or ``{name: spans}``) as an interactive timeline: hover a bar for its name and
    times, click a bar or the background for the time cursor (the spans running then are
    outlined), wheel to zoom, drag to pan.

    In a live notebook (or with ``live=True``) returns a
    :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a
    :class:`~mlsys_lab.viz.timeline_view.TimelineView` whose PNG is :func:`plot_spans`'
    picture; elsewhere that Figure. ``options``: those of :func:`plot_spans` and
    :func:`spans_model` (``lanes``, ``subs``, ``style``, ``unit``, ``origin``, ``window``,
    ``x_label``; ``labels`` and ``legend`` for the picture, ``info`` for the view).
    """
    from .collective_view import want_live
    from .picture import Picture, png_bytes

    drawing = {k: v for k, v in options.items() if k != "info"}
    data = {k: v for k, v in options.items() if k not in ("labels", "legend")}
    runs = _runs(spans)
    figure = plot_spans(spans, title=title, **drawing)
    if not want_live(live):
        return figure
    model = spans_model(spans, title, **data)
    compared = f" in {len(runs)} runs" if runs[0][0] is not None else ""
    picture = Picture(png_bytes(figure),
                      alt=f"{model['title']}: {len(model['bars'])} spans on "
                          f"{len(model['lanes'])} lane(s){compared} (interactive; run the cell "
                          "to hover and zoom)")
    return timeline_view(model, picture)


# ------------------------------------------------------------------- the engine's schedule
def plot_timeline(timeline, ax=None, title=None, span=None):
    """Draw an engine ``Timeline`` (spans of executed nodes: lane ``device/worker``, kind the op)
    in milliseconds from its first start, and return the Figure: :func:`plot_spans` with a
    legend of the ops. ``span``: the seconds the time axis shows (default: the run's own)."""
    spans = _check(timeline, "schedule timeline")
    t0 = min((s.start for s in spans), default=0.0)
    window = None if span is None else (t0, t0 + span)
    return plot_spans(spans, ax, title=title or "schedule timeline", unit="ms", window=window)


def plot_timelines(timelines, title=None):
    """Several runs' timelines (``{name: timeline}``) one above the other on one time axis, each
    measured from its own start (in ms); returns the Figure."""
    return plot_spans(dict(timelines), title=title, unit="ms")


def schedule_widget(timeline, title=None, live=None):
    """An engine ``Timeline`` (or ``{name: timeline}``, runs compared each from its own start)
    as an interactive view: :func:`spans_widget` (its picture: :func:`plot_spans`', in the
    unit that suits the run, as :func:`schedule_model`'s)."""
    runs = _runs(timeline)
    return spans_widget(timeline, title or ("schedule timeline" if runs[0][0] is None
                                            else "schedule timelines"), live)


def schedule_model(timeline, title=None) -> dict:
    """The data of an engine schedule timeline (or ``{name: timeline}``): :func:`spans_model`,
    one lane per ``device/worker``, bars coloured by op."""
    runs = _runs(timeline)
    return spans_model(timeline, title or ("schedule timeline" if runs[0][0] is None
                                           else "schedule timelines"))
