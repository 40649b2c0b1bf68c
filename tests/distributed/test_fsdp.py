"""FSDP (ZeRO stage 3 with per-layer gathers): training equal to one device on 2-8 simulated
ranks and 2-4 MPI processes, per-rank memory equal to the ZeRO-3 formula, the schedule (gather
before use, free after, prefetch one unit ahead), and the exposed communication a prefetching
run leaves against sum(max(0, gather - compute)) computed from the alpha-beta cost model."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.distributed import data_parallel as dp
from mlsys_lab.distributed import fsdp, sim, zero
from mlsys_lab.distributed.collectives import cost
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError


def mlp(widths, seed, dtype=np.float64, act=ml.nn.Tanh):
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers.append(ml.nn.Linear(a, b, rng=seed * 100 + i))
        if i < len(widths) - 2:
            layers.append(act())
    model = ml.nn.Sequential(*layers)
    for p in model.parameters():
        p.data = p.data.astype(dtype)
    return model


def batches(widths, sizes, seed, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n, widths[0])).astype(dtype),
             rng.standard_normal((n, widths[-1])).astype(dtype)) for n in sizes]


def mse(pred, y):
    return ml.ops.mse_loss(pred, ml.tensor(y))


def adam(ps):
    return ml.optim.Adam(ps, lr=0.05)


def momentum(ps):
    return ml.optim.SGD(ps, lr=0.1, momentum=0.9)


# --- equal to one device -------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_fsdp_training_equals_one_device_on_random_mlps(n):
    rng = np.random.default_rng(n)
    widths = [int(w) for w in rng.integers(1, 9, int(rng.integers(3, 6)))]
    model = mlp(widths, n)
    sizes = [16, 11, 5]  # uneven shards; at n > 5 some ranks get no sample of the last batch
    data = batches(widths, sizes, n)
    make = adam if n % 2 else momentum
    want, want_losses = dp.single_device_train(model, make, mse, data)
    runs = {}
    for prefetch in (True, False):
        run = fsdp.fsdp_train(model, make, mse, data, sim.Cluster(sim.ring(n)),
                              prefetch=prefetch)
        for k in want:
            np.testing.assert_allclose(run.state[k], want[k], rtol=0, atol=1e-10, err_msg=k)
        np.testing.assert_allclose(run.losses, want_losses, rtol=1e-12)
        runs[prefetch] = run
    # prefetch changes when a gather runs, not what it sums: bit-identical
    for k in want:
        np.testing.assert_array_equal(runs[True].state[k], runs[False].state[k])
    assert runs[True].bytes_sent == runs[False].bytes_sent


def test_fsdp_float32_within_1e_6_and_the_model_is_not_changed():
    widths = [6, 8, 8, 3]
    model = mlp(widths, 3, np.float32)
    before = {k: v.copy() for k, v in model.state_dict().items()}
    data = batches(widths, [12, 12], 3, np.float32)
    want, _ = dp.single_device_train(model, adam, mse, data)
    run = fsdp.fsdp_train(model, adam, mse, data, sim.Cluster(sim.ring(4)))
    for k in want:
        assert run.state[k].dtype == np.float32
        np.testing.assert_allclose(run.state[k], want[k], rtol=0, atol=1e-6)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


# --- units, layouts, schedule --------------------------------------------------------------
def test_units_are_layers_with_their_activations_and_shards_are_padded():
    model = ml.nn.Sequential(ml.nn.ReLU(), ml.nn.Linear(3, 5, rng=0), ml.nn.Tanh(),
                             ml.nn.Linear(5, 2, rng=1), ml.nn.Tanh(), ml.nn.Dropout(0.0))
    units = fsdp.fsdp_units(model)
    assert [[type(m).__name__ for m in u] for u in units] == [
        ["ReLU", "Linear", "Tanh"], ["Linear", "Tanh", "Dropout"]]
    layouts = fsdp.unit_layouts(model, 4)
    assert [(lay.size, lay.padded, lay.shard) for lay in layouts] == [(20, 20, 5), (12, 12, 3)]
    assert [(lay.size, lay.padded, lay.shard) for lay in fsdp.unit_layouts(model, 3)] == [
        (20, 21, 7), (12, 12, 4)]
    assert layouts[0].shard_bytes == 5 * 4 and layouts[0].full_bytes == 20 * 4
    # a model that is no Sequential is one unit: the old whole-model gather
    assert len(fsdp.fsdp_units(ml.nn.Linear(2, 2, rng=0))) == 1


def _check_schedule(ops, units, prefetch):
    gathered, issued, seen = set(), set(), []
    for i, (action, u) in enumerate(ops):
        if action == "gather":
            assert u not in issued and u not in gathered, (i, ops)
            issued.add(u)
        elif action == "wait":
            issued.remove(u)
            gathered.add(u)
        elif action in ("forward", "backward"):
            assert u in gathered, f"{action} {u} without its parameters: {ops}"
            seen.append((action, u))
            # prefetch: the next unit's gather is already on its way while this one computes
            nxt = u + 1 if action == "forward" else u - 1
            if prefetch and 0 <= nxt < units:
                assert nxt in issued, (action, u, ops)
            if not prefetch:
                assert not issued
        elif action == "free":
            gathered.remove(u)
        elif action == "reduce_scatter":
            assert ops[i - 2] == ("backward", u) and ops[i - 1] == ("free", u)
        assert len(gathered | issued) <= (2 if prefetch else 1)
    assert seen == [("forward", u) for u in range(units)] + \
        [("backward", u) for u in reversed(range(units))]
    assert not gathered and not issued and ops[-2:] == [("sync", None), ("step", None)]


@pytest.mark.parametrize("units", [1, 2, 5])
@pytest.mark.parametrize("prefetch", [True, False])
def test_schedule_gathers_before_use_frees_after_and_prefetches_one_ahead(units, prefetch):
    ops = fsdp.fsdp_schedule(units, prefetch)
    _check_schedule(ops, units, prefetch)
    # each unit: two all-gathers (forward, backward) and one reduce-scatter per step
    assert sum(a == "gather" for a, _ in ops) == 2 * units
    assert sum(a == "reduce_scatter" for a, _ in ops) == units


def test_schedule_slots_and_exposed_communication_by_hand():
    # two units, gathers of 3 s and 5 s, reduce-scatters of 1 s, forward 2 s, backward 4 s
    gather = {0: 3.0, 1: 5.0}
    comm = lambda a, u: gather[u] if a == "gather" else 1.0
    comp = lambda a, u: 2.0 if a == "forward" else 4.0
    slots = fsdp.schedule_slots(fsdp.fsdp_schedule(2, True), comm, comp)
    # AG0 alone; AG1 behind F0; AG1 again alone (issued after F1 and the loss: F1 hides
    # nothing); AG0 behind B1; RS1 behind B0; RS0 alone
    assert slots == [(3.0, 0.0), (5.0, 2.0), (5.0, 0.0), (3.0, 4.0), (1.0, 4.0), (1.0, 0.0)]
    assert fsdp.exposed_communication(slots) == 3 + 3 + 5 + 1
    plain = fsdp.schedule_slots(fsdp.fsdp_schedule(2, False), comm, comp)
    assert fsdp.exposed_communication(plain) == 2 * (3 + 5) + 2 * 1  # nothing hidden


# --- memory: the ZeRO-3 formula ------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 4])
def test_per_rank_memory_equals_zero3_formula(n):
    # float32 Adam: 4 + 4 + 8 bytes per parameter, the formula's 2 + 2 + K with K = 12;
    # every layer's size divides by 2 and 4, so no padding: exactly (2 + 2 + 12) P / N
    widths = [5, 4, 8, 4]
    model = mlp(widths, 1, np.float32)
    layouts = fsdp.unit_layouts(model, n)
    assert [lay.size for lay in layouts] == [24, 40, 36]
    P = model.num_parameters()
    run = fsdp.fsdp_train(model, adam, mse, batches(widths, [8, 8], 1, np.float32),
                          sim.Cluster(sim.ring(n)))
    parts = zero.zero_memory_breakdown(P, n, 3, k=8, weight_bytes=4, grad_bytes=4)
    for held in run.held:
        assert held["total"] == zero.zero_memory_per_device(P, n, 3)
        assert (held["params"], held["grads"], held["optimizer"]) == (
            parts["params"], parts["grads"], parts["optimizer"])
    full = [lay.full_bytes for lay in layouts]
    for peak, held in zip(run.peak, run.held):
        # on top of the shards: this unit and the prefetched next one, never the whole model
        assert peak["gathered"] == max(a + b for a, b in zip(full, full[1:]))
        assert peak["gathered"] < sum(full)
        assert max(full) <= peak["unsharded_grads"] <= peak["gathered"]
        assert peak["total"] <= held["total"] + peak["gathered"] + peak["unsharded_grads"]
    plain = fsdp.fsdp_train(model, adam, mse, batches(widths, [8, 8], 1, np.float32),
                            sim.Cluster(sim.ring(n)), prefetch=False)
    assert [p["gathered"] for p in plain.peak] == [max(full)] * n


def test_padded_memory_is_the_formula_of_the_padded_count():
    widths = [3, 5, 2]  # layers of 20 and 12 parameters on 3 ranks: 20 pads to 21
    model = mlp(widths, 2)
    run = fsdp.fsdp_train(model, momentum, mse, batches(widths, [9], 2), sim.Cluster(sim.ring(3)))
    padded = sum(lay.padded for lay in run.layouts)
    assert padded == 33 and model.num_parameters() == 32
    for held in run.held:  # float64 SGD with a momentum buffer: 8 + 8 + 8 bytes
        assert held["total"] == zero.zero_memory_breakdown(padded, 3, 3, k=8, weight_bytes=8,
                                                           grad_bytes=8)["total"]


# --- prefetch: overlap and exposed communication -------------------------------------------
def _overlap_setup(prefetch):
    widths = [48, 48, 8, 48, 48, 16]  # units of 2352, 392, 432, 2352 and 784 parameters
    model = mlp(widths, 4, np.float32)
    data = batches(widths, [32, 32], 4, np.float32)
    p, alpha, beta, flops = 4, 2e-6, 1 / 10e9, 4e9
    cluster = sim.Cluster(sim.ring(p, alpha=alpha, beta=beta, flops=flops))
    run = fsdp.fsdp_train(model, lambda ps: ml.optim.SGD(ps, lr=0.01), mse, data, cluster,
                          prefetch=prefetch)
    layouts = run.layouts
    total = sum(lay.size for lay in layouts)

    def comm(action, u):  # the alpha-beta cost of the collective alone
        kind = "allgather" if action == "gather" else "reduce_scatter"
        return cost.collective_time(kind, "ring", p, layouts[u].full_bytes, alpha, beta)

    def compute(action, u):  # 6 x parameters per sample, 8 samples per rank
        share = 1 / 3 if action == "forward" else 2 / 3
        return 6 * total * layouts[u].size / total * 8 * share / flops

    slots = fsdp.schedule_slots(fsdp.fsdp_schedule(len(layouts), prefetch), comm, compute)
    return run, slots, len(data)


def _overlaps(a, b):
    return min(a.end, b.end) - max(a.start, b.start) > 1e-12


def test_prefetch_overlaps_gathers_with_compute_and_exposes_what_the_formula_says():
    plain, plain_slots, steps = _overlap_setup(False)
    pre, pre_slots, _ = _overlap_setup(True)
    # some gathers outlast the unit they hide behind, some do not: max(0, .) matters
    hidden = [c <= k for c, k in pre_slots if c > 0]
    assert any(hidden) and not all(hidden)
    for run, slots in ((plain, plain_slots), (pre, pre_slots)):
        predicted = steps * fsdp.exposed_communication(slots)
        assert run.exposed == pytest.approx(predicted, rel=0.05)
        assert run.exposed == pytest.approx(run.predicted_exposed(), rel=0.05)
        assert run.time >= run.compute + run.exposed - 1e-12
    no_overlap = steps * sum(c for c, _ in plain_slots)
    assert plain.exposed == pytest.approx(no_overlap, rel=0.05)
    assert pre.exposed < 0.9 * plain.exposed and pre.time < plain.time
    # on the timeline: prefetched all-gathers run while the previous unit computes
    for run, expect in ((pre, True), (plain, False)):
        work = [s for s in run.timeline if s.lane == "rank 0"]
        gathers = [s for s in run.timeline if s.lane == "rank 0 stream" and s.kind == "all-gather"]
        assert {s.kind for s in work} == {"forward", "backward"}
        assert any(_overlaps(g, w) for g in gathers for w in work) is expect
        # ... and in the simulator's own message-level trace
        trace = run.result.trace
        sends = [s for s in trace if s.rank == 0 and s.kind == "send"]
        computes = [s for s in trace if s.rank == 0 and s.kind == "compute" and s.duration > 0]
        assert any(_overlaps(s, c) for s in sends for c in computes) is expect


# --- zero_train(stage=3) is FSDP -----------------------------------------------------------
def test_zero_train_stage3_runs_fsdp():
    widths = [5, 7, 3]
    model = mlp(widths, 0)
    data = batches(widths, [12, 12, 12], 0)
    run = zero.zero_train(model, adam, mse, data, sim.Cluster(sim.ring(4)), stage=3)
    assert isinstance(run.fsdp, fsdp.FSDPRun)
    direct = fsdp.fsdp_train(model, adam, mse, data, sim.Cluster(sim.ring(4)),
                             flops_per_sample=6.0 * model.num_parameters())
    for k in direct.state:
        np.testing.assert_array_equal(run.state[k], direct.state[k])
    assert run.held == direct.held and run.time == direct.time
    # per step: every layer all-gathered twice and reduce-scattered once (ring: (p - 1) blocks
    # of padded / p elements per rank each), plus one final gather of the model
    padded = sum(lay.padded for lay in direct.layouts)
    assert run.bytes_sent == (3 * len(data) + 1) * 3 * padded * 8


# --- errors ----------------------------------------------------------------------------------
def test_fsdp_errors_name_the_problem():
    with pytest.raises(ArgumentError, match="no parameters"):
        fsdp.fsdp_units(ml.nn.Sequential(ml.nn.Tanh()))
    mixed = ml.nn.Sequential(ml.nn.Linear(2, 2, rng=0))
    mixed[0].bias.data = mixed[0].bias.data.astype(np.float64)
    with pytest.raises(DTypeError, match="mixes parameter dtypes"):
        fsdp.unit_layouts(mixed, 2)
    tied = ml.nn.Sequential(ml.nn.Linear(2, 2, rng=0), ml.nn.Linear(2, 2, rng=1))
    tied[1].weight = tied[0].weight
    with pytest.raises(ArgumentError, match="shared by units 0 and 1"):
        fsdp.fsdp_units(tied)
    with pytest.raises(ArgumentError, match="num_units"):
        fsdp.fsdp_schedule(0)
    with pytest.raises(ArgumentError, match="num_ranks"):
        fsdp.unit_layouts(mixed, 0)
    model = mlp([2, 2], 0)
    with pytest.raises(ShapeError, match="batch 0 is empty"):
        fsdp.fsdp_train(model, adam, mse, [(np.zeros((0, 2)), np.zeros((0, 2)))],
                        sim.Cluster(sim.ring(2)))
    with pytest.raises(ShapeError, match="3 inputs but 2 targets"):
        fsdp.fsdp_train(model, adam, mse, [(np.zeros((3, 2)), np.zeros((2, 2)))],
                        sim.Cluster(sim.ring(2)))


# --- over MPI ----------------------------------------------------------------------------------
MPI_SCRIPT = '''
import numpy as np
import mlsys_lab as ml
from mpi4py import MPI
from mlsys_lab.distributed import data_parallel as dp, fsdp, mpi, sim

c = MPI.COMM_WORLD
r, p = c.rank, c.size
comm = mpi.world(timeout=30)
bad = 0
for seed in range(2):
    rng = np.random.default_rng(seed)
    widths = [int(w) for w in rng.integers(2, 9, 4)]
    layers = []
    for i in range(3):
        layers += [ml.nn.Linear(widths[i], widths[i + 1], rng=seed * 10 + i), ml.nn.Tanh()]
    model = ml.nn.Sequential(*layers[:-1])
    for q in model.parameters():
        q.data = q.data.astype(np.float64)
    data = [(rng.standard_normal((10, widths[0])), rng.standard_normal((10, widths[-1])))
            for _ in range(3)]
    opt = (lambda ps: ml.optim.Adam(ps, lr=0.05)) if seed == 0 else \\
        (lambda ps: ml.optim.SGD(ps, lr=0.1, momentum=0.9))
    loss = lambda pred, y: ml.ops.mse_loss(pred, ml.tensor(y))
    want, _ = dp.single_device_train(model, opt, loss, data)
    for prefetch in (True, False):
        out = fsdp.fsdp_train_mpi(model, opt, loss, data, prefetch=prefetch, comm=comm)
        err = max(float(np.max(np.abs(out["state"][k] - want[k]))) for k in want)
        simulated = fsdp.fsdp_train(model, opt, loss, data, sim.Cluster(sim.ring(p)),
                                    prefetch=prefetch)
        same = all(np.array_equal(out["state"][k], simulated.state[k]) for k in want)
        held = simulated.held[r] == out["held"]
        if not (err <= 1e-10 and same and held):
            bad += 1
            print(f"rank {r}: seed {seed} prefetch {prefetch}: err {err} same {same} "
                  f"held {held}", flush=True)
bad = c.allreduce(bad)
if r == 0:
    print(("FSDP OK" if bad == 0 else "FSDP FAILED"), p, flush=True)
'''


@pytest.mark.service
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4])
def test_fsdp_over_mpi_equals_one_device_and_the_simulator_bit_for_bit(n, tmp_path):
    pytest.importorskip("mpi4py")
    from .test_mpi import launch

    script = tmp_path / "fsdp_check.py"
    script.write_text(MPI_SCRIPT)
    code, out = launch(n, [str(script)], tmp_path)
    assert code == 0 and f"FSDP OK {n}" in out, out
