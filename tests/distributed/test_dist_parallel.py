"""Data and tensor parallelism and the DP x TP x PP mesh, against single-device training."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.distributed import data_parallel as dp
from mlsys_lab.distributed import mesh as M
from mlsys_lab.distributed import sim
from mlsys_lab.distributed import tensor_parallel as tp
from mlsys_lab.errors import ArgumentError, ShapeError, UnknownNameError


def f64(module):
    for p in module.parameters():
        p.data = p.data.astype(np.float64)
    return module


def mse(pred, y):
    return ml.ops.mse_loss(pred, ml.tensor(y))


def small_model(seed=0):
    return f64(ml.nn.Sequential(ml.nn.Linear(6, 10, rng=seed), ml.nn.Tanh(),
                                ml.nn.Linear(10, 10, rng=seed + 1), ml.nn.ReLU(),
                                ml.nn.Linear(10, 3, rng=seed + 2)))


def batches(n_steps, n, d_in=6, d_out=3, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((n, d_in)), rng.standard_normal((n, d_out)))
            for _ in range(n_steps)]


def max_diff(a, b):
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in b)


OPTIMIZERS = {
    "sgd_momentum": lambda ps: ml.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-3),
    "adam": lambda ps: ml.optim.Adam(ps, lr=0.01),
}


# --- data parallel ------------------------------------------------------------------------------
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("p,n", [(1, 12), (3, 12), (4, 30), (8, 30), (7, 5)])
def test_dp_equals_single_device_large_batch(opt, p, n):
    model, data = small_model(), batches(4, n)
    want, want_losses = dp.single_device_train(model, OPTIMIZERS[opt], mse, data)
    got = dp.data_parallel_train(model, OPTIMIZERS[opt], mse, data, sim.Cluster(sim.ring(p)),
                                 bucket_bytes=256)
    assert max_diff(got.state, want) < 1e-6 and max_diff(got.state, want) < 1e-12
    assert got.max_replica_difference == 0.0
    np.testing.assert_allclose(got.losses, want_losses, rtol=1e-12)
    assert got.time > 0
    assert max_diff(model.state_dict(), small_model().state_dict()) == 0  # input untouched


def test_bucketing_fewer_messages_less_alpha_cost():
    """Per step a ring all-reduce of one bucket costs 2(p-1) alpha + bandwidth; with a tiny
    beta, k buckets cost exactly (k - 1) x 2(p-1) alpha more than one."""
    p, alpha, steps = 6, 1e-5, 3
    model, data = small_model(), batches(steps, 24)
    runs = {}
    for bucket_bytes in (0, 512, float("inf")):
        cluster = sim.Cluster(sim.ring(p, alpha=alpha, beta=1e-18))
        runs[bucket_bytes] = dp.data_parallel_train(model, OPTIMIZERS["adam"], mse, data,
                                                    cluster, bucket_bytes=bucket_bytes)
    unfused, mid, fused = runs[0], runs[512], runs[float("inf")]
    assert unfused.buckets == len(model.parameters()) and fused.buckets == 1
    assert unfused.buckets > mid.buckets > fused.buckets
    for r in runs.values():
        assert r.result.messages == r.buckets * steps * p * 2 * (p - 1)
        assert max_diff(r.state, fused.state) < 1e-12
    extra = (unfused.buckets - fused.buckets) * steps * 2 * (p - 1) * alpha
    assert unfused.time - fused.time == pytest.approx(extra, rel=1e-6)


def test_dp_overlap_hides_all_reduce_behind_the_backward_exactly_as_the_chain_predicts():
    """DDP overlap: bucket b's all-reduce starts when its backward share is done and after the
    previous bucket's; the step ends with the last. Checked against that recurrence, with
    each all-reduce costing the ring formula (every bucket's size divisible by p)."""
    from mlsys_lab.distributed import cost

    p, n, steps, flops = 4, 8, 2, 1e9
    model = f64(ml.nn.Sequential(ml.nn.Linear(8, 16, rng=0), ml.nn.Tanh(),
                                 ml.nn.Linear(16, 4, rng=1)))
    data = batches(steps, n, d_in=8, d_out=4)
    opt = OPTIMIZERS["sgd_momentum"]
    alpha, beta, fps = 2e-6, 1 / 5e9, 2e4
    runs = {ov: dp.data_parallel_train(model, opt, mse, data,
                                       sim.Cluster(sim.ring(p, alpha, beta, flops=flops)),
                                       bucket_bytes=0, flops_per_sample=fps, overlap=ov)
            for ov in (False, True)}
    want, _ = dp.single_device_train(model, opt, mse, data)
    for r in runs.values():
        assert max_diff(r.state, want) < 1e-12 and r.max_replica_difference == 0.0
    assert max_diff(runs[True].state, runs[False].state) == 0.0
    params = model.parameters()
    sizes = [q.data.size for q in params]
    compute = fps * (n // p) / flops  # seconds of forward + backward per step
    ar = {i: cost.collective_time("allreduce", "ring", p, 8 * sizes[i], alpha, beta)
          for i in range(len(params))}
    order = list(reversed(range(len(params))))  # one bucket per parameter, last first
    assert runs[False].time == pytest.approx(steps * (compute + sum(ar.values())), rel=1e-9)
    t, end = 0.0, 0.0
    for _ in range(steps):
        ready = t + compute / 3
        for i in order:
            ready += compute * 2 / 3 * sizes[i] / sum(sizes)
            end = max(ready, end) + ar[i]
        t = end
    assert runs[True].time == pytest.approx(t, rel=1e-9)
    assert runs[True].time < 0.8 * runs[False].time
    assert runs[True].compute == pytest.approx(runs[False].compute, rel=1e-12)
    assert runs[False].compute == pytest.approx(steps * compute, rel=1e-12)
    assert runs[True].exposed < 0.5 * runs[False].exposed
    # the overlap is visible: messages move while rank 0 still computes its backward
    trace = runs[True].result.trace
    computes = [(e.start, e.end) for e in trace if e.rank == 0 and e.kind == "compute"]
    sends = [e for e in trace if e.rank == 0 and e.kind == "send"]
    assert any(a < s.start < b for s in sends for a, b in computes)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(0, 200))
def test_make_buckets_is_a_greedy_reverse_partition(sizes, bucket_bytes):
    params = [ml.tensor(np.zeros(n)) for n in sizes]
    buckets = dp.make_buckets(params, bucket_bytes)
    assert [i for b in buckets for i in b] == list(reversed(range(len(sizes))))
    nbytes = [sum(params[i].data.nbytes for i in b) for b in buckets]
    for b, total in zip(buckets, nbytes):
        assert total <= bucket_bytes or len(b) == 1
    for b, nxt in zip(buckets, buckets[1:]):  # closed only when the next one would not fit
        assert sum(params[i].data.nbytes for i in b) + params[nxt[0]].data.nbytes > bucket_bytes


def test_dp_bad_input():
    with pytest.raises(ShapeError, match="batch 0 has 4 inputs but 3 targets"):
        dp.data_parallel_train(small_model(), OPTIMIZERS["adam"], mse,
                               [(np.zeros((4, 6)), np.zeros((3, 3)))], sim.Cluster(sim.ring(2)))
    with pytest.raises(ArgumentError, match="bucket_bytes"):
        dp.make_buckets(small_model().parameters(), -1)


# --- tensor parallel ----------------------------------------------------------------------------
def _run(p, prog):
    return sim.run(sim.Cluster(sim.ring(p)), prog)


@pytest.mark.parametrize("p,hidden,split", [(1, 8, "array"), (2, 8, "array"), (4, 8, "array"),
                                            (3, 8, "array"), (3, 8, "chunk"), (4, 5, "array"),
                                            (4, 5, "chunk")])
def test_parallel_mlp_forward_backward_equal_unsplit(p, hidden, split):
    """Even and uneven splits; (4, 5, chunk) leaves rank 3 with no hidden unit at all."""
    fc1, fc2 = f64(ml.nn.Linear(6, hidden, rng=3)), f64(ml.nn.Linear(hidden, 5, rng=4))
    fc1.bias.data[:] = np.linspace(-1, 1, hidden)
    fc2.bias.data[:] = np.arange(5.0)
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((3, 6)), rng.standard_normal((3, 5))
    xt = ml.tensor(x, requires_grad=True)
    y = fc2(ml.ops.relu(fc1(xt)))
    y.backward(ml.tensor(dy))

    def prog(comm):
        mlp = tp.ParallelMLP(fc1, fc2, comm.rank, comm.size, split=split)
        out = yield from mlp.forward(comm, x)
        after_forward = comm.now()
        dx = yield from mlp.backward(comm, dy)
        return out, dx, [q.grad.numpy() for q in mlp.parameters()], after_forward

    res = _run(p, prog)
    for out, dx, _, _ in res.results:
        np.testing.assert_allclose(out, y.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    grads = [r[2] for r in res.results]
    widths = [g[0].shape[1] for g in grads]
    want = {"array": [len(b) for b in np.array_split(np.arange(hidden), p)],
            "chunk": [len(c) for c in np.array_split(np.arange(hidden), range(
                -(-hidden // p), hidden, -(-hidden // p)))] + [0] * p}[split][:p]
    assert widths == want
    np.testing.assert_allclose(np.concatenate([g[0] for g in grads], 1), fc1.weight.grad.numpy())
    np.testing.assert_allclose(np.concatenate([g[1] for g in grads]), fc1.bias.grad.numpy())
    np.testing.assert_allclose(np.concatenate([g[2] for g in grads], 0), fc2.weight.grad.numpy())
    np.testing.assert_allclose(grads[0][3], fc2.bias.grad.numpy())
    # one all-reduce forward and one backward: 2 x p x 2(p - 1) ring messages in all
    assert res.messages == 2 * p * 2 * (p - 1)


@pytest.mark.parametrize("gather", [False, True])
@pytest.mark.parametrize("width,split", [(6, "array"), (7, "array"), (7, "chunk")])
def test_column_and_row_parallel_linear(gather, width, split):
    lin = f64(ml.nn.Linear(width, width, rng=7))
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((5, width)), rng.standard_normal((5, width))
    xt = ml.tensor(x, requires_grad=True)
    full = lin(xt)
    full.backward(ml.tensor(dy))
    full = full.numpy()
    bounds = tp.split_bounds(width, 3, split)

    def prog(comm):
        col = tp.ColumnParallelLinear.from_linear(lin, comm.rank, comm.size, split,
                                                  gather_output=gather)
        row = tp.RowParallelLinear.from_linear(lin, comm.rank, comm.size, split,
                                               input_is_parallel=False)
        a = yield from col.forward(comm, x)
        b = yield from row.forward(comm, x)
        lo, hi = col.bounds
        dx = yield from col.backward(comm, dy if gather else dy[:, lo:hi])
        return a, b, dx, col.weight.grad.numpy()

    for rank, (a, b, dx, dw) in enumerate(_run(3, prog).results):
        lo, hi = bounds[rank]
        np.testing.assert_allclose(a, full if gather else full[:, lo:hi], rtol=1e-12)
        np.testing.assert_allclose(b, full, rtol=1e-12)
        np.testing.assert_allclose(dx, xt.grad.numpy(), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(dw, lin.weight.grad.numpy()[:, lo:hi], rtol=1e-12)


def test_tensor_parallel_errors():
    with pytest.raises(ArgumentError, match="split='pad' is not one of"):
        tp.ColumnParallelLinear.from_linear(ml.nn.Linear(4, 6), 0, 4, split="pad")
    with pytest.raises(ShapeError, match="bounds=\\(0, 3\\) hold 3 features but the weight "
                                         "shard has 2"):
        tp.RowParallelLinear(np.zeros((2, 4)), None, 0, 2, bounds=(0, 3))
    with pytest.raises(ArgumentError, match="rank 5"):
        tp.RowParallelLinear.from_linear(ml.nn.Linear(4, 6), 5, 2)
    with pytest.raises(ArgumentError, match="activation must be one of"):
        tp.ColumnParallelLinear.from_linear(ml.nn.Linear(4, 4), 0, 2, activation="gelu")

    def early(comm):
        layer = tp.ColumnParallelLinear.from_linear(f64(ml.nn.Linear(4, 4)), comm.rank, 2)
        yield from layer.backward(comm, np.zeros((1, 2)))

    with pytest.raises(ArgumentError, match="no forward with key=0"):
        _run(2, early)

    def wrong_dy(comm):
        layer = tp.RowParallelLinear.from_linear(f64(ml.nn.Linear(4, 4)), comm.rank, 2)
        yield from layer.forward(comm, np.zeros((3, 2)))
        yield from layer.backward(comm, np.zeros((3, 5)))

    with pytest.raises(ShapeError, match="dy has shape"):
        _run(2, wrong_dy)


# --- mesh ---------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4))
def test_mesh_coordinates_and_groups(d, t, p):
    mesh = M.DeviceMesh(dp=d, tp=t, pp=p)
    assert mesh.size == d * t * p
    seen = set()
    for r in range(mesh.size):
        c = mesh.coords(r)
        assert mesh.rank(dp=c.dp, tp=c.tp, pp=c.pp) == r
        seen.add((c.dp, c.tp, c.pp))
        for axis, size in (("dp", d), ("tp", t), ("pp", p)):
            g = mesh.group(r, axis)
            assert len(g) == size and g[getattr(c, axis)] == r
            others = [a for a in ("dp", "tp", "pp") if a != axis]
            for q in g:  # every member agrees on the other coordinates
                assert all(getattr(mesh.coords(q), a) == getattr(c, a) for a in others)
    assert len(seen) == mesh.size
    for axis in ("dp", "tp", "pp"):
        groups = mesh.groups(axis)
        assert sorted(x for g in groups for x in g) == list(range(mesh.size))
    for g in mesh.groups("tp"):  # TP groups are runs of consecutive ranks (one node)
        assert g == list(range(g[0], g[0] + t))


def test_mesh_errors():
    with pytest.raises(ArgumentError, match="tp must be >= 1"):
        M.DeviceMesh(2, 0, 1)
    mesh = M.DeviceMesh(2, 2, 2)
    with pytest.raises(ArgumentError, match="outside 0..7"):
        mesh.coords(8)
    with pytest.raises(UnknownNameError, match="known: dp, tp, pp"):
        mesh.group(0, "ep")
    with pytest.raises(ArgumentError, match="pp=2"):
        mesh.rank(pp=2)


@pytest.mark.parametrize("shape,schedule", [((2, 2, 2), "1f1b"), ((1, 2, 2), "gpipe"),
                                            ((2, 1, 4), "1f1b"), ((4, 2, 1), "gpipe")])
def test_hybrid_dp_tp_pp_equals_single_device(shape, schedule):
    blocks = [(f64(ml.nn.Linear(6, 8, rng=2 * i)), f64(ml.nn.Linear(8, 6, rng=2 * i + 1)))
              for i in range(4)]
    data = batches(2, 16, d_in=6, d_out=6, seed=1)
    want, _ = dp.single_device_train(M.mlp_blocks_model(blocks), OPTIMIZERS["adam"], mse, data)
    mesh = M.DeviceMesh(*shape)
    weights, res = M.hybrid_train(blocks, data, sim.Cluster(sim.fully_connected(mesh.size)),
                                  mesh, OPTIMIZERS["adam"], schedule=schedule, micro_batches=2)
    got = [a for block in weights for a in block]
    assert len(got) == len(want)
    for a, b in zip(got, want.values()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    assert res.messages > 0


def test_hybrid_errors():
    blocks = [(ml.nn.Linear(2, 2), ml.nn.Linear(2, 2))] * 3
    with pytest.raises(ArgumentError, match="needs 8"):
        M.hybrid_train(blocks, [], sim.Cluster(sim.ring(4)), M.DeviceMesh(2, 2, 2), None)
    with pytest.raises(ArgumentError, match="equal stages"):
        M.hybrid_train(blocks, [], sim.Cluster(sim.ring(2)), M.DeviceMesh(1, 1, 2), None)
    with pytest.raises(ArgumentError, match="dp x micro_batches = 8"):
        M.hybrid_train(blocks[:2], batches(1, 6), sim.Cluster(sim.ring(4)), M.DeviceMesh(2, 1, 2),
                       None, micro_batches=4)
