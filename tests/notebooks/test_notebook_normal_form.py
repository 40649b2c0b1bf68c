"""Every committed notebook is in JupyterLab's normal form (issue 17), so opening and saving it in
Lab leaves it byte-identical. To fix a failure: ``python -m mlsys_lab.notebook_format``."""

import json

import nbformat
import pytest

from mlsys_lab import notebook_format as nf
from mlsys_lab.reader.catalogue import project_root

NOTEBOOKS = nf.committed_notebooks(project_root())


def test_every_folder_is_covered():
    folders = {p.parent.name for p in NOTEBOOKS}
    assert {"chapters", "solutions", "exercises"} <= folders
    assert any(p.name == "index.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebook_is_in_normal_form(path):
    assert nf.is_normal(path), (f"{path} is not in normal form; run: "
                                f"python -m mlsys_lab.notebook_format {path}")


def _nb(**metadata):
    nb = nbformat.v4.new_notebook(metadata=metadata)
    nb.cells = [nbformat.v4.new_code_cell("print(1)"), nbformat.v4.new_markdown_cell("# 中文")]
    nb.cells[0].outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="a 10%\r"),
        nbformat.v4.new_output("stream", name="stdout", text="a 100%\nend\n"),
        nbformat.v4.new_output("stream", name="stderr", text="warn\n"),
    ]
    nb.cells[0].metadata["execution"] = {"iopub.execute_input": "2026-01-01T00:00:00Z"}
    nb.cells[0].outputs.append(nbformat.v4.new_output(
        "display_data", data={"application/json": {"w": 36.0, "x": 0.5, "y": 1e-05, "z": 1e21}}))
    return nb


def test_normalise_does_what_lab_does():
    nb = _nb(kernelspec={"display_name": "Python 3", "language": "python", "name": "python3"})
    del nb.cells[1]["id"]
    text = nf.normal_text(nb)
    data = json.loads(text)
    assert text.endswith("}\n") and text.startswith('{\n "cells": [\n')   # indent 1, newline
    assert "中文" in text                                                  # not \\u escaped
    assert data["metadata"]["kernelspec"]["display_name"] == "Python 3 (ipykernel)"
    assert data["metadata"]["language_info"]["version"] == nf.PYTHON_VERSION
    assert data["nbformat_minor"] == 5 and all(c.get("id") for c in data["cells"])
    outs = data["cells"][0]["outputs"]
    assert [o.get("name") for o in outs] == ["stdout", "stderr", None]     # merged like Lab
    assert "".join(outs[0]["text"]) == "a 100%\nend\n"                     # \r resolved
    assert "execution" not in data["cells"][0]["metadata"]
    assert '"w": 36,' in text and '"x": 0.5,' in text and '"y": 1e-05,' in text   # as Lab writes
    assert '"z": 1e+21' in text
    assert nf.normal_text(json.loads(text)) == text                         # idempotent


def test_lab_stream_rules():
    r = nf.resolve_overwrites
    assert r("10%|#  |\r50%|## |\r100%|###|\n") == "100%|###|\n"
    assert r("hello\rHi\n") == "Hillo\n"          # overwrite in place, as a terminal does
    assert r("ab\bc\n") == "ac\n"
    assert r("a\r\nb\n") == "a\nb\n"


def test_check_command_reports_and_fixes(tmp_path, capsys):
    path = tmp_path / "x.ipynb"
    nbformat.write(_nb(), str(path))
    assert nf.main(["--check", str(path)]) == 1
    assert "python -m mlsys_lab.notebook_format" in capsys.readouterr().out
    assert nf.main([str(path)]) == 0 and nf.is_normal(path)
    before = path.read_bytes()
    assert nf.main([str(path)]) == 0 and path.read_bytes() == before
    assert nf.main(["--check", str(path)]) == 0


# ---------------------------------------------------------------------- outputs that show nothing
def _blank(value) -> bool:
    """A string (or nbformat's list of lines) that draws nothing: empty or whitespace only."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = "".join(value)
    return isinstance(value, str) and not value.strip()


def blank_outputs(nb) -> list[str]:
    """Where ``nb`` holds an output that shows the reader nothing, as ``"cell N (execution
    count E): what"``: a stream output that is empty or whitespace only (in JupyterLab an empty
    stderr block is a pink bar with nothing in it, e.g. what ``tqdm(leave=False)`` leaves), or a
    ``display_data`` / ``execute_result`` whose every representation is blank text."""
    found = []
    for i, cell in enumerate(nb["cells"]):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            kind = out.get("output_type")
            if kind == "stream" and _blank(out.get("text", "")):
                what = f"blank {out.get('name')} stream {''.join(out.get('text', ''))!r:.40}"
            elif kind in ("display_data", "execute_result") and \
                    all(_blank(v) for v in out.get("data", {}).values()):
                what = f"blank {kind} ({', '.join(out.get('data', {})) or 'no data'})"
            else:
                continue
            found.append(f"cell {i} (execution count {cell.get('execution_count')}): {what}")
    return found


def test_blank_outputs_are_found():
    nb = _nb()
    assert blank_outputs(nb) == []
    outs = nb.cells[0].outputs
    outs.append(nbformat.v4.new_output("stream", name="stderr", text="\r   \n"))
    outs.append(nbformat.v4.new_output("execute_result", data={"text/plain": ""}))
    outs.append(nbformat.v4.new_output("display_data", data={}))
    outs.append(nbformat.v4.new_output("display_data", data={"text/plain": "",
                                                             "image/png": "iVBORw0KGgo="}))
    found = blank_outputs(nb)
    assert len(found) == 3, found
    assert "blank stderr stream" in found[0] and "execution count" in found[0]
    assert "blank execute_result (text/plain)" in found[1] and "no data" in found[2]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebook_has_no_blank_outputs(path):
    found = blank_outputs(json.loads(path.read_text(encoding="utf-8")))
    assert not found, (f"{path.relative_to(project_root())} holds outputs that show the reader "
                       f"nothing (an empty stream is an empty bar in JupyterLab): {found}")


# ---------------------------------------------------------------------- pictures drawn too coarse
MIN_DPI = 90       # the package draws its pictures at 90 dpi (viz.picture.png_bytes)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_notebook_draws_no_figure_below_the_package_dpi(path):
    """A figure drawn at ``dpi=60`` (chapter 9's augmentation grid was) is blurry and tiny."""
    import re

    nb = json.loads(path.read_text(encoding="utf-8"))
    low = [f"cell {i}: dpi={d}" for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
           for d in re.findall(r"\bdpi\s*=\s*(\d+)", "".join(c["source"])) if int(d) < MIN_DPI]
    assert not low, f"{path.relative_to(project_root())} draws below {MIN_DPI} dpi: {low}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_nbval_markers_are_cell_tags_not_comments(path):
    """nbval's checked cells carry the tag ``nbval-check-output``; the reader's code does not
    start with ``# NBVAL_CHECK_OUTPUT`` (nbval reads both; only the tag stays out of sight)."""
    nb = nbformat.read(path, as_version=4)
    commented = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
        line.strip().startswith("# NBVAL_") for line in c.source.splitlines())]
    assert not commented, f"{path.name}: cells {commented} carry an nbval comment; tag them"
    if path.parent.name == "chapters":   # every chapter checks some of its numbers
        assert any("nbval-check-output" in c.metadata.get("tags", []) for c in nb.cells)
