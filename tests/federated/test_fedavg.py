"""FedAvg and the server: equal to centralised SGD, exact averaging, drop-outs, seeds."""

from fractions import Fraction

import numpy as np
import pytest

from mlsys_lab import federated as fl
from mlsys_lab.errors import ArgumentError, ShapeError
from tests.federated import reference as ref


@pytest.fixture(scope="module")
def digits():
    x, y, xt, yt = fl.load_digits(seed=0, dtype=np.float64)
    return x[:300], y[:300], xt, yt


def models_equal(a, b):
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("epochs,rounds", [(1, 3), (2, 2)])
def test_one_client_full_participation_equals_centralised_sgd(digits, epochs, rounds):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 16, 10), seed=1)
    strategy = fl.FedAvg(fraction_fit=1.0, local_epochs=epochs, batch_size=16, lr=0.2,
                         shuffle=False)
    server = fl.Server(strategy, fl.ClientData(x, y, [np.arange(len(y))]), p0, seed=5)
    server.fit(rounds)
    central = fl.centralised(p0, x, y, epochs=epochs * rounds, batch_size=16, lr=0.2,
                             shuffle=False)
    assert models_equal(server.parameters, central)                 # bit for bit
    hand = ref.sgd(p0, x, y, [np.arange(len(y))] * (epochs * rounds), 16, 0.2)
    for k in p0:
        np.testing.assert_allclose(server.parameters[k], hand[k], rtol=1e-10, atol=1e-12)


def test_shuffled_local_epochs_follow_the_seeded_orders(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), seed=2)
    server = fl.Server(fl.FedAvg(local_epochs=2, batch_size=32, lr=0.1),
                       fl.ClientData(x, y, [np.arange(len(y))]), p0, seed=9)
    server.fit(2)
    want = p0
    for r in (1, 2):
        orders = fl.training.client_orders([len(y)], 2, [[9, r, 0]])[0]
        want = ref.sgd(want, x, y, orders, 32, 0.1)
    for k in p0:
        np.testing.assert_allclose(server.parameters[k], want[k], rtol=1e-10, atol=1e-12)


def test_clients_trained_together_equal_each_alone(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), seed=3)
    parts = fl.partition.quantity_skew(len(y), 5, beta=0.5, seed=0)
    stacked, sizes = fl.training.local_sgd(p0, x, y, parts, epochs=2, batch_size=7, lr=0.1,
                                           mu=0.3, seeds=[[1, c] for c in range(5)])
    assert sizes.tolist() == [len(p) for p in parts]
    for c, part in enumerate(parts):
        orders = [part[o] for o in fl.training.client_orders([len(part)], 2, [[1, c]])[0]]
        want = ref.sgd(p0, x, y, orders, 7, 0.1, mu=0.3)
        got = fl.model.unstack(stacked, c)
        for k in p0:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-12)


def test_weighted_average_is_exact():
    rng = np.random.default_rng(0)
    for _ in range(20):
        m = int(rng.integers(1, 6))
        models = [{"a": rng.integers(-50, 50, (3, 2)).astype(np.float64),
                   "b": rng.integers(-50, 50, 4).astype(np.float64)} for _ in range(m)]
        counts = rng.integers(1, 100, m)
        got = fl.strategies.weighted_average(models, counts)
        for k in ("a", "b"):
            exact = np.array([float(sum(Fraction(int(c)) * Fraction(float(mm[k].flat[i]))
                                        for c, mm in zip(counts, models)) / int(counts.sum()))
                              for i in range(models[0][k].size)]).reshape(models[0][k].shape)
            # rounding only: each share n_k/N and product and sum is one rounding each
            scale = sum(c * np.abs(mm[k]) for c, mm in zip(counts, models)) / counts.sum()
            assert np.all(np.abs(got[k] - exact) <= (2 * m + 1) * 2.3e-16 * scale)
    one = {"w": rng.normal(size=5).astype(np.float32)}
    assert np.array_equal(fl.strategies.weighted_average([one], [17])["w"], one["w"])
    with pytest.raises(ArgumentError, match="weighted_average"):
        fl.strategies.weighted_average([one], [1, 2])
    with pytest.raises(ShapeError, match="weighted_average"):
        fl.strategies.weighted_average([one, {"w": np.zeros(4)}], [1, 2])


def test_a_round_aggregates_exactly_the_uploads_that_arrived(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), seed=4)
    parts = fl.partition.dirichlet(y, 6, alpha=0.5, seed=0)
    fleet = fl.Fleet.uniform(6, flops=1e9, uplink=1e6, downlink=1e7, latency=0.05)
    fleet.drop_prob[2] = 1.0            # always drops out
    fleet.uplink[4] = 10.0              # 10 bytes/s: its upload misses the deadline
    server = fl.Server(fl.FedAvg(local_epochs=1, batch_size=8, lr=0.1),
                       fl.ClientData(x, y, parts), p0, fleet=fleet, deadline=5.0, seed=3)
    rec = server.round()
    assert rec.sampled == list(range(6))
    assert rec.dropped == [2] and rec.late == [4] and rec.completed == [0, 1, 3, 5]
    assert rec.sim_time == pytest.approx(5.0, abs=1e-3)
    stacked, sizes = fl.training.local_sgd(p0, x, y, parts, epochs=1, batch_size=8, lr=0.1,
                                           seeds=[[3, 1, c] for c in range(6)])
    want = fl.strategies.weighted_average([fl.model.unstack(stacked, c) for c in (0, 1, 3, 5)],
                                          sizes[[0, 1, 3, 5]])
    assert models_equal(server.parameters, want)
    # the dropped and the late client's updates never reached the model: with them it differs
    with_all = fl.strategies.weighted_average([fl.model.unstack(stacked, c) for c in range(6)],
                                              sizes)
    assert not np.allclose(with_all["W1"], server.parameters["W1"])


def test_nothing_arrives_keeps_the_model(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), seed=4)
    fleet = fl.Fleet.uniform(3, drop_prob=1.0)
    server = fl.Server(fl.FedAvg(), fl.ClientData(x, y, fl.partition.iid(len(y), 3)), p0,
                       fleet=fleet, deadline=1.0)
    rec = server.round()
    assert rec.completed == [] and models_equal(server.parameters, p0)


def test_rounds_are_reproducible_by_seed(digits):
    x, y, xt, yt = digits
    parts = fl.partition.dirichlet(y, 40, alpha=1.0, seed=0)

    def run(seed):
        server = fl.Server(fl.FedProx(mu=0.1, fraction_fit=0.25, lr=0.1),
                           fl.ClientData(x, y, parts), fl.model.init_mlp((64, 8, 10)),
                           fleet=fl.Fleet.device_cloud(40, seed=1), deadline=2.0, seed=seed,
                           update_transform=fl.privacy.LocalDP("gaussian", 1.0, 0.1))
        recs = server.fit(3)
        return server.parameters, [(r.sampled, r.completed, r.dropped, r.late, r.sim_time,
                                    r.bytes_up, r.bytes_down, r.messages) for r in recs]

    a, b, c = run(7), run(7), run(8)
    assert models_equal(a[0], b[0]) and a[1] == b[1]
    assert not models_equal(a[0], c[0]) and a[1] != c[1]


def test_sampling_and_bytes(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), dtype=np.float32)
    server = fl.Server(fl.FedAvg(fraction_fit=0.1), fl.ClientData(x, y, fl.partition.iid(
        len(y), 100)), p0, seed=0, trace=True)
    rec = server.round()
    assert len(rec.sampled) == 10 == len(set(rec.sampled)) == len(rec.completed)
    wire = (fl.model.num_params(p0) + 1) * 4
    assert rec.bytes_down == 10 * fl.model.num_params(p0) * 4 and rec.bytes_up == 10 * wire
    assert rec.messages == 20
    lanes = {s.lane for s in rec.spans}
    assert "server" in lanes and {f"client {c}" for c in rec.sampled} <= lanes
    second = server.round()
    first_round, second_round = rec.spans[0], second.spans[0]
    assert (first_round.lane, first_round.name, first_round.start) == ("rounds", "round 1", 0.0)
    assert first_round.duration == pytest.approx(rec.sim_time)
    assert second.start == second_round.start == first_round.end == pytest.approx(rec.sim_time)
    assert min(s.start for s in second.spans) >= first_round.end
    assert max(s.end for s in rec.spans) <= first_round.end + 1e-12


def test_server_momentum_and_fedadam(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), seed=6)
    data = fl.ClientData(x, y, fl.partition.iid(len(y), 4))
    plain = fl.Server(fl.FedAvg(lr=0.1), data, p0, seed=1)
    plain.fit(2)
    m0 = fl.Server(fl.FedAvgM(server_lr=1.0, momentum=0.0, lr=0.1), data, p0, seed=1)
    m0.fit(2)
    for k in p0:
        np.testing.assert_allclose(m0.parameters[k], plain.parameters[k], rtol=1e-12, atol=1e-14)
    adam = fl.FedAdam(server_lr=0.05, beta1=0.9, beta2=0.99, tau=1e-3, lr=0.1)
    one = fl.Server(fl.FedAvg(lr=0.1), data, p0, seed=1)
    one.round()
    srv = fl.Server(adam, data, p0, seed=1)
    srv.round()
    for k in p0:
        d = one.parameters[k] - p0[k]
        m, v = 0.1 * d, 0.01 * d * d
        np.testing.assert_allclose(srv.parameters[k], p0[k] + 0.05 * m / (np.sqrt(v) + 1e-3),
                                   rtol=1e-10, atol=1e-12)


def test_fedprox_keeps_clients_near_the_global_model(digits):
    x, y, _, _ = digits
    p0 = fl.model.init_mlp((64, 8, 10), seed=8)
    parts = fl.partition.dirichlet(y, 4, alpha=0.1, seed=0)

    def drift(mu):
        st, _ = fl.training.local_sgd(p0, x, y, parts, epochs=3, batch_size=8, lr=0.1, mu=mu)
        return np.mean([np.linalg.norm(st["W1"][c] - p0["W1"]) for c in range(4)])

    assert drift(1.0) < 0.8 * drift(0.0)


def test_bad_input(digits):
    x, y, _, _ = digits
    with pytest.raises(ArgumentError, match="drop-outs.*deadline"):
        fl.Server(fl.FedAvg(), fl.ClientData(x, y, [np.arange(10)]), fl.model.init_mlp(),
                  fleet=fl.Fleet.uniform(1, drop_prob=0.5))
    with pytest.raises(ArgumentError, match="fleet has 2 devices for 1 clients"):
        fl.Server(fl.FedAvg(), fl.ClientData(x, y, [np.arange(10)]), fl.model.init_mlp(),
                  fleet=fl.Fleet.uniform(2))
    with pytest.raises(ArgumentError, match="fraction_fit"):
        fl.FedAvg(fraction_fit=0)
    with pytest.raises(ArgumentError, match="ClientData"):
        fl.ClientData(x, y, [np.array([10**6])])
