"""Chapter 11's widgets: the collective stepper shows what the library's ring really does, the
pipeline view draws the schedules' own timelines, the cluster timeline adds up the trace; each
widget is live with controls and carries a static PNG."""

import base64
import json
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mlsys_lab import viz  # noqa: E402
from mlsys_lab.distributed import collectives, sim  # noqa: E402
from mlsys_lab.distributed import pipeline_parallel as pp  # noqa: E402
from mlsys_lab.errors import ArgumentError, ShapeError  # noqa: E402
from mlsys_lab.viz import cluster_timeline as ct  # noqa: E402
from mlsys_lab.viz import collective_view as cv  # noqa: E402
from mlsys_lab.viz import pipeline_view as pv  # noqa: E402
from mlsys_lab.viz import timeline_view as tv  # noqa: E402

BOOK = [np.array([2.0, 4, 6]), np.array([1.0, 2, 3]), np.array([4.0, 8, 12])]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _library_ring(inputs, op="sum"):
    def prog(comm, x):
        return (yield from collectives.allreduce(comm, x, op=op, algo="ring"))

    cluster = sim.Cluster(sim.ring(len(inputs)), batch_collectives=False)
    return sim.run(cluster, prog, args=[(x,) for x in inputs])


# ----------------------------------------------------------------------------- collective stepper
def test_book_example_step_by_step():
    steps = cv.ring_allreduce_steps(BOOK)
    assert [s.phase for s in steps] == ["start"] + ["reduce-scatter"] * 2 + ["all-gather"] * 2
    after_rs = steps[2]
    for r in range(3):  # after the reduce-scatter rank r owns the whole sum of chunk r
        assert after_rs.chunks[r][r].sources == frozenset({0, 1, 2})
    assert [float(after_rs.chunks[r][r].value[0]) for r in range(3)] == [7.0, 14.0, 21.0]
    assert cv.describe_step(steps[-1]).splitlines()[1:] == [
        f"  rank {r}: c0=7 {{0,1,2}}  c1=14 {{0,1,2}}  c2=21 {{0,1,2}}" for r in range(3)]
    assert cv.describe_step(steps[1]).splitlines()[0] == \
        "step 1 (reduce-scatter): r0->r1 c2, r1->r2 c0, r2->r0 c1"


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), n=st.integers(0, 23), dtype=st.sampled_from(["float64", "float32"]),
       op=st.sampled_from(["sum", "max"]), seed=st.integers(0, 2**16))
def test_last_step_equals_the_simulators_ring_bit_for_bit(p, n, dtype, op, seed):
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(n).astype(dtype) for _ in range(p)]
    steps = cv.ring_allreduce_steps(inputs, op)
    res = _library_ring(inputs, op)
    assert len(steps) == 2 * (p - 1) + 1
    for r in range(p):
        got = steps[-1].result(r)
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, res.results[r])
    # the picture's messages are the simulator's: per rank, the same destinations and sizes
    item = np.dtype(dtype).itemsize
    bounds = collectives.block_bounds(n, p)
    for r in range(p):
        sent = [(e.dst, e.bytes) for e in res.trace if e.kind == "send" and e.rank == r]
        drawn = [(dst, (bounds[c][1] - bounds[c][0]) * item)
                 for s in steps[1:] for src, dst, c in s.moves if src == r]
        assert sent == drawn


@settings(max_examples=30, deadline=None)
@given(p=st.integers(2, 7), n=st.integers(1, 15), seed=st.integers(0, 2**16))
def test_every_chunk_is_the_sum_of_its_sources(p, n, seed):
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(-50, 50, n).astype(np.float64) for _ in range(p)]  # exact sums
    bounds = collectives.block_bounds(n, p)
    for step in cv.ring_allreduce_steps(inputs):
        for row in step.chunks:
            for c, chunk in enumerate(row):
                a, b = bounds[c]
                want = sum(inputs[s][a:b] for s in chunk.sources)
                np.testing.assert_array_equal(chunk.value, want)
        # each step moves one chunk per rank, to the next rank
        assert sorted((src, dst) for src, dst, _ in step.moves) == \
            ([] if step.index == 0 else [(r, (r + 1) % p) for r in range(p)])
    assert all(len(ch.sources) == p for row in step.chunks for ch in row)


def test_stepper_errors():
    with pytest.raises(ShapeError, match="same shape and dtype"):
        cv.ring_allreduce_steps([np.zeros(3), np.zeros(4)])
    with pytest.raises(ShapeError, match="same shape and dtype"):
        cv.ring_allreduce_steps([np.zeros(3), np.zeros(3, np.float32)])
    with pytest.raises(ArgumentError, match="op='mean'"):
        cv.ring_allreduce_steps(BOOK, op="mean")
    with pytest.raises(ArgumentError, match="none"):
        cv.ring_allreduce_steps([])


def _png(data):
    raw = base64.b64decode(data) if isinstance(data, str) else data
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    return raw


def _image_of(widget):
    return widget.widget.children[-1]


def test_static_pictures_and_the_live_stepper():
    fig = cv.static(BOOK)
    assert sum(ax.get_visible() for ax in fig.axes) == 5
    assert isinstance(cv.collective_stepper(BOOK, live=False), plt.Figure)
    live = cv.collective_stepper(BOOK, live=True)
    bundle = live._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    _png(bundle["image/png"])
    slider = live.widget.children[0].children[0]
    caption = live.widget.children[1]
    first = _png(_image_of(live).value)
    slider.value = 2
    assert _png(_image_of(live).value) != first
    assert caption.value.startswith("reduce-scatter") and "r2→r0: chunk 0" in caption.value


@pytest.mark.parametrize("p", [3, 8])
def test_live_stepper_image_is_shown_at_the_size_it_is_drawn(p):
    """Issue 26: the image was drawn at 303 x 243 px and stretched to the output's width (949 px,
    blurry, taller than the screen). It is drawn at SHARPNESS x SCREEN_DPI and shown at its drawn
    size / SHARPNESS, never wider; with the slider and the caption it fits the notebook area of a
    1280 x 800 screen (about 530 px high)."""
    inputs = [np.arange(2.0 * p) + r for r in range(p)]
    live = cv.collective_stepper(inputs, live=True)
    image = _image_of(live)
    for step in (0, 2 * (p - 1)):
        live.widget.children[0].children[0].value = step
        width, height = cv.png_size(image.value)
        assert image.layout.width == f"{width / cv.SHARPNESS:g}px"
        assert image.layout.max_width == "100%" and image.layout.height == "auto"
        shown = (width / cv.SHARPNESS, height / cv.SHARPNESS)
        assert 300 <= shown[0] <= 640 and 220 <= shown[1] + 60 <= 530, shown
    assert cv.png_size(_png(image.value)) == (width, height)
    with pytest.raises(ArgumentError, match="png_size"):
        cv.png_size(b"GIF89a" + bytes(20))


# ----------------------------------------------------------------------------- pipeline view
@pytest.mark.parametrize("p,m", [(4, 8), (3, 2), (1, 4)])
def test_pipeline_static_shows_the_schedules_and_the_standard_bubble(p, m):
    fig = pv.static(p, m)
    titles = [ax.get_title() for ax in fig.axes]
    standard = f"{pp.bubble_fraction_standard(p, m):.3f}"
    assert titles[0].startswith("GPipe") and titles[1].startswith("1F1B")
    assert all(f"bubble {standard} (standard" in t for t in titles)
    assert f"in flight per stage {[m] * p}" in titles[0]
    assert f"in flight per stage {[min(p - s, m) for s in range(p)]}" in titles[1]
    for ax in fig.axes:  # one bar per forward and per backward of every micro-batch
        assert sum(len(c.get_paths()) for c in ax.collections) == 2 * p * m


def test_plot_pipeline_draws_the_timeline_it_is_given():
    ops, timeline = pv.schedule_timeline("1f1b", 3, 4, t_forward=1.0, t_backward=3.0)
    ax = pv.plot_pipeline(timeline).axes[0]
    boxes = [path.get_extents() for c in ax.collections for path in c.get_paths()]
    bars = sorted((round((b.y0 + b.y1) / 2), b.x0, b.x1) for b in boxes)
    assert bars == sorted((x.stage, x.start, x.end) for x in timeline)
    assert sorted(t.get_text() for t in ax.texts) == sorted(x.name for x in timeline)
    with pytest.raises(ArgumentError, match="3 stages, p=2"):
        pv.schedule_timeline(ops, 2, 4)


def _view(live):
    """The TimelineView inside a live widget, after checking its bundle: PNG, the widget view,
    the data for the offline export and a description (never a repr)."""
    bundle = live._repr_mimebundle_()
    _png(bundle["image/png"])
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle[tv.MIMETYPE]["model"] == tv.pack_model(live.widget.model)
    packed = tv.pack_model(live.widget.model)
    tick = packed["bars"]["tick"]
    assert isinstance(packed["bars"]["start"], str) and tick <= 1e-7 * (
        live.widget.model["t1"] - live.widget.model["t0"])
    for b, u in zip(live.widget.model["bars"], tv.unpack_model(packed)["bars"], strict=True):
        assert b[:2] + b[4:] == u[:2] + u[4:]                 # times to half a tick, rest exact
        assert all(abs(b[i] - u[i]) <= tick / 2 + 2 * math.ulp(b[i]) for i in (2, 3))
    assert "VBox" not in bundle["text/plain"] and "TimelineView(" not in bundle["text/plain"]
    assert isinstance(live.widget, tv.TimelineView)
    return live.widget


@pytest.mark.parametrize("p,m,recompute", [(4, 8, False), (3, 5, True), (1, 2, False)])
def test_pipeline_model_holds_every_pass_once_at_its_simulated_time(p, m, recompute):
    model = viz.pipeline_model(p, m, t_forward=1.0, t_backward=2.5, recompute=recompute)
    json.dumps(model)
    assert [g["title"].split(":")[0] for g in model["groups"]] == ["GPipe", "1F1B"]
    for g, name in zip(model["groups"], ("gpipe", "1f1b")):
        _, timeline = pv.schedule_timeline(name, p, m, 1.0, 2.5, recompute)
        bars = [b for b in model["bars"] if g["first"] <= b[0] < g["first"] + g["count"]]
        drawn = {(b[0] - g["first"], b[5]): (b[2], b[3]) for b in bars}
        assert len(drawn) == len(bars) == 2 * p * m                       # each pass once
        assert drawn == {(x.stage, x.name): (x.start, x.end) for x in timeline}
        assert f"bubble {timeline.bubble_fraction():.3f}" in g["title"]
    keys = [b[7] for b in model["bars"]]
    assert len(set(keys)) == len(keys)
    assert json.dumps(model) == json.dumps(viz.pipeline_model(p, m, t_forward=1.0, t_backward=2.5,
                                                              recompute=recompute))
    assert model["t1"] == max(b[3] for b in model["bars"])


def test_live_pipeline_widget_rebuilds_on_p_and_m():
    live = pv.pipeline_widget(4, 8, live=True)
    view = _view(live)
    assert [c["name"] for c in view.model["controls"]] == ["p", "m", "recompute"]
    assert view.params == {"p": 4, "m": 8, "recompute": False}
    assert len(view.model["bars"]) == 2 * 2 * 4 * 8
    view.selected, view.cursor = "gpipe:s0:F0", 0.5
    view.params = {"p": 4, "m": 2, "recompute": False}          # what the front end sends
    assert len(view.model["bars"]) == 2 * 2 * 4 * 2 and "0.600" in view.model["caption"]
    assert (view.selected, view.cursor) == ("", -1.0)           # the old selection is gone
    view.params = {"p": 2, "m": 3, "recompute": True}
    assert view.model == viz.pipeline_model(2, 3, recompute=True)
    assert isinstance(pv.pipeline_widget(live=False), plt.Figure)


# ----------------------------------------------------------------------------- cluster timeline
def _traced_run(p=4):
    def prog(comm, x):
        yield comm.compute(seconds=1e-6 * (comm.rank + 1))
        return (yield from collectives.allreduce(comm, x))

    return sim.run(sim.Cluster(sim.ring(p)), prog, args=[(np.ones(64 * p),)] * p)


def test_rank_summary_adds_up_the_trace():
    p = 4
    res = _traced_run(p)
    rows = ct.rank_summary(res)
    assert [r["rank"] for r in rows] == list(range(p))
    for r in rows:
        assert r["compute"] == pytest.approx(1e-6 * (r["rank"] + 1))
        assert r["messages"] == 2 * (p - 1)
        assert r["bytes_sent"] == 2 * (p - 1) * 64 * 8
        sends = [e for e in res.trace if e.rank == r["rank"] and e.kind == "send"]
        assert r["send"] == pytest.approx(sum(e.end - e.start for e in sends))
    assert sum(r["messages"] for r in rows) == res.messages


def test_cluster_timeline_draws_each_lane_and_honours_the_window():
    res = _traced_run(4)
    ax = ct.plot_cluster_timeline(res).axes[0]
    drawn = sum(len(c.get_paths()) for c in ax.collections)
    assert drawn == len(res.trace)
    early = ct.plot_cluster_timeline(res, window=(0.0, 2.5e-6), ranks=(0, 1)).axes[0]
    kept = [e for e in res.trace if e.rank <= 1 and e.start <= 2.5e-6]
    assert sum(len(c.get_paths()) for c in early.collections) == len(kept)
    assert "µs" in early.get_xlabel()
    with pytest.raises(ArgumentError, match="not a span of a simulator trace"):
        ct.rank_summary([("compute", 0, 1)])


def test_cluster_timeline_of_32_ranks_is_compact_and_labels_every_rank():
    """Issue 26: 32 ranks made a picture ~1,000 px tall at 90 dpi that labelled only the even
    ranks. Every rank is labelled now, the labels do not overlap, and the picture is at most
    6.5 in (585 px) high."""
    def prog(comm):
        yield comm.compute(seconds=1e-6)

    res = sim.run(sim.Cluster(sim.ring(32)), prog, args=[()] * 32)
    fig = ct.plot_cluster_timeline(res)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(32)]
    assert fig.get_size_inches()[1] <= 6.5
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_yticklabels()]
    assert all(a.y0 >= b.y1 for a, b in zip(boxes, boxes[1:])), "rank labels overlap"
    small = ct.plot_cluster_timeline(_traced_run(4))           # a few ranks keep roomy rows
    assert small.get_size_inches()[1] == pytest.approx(0.9 + 0.32 * 4)


def test_trace_model_holds_every_event_once_with_its_times():
    res = _traced_run(4)
    model = viz.trace_model(res)
    json.dumps(model)
    assert model["subs"] == list(ct.KINDS) and model["lanes"] == [f"rank {r}" for r in range(4)]
    assert len(model["bars"]) == len(res.trace)
    for b, e in zip(model["bars"], res.trace):                   # in trace order, times exact
        assert (b[0], model["subs"][b[1]], b[2], b[3]) == (e.rank, e.kind, e.start, e.end)
        assert b[5] == e.name and model["lanes"][b[0]] == e.lane
        if e.kind != "compute":
            assert b[5] == f"{e.kind} {e.src}->{e.dst}, {e.bytes} B"
    sends = [b for b in model["bars"] if model["subs"][b[1]] == "send"]
    assert len(sends) == res.messages                            # every message once
    assert json.dumps(model) == json.dumps(viz.trace_model(_traced_run(4)))
    assert model["t1"] == max(e.end for e in res.trace) and "µs" in model["x_label"]
    with pytest.raises(ArgumentError, match="not a span of a simulator trace"):
        viz.trace_model([("compute", 0, 1)])


def test_live_cluster_timeline():
    res = _traced_run(4)
    live = ct.timeline_widget(res, title="four ranks", live=True)
    view = _view(live)
    assert view.model["title"] == "four ranks" and len(view.model["bars"]) == len(res.trace)
    assert "4 lane(s)" in live.alt
    assert isinstance(ct.timeline_widget(res.trace, live=False), plt.Figure)


def test_timeline_model_refuses_bad_bars():
    style = [{"name": "x", "color": "#000"}]
    with pytest.raises(ArgumentError, match="unique"):
        tv.timeline_model("t", ["a"], [[0, 0, 0.0, 1.0, 0, "", "", "k"]] * 2, style)
    with pytest.raises(ArgumentError, match="bad bar"):
        tv.timeline_model("t", ["a"], [[1, 0, 0.0, 1.0, 0, "", "", "k"]], style)
    with pytest.raises(ArgumentError, match="bad bar"):
        tv.timeline_model("t", ["a"], [[0, 0, 2.0, 1.0, 0, "", "", "k"]], style)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.floats(-5, 5),
                          st.floats(0, 3), st.integers(0, 1), st.sampled_from(["", "a", "b c"])),
                max_size=30), st.booleans())
def test_packed_timeline_round_trips(rows, index_keys):
    """The packed form (what a notebook stores) gives back every bar: the same lanes, styles,
    labels, infos and keys, times to half a tick; and it is smaller than the list form."""
    style = [{"name": "x", "color": "#000"}, {"name": "y", "color": "#111"}]
    bars = [[lane, sub, start, start + length, s, label, label.upper(),
             str(i) if index_keys else f"k{i}"]
            for i, (lane, sub, start, length, s, label) in enumerate(rows)]
    model = tv.timeline_model("t", ["a", "b", "c"], bars, style, subs=("p", "q", "r"))
    packed = tv.pack_model(model)
    assert tv.pack_model(packed) is packed and tv.unpack_model(model) is model
    assert (packed["bars"]["keys"] is None) == (index_keys or not bars)
    back = tv.unpack_model(json.loads(json.dumps(packed)))
    tick = packed["bars"]["tick"]
    assert len(back["bars"]) == len(bars)
    for b, u in zip(bars, back["bars"]):
        assert b[:2] + b[4:] == u[:2] + u[4:]
        assert all(abs(b[i] - u[i]) <= tick / 2 + 4 * math.ulp(max(abs(b[i]), 1.0))
                   for i in (2, 3))
    if len(bars) >= 10:
        assert len(json.dumps(packed, indent=1)) < len(json.dumps(model, indent=1))


def test_unpack_refuses_a_damaged_column():
    model = tv.timeline_model("t", ["a"], [[0, 0, 0.0, 1.0, 0, "x", "", "0"]],
                              [{"name": "x", "color": "#000"}])
    packed = tv.pack_model(model)
    packed["bars"]["length"] += " 5"
    with pytest.raises(ArgumentError, match="column"):
        tv.unpack_model(packed)
