"""One drawing path for every timeline (issue 28 item 3): plot_spans, spans_model and
spans_widget draw the spans of the runtime, the data pipeline, pipeline parallelism and the
simulator, alone or side by side."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import mlsys_lab as ml  # noqa: E402
from mlsys_lab import viz  # noqa: E402
from mlsys_lab.data.pipeline import sim as data_sim  # noqa: E402
from mlsys_lab.distributed import collectives, sim  # noqa: E402
from mlsys_lab.distributed.parallel import pipeline_parallel as pp  # noqa: E402
from mlsys_lab.engine import runtime  # noqa: E402
from mlsys_lab.viz import timeline_view as tv  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def four():
    """``{part: spans}``: one timeline from each part that emits spans."""
    a = np.ones((8, 8), np.float32)
    g = ml.trace(lambda x, y: ml.ops.tanh(x @ y) + ml.ops.sin(x @ y), a, a)
    _, engine = runtime.run_parallel(g, a, a, workers=2)

    def prog(comm, x):
        yield comm.compute(seconds=1e-6)
        return (yield from collectives.allreduce(comm, x))

    trace = sim.run(sim.Cluster(sim.ring(4)), prog, args=[(np.ones(32),)] * 4).trace
    return {"runtime": list(engine),
            "data pipeline": list(data_sim.simulate(data_sim.book_stages(), 20,
                                                    timeline=True).timeline),
            "pipeline parallel": list(pp.simulate_schedule(pp.one_f_one_b_schedule(3, 4))),
            "simulator": list(trace)}


def _bars(ax):
    return sum(len(c.get_paths()) for c in ax.collections)


def test_the_spans_of_every_part_draw_on_one_path(four):
    assert all(isinstance(s, ml.Span) for spans in four.values() for s in spans)
    for name, spans in four.items():                       # each alone: every span one bar
        ax = viz.plot_spans(spans, title=name).axes[0]
        assert _bars(ax) == len(spans) and ax.get_title() == name
        assert [t.get_text() for t in ax.get_yticklabels()] == viz.timeline.lane_order(spans)
    fig = viz.plot_spans(four, title="four parts")          # side by side, one axis each
    assert [ax.get_title() for ax in fig.axes] == list(four)
    assert [_bars(ax) for ax in fig.axes] == [len(s) for s in four.values()]
    model = viz.spans_model(four, "four parts")
    assert [g["title"] for g in model["groups"]] == list(four)
    assert len(model["bars"]) == sum(len(s) for s in four.values())
    assert len(model["lanes"]) == sum(len({s.lane for s in run}) for run in four.values())
    for b in model["bars"]:
        assert b[2] <= b[3] and model["lanes"][b[0]]
    live = viz.spans_widget(four, "four parts", live=True)
    bundle = live._repr_mimebundle_()
    assert "image/png" in bundle and tv.MIMETYPE in bundle and "in 4 runs" in live.alt


def test_lanes_keep_each_parts_order(four):
    """Lanes that differ only in numbers sort numerically, groups in the order they start: the
    data pipeline's operators in pipeline order, ranks 0..p-1, stages 0..p-1."""
    data = viz.timeline.lane_order(four["data pipeline"])
    assert [lane.split()[0] for lane in data] == [n for n, d in data_sim.BOOK_DEGREES.items()
                                                  for _ in range(d)]
    assert viz.timeline.lane_order(four["simulator"]) == [f"rank {r}" for r in range(4)]
    spans = [ml.Span(f"rank {r}", "x", 0.0, 1.0) for r in (10, 2, 1)]
    assert viz.timeline.lane_order(spans) == ["rank 1", "rank 2", "rank 10"]


def test_styles_and_sub_lanes():
    spans = [ml.Span("a", "one", 0.0, 1.0, "compute"), ml.Span("a", "two", 1.0, 2.0, "send"),
             ml.Span("b", "three", 0.5, 1.5, "recv")]
    model = viz.spans_model(spans, subs=("compute", "send"), style={"send": "#ff0000",
                                                                    "compute": "#0000ff"})
    assert [b[5] for b in model["bars"]] == ["one", "two"]          # recv is not a sub-lane
    assert [s["name"] for s in model["styles"]] == ["send", "compute"]     # the dict's order
    assert [b[1] for b in model["bars"]] == [0, 1]
    kinds = [f"k{i}" for i in range(8)]                       # hashed colours never collide
    model = viz.spans_model([ml.Span("a", k, i, i + 1.0, k) for i, k in enumerate(kinds)])
    assert len({s["color"] for s in model["styles"]}) == 8
    with pytest.raises(ml.ArgumentError, match="not an ml.Span"):
        viz.plot_spans([("a", 0.0, 1.0)])
    with pytest.raises(ml.ArgumentError, match="unknown unit"):
        viz.plot_spans(spans, unit="days")
