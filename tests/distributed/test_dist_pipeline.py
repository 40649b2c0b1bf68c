"""Pipeline parallelism: GPipe and 1F1B schedules (validity, bubble, memory) and execution."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.distributed import pipeline_parallel as pp
from mlsys_lab.errors import ArgumentError, DTypeError, UnknownNameError

NAMES = ("gpipe", "1f1b")
sizes = st.tuples(st.integers(1, 8), st.integers(1, 12))


# --- brute-force oracles, written independently of the module ----------------------------------
def brute_valid_order(schedule, p, m):
    """Execute by repeatedly picking ANY stage whose next op's inputs exist (no timing)."""
    done, nxt = set(), [0] * p
    for _ in range(2 * p * m):
        for s in range(p):
            if nxt[s] == len(schedule[s]):
                continue
            kind, j = schedule[s][nxt[s]]
            if kind == "F":
                ok = s == 0 or (s - 1, "F", j) in done
            else:
                ok = (s, "F", j) in done and (s == p - 1 or (s + 1, "B", j) in done)
            if ok:
                done.add((s, kind, j))
                nxt[s] += 1
                break
        else:
            return len(done) == 2 * p * m
    return len(done) == 2 * p * m


def brute_overlaps(timeline, p):
    """Any two operations of one stage that overlap in time (all pairs)."""
    bad = []
    for s in range(p):
        spans = [(x.start, x.end) for x in timeline if x.stage == s]
        for (a0, b0), (a1, b1) in itertools.combinations(spans, 2):
            if a0 < b1 - 1e-12 and a1 < b0 - 1e-12:
                bad.append(s)
    return bad


def brute_peak_live(timeline, p, m):
    """Peak number of micro-batches held per stage, by scanning every event time."""
    peaks, ops = [], timeline.by_op()
    for s in range(p):
        times = sorted({t for x in timeline if x.stage == s for t in (x.start, x.end)})
        peak = 0
        for t in times:
            live = sum(1 for j in range(m)
                       if ops[(s, ("F", j))].end <= t < ops[(s, ("B", j))].end)
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


@settings(max_examples=40, deadline=None)
@given(sizes, st.sampled_from(NAMES))
def test_generated_schedules_are_valid(pm, name):
    p, m = pm
    sched = pp.make_schedule(name, p, m)
    tl = pp.simulate_schedule(sched, t_forward=1.0, t_backward=2.0)
    assert pp.schedule_problems(sched, p, m, tl) == []
    assert brute_valid_order(sched, p, m)
    assert brute_overlaps(tl, p) == []
    ops = tl.by_op()
    for s in range(p):  # every dependency ends before its dependant starts
        for op in sched[s]:
            for d in pp.dependencies(p, s, op):
                assert ops[d].end <= ops[(s, op)].start + 1e-12


@settings(max_examples=40, deadline=None)
@given(sizes, st.sampled_from(NAMES), st.floats(0.1, 3.0), st.floats(0.1, 3.0))
def test_bubble_equals_standard_result_for_equal_stages(pm, name, tf, tb):
    p, m = pm
    tl = pp.simulate_schedule(pp.make_schedule(name, p, m), tf, tb)
    assert tl.makespan == pytest.approx((m + p - 1) * (tf + tb))
    assert tl.bubble_fraction() == pytest.approx(pp.bubble_fraction_standard(p, m))


@settings(max_examples=30, deadline=None)
@given(sizes)
def test_peak_activations_gpipe_m_and_1f1b_p_minus_stage(pm):
    p, m = pm
    g, f = pp.gpipe_schedule(p, m), pp.one_f_one_b_schedule(p, m)
    assert pp.in_flight_peak(g) == [m] * p
    assert pp.in_flight_peak(f) == [min(p - s, m) for s in range(p)]
    for sched in (g, f):
        tl = pp.simulate_schedule(sched, 1.0, 2.0)
        assert brute_peak_live(tl, p, m) == pp.in_flight_peak(sched)


def test_recomputation_trades_memory_for_compute():
    p, m = 4, 8
    sched = pp.gpipe_schedule(p, m)
    full = pp.activation_memory(sched, activation_bytes=100.0)
    less = pp.activation_memory(sched, activation_bytes=100.0, input_bytes=10.0, recompute=True)
    assert full == [800.0] * p and less == [8 * 10.0 + 100.0] * p
    t0 = pp.simulate_schedule(sched, 1.0, 2.0).makespan
    t1 = pp.simulate_schedule(sched, 1.0, 2.0, recompute=True).makespan
    assert t0 == pytest.approx(11 * 3.0) and t1 == pytest.approx(11 * 4.0)
    with pytest.raises(ArgumentError, match="input_bytes"):
        pp.activation_memory(sched, 100.0, recompute=True)


def test_unequal_stage_times_the_slowest_stage_dominates():
    tl = pp.simulate_schedule(pp.gpipe_schedule(3, 6), t_forward=[1, 3, 1], t_backward=[2, 6, 2])
    assert tl.makespan >= 6 * (3 + 6)
    assert tl.bubble_fraction() > pp.bubble_fraction_standard(3, 6)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(2, 6), st.data())
def test_broken_schedules_are_rejected(p, m, data):
    sched = [list(ops) for ops in pp.one_f_one_b_schedule(p, m)]
    s = data.draw(st.integers(0, p - 1))
    i, k = data.draw(st.integers(0, 2 * m - 1)), data.draw(st.integers(0, 2 * m - 1))
    sched[s][i], sched[s][k] = sched[s][k], sched[s][i]
    valid = not pp.schedule_problems(sched, p, m)
    position = {op: n for n, op in enumerate(sched[s])}
    forward_first = all(position[("F", j)] < position[("B", j)] for j in range(m))
    assert valid == (forward_first and brute_valid_order(sched, p, m))


def test_problems_are_named():
    assert "exactly once" in pp.schedule_problems([[("F", 0)]], 1, 1)[0]
    assert "before their forward" in pp.schedule_problems([[("B", 0), ("F", 0)]], 1, 1)[0]
    # stage 0 waits on B(0) from stage 1, which waits on F(1) from stage 0
    dead = [[("F", 0), ("B", 0), ("F", 1), ("B", 1)], [("F", 1), ("F", 0), ("B", 0), ("B", 1)]]
    assert "deadlock" in pp.schedule_problems(dead, 2, 2)[0]
    with pytest.raises(ArgumentError, match="invalid pipeline schedule"):
        pp.validate_schedule(dead, 2, 2)
    assert "expected 3 stages" in pp.schedule_problems(pp.gpipe_schedule(2, 2), 3, 2)[0]
    tl = pp.simulate_schedule(pp.gpipe_schedule(2, 2))
    tl = pp.Timeline(2, 2, [pp.op_span(1, ("F", 0), 0.0, 1.0) if (x.stage, x.name) == (1, "F0")
                            else x for x in tl])  # F(0) on stage 1 before stage 0 finished it
    assert any("before its dependency" in e for e in pp.schedule_problems(
        pp.gpipe_schedule(2, 2), 2, 2, tl))


def test_bad_arguments():
    with pytest.raises(ArgumentError, match="m .micro-batches. must be >= 1"):
        pp.gpipe_schedule(2, 0)
    with pytest.raises(DTypeError):
        pp.one_f_one_b_schedule(2.5, 3)
    with pytest.raises(UnknownNameError, match="gpipe"):
        pp.make_schedule("zigzag", 2, 2)
    with pytest.raises(ArgumentError, match="t_forward"):
        pp.simulate_schedule(pp.gpipe_schedule(2, 2), t_forward=-1)
    assert np.isclose(pp.bubble_fraction_standard(4, 12), 3 / 15)


# --- execution on the simulator -----------------------------------------------------------------
def _f64(module):
    for p in module.parameters():
        p.data = p.data.astype(np.float64)
    return module


def _pipeline_setup(p=4):
    import mlsys_lab as ml

    layers = []
    for i in range(p):
        layers += [ml.nn.Linear(6, 6, rng=i), ml.nn.Tanh()]
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((16, 6)), rng.standard_normal((16, 6))) for _ in range(2)]
    opt = lambda ps: ml.optim.Adam(ps, lr=0.01)
    loss = lambda pred, y: ml.ops.mse_loss(pred, ml.tensor(y))
    return _f64(ml.nn.Sequential(*layers)), data, opt, loss


def _cluster(p):
    from mlsys_lab.distributed import sim

    # compute dominates: tiny links, slow devices (so the bubble is the schedule's own)
    return sim.Cluster(sim.ring(p, alpha=1e-10, beta=1e-16, flops=1e6))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("recompute", [False, True])
def test_pipeline_on_simulator_equals_single_device(name, recompute):
    from mlsys_lab.distributed.parallel.data_parallel import single_device_train

    p, m = 4, 8
    model, data, opt, loss = _pipeline_setup(p)
    want, want_losses = single_device_train(model, opt, loss, data)
    run = pp.run_pipeline(model, data, loss, _cluster(p), schedule=name, micro_batches=m,
                          make_optimizer=opt, recompute=recompute)
    got = np.concatenate([v.ravel() for state in run.states for v in state.values()])
    np.testing.assert_allclose(got, np.concatenate([v.ravel() for v in want.values()]),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(run.losses, want_losses, rtol=1e-12)
    # the measured timeline is a valid execution of the schedule, step after step
    sched = pp.make_schedule(name, p, m * len(data))
    assert pp._timeline_problems(sched, p, run.timeline) == []
    assert brute_overlaps(run.timeline, p) == []
    assert run.bubble == pytest.approx(pp.bubble_fraction_standard(p, m), abs=1e-4)
    assert run.peak_in_flight == pp.in_flight_peak(pp.make_schedule(name, p, m))


@pytest.mark.parametrize("name", NAMES)
def test_a_schedule_emits_one_span_per_operation_on_its_stage(name):
    """The schedule's timeline is ml.Span records: one per (stage, op), on lane "stage s", named
    "F3"/"B3", kind F/B; its makespan and bubble are the spans' own sums."""
    import mlsys_lab as ml

    p, m = 3, 5
    sched = pp.make_schedule(name, p, m)
    tl = pp.simulate_schedule(sched, t_forward=1.0, t_backward=2.5)
    assert all(isinstance(x, ml.Span) and x.start <= x.end for x in tl)
    assert len(tl) == 2 * p * m and {x.lane for x in tl} == {f"stage {s}" for s in range(p)}
    assert sorted(tl.by_op()) == sorted((s, tuple(op)) for s in range(p) for op in sched[s])
    for x in tl:
        assert x.lane == f"stage {x.stage}" and x.name == f"{x.kind}{x.micro_batch}"
        assert x.end - x.start == (1.0 if x.kind == "F" else 2.5)
    busy = sum(x.end - x.start for x in tl)
    assert busy == pytest.approx(p * m * 3.5)
    assert tl.makespan == max(x.end for x in tl)
    assert tl.bubble_fraction() == pytest.approx(1 - busy / (p * tl.makespan))


def test_a_measured_pipeline_emits_the_simulators_compute_spans():
    """run_pipeline's timeline: the simulator trace's compute spans of each rank, in order,
    labelled with the schedule's operations (same times, one per operation)."""
    p, m = 3, 4
    model, data, opt, loss = _pipeline_setup(p)
    run = pp.run_pipeline(model, data[:1], loss, _cluster(p), schedule="1f1b", micro_batches=m)
    computes = [e for e in run.result.trace if e.kind == "compute"]
    assert len(run.timeline) == len(computes) == 2 * p * m
    for s in range(p):
        mine = [(e.start, e.end) for e in computes if e.rank == s]
        assert [(a, b) for a, b, _ in run.timeline.stage_ops(s)] == sorted(mine)
        assert [op for *_, op in run.timeline.stage_ops(s)] == \
            [tuple(op) for op in pp.make_schedule("1f1b", p, m)[s]]
    assert run.bubble == run.timeline.bubble_fraction()
    assert run.time >= run.timeline.makespan


def test_recomputation_measured_memory_and_time():
    p, m = 4, 8
    model, data, opt, loss = _pipeline_setup(p)
    data = data[:1]
    runs = {(name, rc): pp.run_pipeline(model, data, loss, _cluster(p), schedule=name,
                                        micro_batches=m, make_optimizer=opt, recompute=rc)
            for name in NAMES for rc in (False, True)}
    plain, re = runs[("gpipe", False)], runs[("gpipe", True)]
    assert all(a > b for a, b in zip(plain.peak_activation_bytes, re.peak_activation_bytes))
    assert re.time / plain.time == pytest.approx(4 / 3, rel=1e-3)  # backward 2 -> 2 + 1
    one = runs[("1f1b", False)].peak_activation_bytes
    assert all(a < b for a, b in zip(one[:-1], plain.peak_activation_bytes))
    per_microbatch = plain.peak_activation_bytes[0] / m
    assert one[0] == pytest.approx(per_microbatch * p)  # 1F1B stage 0 holds p micro-batches


def test_split_sequential():
    model, _, _, _ = _pipeline_setup(4)
    stages = pp.split_sequential(model, 3)
    assert sum(len(s) for s in stages) == len(model) and all(len(s) for s in stages)
    assert all(s[0].parameters() for s in stages)  # each stage starts with a Linear
    with pytest.raises(ArgumentError, match="cannot cut 8 layers into 9"):
        pp.split_sequential(model, 9)


def test_run_pipeline_bad_input():
    model, data, opt, loss = _pipeline_setup(2)
    with pytest.raises(ArgumentError, match="fewer samples than the 32 micro-batches"):
        pp.run_pipeline(model, data, loss, _cluster(2), micro_batches=32)
    bad = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]
    with pytest.raises(ArgumentError, match="invalid pipeline schedule"):
        pp.run_pipeline(model, data, loss, _cluster(2), schedule=bad)
