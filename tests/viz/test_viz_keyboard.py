"""The package's views take the keyboard (issue 26, item 14), in a real Chromium.

JupyterLab handles its shortcuts in the bubbling phase on the document: in command mode an arrow
key moves to another cell and its default (moving a focused slider) is prevented. The pages here
put that handler on the document and run ``static/timeline.js`` and ``static/explorer.js`` on a
stand-in widget model (as the offline pages do): an arrow key in a view's slider must move the
slider and never reach the document, and a timeline rebuilt from its new control value (what the
kernel does for the pipeline widget's ``p`` and ``m``) must hand the focus back to that control,
so the next key press moves it again. A missing browser fails these tests; it never skips them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.reader import browser as B
from mlsys_lab.viz import explorer_view as ex
from mlsys_lab.viz import pipeline_view as pv
from mlsys_lab.viz.view_widget import STATIC

# JupyterLab's shortcut handler, reduced to what matters: bubbling phase, arrows prevented.
_PAGE = """<!doctype html><meta charset="utf-8"><style>{css}</style>
<p>a notebook cell above</p><div id="view"></div>
<script>
window.__reached = [];
document.addEventListener("keydown", (ev) => {{
  if (ev.key.startsWith("Arrow")) {{ ev.preventDefault(); window.__reached.push(ev.key); }}
}});
</script>
<script>(function () {{ {module} }})();</script>
<script>
(function () {{
  const state = {state};
  const handlers = {{}};
  const model = {{
    get: (k) => state[k],
    set: (k, v) => {{ state[k] = v; (handlers["change:" + k] || []).forEach((f) => f()); }},
    save_changes: () => {{
      window.__saved = (window.__saved || 0) + 1;
      // the kernel's answer to new params: the model rebuilt from them, a moment later
      if ({rebuild} && state.params) setTimeout(() => {{
        const next = JSON.parse(JSON.stringify(state.model));
        next.controls = next.controls.map(
          (c) => Object.assign(c, {{ value: state.params[c.name] }}));
        next.title = "rebuilt with p = " + state.params.p;
        model.set("model", next);
      }}, 50);
    }},
    on: (ev, f) => {{ (handlers[ev] = handlers[ev] || []).push(f); }},
    off: () => {{}},
  }};
  window.__view.render({{ model, el: document.getElementById("view") }});
}})();
</script>"""


def _page(tmp_path, name, module, css, state, rebuild):
    source = (STATIC / module).read_text(encoding="utf-8")
    assert "export default" in source
    html = _PAGE.format(css=(STATIC / css).read_text(encoding="utf-8"),
                        module=source.replace("export default", "window.__view ="),
                        state=json.dumps(state), rebuild="true" if rebuild else "false")
    path = tmp_path / f"{name}.html"
    path.write_text(html, encoding="utf-8")
    return path.as_uri()


def _wait(driver, script, what, timeout=10.0):
    return B.wait_for(driver, script, what, timeout)


@pytest.fixture(scope="module")
def driver():
    with B.chromium(offline=True, width=1280, height=800) as d:
        yield d


def test_pipeline_sliders_take_arrow_keys_and_keep_the_focus(driver, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    state = {"model": pv.pipeline_model(4, 8), "selected": "", "cursor": -1.0,
             "params": {"p": 4, "m": 8, "recompute": False}}
    driver.get(_page(tmp_path, "pipeline", "timeline.js", "timeline.css", state, rebuild=True))
    _wait(driver, "return document.querySelector('.mlsys-timeline[data-ready]');", "the view")
    value = "return document.querySelector('input.tl-input[name=p]').value;"
    driver.find_element(By.CSS_SELECTOR, "input.tl-input[name=p]").click()   # focus the slider
    driver.execute_script("const r = document.querySelector('input.tl-input[name=p]');"
                          " r.value = 4; r.dispatchEvent(new Event('change'));")
    _wait(driver, "return document.querySelector('.tl-title').textContent.endsWith('p = 4');",
          "the rebuild")
    for want in ("3", "2"):                   # twice: the rebuilt slider has the focus again
        driver.switch_to.active_element.send_keys(Keys.ARROW_LEFT)
        _wait(driver, "return document.querySelector('.tl-title').textContent"
                      f".endsWith('p = {want}');", f"the view rebuilt with p = {want}")
        assert driver.execute_script(value) == want
        active = driver.execute_script("const a = document.activeElement;"
                                       " return a.classList.contains('tl-input') && a.name;")
        assert active == "p", "the rebuilt view did not give the slider its focus back"
    assert driver.execute_script("return window.__reached;") == [], \
        "arrow keys in the slider reached the notebook's shortcut handler"
    driver.find_element(By.TAG_NAME, "p").click()    # outside the view, keys still reach the page
    driver.switch_to.active_element.send_keys(Keys.ARROW_DOWN)
    assert driver.execute_script("return window.__reached;") == ["ArrowDown"]


def test_explorer_step_slider_takes_arrow_keys(driver, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    graph = ml.trace(lambda x, w: (ml.ops.relu(x @ w) ** 2).sum(), x, w)
    state = {"model": ex.explorer_model(graph), "panes": "both", "step": 0,
             "planner": "best", "selected": ""}
    driver.get(_page(tmp_path, "explorer", "explorer.js", "explorer.css", state, rebuild=False))
    _wait(driver, "return document.querySelector('.mlsys-explorer[data-ready]');", "the view")
    slider = driver.find_element(By.CSS_SELECTOR, "input.mx-step")
    driver.execute_script("arguments[0].focus();", slider)
    for want in ("1", "2"):
        driver.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
        _wait(driver, "return document.querySelector('.mlsys-explorer')"
                      f".getAttribute('data-step') === '{want}';", f"step {want}")
    assert driver.execute_script("return window.__reached;") == []
