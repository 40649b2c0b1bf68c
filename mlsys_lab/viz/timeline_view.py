"""The interactive timeline: bars per device/stream over time, on the explorer's machinery.

:func:`timeline_model` is the plain data the front end draws (``static/timeline.js``, shipped in
this package, nothing from a CDN): ``lanes`` (one row per device, worker, stage or rank),
optional ``subs`` (thin sub-lanes of every row, e.g. compute/send/recv) and ``bars``, each
``[lane, sub, start, end, style, label, info, key]`` with the times of the record it was built
from. Three builders fill it: :func:`schedule_model` (an engine ``Timeline`` of executed nodes),
:func:`pipeline_model` (GPipe/1F1B schedules for ``p`` and ``m``) and :func:`trace_model` (a
simulator trace). :class:`TimelineView` is the anywidget: hover a bar for its op or message,
click a bar to select it, click the background to move the time cursor (the bars running then
are outlined), wheel to zoom, drag to pan. ``selected``, ``cursor`` and ``params`` (the values of
the model's controls, e.g. ``p`` and ``m``) are synced traitlets; a view built with a
``rebuild`` function redraws when ``params`` changes. Its display bundle holds the static PNG
(what GitHub, an untrusted notebook and nbconvert show) and the data under :data:`MIMETYPE`
(what ``mlsys-lab export`` turns back into a live view without a kernel).
"""

from __future__ import annotations

from ..errors import ArgumentError
from .picture import Picture

__all__ = ["MIMETYPE", "STATIC", "TimelineView", "timeline_model", "timeline_view"]

from .explorer_view import STATIC

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


# --------------------------------------------------------------------------------- builders
# --------------------------------------------------------------------------------- the widget
try:
    import anywidget
    import traitlets
except ImportError:  # the static pictures still work
    anywidget = None

if anywidget is None:
    TimelineView = None
else:
    class TimelineView(anywidget.AnyWidget):
        """The interactive timeline (see the module's docstring). Synced state: ``model`` (the
        data), ``selected`` (a bar's key, "" for none), ``cursor`` (a time, -1 for none) and
        ``params`` (control values; with ``rebuild`` the data is rebuilt from them)."""

        _esm = STATIC / "timeline.js"
        _css = STATIC / "timeline.css"
        model = traitlets.Dict().tag(sync=True)
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

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            data = dict(bundle[0] if isinstance(bundle, tuple) else bundle)
            data.update(self.picture().bundle())
            data[MIMETYPE] = {"model": self.model, "selected": self.selected,
                              "cursor": self.cursor, "params": self.params}
            return data


def timeline_view(model, picture, rebuild=None, params=None, alt=None):
    """A :class:`~mlsys_lab.viz.picture.WidgetWithStatic` holding a :class:`TimelineView` of
    ``model`` and ``picture`` (a :class:`Picture`), or ``picture`` itself without anywidget."""
    from .picture import WidgetWithStatic

    if TimelineView is None:
        return picture
    view = TimelineView(model, picture, rebuild, params)
    return WidgetWithStatic(view, picture.png, alt or picture.alt)
