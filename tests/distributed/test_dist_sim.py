"""The discrete-event simulator: timing model, contention, topologies, deadlocks, errors,
trace, failures, and the batched ring path against the message-by-message path."""

import heapq

import numpy as np
import pytest

from mlsys_lab.distributed import sim
from mlsys_lab.distributed.collectives import allreduce
from mlsys_lab.distributed.comm import (
    CommTimeoutError,
    DeadlockError,
    DeviceFailure,
    LinkFailure,
)
from mlsys_lab.distributed.sim import batch as sim_batch
from mlsys_lab.distributed.sim import engine as sim_engine
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError

A, B = 5e-6, 1 / 25e9


def shift(comm, x):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = yield comm.sendrecv(x, dst=right, src=left)
    yield comm.compute(flops=2 * x.size)
    return x + got


def ring_allreduce(comm, x):
    return (yield from allreduce(comm, x, algo="ring"))


def test_contract_example_values_and_time():
    p, n = 4, 1000
    xs = [np.full(n, float(r)) for r in range(p)]
    res = sim.run(sim.Cluster(sim.ring(p, A, B, flops=1e12)), shift, args=[(x,) for x in xs])
    for r in range(p):
        np.testing.assert_array_equal(res.results[r], xs[r] + xs[(r - 1) % p])
    assert res.time == pytest.approx(A + 8 * n * B + 2 * n / 1e12, rel=1e-12)
    kinds = sorted({e.kind for e in res.trace})
    assert kinds == ["compute", "recv", "send"]
    send = next(e for e in res.trace if e.kind == "send" and e.rank == 0)
    assert (send.src, send.dst, send.bytes, send.link) == (0, 1, 8 * n, ("dev0->dev1",))


def test_send_recv_fifo_tags_copies_and_out():
    def prog(comm):
        if comm.rank == 0:
            a = np.arange(3.0)
            yield comm.send(a, 1, tag=0)
            a[:] = -1  # the receiver got a copy at send time
            yield comm.send(np.array([10.0]), 1, tag=0)
            yield comm.send(np.array([7.0]), 1, tag=5)
            return None
        late = yield comm.recv(0, tag=5)  # tags match independently of order
        first = yield comm.recv(0, tag=0)
        buf = np.zeros(1)
        second = yield comm.recv(0, tag=0, out=buf)
        return late, first, second, buf

    res = sim.run(sim.Cluster(sim.fully_connected(2, A, B)), prog)
    late, first, second, buf = res.results[1]
    np.testing.assert_array_equal(first, [0.0, 1.0, 2.0])
    assert late[0] == 7.0 and second is buf and buf[0] == 10.0
    assert res.messages == 3 and res.unmatched == []


def test_send_is_blocking_for_the_sender_and_eager():
    n = 10_000

    def prog(comm):
        if comm.rank == 0:
            yield comm.send(np.zeros(n), 1)
            return comm.now()
        yield comm.compute(seconds=1.0)  # the message waits in the mailbox
        yield comm.recv(0)
        return comm.now()

    res = sim.run(sim.Cluster(sim.ring(2, A, B)), prog)
    assert res.results[0] == pytest.approx(A + 8 * n * B)
    assert res.results[1] == pytest.approx(1.0)


def test_full_duplex_and_contention_on_shared_link():
    n = 1 << 20
    topo = sim.tree(4, fanout=2, alpha=A, beta=B)  # 0,1 | 2,3 under two switches, one root

    def swap(comm):
        if comm.rank in (0, 2):
            yield comm.sendrecv(np.zeros(n, np.uint8), 2 - comm.rank, 2 - comm.rank)

    def cross(comm, pairs):
        for src, dst in pairs:
            if comm.rank == src:
                yield comm.send(np.zeros(n, np.uint8), dst)
            if comm.rank == dst:
                yield comm.recv(src)
        return comm.now()

    hops = 4 * A  # dev -> switch -> root -> switch -> dev
    duplex = sim.run(sim.Cluster(topo), swap)  # opposite directions do not contend
    assert duplex.time == pytest.approx(hops + n * B)
    shared = sim.run(sim.Cluster(topo), cross, args=[([(0, 2), (1, 3)],)] * 4)
    # 0->2 and 1->3 both need sw1.0 -> sw2.0: FIFO, the second starts when the first ends
    assert sorted(shared.rank_time)[-1] == pytest.approx(hops + 2 * n * B)
    assert shared.link_busy["sw1.0->sw2.0"] == pytest.approx(2 * n * B)


def test_two_level_nvlink_ib_and_oversubscription():
    n = 1 << 22

    def all_send_to_next_server(comm, g):
        dst, src = (comm.rank + g) % comm.size, (comm.rank - g) % comm.size
        yield comm.sendrecv(np.zeros(n, np.uint8), dst, src)
        return comm.now()

    def intra(comm):
        if comm.rank in (0, 1):
            yield comm.sendrecv(np.zeros(n, np.uint8), 1 - comm.rank, 1 - comm.rank)
        return comm.now()

    nv_beta, ib_beta = 1 / 300e9, 1 / 25e9
    kw = dict(nvlink_alpha=2e-6, nvlink_beta=nv_beta, ib_alpha=5e-6, ib_beta=ib_beta)
    topo = sim.two_level(4, 2, servers_per_tor=1, oversubscription=1.0, **kw)
    assert sim.run(sim.Cluster(topo), intra).time == pytest.approx(2e-6 + n * nv_beta)
    full = sim.run(sim.Cluster(topo), all_send_to_next_server, args=[(2,)] * 8).time
    assert full == pytest.approx(5e-6 + n * ib_beta)  # uplink = 2 NICs' bandwidth, 2 flows
    over = sim.two_level(4, 2, servers_per_tor=1, oversubscription=4.0, **kw)
    slow = sim.run(sim.Cluster(over), all_send_to_next_server, args=[(2,)] * 8).time
    # the uplink carries 2 NICs / 4 = half a NIC: each flow runs at 1/2 NIC, and they queue
    assert slow == pytest.approx(5e-6 + 2 * (n * 2 * ib_beta), rel=1e-9)
    assert over.route(0, 2) != over.route(0, 1)


def test_deadlock_names_every_blocked_rank():
    def both_receive(comm):
        yield comm.recv((comm.rank + 1) % 2, tag=3)

    with pytest.raises(DeadlockError) as info:
        sim.run(sim.Cluster(sim.ring(2)), both_receive)
    message = str(info.value)
    assert "rank 0: recv(src=1, tag=3)" in message and "rank 1: recv(src=0, tag=3)" in message
    assert set(info.value.blocked) == {0, 1}


@pytest.mark.parametrize("how", ["raises", "deadlock", "time limit"])
def test_a_failed_run_closes_the_programs_still_suspended(how):
    """Every rank's generator (and the ones it delegates to) is closed when the run stops
    with an error, before ``run`` raises: not later, whenever the collector frees it."""
    closed = []

    def inner(comm):
        try:
            yield comm.recv(src=(comm.rank + 1) % comm.size)
        finally:
            closed.append(("inner", comm.rank))

    def prog(comm, x):
        try:
            if how == "raises" and comm.rank == 0:
                yield comm.compute(flops=10)
                raise ValueError("rank 0 gives up")
            if how == "time limit":
                while True:
                    yield comm.compute(flops=1e9)
            yield from inner(comm)
        finally:
            closed.append(("prog", comm.rank))

    cluster = sim.Cluster(sim.ring(3, alpha=A, beta=B))
    error = {"raises": ValueError, "deadlock": DeadlockError,
             "time limit": CommTimeoutError}[how]
    with pytest.raises(error):
        sim.run(cluster, prog, args=[(np.ones(2),)] * 3, time_limit=1.0)
    ranks = (1, 2) if how == "raises" else (0, 1, 2)
    want = {("prog", r) for r in (0, 1, 2)} | {("inner", r) for r in ranks if how != "time limit"}
    assert set(closed) == want
    assert len(closed) == len(want)


def test_mismatched_collective_call_is_a_deadlock_not_a_hang():
    def prog(comm, x):
        if comm.rank == 2:
            return x
        return (yield from allreduce(comm, x))

    with pytest.raises(DeadlockError, match="collective"):
        sim.run(sim.Cluster(sim.ring(4)), prog, args=[(np.ones(8),)] * 4, batched=False)
    with pytest.raises(DeadlockError):  # the batched path falls back and reports the same
        sim.run(sim.Cluster(sim.ring(4)), prog, args=[(np.ones(8),)] * 4, batched=True)


@pytest.mark.parametrize("make, match", [
    (lambda c: c.send(np.ones(2), 5), "dst=5 is not a rank"),
    (lambda c: c.recv(-1), "src=-1 is not a rank"),
    (lambda c: c.send(np.ones(2), c.rank), "itself"),
    (lambda c: c.send(np.ones(2), 1.0), "must be an int"),
    (lambda c: c.recv(1, tag=-2), "tag=-2"),
    (lambda c: c.compute(), "exactly one"),
    (lambda c: c.compute(flops=-1), ">= 0"),
    (lambda c: c.sendrecv(np.ones(2), 1, c.rank), "only both"),
    (lambda c: c.sub([1, 1]), "repeat"),
])
def test_bad_arguments_are_library_errors(make, match):
    def prog(comm):
        if comm.rank == 0:
            yield make(comm)
        return None

    with pytest.raises(ArgumentError, match=match):
        sim.run(sim.Cluster(sim.ring(3)), prog)


def test_run_checks_its_own_arguments():
    cluster = sim.Cluster(sim.ring(2))
    with pytest.raises(ArgumentError, match="2 ranks"):
        sim.run(cluster, shift, args=[(np.ones(1),)])
    with pytest.raises(ArgumentError, match="yielded int"):
        sim.run(cluster, lambda comm: (yield 5))
    with pytest.raises(ArgumentError, match="Cluster"):
        sim.run("cluster", shift)
    with pytest.raises(ArgumentError, match="Topology"):
        sim.Cluster(4)
    with pytest.raises(ArgumentError):
        sim.ring(0)


def test_receive_buffer_mismatch_is_a_shape_error():
    def prog(comm):
        if comm.rank == 0:
            yield comm.send(np.ones(3), 1)
        else:
            yield comm.recv(0, out=np.zeros(4))

    with pytest.raises(ShapeError, match="shape"):
        sim.run(sim.Cluster(sim.ring(2)), prog)
    with pytest.raises(ArgumentError, match="contiguous"):
        sim.run(sim.Cluster(sim.ring(2)), lambda c: (yield c.recv(1 - c.rank, out=[0])))


def test_collective_shape_and_dtype_mismatch_are_clear_errors():
    for batched in (False, True):
        with pytest.raises(ShapeError, match="same shape"):
            sim.run(sim.Cluster(sim.ring(3)), ring_allreduce,
                    args=[(np.ones(6),), (np.ones(6),), (np.ones(9),)], batched=batched)
        with pytest.raises(DTypeError):
            sim.run(sim.Cluster(sim.ring(3)), ring_allreduce,
                    args=[(np.ones(6),), (np.ones(6, np.float32),), (np.ones(6),)],
                    batched=batched)


def test_time_and_wall_limits():
    def forever(comm):
        while True:
            yield comm.compute(seconds=1.0)

    with pytest.raises(CommTimeoutError, match="time_limit"):
        sim.run(sim.Cluster(sim.ring(2)), forever, time_limit=50.0)
    with pytest.raises(CommTimeoutError, match="wall_limit"):
        sim.run(sim.Cluster(sim.ring(2)), forever, wall_limit=0.2)


def test_device_and_link_failures_stop_the_run():
    def work(comm):
        for _ in range(10):
            yield comm.compute(seconds=1.0)
            yield from allreduce(comm, np.ones(4))

    with pytest.raises(DeviceFailure) as info:
        sim.run(sim.Cluster(sim.ring(4)), work, failures={2: 3.5})
    assert info.value.rank == 2 and info.value.time == 3.5
    with pytest.raises(LinkFailure) as info:
        sim.run(sim.Cluster(sim.ring(4)), work, link_failures={(1, 2): 2.5})
    assert info.value.link == (1, 2)


def test_straggler_device_and_flops():
    topo = sim.ring(3, flops=1e12)
    topo.set_device(1, flops=1e11)

    def prog(comm):
        yield comm.compute(flops=1e12)
        return comm.now()

    res = sim.run(sim.Cluster(topo), prog)
    assert res.results == [pytest.approx(1.0), pytest.approx(10.0), pytest.approx(1.0)]
    assert topo.devices[1].memory == 80e9


def test_sub_communicators_are_isolated():
    def prog(comm, x):
        group = comm.sub([r for r in range(comm.size) if r % 2 == comm.rank % 2])
        assert group.size == 3 and group.rank == comm.rank // 2
        part = yield from allreduce(group, x)
        whole = yield from allreduce(comm, x)
        return part, whole

    xs = [np.full(5, float(2 ** r)) for r in range(6)]
    res = sim.run(sim.Cluster(sim.fully_connected(6)), prog, args=[(x,) for x in xs])
    for r, (part, whole) in enumerate(res.results):
        np.testing.assert_array_equal(part, sum(xs[q] for q in range(6) if q % 2 == r % 2))
        np.testing.assert_array_equal(whole, sum(xs))


def test_runs_are_deterministic():
    xs = [np.random.default_rng(r).standard_normal(77) for r in range(7)]
    runs = [sim.run(sim.Cluster(sim.tree(7)), ring_allreduce, args=[(x,) for x in xs],
                    batched=False) for _ in range(2)]
    assert runs[0].trace == runs[1].trace and runs[0].rank_time == runs[1].rank_time


@pytest.mark.parametrize("dtype, n", [("float32", 1001), ("int64", 64), ("float64", 5)])
def test_batched_path_equals_event_path_at_p64(dtype, n):
    p = 64
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(n) * 100).astype(dtype) for _ in range(p)]
    topo = sim.ring(p, A, B)
    topo.slow_link(10, 11, 10.0)

    def prog(comm, x):
        yield comm.compute(seconds=1e-6 * comm.rank)  # ranks enter at different times
        return (yield from allreduce(comm, x, algo="ring"))

    runs = [sim.run(sim.Cluster(topo), prog, args=[(x,) for x in xs], batched=b)
            for b in (False, True)]
    event, batched = runs
    assert batched.messages == event.messages == 2 * (p - 1) * p
    assert batched.rank_time == event.rank_time  # bit for bit
    assert sorted(batched.trace) == sorted(event.trace)
    for a, b in zip(event.results, batched.results):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert batched.link_busy == pytest.approx(event.link_busy)


def test_batched_path_falls_back_when_other_traffic_interleaves():
    p = 8
    xs = [np.arange(10.0) * r for r in range(p)]

    def prog(comm, x):
        if comm.rank == 3:  # a message issued while others already wait in the collective
            yield comm.compute(seconds=1e-3)
            yield comm.send(np.ones(1), 4, tag=1)
        if comm.rank == 4:
            yield comm.recv(3, tag=1)
        return (yield from allreduce(comm, x))

    on = sim.run(sim.Cluster(sim.ring(p)), prog, args=[(x,) for x in xs], batched=True)
    off = sim.run(sim.Cluster(sim.ring(p)), prog, args=[(x,) for x in xs], batched=False)
    assert on.rank_time == off.rank_time
    for a, b in zip(on.results, off.results):
        np.testing.assert_array_equal(a, b)


def test_1024_ranks_symbolic_and_a_slow_link():
    p, n = 1024, 256 * 2**20 // 4
    xs = [(sim.SymbolicArray(n, "float32"),)] * p
    base = sim.run(sim.Cluster(sim.ring(p, A, B)), ring_allreduce, args=xs, trace=False)
    assert base.time == pytest.approx(2 * (p - 1) * (A + n * 4 / p * B), rel=1e-9)
    assert base.results[0].shape == (n,) and base.messages == 2 * (p - 1) * p
    topo = sim.ring(p, A, B)
    topo.slow_link(500, 501, 10.0)
    slow = sim.run(sim.Cluster(topo), ring_allreduce, args=xs, trace=False)
    assert slow.time > 5 * base.time  # the ring runs at its slowest link's pace
    busiest = max(slow.link_busy, key=slow.link_busy.get)
    assert busiest in ("dev500->dev501", "dev501->dev500")


def test_symbolic_array_models_size_only():
    s = sim.SymbolicArray((6, 4), "float64")
    assert (s.size, s.nbytes, s.ndim) == (24, 192, 2)
    flat = s.reshape(-1)
    assert flat[3:10].shape == (7,) and np.add(flat, flat).dtype == np.float64
    with pytest.raises(ArgumentError, match="no values"):
        np.asarray(s)
    with pytest.raises(ShapeError):
        s.reshape(5, 5)


def test_symbolic_and_real_runs_take_the_same_time():
    p, n = 5, 103
    real = sim.run(sim.Cluster(sim.ring(p)), ring_allreduce, args=[(np.ones(n),)] * p,
                   batched=False)
    fake = sim.run(sim.Cluster(sim.ring(p)), ring_allreduce,
                   args=[(sim.SymbolicArray(n, "float64"),)] * p, batched=False)
    assert real.rank_time == fake.rank_time


def test_background_tasks_run_beside_the_foreground_and_wait_gives_their_value():
    """A task started on a dup'd communicator exchanges messages while its rank computes."""
    def talk(stream):
        peer = 1 - stream.rank
        got = yield stream.sendrecv(np.full(1000, stream.rank, np.float64), peer, peer)
        return got[0]

    def prog(comm):
        stream = comm.dup()
        task = yield comm.start(talk(stream))
        yield comm.compute(seconds=1e-3)  # the 8 kB message takes A + 8000 B << 1 ms
        mid = comm.now()
        value = yield comm.wait(task)
        return value, mid, comm.now()

    res = sim.run(sim.Cluster(sim.ring(2, A, B)), prog)
    for r in (0, 1):
        value, mid, end = res.results[r]
        assert value == 1 - r and mid == end == pytest.approx(1e-3)
    sends = [e for e in res.trace if e.kind == "send"]
    assert {e.rank for e in sends} == {0, 1} and all(e.end < 1e-3 for e in sends)
    # a foreground message with the same tag is not taken by the task: contexts differ

    def stuck(comm):
        stream = comm.dup()
        task = yield comm.start((lambda s: (yield s.recv(1 - s.rank)))(stream))
        yield comm.wait(task)

    with pytest.raises(DeadlockError, match="rank 0's background task: recv"):
        sim.run(sim.Cluster(sim.ring(2)), stuck)
    with pytest.raises(ArgumentError, match="not a task that comm.start gave"):
        sim.run(sim.Cluster(sim.ring(2)), lambda comm: (yield comm.wait(3)))
    with pytest.raises(ArgumentError, match="need a generator"):
        sim.run(sim.Cluster(sim.ring(2)), lambda comm: (yield comm.start(talk)))


def every_request(comm, from_form):
    """One request of every kind, asked with ``yield`` or (``from_form``) ``yield from``."""
    from mlsys_lab.distributed.collectives.all_reduce import ring_allreduce, ring_plan

    def ask(request):
        if from_form:
            return (yield from request)
        return (yield request)

    r, p = comm.rank, comm.size
    right, left = (r + 1) % p, (r - 1) % p
    got = {}
    yield from ask(comm.send(np.arange(3) + r, right, tag=1))
    got["recv"] = yield from ask(comm.recv(left, tag=1))
    yield from ask(comm.send(np.array(2.5 * r), right, tag=2))
    got["recv_out"] = yield from ask(comm.recv(left, tag=2, out=np.zeros(())))
    got["sendrecv"] = yield from ask(comm.sendrecv(np.array([r]), right, left))
    got["sendrecv_self"] = yield from ask(comm.sendrecv(np.array([r]), r, r))
    got["exchange"] = yield from ask(comm.exchange(
        [(np.array([r]), right), (np.array([-r]), left)], [left, right]))
    yield from ask(comm.compute(flops=1e6))
    yield from ask(comm.compute(seconds=1e-6))
    if r == 0:
        heard = []
        for _ in range(p - 1):
            heard.append((yield from ask(comm.recv_any(tag=3))))
        got["recv_any"] = sorted((src, int(msg)) for src, msg in heard)
    else:
        yield from ask(comm.send(np.array(10 * r), 0, tag=3))
    task = yield from ask(comm.start(allreduce(comm.dup(), np.full(2, r + 1.0))))
    got["wait"] = yield from ask(comm.wait(task))
    x = np.arange(5.0) * (r + 1)
    flow = ring_allreduce(comm, x, np.add, "every_request")
    got["batched"] = yield from ask(comm.batched("allreduce/ring", x, "sum", flow, ring_plan))
    sub = comm.sub([q for q in range(p) if q % 2 == r % 2])
    got["sub"] = yield from ask(sub.sendrecv(np.array(r), (sub.rank + 1) % sub.size,
                                             (sub.rank - 1) % sub.size))
    return got


def same_values(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_values, a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype and \
            np.array_equal(a, b)
    return a == b


@pytest.mark.parametrize("batched", [False, True])
def test_requests_work_with_yield_and_yield_from(batched):
    """``x = yield from comm.recv(0)`` (the collectives' form, an easy slip for a request)
    gives what ``x = yield comm.recv(0)`` gives, for every kind of request, at the same time."""
    p = 5
    runs = [sim.run(sim.Cluster(sim.ring(p, A, B)), every_request, args=[(f,)] * p,
                    batched=batched) for f in (False, True)]
    plain, from_form = runs
    assert plain.rank_time == from_form.rank_time and plain.trace == from_form.trace
    for r in range(p):
        assert same_values(plain.results[r], from_form.results[r])
    got = from_form.results[1]  # the values themselves, for one rank
    assert same_values(got["recv"], np.arange(3)) and got["recv_out"].shape == ()
    assert same_values(got["exchange"], [np.array([0]), np.array([-2])])
    assert same_values(got["wait"], np.full(2, 15.0))
    assert same_values(got["batched"], np.arange(5.0) * 15)
    assert from_form.results[0]["recv_any"] == [(q, 10 * q) for q in range(1, p)]


def test_a_collective_called_with_yield_says_to_use_yield_from():
    def slip(comm):
        return (yield allreduce(comm, np.ones(2)))

    with pytest.raises(ArgumentError, match="yield from"):
        sim.run(sim.Cluster(sim.ring(2)), slip)
    with pytest.raises(ArgumentError, match="yield the requests"):
        sim.run(sim.Cluster(sim.ring(2)), lambda comm: (yield 3))


@pytest.mark.parametrize("cluster_kw", [{}, {"one_port": True}, {"sharing": "fair"}])
def test_batched_path_charges_gamma_like_the_event_path(cluster_kw):
    """The ring all-reduce reduces after each reduce-scatter step (gamma seconds per byte, as
    compute on the reducing rank); the batched path times it by the same arithmetic."""
    p, n, gamma = 64, 1001, 1 / 20e9
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal(n).astype("float32") for _ in range(p)]
    topo = sim.ring(p, A, B, gamma=gamma)
    topo.slow_link(10, 11, 10.0)
    topo.set_device(7, gamma=8 * gamma)  # a slow reducer holds the ring back

    def prog(comm, x):
        yield comm.compute(seconds=1e-6 * comm.rank)
        return (yield from allreduce(comm, x, algo="ring"))

    event, batched = [sim.run(sim.Cluster(topo, **cluster_kw), prog, args=[(x,) for x in xs],
                              batched=b) for b in (False, True)]
    assert batched.rank_time == event.rank_time  # bit for bit
    assert sorted(batched.trace) == sorted(event.trace)
    reductions = [e for e in event.trace if e.kind == "compute" and 0 < e.end - e.start < 1e-6]
    assert len(reductions) == p * (p - 1)  # p - 1 reductions per rank
    for a, b in zip(event.results, batched.results):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    free = sim.run(sim.Cluster(sim.ring(p, A, B), **cluster_kw), prog, args=[(x,) for x in xs])
    assert batched.time > free.time


def test_object_and_structured_arrays_are_refused_alike_on_both_backends():
    """MPI sends raw bytes with a dtype code, which cannot carry Python objects or fields;
    the shared request check refuses them, so the simulator does not accept what MPI can't."""
    for bad in (np.array([{"a": 1}, None], dtype=object),
                np.zeros(2, dtype=[("x", "f4"), ("y", "i4")])):
        with pytest.raises(DTypeError, match="cannot send an array of dtype"):
            sim.run(sim.Cluster(sim.ring(2)),
                    lambda comm, b=bad: (yield comm.sendrecv(b, 1 - comm.rank, 1 - comm.rank)))


# --- the event loop: records, one handler per kind, faults as events, the batched strategy ---
def _engine(p=4, **run_kw):
    kw = dict(trace=True, batching=None, time_limit=None, wall_limit=None, failures=None,
              link_failures=None)
    kw.update(run_kw)
    return sim_engine.Engine(sim.Cluster(sim.ring(p)), **kw)


class _Counting(sim_engine.Engine):
    """An engine that records every event it hands to a handler (and checks the kind)."""

    last = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Counting.last, self.seen = self, []
        self.handlers = tuple(self._count(kind, h) for kind, h in enumerate(self.handlers))

    def _count(self, kind, handler):
        def run(event):
            assert event.kind == kind
            self.seen.append(event)
            return handler(event)
        return run


def test_event_records_sort_by_time_then_kind_then_tie_break():
    e = _engine()
    e.schedule(2, 1.0, np.zeros(3))  # payloads are never compared: seq breaks every tie
    e.schedule(0, 1.0, np.ones(3))
    e.push(1.0, sim_engine.ANY)
    e.push(1.0, sim_engine.ANY)
    e.push(1.0, sim_engine.PORT, -1, 1)
    e.push(1.0, sim_engine.PORT, -3, 3)
    e.push(1.0, sim_engine.NETWORK)
    e.push(1.0, sim_engine.FAULT, target=2)
    e.schedule(1, 0.5)
    popped = [heapq.heappop(e.events) for _ in range(len(e.events))]
    got = [(ev.time, sim_engine.KINDS[ev.kind], ev.target) for ev in popped]
    assert got == [(0.5, "resume", 1), (1.0, "fault", 2), (1.0, "port", 3), (1.0, "port", 1),
                   (1.0, "network", -1), (1.0, "resume", 0), (1.0, "resume", 2),
                   (1.0, "any", -1), (1.0, "any", -1)]
    anys = [ev.seq for ev in popped if ev.kind == sim_engine.ANY]
    assert anys == sorted(anys) and len(set(ev.seq for ev in popped)) == len(popped)
    assert isinstance(popped[0], tuple) and popped[0]._fields[:3] == ("time", "kind", "order")
    assert e.live == 8  # every event but the fault keeps the run going


def test_one_handler_per_kind_and_each_event_goes_to_its_own(monkeypatch):
    e = _engine()
    assert len(e.handlers) == len(sim_engine.KINDS) == 5
    assert [h.__name__ for h in e.handlers] == [f"on_{k}" for k in sim_engine.KINDS]
    monkeypatch.setattr(sim, "Engine", _Counting)

    def gather_any(comm):  # rank 0 takes the others' messages as they come; ranks exchange
        got = []
        if comm.rank == 0:
            for _ in range(comm.size - 1):
                got.append((yield comm.recv_any(tag=1)))
        else:
            yield comm.compute(seconds=1e-6 * (comm.size - comm.rank))
            yield comm.send(np.full(100, comm.rank), 0, tag=1)
            got = None
        others = [r for r in range(comm.size) if r != comm.rank]
        yield comm.exchange([(np.ones(10), r) for r in others], others)
        return got

    res = sim.run(sim.Cluster(sim.fully_connected(4), one_port=True), gather_any)
    assert [src for src, _ in res.results[0]] == [3, 2, 1]  # the first to arrive first
    kinds = {sim_engine.KINDS[ev.kind] for ev in _Counting.last.seen}
    assert kinds == {"port", "resume", "any"}
    ports = [ev for ev in _Counting.last.seen if ev.kind == sim_engine.PORT]
    assert len(ports) == 4 * 2  # each rank sends 3 messages one at a time: 2 wait for a port
    sim.run(sim.Cluster(sim.ring(4), sharing="fair"), ring_allreduce,
            args=[(np.ones(8),)] * 4, batched=False)
    kinds = {sim_engine.KINDS[ev.kind] for ev in _Counting.last.seen}
    assert kinds == {"network", "resume"}


def test_a_device_failure_is_an_event_the_earliest_one_stops_the_run():
    def slow(comm):
        yield comm.compute(seconds=1.0)
        yield comm.compute(seconds=1.0)

    e = _engine(failures={3: 2e-5, 1: 1e-5})
    assert sorted((ev.time, ev.target) for ev in e.events) == [(1e-5, 1), (2e-5, 3)]
    assert all(ev.kind == sim_engine.FAULT for ev in e.events) and e.live == 0
    # nothing happens between the two failures: the device that failed first is named
    with pytest.raises(DeviceFailure) as info:
        sim.run(sim.Cluster(sim.ring(4)), slow, failures={3: 2e-5, 1: 1e-5})
    assert (info.value.rank, info.value.time) == (1, 1e-5)
    # a failure at the very instant a rank resumes comes first
    with pytest.raises(DeviceFailure) as info:
        sim.run(sim.Cluster(sim.ring(4)), slow, failures={0: 1.0})
    assert info.value.time == 1.0
    # a failure after the run has ended stops nothing; a deadlock before it is a deadlock
    assert sim.run(sim.Cluster(sim.ring(4)), slow, failures={0: 2.5}).time == 2.0

    def stuck(comm):
        yield comm.recv((comm.rank + 1) % comm.size)

    with pytest.raises(DeadlockError):
        sim.run(sim.Cluster(sim.ring(4)), stuck, failures={0: 1.0})


@pytest.mark.parametrize("cluster_kw", [{}, {"one_port": True}, {"sharing": "fair"}])
def test_batched_strategy_gives_the_unbatched_times_with_fewer_events(monkeypatch, cluster_kw):
    p = 16
    topo = sim.ring(p, A, B, gamma=1e-11)
    topo.slow_link(4, 5, 3.0)
    xs = [np.random.default_rng(r).standard_normal(1000) for r in range(p)]

    def prog(comm, x):
        yield comm.compute(seconds=1e-6 * (comm.rank % 3))
        return (yield from allreduce(comm, x, algo="ring"))

    monkeypatch.setattr(sim, "Engine", _Counting)
    runs, events = {}, {}
    for batched in (False, True):
        runs[batched] = sim.run(sim.Cluster(topo, **cluster_kw), prog,
                                args=[(x,) for x in xs], batched=batched)
        events[batched] = len(_Counting.last.seen)
    assert events[True] == 3 * p < events[False]  # start, compute, collective: batched
    assert runs[True].rank_time == runs[False].rank_time  # bit for bit
    assert sorted(runs[True].trace) == sorted(runs[False].trace)
    assert runs[True].messages == runs[False].messages
    for a, b in zip(runs[True].results, runs[False].results):
        np.testing.assert_array_equal(a, b)


def test_a_batch_that_cannot_complete_is_released_to_the_message_by_message_path(monkeypatch):
    p, released = 6, []
    release = sim_batch.BatchedRing.release
    monkeypatch.setattr(sim_batch.BatchedRing, "release",
                        lambda ring: released.append(dict(ring.entries)) or release(ring))

    def late_last(comm, x):
        if comm.rank == p - 1:  # waits for rank 0, which waits inside the collective
            yield comm.recv(0, tag=7)
        y = yield from allreduce(comm, x, algo="ring")
        if comm.rank == 0:
            yield comm.send(np.ones(3), p - 1, tag=7)
        return y

    xs = [(np.full(12, float(r)),) for r in range(p)]
    errors = {}
    for batched in (False, True):
        with pytest.raises(DeadlockError) as info:
            sim.run(sim.Cluster(sim.ring(p, A, B)), late_last, args=xs, batched=batched)
        errors[batched] = info.value
    assert [sorted(r) for r in released] == [list(range(p - 1))]  # once, when nothing was left
    assert errors[True].blocked == errors[False].blocked  # each rank inside the fallback
    assert str(errors[True]) == str(errors[False])
    assert "rank 5: recv(src=0, tag=7)" in str(errors[True])
