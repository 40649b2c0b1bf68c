"""Checks for chapter 9, data processing (``solutions/ch09_data_processing.ipynb``).

9.1 an order-preserving parallel map on threads, in which producer ``i`` of ``M`` owns items
``i + M*k``: outputs in input order although later items finish first, ``M`` calls running at
once (not fewer, not more), the ownership itself read from the threads that ran each item (a
record of fn's calls written to an OS pipe as they happen, out of the answer's reach), a
bounded read-ahead and threads that finish; 9.2 a shard-aware sampler with DistributedSampler's
semantics (one permutation shared by every rank, padding by repetition to equal lengths, strided
shards, ``set_epoch``, ``drop_last``); 9.3 a bottleneck finder: the slowest of the read rate F,
each stage's ``degree / cost``, the shared CPUs and the consume rate G.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references and decide. The probes of
9.1 run the answer on a helper thread with a time limit, so an answer that deadlocks fails its
case instead of hanging the check.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import struct
import sys
import threading
import time

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    plain,
    register,
)

# ============================================================================= shared helpers

_LIMIT_S = 20.0  # a case whose answer runs longer than this is taken as hung


def _bounded(body, limit=_LIMIT_S):
    """``body()`` on a helper thread; ``{"hung": seconds}`` if it does not finish in time.

    An exception from the answer is re-raised here, so the check reports it as the answer's.
    """
    box = {}

    def run():
        try:
            box["value"] = body()
        except BaseException as error:  # handed to the probe's thread, raised there
            box["error"] = error

    thread = threading.Thread(target=run, name="check-9", daemon=True)
    thread.start()
    thread.join(limit)
    if thread.is_alive():
        return {"hung": limit}
    if "error" in box:
        raise box["error"]
    return box["value"]


def _not_hung(raw, what):
    if isinstance(raw, dict) and "hung" in raw and len(raw) == 1:
        raise AssertionError(f"{what}: your parallel_map did not finish within {raw['hung']:g} s "
                             "(a deadlock? every worker must see the end of the input, and the "
                             "consumer must stop at the first end marker of its lane)")
    return raw


def _expect(raw, kind, what):
    if not isinstance(raw, kind):
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    return raw


# ============================================================================= 9.1 parallel map
# ----------------------------------------------------------------------------- inputs (both sides)


def _order_inputs(seed):
    """Workers M, the items (dicts with an id and a value) and the lane whose items are slow."""
    rng = np.random.default_rng(9100 + seed)
    m = int(rng.integers(2, 5))
    n = int(rng.integers(4, 7)) * m + int(rng.integers(1, m))   # not a multiple of M
    values = [int(v) for v in rng.integers(-1000, 1000, n)]
    slow = int(rng.integers(0, m))
    offset = int(rng.integers(1, 100))
    return m, values, slow, offset


def _transform(value, offset):
    return 3 * value - offset


def _ownership_inputs(seed):
    rng = np.random.default_rng(9200 + seed)
    m = int(rng.integers(2, 5))
    n = 6 * m + int(rng.integers(0, m))
    slow = int(rng.integers(0, m))   # this producer's first item takes long
    return m, n, slow


def _streaming_inputs(seed):
    rng = np.random.default_rng(9300 + seed)
    return int(rng.integers(2, 5)), int(rng.integers(200, 260))


def _concurrency_inputs(seed):
    rng = np.random.default_rng(9400 + seed)
    m = int(rng.integers(2, 5))
    return m, 4 * m, 0.025


#: At most this many items per worker may have been read from the input and not yet delivered.
READ_AHEAD_PER_WORKER = 8

# ----------------------------------------------------------------------------- the call record
# The concurrency and ownership cases judge from when and where fn ran. Those records must be
# out of the answer's reach: anything fn closes over, the answer can find (fn.__closure__) and
# rewrite after running the items one by one. So fn writes each call's start and end, with the
# thread it ran on, to an OS pipe the moment they happen: what is written cannot be taken back
# or reordered, and the read end is held by the probe alone, which reads it once the answer has
# returned. An answer that writes events of its own to the pipe only adds to the record: the
# judge wants exactly one start and one end per item, so a forged call beside a real one is seen.

_EVENT = struct.Struct("<cqQ")  # b"S" (start) or b"E" (end), the item, the thread's ident
_OS_CALLS = ("pipe", "write", "read", "close", "set_blocking")


def _os_calls():
    """os.pipe, write, read, close and set_blocking, checked to be the operating system's own
    C functions (a notebook that replaced one could rewrite the record on its way)."""
    builtin, module = type(len), type(sys)
    calls = {}
    for name in _OS_CALLS:
        f = getattr(os, name, None)
        owner = getattr(f, "__self__", None)
        if not (type(f) is builtin and type(owner) is module and f.__name__ == name
                and owner.__name__ in ("posix", "nt")):
            raise RuntimeError(f"os.{name} was replaced in this notebook; the check records "
                               "fn's calls with it and cannot trust it")
        calls[name] = f
    return calls


def _call_record():
    """``(note, collect)``: ``note(kind, item)`` writes one event of a call of fn to a fresh
    pipe; ``collect()`` stops the noting and returns the events in the order they happened,
    as ``[kind, item, thread]`` with ``thread`` numbered by first appearance (0, 1, ...)."""
    calls = _os_calls()
    get_ident = threading.get_ident
    read_end, write_end = calls["pipe"]()
    calls["set_blocking"](write_end, False)  # a full pipe raises in fn instead of hanging
    calls["set_blocking"](read_end, False)
    lock = threading.Lock()
    noting = [True]

    def note(kind, item):
        with lock:
            if noting[0]:
                calls["write"](write_end, _EVENT.pack(kind, item, get_ident()))

    def collect():
        with lock:
            noting[0] = False
            calls["close"](write_end)
        chunks = []
        try:  # never blocks: a copy of the write end the answer made may still be open
            while chunk := calls["read"](read_end, 1 << 16):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        finally:
            calls["close"](read_end)
        data = b"".join(chunks)
        threads, events = {}, []
        for start in range(0, len(data) - len(data) % _EVENT.size, _EVENT.size):
            kind, item, ident = _EVENT.unpack_from(data, start)
            events.append([kind.decode("latin-1"), item,
                           threads.setdefault(ident, len(threads))])
        return events

    return note, collect


def _calls_of(events, n, what):
    """Each item's ``(start, end, thread)`` from the events (positions in the event order),
    after checking that fn ran once per item: one start, then one end on the same thread."""
    if not isinstance(events, list):
        raise AssertionError(f"{what}: the check got {describe(events)}")
    starts, ends = {}, {}
    for position, event in enumerate(events):
        if not (isinstance(event, list) and len(event) == 3 and event[0] in ("S", "E")):
            raise AssertionError(f"{what}: the record of fn's calls is damaged")
        kind, item, thread = event
        seen = starts if kind == "S" else ends
        if item in seen or not (isinstance(item, int) and 0 <= item < n):
            raise AssertionError(f"{what}: the record of fn's calls shows item {item} "
                                 f"{'started' if kind == 'S' else 'ended'} twice (or an item "
                                 "that is not in the input); each item is one call of fn")
        seen[item] = (position, thread)
    missing = [i for i in range(n) if i not in starts or i not in ends]
    if missing:
        raise AssertionError(f"{what}: fn was not called (to the end) on item(s) {missing[:5]}")
    calls = {}
    for i in range(n):
        (begin, thread), (end, end_thread) = starts[i], ends[i]
        if end < begin or end_thread != thread:
            raise AssertionError(f"{what}: the record of fn's calls is damaged (item {i})")
        calls[i] = (begin, end, thread)
    busy = {}  # thread -> the item whose call it is running
    for kind, item, thread in events:  # a thread runs one call of fn at a time
        if kind == "E":
            busy.pop(thread, None)
        elif thread in busy:
            raise AssertionError(f"{what}: the record shows item {item} starting on the "
                                 f"thread that was still running item {busy[thread]}; one "
                                 "thread runs one call of fn at a time")
        else:
            busy[thread] = item
    return calls

# ----------------------------------------------------------------------------- probes


def _pm_order_probe(parallel_map, seed):
    m, values, slow, offset = _order_inputs(seed)

    def fn(item):
        time.sleep(0.04 if item["id"] % m == slow else 0.001)  # one lane is slow
        return {"id": item["id"], "y": _transform(item["x"], offset)}

    items = [{"id": i, "x": x} for i, x in enumerate(values)]
    out = _bounded(lambda: list(parallel_map(fn, items, m)))
    return plain(out)


def _pm_edge_probe(parallel_map, seed):
    m, values, _, offset = _order_inputs(seed)
    m += 1

    def fn(x):
        return _transform(x, offset)

    return plain(_bounded(lambda: [list(parallel_map(fn, [], m)),
                                   list(parallel_map(fn, values[:m - 1], m)),
                                   list(parallel_map(fn, values[:1], 1))]))


def _recorded_map(parallel_map, work, n, m):
    """``list(parallel_map(fn, range(n), m))`` where ``fn(i)`` notes its start, runs
    ``work(i)`` and notes its end (see ``_call_record``); ``{"out", "events"}``, or the
    ``{"hung": ...}`` of ``_bounded``."""
    note, collect = _call_record()

    def fn(i):
        note(b"S", i)
        value = work(i)
        note(b"E", i)
        return value

    out = _bounded(lambda: list(parallel_map(fn, list(range(n)), m)))
    events = collect()  # the answer has returned (or hung): later calls of fn note nothing
    if isinstance(out, dict) and "hung" in out:
        return out
    return {"out": plain(out), "events": events}


def _pm_concurrency_probe(parallel_map, seed):
    m, n, delay = _concurrency_inputs(seed)

    def work(x):
        time.sleep(delay)
        return x + 1

    return _recorded_map(parallel_map, work, n, m)


def _pm_ownership_probe(parallel_map, seed):
    m, n, slow = _ownership_inputs(seed)

    def work(i):
        time.sleep(0.08 if i == slow else 0.002 + 0.001 * (i % 3))
        return i

    return _recorded_map(parallel_map, work, n, m)


def _pm_streaming_probe(parallel_map, seed):
    m, n = _streaming_inputs(seed)
    # The items read so far, counted by a C counter: the answer can reach it (through the
    # input generator's frame) and advance it, but never take it back, as it could a list.
    pulled = itertools.count()

    def source():
        for i in range(n):
            next(pulled)
            yield i

    def read(counter=pulled):  # the counter itself, held where the answer cannot reach it
        if pulled is not counter:
            raise RuntimeError("the check's count of the items read was replaced")
        return int(repr(counter)[len("count("):-1])

    def run():
        ahead, out = [], []
        for y in parallel_map(lambda x: 2 * x + 1, source(), m):
            out.append(y)
            ahead.append(read() - len(out))
            time.sleep(0.0005)
        return {"out": out, "max_ahead": max(ahead, default=0)}

    return plain(_bounded(run))


def _pm_threads_probe(parallel_map, seed):
    m, n = _streaming_inputs(seed)

    def run():
        before = threading.active_count()
        out = list(parallel_map(lambda x: x, list(range(20)), m))
        deadline = time.perf_counter() + 2.0
        extra = threading.active_count() - before
        while extra > 0 and time.perf_counter() < deadline:
            time.sleep(0.02)
            extra = threading.active_count() - before
        return {"out": out, "extra": extra}

    return plain(_bounded(run))


# ----------------------------------------------------------------------------- judges


def _pm_order_judge(raw, seed):
    m, values, slow, offset = _order_inputs(seed)
    got = _expect(_not_hung(raw, "ordered output"), list, "ordered output")
    want = [{"id": i, "y": _transform(x, offset)} for i, x in enumerate(values)]
    if len(got) != len(want):
        raise AssertionError(f"{len(values)} items with {m} workers: got {len(got)} results, "
                             f"expected {len(want)} (every item exactly once)")
    ids = [g.get("id") if isinstance(g, dict) else None for g in got]
    if sorted(i for i in ids if i is not None) == list(range(len(values))) and ids != sorted(ids):
        raise AssertionError(f"{len(values)} items with {m} workers, producer {slow}'s items "
                             f"slow: every result is there but the order is {ids[:10]}...; "
                             "results must come out in input order, not as they finish "
                             "(read the output queues round-robin)")
    if got != want:
        bad = next(k for k, (g, w) in enumerate(zip(got, want)) if g != w)
        raise AssertionError(f"result {bad} is {describe(got[bad])}, expected {want[bad]}")


def _pm_edge_judge(raw, seed):
    m, values, _, offset = _order_inputs(seed)
    m += 1
    got = _expect(_not_hung(raw, "edge cases"), list, "edge cases")
    want = [[], [_transform(x, offset) for x in values[:m - 1]], [_transform(values[0], offset)]]
    labels = ["no items", f"{m - 1} items with {m} workers", "one item, one worker"]
    for label, g, w in zip(labels, got, want, strict=True):
        if g != w:
            raise AssertionError(f"{label}: got {describe(g)}, expected {w}")


def _pm_concurrency_judge(raw, seed):
    m, n, delay = _concurrency_inputs(seed)
    got = _expect(_not_hung(raw, "concurrency"), dict, "concurrency")
    if got.get("out") != [x + 1 for x in range(n)]:
        raise AssertionError(f"{n} items with {m} workers: wrong results "
                             f"{describe(got.get('out'))}")
    _calls_of(got.get("events"), n, f"{n} items with {m} workers")
    in_flight, overlap, peak = set(), [0] * n, 0  # overlap: the most calls in flight with it
    for kind, item, _ in got["events"]:
        if kind == "E":
            in_flight.discard(item)
            continue
        in_flight.add(item)
        peak = max(peak, len(in_flight))
        for k in in_flight:
            overlap[k] = max(overlap[k], len(in_flight))
    if peak == 1:
        raise AssertionError(f"with num_workers={m}, only one call of fn ran at a time: the map "
                             "is serial (fn must run on the worker threads, not in the consumer)")
    if peak != m:
        raise AssertionError(f"with num_workers={m}, at most {peak} calls of fn ran at once; "
                             f"expected exactly {m} (one per worker, never more)")
    # Sustained, not only at the start: with equal sleeps every call of a real pool shares its
    # time with the other workers' calls (sleeping threads need no CPU, so this does not depend
    # on the machine's speed). Half the calls is a wide margin for lanes drifting apart.
    full = sum(1 for k in overlap if k == m)
    if full < n // 2:
        raise AssertionError(f"{n} calls with num_workers={m}: only {full} of them ran while "
                             f"{m} calls were in flight; the workers must keep running calls "
                             "at once until the input ends, not only for the first items")


def _pm_ownership_judge(raw, seed):
    m, n, slow = _ownership_inputs(seed)
    got = _expect(_not_hung(raw, "ownership"), dict, "ownership")
    if got.get("out") != list(range(n)):
        raise AssertionError(f"wrong or reordered results: {describe(got.get('out'))}")
    calls = _calls_of(got.get("events"), n, f"{n} items with {m} workers")
    threads = [calls[i][2] for i in range(n)]
    for r in range(m):
        lane = [threads[i] for i in range(r, n, m)]
        if len(set(lane)) != 1:
            moved = next(i for i in range(r, n, m) if threads[i] != lane[0])
            raise AssertionError(f"items {r} and {moved} both belong to producer {r} of {m} "
                                 f"(i + {m}*k) but ran on different threads, while producer "
                                 f"{slow} was busy with a slow item: a shared work queue hands "
                                 "items to whichever thread is free; give each producer its own "
                                 "input queue")
    owners = [threads[r] for r in range(m)]
    if len(set(owners)) != m:
        raise AssertionError(f"{m} producers should be {m} different threads; items 0..{m - 1} "
                             f"ran on {len(set(owners))}")


def _pm_streaming_judge(raw, seed):
    m, n = _streaming_inputs(seed)
    got = _expect(_not_hung(raw, "streaming"), dict, "streaming")
    if got.get("out") != [2 * x + 1 for x in range(n)]:
        raise AssertionError(f"a generator of {n} items: wrong results {describe(got.get('out'))}")
    bound = READ_AHEAD_PER_WORKER * m
    if got["max_ahead"] > bound:
        raise AssertionError(f"{got['max_ahead']} items were read from the input before the "
                             f"consumer took them (at most {bound} = {READ_AHEAD_PER_WORKER} x "
                             f"num_workers allowed): stream through bounded queues "
                             "(queue.Queue(maxsize=...)) instead of reading the whole input first")


def _pm_threads_judge(raw, seed):
    got = _expect(_not_hung(raw, "thread clean-up"), dict, "thread clean-up")
    if got.get("out") != list(range(20)):
        raise AssertionError(f"20 items: wrong results {describe(got.get('out'))}")
    if got["extra"] > 0:
        raise AssertionError(f"{got['extra']} thread(s) started by parallel_map were still "
                             "running 2 s after the last result: send every worker an end "
                             "marker so it returns")


# ============================================================================= 9.2 shard sampler
# ----------------------------------------------------------------------------- inputs (both sides)


def _shard_configs(seed, count=12):
    """(n, num_replicas, sampler seed, epoch); n is rarely a multiple of num_replicas, and one
    config has fewer samples than replicas."""
    rng = np.random.default_rng(9500 + seed)
    configs = []
    for k in range(count):
        replicas = int(rng.integers(2, 9))
        n = int(rng.integers(1, replicas)) if k == 0 else \
            int(rng.integers(replicas + 1, 120))
        if k > 1 and n % replicas == 0:
            n += 1
        configs.append((n, replicas, int(rng.integers(0, 10_000)), int(rng.integers(0, 5))))
    return configs


def _epoch_order(n, seed, epoch, shuffle):
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(n).tolist()
    return list(range(n))


def _reference_shard(n, replicas, rank, seed, epoch, shuffle=True, drop_last=False):
    order = _epoch_order(n, seed, epoch, shuffle)
    per_rank = n // replicas if drop_last else -(-n // replicas)
    total = per_rank * replicas
    if drop_last:
        order = order[:total]
    else:
        while len(order) < total:
            order += order[:total - len(order)]
    return order[rank::replicas]


# ----------------------------------------------------------------------------- probes


def _shards(sampler_cls, n, replicas, seed, epoch, shuffle=True, drop_last=False):
    """Every rank's (len, indices) for one configuration."""
    out = []
    for rank in range(replicas):
        sampler = sampler_cls(n, replicas, rank, seed=seed, shuffle=shuffle,
                              drop_last=drop_last)
        sampler.set_epoch(epoch)
        out.append([len(sampler), [int(i) for i in sampler]])
    return out


def _ss_equal_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e, shuffle=(k % 2 == 0))
            for k, (n, r, s, e) in enumerate(_shard_configs(seed))]


def _ss_exact_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e, shuffle=(k % 3 != 1))
            for k, (n, r, s, e) in enumerate(_shard_configs(seed + 1))]


def _ss_shared_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e) for n, r, s, e in _shard_configs(seed + 2, 6)[1:]]


def _ss_epoch_probe(ShardSampler, seed):
    n, replicas, s, _ = _shard_configs(seed + 3, 2)[1]
    n = max(n, 4 * replicas)
    sampler = ShardSampler(n, replicas, replicas - 1, seed=s, shuffle=True, drop_last=False)
    runs = []
    for epoch in (0, 1, 1, 2):
        sampler.set_epoch(epoch)
        runs.append([int(i) for i in sampler])
    again = [int(i) for i in sampler]          # iterating twice in one epoch: the same order
    other_seed = ShardSampler(n, replicas, replicas - 1, seed=s + 1, shuffle=True,
                              drop_last=False)
    other_seed.set_epoch(2)
    return {"n": n, "replicas": replicas, "runs": runs, "again": again,
            "other_seed": [int(i) for i in other_seed]}


def _ss_drop_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e, shuffle=(k % 2 == 0), drop_last=True)
            for k, (n, r, s, e) in enumerate(_shard_configs(seed + 4, 8)[1:])]


SS_BAD_CALLS = ((10, 4, 4), (10, 4, -1), (10, 0, 0))  # rank R of R, rank -1, R = 0


def _ss_errors_probe(ShardSampler):
    return [attempt(ShardSampler, *args) for args in SS_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _shard_list(raw, configs, what):
    _expect(raw, list, what)
    if len(raw) != len(configs):
        raise AssertionError(f"{what}: expected {len(configs)} configurations, got {len(raw)}")
    for got, (n, replicas, _, _) in zip(raw, configs):
        if not isinstance(got, list) or len(got) != replicas:
            raise AssertionError(f"{what}: n={n}, {replicas} replicas: the check got "
                                 f"{describe(got)}")
    return raw


def _ss_equal_judge(raw, seed):
    configs = _shard_configs(seed)
    for got, (n, replicas, _, epoch) in zip(_shard_list(raw, configs, "lengths"), configs):
        want = -(-n // replicas)
        for rank, (length, indices) in enumerate(got):
            if len(indices) != length:
                raise AssertionError(f"n={n}, {replicas} replicas, rank {rank}: len() says "
                                     f"{length} but iterating gives {len(indices)} indices")
            if length != want:
                hint = (" (dropping the tail instead of padding?)" if length == n // replicas
                        else " (every rank must get the same number: pad, do not split unevenly)")
                raise AssertionError(f"n={n}, {replicas} replicas, rank {rank}: {length} "
                                     f"indices, expected ceil(n / num_replicas) = {want}{hint}")
        seen = {i for _, indices in got for i in indices}
        if seen != set(range(n)):
            missing = sorted(set(range(n)) - seen)[:5]
            extra = sorted(seen - set(range(n)))[:5]
            raise AssertionError(f"n={n}, {replicas} replicas, epoch {epoch}: the shards "
                                 f"together miss {missing} and contain {extra} outside 0..n-1; "
                                 "their union must be the whole dataset")


def _ss_exact_judge(raw, seed):
    configs = _shard_configs(seed + 1)
    for k, (got, (n, replicas, s, epoch)) in enumerate(zip(_shard_list(raw, configs, "shards"),
                                                           configs)):
        shuffle = k % 3 != 1
        for rank, (_, indices) in enumerate(got):
            want = _reference_shard(n, replicas, rank, s, epoch, shuffle)
            if indices != want:
                raise AssertionError(
                    f"n={n}, {replicas} replicas, seed={s}, epoch {epoch}, shuffle={shuffle}, "
                    f"rank {rank}: got {indices[:8]}{'...' if len(indices) > 8 else ''}, "
                    f"expected {want[:8]}{'...' if len(want) > 8 else ''} (the epoch's order "
                    "padded by repeating its first indices, then every num_replicas-th index "
                    "starting at rank)")


def _ss_shared_judge(raw, seed):
    configs = _shard_configs(seed + 2, 6)[1:]
    for got, (n, replicas, _, epoch) in zip(_shard_list(raw, configs, "shared order"), configs):
        total = -(-n // replicas) * replicas
        padded = total - n
        counts = {}
        for _, indices in got:
            for i in indices:
                counts[i] = counts.get(i, 0) + 1
        repeats = sum(c - 1 for c in counts.values())
        if repeats > padded or len(counts) != n:
            raise AssertionError(f"n={n}, {replicas} replicas, epoch {epoch}: {repeats} indices "
                                 f"appear on more than one rank (only the {padded} padded ones "
                                 "may): every rank must draw the same permutation, from seed "
                                 "and epoch alone, not from its rank")


def _ss_epoch_judge(raw, seed):
    got = _expect(raw, dict, "epochs")
    runs, n, replicas = got["runs"], got["n"], got["replicas"]
    if runs[1] != runs[2]:
        raise AssertionError("the same epoch must give the same order (set_epoch(1) twice gave "
                             f"{runs[1][:6]}... and {runs[2][:6]}...)")
    if got["again"] != runs[3]:
        raise AssertionError("iterating the sampler twice in one epoch gave two orders")
    if runs[0] == runs[1] or runs[1] == runs[3]:
        raise AssertionError("set_epoch did not change the order: each epoch must draw a new "
                             "permutation (seed the generator with [seed, epoch])")
    if set(runs[0]) == set(runs[1]) == set(runs[3]):
        raise AssertionError(f"rank {replicas - 1} of {replicas} sees the same {len(runs[0])} "
                             f"samples of the {n} in every epoch, only reordered: shuffle the "
                             "whole dataset and then split it, not split it and shuffle each "
                             "part")
    if got["other_seed"] == runs[3]:
        raise AssertionError("a different seed gave the same order")


def _ss_drop_judge(raw, seed):
    configs = _shard_configs(seed + 4, 8)[1:]
    for k, (got, (n, replicas, s, epoch)) in enumerate(zip(_shard_list(raw, configs, "drop_last"),
                                                           configs)):
        shuffle = k % 2 == 0
        for rank, (length, indices) in enumerate(got):
            want = _reference_shard(n, replicas, rank, s, epoch, shuffle, drop_last=True)
            if length != len(want) or indices != want:
                raise AssertionError(
                    f"drop_last=True, n={n}, {replicas} replicas, rank {rank}: len {length}, "
                    f"indices {indices[:8]}; expected {len(want)} = floor(n / num_replicas) "
                    f"indices {want[:8]} (drop the tail of the epoch's order, then stride)")


def _ss_errors_judge(raw):
    expect_each_raised("ShardSampler", SS_BAD_CALLS, raw, "ValueError",
                       "rank must lie in 0..num_replicas-1 and num_replicas >= 1")


# ============================================================================= 9.3 bottleneck
# ----------------------------------------------------------------------------- inputs (both sides)

_STAGE_NAMES = ("read_record", "decode", "crop", "resize", "rotate", "flip", "normalize",
                "to_chw", "batch")


def _random_pipeline(rng, with_rates=False, with_cores=False):
    """A configured pipeline: degrees roughly follow the costs (as someone tuning by hand would
    set them), so the slowest stage is often not the one with the largest cost per item."""
    k = int(rng.integers(3, 8))
    names = [str(x) for x in rng.choice(_STAGE_NAMES, size=k, replace=False)]
    costs = {name: float(10 ** rng.uniform(-4, -2.5)) for name in names}
    cheapest = min(costs.values())
    degrees = {name: int(np.clip(round(costs[name] / cheapest * rng.uniform(0.4, 1.6)), 1, 16))
               for name in names}
    kwargs = {}
    p = min(degrees[n] / costs[n] for n in names)
    if with_rates:
        kwargs["read_rate"] = float(p * rng.uniform(0.5, 2.0))
        kwargs["consume_rate"] = float(p * rng.uniform(0.5, 2.0))
    if with_cores:
        kwargs["cores"] = int(rng.integers(1, 17))
    return costs, degrees, kwargs


def _bn_examples():
    """Hand-made cases with exact answers (seconds per item, workers)."""
    return [
        ({"decode": 0.002}, {"decode": 1}, {}),
        ({"decode": 0.002}, {"decode": 4}, {}),
        ({"decode": 0.002}, {"decode": 4}, {"read_rate": 100.0}),
        ({"decode": 0.002}, {"decode": 4}, {"read_rate": 5000.0, "consume_rate": 1500.0}),
        ({"decode": 0.004, "resize": 0.001}, {"decode": 2, "resize": 1}, {}),
    ]


_BN_EXAMPLE_ANSWERS = [("decode", 500.0), ("decode", 2000.0), ("read", 100.0),
                       ("device", 1500.0), ("decode", 500.0)]


def _bn_random(seed, count, **kinds):
    salt = 1 if kinds.get("with_rates") else 2 if kinds.get("with_cores") else 0
    rng = np.random.default_rng([9600 + salt, seed])
    return [_random_pipeline(rng, **kinds) for _ in range(count)]


def _bn_ties():
    return [
        ({"a": 0.5, "b": 0.25}, {"a": 2, "b": 1}, {}),                       # 4/s each
        ({"a": 0.25, "b": 0.5}, {"a": 1, "b": 4}, {"read_rate": 4.0}),       # read ties a
        ({"a": 0.25}, {"a": 1}, {"consume_rate": 4.0}),                      # G == P: fed
        ({"a": 0.125, "b": 0.125}, {"a": 1, "b": 1}, {"cores": 2}),          # 8/s: a, b, cpus
    ]


_BN_TIE_ANSWERS = [("a", 4.0), ("read", 4.0), ("a", 4.0), ("a", 8.0)]

# ----------------------------------------------------------------------------- probes


def _bn_call(find_bottleneck, cases):
    return [plain(find_bottleneck(dict(c), dict(d), **kw)) for c, d, kw in cases]


def _bn_examples_probe(find_bottleneck):
    return _bn_call(find_bottleneck, _bn_examples())


def _bn_stages_probe(find_bottleneck, seed):
    return _bn_call(find_bottleneck, _bn_random(seed, 30))


def _bn_rates_probe(find_bottleneck, seed):
    return _bn_call(find_bottleneck, _bn_random(seed, 30, with_rates=True))


def _bn_cores_probe(find_bottleneck, seed):
    return _bn_call(find_bottleneck, _bn_random(seed, 30, with_cores=True))


def _bn_ties_probe(find_bottleneck):
    return _bn_call(find_bottleneck, _bn_ties())


# ----------------------------------------------------------------------------- judges


def _reference_bottleneck(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    limits = []
    if read_rate is not None:
        limits.append(("read", read_rate))
    limits += [(n, degrees[n] / costs[n] if costs[n] > 0 else math.inf) for n in costs]
    total = sum(costs.values())
    if cores is not None and total > 0:
        limits.append(("cpus", cores / total))
    if consume_rate is not None:
        limits.append(("device", consume_rate))
    best = limits[0]
    for limit in limits[1:]:
        if limit[1] < best[1]:
            best = limit
    return best


def _bn_limits(costs, degrees, read_rate=None, consume_rate=None, cores=None, *, stages="all",
               read=True, cpus=True, device=True):
    """The limits in pipeline order, as ``_reference_bottleneck`` lists them, with one idea
    changed for the wrong answers: ``stages`` "all" (right), "largest cost" (only the stage of
    the largest cost per item) or "fastest" (only the stage of the highest degree / cost); and
    ``read``, ``cpus``, ``device`` False to leave that limit out."""
    rates = {n: degrees[n] / costs[n] if costs[n] > 0 else math.inf for n in costs}
    names = list(costs)
    if stages == "largest cost":
        names = [max(names, key=costs.get)]
    elif stages == "fastest":
        names = [max(names, key=rates.get)]
    limits = [("read", read_rate)] if read and read_rate is not None else []
    limits += [(n, rates[n]) for n in names]
    total = sum(costs.values())
    if cpus and cores is not None and total > 0:
        limits.append(("cpus", cores / total))
    if device and consume_rate is not None:
        limits.append(("device", consume_rate))
    return limits


def _bn_lowest(limits, last_on_ties=False):
    best = limits[0]
    for limit in limits[1:]:
        if limit[1] < best[1] or (last_on_ties and limit[1] == best[1]):
            best = limit
    return best


#: The wrong ideas a 9.3 answer is diagnosed with, each as what it answers (costs, degrees,
#: kwargs) -> (name, rate), and the hint shown when an answer's choice is that idea's and no
#: other's. tests/notebooks/test_exercises_ch09.py implements each idea and checks its hint.
_BN_MISTAKES = {
    "largest cost": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, stages="largest cost")),
        "that is the stage with the largest cost per item, but its workers share the work: a "
        "stage of d workers at c seconds per item runs at d / c items/s, and the lowest of "
        "those limits the pipeline"),
    "fastest stage": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, stages="fastest")),
        "that is the fastest stage; the lowest rate degree / cost (items per second) limits "
        "the pipeline"),
    "no read": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, read=False)),
        "the reader delivers only read_rate (F) items per second: F is a limit too"),
    "no cpus": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, cpus=False)),
        "all stages share the cores: cores / (sum of the costs) items per second is a limit "
        "too"),
    "no device": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, device=False)),
        "the device takes only consume_rate (G) items per second: G is a limit too"),
    "last on ties": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw), last_on_ties=True),
        "on a tie the earliest limit in pipeline order is the bottleneck: read, the stages in "
        "their order, cpus, device"),
}
#: The hint for a right name with the reciprocal rate.
_BN_SECONDS_HINT = "that is seconds per item; return items per second"


def _diagnose(got_name, case, want):
    """The one wrong idea whose answer to ``case`` is wrong and names ``got_name``, or None
    when no idea does, or more than one (then no hint can say which mistake it was)."""
    costs, degrees, kwargs = case
    found = []
    for mistake, (answer, _) in _BN_MISTAKES.items():
        theirs = answer(costs, degrees, kwargs)
        if theirs[0] == got_name and (theirs[0] != want[0] or theirs[1] != want[1]):
            found.append(mistake)
    return found[0] if len(found) == 1 else None


def _bn_failure(g, case, want):
    """Why answer ``g`` to ``case`` is wrong (``want`` is right), with a hint derived from the
    mistake it matches, or None when it is right. Returns (message, hinted)."""
    label = f"costs {case[0]}, degrees {case[1]}" + (f", {case[2]}" if case[2] else "")
    if not (isinstance(g, (list, tuple)) and len(g) == 2 and isinstance(g[0], str)
            and isinstance(g[1], numbers.Real) and not isinstance(g[1], bool)):
        return (f"{label}: find_bottleneck should return (name, items per second), got "
                f"{describe(g)}"), False
    if g[0] != want[0]:
        mistake = _diagnose(g[0], case, want)
        hint = f" — {_BN_MISTAKES[mistake][1]}" if mistake else ""
        return (f"{label}: the bottleneck is {want[0]!r} at {want[1]:.6g} items/s, you said "
                f"{g[0]!r}{hint}"), bool(hint)
    if not math.isclose(float(g[1]), want[1], rel_tol=1e-9):
        hint = ""
        if want[1] > 0 and math.isclose(float(g[1]), 1.0 / want[1], rel_tol=1e-6):
            hint = f" ({_BN_SECONDS_HINT})"
        return (f"{label}: {want[0]!r} runs at {want[1]:.6g} items/s, you said "
                f"{float(g[1]):.6g}{hint}"), bool(hint)
    return None


def _bn_judge_list(raw, cases, what, answers=None):
    """Fail on the first wrong answer whose mistake can be named (a hint), else on the first
    wrong answer."""
    got = _expect(raw, list, what)
    if len(got) != len(cases):
        raise AssertionError(f"{what}: expected {len(cases)} answers, got {len(got)}")
    first = None
    for k, (g, case) in enumerate(zip(got, cases)):
        want = answers[k] if answers is not None else _reference_bottleneck(
            case[0], case[1], **case[2])
        failure = _bn_failure(g, case, want)
        if failure is None:
            continue
        message, hinted = failure
        if hinted:
            raise AssertionError(message)
        first = first or message
    if first:
        raise AssertionError(first)


def _bn_examples_judge(raw):
    _bn_judge_list(raw, _bn_examples(), "worked examples", _BN_EXAMPLE_ANSWERS)


def _bn_stages_judge(raw, seed):
    _bn_judge_list(raw, _bn_random(seed, 30), "random pipelines")


def _bn_rates_judge(raw, seed):
    _bn_judge_list(raw, _bn_random(seed, 30, with_rates=True), "with read and consume rates")


def _bn_cores_judge(raw, seed):
    _bn_judge_list(raw, _bn_random(seed, 30, with_cores=True), "with shared cores")


def _bn_ties_judge(raw):
    _bn_judge_list(raw, _bn_ties(), "ties", _BN_TIE_ANSWERS)


# ============================================================================= registry

register(
    # 9.1. A wrong idea that still returns the right multiset fails because: an unordered pool
    # (one shared queue, results as they finish) reorders the results when one producer's items
    # are slow; a serial map (fn called in the consumer, or one worker) is seen by the peak
    # number of calls in flight, and one that runs only its first num_workers calls at once by
    # how few calls overlapped num_workers - 1 others (recorded by the probe: no wall-time
    # bound); a thread per item exceeds num_workers calls at once; a shared work queue or
    # concurrent.futures' map keeps the order but lets a free thread take a busy producer's
    # items (ownership case); reading the whole input first (list(items), submitting every
    # item to an executor) breaks the read-ahead bound; workers without an end marker are
    # still alive after the last result. A serial map that rewrites the record of fn's calls
    # once the items are done (H6: the record sat in dicts fn closes over) fails the
    # concurrency and ownership cases: fn writes each call's start and end, with its thread,
    # to an OS pipe as they happen (``_call_record``), so what happened cannot be taken back;
    # a made-up record written beside the real one shows each item called twice, and one
    # opened with the probe's own noting on one thread shows a thread in two calls at once.
    # Reading the whole input first and rewriting the probe's count of the items read before
    # each result fails the streaming case: that count is an itertools.count, which can only
    # go up.
    Exercise(
        id="9.1",
        title="An order-preserving parallel map",
        target="parallel_map",
        task="the order-preserving parallel map",
        forbidden=(
            "mlsys_lab.data.pipeline.pipeline:Pipeline",
            "mlsys_lab.data.pipeline.ops:MapNode",
            "mlsys_lab.data.pipeline.pools:Pool",
            "mlsys_lab.data.pipeline.pools:ThreadPool",
            "mlsys_lab.data.pipeline.pools:ProcessPool",
            "mlsys_lab.data.pipeline.ops:inline_map",
            "mlsys_lab.data.pipeline.ops:prefetch",
            "mlsys_lab.data.loader.dataloader:DataLoader",
        ),
        cases=(
            Case("results in input order although one producer is slow", 2,
                 feedback="read the producers' output queues round-robin",
                 probe=_pm_order_probe, judge=_pm_order_judge),
            Case("no items; fewer items than workers", 1,
                 feedback="every worker must see the end of the input",
                 probe=_pm_edge_probe, judge=_pm_edge_judge),
            Case("num_workers calls run at once, never more", 2,
                 feedback="call fn on num_workers worker threads",
                 probe=_pm_concurrency_probe, judge=_pm_concurrency_judge),
            Case("producer i owns items i + M*k", 2,
                 feedback="item n goes to producer n % M's own input queue",
                 probe=_pm_ownership_probe, judge=_pm_ownership_judge),
            Case(f"streams: at most {READ_AHEAD_PER_WORKER} x num_workers items read ahead", 1,
                 feedback="bounded queues between the reader, the producers and the consumer",
                 probe=_pm_streaming_probe, judge=_pm_streaming_judge),
            Case("the worker threads finish after the last item", 1,
                 feedback="send each worker an end marker",
                 probe=_pm_threads_probe, judge=_pm_threads_judge),
        ),
    ),
    # 9.2. A wrong idea that still gives plausible shards fails because: contiguous blocks of
    # the permutation, or of 0..n-1, differ from the strided shards (exact case) and a fixed
    # block per rank keeps the same samples every epoch (epoch case); seeding each rank's
    # permutation with its rank makes shards overlap (shared-order case); dropping the tail
    # instead of padding gives floor(n / R) indices and loses samples (lengths case); padding
    # with 0, -1 or random indices instead of the first indices of the order fails the exact
    # case; uneven shards (the first n % R ranks one longer) fail the lengths case; ignoring
    # set_epoch repeats the order (epoch case); drop_last that pads or cuts from the front fails
    # the drop_last case.
    Exercise(
        id="9.2",
        title="A shard-aware sampler",
        target="ShardSampler",
        task="the shard-aware sampler",
        forbidden=(
            "mlsys_lab.data.loader.sampler:DistributedSampler",
            "mlsys_lab.data.pipeline.ops:ShardNode",
            "mlsys_lab.data.records:read_shard",
        ),
        cases=(
            Case("every rank gets ceil(n / R) indices; together all of 0..n-1", 2,
                 feedback="pad the order to a multiple of num_replicas",
                 probe=_ss_equal_probe, judge=_ss_equal_judge),
            Case("padding repeats the first indices; rank r takes order[r::R]", 2,
                 feedback="pad by repetition, then stride",
                 probe=_ss_exact_probe, judge=_ss_exact_judge),
            Case("all ranks split one permutation: shards overlap only in the padding", 1,
                 feedback="seed the permutation with seed and epoch only",
                 probe=_ss_shared_probe, judge=_ss_shared_judge),
            Case("set_epoch reshuffles the whole dataset; the same epoch repeats", 1,
                 feedback="default_rng([seed, epoch]).permutation(n)",
                 probe=_ss_epoch_probe, judge=_ss_epoch_judge),
            Case("drop_last cuts the tail: floor(n / R) each", 1,
                 feedback="drop the tail instead of padding",
                 probe=_ss_drop_probe, judge=_ss_drop_judge),
            Case("a rank outside 0..R-1 or R < 1 raises ValueError", 1,
                 feedback="check the arguments", probe=_ss_errors_probe,
                 judge=_ss_errors_judge),
        ),
    ),
    # 9.3. A wrong idea that still names a stage fails because: the stage with the largest cost
    # per item ignores its degree (random pipelines, where degrees differ); cost / degree or
    # cost x degree as the "rate" picks the fastest stage; 1 / sum(costs) is a serial pipeline;
    # ignoring F or G misses the read and device cases; ignoring the shared CPUs misses the
    # cores case; returning seconds per item instead of items per second fails every rate;
    # ties resolved to the last stage fail the tie case.
    Exercise(
        id="9.3",
        title="Find the bottleneck from measured stage costs",
        target="find_bottleneck",
        task="the bottleneck finder",
        forbidden=(
            "mlsys_lab.data.pipeline.sim",
            "mlsys_lab.data.pipeline.autotune",
            "mlsys_lab.data.pipeline.report:Report",
        ),
        cases=(
            Case("worked examples: one and two stages, F and G", 1,
                 feedback="degree / cost items per second; F and G are rates too",
                 probe=_bn_examples_probe, judge=_bn_examples_judge),
            Case("30 random pipelines: the lowest degree / cost", 2,
                 feedback="the stage with the lowest degree / cost",
                 probe=_bn_stages_probe, judge=_bn_stages_judge),
            Case("with F and G: the device is the bottleneck iff G < min(F, P)", 1,
                 feedback="compare F, every stage and G",
                 probe=_bn_rates_probe, judge=_bn_rates_judge),
            Case("with shared cores: cores / sum of costs caps the rate", 1,
                 feedback="all stages share the CPUs",
                 probe=_bn_cores_probe, judge=_bn_cores_judge),
            Case("ties go to the earliest limit in pipeline order", 1,
                 feedback="read, the stages in order, cpus, device",
                 probe=_bn_ties_probe, judge=_bn_ties_judge),
        ),
    ),
)
