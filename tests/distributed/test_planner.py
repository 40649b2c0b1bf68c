"""The 3-D parallel planner: memory per GPU against numbers computed by hand, the FLOPs formula,
the 1F1B bubble (p - 1) / m, collective times equal to the simulator's, a configuration that
does not fit, and the errors."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.distributed import sim
from mlsys_lab.distributed.collectives import allreduce
from mlsys_lab.distributed.parallel import DeviceMesh
from mlsys_lab.distributed.parallel import planner as P

SMALL = P.GPT(layers=4, hidden=64, heads=4, seq=32, vocab=100, global_batch=8, microbatch=2)


def test_memory_matches_hand_computed_numbers():
    mesh = DeviceMesh(dp=2, tp=2, pp=2)
    # stage 0: 2 layers x ((12*64^2 + 7*64) / 2 + 6*64) + 100*64/2 + 32*64 = 55,616 params
    assert P.stage_parameters(SMALL, mesh, 0) == 55616
    mem = P.memory_per_gpu(SMALL, mesh)
    assert mem["params"] == 2 * 55616 and mem["grads"] == 2 * 55616
    assert mem["optimizer"] == 12 * 55616
    # m = 8 / (2 * 2) = 2 microbatches, both in flight on stage 0; recomputation keeps each
    # layer's input (2 s b h = 8,192 B) plus one layer's full activations,
    # s b h (10 + 24/2 + 5 a s / (h t)) = 4096 * 27 = 110,592 B
    assert mem["in_flight"] == 2
    assert mem["activations"] == 2 * 2 * 8192 + 110592
    assert mem["total"] == 16 * 55616 + 2 * 2 * 8192 + 110592
    plain = P.memory_per_gpu(SMALL, mesh, recompute=False)
    assert plain["activations"] == 2 * 2 * 110592
    zero1 = P.memory_per_gpu(SMALL, mesh, zero_stage=1)
    assert zero1["optimizer"] == 12 * 55616 / 2 and zero1["params"] == 2 * 55616
    # the last stage holds the output embedding's copy and the final layer norm instead
    assert P.stage_parameters(SMALL, mesh, 1) == 2 * (24576 + 224 + 384) + 2 * 64 + 3200


def test_flops_formula_is_narayanans():
    m = P.GPT(layers=24, hidden=2304, heads=24, global_batch=512)
    B, s, l, h, V = 512, 2048, 24, 2304, 51200
    want = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    assert P.training_flops(m) == pytest.approx(want, rel=1e-12)
    assert round(m.parameters / 1e9, 1) == 1.7  # Table 1's first row, to its one decimal


@pytest.mark.parametrize("pp,micro", [(2, 1), (4, 1), (4, 2), (8, 1)])
def test_bubble_fraction_is_p_minus_1_over_m(pp, micro):
    model = P.GPT(layers=8, hidden=256, heads=8, seq=128, vocab=1000, global_batch=32,
                  microbatch=micro)
    mesh = DeviceMesh(dp=2, tp=2, pp=pp)
    t = P.step_time(model, mesh)
    m = 32 // (2 * micro)
    assert t["microbatches"] == m and t["bubble_fraction"] == pytest.approx((pp - 1) / m)
    busy = t["compute"] + t["tp"] + t["pp"]
    assert t["bubble"] / busy == pytest.approx((pp - 1) / m, rel=1e-12)
    assert t["step"] == pytest.approx(busy + t["bubble"] + t["dp"] + t["optimizer"])
    off = P.step_time(model, mesh, bubble=False, comm=False)
    assert off["bubble"] == off["tp"] == off["pp"] == off["dp"] == 0
    assert off["compute"] == pytest.approx(t["compute"])


def test_collective_times_are_the_simulators():
    """The TP all-reduce inside a server and the DP one across servers cost what the simulator
    measures for a ring all-reduce on the same two_level topology."""
    hw = P.A100
    mesh = DeviceMesh(dp=2, tp=4, pp=1)
    topo = hw.topology(16)  # two servers of 8
    nbytes = 4 * 2 ** 16
    for ranks in (mesh.group(0, "tp"), [0, 8]):
        def prog(comm, x):
            return (yield from allreduce(comm, x, algo="ring"))
        sub = sim.Cluster(hw.topology(16))
        args = [(np.ones(nbytes // 4, np.float32),) if r in ranks else () for r in range(16)]

        def everyone(comm, *x, ranks=ranks):
            if comm.rank in ranks:
                return (yield from prog(comm.sub(ranks), x[0]))

        res = sim.run(sub, everyone, args=args)
        assert P._allreduce(topo, ranks, nbytes) == pytest.approx(res.time, rel=1e-9)


def test_tensor_parallelism_across_servers_goes_over_infiniband():
    model = P.GPT(layers=32, hidden=4096, heads=32, global_batch=64)
    inside = P.step_time(model, DeviceMesh(dp=1, tp=8, pp=2))
    across = P.step_time(model, DeviceMesh(dp=1, tp=16, pp=1))
    assert across["tp"] > 5 * inside["tp"]


def test_a_configuration_that_does_not_fit_is_reported():
    big = P.GPT(layers=80, hidden=12288, heads=96, global_batch=64)
    alone = P.plan(big, dp=8, tp=1, pp=1)
    assert not alone.fits and alone.memory["total"] > 80e9
    assert "does not fit" in repr(alone)
    split = P.plan(big, dp=1, tp=8, pp=8)
    assert split.fits and "does not fit" not in repr(split)
    assert P.plan(big, dp=1, tp=8, pp=8, recompute=False).memory["activations"] > \
        split.memory["activations"]


def test_errors_name_the_problem():
    with pytest.raises(ml.ArgumentError, match="pp=3"):
        P.plan(SMALL, pp=3)
    with pytest.raises(ml.ArgumentError, match="tp=8"):
        P.plan(SMALL, tp=8)
    with pytest.raises(ml.ArgumentError, match="global batch"):
        P.plan(SMALL, dp=3)
    with pytest.raises(ml.ArgumentError, match="heads"):
        P.GPT(layers=2, hidden=10, heads=3)
    with pytest.raises(ml.ArgumentError, match="layers"):
        P.GPT(layers=0, hidden=8, heads=2)
