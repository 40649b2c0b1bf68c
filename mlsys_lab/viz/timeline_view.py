"""The interactive timeline: bars per device/stream over time, on the explorer's machinery.

:func:`timeline_model` is the plain data the front end draws (``static/timeline.js``, shipped in
this package, nothing from a CDN): ``lanes`` (one row per device, worker, stage or rank), optional
``subs`` (thin sub-lanes of every row, e.g. compute/send/recv) and ``bars``, each ``[lane, sub,
start, end, style, label, info, key]`` with the times of the record it was built from. One builder
fills it from any list of :class:`~mlsys_lab.span.Span` records,
:func:`~mlsys_lab.viz.timeline.spans_model`; the parts' views call it (:func:`schedule_model`: an
engine ``Timeline``; :func:`pipeline_model`: GPipe/1F1B for ``p`` and ``m``; :func:`trace_model`: a
simulator trace). :class:`TimelineView` is the anywidget: hover a bar for its op or message, click a
bar to select it, click the background to move the time cursor (the bars running then are outlined),
wheel to zoom, drag to pan. ``selected``, ``cursor`` and ``params`` (the values of the model's
controls, e.g. ``p`` and ``m``) are synced traitlets; a view built with a ``rebuild`` function
redraws when ``params`` changes. Its display bundle holds the static PNG (what GitHub, an untrusted
notebook and nbconvert show) and the data under :data:`MIMETYPE` (what ``mlsys-lab export`` turns
back into a live view without a kernel). The data is sent and saved packed (:func:`pack_model`: the
bars column-wise, a few lines however many bars), so a 32-rank trace does not make the notebook file
megabytes long.
"""

from __future__ import annotations

import itertools
import math

from ..errors import ArgumentError
from .picture import Picture
from .view_widget import STATIC, ViewWidget, traitlets

__all__ = ["MIMETYPE", "STATIC", "TimelineView", "pack_model", "timeline_model", "timeline_view",
           "unpack_model"]

MIMETYPE = "application/vnd.mlsys-lab.timeline+json"
_TAB10 = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf"]


def _unit(span):
    for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if span >= scale:
            return scale, name
    return 1e-9, "ns"


def _hex(rgb):
    return "#%02x%02x%02x" % tuple(round(255 * c) for c in rgb[:3])


def timeline_model(title, lanes, bars, styles, subs=(), groups=(), controls=(), caption="",
                   unit=None, scale=None, t0=None, t1=None, x_label=None) -> dict:
    """The timeline view's data (JSON-able).

    Args:
        title: heading. lanes: row labels. subs: sub-lane names (empty: one lane per row).
        bars: ``[lane, sub, start, end, style, label, info, key]`` (times in seconds or the
            schedule's own units; ``key`` unique; an empty ``info`` is shown as
            ``"label on lane, start-end unit"``).
        styles: ``{"name", "color"}`` per style index (the legend).
        groups: ``{"title", "first", "count"}`` headings over consecutive lanes.
        controls: ``{"name", "label", "type": "int" | "bool", "min", "max", "value"}``.
        unit, scale: axis unit name and its size (default: s/ms/µs/ns from the span).
        t0, t1: the time range (default: the bars' range, t0 shown as 0).
    """
    bars = [list(b) for b in bars]
    keys = [b[7] for b in bars]
    if len(set(keys)) != len(keys):
        raise ArgumentError("timeline_model: bar keys must be unique")
    for b in bars:
        if not (0 <= b[0] < len(lanes)) or not (0 <= b[4] < max(len(styles), 1)) or \
                not b[3] >= b[2]:
            raise ArgumentError(f"timeline_model: bad bar {b!r:.120}")
    lo = min((b[2] for b in bars), default=0.0) if t0 is None else t0
    hi = max((b[3] for b in bars), default=lo) if t1 is None else t1
    if scale is None:
        scale, unit = _unit(hi - lo or 1e-9)
    return {"title": title, "lanes": list(lanes), "subs": list(subs), "groups": list(groups),
            "styles": list(styles), "bars": bars, "controls": list(controls),
            "caption": caption, "unit": unit or "", "scale": float(scale), "t0": float(lo),
            "t1": float(hi), "x_label": x_label}


def pack_model(model: dict) -> dict:
    """``model`` as stored in a notebook and sent to the front end: the bars column-wise.

    ``bars`` becomes ``{"count", "tick", "lane", "sub", "start", "length", "style", "label",
    "labels", "info", "infos", "keys"}``: the integer columns as space-separated numbers in one
    string each (one line in the notebook file, however many bars; a run of three or more equal
    numbers ``v`` is written ``v*count``), times as whole multiples of
    ``tick`` from ``t0`` (``tick`` a power of ten, at most 1e-7 of the time range, so a drawn or
    printed time is unchanged to the 4 digits shown; ``start`` holds each bar's start minus the
    previous bar's, ``length`` its end minus its start: short numbers), labels and infos as
    indices into their tables of distinct strings, and ``keys`` None when every key is its bar's
    index. A packed model is returned as it is; :func:`unpack_model` reverses it (times to
    within ``tick / 2``).
    """
    bars = model["bars"]
    if not isinstance(bars, list):
        return model
    t0 = model["t0"]
    reach = max([abs(b[i] - t0) for b in bars for i in (2, 3)] + [model["t1"] - t0, 0.0])
    tick = 10.0 ** (math.floor(math.log10(reach)) - 7) if reach > 1e-290 else 1e-9

    def column(values):
        runs = [(v, len(list(same))) for v, same in itertools.groupby(int(v) for v in values)]
        return " ".join(f"{v}*{n}" if n > 2 else " ".join([str(v)] * n) for v, n in runs)

    def table(values):
        index = {}
        codes = [index.setdefault(v, len(index)) for v in values]
        return column(codes), list(index)

    label, labels = table(b[5] for b in bars)
    info, infos = table(b[6] for b in bars)
    keys = [b[7] for b in bars]
    starts = [round((b[2] - t0) / tick) for b in bars]
    ends = [round((b[3] - t0) / tick) for b in bars]
    packed = {"count": len(bars), "tick": tick,
              "lane": column(b[0] for b in bars), "sub": column(b[1] for b in bars),
              "start": column(b - a for a, b in zip([0] + starts[:-1], starts)),
              "length": column(b - a for a, b in zip(starts, ends)),
              "style": column(b[4] for b in bars), "label": label, "labels": labels,
              "info": info, "infos": infos,
              "keys": None if keys == [str(i) for i in range(len(bars))] else keys}
    return dict(model, bars=packed)


def unpack_model(model: dict) -> dict:
    """The model :func:`pack_model` packed, with ``bars`` a list again (a list stays as it is)."""
    packed = model["bars"]
    if isinstance(packed, list):
        return model

    def column(text):
        values = []
        for token in text.split():
            value, _, count = token.partition("*")
            values += [int(value)] * (int(count) if count else 1)
        if len(values) != packed["count"]:
            raise ArgumentError(f"unpack_model: a column holds {len(values)} values, not "
                                f"{packed['count']}")
        return values

    t0, tick = model["t0"], packed["tick"]
    keys = packed["keys"] or [str(i) for i in range(packed["count"])]
    starts = list(itertools.accumulate(column(packed["start"])))
    bars = [[lane, sub, t0 + start * tick, t0 + (start + length) * tick, style,
             packed["labels"][label], packed["infos"][info], key]
            for lane, sub, start, length, style, label, info, key in zip(
                column(packed["lane"]), column(packed["sub"]), starts,
                column(packed["length"]), column(packed["style"]), column(packed["label"]),
                column(packed["info"]), keys)]
    return dict(model, bars=bars)


# --------------------------------------------------------------------------------- the widget
if ViewWidget is None:
    TimelineView = None
else:
    class TimelineView(ViewWidget):
        """The interactive timeline (see the module's docstring). Synced state: ``model`` (the
        data; sent and saved packed, :func:`pack_model`), ``selected`` (a bar's key, "" for
        none), ``cursor`` (a time, -1 for none) and ``params`` (control values; with
        ``rebuild`` the data is rebuilt from them)."""

        MIMETYPE = MIMETYPE
        _esm = STATIC / "timeline.js"
        _css = STATIC / "timeline.css"
        model = traitlets.Dict().tag(sync=True, to_json=lambda value, _: pack_model(value),
                                     from_json=lambda value, _: unpack_model(value))
        selected = traitlets.Unicode("").tag(sync=True)
        cursor = traitlets.Float(-1.0).tag(sync=True)
        params = traitlets.Dict().tag(sync=True)

        def __init__(self, model, picture, rebuild=None, params=None, **kwargs):
            self._picture, self._rebuild = picture, rebuild
            super().__init__(model=model, params=dict(params or {}), **kwargs)

        @traitlets.observe("params")
        def _params_changed(self, change):
            if self._rebuild is not None:
                self.selected, self.cursor = "", -1.0
                self.model = self._rebuild(**change["new"])

        def picture(self) -> Picture:
            """The still picture (of the first state)."""
            return self._picture() if callable(self._picture) else self._picture

        def saved_state(self) -> dict:
            """The packed data and the state the offline page boots from."""
            return {"model": pack_model(self.model), "selected": self.selected,
                    "cursor": self.cursor, "params": self.params}


def timeline_view(model, picture, rebuild=None, params=None, alt=None):
    """A :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a :class:`TimelineView` of
    ``model`` and ``picture`` (a :class:`Picture`), or ``picture`` itself without anywidget."""
    from .picture import WidgetWithStatic

    if TimelineView is None:
        return picture
    view = TimelineView(model, picture, rebuild, params)
    return WidgetWithStatic(view, picture.png, alt or picture.alt)
