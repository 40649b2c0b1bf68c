"""Exercises of chapter 11 test the idea: the references score full marks, the library's own
implementations are refused, and each wrong idea listed in the exercise modules of
``mlsys_lab/grading/exercises/ch11_distributed_training/`` scores 0 on the cases that name it.

Everything runs in process with ``run_cases`` (the same probe -> wire -> judge round trip as the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from mlsys_lab.distributed import collectives, param_server, zero
from mlsys_lab.distributed import pipeline_parallel as pp
from mlsys_lab.distributed.collectives import all_reduce as collective_allreduce
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.exercises.ch11_distributed_training import ex11_2_one_f_one_b as ex11_2

from ..exercise_results import case, fails, feedback, full

SEEDS = [0, 1, 7]


# ============================================================================= 11.1 ring all-reduce
def ring_allreduce(comm, x):
    p, r = comm.size, comm.rank
    chunks = [c.copy() for c in np.array_split(x.reshape(-1), p)]
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        out, into = (r - step) % p, (r - step - 1) % p
        got = yield comm.sendrecv(chunks[out], dst=right, src=left)
        chunks[into] = chunks[into] + got
    for step in range(p - 1):
        out, into = (r - step + 1) % p, (r - step) % p
        chunks[into] = yield comm.sendrecv(chunks[out], dst=right, src=left)
    return np.concatenate(chunks).reshape(x.shape)


def gather_then_broadcast(comm, x):
    if comm.rank == 0:
        total = x.astype(x.dtype, copy=True)
        for src in range(1, comm.size):
            total = total + (yield comm.recv(src))
        for dst in range(1, comm.size):
            yield comm.send(total, dst)
        return total
    yield comm.send(x, 0)
    return (yield comm.recv(0))


def all_to_all(comm, x):
    others = [r for r in range(comm.size) if r != comm.rank]
    got = yield comm.exchange(sends=[(x, r) for r in others], srcs=others)
    return x + sum(got) if got else x.copy()


def chain_reduce_broadcast(comm, x):
    """Running sums passed along the ring as whole vectors, then the total passed on."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    acc = x.copy()
    if r > 0:
        acc = acc + (yield comm.recv(left))
    if r < p - 1:
        yield comm.send(acc, right)
        acc = yield comm.recv(left)
    if r != p - 2 and p > 1:
        yield comm.send(acc, right)
    return acc


def wrong_slot(comm, x):
    """Reduces the received chunk into the slot it just sent."""
    p, r = comm.size, comm.rank
    chunks = [c.copy() for c in np.array_split(x.reshape(-1), p)]
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        out = (r - step) % p
        got = yield comm.sendrecv(chunks[out], dst=right, src=left)
        chunks[out] = chunks[out] + got
    for step in range(p - 1):
        out, into = (r - step + 1) % p, (r - step) % p
        chunks[into] = yield comm.sendrecv(chunks[out], dst=right, src=left)
    return np.concatenate(chunks).reshape(x.shape)


def reduce_scatter_only(comm, x):
    p, r = comm.size, comm.rank
    chunks = [c.copy() for c in np.array_split(x.reshape(-1), p)]
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(p - 1):
        out, into = (r - step) % p, (r - step - 1) % p
        got = yield comm.sendrecv(chunks[out], dst=right, src=left)
        chunks[into] = chunks[into] + got
    return np.concatenate(chunks).reshape(x.shape)


def bidirectional_ring(comm, x):
    """Half the data clockwise and half anticlockwise at once: two neighbours, and faster
    than the one-way ring the formula describes."""
    p, r = comm.size, comm.rank
    flat = x.reshape(-1)
    half = flat.size // 2
    a = [c.copy() for c in np.array_split(flat[:half], p)]
    b = [c.copy() for c in np.array_split(flat[half:], p)]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        got_a, got_b = yield comm.exchange(sends=[(a[(r - s) % p], right),
                                                  (b[(r + s) % p], left)], srcs=[left, right])
        a[(r - s - 1) % p] = a[(r - s - 1) % p] + got_a
        b[(r + s + 1) % p] = b[(r + s + 1) % p] + got_b
    for s in range(p - 1):
        got_a, got_b = yield comm.exchange(sends=[(a[(r - s + 1) % p], right),
                                                  (b[(r + s - 1) % p], left)], srcs=[left, right])
        a[(r - s) % p], b[(r + s) % p] = got_a, got_b
    return np.concatenate(a + b).reshape(x.shape)


def batched_sum(comm, x):
    """H7: one comm.batched request whose plan sums every rank's array and reports a ring's
    traffic; no ring written (the reference ring only as the fallback the request needs)."""
    def plan(arrays, op):
        p, item = len(arrays), arrays[0].dtype.itemsize
        lengths = np.array([c.size for c in np.array_split(arrays[0].reshape(-1), p)])
        ranks = np.arange(p)
        steps = [lengths[(ranks - s - 1) % p] * item for s in range(p - 1)] + \
            [lengths[(ranks - s) % p] * item for s in range(p - 1)]
        total = np.sum(np.stack(arrays), axis=0).astype(arrays[0].dtype)
        return [total.copy() for _ in arrays], np.array(steps, np.int64).reshape(-1, p)

    return (yield comm.batched("allreduce/ring", x, "sum", ring_allreduce(comm, x), plan))


def exchange_then_batched(comm, x):
    """One real exchange on every rank, then rank 0's batched request: refused with the other
    ranks suspended mid-ring."""
    p = comm.size
    yield comm.sendrecv(x, dst=(comm.rank + 1) % p, src=(comm.rank - 1) % p)
    if comm.rank == 0:
        yield from batched_sum(comm, x)
    yield comm.recv(src=(comm.rank - 1) % p)
    return x


def test_a_refused_ring_leaves_no_program_for_a_later_probe_to_finalize():
    """A refusal stops the simulated run with the other ranks' programs suspended (the
    grader's ``program`` and ``_watched`` generators around the answer). ``sim.run`` closes
    them inside that probe; left to the collector, they were finalized during some later
    exercise's probe, whose guard took the grader's 11.1 helpers running there for a shortcut
    (11.2's reference lost two cases that way, on 3.13)."""
    def suspended():  # the collector lists them until it frees them, whenever that is
        return {id(g) for g in gc.get_objects() if type(g).__name__ == "generator"
                and g.gi_code.co_name in ("program", "_watched") and g.gi_frame is not None
                and "ex11_1" in g.gi_code.co_filename}

    before = suspended()
    result = run_cases("11.1", exchange_then_batched, seed=2)
    assert result.score == 0 and "comm.batched" in feedback(result), feedback(result)
    assert suspended() - before == set()


_INPUTS_SEEN = {}  # (run, rank) -> input: where the sham below takes its sum from


def sum_from_a_dict(comm, x):
    """H7: a ring's messages sent and received for show, each block the right size to the
    right neighbour; the result is the sum of every rank's input kept in a module-level dict."""
    p, r = comm.size, comm.rank
    run = id(comm._engine)
    _INPUTS_SEEN[run, r] = x.copy()
    chunks = np.array_split(x.reshape(-1), p)
    right, left = (r + 1) % p, (r - 1) % p
    for step in range(2 * (p - 1)):
        yield comm.sendrecv(chunks[(r - step) % p], dst=right, src=left)  # and ignored
    return np.sum([_INPUTS_SEEN[run, k] for k in range(p)], axis=0).astype(x.dtype)


def test_ring_a_batched_request_is_refused():
    # comm.batched has the simulator run a whole collective: refused in every case
    result = run_cases("11.1", batched_sum, seed=2)
    assert result.score == 0, feedback(result)
    assert all("comm.batched('allreduce/ring', ...)" in row.feedback for row in result.rows), \
        feedback(result)


def test_ring_a_sum_not_taken_from_the_messages_fails():
    # the check adds delta to one message in transit: a ring's result changes by delta on one
    # block of every rank, a sum taken from anywhere else does not change at all
    result = run_cases("11.1", sum_from_a_dict, seed=3)
    assert case(result, "[2,4,6]").passed, feedback(result)
    fails(result, "sums", "ring traffic", "simulated time")
    assert "no rank's result changed" in case(result, "ring traffic").feedback


@pytest.mark.parametrize("seed", SEEDS)
def test_ring_reference_scores_full_marks(seed):
    full(run_cases("11.1", ring_allreduce, seed=seed))


def test_ring_library_is_refused():
    for cheat in (lambda comm, x: collectives.allreduce(comm, x, algo="ring"),
                  lambda comm, x: collectives.allreduce(comm, x, algo="tree"),
                  lambda comm, x: collective_allreduce.ring_allreduce(comm, x, np.add, "x")):
        result = run_cases("11.1", cheat, seed=0)
        gc.collect()  # close the refused rank generators now, not inside a later guarded run
        assert result.score == 0, feedback(result)
        assert "off limits" in feedback(result)


def via_the_stepper(comm, x):
    """The collective stepper's replay of the ring (every rank's input is its own here)."""
    from mlsys_lab.viz import collective_view

    yield from ()
    steps = collective_view.ring_allreduce_steps([x] * comm.size)
    return steps[-1].result(comm.rank).reshape(x.shape)


def via_the_steppers_helper(comm, x):
    """One step of the stepper's moves, by its private helper."""
    from mlsys_lab.viz import collective_view

    yield from ()
    state = collective_view._apply([[collective_view.Chunk(x, frozenset())]], (),
                                   lambda got, own: own)
    return state[0][0].value


def test_ring_the_collective_stepper_is_refused():
    # 11.1 forbids the whole module mlsys_lab.viz.collective_view (a forbidden entry names no
    # private object): ring_allreduce_steps and the private _apply it steps with both refuse
    for cheat in (via_the_stepper, via_the_steppers_helper):
        result = run_cases("11.1", cheat, seed=0)
        gc.collect()
        assert result.score == 0, feedback(result)
        assert "off limits" in feedback(result) and "collective_view" in feedback(result), \
            feedback(result)


@pytest.mark.parametrize("wrong", [gather_then_broadcast, all_to_all, chain_reduce_broadcast,
                                   bidirectional_ring])
def test_ring_right_sums_wrong_algorithm_fail_traffic_and_time(wrong):
    result = run_cases("11.1", wrong, seed=1)
    assert case(result, "[2,4,6]").passed and case(result, "sums").passed, feedback(result)
    fails(result, "ring traffic", "simulated time")


@pytest.mark.parametrize("wrong", [wrong_slot, reduce_scatter_only])
def test_ring_wrong_chunk_schedule_fails_the_sums(wrong):
    result = run_cases("11.1", wrong, seed=2)
    fails(result, "[2,4,6]", "sums")


# ============================================================================= 11.2 1F1B
def one_f_one_b(p, m):
    schedule = []
    for s in range(p):
        ahead = min(p - s - 1, m)
        ops = [("F", j) for j in range(ahead)]
        f, b = ahead, 0
        while b < m:
            if f < m:
                ops.append(("F", f))
                f += 1
            ops.append(("B", b))
            b += 1
        schedule.append(ops)
    return schedule


def _warmup(p, m, count):
    schedule = []
    for s in range(p):
        w = min(count(p, s), m)
        ops = [("F", j) for j in range(w)]
        for i in range(m - w):
            ops += [("F", w + i), ("B", i)]
        schedule.append(ops + [("B", j) for j in range(m - w, m)])
    return schedule


def no_warm_up(p, m):
    return [[op for j in range(m) for op in (("F", j), ("B", j))] for _ in range(p)]


def one_too_many(p, m):
    return _warmup(p, m, lambda p, s: p - s)


def reversed_warm_up(p, m):
    return _warmup(p, m, lambda p, s: s)


def backward_first(p, m):
    return [[("B", 0)] + [op for op in stage if op != ("B", 0)] for stage in one_f_one_b(p, m)]


@pytest.mark.parametrize("seed", SEEDS)
def test_1f1b_reference_scores_full_marks(seed):
    full(run_cases("11.2", one_f_one_b, seed=seed))


def test_1f1b_library_is_refused():
    for cheat in (pp.one_f_one_b_schedule, lambda p, m: pp.make_schedule("1f1b", p, m)):
        result = run_cases("11.2", cheat, seed=0)
        assert result.score == 0 and "off limits" in feedback(result), feedback(result)


def test_gpipe_is_valid_but_keeps_m_in_flight():
    result = run_cases("11.2", pp.gpipe_schedule, seed=3)
    assert case(result, "valid").passed and case(result, "no bubble").passed
    fails(result, "at most")


def test_no_warm_up_is_valid_but_serialises():
    result = run_cases("11.2", no_warm_up, seed=3)
    assert case(result, "valid").passed and case(result, "at most").passed
    fails(result, "no bubble")


def test_one_warm_up_too_many_keeps_one_more_in_flight():
    result = run_cases("11.2", one_too_many, seed=4)
    assert case(result, "valid").passed and case(result, "no bubble").passed
    fails(result, "at most")


def test_1f1b_tabulated_from_the_library_before_the_check_fails():
    # every (p, m) the check used to draw (p <= 6, m <= 10), looked up in the library outside
    # the check (where nothing is off limits), then served from the table: no rule needed
    table = {(p, m): pp.one_f_one_b_schedule(p, m) for p in range(1, 7) for m in range(1, 11)}
    result = run_cases("11.2", lambda p, m: table[(p, m)], seed=3)
    fails(result, "valid", "at most", "no bubble")


def test_1f1b_packed_on_the_wire_judged_as_given():
    # the probe packs well-formed stages into int arrays; lists and numpy ints are pairs too,
    # and an odd operation reaches the judge as the answer gave it
    lists = run_cases("11.2", lambda p, m: [[["F", np.int64(j)] for j in range(m)]
                                            + [["B", j] for j in range(m)] for _ in range(p)],
                      seed=2)
    assert case(lists, "valid").passed and case(lists, "no bubble").passed, feedback(lists)
    for odd in (("F", True), ("F", -1), ("X", 0), "F0"):
        result = run_cases("11.2", lambda p, m, odd=odd: [[odd] + [op for op in stage]
                                                          for stage in one_f_one_b(p, m)],
                           seed=2)
        assert result.score == 0, feedback(result)
        assert f"stage 0 holds {type(odd).__name__} {odd!r}" in feedback(result) or \
            "exactly once: [('F', -1)" in feedback(result), feedback(result)


def test_1f1b_draws_from_a_range_too_wide_to_tabulate():
    drawn = [pm for seed in range(20) for pm in ex11_2._pipeline_configs(seed)[7:]]
    assert max(p for p, _ in drawn) > 100 and max(m for _, m in drawn) > 200
    assert all(p * m <= ex11_2.PIPELINE_MAX_WORK for p, m in drawn)  # each stays quick to judge


@pytest.mark.parametrize("wrong", [reversed_warm_up, backward_first])
def test_invalid_schedules_fail(wrong):
    result = run_cases("11.2", wrong, seed=5)
    fails(result, "valid", "no bubble")


# ============================================================================= 11.3 ZeRO memory
def zero_memory(num_params, num_devices, stage, weight_bytes=2, grad_bytes=2,
                optimizer_bytes=12):
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_memory: stage must be 0, 1, 2 or 3, got {stage!r}")
    if num_devices < 1:
        raise ValueError(f"zero_memory: need at least one device, got {num_devices!r}")
    shards_from = {"params": 3, "grads": 2, "optimizer": 1}
    per_param = {"params": weight_bytes, "grads": grad_bytes, "optimizer": optimizer_bytes}
    out = {key: num_params * per_param[key] / (num_devices if stage >= shards_from[key] else 1)
           for key in per_param}
    out["total"] = sum(out.values())
    return out


def _zero_with(shards_from, total_only=False, divide_all=False):
    def wrong(num_params, num_devices, stage, weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
        if stage not in (0, 1, 2, 3) or num_devices < 1:
            raise ValueError("bad arguments")
        per = {"params": weight_bytes, "grads": grad_bytes, "optimizer": optimizer_bytes}
        out = {k: num_params * per[k] / (num_devices if stage >= shards_from[k] else 1)
               for k in per}
        if divide_all and stage >= 1:
            out = {k: num_params * per[k] / num_devices for k in per}
        out["total"] = sum(out.values())
        return out["total"] if total_only else out
    return wrong


@pytest.mark.parametrize("seed", SEEDS)
def test_zero_reference_scores_full_marks(seed):
    full(run_cases("11.3", zero_memory, seed=seed))


def test_zero_paper_numbers():
    gb = [zero_memory(7.5e9, 64, s)["total"] / 1e9 for s in range(4)]
    assert [round(g, 1) for g in gb] == [120.0, 31.4, 16.6, 1.9]


def test_zero_library_is_refused():
    def cheat(P, N, stage, weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
        return zero.zero_memory_breakdown(P, N, stage, k=optimizer_bytes,
                                          weight_bytes=weight_bytes, grad_bytes=grad_bytes)

    result = run_cases("11.3", cheat, seed=0)
    assert result.score == 0 and "off limits" in feedback(result), feedback(result)


@pytest.mark.parametrize("wrong,cases", [
    (_zero_with({"params": 3, "grads": 1, "optimizer": 1}), ["the ZeRO paper", "each term"]),
    (_zero_with({"params": 2, "grads": 3, "optimizer": 1}), ["each term"]),  # equal totals
    (_zero_with({"params": 3, "grads": 2, "optimizer": 9}), ["the ZeRO paper", "each term"]),
    (_zero_with({"params": 3, "grads": 2, "optimizer": 1}, divide_all=True),
     ["the ZeRO paper", "each term"]),
    (_zero_with({"params": 3, "grads": 2, "optimizer": 1}, total_only=True),
     ["the ZeRO paper", "each term"]),
])
def test_zero_wrong_terms_fail(wrong, cases):
    fails(run_cases("11.3", wrong, seed=6), *cases)


def test_swapping_weights_and_grads_keeps_the_papers_totals():
    wrong = _zero_with({"params": 2, "grads": 3, "optimizer": 1})
    assert [wrong(7.5e9, 64, s)["total"] for s in range(4)] == \
        [zero_memory(7.5e9, 64, s)["total"] for s in range(4)]


def test_zero_without_argument_checks_fails_that_case():
    def unchecked(P, N, stage, weight_bytes=2, grad_bytes=2, optimizer_bytes=12):
        return zero_memory(P, max(N, 1), min(max(stage, 0), 3), weight_bytes, grad_bytes,
                           optimizer_bytes)

    result = run_cases("11.3", unchecked, seed=0)
    fails(result, "a stage outside")
    assert case(result, "each term").passed


# ============================================================================= 11.4 SSP server
class SSPServer:
    def __init__(self, weights, num_workers, staleness, lr):
        self.weights = np.array(weights, dtype=float)
        self.staleness, self.lr = staleness, lr
        self.pushes = [0] * num_workers

    def can_start(self, worker):
        return self.pushes[worker] <= min(self.pushes) + self.staleness

    def pull(self, worker):
        return self.weights.copy()

    def push(self, worker, grad):
        self.weights = self.weights - self.lr * np.asarray(grad)
        self.pushes[worker] += 1


class AsyncNoBound(SSPServer):
    def can_start(self, worker):
        return True


class FullySync(SSPServer):
    def can_start(self, worker):
        return self.pushes[worker] == min(self.pushes)


class OffByOne(SSPServer):
    def can_start(self, worker):
        return self.pushes[worker] < min(self.pushes) + self.staleness


class AveragesRounds(SSPServer):
    """Buffers the pushes of a round and applies their mean when all workers sent one."""

    def __init__(self, weights, num_workers, staleness, lr):
        super().__init__(weights, num_workers, staleness, lr)
        self.buffer = {}

    def push(self, worker, grad):
        round_ = self.pushes[worker]
        self.pushes[worker] += 1
        self.buffer.setdefault(round_, []).append(np.asarray(grad))
        if len(self.buffer[round_]) == len(self.pushes):
            self.weights = self.weights - self.lr * np.mean(self.buffer.pop(round_), axis=0)


class ScaledLr(SSPServer):
    def push(self, worker, grad):
        self.weights = self.weights - self.lr / len(self.pushes) * np.asarray(grad)
        self.pushes[worker] += 1


@pytest.mark.parametrize("seed", SEEDS)
def test_ssp_reference_scores_full_marks(seed):
    full(run_cases("11.4", SSPServer, seed=seed))


def test_ssp_library_server_is_refused():
    class Wrapper(SSPServer):
        def can_start(self, worker):
            return param_server.ParameterServer._may_answer(self, 0, {}, 0, worker, np.arange(1))

    result = run_cases("11.4", Wrapper, seed=0)
    assert result.score == 0 and "off limits" in feedback(result), feedback(result)


def test_async_without_bound_fails():
    result = run_cases("11.4", AsyncNoBound, seed=1)
    fails(result, "can_start", "a straggler")


def test_fully_sync_fails_but_is_right_for_s_zero():
    result = run_cases("11.4", FullySync, seed=1)
    fails(result, "can_start", "a straggler")
    assert case(result, "s = 0").passed


def test_off_by_one_gate_fails():
    result = run_cases("11.4", OffByOne, seed=2)
    fails(result, "can_start", "a straggler", "s = 0")


@pytest.mark.parametrize("wrong", [AveragesRounds, ScaledLr])
def test_updates_not_applied_at_once_fail(wrong):
    result = run_cases("11.4", wrong, seed=3)
    assert case(result, "can_start").passed
    fails(result, "each push")


def _stub(*args, **kwargs):
    raise NotImplementedError("Exercise 11.x")


class StubServer:
    def __init__(self, *args):
        raise NotImplementedError("Exercise 11.4")


@pytest.mark.parametrize("exercise,stub", [("11.1", _stub), ("11.2", _stub), ("11.3", _stub),
                                           ("11.4", StubServer)])
def test_stubs_score_zero_without_crashing(exercise, stub):
    result = run_cases(exercise, stub, seed=0)
    assert result.score == 0 and all("NotImplementedError" in row.feedback for row in result.rows)
