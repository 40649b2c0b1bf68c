"""Pictures that show everywhere: one display bundle holding PNG (and SVG where there is one).

JupyterLab does not render ``image/svg+xml`` or widget views from an untrusted notebook (a fresh
clone is untrusted), and GitHub's notebook viewer shows neither; both show ``image/png``. So every
picture this package puts in a notebook output carries a PNG next to its SVG or its widget view,
and a plain-text line that says what the picture is (never a Python repr).
"""

from __future__ import annotations

import base64
import io

__all__ = ["Picture", "WidgetWithStatic", "attach_static", "describe_widget", "figure_picture",
           "in_notebook", "png_bytes", "svg_text"]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where a widget can be live)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def png_bytes(figure, dpi=90) -> bytes:
    """The figure as PNG bytes; the figure is closed (it lives on only as the picture)."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def svg_text(figure) -> str:
    """The figure as SVG text (the figure stays open)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    return buffer.getvalue()


class Picture:
    """A still picture for a notebook output: PNG, optionally SVG, and a one-line description.

    Its display bundle holds ``image/png`` (shown by GitHub, untrusted notebooks and nbconvert),
    ``image/svg+xml`` when given (sharper, shown by a trusted JupyterLab) and ``text/plain``.

    Attributes:
        png: PNG bytes. svg: SVG text or None. alt: what the picture shows, in words.
    """

    def __init__(self, png: bytes, svg: str | None = None, alt: str = "picture"):
        if not isinstance(png, (bytes, bytearray)) or not bytes(png[:8]) == b"\x89PNG\r\n\x1a\n":
            raise ValueError("Picture: png must be the bytes of a PNG image")
        self.png, self.svg, self.alt = bytes(png), svg, alt

    def bundle(self) -> dict:
        """The display bundle (mimetype -> data)."""
        data = {"text/plain": self.alt, "image/png": base64.b64encode(self.png).decode("ascii")}
        if self.svg is not None:
            data["image/svg+xml"] = self.svg
        return data

    def _repr_mimebundle_(self, include=None, exclude=None):
        return self.bundle()

    def _repr_png_(self):
        return self.png

    def __repr__(self):
        return self.alt


def figure_picture(figure, alt: str, dpi=90) -> Picture:
    """A matplotlib figure as a :class:`Picture` (PNG and SVG); the figure is closed, so the
    inline backend does not draw it a second time."""
    svg = svg_text(figure)
    return Picture(png_bytes(figure, dpi=dpi), svg, alt)


class WidgetWithStatic:
    """A live widget plus a static PNG in one output.

    Its display bundle holds the widget's view (JupyterLab with a kernel shows the slider) and an
    ``image/png`` (nbconvert, GitHub and a notebook opened without a kernel, or untrusted, show the
    picture). Its ``text/plain`` is ``alt``, not the widget's repr.

    Attributes:
        widget: the ipywidgets widget. png: the static picture's bytes. alt: a description.
    """

    def __init__(self, widget, png: bytes, alt: str | None = None):
        self.widget, self.png = widget, png
        self.alt = alt or (f"interactive view ({type(widget).__name__}); the picture shows its "
                           "first state")

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = dict(self.widget._repr_mimebundle_())
        bundle["text/plain"] = self.alt
        bundle["image/png"] = base64.b64encode(self.png).decode("ascii")
        return bundle

    def __repr__(self):
        return f"WidgetWithStatic({type(self.widget).__name__})"


def attach_static(widget, picture: Picture):
    """Give ``widget`` itself (it stays the same ipywidgets object) a display bundle that also
    holds ``picture``: the widget view, its PNG (and SVG), and ``picture.alt`` as plain text.

    Returns the widget.
    """
    own = widget._repr_mimebundle_

    def bundle(include=None, exclude=None, **kwargs):
        data = dict(own(**kwargs) or {})
        data.update(picture.bundle())
        return data

    widget._repr_mimebundle_ = bundle
    widget.static_picture = picture
    return widget


def describe_widget(widget, text: str):
    """Give ``widget`` (it stays the same ipywidgets object) a plain-text line in its display
    bundle instead of its repr: what an untrusted notebook, GitHub or an unrun page shows of a
    widget that has no picture (a calculator, a form). Returns the widget."""
    own = widget._repr_mimebundle_

    def bundle(include=None, exclude=None, **kwargs):
        data = dict(own(**kwargs) or {})
        data["text/plain"] = text
        return data

    widget._repr_mimebundle_ = bundle
    return widget
