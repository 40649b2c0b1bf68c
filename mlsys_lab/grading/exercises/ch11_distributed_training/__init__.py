"""Checks for chapter 11, distributed training (``solutions/ch11_distributed_training.ipynb``).

11.1 a ring all-reduce written as a rank program over the simulator's ``Communicator``: the
values on every rank equal numpy's sum, the simulator's trace must show the ring (2(p - 1)
messages per rank, each one block, all to one neighbour) in the time of the alpha-beta formula,
and the result must come from the messages (one message is altered in transit; batched
collectives are refused);
11.2 a 1F1B pipeline schedule generator: valid, at most ``min(p - s, m)`` micro-batches in
flight on stage ``s`` and no bubble beyond GPipe's; 11.3 ZeRO's memory per device, term by term;
11.4 a bounded-staleness (SSP) parameter server, driven by an event loop with a straggler and
compared step by step with the rule.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references and decide.
"""

from __future__ import annotations

import heapq
import math
import numbers

import numpy as np

from mlsys_lab.distributed import pipeline_parallel as pp
from mlsys_lab.distributed import sim, zero
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
from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    plain,
    register,
)

# ============================================================================= 11.1 ring all-reduce
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


# ============================================================================= 11.2 1F1B
# ----------------------------------------------------------------------------- inputs (both sides)


#: The random (p, m) of 11.2: p and m log-uniform in these ranges with p * m at most
#: ``PIPELINE_MAX_WORK`` (up to 24,000 operations a schedule, about a second to judge). Some
#: 37,000 pairs with 4e8 operations in all: too many to tabulate from the library before the
#: check, while each one alone is small.
PIPELINE_STAGES, PIPELINE_MICRO, PIPELINE_MAX_WORK = (2, 200), (1, 500), 12_000


def _pipeline_configs(seed):
    """A few small fixed (p, m), edge cases included, then three drawn from a wide range."""
    rng = np.random.default_rng(seed)
    fixed = [(4, 8), (4, 4), (4, 2), (1, 3), (2, 1), (5, 7), (6, 3)]
    drawn = []
    while len(drawn) < 3:
        p, m = (min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))
                for lo, hi in (PIPELINE_STAGES, PIPELINE_MICRO))
        if p * m <= PIPELINE_MAX_WORK:
            drawn.append((p, m))
    return fixed + drawn


# ----------------------------------------------------------------------------- probes


def _packed_stage(ops):
    """A stage's operations as one int64 array, ``j + 1`` for ``("F", j)`` and ``-(j + 1)`` for
    ``("B", j)`` (``j >= 0``), when every operation is such a pair; else the stage as the answer
    gave it (the judge names the problem). Whole-array numpy steps, not a loop per operation:
    a schedule of thousands of operations would otherwise cost thousands of profiled calls
    under the guard (and on the wire)."""
    if not isinstance(ops, (list, tuple)) or not ops:
        return ops
    try:
        table = np.array(ops, dtype=object)
        if table.shape != (len(ops), 2):
            return ops
        kinds, index = table[:, 0], table[:, 1]
        forward = kinds == "F"
        types = set(map(type, index))
        if not (np.all(forward | (kinds == "B")) and all(
                issubclass(t, (int, np.integer)) and not issubclass(t, (bool, np.bool_))
                for t in types)):
            return ops
        j = np.array(index.tolist(), dtype=np.int64)
    except Exception:  # odd operations (ragged, huge ints): the judge explains
        return ops
    if j.min() < 0:
        return ops
    return np.where(forward, j + 1, -(j + 1))


def _schedule_probe(one_f_one_b, seed):
    out = []
    for p, m in _pipeline_configs(seed):
        got = one_f_one_b(p, m)
        out.append([_packed_stage(ops) for ops in got] if isinstance(got, (list, tuple))
                   else got)
    return out


# ----------------------------------------------------------------------------- judges


def _as_schedule(raw, p, m):
    """The answer as lists of ``(kind, j)`` tuples, or an AssertionError naming the problem."""
    what = f"one_f_one_b({p}, {m})"
    if not isinstance(raw, (list, tuple)) or len(raw) != p:
        raise AssertionError(f"{what} returned {describe(raw)}; expected a list of {p} stages")
    out = []
    for s, ops in enumerate(raw):
        if isinstance(ops, np.ndarray) and ops.dtype == np.int64 and ops.ndim == 1:  # packed
            out.append([("F", c - 1) if c > 0 else ("B", -c - 1) for c in ops.tolist()])
            continue
        if not isinstance(ops, (list, tuple)):
            raise AssertionError(f"{what}: stage {s} is {describe(ops)}, not a list")
        stage = []
        for op in ops:
            ok = isinstance(op, (list, tuple)) and len(op) == 2 and op[0] in ("F", "B") and \
                isinstance(op[1], numbers.Integral) and not isinstance(op[1], bool)
            if not ok:
                raise AssertionError(f"{what}: stage {s} holds {describe(op)}; each operation "
                                     "is a pair ('F', j) or ('B', j)")
            stage.append((op[0], int(op[1])))
        out.append(stage)
    return out


def _schedules(raw, seed):
    configs = _pipeline_configs(seed)
    if not isinstance(raw, list) or len(raw) != len(configs):
        raise AssertionError(f"expected {len(configs)} schedules, got {describe(raw)}")
    return [(p, m, _as_schedule(r, p, m)) for (p, m), r in zip(configs, raw)]


def _valid_judge(raw, seed):
    for p, m, sched in _schedules(raw, seed):
        problems = pp.schedule_problems(sched, p, m)
        if problems:
            raise AssertionError(f"one_f_one_b({p}, {m}): {problems[0]}")


def _in_flight_judge(raw, seed):
    for p, m, sched in _schedules(raw, seed):
        peaks = pp.in_flight_peak(sched)
        limit = [min(p - s, m) for s in range(p)]
        over = [s for s in range(p) if peaks[s] > limit[s]]
        if over:
            s = over[0]
            raise AssertionError(f"one_f_one_b({p}, {m}): stage {s} holds {peaks[s]} micro-"
                                 f"batches' activations at once; 1F1B keeps at most "
                                 f"min(p - s, m) = {limit[s]} (GPipe keeps all m)")


def _makespan_judge(raw, seed):
    for p, m, sched in _schedules(raw, seed):
        if pp.schedule_problems(sched, p, m):
            raise AssertionError(f"one_f_one_b({p}, {m}) is not a valid schedule")
        for tf, tb in ((1.0, 2.0), (1.0, 1.0)):
            want = pp.simulate_schedule(pp.gpipe_schedule(p, m), tf, tb).makespan
            got = pp.simulate_schedule(sched, tf, tb).makespan
            if got > want + 1e-9:
                raise AssertionError(f"one_f_one_b({p}, {m}) with forward {tf:g}, backward "
                                     f"{tb:g} takes {got:g}; GPipe's bubble gives {want:g}: "
                                     "start with enough warm-up forwards to fill the pipeline")


# ============================================================================= 11.3 ZeRO memory
# ----------------------------------------------------------------------------- inputs (both sides)

PAPER = (7.5e9, 64)  # the ZeRO paper's example: 7.5 B parameters on 64 GPUs, 2 + 2 + 12 bytes
_KEYS = ("params", "grads", "optimizer", "total")


def _zero_configs(seed):
    """(P, N, stage, weight bytes, grad bytes, optimizer bytes), byte widths that differ."""
    rng = np.random.default_rng(seed)
    widths = [(4, 2, 12), (2, 4, 8), (4, 4, 8), (2, 2, 12), (8, 4, 0)]
    out = []
    for w, g, k in widths:
        for stage in range(4):
            out.append((int(rng.integers(10**6, 10**10)), int(rng.integers(2, 1025)), stage,
                        w, g, k))
    return out


def _zero_call(zero_memory, P, N, stage, w, g, k):
    return zero_memory(P, N, stage, weight_bytes=w, grad_bytes=g, optimizer_bytes=k)


# ----------------------------------------------------------------------------- probes


def _zero_paper_probe(zero_memory):
    return [zero_memory(PAPER[0], PAPER[1], stage) for stage in range(4)]


def _zero_terms_probe(zero_memory, seed):
    return [_zero_call(zero_memory, *cfg) for cfg in _zero_configs(seed)]


ZERO_BAD_CALLS = ((1e9, 8, 4), (1e9, 8, -1), (1e9, 0, 1))


def _zero_errors_probe(zero_memory):
    return [attempt(zero_memory, *args) for args in ZERO_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _expect_breakdown(got, want, what):
    if not isinstance(got, dict) or set(_KEYS) - set(got):
        raise AssertionError(f"{what} returned {describe(got)}; return a dict with the keys "
                             f"{list(_KEYS)} (bytes per device)")
    for key in _KEYS:
        value = got[key]
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
                not math.isclose(float(value), want[key], rel_tol=1e-9, abs_tol=1e-6):
            raise AssertionError(f"{what}: {key} = {plain(value)!r} bytes, expected "
                                 f"{want[key]:.6g}")


def _zero_paper_judge(raw):
    if not isinstance(raw, list) or len(raw) != 4:
        raise AssertionError(f"expected the four stages' breakdowns, got {describe(raw)}")
    for stage, got in enumerate(raw):
        want = zero.zero_memory_breakdown(*PAPER, stage)
        _expect_breakdown(got, want, f"zero_memory(7.5e9, 64, {stage})")


def _zero_terms_judge(raw, seed):
    configs = _zero_configs(seed)
    if not isinstance(raw, list) or len(raw) != len(configs):
        raise AssertionError(f"expected {len(configs)} breakdowns, got {describe(raw)}")
    for (P, N, stage, w, g, k), got in zip(configs, raw):
        want = zero.zero_memory_breakdown(P, N, stage, k=k, weight_bytes=w, grad_bytes=g)
        _expect_breakdown(got, want, f"zero_memory({P}, {N}, {stage}, weight_bytes={w}, "
                                     f"grad_bytes={g}, optimizer_bytes={k})")


def _zero_errors_judge(raw):
    expect_each_raised("zero_memory", ZERO_BAD_CALLS, raw, "ValueError",
                       "stages are 0..3, devices >= 1")


# ============================================================================= 11.4 SSP server
# ----------------------------------------------------------------------------- inputs (both sides)

SSP_WORKERS, SSP_STEPS, SSP_LR = 4, 10, 0.05


def _regression(seed):
    rng = np.random.default_rng([seed, 11])
    X = rng.standard_normal((240, 6))
    y = X @ rng.standard_normal(6) + 0.01 * rng.standard_normal(240)
    return X, y


def _durations(seed, straggler=True):
    """Seconds each worker's step takes: about 1, and 3 for worker 3 (a straggler)."""
    rng = np.random.default_rng([seed, 12])
    base = np.array([1.0, 1.1, 0.9, 3.0 if straggler else 1.05])
    return base[:, None] * (1 + 0.1 * rng.random((SSP_WORKERS, SSP_STEPS)))


def _gate_states(seed):
    """(clocks, staleness): pushes per worker and the bound, for direct questions."""
    rng = np.random.default_rng([seed, 13])
    states = [([4, 2, 1], 2), ([4, 2, 1], 3), ([3, 3, 3], 0), ([5, 1, 3, 1], 1), ([0, 0], 0)]
    for _ in range(3):
        states.append((rng.integers(0, 7, 4).tolist(), int(rng.integers(0, 4))))
    return states


# ----------------------------------------------------------------------------- probes


def _ssp_drive(server_cls, staleness, durations, seed):
    """Workers on an event loop: a worker asks ``can_start``, pulls, computes for its duration
    and pushes; a waiting worker asks again after every push. Returns what happened."""
    X, y = _regression(seed)
    server = server_cls(np.zeros(X.shape[1]), SSP_WORKERS, staleness, SSP_LR)
    done, waiting = [0] * SSP_WORKERS, set()
    starts, curve, heap, seq = [], [], [], 0

    def try_start(w, now):
        nonlocal seq
        step = done[w]
        if step >= SSP_STEPS:
            return
        if not server.can_start(w):
            waiting.add(w)
            return
        waiting.discard(w)
        starts.append((w, step, float(now), step - min(done)))
        weights = np.asarray(server.pull(w), dtype=np.float64)
        rows = np.random.default_rng([seed, w, step]).choice(len(y), 16, replace=False)
        grad = X[rows].T @ (X[rows] @ weights - y[rows]) / len(rows)
        seq += 1
        heapq.heappush(heap, (now + float(durations[w][step]), seq, w, grad))

    for w in range(SSP_WORKERS):
        try_start(w, 0.0)
    while heap:
        now, _, w, grad = heapq.heappop(heap)
        server.push(w, grad)
        done[w] += 1
        weights = np.asarray(server.pull(w), dtype=np.float64)
        curve.append((float(now), float(0.5 * np.mean((X @ weights - y) ** 2))))
        for v in [w] + sorted(waiting - {w}):
            try_start(v, now)
    return {"starts": starts, "curve": curve, "done": list(done),
            "weights": np.asarray(server.pull(0), dtype=np.float64)}


def _ssp_gate_probe(SSPServer, seed):
    answers = []
    for clocks, staleness in _gate_states(seed):
        server = SSPServer(np.zeros(3), len(clocks), staleness, 0.1)
        for w, count in enumerate(clocks):
            for _ in range(count):
                server.push(w, np.zeros(3))
        answers.append([server.can_start(w) for w in range(len(clocks))])
    return answers


def _ssp_straggler_probe(SSPServer, seed):
    return _ssp_drive(SSPServer, 2, _durations(seed), seed)


def _ssp_bsp_probe(SSPServer, seed):
    return _ssp_drive(SSPServer, 0, _durations(seed), seed)


# ----------------------------------------------------------------------------- judges


class _ReferenceSSP:
    """The rule as the judges apply it (asynchronous updates, a gate on the slowest clock)."""

    def __init__(self, weights, num_workers, staleness, lr):
        self.weights, self.staleness, self.lr = np.array(weights, float), staleness, lr
        self.clock = [0] * num_workers

    def can_start(self, worker):
        return self.clock[worker] - min(self.clock) <= self.staleness

    def pull(self, worker):
        return self.weights.copy()

    def push(self, worker, grad):
        self.weights -= self.lr * np.asarray(grad)
        self.clock[worker] += 1


def _ssp_gate_judge(raw, seed):
    states = _gate_states(seed)
    if not isinstance(raw, list) or len(raw) != len(states):
        raise AssertionError(f"expected answers for {len(states)} clock states, got "
                             f"{describe(raw)}")
    for (clocks, s), got in zip(states, raw):
        want = [c - min(clocks) <= s for c in clocks]
        got = [bool(v) if isinstance(v, (bool, np.bool_)) else v for v in plain(got)]
        if got != want:
            w = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), 0)
            raise AssertionError(f"pushes per worker {clocks}, staleness {s}: can_start({w}) "
                                 f"gave {got[w] if w < len(got) else None!r}, expected {want[w]} "
                                 f"(worker {w} is {_steps(clocks[w] - min(clocks))} ahead of "
                                 "the slowest)")


def _steps(n):
    return f"{n} step" if n == 1 else f"{n} steps"


def _drive_record(raw, what):
    if not isinstance(raw, dict) or not isinstance(raw.get("starts"), list):
        raise AssertionError(f"{what}: the run gave {describe(raw)}")
    if raw.get("done") != [SSP_STEPS] * SSP_WORKERS:
        raise AssertionError(f"{what}: workers finished {raw.get('done')} of {SSP_STEPS} steps "
                             "(a worker that is never allowed to start waits forever)")
    return {(w, c): (t, lead) for w, c, t, lead in raw["starts"]}


def _compare_starts(raw, staleness, seed, what):
    got = _drive_record(raw, what)
    want = _drive_record(_ssp_drive(_ReferenceSSP, staleness, _durations(seed), seed), what)
    for key in sorted(want, key=lambda k: want[k][0]):
        (t, lead), (t_ref, _) = got[key], want[key]
        if lead > staleness:
            raise AssertionError(f"{what}: worker {key[0]} started step {key[1]} at t={t:.3g} "
                                 f"while {_steps(lead)} ahead of the slowest worker; the bound "
                                 f"is s = {staleness}")
        if t > t_ref + 1e-9:
            raise AssertionError(f"{what}: worker {key[0]} started step {key[1]} at t={t:.3g}, "
                                 f"but it may start at t={t_ref:.3g} (it is then at most "
                                 f"{staleness} steps ahead): do not wait for more than the bound")
        if t < t_ref - 1e-9:
            raise AssertionError(f"{what}: worker {key[0]} started step {key[1]} at t={t:.3g}, "
                                 f"before the bound allows (t={t_ref:.3g})")
    return want


def _ssp_straggler_judge(raw, seed):
    _compare_starts(raw, 2, seed, "s = 2 with a straggler")


def _ssp_bsp_judge(raw, seed):
    _compare_starts(raw, 0, seed, "s = 0 (bulk synchronous)")


def _ssp_weights_judge(raw, seed):
    _drive_record(raw, "the weights")
    ref = _ssp_drive(_ReferenceSSP, 2, _durations(seed), seed)
    got = raw.get("weights")
    if not isinstance(got, np.ndarray) or got.shape != ref["weights"].shape:
        raise AssertionError(f"pull returned {describe(got)}; return the weights as an array")
    curve = raw.get("curve") or []
    if len(curve) != len(ref["curve"]):
        raise AssertionError(f"{len(curve)} pushes were applied, expected {len(ref['curve'])}")
    for (t, loss), (_, want) in zip(curve, ref["curve"]):
        if not math.isclose(loss, want, rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError(f"after the push at t={t:.3g} the loss is {loss:.6g}, expected "
                                 f"{want:.6g}: apply each push at once, w -= lr * grad")
    if not np.allclose(got, ref["weights"], rtol=1e-9, atol=1e-12):
        raise AssertionError("the final weights differ from w -= lr * grad applied per push")


register(
    # 11.1. A wrong idea that still produces plausible output would fail because: gathering to
    # rank 0 and broadcasting, or every rank sending its whole array to every other rank (an
    # all-to-all), gives the right sums but sends full arrays to non-neighbours (traffic case)
    # and takes several times the ring's time; passing the whole vector round the ring (reduce,
    # then broadcast) sends 2(p - 1) messages of n values, not n / p; reducing a received chunk
    # into the wrong slot (the one just sent) gives wrong sums; stopping after the
    # reduce-scatter leaves each rank with one reduced chunk; a bidirectional ring is faster
    # than the formula and talks to two neighbours. H7: a single comm.batched request whose
    # plan sums every rank's array is refused in every case (``_watched`` passes on plain
    # messages and compute only); a ring whose messages are sent for show while the sum comes
    # from elsewhere (a module-level dict of the inputs) fails the sums, traffic and time
    # cases: the check adds a known delta to the first block one rank receives, and only a
    # result computed from the messages changes — a ring's by delta on that one block, on
    # every rank (``_expect_ring_flow``).
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
            "mlsys_lab.viz.collective_view:ring_allreduce_steps",
            "mlsys_lab.viz.collective_view:_apply",
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
    # 11.2. A wrong idea that still produces plausible output would fail because: GPipe's order
    # (all forwards, then all backwards) is valid and as fast but keeps m micro-batches in
    # flight; strict alternation F0 B0 F1 B1 ... from the start is valid with one in flight but
    # serialises the pipeline (about 3x GPipe's makespan); p - s warm-up forwards (one too many)
    # keeps p - s + 1 in flight; s warm-up forwards on stage s (the order reversed) deadlocks;
    # a backward before its forward, a missing or repeated operation fail validation. A table
    # of the library's schedules made before the check (where nothing is off limits) fails
    # every case: three of the (p, m) are drawn from p <= 200, m <= 500 (p * m <= 12,000),
    # some 37,000 pairs and 4e8 operations, too many to tabulate.
    Exercise(
        id="11.2",
        title="A 1F1B pipeline schedule",
        target="one_f_one_b",
        task="the 1F1B schedule",
        forbidden=(
            "mlsys_lab.distributed.parallel.pipeline_parallel:one_f_one_b_schedule",
            "mlsys_lab.distributed.parallel.pipeline_parallel:make_schedule",
            "mlsys_lab.viz.pipeline_view:schedule_timeline",
        ),
        cases=(
            Case("valid: F and B of each micro-batch once, F first, no deadlock", 2,
                 feedback="each stage runs F j and B j for every j, forwards first",
                 probe=_schedule_probe, judge=_valid_judge),
            Case("at most min(p - s, m) micro-batches in flight on stage s", 2,
                 feedback="warm up with p - s - 1 forwards, then one forward, one backward",
                 probe=_schedule_probe, judge=_in_flight_judge),
            Case("no bubble beyond GPipe's (same makespan)", 2,
                 feedback="fill the pipeline before alternating", probe=_schedule_probe,
                 judge=_makespan_judge),
        ),
    ),
    # 11.3. A wrong idea that still produces plausible output would fail because: sharding the
    # gradients from stage 1 on, or the weights instead of the gradients at stage 2 (the same
    # total when both take 2 bytes) gives wrong terms with the byte widths drawn here; dividing
    # everything by N from stage 1 on misses the paper's 31.4 GB; leaving the optimiser state
    # whole at stages 2 and 3 fails the terms; a stage of 4 or -1 must raise.
    Exercise(
        id="11.3",
        title="ZeRO memory per device",
        target="zero_memory",
        task="the ZeRO memory formulas",
        forbidden=(
            "mlsys_lab.distributed.parallel.zero:zero_memory_per_device",
            "mlsys_lab.distributed.parallel.zero:zero_memory_breakdown",
            "mlsys_lab.distributed.parallel.zero:training_memory",
            "mlsys_lab.distributed.parallel.zero:smallest_stage_that_fits",
        ),
        cases=(
            Case("the ZeRO paper: 7.5 B parameters on 64 GPUs (120, 31.4, 16.6, 1.9 GB)", 2,
                 feedback="2 + 2 + 12 bytes per parameter, sharded stage by stage",
                 probe=_zero_paper_probe, judge=_zero_paper_judge),
            Case("each term sharded from its stage on (random sizes and byte widths)", 3,
                 feedback="stage 1 shards the optimiser state, 2 the gradients, 3 the weights",
                 probe=_zero_terms_probe, judge=_zero_terms_judge),
            Case("a stage outside 0..3 or no devices raises ValueError", 1,
                 feedback="check the arguments", probe=_zero_errors_probe,
                 judge=_zero_errors_judge),
        ),
    ),
    # 11.4. A wrong idea that still produces plausible output would fail because: asynchronous
    # updates without a bound let the fast workers run 4+ steps ahead of the straggler (gate
    # and straggler cases); a fully synchronous gate (start only when level with the slowest)
    # makes fast workers wait while they are within the bound; an off-by-one gate (< s) waits
    # one step early; averaging the pushes of a round before applying them, or scaling lr by
    # 1 / W, changes the loss after each push.
    Exercise(
        id="11.4",
        title="A bounded-staleness parameter server",
        target="SSPServer",
        task="the bounded-staleness server",
        forbidden=("mlsys_lab.distributed.ps.param_server:ParameterServer",),
        cases=(
            Case("can_start: at most s steps ahead of the slowest worker", 2,
                 feedback="compare the worker's pushes with the fewest pushes of any worker",
                 probe=_ssp_gate_probe, judge=_ssp_gate_judge),
            Case("a straggler, s = 2: fast workers run ahead 2 steps, no more, no less", 2,
                 feedback="wait only when the bound would be broken",
                 probe=_ssp_straggler_probe, judge=_ssp_straggler_judge),
            Case("s = 0 is bulk-synchronous", 1, feedback="with s = 0 nobody runs ahead",
                 probe=_ssp_bsp_probe, judge=_ssp_bsp_judge),
            Case("each push is applied at once: the loss after every push", 2,
                 feedback="push: weights -= lr * grad, then count the worker's step",
                 probe=_ssp_straggler_probe, judge=_ssp_weights_judge),
        ),
    ),
)
