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
        spans = [(a, b) for (st_, _), (a, b) in timeline.spans.items() if st_ == s]
        for (a0, b0), (a1, b1) in itertools.combinations(spans, 2):
            if a0 < b1 - 1e-12 and a1 < b0 - 1e-12:
                bad.append(s)
    return bad


def brute_peak_live(timeline, p, m):
    """Peak number of micro-batches held per stage, by scanning every event time."""
    peaks = []
    for s in range(p):
        times = sorted({t for (st_, _), span in timeline.spans.items() if st_ == s for t in span})
        peak = 0
        for t in times:
            live = sum(1 for j in range(m)
                       if timeline.spans[(s, ("F", j))][1] <= t < timeline.spans[(s, ("B", j))][1])
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
    for s in range(p):  # every dependency ends before its dependant starts
        for op in sched[s]:
            for d in pp.dependencies(p, s, op):
                assert tl.spans[d][1] <= tl.spans[(s, op)][0] + 1e-12


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
    tl.spans[(1, ("F", 0))] = (0.0, 1.0)  # starts before stage 0 finished F(0)
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
