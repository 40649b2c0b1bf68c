"""The simulator's port and sharing models: one-port costs against the classic formulas,
max-min fair sharing against hand-computed cases and the bottleneck characterisation, and
any-source receives."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.distributed import collectives as coll
from mlsys_lab.distributed import cost, sim
from mlsys_lab.distributed.comm import DeadlockError
from mlsys_lab.distributed.sim.network import max_min_rates
from mlsys_lab.distributed.sim.topology import Topology
from mlsys_lab.errors import ArgumentError

A, B = 5e-6, 1 / 25e9


def _rooted_prog(kind, algo):
    def prog(comm, x):
        fn = getattr(coll, kind)
        if kind == "scatter" or (kind == "broadcast" and algo != "scatter_allgather"):
            return (yield from fn(comm, x if comm.rank == 0 else None, root=0, algo=algo))
        if kind in ("reduce", "gather"):
            return (yield from fn(comm, x, root=0, algo=algo))
        return (yield from fn(comm, x, algo=algo))
    return prog


CASES = [("broadcast", "binomial"), ("reduce", "binomial"), ("gather", "binomial"),
         ("gather", "direct"), ("scatter", "binomial"), ("scatter", "direct"),
         ("alltoall", "direct"), ("alltoall", "pairwise"), ("reduce", "ring")]


def _timed(kind, algo, p, one_port):
    per = 24 * p  # elements per rank: every block size divides evenly
    size = per * p if kind == "scatter" else per
    nbytes = 8 * (per * p if kind in ("gather", "scatter") else per)
    xs = [(np.arange(size, dtype=np.float64) * (r + 1),) for r in range(p)]
    res = sim.run(sim.Cluster(sim.fully_connected(p, A, B), one_port=one_port),
                  _rooted_prog(kind, algo), args=xs)
    return res, xs, nbytes


@pytest.mark.parametrize("kind,algo", CASES)
@pytest.mark.parametrize("p", [3, 5, 6, 8])
def test_one_port_time_equals_the_one_port_formula(kind, algo, p):
    res, xs, nbytes = _timed(kind, algo, p, one_port=True)
    want = cost.collective_time(kind, algo, p, nbytes, A, B, one_port=True)
    assert res.time == pytest.approx(want, rel=1e-9)
    if kind == "reduce":  # values are unchanged by the port model
        np.testing.assert_allclose(res.results[0], sum(x for (x,) in xs))


def test_without_ports_binomial_beats_ceil_log2_and_direct_is_one_message():
    """What the one-port option fixes: a rank taking several messages at once."""
    for kind in ("reduce", "gather"):
        res, _, nbytes = _timed(kind, "binomial", 6, one_port=False)
        assert res.time < 0.8 * cost.collective_time(kind, "binomial", 6, nbytes, A, B,
                                                     one_port=True)
    res, _, nbytes = _timed("gather", "direct", 6, one_port=False)
    assert res.time == pytest.approx(cost.collective_time("gather", "direct", 6, nbytes, A, B))
    with pytest.raises(ArgumentError, match="no one-port formula"):
        cost.collective_time("allreduce", "tree", 4, 100, A, B, one_port=True)


def test_one_port_keeps_ring_allreduce_and_batched_path_exact():
    p, n = 16, 1024
    xs = [(np.random.default_rng(r).standard_normal(n),) for r in range(p)]
    prog = lambda comm, x: (yield from coll.allreduce(comm, x))
    runs = [sim.run(sim.Cluster(sim.ring(p, A, B), one_port=True), prog, args=xs, batched=b)
            for b in (True, False)]
    assert runs[0].time == runs[1].time == pytest.approx(
        cost.collective_time("allreduce", "ring", p, 8 * n, A, B), rel=1e-9)
    assert sorted(runs[0].trace) == sorted(runs[1].trace)


# --- max-min fair sharing ------------------------------------------------------------------
def _dumbbell(beta0=1e-9, beta=1e-9):
    """Ranks 0, 1 -> switch s1 -> s2 -> ranks 2, 3: flows 0->2 and 1->3 share s1->s2."""
    t = Topology(4, name="dumbbell")
    s1, s2 = t.add_switch("s1"), t.add_switch("s2")
    t.add_link(0, s1, 0.0, beta0)
    t.add_link(1, s1, 0.0, beta)
    t.add_link(s1, s2, 0.0, beta)
    t.add_link(s2, 2, 0.0, beta)
    t.add_link(s2, 3, 0.0, beta)
    return t


def _two_flows(topology, sizes, sharing):
    def prog(comm):
        r = comm.rank
        if r < 2:
            yield comm.send(np.zeros(sizes[r], np.uint8), r + 2)
        else:
            yield comm.recv(r - 2)
        return comm.now()
    return sim.run(sim.Cluster(topology, sharing=sharing), prog).results


def test_fair_two_flows_on_one_link_get_half_each():
    n, b = 1000, 1e-9
    got = _two_flows(_dumbbell(), (n, n), "fair")
    assert got == pytest.approx([2 * n * b] * 4, rel=1e-12)  # both at half rate to the end
    fifo = _two_flows(_dumbbell(), (n, n), "fifo")
    assert fifo == pytest.approx([n * b, 2 * n * b] * 2, rel=1e-12)  # one after the other
    got = _two_flows(_dumbbell(), (n, 2 * n), "fair")  # the short one ends at 2nb, then the
    assert got == pytest.approx([2 * n * b, 3 * n * b] * 2, rel=1e-12)  # long one runs alone


def test_fair_a_flow_bottlenecked_elsewhere_leaves_its_share():
    n, b = 1000, 1e-9
    got = _two_flows(_dumbbell(beta0=4 * b), (n, n), "fair")  # flow 0 gets c/4 on its access
    assert got == pytest.approx([4 * n * b, 4 / 3 * n * b] * 2, rel=1e-12)  # flow 1 gets 3c/4


def test_max_min_rates_textbook_case():
    # links of capacity 1 (beta 1); flows: A on l0+l1, B on l0, C on l1, D on l1 -> l1 is the
    # bottleneck of A, C, D at 1/3 each; B gets what A leaves on l0: 2/3
    rates = max_min_rates([(0, 1), (0,), (1,), (1,)], [1.0, 1.0])
    assert rates == pytest.approx([1 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert max_min_rates([(0,), (1,)], [0.0, 0.5]) == [float("inf"), 2.0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5).flatmap(lambda links: st.tuples(
    st.lists(st.floats(0.1, 10.0), min_size=links, max_size=links),
    st.lists(st.sets(st.integers(0, links - 1), min_size=1), min_size=1, max_size=6))))
def test_max_min_rates_are_feasible_and_every_flow_has_a_bottleneck(case):
    """Max-min fairness (Bertsekas & Gallager): feasible, and every flow crosses a saturated
    link on which no other flow gets more."""
    betas, flows = case
    routes = [tuple(sorted(f)) for f in flows]
    rates = max_min_rates(routes, betas)
    load = [sum(r for r, route in zip(rates, routes) if link in route)
            for link in range(len(betas))]
    for link, beta in enumerate(betas):
        assert load[link] <= (1 / beta) * (1 + 1e-9)
    for f, route in enumerate(routes):
        assert any(load[link] >= (1 / betas[link]) * (1 - 1e-9) and
                   all(rates[g] <= rates[f] * (1 + 1e-9) for g, other in enumerate(routes)
                       if link in other) for link in route)


@pytest.mark.parametrize("algo,topology", [("ring", sim.ring), ("recursive_doubling",
                                                                 sim.fully_connected),
                                           ("rabenseifner", sim.fully_connected)])
def test_fair_sharing_keeps_the_uncontended_formulas_exact(algo, topology):
    p, n = 8, 4096
    xs = [(np.random.default_rng(r).standard_normal(n),) for r in range(p)]
    prog = lambda comm, x: (yield from coll.allreduce(comm, x, algo=algo))
    fair = sim.run(sim.Cluster(topology(p, A, B), sharing="fair"), prog, args=xs,
                   batched=False)
    fifo = sim.run(sim.Cluster(topology(p, A, B)), prog, args=xs, batched=False)
    assert fair.time == fifo.time == pytest.approx(
        cost.collective_time("allreduce", algo, p, 8 * n, A, B), rel=1e-9)
    np.testing.assert_array_equal(fair.results[3], fifo.results[3])
    assert sorted(fair.trace) == sorted(fifo.trace)


def test_fair_sharing_on_a_contended_tree_is_exact_and_keeps_message_order():
    """Every rank sends two messages to the rank across the root of a 2-level tree: the
    root's links are shared, and the receiver still gets them in sending order."""
    p, n = 4, 1000

    def prog(comm):
        peer = (comm.rank + 2) % p
        yield comm.exchange([(np.full(2 * n, comm.rank, np.uint8), peer),
                             (np.full(n, 10 + comm.rank, np.uint8), peer)], [])
        first = yield comm.recv(peer)
        second = yield comm.recv(peer)
        return first[0], second[0], len(first), len(second)

    res = sim.run(sim.Cluster(sim.tree(p, alpha=0.0, beta=1e-9), sharing="fair"), prog)
    for r in range(p):
        peer = (r + 2) % p
        assert res.results[r][:2] == (peer, 10 + peer) and res.results[r][2:] == (2 * n, n)
    # every switch-to-switch direction carries 2 ranks x 3n bytes at half rate each: 6n b
    assert res.time == pytest.approx(6 * n * 1e-9, rel=1e-9)


def test_cluster_refuses_bad_sharing_options():
    with pytest.raises(ArgumentError, match="sharing='gossip' is not one of"):
        sim.Cluster(sim.ring(2), sharing="gossip")
    with pytest.raises(ArgumentError, match="one_port=True works with sharing='fifo'"):
        sim.Cluster(sim.ring(2), one_port=True, sharing="fair")


# --- any-source receive --------------------------------------------------------------------
@pytest.mark.parametrize("sharing", ["fifo", "fair"])
def test_recv_any_takes_messages_in_arrival_order_with_their_sources(sharing):
    # rank r waits r * 1 ms, then sends r + 10 to rank 0; rank 3 sends first but a big
    # message, which arrives last; ties go to the lowest source
    def prog(comm):
        if comm.rank == 0:
            got = []
            for _ in range(comm.size - 1):
                src, msg = yield comm.recv_any(tag=4)
                got.append((src, int(msg[0]), comm.now()))
            return got
        delay = {1: 1e-3, 2: 1e-3, 3: 0.0}[comm.rank]
        yield comm.compute(seconds=delay)
        size = 10_000_000 if comm.rank == 3 else 1
        yield comm.send(np.full(size, comm.rank + 10, np.uint8), 0, tag=4)
        return None

    topo = sim.fully_connected(4, alpha=1e-6, beta=1e-9)
    got = sim.run(sim.Cluster(topo, sharing=sharing), prog).results[0]
    assert [(s, v) for s, v, _ in got] == [(1, 11), (2, 12), (3, 13)]
    assert got[0][2] == pytest.approx(1e-3 + 1e-6 + 1e-9) and got[1][2] == got[0][2]
    assert got[2][2] == pytest.approx(1e-6 + 1e-2)


def test_recv_any_is_not_fooled_by_a_message_sent_earlier_that_arrives_later():
    """A slow early message must not be taken before a quick one sent after it was."""
    def prog(comm):
        if comm.rank == 0:
            src, _ = yield comm.recv_any()
            return src
        if comm.rank == 1:  # sent at t=0, arrives at 1 ms
            yield comm.send(np.zeros(1_000_000, np.uint8), 0)
        else:  # sent at 0.1 ms, arrives at about 0.1 ms
            yield comm.compute(seconds=1e-4)
            yield comm.send(np.zeros(1, np.uint8), 0)
        return None

    res = sim.run(sim.Cluster(sim.fully_connected(3, alpha=0.0, beta=1e-9)), prog)
    assert res.results[0] == 2 and len(res.unmatched) == 1


def test_recv_any_in_a_sub_communicator_gives_the_local_rank_and_deadlock_names_it():
    def prog(comm):
        sub = comm.sub([2, 0, 1])  # world rank 1 is local rank 2
        if sub.rank == 0:
            src, msg = yield sub.recv_any(tag=1)
            return src, int(msg[0])
        if sub.rank == 2:
            yield sub.send(np.array([7]), 0, tag=1)
        return None

    res = sim.run(sim.Cluster(sim.fully_connected(3)), prog)
    assert res.results[2] == (2, 7)
    with pytest.raises(DeadlockError, match=r"recv\(src=any, tag=0\)"):
        sim.run(sim.Cluster(sim.fully_connected(2)), lambda comm: (yield comm.recv_any()))


def test_fair_sharing_batched_path_equals_event_path_at_p64():
    p, n = 64, 1000  # 1000 elements: blocks of 15 and 16, so step sizes differ by rank
    topo = sim.ring(p, A, B)
    topo.slow_link(7, 8, 10.0)
    xs = [(np.random.default_rng(r).standard_normal(n),) for r in range(p)]
    prog = lambda comm, x: (yield from coll.allreduce(comm, x))
    runs = [sim.run(sim.Cluster(topo, sharing="fair"), prog, args=xs, batched=b)
            for b in (True, False)]
    assert runs[0].rank_time == runs[1].rank_time
    assert sorted(runs[0].trace) == sorted(runs[1].trace)
    assert all(np.array_equal(a, b) for a, b in zip(runs[0].results, runs[1].results))
    np.testing.assert_allclose(runs[0].results[5], sum(x for (x,) in xs), rtol=1e-12)
