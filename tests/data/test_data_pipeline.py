"""The Pipeline: operators against plain-Python references, ordered and unordered parallel map
(the ownership scheme itself), errors, clean shutdown, the per-stage report, the passes, the
autotuner and the pipeline simulator."""

import itertools
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.data import pipeline_sim as sim
from mlsys_lab.data import transforms as T
from mlsys_lab.data.pipeline.autotune import (
    AUTOTUNE,
    brute_force,
    choose_degrees,
    predicted_throughput,
    refine_degrees,
)
from mlsys_lab.data.pipeline.passes import fuse_maps, optimize, push_filters, vectorize_maps
from mlsys_lab.data.pipeline.pipeline import (
    Pipeline,
    PipelineError,
    PipelineTimeout,
    autotune,
    collate,
    measure_costs,
)
from mlsys_lab.errors import ArgumentError


def items(n):
    return Pipeline.from_iterable(list(range(n)))


def no_leftover_threads(baseline, within=3.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if threading.active_count() <= baseline and not multiprocessing.active_children():
            return True
        time.sleep(0.02)
    return False


def equal(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


# -- operators ------------------------------------------------------------------------------------

def test_operators_match_python():
    data = list(range(23))
    assert items(23).map(lambda x: x * 3).to_list() == [x * 3 for x in data]
    assert items(23).filter(lambda x: x % 3).to_list() == [x for x in data if x % 3]
    batches = items(23).batch(5).to_list()
    assert [b.tolist() for b in batches] == [data[i:i + 5] for i in range(0, 23, 5)]
    assert len(items(23).batch(5, drop_remainder=True).to_list()) == 4
    assert items(10).repeat(3).to_list() == list(range(10)) * 3
    assert items(10).repeat().take(25).to_list() == (list(range(10)) * 3)[:25]
    assert items(23).shard(4, 1).to_list() == data[1::4]
    assert items(23).take(4).to_list() == data[:4] and items(3).take(0).to_list() == []
    assert items(23).prefetch(3).to_list() == data
    assert Pipeline.from_iterable([]).repeat().to_list() == []  # an empty pass ends a repeat


def test_collate_nests_dicts_and_tuples():
    batch = collate([{"x": np.ones(2), "y": (1, b"a")}, {"x": np.zeros(2), "y": (2, b"b")}])
    assert np.array_equal(batch["x"], [[1, 1], [0, 0]])
    assert batch["y"][0].tolist() == [1, 2] and batch["y"][1] == [b"a", b"b"]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40), st.integers(1, 12), st.integers(0, 5))
def test_shuffle_is_a_seeded_permutation_reshuffled_each_epoch(n, buffer, seed):
    pipe = items(n).shuffle(buffer, seed=seed)
    order = pipe.to_list()
    assert sorted(order) == list(range(n)) and pipe.to_list() == order
    if buffer == 1:
        assert order == list(range(n))
    two = items(n).shuffle(buffer, seed=seed).repeat(2).to_list()
    assert two[:n] == order and sorted(two[n:]) == list(range(n))
    if n >= 8 and buffer >= 4:
        assert two[n:] != order


def test_cache_replays_the_first_complete_pass():
    calls = []
    pipe = items(6).map(lambda x: calls.append(x) or x * 2).cache()
    assert pipe.take(3).to_list() == [0, 2, 4]       # an incomplete pass is not kept
    assert pipe.to_list() == pipe.to_list() == [0, 2, 4, 6, 8, 10]
    assert len(calls) == 3 + 6
    assert items(4).map(lambda x: calls.append(x) or x).cache().repeat(3).run() == 12


def test_sources():
    class MapStyle:
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i * i

    class Stream:  # like torch's IterableDataset: __getitem__ exists but must not be used
        def __getitem__(self, i):
            raise NotImplementedError

        def __iter__(self):
            return iter([7, 8])

    assert Pipeline.from_dataset(MapStyle()).to_list() == [0, 1, 4, 9]
    assert Pipeline.from_dataset(Stream()).repeat(2).to_list() == [7, 8, 7, 8]
    assert Pipeline.from_dataset(range(3)).to_list() == [0, 1, 2]
    assert Pipeline.from_iterable(lambda: iter("ab")).repeat(2).to_list() == list("abab")
    once = Pipeline.from_iterable(iter([1, 2]))
    assert once.to_list() == [1, 2]
    with pytest.raises(ArgumentError, match="read only once"):
        once.to_list()
    with pytest.raises(ArgumentError, match="not iterable"):
        Pipeline.from_iterable(5)


def test_bad_arguments_are_clear():
    for call, match in [(lambda: items(3).batch(0), "size"),
                        (lambda: items(3).map(1), "callable"),
                        (lambda: items(3).map(abs, num_parallel=0), "num_parallel"),
                        (lambda: items(3).map(abs, executor="gpu"), "executor"),
                        (lambda: items(3).shard(2, 2), "index"),
                        (lambda: items(3).shuffle(0), "buffer"),
                        (lambda: items(3).map(T.RandomRotation(5)), "seed=")]:
        with pytest.raises(ArgumentError, match=match):
            call()


# -- parallel map ---------------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(0, 30), st.integers(1, 4), st.integers(0, 2**31))
def test_ordered_parallel_map_keeps_order_whatever_the_timing(n, workers, seed):
    delays = np.random.default_rng(seed).uniform(0, 0.002, max(n, 1))
    slow = lambda x: (time.sleep(delays[x]), x * 10)[1]
    out = items(n).map(slow, num_parallel=workers).to_list()
    assert out == [x * 10 for x in range(n)]
    loose = items(n).map(slow, num_parallel=workers, deterministic=False).to_list()
    assert sorted(loose) == out


def test_producer_i_owns_items_i_plus_m_k():
    workers = 3
    seen = items(30).map(lambda x: (x, threading.current_thread().name),
                         num_parallel=workers).to_list()
    for x, thread in seen:
        assert thread.endswith(f":{x % workers}"), (x, thread)


def test_unordered_map_yields_as_ready():
    slow_first = lambda x: (time.sleep(0.3 if x == 0 else 0), x)[1]
    out = items(8).map(slow_first, num_parallel=2, deterministic=False).to_list()
    assert out[0] != 0 and sorted(out) == list(range(8))


def test_process_executor_matches_threads_and_reports_worker_errors():
    pid = os.getpid()
    pids = items(12).map(lambda x: (x, os.getpid()), num_parallel=2,
                         executor="process").to_list()
    assert [x for x, _ in pids] == list(range(12)) and pid not in {p for _, p in pids}
    bad = lambda x: 1 / (x - 5)
    with pytest.raises(PipelineError, match=r"failed on item 5: ZeroDivisionError") as info:
        items(12).map(bad, num_parallel=2, executor="process").to_list()
    assert "worker traceback" in str(info.value) and info.value.index == 5
    unsendable = items(5).map(lambda x: (lambda: x) if x == 2 else x)
    with pytest.raises(PipelineError, match="item 2 cannot be sent"):
        unsendable.map(abs, num_parallel=2, executor="process").to_list()
    with pytest.raises(PipelineError, match="item 0.*result cannot be sent back"):
        items(5).map(lambda x: (lambda: x), num_parallel=2, executor="process").to_list()
    die = lambda x: os._exit(3) if x == 4 else x
    with pytest.raises(PipelineError, match="died"):
        items(12).map(die, num_parallel=2, executor="process").to_list()
    assert no_leftover_threads(threading.active_count())


@pytest.mark.parametrize("parallel", [None, 2])
def test_user_errors_name_the_operator_and_item(parallel):
    def picky(x):
        if x == 7:
            raise ValueError("seven")
        return x

    pipe = items(20).map(picky, num_parallel=parallel, name="picky")
    with pytest.raises(PipelineError, match="'picky' failed on item 7: ValueError: seven") as e:
        pipe.to_list()
    assert isinstance(e.value.__cause__, ValueError) and e.value.op == "picky"
    got = []
    with pytest.raises(PipelineError):
        for x in pipe:
            got.append(x)
    assert got == list(range(7))  # everything before the failure, in order, then the error
    with pytest.raises(PipelineError, match="filter.*item 3"):
        items(5).filter(lambda x: 1 / (x - 3)).to_list()
    ragged = Pipeline.from_iterable([np.zeros(2), np.zeros(3)]).batch(2)
    with pytest.raises(PipelineError, match="batch operator 'batch' failed on batch 0"):
        ragged.to_list()
    upstream_failure = items(9).map(picky).map(abs, num_parallel=2)
    with pytest.raises(PipelineError, match="item 7"):
        upstream_failure.to_list()


def test_early_break_exception_and_take_leave_no_threads():
    baseline = threading.active_count()
    pipe = items(1000).map(lambda x: (time.sleep(0.001), x)[1], num_parallel=3).prefetch(4)
    for x in pipe.map(abs, num_parallel=2):
        if x == 5:
            break
    assert no_leftover_threads(baseline)
    with pytest.raises(PipelineError):
        items(100).map(lambda x: 1 // (x - 50), num_parallel=3).prefetch(2).to_list()
    assert no_leftover_threads(baseline)
    assert pipe.take(7).to_list() == list(range(7))
    with pytest.raises(KeyError):
        for x in pipe:
            if x == 2:
                raise KeyError("the loop body failed")
    assert no_leftover_threads(baseline)
    for x in items(1000).map(abs, num_parallel=2, executor="process"):
        if x == 3:
            break
    assert no_leftover_threads(baseline)


def test_timeout():
    stuck = items(3).map(lambda x: time.sleep(2) or x, num_parallel=1)
    start = time.monotonic()
    with pytest.raises(PipelineTimeout, match="within 0.2 s"):
        list(stuck.iter(timeout=0.2))
    assert time.monotonic() - start < 1.9


# -- seeded randomness ----------------------------------------------------------------------------

def augment_pipeline(parallel=None, deterministic=True, n=20):
    """Only the seeded map may be unordered: an unordered map upstream of it would renumber
    its input (item indices follow arrival order), and so change which item gets which angle."""
    pixels = [np.random.default_rng(i).integers(0, 256, (6, 6, 3)).astype(np.uint8)
              for i in range(n)]
    return (Pipeline.from_iterable([{"image": p, "label": i} for i, p in enumerate(pixels)])
            .map(T.Resize(5), field="image", num_parallel=parallel)
            .map(T.RandomRotation(40), field="image", seed=11, num_parallel=parallel,
                 deterministic=deterministic)
            .map(T.Normalize(), field="image", num_parallel=parallel))


def test_seeded_maps_do_not_depend_on_threads_or_order():
    reference = {r["label"]: r["image"] for r in augment_pipeline().to_list()}
    for parallel, det in [(3, True), (3, False), (1, True)]:
        got = augment_pipeline(parallel, det).to_list()
        assert len(got) == 20
        assert all(np.array_equal(reference[r["label"]], r["image"]) for r in got)
    twice = augment_pipeline().repeat(2).to_list()
    assert not np.array_equal(twice[0]["image"], twice[20]["image"])  # a new epoch, new angles


# -- report ---------------------------------------------------------------------------------------

def test_profile_reports_every_stage_and_a_timeline():
    pipe = (items(40).map(lambda x: x + 1, name="cheap")
            .map(lambda x: time.sleep(0.003) or x, num_parallel=2, name="slow").batch(8))
    report = pipe.profile()
    names = [s.name for s in report.stages]
    assert names == ["source", "cheap", "slow", "batch"] and report.outputs == 5
    slow, cheap = report.stage("slow"), report.stage("cheap")
    assert slow.degree == 2 and slow.items == 40 and report.stage("batch").items == 5
    assert all(0 <= s.busy <= 1 and 0 <= s.waiting <= 1 for s in report.stages)
    assert report.bottleneck == "slow" and slow.busy > cheap.busy
    assert slow.busy_seconds >= 40 * 0.003
    events = [e for e in report.timeline if e.stage == "slow"]
    assert sorted(e.item for e in events) == list(range(40))
    assert {e.worker for e in events} == {0, 1}
    assert all(0 <= e.start <= e.end <= report.wall for e in report.timeline)
    assert "bottleneck: slow" in report.table()
    assert pipe.run() == 5 and pipe.run(report=True).outputs == 5
    assert items(40).profile(7).outputs == 7


def test_a_profile_emits_one_span_per_item_per_stage_adding_up_to_the_report():
    """Report.timeline is ml.Span records (lane "stage worker", kind the stage, details stage,
    worker, item) whose durations add up to each stage's busy seconds."""
    import mlsys_lab as ml

    pipe = (items(24).map(lambda x: x * 2, name="double")
            .map(lambda x: time.sleep(0.001) or x, num_parallel=2, name="nap"))
    report = pipe.profile()
    assert all(isinstance(e, ml.Span) and e.start <= e.end for e in report.timeline)
    for e in report.timeline:
        assert (e.lane, e.kind, e.name) == (f"{e.stage} {e.worker}", e.stage, f"item {e.item}")
    for stage in report.stages:
        mine = [e for e in report.timeline if e.stage == stage.name]
        assert len(mine) == stage.items
        assert sum(e.end - e.start for e in mine) == pytest.approx(stage.busy_seconds, rel=1e-9)
        assert len({e.lane for e in mine}) <= stage.degree
    assert {e.lane for e in report.timeline if e.stage == "nap"} == {"nap 0", "nap 1"}


def test_the_simulator_emits_spans_that_add_up_to_its_utilisation():
    """SimResult.timeline: one span per item per stage (the same record as a profile), each
    worker one item at a time; the busy seconds per stage are its utilisation x degree x
    makespan (no shared CPUs, so a worker runs at full speed)."""
    import mlsys_lab as ml

    result = sim.simulate(sim.book_stages(), 60, timeline=True)
    spans = result.timeline
    assert all(isinstance(e, ml.Span) and e.start <= e.end <= result.makespan for e in spans)
    assert {e.lane for e in spans} == {f"{name} {w}" for name, d in sim.BOOK_DEGREES.items()
                                       for w in range(d)}
    for stage in result.stages:
        mine = [e for e in spans if e.kind == stage.name]
        assert sorted(e.item for e in mine) == list(range(60))
        busy = sum(e.end - e.start for e in mine)
        assert busy == pytest.approx(stage.utilisation * stage.degree * result.makespan)
        for lane in {e.lane for e in mine}:
            own = sorted((e.start, e.end) for e in mine if e.lane == lane)
            assert all(a[1] <= b[0] + 1e-12 for a, b in zip(own, own[1:]))
    assert sim.simulate(sim.book_stages(), 60).timeline == ()


# -- passes ---------------------------------------------------------------------------------------

def test_fusion_composes_maps_with_equal_parallelism_only():
    pipe = items(10).map(lambda x: x + 1).map(lambda x: x * 2).map(abs, num_parallel=2)
    before = [n.name for n in pipe.nodes]
    fused = fuse_maps(pipe)
    assert [n.kind for n in fused.nodes] == ["source", "map", "map"]
    assert [n.name for n in pipe.nodes] == before  # the input is untouched
    assert fused.to_list() == pipe.to_list() == [(x + 1) * 2 for x in range(10)]
    mixed = items(4).map(abs, num_parallel=2).map(abs, num_parallel=2, deterministic=False)
    assert len(fuse_maps(mixed).nodes) == 3


def test_vectorisation_moves_batch_up_and_keeps_results():
    pipe = augment_pipeline(n=13).batch(4)
    fast = vectorize_maps(fuse_maps(pipe))
    assert [n.kind for n in fast.nodes] == ["source", "batch", "map"]
    assert fast.nodes[-1].batch_size == 4
    slow_out, fast_out = pipe.to_list(), fast.to_list()
    assert len(fast_out) == 4 and all(equal(a, b) for a, b in zip(slow_out, fast_out))
    # illegal: a map without a batched form, or a batch with its own collate_fn
    plain = items(6).map(lambda x: x + 1).batch(2)
    assert [n.kind for n in vectorize_maps(plain).nodes] == ["source", "map", "batch"]
    custom = items(6).map(T.Normalize()).batch(2, collate_fn=list)
    assert [n.kind for n in vectorize_maps(custom).nodes] == ["source", "map", "batch"]


def test_filter_pushdown_only_when_declared_legal():
    calls = []
    record = lambda x: calls.append(1) or x * 10
    data = Pipeline.from_iterable([{"x": i, "label": i % 3} for i in range(12)])
    keep = lambda r: r["label"] == 0
    pipe = data.map(record, field="x").filter(keep, reads="label")
    pushed = push_filters(pipe)
    assert [n.kind for n in pushed.nodes] == ["source", "filter", "map"]
    assert pushed.to_list() == pipe.to_list()
    calls.clear()
    pushed.run()
    assert len(calls) == 4  # the map no longer sees the dropped items
    illegal = [data.map(record, field="x").filter(keep),                      # reads undeclared
               data.map(record, field="label").filter(keep, reads="label"),   # map changes it
               data.map(lambda r: r).filter(keep, reads="label"),             # map undeclared
               data.map(lambda r, rng: r, seed=1, preserves="label").filter(keep, reads="label"),
               vectorize_maps(data.map(abs, field="x", batched_fn=abs).batch(2)).filter(
                   lambda b: b["label"][0] == 0, reads="label")]                # per-batch map
    for pipe in illegal:
        assert [n.kind for n in push_filters(pipe).nodes] == [n.kind for n in pipe.nodes]
    declared = data.map(lambda r: {**r, "x": -r["x"]}, preserves=["label"]).filter(
        keep, reads="label")
    assert push_filters(declared).nodes[1].kind == "filter"


OPS = st.sampled_from(["inc", "dbl", "inc_par", "even", "batch", "shuffle", "take", "norm"])


def build(ops):
    pipe = Pipeline.from_iterable([{"v": np.float64(i), "k": i % 4} for i in range(17)])
    batched = False
    for op in ops:
        if op == "inc":
            pipe = pipe.map(lambda v: v + 1, field="v", batched_fn=lambda v: v + 1)
        elif op == "dbl":
            pipe = pipe.map(lambda v: v * 2, field="v", batched_fn=lambda v: v * 2)
        elif op == "inc_par":
            pipe = pipe.map(lambda v: v + 1, field="v", num_parallel=2)
        elif op == "norm" and not batched:
            pipe = pipe.map(lambda v, rng: v + rng.uniform(), field="v", seed=5,
                            batched_fn=lambda v, rngs: v + np.array([r.uniform() for r in rngs]))
        elif op == "even" and not batched:
            pipe = pipe.filter(lambda r: r["k"] % 2 == 0, reads="k")
        elif op == "batch" and not batched:
            pipe, batched = pipe.batch(3), True
        elif op == "shuffle":
            pipe = pipe.shuffle(4, seed=2)
        elif op == "take":
            pipe = pipe.take(11)
    return pipe


@settings(max_examples=40, deadline=None)
@given(st.lists(OPS, max_size=7))
def test_optimize_never_changes_results(ops):
    pipe = build(ops)
    names = [n.name for n in pipe.nodes]
    optimised, steps = optimize(pipe, return_steps=True)
    assert [n.name for n in pipe.nodes] == names
    assert all(isinstance(name, str) for name, _ in steps)
    assert equal(pipe.to_list(), optimised.to_list())


# -- autotuner ------------------------------------------------------------------------------------

costs_lists = st.lists(st.floats(0.1, 10), min_size=1, max_size=4)


@settings(max_examples=60, deadline=None)
@given(costs_lists, st.integers(0, 6), st.sampled_from([None, 2, 3.5]), st.booleans())
def test_autotuner_finds_the_brute_force_optimum(costs, extra, cores, with_fixed):
    costs = {f"s{i}": c for i, c in enumerate(costs)}
    fixed = {"s0": 2} if with_fixed and len(costs) > 1 else None
    budget = len(costs) - (1 if fixed else 0) + extra
    chosen = choose_degrees(costs, budget, fixed=fixed, cores=cores)
    best = brute_force(costs, budget, fixed=fixed, cores=cores)
    assert sum(chosen.values()) - sum((fixed or {}).values()) <= budget
    rate, best_rate = (predicted_throughput(costs, d, cores) for d in (chosen, best))
    assert rate == pytest.approx(best_rate, rel=1e-9)
    assert sum(chosen.values()) == sum(best.values())  # and no more workers than needed


def test_autotuner_gives_the_bottleneck_more_workers():
    costs = {"decode": 3.0, "resize": 2.0, "rotate": 4.0, "normalize": 3.0, "chw": 1.0}
    degrees = choose_degrees(costs, 13)
    assert degrees == {"decode": 3, "resize": 2, "rotate": 4, "normalize": 3, "chw": 1}
    assert choose_degrees({"a": 4.0, "b": 1.0}, 2) == {"a": 1, "b": 1}
    assert choose_degrees({"a": 4.0, "b": 1.0}, 5) == {"a": 4, "b": 1}
    assert choose_degrees({"a": 4.0, "b": 1.0}, 9) == {"a": 7, "b": 2}
    capped = choose_degrees({"src": 1.0, "a": 4.0, "b": 1.0}, 9, fixed={"src": 1})
    assert capped == {"src": 1, "a": 4, "b": 1}  # the fixed stage caps the rate: spare unused
    assert choose_degrees({"a": 4.0, "b": 1.0}, 9, cores=2) == {"a": 2, "b": 1}
    with pytest.raises(ArgumentError, match="budget"):
        choose_degrees({"a": 1.0, "b": 1.0}, 1)


def test_autotuned_degrees_are_optimal_on_the_simulator():
    costs = {"decode": 0.004, "resize": 0.001, "rotate": 0.006}
    budget = 8
    chosen = choose_degrees(costs, budget)
    assert chosen != dict.fromkeys(costs, 1)
    stages = lambda degrees: [sim.SimStage(n, c, degrees[n]) for n, c in costs.items()]
    tuned = sim.simulate(stages(chosen), 300).throughput
    every = [dict(zip(costs, combo)) for combo in itertools.product(range(1, 7), repeat=3)
             if sum(combo) <= budget]
    best = max(sim.simulate(stages(d), 300).throughput for d in every)
    assert tuned >= 0.98 * best


def test_autotune_a_real_pipeline():
    pipe = (items(40).map(lambda x: x + 1, num_parallel=AUTOTUNE, name="a")
            .map(lambda x: x * 2, num_parallel=AUTOTUNE, name="b"))
    tuned = autotune(pipe, budget=5, costs={"source": 0.0, "a": 3.0, "b": 1.0})
    assert [n.num_parallel for n in tuned.nodes[1:]] == [3, 1]  # 3.0/3 = 1.0/1
    assert tuned.to_list() == pipe.to_list() == [(x + 1) * 2 for x in range(40)]
    with pytest.raises(ArgumentError, match="no cost"):
        autotune(pipe, costs={"a": 1.0})


def test_measured_costs_are_per_source_item(monkeypatch):
    from mlsys_lab.data.pipeline import runtime as pipeline_runtime

    clock = [0.0]
    monkeypatch.setattr(pipeline_runtime, "clock", lambda: clock[0])

    def spend(units):
        def work(x):
            clock[0] += units
            return x
        return work

    def collate_slowly(chunk):
        clock[0] += 4.0
        return chunk

    pipe = (items(16).map(spend(3.0), name="a").filter(lambda x: x % 2 == 0)
            .map(spend(2.0), name="b").batch(4, collate_fn=collate_slowly))
    costs = measure_costs(pipe, sample=100)
    assert costs["a"] == 3.0 and costs["b"] == 1.0 and costs["batch"] == 0.5
    assert costs["source"] == 0.0
    tuned = autotune(pipe, budget=4, sample=100)
    assert {n.name: n.num_parallel for n in tuned.nodes if n.kind == "map"} == {"a": 3, "b": 1}


# -- simulator ------------------------------------------------------------------------------------

stage_lists = st.lists(st.tuples(st.floats(0.5, 5), st.integers(1, 4)), min_size=1, max_size=4)


@settings(max_examples=30, deadline=None)
@given(stage_lists, st.booleans())
def test_simulated_throughput_is_min_of_degree_over_cost(spec, ordered):
    stages = [sim.SimStage(f"s{i}", c / 1000, d) for i, (c, d) in enumerate(spec)]
    result = sim.simulate(stages, 240, ordered=ordered)
    expected = min(d / (c / 1000) for c, d in spec)
    assert result.analytic == pytest.approx(expected)
    assert result.throughput == pytest.approx(expected, rel=0.02)
    slowest = min(range(len(spec)), key=lambda i: spec[i][1] / spec[i][0])
    assert result.stages[slowest].utilisation > 0.75


@settings(max_examples=20, deadline=None)
@given(stage_lists)
def test_shared_cores_cap_the_rate(spec):
    stages = [sim.SimStage(f"s{i}", c / 1000, d) for i, (c, d) in enumerate(spec)]
    result = sim.simulate(stages, 240, cores=3)
    bound = min(min(d / (c / 1000) for c, d in spec), 3 / sum(c / 1000 for c, _ in spec))
    assert result.analytic == pytest.approx(bound)
    assert 0.75 * bound <= result.throughput <= bound * 1.001


def test_device_idles_exactly_when_it_is_faster_than_the_data():
    stages = sim.book_stages()                        # P = 1000 items/s
    assert sim.preprocess_rate(stages) == pytest.approx(1000)
    for read, consume in [(2000, 500), (800, 600), (900, 1200), (3000, 1500), (700, 2000)]:
        result = sim.simulate(stages, 400, read_rate=read, consume_rate=consume)
        supply = min(read, 1000)
        assert result.throughput == pytest.approx(min(supply, consume), rel=0.02)
        if consume < supply:
            assert result.device_idle < 0.02 and result.bottleneck == "device"
        else:
            assert result.device_idle == pytest.approx(1 - supply / consume, abs=0.02)
            assert result.bottleneck in ("read", "decode", "resize", "rotate", "normalize",
                                         "hwc_to_chw")


def test_book_example_on_sixteen_cores_and_the_moving_bottleneck():
    assert sim.BOOK_DEGREES == {"decode": 3, "resize": 2, "rotate": 4, "normalize": 3,
                                "hwc_to_chw": 1}
    balanced = sim.simulate(sim.book_stages(), 300, cores=16, timeline=True)
    assert balanced.throughput == pytest.approx(1000, rel=0.02)
    assert all(s.utilisation > 0.9 for s in balanced.stages)
    assert len(balanced.timeline) == 300 * 5
    starved = sim.simulate(sim.book_stages(degrees={"rotate": 2}), 300, cores=16)
    assert starved.bottleneck == "rotate"
    assert starved.throughput == pytest.approx(500, rel=0.02)
    assert max(starved.stages, key=lambda s: s.utilisation).name == "rotate"
    shared = sim.simulate(sim.book_stages(), 300, cores=8)
    assert shared.bottleneck == "cpus" and shared.throughput == pytest.approx(8000 / 13, rel=0.02)


def test_ordered_simulation_with_variable_costs_finishes_and_is_not_faster():
    costs = list(np.random.default_rng(0).exponential(0.003, 300))
    stages = [sim.SimStage("decode", costs, 3), sim.SimStage("chw", 0.0005, 1)]
    ordered = sim.simulate(stages, 300, ordered=True)
    loose = sim.simulate(stages, 300, ordered=False)
    assert ordered.throughput <= loose.throughput * 1.01
    with pytest.raises(ArgumentError, match="degree"):
        sim.simulate([sim.SimStage("x", 1.0, 0)])


# -- measured refinement of the tuner's choice ---------------------------------------------------

def contended(costs, cores, overhead):
    """A stand-in for measurement: the model's rate, less a hand-off cost per worker beyond the
    cores (what the idealised model leaves out)."""
    def rate(degrees):
        extra = max(0, sum(degrees.values()) - cores)
        return predicted_throughput(costs, degrees, cores) / (1 + overhead * extra)
    return rate


def test_refine_moves_off_the_idealised_choice_when_measurement_disagrees():
    costs = {"a": 3.0, "b": 1.0}
    start = choose_degrees(costs, 4)          # the model, with a core per worker: a 3, b 1
    assert start == {"a": 3, "b": 1}
    evaluate = contended(costs, cores=2, overhead=0.6)   # extra workers cost more than they give
    best, tried = refine_degrees(start, 4, evaluate)
    exhaustive = max((evaluate({"a": a, "b": b}), -(a + b), (a, b))
                     for a in range(1, 4) for b in range(1, 4) if a + b <= 4)
    assert (best["a"], best["b"]) == exhaustive[2] and best != start
    assert tried[(3, 1)] == evaluate(start) and len(tried) > 1


def test_refine_keeps_the_start_unless_a_neighbour_is_clearly_better():
    calls = []
    flat = lambda degrees: calls.append(dict(degrees)) or 100.0
    best, tried = refine_degrees({"a": 2, "b": 1}, 3, flat)
    assert best == {"a": 2, "b": 1}
    assert all(sum(d.values()) <= 3 and min(d.values()) >= 1 for d in calls)
    assert {(1, 1), (1, 2)} <= set(tried)  # one fewer; one moved


def test_refine_on_the_simulator_never_ends_below_the_model():
    costs = {"decode": 6e-4, "resize": 8e-5, "rotate": 1e-4, "normalize": 1.2e-5, "chw": 4e-6}
    start = choose_degrees(costs, 16, cores=16)
    run = lambda d: sim.simulate([sim.SimStage(n, costs[n], d[n]) for n in costs], 300,
                                 cores=16).throughput
    best, tried = refine_degrees(start, 16, run, rounds=2)
    assert run(best) >= run(start) and sum(best.values()) <= 16


def test_autotune_with_refine_picks_a_measured_allocation_and_keeps_results():
    pipe = (items(30).map(lambda x: x + 1, num_parallel=AUTOTUNE, name="a")
            .map(lambda x: x * 2, num_parallel=AUTOTUNE, name="b"))
    tuned = autotune(pipe, budget=3, costs={"source": 0.0, "a": 2.0, "b": 1.0}, refine=1,
                     sample=10, repeats=1)
    degrees = {n.name: n.num_parallel for n in tuned.nodes if n.kind == "map"}
    assert sum(degrees.values()) <= 3 and min(degrees.values()) >= 1
    assert tuned.to_list() == [(x + 1) * 2 for x in range(30)]


def test_refine_does_not_move_on_one_disturbed_measurement():
    calls = {}

    def spiky(degrees):  # (1, 1) looks twice as fast the first time only
        key = (degrees["a"], degrees["b"])
        calls[key] = calls.get(key, 0) + 1
        return 200.0 if key == (1, 1) and calls[key] == 1 else 100.0

    best, tried = refine_degrees({"a": 2, "b": 1}, 3, spiky)
    assert best == {"a": 2, "b": 1} and calls[(1, 1)] == 2 and calls[(2, 1)] == 2
    steady = lambda degrees: 200.0 if (degrees["a"], degrees["b"]) == (1, 1) else 100.0
    assert refine_degrees({"a": 2, "b": 1}, 3, steady)[0] == {"a": 1, "b": 1}
