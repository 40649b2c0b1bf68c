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

ROOT = pathlib.Path(__file__).resolve().parents[2]
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


# --------------------------------------------------------------------- labels the reader can read
DEFAULT_LABEL_PX = 80      # ipywidgets' --jp-widgets-inline-label-width
CHAR_PX = 7                # a 13 px sans-serif letter is ~7 px wide on average (an underestimate
                           # for capitals: a label this check passes can still be tight)


def _label_width(style: dict):
    """The pixels a control's description gets: ``None`` when it sizes to the text."""
    width = (style or {}).get("description_width", "")
    if width in ("", None):
        return DEFAULT_LABEL_PX
    if width in ("initial", "auto", "max-content", "fit-content"):
        return None
    if width.endswith("px"):
        return float(width[:-2])
    raise AssertionError(f"description_width {width!r} is not in px")


def cut_labels(path) -> list[str]:
    """The saved ipywidgets controls of notebook ``path`` whose description is too long for its
    label (ipywidgets cuts it to ``activation...``)."""
    meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    state = meta.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    models = state.get("state", {})
    cut = []
    for model in models.values():
        saved = model.get("state", {})
        text = saved.get("description", "")
        if not text or "style" not in saved:
            continue
        style = models.get(str(saved["style"]).removeprefix("IPY_MODEL_"), {}).get("state", {})
        room = _label_width(style)
        if room is not None and CHAR_PX * len(text) > room - 4:
            cut.append(f"{model.get('model_name')} {text!r} ({room:g} px for "
                       f"~{CHAR_PX * len(text)} px)")
    return cut


def test_cut_labels_are_found(tmp_path):
    def nb(description, width):
        state = {"s": {"model_name": "SliderStyleModel", "state": {"description_width": width}},
                 "w": {"model_name": "FloatSliderModel",
                       "state": {"description": description, "style": "IPY_MODEL_s"}}}
        path = tmp_path / "x.ipynb"
        path.write_text(json.dumps({"metadata": {"widgets": {
            "application/vnd.jupyter.widget-state+json": {"state": state}}}}))
        return path

    assert cut_labels(nb("ZeRO stage", "")) == []
    assert cut_labels(nb("activations GB", "")) == [
        "FloatSliderModel 'activations GB' (80 px for ~98 px)"]
    assert cut_labels(nb("activations GB", "120px")) == []
    assert cut_labels(nb("activations GB", "initial")) == []


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_saved_controls_show_their_whole_label(path):
    cut = cut_labels(path)
    assert not cut, (f"{path.relative_to(ROOT)}: these controls' labels are cut (give them "
                     f"style={{'description_width': ...}} wide enough): {cut}")
