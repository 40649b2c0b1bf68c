"""TeX as pictures, for pages without MathJax (``mlsys-lab export`` loads nothing from a CDN).

:func:`tex_svg` draws one formula with matplotlib's mathtext (no LaTeX installation needed);
:func:`render_math` replaces the ``$...$`` and ``$$...$$`` of a Markdown text by inline SVG
images (alt text: the TeX source), leaving code spans and fences alone. Mathtext covers most of
the chapters' formulas; the LaTeX it lacks is rewritten first into notation it draws: ``\\text``
as ``\\mathrm``, ``\\tfrac`` as ``\\frac``, ``\\big`` delimiters as plain ones, ``\\bmod`` and
``\\pmod`` as an upright "mod", and matrices (``bmatrix``, ``pmatrix``, ...) as columns of stacked
entries between stretched fences. A formula it still cannot draw stays as TeX source (a test
checks that no committed chapter has one).
"""

from __future__ import annotations

import base64
import functools
import html
import io
import re

__all__ = ["render_math", "tex_svg"]

_CODE = re.compile(r"```.*?```|~~~.*?~~~|`[^`\n]*`", re.S)
_MATH = re.compile(r"\$\$([^$\x00]+?)\$\$"                                  # display
                   r"|(?<![\\$\w])\$(?![\s$])([^$\x00\n]+?)(?<![\s\\$])\$(?!\w)")  # inline
_REWRITES = (
    (re.compile(r"\\(?:text|textrm|operatorname)\{"), r"\\mathrm{"),
    (re.compile(r"\\[td]frac(?![a-zA-Z])"), r"\\frac"),
    (re.compile(r"\\frac\s*(\d)\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\[bB]igg?[lr]?(?![a-zA-Z])"), ""),
    (re.compile(r"\\(mathsf|mathbb|mathrm|mathcal|mathbf)\s*([A-Za-z0-9])"), r"\\\1{\2}"),
    (re.compile(r"\\pmod\s*\{([^{}]*)\}"), r"\\ (\\mathrm{mod}\\ \1)"),
    (re.compile(r"\\b?mod(?![a-zA-Z])"), r"\\,\\mathrm{mod}\\,"),
    (re.compile(r"\s*\n\s*"), " "),
)


_MATRIX = re.compile(r"\\begin\{([bpBvV]?matrix)\}(.*?)\\end\{\1\}", re.S)
_FENCES = {"matrix": ("", ""), "bmatrix": ("[", "]"), "pmatrix": ("(", ")"),
           "Bmatrix": (r"\{", r"\}"), "vmatrix": ("|", "|"), "Vmatrix": (r"\Vert", r"\Vert")}


def _stack(entries):
    """One column of a matrix as nested rule-less fractions (mathtext has no arrays)."""
    if len(entries) == 1:
        return "{" + entries[0] + "}"
    return r"\genfrac{}{}{0}{0}{" + entries[0] + "}{" + _stack(entries[1:]) + "}"


def _matrix(match) -> str:
    """A ``\\begin{bmatrix} ... \\end{bmatrix}`` (and its p/B/v/V/plain kin) in notation mathtext
    draws: each column a stack of its entries, centred like LaTeX's, between stretched fences."""
    rows = [[cell.strip() or r"\,"
             for cell in row.split("&")] for row in re.split(r"\\\\", match.group(2))
            if row.strip()]
    width = max(len(row) for row in rows)
    rows = [row + [r"\,"] * (width - len(row)) for row in rows]
    columns = r"\quad ".join(_stack([row[j] for row in rows]) for j in range(width))
    left, right = _FENCES[match.group(1)]
    if not left:
        return "{" + columns + "}"
    return rf"\left{left}\,{columns}\,\right{right}"


def _normal(tex: str) -> str:
    tex = _MATRIX.sub(_matrix, tex)
    for pattern, replacement in _REWRITES:
        tex = pattern.sub(replacement, tex)
    return tex.strip()


@functools.lru_cache(maxsize=1024)
def tex_svg(tex: str, size: float = 11.0):
    """``(svg_text, width_pt, height_pt, depth_pt)`` of formula ``tex`` (without dollars), or
    None when mathtext cannot draw it. ``depth`` is how far the formula reaches below its
    baseline (for ``vertical-align``)."""
    import matplotlib
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.mathtext import MathTextParser

    source = f"${_normal(tex)}$"
    prop = FontProperties(size=size)
    try:
        width, height, depth, _, _ = MathTextParser("path").parse(source, dpi=72, prop=prop)
    except Exception:  # mathtext's ParseFatalException / ValueError: keep the TeX source
        return None
    fig = Figure(figsize=(width / 72.0, height / 72.0))
    fig.text(0, depth / height, source, fontproperties=prop)
    buffer = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "mlsys-math"}):
        fig.savefig(buffer, format="svg", transparent=True, metadata={"Date": None})
    return buffer.getvalue().decode("utf-8"), width, height, depth


def _img(tex: str, display: bool):
    drawn = tex_svg(tex, 13.0 if display else 11.0)
    if drawn is None:
        return None
    svg, width, height, depth = drawn
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    place = "display:block;margin:0.5em auto" if display else f"vertical-align:{-depth:.2f}pt"
    return (f'<img class="mlsys-math" alt="{html.escape(tex.strip(), quote=True)}" '
            f'style="width:{width:.1f}pt;height:{height:.1f}pt;{place}" '
            f'src="data:image/svg+xml;base64,{data}">')


def render_math(markdown: str) -> str:
    """``markdown`` with each ``$...$`` / ``$$...$$`` drawn as an inline SVG image (code spans and
    fences untouched; a formula mathtext cannot draw is left as it is)."""
    kept = []

    def keep(match):
        kept.append(match.group(0))
        return f"\x00{len(kept) - 1}\x00"

    def draw(match):
        display = match.group(1) is not None
        img = _img(match.group(1) if display else match.group(2), display)
        return img if img is not None else match.group(0)

    text = _MATH.sub(draw, _CODE.sub(keep, markdown))
    return re.sub(r"\x00(\d+)\x00", lambda m: kept[int(m.group(1))], text)
