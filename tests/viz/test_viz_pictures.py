"""Pictures show on first open: PNG in every bundle, the matplotlib fallback draws once with live
tensors and values, charts fit their data (issue 17)."""

import base64
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mlsys_lab as ml  # noqa: E402
from mlsys_lab import viz  # noqa: E402
from mlsys_lab.engine.memory import Lifetime, plan  # noqa: E402
from mlsys_lab.viz import graph_view, memory_view, stepper  # noqa: E402
from mlsys_lab.viz.picture import Picture  # noqa: E402
from mlsys_lab.viz.timeline import plot_timeline  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"
PLACEHOLDERS = ("<graph drawing", "interactive(children=", "Image(value=", "VBox(children=",
                "<Figure size", "object at 0x")


def _graph():
    return ml.trace(lambda a, b: (a + ml.ops.sin(b) * 3).sum(),
                    np.zeros(8, np.float32), np.zeros(8, np.float32))


def _check_bundle(bundle):
    assert base64.b64decode(bundle["image/png"]).startswith(PNG)
    assert not any(p in bundle["text/plain"] for p in PLACEHOLDERS), bundle["text/plain"]


@pytest.mark.skipif(not graph_view.has_dot(), reason="needs Graphviz dot")
def test_graphviz_picture_carries_png_and_svg():
    g = _graph()
    pic = graph_view.show_graph(g, highlight=[g.nodes[1].id], live={"c"})
    bundle = pic._repr_mimebundle_()
    _check_bundle(bundle)
    assert bundle["image/svg+xml"].lstrip().startswith("<?xml")
    assert "palegreen" in g.to_dot(live={"c"}) and "lambda" in bundle["text/plain"]


def test_matplotlib_fallback_draws_once_with_live_values_and_a_name(monkeypatch, capsys):
    monkeypatch.setattr(graph_view, "has_dot", lambda: False)
    plt.close("all")
    g = _graph()
    live = stepper.live_at(g, 1)
    pic = stepper.show_step(g, 1)
    assert isinstance(pic, Picture) and plt.get_fignums() == []  # closed: drawn only once
    _check_bundle(pic._repr_mimebundle_())
    assert "matplotlib" in capsys.readouterr().out
    fig = graph_view.draw_matplotlib(g, highlight=[g.nodes[1].id], live=live)
    texts = {t.get_text().split("\n")[0]: t for t in fig.axes[0].texts}
    values = [v.name for n in g.nodes for v in n.outputs] + [v.name for v in g.inputs]
    assert set(values) <= set(texts)                      # every value is drawn
    assert live and all(matplotlib.colors.to_hex(texts[name].get_bbox_patch().get_facecolor())
                        == matplotlib.colors.to_hex(graph_view.LIVE_FILL) for name in live)
    dead = [v for v in values if v not in live and v not in {x.name for x in g.inputs}]
    assert all(matplotlib.colors.to_hex(texts[name].get_bbox_patch().get_facecolor())
               != matplotlib.colors.to_hex(graph_view.LIVE_FILL) for name in dead)
    assert matplotlib.colors.to_hex(texts[g.nodes[1].op].get_bbox_patch().get_facecolor()) \
        == matplotlib.colors.to_hex(graph_view.HIGHLIGHT_FILL)
    assert "<" not in fig.axes[0].get_title()
    plt.close("all")


def test_display_name():
    g = _graph()
    g.name = "<lambda>@cpu"
    assert graph_view.display_name(g) == "lambda (for cpu)"


def test_widgets_carry_a_static_png(monkeypatch):
    ipywidgets = pytest.importorskip("ipywidgets")
    g = _graph()
    w = stepper.graph_stepper(g)
    assert isinstance(w, ipywidgets.interactive)
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    _check_bundle(bundle)
    monkeypatch.setattr(memory_view, "_in_notebook", lambda: True)
    lts = [Lifetime(f"t{i}", 64 * (1 + i % 3), i, i + 2) for i in range(8)]
    m = memory_view.memory_widget(lts, strategies=["naive", "greedy_by_size"])
    bundle = m._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    _check_bundle(bundle)
    plt.close("all")


def test_memory_chart_fits_the_plan_not_the_no_reuse_total():
    lts = [Lifetime(f"t{i}", 1024, i, i + 1) for i in range(40)]   # reuse makes naive 20x larger
    made = plan(lts, "greedy_by_size", alignment=64)
    fig = memory_view.plot_lifetimes(lts, made)
    bottom, top = fig.axes[0].get_ylim()
    assert made.arena_size / top > 0.8
    assert any("no reuse" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
    plt.close("all")


def _Event(node, start, end, worker=0):  # noqa: N802 - reads like the runtime's Event
    """The span of node ``node`` on cpu/``worker`` (the runtime's constructor)."""
    from mlsys_lab.engine.runtime import Event

    return Event(node, "cpu", worker, start, end)


def _bar_boxes(ax):
    """Each drawn bar's box in display units (bars are broken_barh collections)."""
    return [path.get_extents(ax.transData) for c in ax.collections for path in c.get_paths()]


def _overlaps(fig):
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in fig.axes[0].texts]
    return sum(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:]), len(boxes)


def test_timeline_labels_never_overlap():
    ends = np.cumsum([3e-3 if i % 5 == 0 else 1e-4 for i in range(40)])   # a few long kernels
    starts = np.concatenate([[0.0], ends[:-1]])
    events = [_Event(f"v{i} = {'matmul' if i % 5 == 0 else 'add'}", s, e)
              for i, (s, e) in enumerate(zip(starts, ends))]
    fig = plot_timeline(events)
    overlaps, labelled = _overlaps(fig)
    assert overlaps == 0 and 0 < labelled < 40      # long bars labelled, short ones not
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["add", "matmul"]
    plt.close("all")


def test_a_widget_without_a_picture_gets_a_description():
    ipywidgets = pytest.importorskip("ipywidgets")
    from mlsys_lab.viz.picture import describe_widget

    box = ipywidgets.VBox([ipywidgets.IntSlider(value=3)])
    assert describe_widget(box, "calculator: 3 -> 9") is box
    bundle = box._repr_mimebundle_()
    assert bundle["text/plain"] == "calculator: 3 -> 9"
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_schedule_timeline_widget_holds_every_node_once_with_its_times():
    from mlsys_lab.viz import timeline_view as tv
    from mlsys_lab.viz.timeline import schedule_widget

    g = ml.trace(lambda a, b: ml.ops.sin(a @ b) + ml.ops.cos(a @ b),
                 np.ones((16, 16), np.float32), np.ones((16, 16), np.float32))
    from mlsys_lab.engine.runtime import run_parallel

    _, events = run_parallel(g, np.ones((16, 16), np.float32), np.ones((16, 16), np.float32),
                             workers=2)                    # a measured two-worker schedule
    assert len(events) == len(g.nodes)
    live = schedule_widget(events, title="two workers", live=True)
    bundle = live._repr_mimebundle_()
    _check_bundle(bundle)
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert not any(p in bundle["text/plain"] for p in PLACEHOLDERS)
    model = viz.schedule_model(events, "two workers")
    assert len(model["bars"]) == len(events)
    for b, e in zip(model["bars"], events):                   # each event once, times exact
        assert model["lanes"][b[0]] == e.lane == f"{e.device}/{e.worker}"
        assert (b[2], b[3], b[5]) == (e.start, e.end, e.name)
        assert model["styles"][b[4]]["name"] == e.kind == e.name.split("=")[-1].strip()
    assert model["t0"] == min(e.start for e in events)
    assert model["scale"] in (1.0, 1e-3, 1e-6, 1e-9) and model["unit"] in ("s", "ms", "µs", "ns")
    saved = bundle[tv.MIMETYPE]["model"]                      # what the notebook stores: packed
    assert saved == tv.pack_model(model) and isinstance(saved["bars"]["lane"], str)
    back = tv.unpack_model(saved)
    tick = saved["bars"]["tick"]
    assert tick <= 1e-7 * (model["t1"] - model["t0"])
    for b, u in zip(model["bars"], back["bars"]):             # times to half a tick, rest exact
        for i in (2, 3):                                       # (+ the float spacing there)
            assert abs(b[i] - u[i]) <= tick / 2 + 2 * math.ulp(b[i])
        assert b[:2] + b[4:] == u[:2] + u[4:]
    assert isinstance(schedule_widget(events, live=False), plt.Figure)
    plt.close("all")


def test_tex_becomes_svg_images_for_pages_without_mathjax():
    from mlsys_lab.viz.math_picture import render_math, tex_svg

    svg, width, height, depth = tex_svg(r"\frac{\partial L}{\partial W}")
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and width > 0 and height > depth >= 0
    assert tex_svg(r"\frac{\partial L}{\partial W}")[0] == svg          # deterministic
    assert tex_svg(r"\text{Label}") is not None and tex_svg(r"\tfrac12") is not None
    assert tex_svg(r"\begin{aligned}a&=b\end{aligned}") is None          # beyond mathtext
    text = ("Loss $L = \\sum_i y_i^2$ costs $5 and $10.\n\n$$a = b^2$$\n\n"
            "`code $x$` and\n```\n$y$\n```\n$\\begin{aligned}1\\end{aligned}$")
    out = render_math(text)
    assert out.count('<img class="mlsys-math"') == 2
    assert 'alt="L = \\sum_i y_i^2"' in out and 'alt="a = b^2"' in out
    assert "display:block" in out.split('alt="a = b^2"')[1].split(">")[0]
    assert "costs $5 and $10." in out and "`code $x$`" in out and "```\n$y$\n```" in out
    assert "$\\begin{aligned}1\\end{aligned}$" in out                  # left as TeX source
    assert render_math("no math here") == "no math here"


def test_compared_schedules_share_one_view_each_from_its_own_start():
    from mlsys_lab.viz import timeline_view as tv
    from mlsys_lab.viz.timeline import plot_timelines, schedule_widget

    serial = [_Event("c = matmul", 10.0, 10.004), _Event("d = matmul", 10.004, 10.008),
              _Event("e = add", 10.008, 10.009)]
    parallel = [_Event("c = matmul", 50.0, 50.004, worker=0),
                _Event("d = matmul", 50.0005, 50.0045, worker=1),
                _Event("e = add", 50.0045, 50.0055, worker=0)]
    runs = {"serial": serial, "parallel": parallel}
    model = viz.schedule_model(runs, "two runs")
    assert model["lanes"] == ["cpu/0", "cpu/0", "cpu/1"]
    assert model["groups"] == [{"title": "serial", "first": 0, "count": 1},
                               {"title": "parallel", "first": 1, "count": 2}]
    assert (model["t0"], model["t1"]) == (0.0, pytest.approx(0.009))   # the longer run's span
    starts = {(b[0], b[5]): b[2] for b in model["bars"]}
    assert starts[(0, "c = matmul")] == 0.0 and starts[(1, "c = matmul")] == 0.0  # own clocks
    assert starts[(2, "d = matmul")] == pytest.approx(0.0005)
    assert [b[7] for b in model["bars"]] == [str(i) for i in range(6)]          # unique keys
    assert model["bars"][3][6].startswith("parallel: c = matmul on cpu/0: 0-4 ms")
    assert {model["styles"][b[4]]["name"] for b in model["bars"]} == {"matmul", "add"}
    fig = plot_timelines(runs, title="two runs")
    assert [ax.get_title() for ax in fig.axes] == ["serial", "parallel"]
    assert all(ax.get_xlim() == pytest.approx((0, 9.0)) for ax in fig.axes)   # one time axis
    renderer = fig.canvas.get_renderer()
    labelled = 0
    for ax in fig.axes:                       # each label kept fits inside its bar as drawn
        bars = _bar_boxes(ax)
        for text in ax.texts:
            box = text.get_window_extent(renderer)
            assert any(b.x0 <= box.x0 and box.x1 <= b.x1 for b in bars), text.get_text()
            labelled += 1
    assert labelled >= 2                       # the 4 ms matmuls are wide enough to name
    plt.close("all")
    live = schedule_widget(runs, title="two runs", live=True)
    bundle = live._repr_mimebundle_()
    _check_bundle(bundle)
    assert "in 2 runs" in bundle["text/plain"]
    assert tv.unpack_model(bundle[tv.MIMETYPE]["model"])["groups"] == model["groups"]
    assert isinstance(schedule_widget(runs, live=False), plt.Figure)
    with pytest.raises(ml.errors.ArgumentError):
        viz.schedule_model({})
    plt.close("all")
