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

import zlib

from ..errors import ArgumentError
from .picture import Picture

__all__ = ["MIMETYPE", "STATIC", "TimelineView", "pipeline_model", "schedule_model",
           "timeline_model", "timeline_view", "trace_model"]

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
def schedule_model(timeline, title=None) -> dict:
    """The data of an engine schedule timeline (``Event`` records: node, device, worker, start,
    end): one lane per ``device/worker``, one bar per event, coloured by op as
    :func:`~mlsys_lab.viz.timeline.plot_timeline` colours them."""
    from .timeline import _kind

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


def pipeline_model(p=4, m=8, schedules=("gpipe", "1f1b"), t_forward=1.0, t_backward=2.0,
                   recompute=False) -> dict:
    """The data of the pipeline schedules for ``p`` stages and ``m`` micro-batches: one group of
    ``p`` lanes per schedule (headed by its makespan and bubble), one bar per forward ``F j``
    and backward ``B j``, the times of ``simulate_schedule``; controls ``p``, ``m`` and
    ``recompute``."""
    import matplotlib.pyplot as plt

    from ..distributed import pipeline_parallel as pp
    from .pipeline_view import _NAMES, _shade, _summary, schedule_timeline

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


def trace_model(trace, title=None) -> dict:
    """The data of a simulator trace (``sim.Result`` or its ``TraceEvent`` list): one row per
    rank with sub-lanes compute / send / recv, one bar per event (a message is its send on the
    sender's row and its receive on the receiver's row), in trace order."""
    from matplotlib.colors import to_rgb

    from .cluster_timeline import _COLOURS, KINDS, _events

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
