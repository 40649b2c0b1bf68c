"""Every committed notebook's saved widgets run the package's current front end.

Each anywidget view (the explorer, the timeline) saves a copy of its ES module and its CSS in
the notebook's widget state when the notebook is executed, and JupyterLab runs that copy when
the reader opens the notebook. A change to ``mlsys_lab/viz/static/*.js`` or ``*.css`` that is
not followed by re-executing the chapters that show the view leaves readers with the old front
end; this test names those notebooks.
"""

import importlib
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted([*(ROOT / "chapters").glob("*.ipynb"), *(ROOT / "solutions").glob("*.ipynb")])


def _saved_views(path):
    """(model id, class path, saved state) of every anywidget view saved in the notebook."""
    meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    state = meta.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for model_id, model in state.get("state", {}).items():
        saved = model.get("state", {})
        if "_esm" in saved:
            yield model_id, saved.get("_anywidget_id", ""), saved


def _source(value):
    return value.read_text(encoding="utf-8") if isinstance(value, pathlib.Path) else str(value)


def _current(class_path):
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return _source(cls._esm), _source(getattr(cls, "_css", ""))


def test_some_notebooks_save_views():
    # the check below must have something to check: chapters 04, 07 and 11 show views
    assert sum(1 for p in NOTEBOOKS for _ in _saved_views(p)) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_saved_views_match_the_package_front_end(path):
    stale = []
    for model_id, class_path, saved in _saved_views(path):
        assert class_path.startswith("mlsys_lab."), (
            f"{path.name}: widget {model_id} is {class_path!r}, not one of the package's views")
        esm, css = _current(class_path)
        for what, now, then in (("ES module", esm, saved["_esm"]),
                                ("CSS", css, saved.get("_css", ""))):
            if now != then:
                stale.append(f"{class_path.rpartition('.')[2]} {model_id[:8]}: its {what}")
    assert not stale, (f"{path.relative_to(ROOT)} saved an older front end than "
                       f"mlsys_lab/viz/static holds ({'; '.join(stale)}): re-execute the notebook")
