"""Formulas in the offline pages (issue 17): every formula of every committed chapter is drawn by
mathtext (no TeX source left for a reader without MathJax), including the LaTeX mathtext lacks
and the exporter rewrites (matrices, ``\\bmod``/``\\pmod``)."""

import json
import re

import matplotlib
import pytest

matplotlib.use("Agg")

from mlsys_lab.reader.catalogue import chapters, project_root  # noqa: E402
from mlsys_lab.viz import math_picture as mp  # noqa: E402

ROOT = project_root()


def _size(tex):
    drawn = mp.tex_svg(tex)
    assert drawn is not None, f"mathtext cannot draw {tex!r}"
    return drawn[1], drawn[2]          # width, height in points


def test_matrices_are_drawn_as_columns_of_stacked_entries():
    one_row = _size(r"\begin{bmatrix}1&1&1&0\end{bmatrix}")
    two_rows = _size(r"\begin{bmatrix}1&1&1&0\\0&1&-1&-1\end{bmatrix}")
    three_rows = _size(r"\begin{pmatrix}1&2\\3&4\\5&6\end{pmatrix}")
    single = _size("1")
    assert two_rows[1] > 1.6 * one_row[1] and three_rows[1] > two_rows[1]   # rows stack up
    assert one_row[0] > 4 * single[0]                                        # columns sit apart
    # every entry is in the drawing, column by column, top to bottom (a swapped row/column
    # reading would order them differently)
    normal = mp._normal(r"\begin{bmatrix}a&b\\c&d\end{bmatrix}")
    assert re.findall(r"\{([abcd])\}", normal) == ["a", "c", "b", "d"]
    assert normal.startswith(r"\left[") and normal.endswith(r"\right]")
    assert mp._normal(r"\begin{vmatrix}a\end{vmatrix}").startswith(r"\left|")
    ragged = mp._normal(r"\begin{bmatrix}a&b\\c\end{bmatrix}")   # a short row is padded
    assert mp.tex_svg(r"\begin{bmatrix}a&b\\c\end{bmatrix}") is not None and "{c}" in ragged


def test_mod_operators_are_upright_words():
    for tex in (r"(c \bmod 16)", r"x \equiv 1 \pmod{7}", r"a \mod b"):
        assert mp.tex_svg(tex) is not None, tex
        assert r"\mathrm{mod}" in mp._normal(tex) and r"\bmod" not in mp._normal(tex)
    assert r"\mathrm{mod}\ 7)" in mp._normal(r"\pmod{7}")
    assert mp._normal(r"\model") == r"\model"          # only the whole command is rewritten


def _formulas(markdown):
    return [m.group(0) for m in mp._MATH.finditer(mp._CODE.sub("", markdown))]


@pytest.mark.parametrize("path", [c.notebook for c in chapters(ROOT)])
def test_every_formula_of_every_chapter_renders_offline(path):
    nb = json.loads((ROOT / path).read_text(encoding="utf-8"))
    found = drawn = 0
    left = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        found += len(_formulas(source))
        out = mp.render_math(source)
        drawn += out.count('<img class="mlsys-math"')
        left += _formulas(out)            # what is still TeX source after rendering
    assert not left, f"{path}: formulas left as TeX source offline: {left[:5]}"
    assert drawn == found, (path, drawn, found)
