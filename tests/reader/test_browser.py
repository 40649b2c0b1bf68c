"""The reader's first look, in a real browser (issue 17).

JupyterLab runs on 127.0.0.1 over a copy of the committed notebooks, untrusted as on a fresh clone,
and the system's Chromium (Debian's ``chromium`` + ``chromium-driver``; no browser download)
opens each chapter: no output may show a placeholder repr instead of its picture, every image must
load, and saving the notebook must leave the file byte-identical (the normal form). The chapters
holding widgets are then run in the browser and every widget is driven (slider moved, planner
picked, node clicked, rectangle hovered; every schedule, pipeline and cluster timeline of chapters
04, 07 and 11 hovered and clicked) and must change its picture or readout. Last, the offline HTML
export is loaded with the network off: its explorer and every saved timeline must work. A
missing browser fails these tests; it never skips them. Screenshots go to
``tests/artifacts/browser/``.
"""

from __future__ import annotations

import hashlib
import json
import platform
import re
import shutil
import time
from pathlib import Path

import pytest

from mlsys_lab import notebook_format as nf
from mlsys_lab.reader import browser as B
from mlsys_lab.reader.catalogue import chapters, project_root

ROOT = project_root()
ARTIFACTS = ROOT / "tests" / "artifacts" / "browser"
CHAPTERS = [c.notebook for c in chapters(ROOT)]
PLACEHOLDERS = ("<graph drawing", "interactive(children=", "Image(value=", "VBox(children=",
                "HBox(children=", "Error displaying widget", "Loading widget", "object at 0x",
                "<IPython.core.display")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _widget_chapters():
    found = []
    for path in CHAPTERS:
        nb = json.loads((ROOT / path).read_text(encoding="utf-8"))
        if any(WIDGET_VIEW in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", [])):
            found.append(path)
    return found


def _shot(driver, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.png"))


def _wait(driver, condition, timeout, what):
    return B.wait_for(driver, condition, what, timeout, poll=0.25,
                      on_timeout=lambda: _shot(driver, "timeout-" + what))


def test_chromium_and_its_driver_are_installed():
    browser, driver = B.find_browser()    # raises BrowserNotFound (a failure, not a skip)
    assert Path(browser).exists() and Path(driver).exists()


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """The notebooks as a fresh clone has them (a copy: saving must not touch the checkout)."""
    root = tmp_path_factory.mktemp("clone")
    for folder in ("chapters", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, root / folder,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "*.npz", "__pycache__"))
    shutil.copy(ROOT / "index.ipynb", root / "index.ipynb")
    for data in ("tests/data",):     # chapters may read committed data next to the checkout
        if (ROOT / data).is_dir():
            shutil.copytree(ROOT / data, root / data)
    return root


@pytest.fixture(scope="module")
def lab(clone):
    with B.jupyter_lab(clone) as server:
        yield server


@pytest.fixture(scope="module")
def driver():
    with B.chromium() as d:
        yield d


# ----------------------------------------------------------------------------------- JupyterLab
_KERNEL_IDLE = """const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) '
  + '~ * [data-status], [data-status]'); return s && s.getAttribute('data-status') === 'idle';"""
_DIALOG = "const d = document.querySelector('.jp-Dialog'); return d ? d.innerText : '';"
_OUTPUTS = """const w = window.jupyterapp.shell.currentWidget;
if (!w || !w.content || !w.content.model || !w.context.isReady) return null;
let outputs = 0, trusted = 0;
for (const cell of w.content.model.cells) {
  if (cell.type !== 'code') continue;
  outputs += cell.outputs.length;
  if (cell.outputs.length && cell.trusted) trusted += 1;
}
return {outputs, trusted, rendered: w.node.querySelectorAll('.jp-OutputArea-output').length};"""
_IMAGES = """const w = window.jupyterapp.shell.currentWidget;
const imgs = [...w.node.querySelectorAll('.jp-OutputArea-output img')];
return {n: imgs.length, broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length};"""
# textContent, not innerText: cells out of view are not laid out (content-visibility), and
# innerText is empty there.
_TEXTS = """const w = window.jupyterapp.shell.currentWidget;
return [...w.node.querySelectorAll('.jp-OutputArea-output')].map(o => o.textContent || '');"""


def _open(driver, lab, path):
    driver.get(lab.url(path))
    _wait(driver, "return !!(window.jupyterapp && window.jupyterapp.shell.currentWidget"
                  " && window.jupyterapp.shell.currentWidget.context"
                  " && window.jupyterapp.shell.currentWidget.context.isReady);", 90,
          f"{path} to open")
    _wait(driver, "const w = window.jupyterapp.shell.currentWidget; const k = w.sessionContext;"
                  " return k && k.session && k.session.kernel && "
                  "k.session.kernel.status === 'idle';", 90, f"{path}'s kernel")
    dialog = driver.execute_script(_DIALOG)
    assert not dialog, f"{path}: a dialog opened: {dialog}"


def _stop_kernels(lab):
    """Shut every kernel session down through the server's REST API (navigating away leaves
    them running)."""
    import urllib.request

    def call(method, url):
        request = urllib.request.Request(f"{lab.base}{url}?token={lab.token}", method=method)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.read()

    for session in json.loads(call("GET", "/api/sessions") or b"[]"):
        call("DELETE", f"/api/sessions/{session['id']}")


def _images_in_file(path: Path) -> int:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return sum(1 for c in nb["cells"] for o in c.get("outputs", [])
               if any(k.startswith("image/") for k in o.get("data", {})))


@pytest.mark.parametrize("path", CHAPTERS + ["index.ipynb"])
def test_opens_untrusted_with_every_picture_and_saves_unchanged(driver, lab, clone, path):
    _open(driver, lab, path)
    state = _wait(driver, _OUTPUTS + "", 60, f"{path}'s outputs")
    assert state["trusted"] == 0, f"{path}: outputs are trusted; a fresh clone's are not"
    _wait(driver, _OUTPUTS.replace("return {outputs", "return (w.node.querySelectorAll("
                                   "'.jp-OutputArea-output').length >= outputs) && {outputs"),
          60, f"{path}'s outputs to render")
    texts = driver.execute_script(_TEXTS)
    bad = [t[:120] for t in texts if any(p in t for p in PLACEHOLDERS)]
    assert not bad, f"{path}: outputs show a placeholder instead of a picture: {bad}"
    want = _images_in_file(clone / path)
    images = _wait(driver, _IMAGES.replace("return {n", "if (imgs.some(i => !i.complete)) "
                                           "return null; return {n"), 30, f"{path}'s images")
    assert images["n"] >= want and images["broken"] == 0, (path, images, want)
    driver.execute_script("const i = window.jupyterapp.shell.currentWidget.node.querySelector"
                          "('.jp-OutputArea-output img');"
                          " if (i) i.scrollIntoView({block: 'center'});")
    time.sleep(0.3)
    _shot(driver, f"open-{Path(path).stem}")
    before = (clone / path).read_bytes()
    driver.execute_script("window.jupyterapp.commands.execute('docmanager:save'); return 1;")
    _wait(driver, "const w = window.jupyterapp.shell.currentWidget;"
                  " return !w.context.model.dirty && !w.title.className.includes('jp-mod-dirty');",
          30, f"{path} to save")
    time.sleep(0.5)
    _stop_kernels(lab)
    after = (clone / path).read_bytes()
    assert _as_committed(after) == before, (
        f"{path}: JupyterLab rewrote it on save ({len(before)} -> {len(after)} bytes); put it "
        f"in normal form: python -m mlsys_lab.notebook_format {path}")


def _as_committed(saved: bytes, running: str = platform.python_version()) -> bytes:
    """What Lab saved, with the running kernel's Python version (this interpreter's, which Lab
    writes into ``language_info.version``) put back to the normal form's ``PYTHON_VERSION``: the
    one change a reader on another Python sees (``mlsys_lab.notebook_format``)."""
    return saved.replace(f'"version": "{running}"'.encode(),
                         f'"version": "{nf.PYTHON_VERSION}"'.encode())


def test_the_save_check_forgives_the_kernel_version_and_nothing_else():
    raw = (ROOT / CHAPTERS[0]).read_bytes()
    committed = f'"version": "{nf.PYTHON_VERSION}"'.encode()
    other_python = raw.replace(committed, b'"version": "3.12.1"')
    assert other_python != raw and _as_committed(other_python, "3.12.1") == raw
    assert _as_committed(other_python, "3.13.0") != raw  # only the running Python's is forgiven
    for changed in (raw.replace(b'"nbformat_minor": ', b'"nbformat_minor": 1'),
                    raw.replace(b'"execution_count": 1,', b'"execution_count": 2,', 1),
                    raw.replace(b'"codemirror_mode": {', b'"codemirror_mode":  {')):
        assert changed != raw and _as_committed(changed, "3.12.1") != raw


# ----------------------------------------------------------------------------- driving widgets
_RUN_DONE = """const w = window.jupyterapp.shell.currentWidget;
const k = w.sessionContext.session.kernel;
if (k.status !== 'idle') return false;
for (const cell of w.content.model.cells)
  if (cell.type === 'code' && cell.sharedModel.source.trim() && cell.executionCount === null)
    return false;
return !w.node.querySelector('.jp-InputArea-prompt') ||
  ![...w.node.querySelectorAll('.jp-InputArea-prompt')].some(p => p.innerText.includes('*'));"""
_ERRORS = """const w = window.jupyterapp.shell.currentWidget;
const sel = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]';
return [...w.node.querySelectorAll(sel)]
  .map(e => e.innerText).filter(t => t.includes('Traceback') || t.includes('Error'));"""


def _fingerprint(element) -> str:
    return hashlib.sha1(element.get_attribute("innerHTML").encode()).hexdigest()


def _changes(driver, element, action, what, timeout=20):
    before = _fingerprint(element)
    action()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _fingerprint(element) != before:
            return
        time.sleep(0.2)
    _shot(driver, "unchanged-" + what)
    raise AssertionError(f"{what}: the picture did not change")


def _drive_ipywidgets(driver, stem):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    driven = 0
    top = ".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output"
    for i in range(len(driver.find_elements(By.CSS_SELECTOR, top))):
        out = driver.find_elements(By.CSS_SELECTOR, top)[i]
        controls = ".widget-slider .noUi-handle, .widget-hslider .noUi-handle"
        if not out.find_elements(By.CSS_SELECTOR, controls + ", .widget-dropdown select"):
            continue
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", out)
        for h in out.find_elements(By.CSS_SELECTOR, controls):
            _changes(driver, out, lambda h=h: h.send_keys(Keys.ARROW_RIGHT), f"{stem} slider {i}")
            driven += 1
        for s in out.find_elements(By.CSS_SELECTOR, ".widget-dropdown select"):
            count = len(Select(s).options)
            assert count > 1, f"{stem}: dropdown {i} offers one choice"
            _changes(driver, out, lambda s=s, n=count: Select(s).select_by_index(n - 1),
                     f"{stem} dropdown {i}")
            driven += 1
        time.sleep(0.5)
        out.screenshot(str(ARTIFACTS / f"widget-{stem}-{i}.png"))
    return driven


_VISIBLE_OP = """const root = arguments[0];
const pane = root.querySelector('.mx-graph').getBoundingClientRect();
const ops = [...root.querySelectorAll('.mx-node.mx-op')].filter(g => {
  const r = g.getBoundingClientRect();
  return r.top > pane.top && r.bottom < pane.bottom && r.left > pane.left && r.right < pane.right;
});
return ops[Math.floor(ops.length / 2)] || null;"""


def _visible_op(driver, root):
    """An op node of the explorer that is on screen (the middle one of those)."""
    op = driver.execute_script(_VISIBLE_OP, root)
    assert op is not None, "no op node of the explorer is visible"
    return op


def _drive_explorers(driver, stem):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driven = 0
    for i, root in enumerate(driver.find_elements(By.CSS_SELECTOR, ".mlsys-explorer[data-ready]")):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", root)
        live = lambda root=root: len(root.find_elements(By.CSS_SELECTOR, ".mx-live"))  # noqa: E731
        target = _visible_op(driver, root)
        key = target.get_attribute("data-key")
        ActionChains(driver).move_to_element(target).click().perform()
        _wait(driver, f"return document.querySelectorAll('.mlsys-explorer')[{i}]"
                      f".getAttribute('data-selected') === '{key}';", 10, "explorer click")
        assert root.find_elements(By.CSS_SELECTOR, ".mx-input"), "clicked op: no inputs outlined"
        title = target.find_element(By.TAG_NAME, "title").get_attribute("textContent")
        step = int(root.get_attribute("data-step"))
        assert f"(step {step}," in title, (title, step)      # clicking an op moves the schedule
        lives = {step: live()}
        slider = root.find_element(By.CSS_SELECTOR, ".mx-step")
        width = slider.size["width"]
        seen = [root.get_attribute("data-step")]
        for fraction in (0.1, 0.35, 0.6, 0.9):        # click along the slider's track
            ActionChains(driver).move_to_element_with_offset(
                slider, int((fraction - 0.5) * width), 0).click().perform()
            time.sleep(0.3)
            seen.append(root.get_attribute("data-step"))
            lives[int(root.get_attribute("data-step"))] = live()
        assert len(lives) >= 3, f"{stem}: the explorer's slider does not move the step {seen}"
        assert len(set(lives.values())) > 1, f"{stem}: the live tensors never change {lives}"
        picker = root.find_elements(By.CSS_SELECTOR, ".mx-planner")
        if picker:
            rects = lambda root=root: [r.get_attribute("y") for r in  # noqa: E731
                                       root.find_elements(By.CSS_SELECTOR, ".mx-rect")]
            first = rects()
            names = [o.get_attribute("value") for o in Select(picker[0]).options]
            assert "naive" in names
            Select(picker[0]).select_by_value("naive")
            assert root.get_attribute("data-planner") == "naive" and rects() != first
            rect = root.find_elements(By.CSS_SELECTOR, ".mx-rect")[1]
            ActionChains(driver).move_to_element(rect).perform()
            info = root.find_element(By.CSS_SELECTOR, ".mx-info").text
            assert "produced by" in info and "last read by" in info, info
            assert root.find_elements(By.CSS_SELECTOR, ".mx-hovered"), "graph not linked"
        root.screenshot(str(ARTIFACTS / f"explorer-{stem}-{i}.png"))
        driven += 1
    return driven


_VISIBLE_BAR = """const root = arguments[0];
const pane = root.querySelector('.tl-scroll').getBoundingClientRect();
const bars = [...root.querySelectorAll('.tl-item')].filter(b => {
  const r = b.getBoundingClientRect();
  return r.width > 6 && r.top >= pane.top && r.bottom <= pane.bottom && r.left >= pane.left
    && r.right <= pane.right && r.top >= 0 && r.bottom <= window.innerHeight;
});
return bars[Math.floor(bars.length / 2)] || null;"""


def _drive_timelines(driver, stem, kernel=True):
    """Hover a bar (its op/message is named), click it (selected, the time cursor on it, the bars
    running then outlined) and, with a kernel, move a control (the view is rebuilt)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driven = 0
    for i, root in enumerate(driver.find_elements(By.CSS_SELECTOR, ".mlsys-timeline[data-ready]")):
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", root)
        time.sleep(0.2)
        bar = driver.execute_script(_VISIBLE_BAR, root)
        assert bar is not None, f"{stem}: timeline {i} shows no bar"
        key = bar.get_attribute("data-key")
        named = bar.find_element(By.TAG_NAME, "title").get_attribute("textContent")
        info = root.find_element(By.CSS_SELECTOR, ".tl-info")
        idle = info.text
        ActionChains(driver).move_to_element(bar).perform()
        assert root.get_attribute("data-hovered") == key and info.text == named != idle, \
            (stem, key, info.text)
        ActionChains(driver).click().perform()
        _wait(driver, f"return document.querySelectorAll('.mlsys-timeline[data-ready]')[{i}]"
                      f".getAttribute('data-selected') === '{key}';", 10, "timeline click")
        assert "tl-selected" in bar.get_attribute("class")
        assert int(root.get_attribute("data-at-cursor")) >= 1       # the clicked bar runs then
        assert float(root.get_attribute("data-cursor")) >= 0
        away = root.find_element(By.CSS_SELECTOR, ".tl-title")
        ActionChains(driver).move_to_element(away).perform()       # away: the selection shows
        assert info.text.startswith("selected: " + named), info.text
        ranges = root.find_elements(By.CSS_SELECTOR, "input.tl-input[type=range]")
        if ranges and kernel:
            count = root.get_attribute("data-bars")
            driver.execute_script("const r = arguments[0];"
                                  " r.value = Math.max(+r.min, +r.value - 2);"
                                  " r.dispatchEvent(new Event('change'));", ranges[-1])
            _wait(driver, "const r = document.querySelectorAll('.mlsys-timeline[data-ready]')"
                          f"[{i}]; return r && r.getAttribute('data-bars') !== '{count}';", 30,
                  "timeline rebuilt from its control")
            root = driver.find_elements(By.CSS_SELECTOR, ".mlsys-timeline[data-ready]")[i]
        time.sleep(0.3)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        root.screenshot(str(ARTIFACTS / f"timeline-{stem}-{i}.png"))
        driven += 1
    return driven


@pytest.mark.parametrize("path", _widget_chapters())
def test_widget_chapters_run_and_every_widget_responds(driver, lab, path):
    stem = Path(path).stem
    _open(driver, lab, path)
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells'); return 1;")
    time.sleep(2)
    _wait(driver, _RUN_DONE, 240, f"{path} to run")
    errors = driver.execute_script(_ERRORS)
    assert not errors, f"{path}: cells failed in the browser: {errors[:2]}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    driven = _drive_ipywidgets(driver, stem) + _drive_explorers(driver, stem)
    timelines = _drive_timelines(driver, stem)
    assert driven + timelines >= 1, f"{path}: no widget found to drive"
    source = (ROOT / path).read_text(encoding="utf-8")
    calls = sum(source.count(f"{name}(") for name in
                ("pipeline_widget", "timeline_widget", "schedule_widget"))
    assert timelines >= calls, f"{path}: {timelines} of {calls} timeline widgets driven"
    _shot(driver, f"ran-{stem}")
    _stop_kernels(lab)


# ------------------------------------------------------------------------------- offline export
def _saved_timelines(path: Path) -> list:
    """The bar count of each timeline widget output saved in notebook ``path``, in order."""
    from mlsys_lab.viz.timeline_view import MIMETYPE, unpack_model

    nb = json.loads(path.read_text(encoding="utf-8"))
    return [len(unpack_model(o["data"][MIMETYPE]["model"])["bars"]) for c in nb["cells"]
            for o in c.get("outputs", []) if MIMETYPE in o.get("data", {})]


def test_offline_export_shows_working_widgets_with_the_network_off(tmp_path):
    from selenium.webdriver.common.by import By

    from mlsys_lab.reader.export import export_site

    index = export_site(tmp_path / "site", root=ROOT)
    pages = sorted(p.name for p in index.parent.glob("*.html"))
    assert len(pages) == len(CHAPTERS) + 1
    html = index.read_text(encoding="utf-8")
    assert all(c.chinese in html and c.english in html for c in chapters(ROOT))
    shown = [p for p in CHAPTERS if "explorer(" in (ROOT / p).read_text(encoding="utf-8")]
    assert shown, "no chapter holds an explorer"
    timelines = {p: _saved_timelines(ROOT / p) for p in CHAPTERS}
    timelines = {p: bars for p, bars in timelines.items() if bars}
    assert {"chapters/04_computational_graph.ipynb", "chapters/07_compiler_backend_runtime.ipynb",
            "chapters/11_distributed_training.ipynb"} <= set(timelines), sorted(timelines)
    for page in pages:
        text = (index.parent / page).read_text(encoding="utf-8")
        loads = re.findall(r'<(?:script|link|img|iframe)[^>]+(?:src|href)="(https?:[^"]+)"', text)
        assert not loads, f"{page} loads from the network: {loads[:3]}"
    # No MathJax offline: the chapters' TeX is drawn as SVG images that load from the page.
    maths = {p: (index.parent / p).read_text(encoding="utf-8").count('class="mlsys-math"')
             for p in pages}
    assert sum(maths.values()) > 100, maths
    most = max(maths, key=maths.get)
    visits = list(dict.fromkeys([Path(p).with_suffix(".html").name for p in shown + list(timelines)]
                                + [most]))               # each page loaded once
    with B.chromium(offline=True) as d:
        d.get(index.as_uri())
        links = d.find_elements(By.CSS_SELECTOR, "a[href$='.html']")
        assert len(links) == len(CHAPTERS)
        for page in visits:
            path = f"chapters/{Path(page).with_suffix('.ipynb').name}"
            stem = Path(page).stem
            bars = timelines.get(path, [])
            d.get((index.parent / page).as_uri())
            _wait(d, "return [...document.images].every(i => i.complete) && "
                     f"document.querySelectorAll('.mlsys-timeline[data-ready]').length === "
                     f"{len(bars)} && (document.querySelectorAll('.mlsys-explorer[data-ready]')"
                     f".length > 0) === {str(path in shown).lower()};", 30, f"offline {stem}")
            broken = d.execute_script("return [...document.images].filter("
                                      "i => i.naturalWidth === 0).length")
            assert broken == 0
            if path in shown:
                root = d.find_element(By.CSS_SELECTOR, ".mlsys-explorer[data-ready]")
                d.execute_script("arguments[0].scrollIntoView({block: 'center'});", root)
                op = _visible_op(d, root)
                op.click()
                assert root.get_attribute("data-selected") == op.get_attribute("data-key")
                root.screenshot(str(ARTIFACTS / f"offline-{stem}.png"))
            if bars:                              # every saved timeline boots and responds
                roots = d.find_elements(By.CSS_SELECTOR, ".mlsys-timeline[data-ready]")
                drawn = [int(r.get_attribute("data-bars")) for r in roots]
                assert drawn == bars, (stem, drawn, bars)      # the packed bars, all unpacked
                for r in roots:                   # controls that need a kernel are disabled
                    assert all(i.get_attribute("disabled") for i in
                               r.find_elements(By.CSS_SELECTOR, "input.tl-input"))
                assert _drive_timelines(d, f"offline-{stem}", kernel=False) == len(bars)
            if page == most:
                sizes = d.execute_script("return [...document.querySelectorAll('img.mlsys-math')]"
                                         ".map(i => i.naturalWidth);")
                assert len(sizes) == maths[most] and all(w > 0 for w in sizes), sizes[:5]
                formula = d.find_elements(By.CSS_SELECTOR, "img.mlsys-math")[0]
                d.execute_script("arguments[0].scrollIntoView({block: 'center'});", formula)
                d.save_screenshot(str(ARTIFACTS / "offline-math.png"))
            remote = d.execute_script("return performance.getEntriesByType('resource')"
                                      ".map(e => e.name).filter(n => /^https?:/.test(n))")
            assert remote == [], remote
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        d.save_screenshot(str(ARTIFACTS / "offline-last-page.png"))


def test_offline_timelines_respond_without_a_kernel(tmp_path):
    """The timeline widgets of chapter 11 (pipeline schedules, cluster trace) exported offline:
    hover and click work from the saved data; the controls that need a kernel are disabled."""
    import matplotlib
    import nbformat
    import numpy as np
    from selenium.webdriver.common.by import By

    matplotlib.use("Agg")
    from mlsys_lab.distributed import collectives, sim
    from mlsys_lab.reader.export import export_notebook
    from mlsys_lab.viz import cluster_timeline, pipeline_view

    def prog(comm, x):
        yield comm.compute(seconds=1e-6 * (comm.rank + 1))
        return (yield from collectives.allreduce(comm, x))

    res = sim.run(sim.Cluster(sim.ring(4)), prog, args=[(np.ones(256),)] * 4)
    nb = nbformat.v4.new_notebook()
    for widget in (pipeline_view.pipeline_widget(4, 8, live=True),
                   cluster_timeline.timeline_widget(res, live=True)):
        cell = nbformat.v4.new_code_cell("widget")
        cell.outputs = [nbformat.v4.new_output("execute_result", execution_count=1,
                                               data=widget._repr_mimebundle_())]
        nb.cells.append(cell)
    page = tmp_path / "timelines.html"
    page.write_text(export_notebook(nb, "timelines"), encoding="utf-8")
    with B.chromium(offline=True) as d:
        d.get(page.as_uri())
        _wait(d, "return document.querySelectorAll('.mlsys-timeline[data-ready]').length === 2;",
              30, "offline timelines")
        roots = d.find_elements(By.CSS_SELECTOR, ".mlsys-timeline[data-ready]")
        assert [r.get_attribute("data-bars") for r in roots] == \
            [str(2 * 4 * 8 * 2), str(len(res.trace))]
        assert all(i.get_attribute("disabled") for i in
                   roots[0].find_elements(By.CSS_SELECTOR, "input.tl-input"))
        assert _drive_timelines(d, "offline", kernel=False) == 2
