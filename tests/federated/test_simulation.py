"""A round's simulated time and bytes against the alpha-beta arithmetic by hand."""

import numpy as np
import pytest

from mlsys_lab import federated as fl
from mlsys_lab.errors import ArgumentError


def test_one_client_round_time_by_hand():
    fleet = fl.Fleet.uniform(3, flops=2e9, uplink=2.5e5, downlink=1e6, latency=0.08)
    model = np.zeros(1000, dtype=np.float32)
    payload = np.zeros(1001, dtype=np.float32)
    t = fl.simulate_round(fleet, [1], model, [payload], [6e9], aggregate=lambda r: len(r),
                          server_bandwidth=1e8, server_latency=0.002, server_flops=1e12)
    down = 0.002 + 0.08 + 4000 / min(1e8, 1e6)          # cut-through: bottleneck rate
    compute = 6e9 / 2e9
    up = 0.08 + 0.002 + 4004 / min(2.5e5, 1e8)
    agg = 2 * 1000 / 1e12
    assert t.sim_time == pytest.approx(down + compute + up + agg, rel=1e-12)
    assert t.aggregate == 1 and t.received == [0] and t.late == [] and t.dropped == []
    assert t.last_arrival == pytest.approx(down + compute + up, rel=1e-12)
    assert t.bytes_down == 4000 and t.bytes_up == 4004 and t.messages == 2


def test_straggler_sets_the_pace_and_a_deadline_cuts_it_off():
    fleet = fl.Fleet.uniform(4, flops=1e9, uplink=1e6, downlink=1e6, latency=0.01)
    fleet.flops[3] = 1e7                                  # 100x slower device
    model = np.zeros(10)
    pay = [np.zeros(11)] * 4
    flops = [1e9] * 4
    waited = fl.simulate_round(fleet, range(4), model, pay, flops, aggregate=len)
    assert waited.sim_time > 100 and waited.aggregate == 4
    cut = fl.simulate_round(fleet, range(4), model, pay, flops, aggregate=len, deadline=5.0,
                            trace=True)
    assert cut.aggregate == 3 and cut.late == [3] and cut.sim_time == pytest.approx(5.0)
    assert {s.lane for s in cut.trace} >= {"server", "deadline", "client 3"}
    spans = [s for s in cut.trace if s.lane == "client 3" and s.kind == "compute"]
    assert spans[0].duration == pytest.approx(100.0)


def test_drop_out_needs_a_deadline():
    fleet = fl.Fleet.uniform(2)
    with pytest.raises(ArgumentError, match="no deadline"):
        fl.simulate_round(fleet, [0, 1], np.zeros(3), [np.zeros(4)] * 2, [1.0, 1.0],
                          aggregate=len, drop_at=[0.5, None])
    t = fl.simulate_round(fleet, [0, 1], np.zeros(3), [np.zeros(4)] * 2, [1.0, 1.0],
                          aggregate=len, drop_at=[0.5, None], deadline=1.0)
    assert t.aggregate == 1 and t.dropped == [0] and t.received == [1]
    assert t.bytes_up == 32


def test_thousand_clients_round_runs():
    x, y, _, _ = fl.load_digits()
    server = fl.Server(fl.FedAvg(fraction_fit=0.1), fl.ClientData(
        x, y, fl.partition.iid(len(y), 1000)), fl.model.init_mlp(dtype=np.float32),
        fleet=fl.Fleet.device_cloud(1000), deadline=20.0)
    rec = server.round()
    assert len(rec.sampled) == 100 and 70 <= len(rec.completed) <= 100
    assert set(rec.completed) | set(rec.dropped) | set(rec.late) == set(rec.sampled)


def test_over_selection_keeps_the_first_uploads():
    fleet = fl.Fleet.uniform(4, flops=1e9, uplink=1e6, downlink=1e6, latency=0.01)
    fleet.uplink[:] = [1e3, 1e5, 1e4, 1e6]             # arrival order: 3, 1, 2, 0
    pay = [np.zeros(251, dtype=np.float32)] * 4        # 1,004 bytes
    t = fl.simulate_round(fleet, range(4), np.zeros(10), pay, [0.0] * 4,
                          aggregate=lambda r: [i for i, _ in r], accept=2, deadline=100.0)
    assert t.aggregate == [1, 3] and t.late == [0, 2]
    assert t.last_arrival == pytest.approx(0.001 + 80 / 1e6 + 0.02 + 0.001 + 1004 / 1e5)
    with pytest.raises(ArgumentError, match="accept=5"):
        fl.simulate_round(fleet, range(4), np.zeros(10), pay, [0.0] * 4, aggregate=len,
                          accept=5)
    x, y, _, _ = fl.load_digits()
    server = fl.Server(fl.FedAvg(fraction_fit=0.5), fl.ClientData(
        x, y, fl.partition.iid(len(y), 40)), fl.model.init_mlp(dtype=np.float32),
        fleet=fl.Fleet.device_cloud(40, drop_prob=0.1), deadline=30.0, accept=0.7, seed=2)
    rec = server.round()
    assert len(rec.completed) == 14 and rec.sim_time < 30.0
