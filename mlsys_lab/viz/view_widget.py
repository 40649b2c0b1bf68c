"""The machinery the package's anywidget views share (the explorer and the timeline).

A :class:`ViewWidget` runs an ES module from ``static/`` (shipped in this package: nothing comes
from a CDN) and its display bundle holds, next to the widget view, the still picture of its state
(:meth:`picture`: PNG and maybe SVG, what GitHub, an untrusted notebook and nbconvert show) and
its data under its own ``MIMETYPE`` (:meth:`saved_state`: what ``mlsys-lab export`` turns back
into a live view without a kernel). Without ``anywidget`` installed :data:`ViewWidget` is None
and the callers return their static pictures.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC", "ViewWidget", "traitlets"]

STATIC = Path(__file__).with_name("static")

try:
    import anywidget
    import traitlets
except ImportError:  # the static pictures still work
    anywidget = traitlets = None

if anywidget is None:
    ViewWidget = None
else:
    class ViewWidget(anywidget.AnyWidget):
        """An anywidget whose display bundle also carries its picture and its saved data.

        Subclasses set ``_esm``/``_css`` (files in :data:`STATIC`) and ``MIMETYPE``, and define
        :meth:`picture` and :meth:`saved_state`."""

        MIMETYPE = ""

        def picture(self):
            """The still picture (a :class:`~mlsys_lab.viz.picture.Picture`) of the state."""
            raise NotImplementedError

        def saved_state(self) -> dict:
            """The JSON-able data the offline page boots the view from."""
            raise NotImplementedError

        def _repr_mimebundle_(self, **kwargs):
            bundle = super()._repr_mimebundle_(**kwargs)
            data, meta = bundle if isinstance(bundle, tuple) else (bundle, {})
            data = dict(data)
            data.update(self.picture().bundle())
            data[self.MIMETYPE] = self.saved_state()
            return (data, meta) if meta else data
