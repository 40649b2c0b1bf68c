"""Exercises of chapter 9 test the idea: shortcuts and wrong ideas score 0 on their cases.

Each wrong idea listed in the exercise modules of ``mlsys_lab/grading/exercises/ch09_*/`` is run
here in process with ``run_cases``, which makes the same probe -> wire -> judge round trip as the
grader. The reference answers (copies of the solution notebook's code) must score full marks on
several seeds, and the library's own implementations must be refused.
"""

from __future__ import annotations

import concurrent.futures
import linecache
import queue
import threading

import numpy as np
import pytest

from mlsys_lab.data import DataLoader, DistributedSampler, pipeline_sim
from mlsys_lab.data.pipeline import Pipeline
from mlsys_lab.data.pipeline.autotune import predicted_throughput
from mlsys_lab.data.records import read_shard
from mlsys_lab.grading.core import guard
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.core.exercise import exercises_for_chapter, plain
from mlsys_lab.grading.exercises.ch09_data_processing import ex9_1_parallel_map as pm
from mlsys_lab.grading.exercises.ch09_data_processing import ex9_2_shard_sampler as ss
from mlsys_lab.grading.exercises.ch09_data_processing import ex9_3_bottleneck as bn

from ..exercise_results import fails_only as _failed
from ..exercise_results import feedback as _feedback
from ..exercise_results import refused as _refused
from ..exercise_results import rows as _rows


def test_three_exercises():
    assert [e.id for e in exercises_for_chapter(9)] == ["9.1", "9.2", "9.3"]
    assert all(e.forbidden and e.max_points >= 6 for e in exercises_for_chapter(9))


# ============================================================================= 9.1 parallel map

_END = object()


def parallel_map(fn, items, num_workers):
    """The reference: producer i owns items i + M*k, its own input and output queue."""
    inboxes = [queue.Queue(maxsize=2) for _ in range(num_workers)]
    outboxes = [queue.Queue(maxsize=2) for _ in range(num_workers)]

    def dispatch():
        n = 0
        for item in items:
            inboxes[n % num_workers].put(item)
            n += 1
        for w in range(num_workers):
            inboxes[w].put(_END)

    def work(w):
        while True:
            item = inboxes[w].get()
            if item is _END:
                outboxes[w].put((_END, None))
                return
            try:
                outboxes[w].put((True, fn(item)))
            except Exception as error:
                outboxes[w].put((False, error))

    threads = [threading.Thread(target=dispatch, daemon=True)]
    threads += [threading.Thread(target=work, args=(w,), daemon=True) for w in range(num_workers)]
    for t in threads:
        t.start()
    k = 0
    while True:
        ok, value = outboxes[k % num_workers].get()
        if ok is _END:
            return
        if not ok:
            raise value
        yield value
        k += 1


def first_wave_then_serial(fn, items, num_workers):
    """num_workers calls at once for the first items, then one at a time: the right peak."""
    items = list(items)
    with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:
        head = list(pool.map(fn, items[:num_workers]))
    yield from head
    for item in items[num_workers:]:
        yield fn(item)


def serial_list(fn, items, num_workers):
    return [fn(x) for x in items]


def serial_generator(fn, items, num_workers):
    return (fn(x) for x in items)


def unordered_pool(fn, items, num_workers):
    """One shared input queue, results yielded as they finish."""
    inbox, outbox = queue.Queue(), queue.Queue()
    items = list(items)
    for x in items:
        inbox.put(x)

    def work():
        while True:
            try:
                x = inbox.get_nowait()
            except queue.Empty:
                return
            outbox.put(fn(x))

    for _ in range(num_workers):
        threading.Thread(target=work, daemon=True).start()
    return [outbox.get() for _ in items]


def executor_map(fn, items, num_workers):
    with concurrent.futures.ThreadPoolExecutor(num_workers) as pool:
        return list(pool.map(fn, items))


def thread_per_item(fn, items, num_workers):
    items = list(items)
    out = [None] * len(items)

    def run(i):
        out[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def shared_queue_reordered(fn, items, num_workers):
    """Ordered, concurrent and streaming, but any free thread takes the next item."""
    inbox, outbox = queue.Queue(maxsize=2 * num_workers), queue.Queue(maxsize=2 * num_workers)

    def dispatch():
        n = 0
        for n, x in enumerate(items):
            inbox.put((n, x))
        for _ in range(num_workers):
            inbox.put(None)

    def work():
        while (task := inbox.get()) is not None:
            outbox.put((task[0], fn(task[1])))
        outbox.put(None)

    threading.Thread(target=dispatch, daemon=True).start()
    for _ in range(num_workers):
        threading.Thread(target=work, daemon=True).start()
    pending, ended, k = {}, 0, 0
    while ended < num_workers or k in pending:
        if k in pending:
            yield pending.pop(k)
            k += 1
            continue
        got = outbox.get()
        if got is None:
            ended += 1
        else:
            pending[got[0]] = got[1]


def no_end_markers(fn, items, num_workers):
    """The book's lanes, but the consumer counts the items and the workers never return."""
    items = list(items)
    inboxes = [queue.Queue() for _ in range(num_workers)]
    outboxes = [queue.Queue() for _ in range(num_workers)]

    def work(w):
        while True:
            outboxes[w].put(fn(inboxes[w].get()))

    for w in range(num_workers):
        threading.Thread(target=work, args=(w,), daemon=True).start()
    for n, x in enumerate(items):
        inboxes[n % num_workers].put(x)
    return [outboxes[k % num_workers].get() for k in range(len(items))]


@pytest.mark.parametrize("seed", [0, 1, 2024])
def test_9_1_reference_answer_scores_full_marks(seed):
    result = run_cases("9.1", parallel_map, seed=seed)
    assert result.score == result.max == 9, _feedback(result)


def test_9_1_the_cases_cover_what_they_claim():
    m, values, slow, _ = pm._order_inputs(3)
    assert len(values) % m and 0 <= slow < m        # a partial last round
    m, n, slow = pm._ownership_inputs(3)
    assert n >= 6 * m


@pytest.mark.parametrize("cheat", [
    lambda fn, items, m: Pipeline.from_iterable(list(items)).map(fn, num_parallel=m).to_list(),
    lambda fn, items, m: [b for b in DataLoader(list(items), batch_size=None, num_workers=0,
                                                collate_fn=fn)],
], ids=["Pipeline.map", "DataLoader"])
def test_9_1_library_map_is_refused(cheat):
    result = run_cases("9.1", cheat, seed=3)
    assert _refused(result), _feedback(result)


def test_9_1_a_serial_list_fails_concurrency_ownership_and_streaming():
    result = run_cases("9.1", serial_list, seed=4)
    _failed(result, "num_workers calls", "producer i owns", "streams")
    assert "serial" in _rows(result)["num_workers calls run at once, never more"].feedback


def test_9_1_a_serial_generator_fails_concurrency_and_ownership():
    _failed(run_cases("9.1", serial_generator, seed=5), "num_workers calls", "producer i owns")


def test_9_1_a_first_wave_then_serial_map_fails_sustained_concurrency():
    result = run_cases("9.1", first_wave_then_serial, seed=11)
    row = _rows(result)["num_workers calls run at once, never more"]
    assert not row.passed and "only for the first items" in row.feedback, _feedback(result)


def _events(calls):
    """A call record as the probe sends it: ``calls`` in the order they ran, each a list of
    ``(item, thread)`` started together and then ended together."""
    return [[kind, i, t] for wave in calls for kind in "SE" for i, t in wave]


def test_9_1_the_concurrency_case_needs_no_wall_time():
    # the verdict comes from the order of the recorded events, so a slow machine cannot fail it
    m, n, _ = pm._concurrency_inputs(0)
    waves = [[(i + k, k) for k in range(m)] for i in range(0, n, m)]
    raw = {"out": [x + 1 for x in range(n)], "events": _events(waves)}
    pm._pm_concurrency_judge(raw, 0)
    first_wave = _events(waves[:1]) + _events([[(i, 0)] for i in range(m, n)])
    with pytest.raises(AssertionError, match="only for the first items"):
        pm._pm_concurrency_judge({**raw, "events": first_wave}, 0)


def test_9_1_a_call_recorded_twice_or_not_at_all_fails():
    m, n, _ = pm._concurrency_inputs(0)
    waves = [[(i + k, k) for k in range(m)] for i in range(0, n, m)]
    raw = {"out": [x + 1 for x in range(n)], "events": _events(waves)}
    with pytest.raises(AssertionError, match="item 0 started twice"):
        pm._pm_concurrency_judge({**raw, "events": _events(waves[:1]) + raw["events"]}, 0)
    with pytest.raises(AssertionError, match="not called"):
        pm._pm_concurrency_judge({**raw, "events": _events(waves[1:])}, 0)


def _free(fn):
    """``{name: value}`` of what a function closes over."""
    return dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__ or ())))


def _reachable(fn):
    """Every function reachable from ``fn`` through closures, ``fn`` first."""
    found, stack = [], [fn]
    while stack:
        f = stack.pop()
        if callable(getattr(f, "__code__", None)) or not hasattr(f, "__code__") or f in found:
            continue
        found.append(f)
        stack += [v for v in _free(f).values() if hasattr(v, "__code__")]
    return found


def serial_then_rewrite_records(fn, items, num_workers):
    """H6 as filed: one item at a time, then the records the probe's fn kept in objects it
    closes over rewritten to show num_workers calls at once and one thread per lane."""
    for x in items:
        yield fn(x)
    cells = _free(fn)
    if "peak" in cells:
        cells["peak"][0] = num_workers
        cells["overlap"].update(dict.fromkeys(cells["overlap"], num_workers))
    if "ran_on" in cells:
        cells["ran_on"].update({i: 1000 + i % num_workers for i in cells["ran_on"]})


def serial_then_forge_the_pipe(fn, items, num_workers):
    """The same against a record in a pipe: one item at a time, then a made-up record of
    num_workers calls at once, one thread per lane, written to the pipe fn writes to."""
    import os
    import struct

    n = 0
    for x in items:
        yield fn(x)
        n += 1
    for f in _reachable(fn):
        fd = _free(f).get("write_end")
        if isinstance(fd, int):
            for first in range(0, n, num_workers):
                lane = range(first, min(n, first + num_workers))
                for kind in b"SE":
                    for i in lane:
                        os.write(fd, struct.pack("<cqQ", bytes([kind]), i,
                                                 1000 + i % num_workers))


#: Never calls fn: its work (found in fn's closure) one item at a time, and a made-up record of
#: num_workers calls at once, one thread per lane, written straight to the pipe's write end
#: (found in the noting function's closure). As a notebook cell (student code), whose os calls
#: the closed probe refuses.
FORGE_THE_PIPE_CELL = """
import os
import struct


def forge_the_pipe(fn, items, num_workers):
    free = lambda f: dict(zip(f.__code__.co_freevars, [c.cell_contents for c in f.__closure__]))
    cells = free(fn) if fn.__closure__ else {}
    if "work" not in cells:  # a case that records nothing: a plain serial map
        yield from (fn(x) for x in items)
        return
    work, fd = cells["work"], free(cells["note"])["write_end"]
    items = iter(items)
    while chunk := [x for _, x in zip(range(num_workers), items)]:
        for kind in b"SE":
            for i in chunk:
                os.write(fd, struct.pack("<cqQ", bytes([kind]), i, 1000 + i % num_workers))
        yield from (work(x) for x in chunk)
"""


def _cell(source, name):
    """``name`` as a notebook cell defines it after the seal: the student's own code."""
    guard._local_seal()
    scope = {"__name__": "__main__"}
    filename = f"/tmp/ipykernel_4242/{abs(hash(source))}.py"  # as a kernel names a cell
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


def test_9_1_a_record_written_straight_to_the_pipe_is_refused():
    # the only way to a record without calling fn is to write the pipe directly: the closed
    # probe refuses os from the student's code (posix.write), in the cases that record
    result = run_cases("9.1", _cell(FORGE_THE_PIPE_CELL, "forge_the_pipe"), seed=12)
    _failed(result, "num_workers calls", "producer i owns", strict=False)
    assert "`posix.write` is off limits" in _rows(result)[
        "num_workers calls run at once, never more"].feedback, _feedback(result)


def one_thread_brackets_the_calls(fn, items, num_workers):
    """Uses the probe's own noting to open num_workers calls at once, then runs them one by
    one on the consumer's thread."""
    cells = _free(fn)
    if "note" not in cells:  # a case that records nothing: a plain serial map
        yield from (fn(x) for x in items)
        return
    note, work = cells["note"], cells["work"]
    items = iter(items)
    while chunk := [x for _, x in zip(range(num_workers), items)]:
        for x in chunk:
            note(b"S", x)
        values = [work(x) for x in chunk]
        for x in chunk:
            note(b"E", x)
        yield from values


@pytest.mark.parametrize("cheat", [serial_then_rewrite_records, serial_then_forge_the_pipe,
                                   one_thread_brackets_the_calls])
def test_9_1_a_serial_map_cannot_rewrite_the_call_record(cheat):
    # the probe's fn writes each call's start and end, with its thread, to an OS pipe as they
    # happen: nothing the answer can reach holds the record, what was written stays, a forged
    # call beside a real one is a call twice, and one thread cannot run two calls at once
    result = run_cases("9.1", cheat, seed=12)
    _failed(result, "num_workers calls", "producer i owns")


def read_all_then_rewrite_the_count(fn, items, num_workers):
    """Reads the whole input first, then, before each result, rewrites the probe's count of
    the items read (found in the input generator's frame) to look one ahead."""
    frame = getattr(items, "gi_frame", None)
    counter = (frame.f_locals.get("pulled") if frame is not None else None)
    items = list(items)
    for k, y in enumerate(parallel_map(fn, items, num_workers)):
        if isinstance(counter, list):
            counter[0] = k + 1
        yield y


def test_9_1_the_read_ahead_count_cannot_be_rewritten():
    # the source counts what was read in a C counter (itertools.count): it can be advanced,
    # never taken back
    result = run_cases("9.1", read_all_then_rewrite_the_count, seed=13)
    _failed(result, "streams")


def test_9_1_an_unordered_pool_fails_the_order():
    result = run_cases("9.1", unordered_pool, seed=6)
    _failed(result, "results in input order", "producer i owns", strict=False)
    assert "input order" in _rows(result)[
        "results in input order although one producer is slow"].feedback


def test_9_1_an_executor_map_fails_ownership_and_streaming():
    result = run_cases("9.1", executor_map, seed=7)
    _failed(result, "producer i owns", "streams")
    assert "shared work queue" in _rows(result)["producer i owns items i + M*k"].feedback


def test_9_1_a_thread_per_item_runs_too_many_at_once():
    result = run_cases("9.1", thread_per_item, seed=8)
    _failed(result, "num_workers calls", "producer i owns", "streams")
    assert "never more" in _feedback(result) or "expected exactly" in _feedback(result)


def test_9_1_a_shared_queue_with_a_reorder_buffer_fails_ownership():
    # its reorder buffer is unbounded too, which the streaming case sees on some runs
    result = run_cases("9.1", shared_queue_reordered, seed=9)
    _failed(result, "producer i owns", strict=False)
    rows = _rows(result)
    assert all(rows[n].passed for n in rows if n.startswith(("results", "no items", "num_")))


def test_9_1_workers_without_end_markers_are_left_running():
    _failed(run_cases("9.1", no_end_markers, seed=10), "streams", "the worker threads finish")


def test_9_1_a_stub_scores_zero():
    def stub(fn, items, num_workers):
        raise NotImplementedError("Exercise 9.1")

    result = run_cases("9.1", stub, seed=11)
    assert result.score == 0 and "NotImplementedError" in _feedback(result)


# ============================================================================= 9.2 shard sampler


class ShardSampler:
    """The reference: one permutation per (seed, epoch), padded by repetition, strided."""

    def __init__(self, n, num_replicas, rank, seed=0, shuffle=True, drop_last=False):
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas - 1}], got {rank}")
        self.n, self.num_replicas, self.rank = n, num_replicas, rank
        self.seed, self.shuffle, self.drop_last = seed, shuffle, drop_last
        self.epoch = 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        if self.drop_last:
            return self.n // self.num_replicas
        return -(-self.n // self.num_replicas)

    def order(self):
        if self.shuffle:
            return np.random.default_rng([self.seed, self.epoch]).permutation(self.n).tolist()
        return list(range(self.n))

    def __iter__(self):
        order = self.order()
        total = len(self) * self.num_replicas
        if self.drop_last:
            order = order[:total]
        while len(order) < total:
            order += order[:total - len(order)]
        return iter(order[self.rank::self.num_replicas])


def _sampler(**overrides):
    """A subclass of the reference with some methods replaced (one wrong idea each)."""
    return type("Wrong", (ShardSampler,), overrides)


def _contiguous_iter(self):
    order, per = self.order(), len(self)
    while len(order) < per * self.num_replicas:
        order += order[:per * self.num_replicas - len(order)]
    return iter(order[self.rank * per:(self.rank + 1) * per])


def _per_rank_seed_order(self):
    return np.random.default_rng([self.seed + self.rank, self.epoch]).permutation(self.n).tolist()


def _dropping_len(self):
    return self.n // self.num_replicas


def _dropping_iter(self):
    order = self.order()
    return iter(order[:len(self) * self.num_replicas][self.rank::self.num_replicas])


def _pad_with_zero_iter(self):
    order, total = self.order(), len(self) * self.num_replicas
    return iter((order + [0] * (total - len(order)))[self.rank::self.num_replicas])


def _uneven_iter(self):
    return iter(self.order()[self.rank::self.num_replicas])


def _uneven_len(self):
    return len(range(self.rank, self.n, self.num_replicas))


def _no_epoch_order(self):
    return np.random.default_rng(self.seed).permutation(self.n).tolist()


def _fixed_block_iter(self):
    per = len(self)
    block = [i % self.n for i in range(self.rank * per, (self.rank + 1) * per)]
    rng = np.random.default_rng([self.seed, self.epoch])
    return iter([block[j] for j in rng.permutation(len(block))])


def _drop_last_still_pads_iter(self):
    order, total = self.order(), -(-self.n // self.num_replicas) * self.num_replicas
    while len(order) < total:
        order += order[:total - len(order)]
    return iter(order[self.rank::self.num_replicas])


def _lenient_init(self, n, num_replicas, rank, seed=0, shuffle=True, drop_last=False):
    self.n, self.num_replicas, self.rank = n, max(num_replicas, 1), rank
    self.seed, self.shuffle, self.drop_last, self.epoch = seed, shuffle, drop_last, 0


@pytest.mark.parametrize("seed", [0, 1, 2024])
def test_9_2_reference_answer_scores_full_marks(seed):
    result = run_cases("9.2", ShardSampler, seed=seed)
    assert result.score == result.max == 8, _feedback(result)


def test_9_2_the_reference_matches_the_library_sampler():
    for n, replicas, seed, epoch in ss._shard_configs(5):
        for drop_last in (False, True):
            for rank in range(replicas):
                lib = DistributedSampler(range(n), replicas, rank, seed=seed, drop_last=drop_last)
                lib.set_epoch(epoch)
                mine = ShardSampler(n, replicas, rank, seed=seed, drop_last=drop_last)
                mine.set_epoch(epoch)
                assert list(mine) == [int(i) for i in lib]


def test_9_2_the_configurations_need_padding_and_include_n_below_replicas():
    configs = ss._shard_configs(0)
    assert configs[0][0] < configs[0][1]
    assert all(n % r for n, r, _, _ in configs[2:])


def _distributed_sampler(n, num_replicas, rank, seed=0, shuffle=True, drop_last=False):
    sampler = DistributedSampler(range(n), num_replicas, rank, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    return sampler


def _read_shard_sampler(n, num_replicas, rank, seed=0, shuffle=True, drop_last=False):
    shard = list(read_shard([], num_replicas, rank))

    class FromRecords:
        def __len__(self):
            return -(-n // num_replicas)

        def set_epoch(self, epoch):
            pass

        def __iter__(self):
            return iter(shard)

    return FromRecords()


@pytest.mark.parametrize("cheat", [_distributed_sampler, _read_shard_sampler],
                         ids=["DistributedSampler", "read_shard"])
def test_9_2_library_samplers_are_refused(cheat):
    result = run_cases("9.2", cheat, seed=3)
    assert _refused(result), _feedback(result)


@pytest.mark.parametrize("wrong, failing", [
    (_sampler(__iter__=_contiguous_iter), ["padding repeats", "drop_last"]),
    (_sampler(order=_per_rank_seed_order),
     ["every rank gets", "padding repeats", "all ranks split", "drop_last"]),
    (_sampler(__len__=_dropping_len, __iter__=_dropping_iter),
     ["every rank gets", "padding repeats", "all ranks split"]),
    (_sampler(__iter__=_pad_with_zero_iter), ["padding repeats", "drop_last"]),
    (_sampler(__iter__=_uneven_iter, __len__=_uneven_len),
     ["every rank gets", "padding repeats", "drop_last"]),
    (_sampler(order=_no_epoch_order), ["padding repeats", "set_epoch", "drop_last"]),
    (_sampler(__iter__=_fixed_block_iter), ["padding repeats", "set_epoch", "drop_last"]),
    (_sampler(__iter__=_drop_last_still_pads_iter), ["drop_last"]),
    (_sampler(__init__=_lenient_init), ["a rank outside"]),
], ids=["contiguous blocks", "per-rank seed", "drop instead of pad", "pad with 0",
        "uneven shards", "ignores the epoch", "fixed block shuffled locally",
        "drop_last still pads", "no argument checks"])
def test_9_2_each_wrong_idea_fails_its_cases(wrong, failing):
    _failed(run_cases("9.2", wrong, seed=12), *failing)


def test_9_2_a_fixed_block_is_named_as_such():
    result = run_cases("9.2", _sampler(__iter__=_fixed_block_iter), seed=13)
    assert "same" in _rows(result)[
        "set_epoch reshuffles the whole dataset; the same epoch repeats"].feedback


def test_9_2_a_stub_class_scores_zero():
    class Stub:
        def __init__(self, n, num_replicas, rank, seed=0, shuffle=True, drop_last=False):
            raise NotImplementedError("Exercise 9.2")

    assert run_cases("9.2", Stub, seed=14).score == 0


# ============================================================================= 9.3 bottleneck


def find_bottleneck(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    limits = [] if read_rate is None else [("read", read_rate)]
    for name, cost in costs.items():
        limits.append((name, degrees[name] / cost if cost > 0 else float("inf")))
    if cores is not None and sum(costs.values()) > 0:
        limits.append(("cpus", cores / sum(costs.values())))
    if consume_rate is not None:
        limits.append(("device", consume_rate))
    slowest = limits[0]
    for limit in limits[1:]:
        if limit[1] < slowest[1]:
            slowest = limit
    return slowest


def largest_cost(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    name = max(costs, key=costs.get)
    return name, degrees[name] / costs[name]


def cost_over_degree(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    name = min(costs, key=lambda n: costs[n] / degrees[n])
    return name, degrees[name] / costs[name]


def ignores_degree(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    name = max(costs, key=costs.get)
    return name, 1.0 / costs[name]


def stages_only(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    name = min(costs, key=lambda n: degrees[n] / costs[n])
    return name, degrees[name] / costs[name]


def ignores_cores(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    return find_bottleneck(costs, degrees, read_rate, consume_rate)


def seconds_per_item(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    name, rate = find_bottleneck(costs, degrees, read_rate, consume_rate, cores)
    return name, 1.0 / rate


def last_of_ties(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    limits = [] if read_rate is None else [("read", read_rate)]
    limits += [(n, degrees[n] / c) for n, c in costs.items()]
    if cores is not None:
        limits.append(("cpus", cores / sum(costs.values())))
    if consume_rate is not None:
        limits.append(("device", consume_rate))
    return min(reversed(limits), key=lambda limit: limit[1])


def serial_pipeline(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    return max(costs, key=costs.get), 1.0 / sum(costs.values())


@pytest.mark.parametrize("seed", [0, 1, 2024])
def test_9_3_reference_answer_scores_full_marks(seed):
    result = run_cases("9.3", find_bottleneck, seed=seed)
    assert result.score == result.max == 6, _feedback(result)


def test_9_3_the_reference_agrees_with_the_simulator_formula():
    for costs, degrees, kwargs in bn._bn_random(3, 20, with_rates=True):
        stages = [pipeline_sim.SimStage(n, c, degrees[n]) for n, c in costs.items()]
        rate = pipeline_sim.analytic_throughput(stages, kwargs["read_rate"],
                                                kwargs["consume_rate"])
        assert np.isclose(find_bottleneck(costs, degrees, **kwargs)[1], rate, rtol=1e-12)
    for costs, degrees, kwargs in bn._bn_random(3, 20, with_cores=True):
        rate = predicted_throughput(costs, degrees, kwargs["cores"])
        assert np.isclose(find_bottleneck(costs, degrees, **kwargs)[1], rate, rtol=1e-12)


def test_9_3_random_pipelines_are_not_solved_by_the_largest_cost():
    cases = bn._bn_random(0, 30)
    fooled = sum(largest_cost(*c[:2])[0] != find_bottleneck(*c[:2])[0] for c in cases)
    assert fooled >= 10


@pytest.mark.parametrize("cheat", [
    lambda c, d, read_rate=None, consume_rate=None, cores=None: (
        "x", pipeline_sim.analytic_throughput(
            [pipeline_sim.SimStage(n, v, d[n]) for n, v in c.items()], read_rate,
            consume_rate, cores)),
    lambda c, d, read_rate=None, consume_rate=None, cores=None: (
        "x", predicted_throughput(c, d, cores)),
], ids=["analytic_throughput", "predicted_throughput"])
def test_9_3_library_formulas_are_refused(cheat):
    result = run_cases("9.3", cheat, seed=3)
    assert _refused(result), _feedback(result)


@pytest.mark.parametrize("wrong, failing", [
    (largest_cost, ["30 random", "with F and G", "with shared cores", "worked", "ties"]),
    (cost_over_degree, ["30 random", "with F and G", "with shared cores", "worked", "ties"]),
    (ignores_degree, ["30 random", "with F and G", "with shared cores", "worked", "ties"]),
    (stages_only, ["with F and G", "worked", "ties", "with shared cores"]),
    (ignores_cores, ["with shared cores"]),
    (seconds_per_item, ["30 random", "with F and G", "with shared cores", "worked", "ties"]),
    (last_of_ties, ["ties"]),
    (serial_pipeline, ["30 random", "with F and G", "with shared cores", "worked", "ties"]),
], ids=["largest cost", "cost / degree", "ignores degree", "ignores F and G", "ignores cores",
        "seconds per item", "ties to the last", "serial pipeline"])
def test_9_3_each_wrong_idea_fails_its_cases(wrong, failing):
    _failed(run_cases("9.3", wrong, seed=15), *failing)


def test_9_3_feedback_names_the_wrong_idea():
    assert "largest cost" in _feedback(run_cases("9.3", largest_cost, seed=16))
    assert "seconds per item" in _feedback(run_cases("9.3", seconds_per_item, seed=16))


def _one_stage_rule(pick):
    """find_bottleneck with one wrong idea: only the stage ``pick`` chooses is a limit."""
    def wrong(costs, degrees, read_rate=None, consume_rate=None, cores=None):
        name = pick(costs, degrees)
        return find_bottleneck({name: costs[name]}, {name: degrees[name]}, read_rate,
                               consume_rate, cores and cores * costs[name] / sum(costs.values()))
    return wrong


def _without(limit):
    """find_bottleneck with one wrong idea: the limit ``limit`` is left out."""
    def wrong(costs, degrees, read_rate=None, consume_rate=None, cores=None):
        kwargs = {"read_rate": read_rate, "consume_rate": consume_rate, "cores": cores}
        kwargs[limit] = None
        return find_bottleneck(costs, degrees, **kwargs)
    return wrong


# Each wrong idea changes the reference in exactly one respect, and has its own hint.
_ONE_MISTAKE = {
    "largest cost": _one_stage_rule(lambda c, d: max(c, key=c.get)),
    "fastest stage": _one_stage_rule(lambda c, d: max(c, key=lambda n: d[n] / c[n])),
    "no read": _without("read_rate"),
    "no cpus": _without("cores"),
    "no device": _without("consume_rate"),
    "last on ties": last_of_ties,
    "seconds per item": seconds_per_item,
}
_HINTS = {mistake: hint for mistake, (_, hint) in bn._BN_MISTAKES.items()}
_HINTS["seconds per item"] = bn._BN_SECONDS_HINT
_JUDGES = [  # (case, judge(raw, seed), the case's inputs for a seed)
    ("worked examples", lambda raw, seed: bn._bn_examples_judge(raw),
     lambda seed: bn._bn_examples()),
    ("30 random", bn._bn_stages_judge, lambda seed: bn._bn_random(seed, 30)),
    ("with F and G", bn._bn_rates_judge,
     lambda seed: bn._bn_random(seed, 30, with_rates=True)),
    ("with shared cores", bn._bn_cores_judge,
     lambda seed: bn._bn_random(seed, 30, with_cores=True)),
    ("ties", lambda raw, seed: bn._bn_ties_judge(raw), lambda seed: bn._bn_ties()),
]


def _hints_shown(wrong, seeds):
    """{(case, hints named in its message)}: how often, over ``seeds``, each case failed with
    which hints (the judges called directly, as the grader calls them, for speed)."""
    shown: dict[tuple[str, tuple[str, ...]], int] = {}
    for seed in seeds:
        for case, judge, inputs in _JUDGES:
            raw = [plain(wrong(dict(c), dict(d), **kw)) for c, d, kw in inputs(seed)]
            try:
                judge(raw, seed)
            except AssertionError as error:
                named = tuple(m for m, hint in _HINTS.items() if hint in str(error))
                shown[(case, named)] = shown.get((case, named), 0) + 1
    return shown


@pytest.mark.parametrize("mistake", list(_ONE_MISTAKE))
def test_9_3_each_hint_is_shown_for_its_own_mistake_and_never_another(mistake):
    """The hint comes from the mistake the answer made: over many seeds, an answer with one
    wrong idea is only ever told that idea's hint, and is told it on nearly every failure of a
    case with random inputs (an answer that two ideas would both give gets no hint when no
    other failure of the case can be named: "no read" and "last on ties" both answer 'a' when
    F ties stage a)."""
    shown = _hints_shown(_ONE_MISTAKE[mistake], range(150))
    others = {key: n for key, n in shown.items() if set(key[1]) - {mistake}}
    assert not others, f"{mistake}: other hints shown: {others}"
    assert any(named == (mistake,) for _, named in shown), shown
    drawn = {key: n for key, n in shown.items() if key[0] not in ("worked examples", "ties")}
    hinted = sum(n for key, n in drawn.items() if key[1] == (mistake,))
    assert hinted >= 0.85 * sum(drawn.values()), shown  # random inputs: nearly always named
    # the case: an answer that forgets the shared-cores cap is always told so
    if mistake == "no cpus":
        assert shown == {("with shared cores", ("no cpus",)): 150}, shown


@pytest.mark.parametrize("wrong, mistakes", [
    (largest_cost, {"largest cost", "no read", "no cpus", "no device"}),
    (cost_over_degree, {"fastest stage", "no read", "no cpus", "no device"}),
    (stages_only, {"no read", "no cpus", "no device"}),
], ids=["largest cost only", "cost / degree only", "ignores F, G and cores"])
def test_9_3_an_answer_with_several_mistakes_is_told_only_mistakes_it_made(wrong, mistakes):
    shown = _hints_shown(wrong, range(60))
    told = {m for (_, named), n in shown.items() for m in named}
    assert told and told <= mistakes, shown


def test_9_3_the_hint_survives_the_round_trip_through_check():
    result = run_cases("9.3", ignores_cores, seed=4)
    assert _HINTS["no cpus"] in _feedback(result)
    assert _HINTS["largest cost"] not in _feedback(result)


def test_9_3_a_stub_scores_zero():
    def stub(costs, degrees, read_rate=None, consume_rate=None, cores=None):
        raise NotImplementedError("Exercise 9.3")

    assert run_cases("9.3", stub, seed=17).score == 0
