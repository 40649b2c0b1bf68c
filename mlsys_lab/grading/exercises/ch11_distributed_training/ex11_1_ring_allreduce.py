"""Exercise 11.1: a ring all-reduce written as a rank program over the simulator's
``Communicator``.

The values on every rank must equal numpy's sum, the simulator's trace must show the ring
(2(p - 1) messages per rank, each one block, all to one neighbour) in the time of the
alpha-beta formula, and the result must come from the messages (one message is altered in
transit; batched collectives are refused).

Wrong ideas rejected: gathering to rank 0 and broadcasting, or every rank sending its whole
array to every other rank (an all-to-all), gives the right sums but sends full arrays to
non-neighbours (traffic case) and takes several times the ring's time; passing the whole vector
round the ring (reduce, then broadcast) sends 2(p - 1) messages of n values, not n / p;
reducing a received chunk into the wrong slot (the one just sent) gives wrong sums; stopping
after the reduce-scatter leaves each rank with one reduced chunk; a bidirectional ring is faster
than the formula and talks to two neighbours. H7: a single comm.batched request whose plan sums
every rank's array is refused in every case (``_watched`` passes on plain messages and compute
only); a ring whose messages are sent for show while the sum comes from elsewhere (a
module-level dict of the inputs) fails the sums, traffic and time cases: the check adds a known
delta to the first block one rank receives, and only a result computed from the messages
changes — a ring's by delta on that one block, on every rank (``_expect_ring_flow``).

``forbidden`` names the library's collectives and its ring, and the whole module
``mlsys_lab.viz.collective_view``: its ``ring_allreduce_steps`` replays the ring chunk by chunk,
and the private helper it steps with (``_apply``, one step of moves) would do the same; the
solution uses none of it.
"""

from __future__ import annotations

import numbers

import numpy as np

from mlsys_lab.distributed import sim
from mlsys_lab.distributed.comm import (
    Batched,
    Compute,
    Exchange,
    Recv,
    Request,
    Send,
    SendRecv,
    Start,
    Wait,
)
from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)

#: The probes' ring: 1 us per hop and 1 GB/s, so the bandwidth term dominates a 600-value block.
RING_ALPHA, RING_BETA = 1e-6, 1e-9
BOOK_INPUTS = ([2.0, 4.0, 6.0], [1.0, 2.0, 3.0], [4.0, 8.0, 12.0])


def _ring_inputs(p, shape, dtype, seed):
    rng = np.random.default_rng([seed, p, int(np.prod(shape, dtype=np.int64))])
    return [rng.uniform(-4, 4, shape).astype(dtype) for _ in range(p)]


def _sum_configs(seed):
    """(p, shape, dtype): sizes divisible by p or not, smaller than p, empty, 2-d, float32."""
    rng = np.random.default_rng(seed)
    p = int(rng.integers(3, 7))
    return [(2, (10,), "float64"), (p, (p * 5 + int(rng.integers(1, p)),), "float64"),
            (5, (2,), "float64"), (3, (0,), "float64"), (4, (3, 5), "float64"),
            (3, (int(rng.integers(8, 40)),), "float32"), (7, (7 * 3,), "float64"),
            (1, (6,), "float64")]


def _timing_configs(seed):
    """Bandwidth-bound runs: p ranks, 600 values per block (one not divisible by p)."""
    p = int(np.random.default_rng(seed).integers(3, 7))
    return [(4, (4 * 600,), "float64"), (p, (p * 600,), "float64"),
            (p + 1, ((p + 1) * 600 + 3,), "float64")]


def _tamper_of(seed, p, shape):
    """(rank, delta) of the message the check alters in a run: the first non-empty array that
    ``rank`` receives gets ``delta`` added to every value, in transit."""
    rng = np.random.default_rng([seed, p, int(np.prod(shape, dtype=np.int64)), 1111])
    return int(rng.integers(0, p)), float(rng.integers(16, 64))


# ----------------------------------------------------------------------------- probes
# The answer's rank programs run under ``_watched``, a driver between each program and the
# simulator: it passes the program's requests on, refuses ``comm.batched`` (a whole collective
# the simulator would run for the answer), and on one rank alters one message in transit. A
# ring computes its result from what it receives, so that change reaches the results in a way
# the judge predicts; a sum taken elsewhere (a module-level dict, messages sent for show) does
# not change at all.

_PLAIN_REQUESTS = (Send, Recv, SendRecv, Exchange, Compute, Wait)


class _Refused(Exception):
    """A rank program yielded a request this exercise does not allow."""


def _add_delta(value, request, delta):
    """``value`` (what the simulator gives back for ``request``) with ``delta`` added to its
    first non-empty array, and that array's size; ``(value, 0)`` when it holds none."""
    if isinstance(value, np.ndarray) and value.size and value.dtype.kind in "fiu":
        if value is getattr(request, "out", None):  # the answer's own buffer, filled
            value += value.dtype.type(delta)
            return value, value.size
        return value + value.dtype.type(delta), value.size
    if isinstance(value, (list, tuple)):
        items = list(value)
        for k, item in enumerate(items):
            changed, size = _add_delta(item, request, delta)
            if size:
                items[k] = changed
                return type(value)(items) if isinstance(value, tuple) else items, size
    return value, 0


def _watched(program, rank, tamper, altered):
    """Drive the generator ``program`` for the simulator, as ``yield from`` would, refusing
    requests other than plain messages and compute; with ``tamper = delta``, add ``delta`` to
    the first non-empty array received and note its size in ``altered[rank]``."""
    value, error = None, None
    while True:
        try:
            request = program.throw(error) if error is not None else program.send(value)
        except StopIteration as stop:
            return stop.value
        error, kind = None, type(request)
        if kind is Start:  # a background task is watched too (never altered)
            request = Start(request.comm, _watched(request.program, rank, None, altered))
        elif isinstance(request, Request) and kind not in _PLAIN_REQUESTS:
            what = f"comm.batched({request.name!r}, ...)" if isinstance(request, Batched) \
                else f"a {kind.__name__} request"
            raise _Refused(f"rank {rank} yielded {what}: this exercise asks for the ring's own "
                           "messages (send, recv, sendrecv, exchange); a batched request has "
                           "the simulator run a whole collective for you")
        try:
            value = yield request
        except GeneratorExit:
            program.close()
            raise
        except BaseException as raised:  # the simulator's error, handed to the program
            error, value = raised, None
            continue
        if tamper is not None and rank not in altered:
            value, size = _add_delta(value, request, tamper)
            if size:
                altered[rank] = size


def _ring_run(ring_allreduce, inputs, tamper=None):
    """Run the answer on a simulated ring; what it returned, the trace's sends and the time.
    ``tamper = (rank, delta)``: that rank's first non-empty received array gets ``delta`` added
    (``altered`` is its size, 0 when the rank received none)."""
    p = len(inputs)
    cluster = sim.Cluster(sim.ring(p, alpha=RING_ALPHA, beta=RING_BETA))
    given = [x.copy() for x in inputs]
    altered = {}

    def program(comm, x):
        made = ring_allreduce(comm, x)
        if not (hasattr(made, "send") and hasattr(made, "throw")):
            return made  # a plain function: no messages
        delta = tamper[1] if tamper is not None and comm.rank == tamper[0] else None
        return (yield from _watched(made, comm.rank, delta, altered))

    try:
        res = sim.run(cluster, program, args=[(x,) for x in given], wall_limit=30.0,
                      time_limit=1.0)
    except _Refused as refused:
        return {"refused": str(refused)}
    sends = [(e.rank, e.dst, e.bytes) for e in res.trace if e.kind == "send"]
    out = {"results": list(res.results), "time": res.time, "sends": sends,
           "inputs_after": given}
    if tamper is not None:
        out["altered"] = altered.get(tamper[0], 0)
    return out


def _ring_book_probe(ring_allreduce):
    return _ring_run(ring_allreduce, [np.array(x) for x in BOOK_INPUTS])


def _ring_sums_probe(ring_allreduce, seed):
    """Each configuration twice: as it is, and with one message altered in transit."""
    runs = []
    for p, shape, dtype in _sum_configs(seed):
        inputs = _ring_inputs(p, shape, dtype, seed)
        runs.append([_ring_run(ring_allreduce, inputs),
                     _ring_run(ring_allreduce, inputs, _tamper_of(seed, p, shape))])
    return runs


def _ring_timing_probe(ring_allreduce, seed):
    """One message altered in each run (the time and the traffic do not depend on values)."""
    return [_ring_run(ring_allreduce, _ring_inputs(p, shape, dtype, seed),
                      _tamper_of(seed, p, shape))
            for p, shape, dtype in _timing_configs(seed)]


# ----------------------------------------------------------------------------- judges


def _runs(raw, count, what):
    if not isinstance(raw, list) or len(raw) != count:
        raise AssertionError(f"{what}: expected {count} runs, got {describe(raw)}")
    return raw


def _expect_sums(run, inputs, what):
    p = len(inputs)
    want = np.sum(np.stack([x.astype(np.float64) for x in inputs]), axis=0)
    results = run.get("results") if isinstance(run, dict) else None
    if not isinstance(results, list) or len(results) != p:
        raise AssertionError(f"{what}: expected one result per rank, got {describe(results)}")
    tol = 1e-5 if inputs[0].dtype == np.float32 else 1e-12
    for r, got in enumerate(results):
        if not isinstance(got, np.ndarray):
            raise AssertionError(f"{what}: rank {r} returned {describe(got)}; return a numpy "
                                 "array (the generator's return value)")
        if got.shape != inputs[0].shape or got.dtype != inputs[0].dtype:
            raise AssertionError(f"{what}: rank {r} returned shape {got.shape} {got.dtype}, "
                                 f"expected {inputs[0].shape} {inputs[0].dtype} (the input's)")
        if got.size and not np.allclose(got, want, rtol=tol, atol=tol * (1 + np.abs(want).max())):
            worst = int(np.argmax(np.abs(got.astype(np.float64) - want).reshape(-1)))
            raise AssertionError(f"{what}: rank {r} holds {float(got.reshape(-1)[worst]):.6g} at "
                                 f"flat index {worst}, the sum over ranks is "
                                 f"{float(want.reshape(-1)[worst]):.6g}")
    for r, after in enumerate(run.get("inputs_after") or []):
        if not (isinstance(after, np.ndarray) and np.array_equal(after, inputs[r])):
            raise AssertionError(f"{what}: rank {r}'s input array was changed; work on copies")


def _not_refused(run, what):
    if isinstance(run, dict) and "refused" in run:
        raise AssertionError(f"{what}: {run['refused']}")
    return run


def _moved(run, inputs, tamper, what):
    """Which values of each rank's result (ranks x values, bool) are numpy's sum plus the
    ``delta`` the check added to one message; fails when a value is neither that nor the sum."""
    rank, delta = tamper
    want = np.sum(np.stack([x.astype(np.float64) for x in inputs]), axis=0).reshape(-1)
    results = run.get("results") if isinstance(run, dict) else None
    if not isinstance(results, list) or len(results) != len(inputs):
        raise AssertionError(f"{what}: expected one result per rank, got {describe(results)}")
    tol = (1e-5 if inputs[0].dtype == np.float32 else 1e-12) * (1 + np.abs(want).max() + delta)
    moved = []
    for r, got in enumerate(results):
        if not (isinstance(got, np.ndarray) and got.shape == inputs[0].shape):
            raise AssertionError(f"{what}: rank {r} returned {describe(got)}")
        diff = got.astype(np.float64).reshape(-1) - want
        up, same = np.abs(diff - delta) <= tol, np.abs(diff) <= tol
        if not np.all(up | same):
            k = int(np.argmax(~(up | same)))
            raise AssertionError(f"{what}, with {delta:g} added to the first values rank {rank} "
                                 f"received: rank {r} holds {got.reshape(-1)[k]:.6g} at flat "
                                 f"index {k}, neither the sum {want[k]:.6g} nor the sum plus "
                                 f"{delta:g} (what a reduction of the messages gives)")
        moved.append(up)
    return np.array(moved)


def _expect_from_messages(run, inputs, tamper, what):
    """The run with one message altered: some rank's result must show the change."""
    _not_refused(run, what)
    if len(inputs) == 1 or inputs[0].size == 0:
        return
    rank, delta = tamper
    moved = _moved(run, inputs, tamper, what)
    if not run.get("altered"):
        raise AssertionError(f"{what}: rank {rank} received no values; every rank of an "
                             "all-reduce must receive the others' data")
    if not moved.any():
        raise AssertionError(f"{what}: the check added {delta:g} to the first values rank "
                             f"{rank} received, and no rank's result changed: the sum does not "
                             "come from the messages (a ring adds up what it receives)")


def _expect_ring_flow(run, inputs, tamper, what):
    """The run with one message altered: in a ring, the first block rank ``q`` receives is a
    partial sum of one block of the result, reduced on along the ring and then passed to
    every rank, so every rank ends with exactly that block ``delta`` higher."""
    _not_refused(run, what)
    rank, delta = tamper
    moved = _moved(run, inputs, tamper, what)
    size = run.get("altered") or 0
    if not size:
        raise AssertionError(f"{what}: rank {rank} received no values; in a ring every rank "
                             "receives a block from its neighbour at every step")
    counts = moved.sum(axis=1).tolist()
    if not moved.any():
        raise AssertionError(f"{what}: the check added {delta:g} to the {size}-value block rank "
                             f"{rank} received first, and no rank's result changed: the sum "
                             "does not come from the messages (a ring adds up what it receives)")
    if counts != [size] * len(counts) or not (moved == moved[0]).all():
        raise AssertionError(f"{what}: the check added {delta:g} to the {size}-value block rank "
                             f"{rank} received first; in a ring that partial sum is reduced on "
                             f"and the finished block reaches every rank, so every rank should "
                             f"end with the same {size} values {delta:g} higher, but the ranks "
                             f"have {counts} values changed")


def _ring_book_judge(raw):
    what = "[2,4,6] + [1,2,3] + [4,8,12]"
    _expect_sums(_not_refused(raw, what), [np.array(x) for x in BOOK_INPUTS], what)


def _ring_sums_judge(raw, seed):
    configs = _sum_configs(seed)
    for (p, shape, dtype), pair in zip(configs, _runs(raw, len(configs), "sums")):
        what = f"p={p}, shape {shape} {dtype}"
        if not (isinstance(pair, list) and len(pair) == 2):
            raise AssertionError(f"{what}: the check got {describe(pair)}")
        inputs = _ring_inputs(p, shape, dtype, seed)
        _expect_sums(_not_refused(pair[0], what), inputs, what)
        _expect_from_messages(pair[1], inputs, _tamper_of(seed, p, shape), what)


def _ring_traffic_judge(raw, seed):
    configs = _timing_configs(seed)
    for (p, shape, dtype), run in zip(configs, _runs(raw, len(configs), "ring traffic")):
        what = f"p={p}, {shape[0]} values"
        _not_refused(run, what)
        n, item = shape[0], np.dtype(dtype).itemsize
        largest = -(-n // p) * item
        sends = [tuple(s) for s in run.get("sends", [])] if isinstance(run, dict) else []
        per_rank = {r: [(dst, b) for src, dst, b in sends if src == r] for r in range(p)}
        for r, mine in per_rank.items():
            if len(mine) != 2 * (p - 1):
                raise AssertionError(f"{what}: rank {r} sent {len(mine)} messages; a ring "
                                     f"all-reduce sends 2(p - 1) = {2 * (p - 1)}")
            too_big = [b for _, b in mine if b > largest]
            if too_big:
                raise AssertionError(f"{what}: rank {r} sent a message of {too_big[0]} bytes; "
                                     f"each ring message carries one block (<= {largest} bytes)")
        directions = {tuple((dst - r) % p for dst, _ in per_rank[r]) for r in range(p)}
        if directions not in ({(1,) * 2 * (p - 1)}, {(p - 1,) * 2 * (p - 1)}):
            peers = sorted({dst for dst, _ in per_rank[0]})
            raise AssertionError(f"{what}: rank 0 sent to ranks {peers}; in a ring every rank "
                                 "sends only to its neighbour on one side (rank + 1)")
        _expect_ring_flow(run, _ring_inputs(p, shape, dtype, seed), _tamper_of(seed, p, shape),
                          what)


def _ring_time_judge(raw, seed):
    configs = _timing_configs(seed)
    for (p, shape, dtype), run in zip(configs, _runs(raw, len(configs), "ring time")):
        n, item = shape[0], np.dtype(dtype).itemsize
        _not_refused(run, f"p={p}, {n} values")
        block = (n / p) if n % p == 0 else -(-n // p)
        formula = 2 * (p - 1) * (RING_ALPHA + block * item * RING_BETA)
        got = run.get("time") if isinstance(run, dict) else None
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise AssertionError(f"p={p}: the run reported no time ({describe(got)})")
        exact = n % p == 0
        if (exact and abs(got - formula) > 0.01 * formula) or got > 1.01 * formula:
            raise AssertionError(f"p={p}, {n} values: simulated time {got:.4g} s, the ring takes "
                                 f"2(p-1)(alpha + n/p beta) = {formula:.4g} s")
        # the time of a ring, and of messages that carry the sum: not of messages for show
        _expect_ring_flow(run, _ring_inputs(p, shape, dtype, seed), _tamper_of(seed, p, shape),
                          f"p={p}, {n} values")


register(
    Exercise(
        id="11.1",
        title="Ring all-reduce on the simulator",
        target="ring_allreduce",
        task="the ring all-reduce",
        forbidden=(
            "mlsys_lab.distributed.collectives:allreduce",
            "mlsys_lab.distributed.collectives:reduce_scatter",
            "mlsys_lab.distributed.collectives:allgather",
            "mlsys_lab.distributed.collectives:reduce",
            "mlsys_lab.distributed.collectives:broadcast",
            "mlsys_lab.distributed.collectives:gather",
            "mlsys_lab.distributed.collectives:scatter",
            "mlsys_lab.distributed.collectives:alltoall",
            "mlsys_lab.distributed.collectives:ring_plan",
            "mlsys_lab.distributed.collectives.all_reduce:ring_allreduce",
            "mlsys_lab.distributed.collectives.all_reduce:ring_reduce_scatter",
            "mlsys_lab.distributed.collectives.all_reduce:ring_allgather_blocks",
            "mlsys_lab.distributed.parallel.data_parallel:allreduce_gradients",
            "mlsys_lab.viz.collective_view",  # the stepper's replay of the ring, helpers included
        ),
        cases=(
            Case("[2,4,6] + [1,2,3] + [4,8,12] = [7,14,21] on every rank", 1,
                 feedback="every rank ends with the sum", probe=_ring_book_probe,
                 judge=_ring_book_judge),
            Case("sums equal numpy's: p = 1..7, sizes not divisible by p, empty, 2-d, float32",
                 3, feedback="p - 1 reduce steps, then p - 1 copy steps, on np.array_split "
                 "chunks", probe=_ring_sums_probe, judge=_ring_sums_judge),
            Case("ring traffic: 2(p - 1) messages per rank, one block each, to one neighbour",
                 2, feedback="send one chunk per step to rank + 1", probe=_ring_timing_probe,
                 judge=_ring_traffic_judge),
            Case("simulated time = 2(p - 1)(alpha + n/p beta) within 1%", 2,
                 feedback="send and receive together (comm.sendrecv)",
                 probe=_ring_timing_probe, judge=_ring_time_judge),
        ),
    ),
)
