"""Expert parallelism: an nn.MoE's experts over 2-8 simulated ranks (and 2-4 MPI processes)
trains exactly as the single-device layer with one routing group per rank; the all-to-alls
move exactly the routed tokens; dropped tokens are the ones past capacity; an imbalanced
router costs time on the timeline."""

import copy
import textwrap

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.distributed import sim
from mlsys_lab.distributed.parallel import expert as ep
from mlsys_lab.nn.moe import capacity


def make(experts=8, k=2, c=0.75, d=6, hidden=5, seed=0):
    return ml.nn.MoE(d, hidden, experts, k=k, capacity_factor=c, rng=seed, dtype="float64")


def batches_of(tokens, d=6, steps=3, seed=1):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((tokens, d)), rng.standard_normal((tokens, d)))
            for _ in range(steps)]


def adam(params):
    return ml.optim.Adam(params, lr=1e-2)


def one_device(moe, batches, groups, aux_weight):
    model = copy.deepcopy(moe)
    model.groups = groups
    opt = adam(model.parameters())
    routings, dxs = [], []
    for x, y in batches:
        model.zero_grad()
        xt = ml.tensor(x, requires_grad=True)
        out, aux = model(xt)
        diff = out - ml.tensor(y)
        (ml.ops.sum(diff * diff) * (1.0 / x.size) + aux * aux_weight).backward()
        opt.step()
        routings.append(model.routing)
        dxs.append(xt.grad.numpy())
    return model, routings, dxs


@pytest.mark.parametrize("ranks,experts,k,c", [(2, 4, 1, 1.0), (2, 2, 2, 0.5), (4, 8, 2, 0.75),
                                               (8, 8, 1, 1.25), (8, 16, 2, 0.5)])
def test_training_equals_one_device_with_a_group_per_rank(ranks, experts, k, c):
    moe = make(experts, k, c)
    batches = batches_of(4 * ranks)
    run = ep.expert_parallel_train(moe, batches, sim.Cluster(sim.fully_connected(ranks)), adam,
                                   aux_weight=0.1)
    ref, routings, dxs = one_device(moe, batches, ranks, 0.1)
    for mine, want in zip(run.model.parameters(), ref.parameters()):
        np.testing.assert_allclose(mine.data, want.data, rtol=0, atol=1e-10)
    assert not np.allclose(ref.gate.weight.data, moe.gate.weight.data)  # it did train
    n = 4
    for step, (routing, dx) in enumerate(zip(routings, dxs)):
        assert routing.dropped.any() or c > 1
        for r in range(ranks):
            mine = run.ranks[r]["routing"][step]
            np.testing.assert_array_equal(mine.expert, routing.expert[r * n:(r + 1) * n])
            np.testing.assert_array_equal(mine.slot, routing.slot[r * n:(r + 1) * n])
            np.testing.assert_allclose(run.ranks[r]["dx"][step], dx[r * n:(r + 1) * n],
                                       rtol=0, atol=1e-12)


def test_dropped_tokens_are_the_ones_past_capacity():
    moe = make(experts=4, k=2, c=0.5)
    run = ep.expert_parallel_train(moe, batches_of(16, steps=1),
                                   sim.Cluster(sim.fully_connected(2)), adam)
    for rank in run.ranks:
        r = rank["routing"][0]
        cap = capacity(8, 4, 2, 0.5)
        assert r.capacity == cap == 2
        for e in range(4):
            # GShard order: level-0 choices in token order, then level 1
            order = [(j, t) for j in range(2) for t in range(8) if r.expert[t, j] == e]
            for i, (j, t) in enumerate(order):
                assert r.slot[t, j] == (i if i < cap else -1)
        assert r.dropped.sum() > 0


@pytest.mark.parametrize("ranks", [2, 4])
def test_all_to_alls_move_exactly_the_routed_tokens(ranks):
    moe = make(experts=8, k=2, c=0.75)
    x = np.random.default_rng(3).standard_normal((6 * ranks, 6))
    _, spans, res = ep.moe_step_time(moe, x, sim.Cluster(sim.fully_connected(ranks)))
    ref = copy.deepcopy(moe)
    ref.groups = ranks
    ref(x)
    routing = ref.routing
    token_rank = np.repeat(np.arange(ranks), 6)[:, None]
    owner = routing.expert // (8 // ranks)
    travelling = int((routing.kept & (owner != token_rank)).sum())
    row = 6 * 8  # d_model float64
    # four all-to-alls (dispatch, combine and their gradients), nothing else on the wire
    assert res.bytes == 4 * travelling * row
    dispatched = sum(s.detail["bytes"] for s in spans if s.name == "dispatch")
    assert dispatched == travelling * row
    # one message per (source, destination, expert of the destination), empty ones included
    assert res.messages == 4 * ranks * (ranks - 1) * (8 // ranks)


def skewed(balanced, tokens=32, experts=4):
    moe = ml.nn.MoE(experts, 16, experts, k=1, capacity_factor=experts, rng=0,
                    dtype="float64")
    moe.gate.weight.data = 5.0 * np.eye(experts)
    hot = np.arange(tokens) % experts if balanced else np.zeros(tokens, int)
    return moe, np.eye(experts)[hot] + 0.01 * np.random.default_rng(0).standard_normal(
        (tokens, experts))


def test_imbalance_costs_time_on_the_timeline():
    cluster = sim.Cluster(sim.fully_connected(4, flops=1e7))
    moe, x = skewed(True)
    t_bal, spans_bal, _ = ep.moe_step_time(moe, x, cluster)
    moe, x = skewed(False)
    t_hot, spans_hot, _ = ep.moe_step_time(moe, x, cluster)
    assert t_hot > 2 * t_bal

    def lasting(spans, name):
        return {s.rank: s.duration for s in spans if s.name == name}

    work = lasting(spans_hot, "experts")
    assert work[0] > 3.9 * max(work[1], work[2], work[3])  # rank 0 holds the hot expert
    assert {s.detail["tokens"] for s in spans_hot if s.name == "experts"} == {32, 0}
    wait = lasting(spans_hot, "combine")
    assert min(wait[1], wait[2], wait[3]) > work[0] * 0.9  # the others wait for rank 0
    assert all(isinstance(s, ml.Span) for s in spans_hot)
    assert {s.detail["tokens"] for s in spans_bal if s.name == "experts"} == {8}


def test_errors_name_the_problem():
    with pytest.raises(ml.ArgumentError, match="do not split over 3 ranks"):
        ep.ExpertParallelMoE(make(experts=4), 0, 3)
    with pytest.raises(ml.ArgumentError, match="nn.MoE"):
        ep.ExpertParallelMoE(ml.nn.Linear(2, 2), 0, 1)
    with pytest.raises(ml.ArgumentError, match="equal shards"):
        ep.expert_parallel_train(make(experts=4), batches_of(5, steps=1),
                                 sim.Cluster(sim.fully_connected(2)), adam)


MPI_SCRIPT = textwrap.dedent('''
    import copy
    import numpy as np
    import mlsys_lab as ml
    from mpi4py import MPI
    from mlsys_lab.distributed import mpi, sim
    from mlsys_lab.distributed.parallel import expert as ep

    c = MPI.COMM_WORLD
    p = c.size
    moe = ml.nn.MoE(6, 5, 2 * p, k=2, capacity_factor=0.75, rng=0, dtype="float64")
    rng = np.random.default_rng(1)
    batches = [(rng.standard_normal((4 * p, 6)), rng.standard_normal((4 * p, 6)))
               for _ in range(3)]
    adam = lambda params: ml.optim.Adam(params, lr=1e-2)
    model, mine = ep.expert_parallel_train_mpi(moe, batches, adam, aux_weight=0.1,
                                               comm=mpi.world(timeout=30))
    ref = copy.deepcopy(moe)
    ref.groups = p
    opt = adam(ref.parameters())
    for x, y in batches:
        ref.zero_grad()
        out, aux = ref(x)
        d = out - ml.tensor(y)
        (ml.ops.sum(d * d) * (1.0 / x.size) + aux * 0.1).backward()
        opt.step()
    err = max(float(np.abs(a.data - b.data).max())
              for a, b in zip(model.parameters(), ref.parameters()))
    simulated = ep.expert_parallel_train(moe, batches, sim.Cluster(sim.fully_connected(p)),
                                         adam, aux_weight=0.1)
    same = all(np.array_equal(a.data, b.data)
               for a, b in zip(model.parameters(), simulated.model.parameters()))
    sent = mine["sent"] == simulated.ranks[c.rank]["sent"]
    ok = c.allreduce(int(err <= 1e-10 and same and sent), op=MPI.MIN)
    if c.rank == 0:
        print("EP", p, err, same, sent, "ALL OK" if ok else "FAILED", flush=True)
''')


@pytest.mark.service
@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 4])
def test_expert_parallel_over_mpi_equals_one_device_and_the_simulator(n, tmp_path):
    from .test_mpi import launch

    pytest.importorskip("mpi4py")
    script = tmp_path / "ep.py"
    script.write_text(MPI_SCRIPT)
    code, out = launch(n, [str(script)], tmp_path)
    assert code == 0 and "ALL OK" in out, out
