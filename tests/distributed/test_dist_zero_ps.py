"""ZeRO memory/communication formulas, the row-sparse gradient type, and the parameter server."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.distributed import RowSparse, zero
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError

GB = 1e9


# --- ZeRO formulas ------------------------------------------------------------------------------
def test_zero_paper_table_7_5b_params_64_devices():
    """The ZeRO paper's worked example: 7.5 B parameters, N = 64, K = 12."""
    got = [zero.zero_memory_per_device(7.5e9, 64, s) / GB for s in range(4)]
    assert got == pytest.approx([120.0, 31.40625, 16.640625, 1.875])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 10**12), st.integers(1, 4096), st.integers(0, 16))
def test_zero_stage_formulas(params, n, k):
    mem = [zero.zero_memory_per_device(params, n, s, k) for s in range(4)]
    assert mem[0] == pytest.approx((2 + 2 + k) * params)
    assert mem[1] == pytest.approx(2 * params + 2 * params + k * params / n)
    assert mem[2] == pytest.approx(2 * params + (2 + k) * params / n)
    assert mem[3] == pytest.approx((2 + 2 + k) * params / n)
    assert mem[0] >= mem[1] >= mem[2] >= mem[3]
    parts = zero.zero_memory_breakdown(params, n, 2, k)
    assert parts["params"] + parts["grads"] + parts["optimizer"] == pytest.approx(mem[2])


def test_zero_communication_stage3_is_one_and_a_half_times_dp():
    p, n = 1e9, 8
    dp = zero.zero_communication(p, n, 0)
    assert dp == pytest.approx(2 * (n - 1) / n * p * 2)  # one ring all-reduce of fp16 grads
    assert zero.zero_communication(p, n, 1) == dp == zero.zero_communication(p, n, 2)
    assert zero.zero_communication(p, n, 3) == pytest.approx(1.5 * dp)


def test_book_memory_arithmetic_100b_params():
    mem = zero.training_memory(100e9, optimizer="adam", precision="fp32")
    assert mem["params"] == 400 * GB
    assert mem["total"] > 1.2e12  # weights + gradients + Adam's two moments = 1.6 TB
    assert zero.devices_needed(mem["params"]) == 5  # 400 GB on 80 GB devices
    assert zero.devices_needed(mem["total"]) == 20
    with_act = zero.training_memory(100e9, activation_bytes=50 * GB)
    assert with_act["total"] == pytest.approx(mem["total"] + 50 * GB)
    assert zero.smallest_stage_that_fits(7.5e9, 64, 32 * GB) == 1
    assert zero.smallest_stage_that_fits(7.5e9, 64, 1 * GB) is None
    sharded = zero.training_memory(100e9, precision="mixed", stage=3, num_devices=64)
    assert sharded["total"] == pytest.approx(zero.zero_memory_per_device(100e9, 64, 3))


def test_zero_bad_arguments():
    with pytest.raises(ArgumentError, match="stage must be"):
        zero.zero_memory_per_device(1e9, 8, 4)
    with pytest.raises(ArgumentError, match="num_devices must be > 0"):
        zero.zero_memory_per_device(1e9, 0, 1)
    with pytest.raises(DTypeError):
        zero.zero_communication("big", 8, 1)
    with pytest.raises(ArgumentError, match="unknown optimizer"):
        zero.training_memory(1e9, optimizer="lion")


# --- RowSparse ----------------------------------------------------------------------------------
row_sparse = st.integers(1, 30).flatmap(lambda rows: st.tuples(
    st.just(rows), st.lists(st.integers(0, rows - 1), max_size=40),
    st.sampled_from([(), (3,), (2, 2)])))


def _make(rows, idx, row_shape, seed):
    vals = np.random.default_rng(seed).standard_normal((len(idx), *row_shape))
    return RowSparse(np.array(idx, dtype=np.int64), vals, rows)


def _dense_oracle(sp):
    out = np.zeros(sp.shape)
    for i, v in zip(sp.indices, sp.values):
        out[i] += v
    return out


@settings(max_examples=50, deadline=None)
@given(row_sparse, row_sparse.map(lambda t: t[1:]), st.integers(0, 2**31))
def test_row_sparse_matches_dense(a, b_parts, seed):
    rows, idx, shape = a
    sp = _make(rows, idx, shape, seed)
    dense = _dense_oracle(sp)
    np.testing.assert_allclose(sp.to_dense(), dense)
    co = sp.coalesce()
    assert co.is_coalesced() and len(set(idx)) == co.nnz_rows
    np.testing.assert_allclose(co.to_dense(), dense)
    assert co.nbytes == co.indices.nbytes + co.values.nbytes
    other = _make(rows, [i % rows for i in b_parts[0]], shape, seed + 1)
    np.testing.assert_allclose((sp + other).to_dense(), dense + _dense_oracle(other))
    np.testing.assert_allclose(sp + np.ones(sp.shape), dense + 1)
    np.testing.assert_allclose((2.5 * sp).to_dense(), 2.5 * dense)
    target = np.ones(sp.shape)
    sp.add_to(target, scale=-1.0)
    np.testing.assert_allclose(target, 1 - dense)
    back = RowSparse.from_dense(dense)
    np.testing.assert_allclose(back.to_dense(), dense)
    assert set(back.indices) == {i for i in range(rows) if np.any(dense[i] != 0)}


def test_row_sparse_moves_only_touched_rows():
    table_grad = np.zeros((100_000, 16))
    table_grad[[3, 77, 5000]] = 1.0
    sp = RowSparse.from_dense(table_grad)
    assert sp.nnz_rows == 3 and sp.nbytes == 3 * 8 + 3 * 16 * 8
    assert sp.nbytes < table_grad.nbytes / 10_000
    picked = RowSparse.from_dense(table_grad, indices=[3, 4])
    np.testing.assert_array_equal(picked.values, [np.ones(16), np.zeros(16)])
    sel = sp.select(sp.indices > 10)
    assert list(sel.indices) == [77, 5000]


def test_row_sparse_errors():
    with pytest.raises(ArgumentError, match="index 5 is outside"):
        RowSparse([5], np.ones((1, 2)), 5)
    with pytest.raises(ShapeError, match="one row per index"):
        RowSparse([0, 1], np.ones((3, 2)), 5)
    with pytest.raises(DTypeError, match="integers"):
        RowSparse([0.5], np.ones((1, 2)), 5)
    with pytest.raises(ShapeError, match="differ"):
        RowSparse([0], np.ones((1, 2)), 5) + RowSparse([0], np.ones((1, 3)), 5)
    with pytest.raises(ShapeError, match="target shape"):
        RowSparse([0], np.ones((1, 2)), 5).add_to(np.zeros((4, 2)))
    with pytest.raises(ArgumentError, match="num_rows"):
        RowSparse([], np.ones((0, 2)), -1)
    with pytest.raises(ArgumentError, match="outside"):
        RowSparse.from_dense(np.ones((3, 2)), indices=[7])
    empty = RowSparse([], np.zeros((0, 4)), 10)
    assert empty.coalesce().nnz_rows == 0 and empty.to_dense().shape == (10, 4)


# --- ZeRO on the simulator ----------------------------------------------------------------------
def _zero_setup():
    import mlsys_lab as ml

    model = ml.nn.Sequential(ml.nn.Linear(5, 7, rng=0), ml.nn.Tanh(), ml.nn.Linear(7, 3, rng=1))
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((12, 5)), rng.standard_normal((12, 3))) for _ in range(3)]
    opt = lambda ps: ml.optim.Adam(ps, lr=0.05)
    loss = lambda pred, y: ml.ops.mse_loss(pred, ml.tensor(y))
    return model, data, opt, loss


@pytest.mark.parametrize("n", [3, 4])
def test_zero_stages_equal_plain_dp_and_shard_the_state(n):
    from mlsys_lab.distributed import data_parallel as dp
    from mlsys_lab.distributed import sim
    from mlsys_lab.distributed.collectives import block_bounds
    from mlsys_lab.distributed.parallel import fsdp

    model, data, opt, loss = _zero_setup()
    P = model.num_parameters()  # 66 parameters, fp64 everywhere: 8 + 8 + 16 bytes each
    want, _ = dp.single_device_train(model, opt, loss, data)
    plain = dp.data_parallel_train(model, opt, loss, data, sim.Cluster(sim.ring(n)),
                                   bucket_bytes=float("inf"))
    for stage in (1, 2, 3):
        run = zero.zero_train(model, opt, loss, data, sim.Cluster(sim.ring(n)), stage=stage)
        for k in want:
            np.testing.assert_allclose(run.state[k], want[k], rtol=0, atol=1e-12)
        # stage 3 is FSDP: one flat shard per layer (Linear+Tanh, Linear), each padded to a
        # multiple of n; stages 1-2 shard the whole flattened model by block_bounds
        padded = sum(lay.padded for lay in fsdp.unit_layouts(model, n))
        assert padded == (42 + 24 if n == 3 else 44 + 24)
        for rank, held in enumerate(run.held):
            lo, hi = block_bounds(P, n)[rank]
            shard, full = ((hi - lo) if stage < 3 else padded // n) * 8, P * 8
            assert held["optimizer"] == 2 * shard
            assert held["grads"] == (shard if stage >= 2 else full)
            assert held["params"] == (shard if stage == 3 else full)
        if stage == 3 or P % n == 0:
            formula = zero.zero_memory_breakdown(P if stage < 3 else padded, n, stage, k=16,
                                                 weight_bytes=8, grad_bytes=8)
            assert run.held[0]["total"] == formula["total"]
        steps = len(data)
        if stage < 3:  # reduce-scatter + all-gather moves what one all-reduce moves
            assert run.bytes_sent == plain.result.bytes
        else:  # each layer gathered twice per step (+ once at the end), padded
            assert run.bytes_sent == pytest.approx(plain.result.bytes * (3 * steps + 1)
                                                   / (2 * steps) * padded / P)


# --- parameter server ---------------------------------------------------------------------------
def _ps(problem, S, W, straggler=None, **kwargs):
    from mlsys_lab.distributed import param_server as ps
    from mlsys_lab.distributed import sim

    topo = sim.fully_connected(S + W, alpha=5e-6, beta=1 / 1e9, flops=1e9)
    if straggler is not None:
        topo.set_device(S + straggler, flops=1e8)
    options = dict(lr=0.1, batch_size=16, steps=40, flops_per_sample=1e4)
    options.update(kwargs)
    return ps.ParameterServer(problem, topo, S, W, **options).run()


def test_sync_ps_equals_large_batch_sgd():
    from mlsys_lab.distributed import param_server as ps

    prob = ps.SparseRegression(num_features=300, num_samples=512, nnz=5, seed=1)
    S, W, steps, lr, b = 3, 4, 10, 0.3, 8
    run = _ps(prob, S, W, mode="sync", lr=lr, batch_size=b, steps=steps)
    # the oracle: the same per-worker sample streams, averaged gradient, plain numpy
    shards = np.array_split(np.random.default_rng(0).permutation(prob.num_samples), W)
    rngs = [np.random.default_rng([0, w]) for w in range(W)]
    w_vec = np.zeros(prob.num_features)
    for _ in range(steps):
        total = np.zeros_like(w_vec)
        for k in range(W):
            idx = rngs[k].choice(shards[k], b)
            err = np.sum(prob.vals[idx] * w_vec[prob.cols[idx]], axis=1) - prob.y[idx]
            np.add.at(total, prob.cols[idx], err[:, None] * prob.vals[idx] / b)
        w_vec -= lr * total / W
    np.testing.assert_allclose(run.weights, w_vec, rtol=0, atol=1e-12)
    assert run.updates == S * steps and run.dropped == 0 and run.steps == [steps] * W


def test_sparse_rows_move_only_touched_rows():
    from mlsys_lab.distributed import param_server as ps

    prob = ps.SparseRegression(num_features=5000, num_samples=2048, nnz=4, seed=0)
    sparse = _ps(prob, 2, 4, mode="sync", steps=5)
    dense = _ps(prob, 2, 4, mode="sync", steps=5, sparse=False)
    np.testing.assert_allclose(sparse.weights, dense.weights, atol=1e-12)
    row = 8 + 8  # a key and one float64 value
    assert dense.bytes_pushed == 5 * 4 * prob.num_features * row
    assert sparse.bytes_pushed <= 5 * 4 * 16 * 4 * row  # <= batch x nnz rows per push
    assert dense.bytes_pushed / sparse.bytes_pushed > 50
    assert sparse.time < dense.time


def test_straggler_sync_async_ssp_and_backup_workers():
    from mlsys_lab.distributed import param_server as ps

    prob = ps.SparseRegression(num_features=16, num_samples=1024, seed=0)
    target = 0.05
    fast = _ps(prob, 2, 4, mode="sync", steps=60)
    runs = {"sync": _ps(prob, 2, 4, 1, mode="sync", steps=60),
            "backup": _ps(prob, 2, 4, 1, mode="sync", steps=60, fraction=0.75),
            "async": _ps(prob, 2, 4, 1, mode="async", steps=60),
            "ssp": _ps(prob, 2, 4, 1, mode="ssp", staleness=3, steps=60)}
    tta = {k: r.time_to_loss(target) for k, r in runs.items()}
    assert all(t is not None for t in tta.values()) and fast.time_to_loss(target) is not None
    assert tta["sync"] > 5 * fast.time_to_loss(target)  # everyone waits for the straggler
    assert tta["backup"] < tta["sync"] / 5 and runs["backup"].dropped > 0
    assert runs["backup"].steps[1] < 60  # the straggler skipped the versions it missed
    assert tta["async"] < tta["ssp"] < tta["sync"]
    assert runs["ssp"].max_lead <= 3 < runs["async"].max_lead
    for s in (0, 1):
        assert _ps(prob, 2, 4, 1, mode="ssp", staleness=s, steps=20).max_lead <= s
    for r in runs.values():  # everything converges (loss vs simulated time falls)
        assert r.curve[-1][1] < r.curve[0][1] / 20


def test_hot_key_replication_balances_servers_same_result():
    from mlsys_lab.distributed import param_server as ps

    prob = ps.SparseRegression(num_features=5000, num_samples=4096, nnz=4, skew=1.2, seed=0)
    plain = _ps(prob, 4, 8, mode="sync", steps=10, partition="range", lr=0.5)
    hot = _ps(prob, 4, 8, mode="sync", steps=10, partition="range", lr=0.5, replicate_hot=100)
    np.testing.assert_allclose(hot.weights, plain.weights, rtol=0, atol=1e-12)

    def imbalance(r):
        return max(r.server_bytes) / np.mean(r.server_bytes)

    assert imbalance(plain) > 2.5 and imbalance(hot) < 0.75 * imbalance(plain)


def test_hot_key_replication_in_async_mode_balances_servers_and_converges():
    from mlsys_lab.distributed import param_server as ps

    prob = ps.SparseRegression(num_features=2000, num_samples=4096, nnz=4, skew=1.2, seed=0)
    plain = _ps(prob, 4, 8, mode="async", steps=15, partition="range", lr=0.5)
    hot = _ps(prob, 4, 8, mode="async", steps=15, partition="range", lr=0.5, replicate_hot=50)

    def imbalance(r):
        return max(r.server_bytes) / np.mean(r.server_bytes)

    assert imbalance(plain) > 2 and imbalance(hot) < 0.75 * imbalance(plain)
    assert hot.updates == plain.updates and hot.steps == plain.steps == [15] * 8
    # replicas lag by a refresh's flight, so the tables differ a little, not the progress
    assert not np.array_equal(hot.weights, plain.weights)
    assert hot.curve[-1][1] < 0.6 * hot.curve[0][1]
    assert abs(hot.curve[-1][1] - plain.curve[-1][1]) < 0.01 * plain.curve[0][1]


def test_ps_runs_on_the_simulator_and_reports_a_stuck_job():
    from mlsys_lab.distributed import param_server as ps
    from mlsys_lab.distributed import sim
    from mlsys_lab.distributed.comm import DeadlockError

    prob = ps.SparseRegression(num_features=8, num_samples=64, seed=0)
    job = ps.ParameterServer(prob, sim.fully_connected(3), 1, 2, steps=3)
    job.needed = 3  # more pushes than there are workers: version 1 never comes
    with pytest.raises(DeadlockError, match="ParameterServer: workers .* never finished"):
        job.run()


def test_ps_errors():
    from mlsys_lab.distributed import param_server as ps
    from mlsys_lab.distributed import sim

    prob = ps.SparseRegression(num_features=8, num_samples=64, seed=0)
    topo = sim.fully_connected(3)
    with pytest.raises(ArgumentError, match="mode must be one of"):
        ps.ParameterServer(prob, topo, 1, 2, mode="gossip")
    with pytest.raises(ArgumentError, match="3 devices for 2 servers \\+ 2 workers"):
        ps.ParameterServer(prob, topo, 2, 2)
    with pytest.raises(ArgumentError, match="replicate_hot=9 is outside 0..8"):
        ps.ParameterServer(prob, topo, 1, 2, mode="async", replicate_hot=9)
    with pytest.raises(ArgumentError, match="fraction"):
        ps.ParameterServer(prob, topo, 1, 2, fraction=0)
    with pytest.raises(ArgumentError, match="staleness"):
        ps.ParameterServer(prob, topo, 1, 2, mode="ssp", staleness=-1)
