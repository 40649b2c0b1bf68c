"""Exercise 9.1: an order-preserving parallel map.

A parallel map on threads in which producer ``i`` of ``M`` owns items ``i + M*k``: outputs in
input order although later items finish first, ``M`` calls running at once (not fewer, not
more), the ownership itself read from the threads that ran each item (a record of fn's calls
written to an OS pipe as they happen, out of the answer's reach), a bounded read-ahead and
threads that finish. The probes run the answer on a helper thread with a time limit, so an
answer that deadlocks fails its case instead of hanging the check.

Wrong ideas rejected (a wrong idea that still returns the right multiset): an unordered pool
(one shared queue, results as they finish) reorders the results when one producer's items are
slow; a serial map (fn called in the consumer, or one worker) is seen by the peak number of
calls in flight, and one that runs only its first num_workers calls at once by how few calls
overlapped num_workers - 1 others (recorded by the probe: no wall-time bound); a thread per item
exceeds num_workers calls at once; a shared work queue or concurrent.futures' map keeps the
order but lets a free thread take a busy producer's items (ownership case); reading the whole
input first (``list(items)``, submitting every item to an executor) breaks the read-ahead bound;
workers without an end marker are still alive after the last result. A serial map that rewrites
the record of fn's calls once the items are done (H6: the record sat in dicts fn closes over)
fails the concurrency and ownership cases: fn writes each call's start and end, with its thread,
to an OS pipe as they happen (``_call_record``), so what happened cannot be taken back; a
made-up record written beside the real one shows each item called twice, and one opened with
the probe's own noting on one thread shows a thread in two calls at once. Reading the whole
input first and rewriting the probe's count of the items read before each result fails the
streaming case: that count is an ``itertools.count``, which can only go up.
"""

import itertools
import os
import struct
import sys
import threading
import time

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, plain, register
from mlsys_lab.grading.exercises.ch09_data_processing.common import expect_type

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
        items = source()
        try:
            for y in parallel_map(lambda x: 2 * x + 1, items, m):
                out.append(y)
                ahead.append(read() - len(out))
                time.sleep(0.0005)
        finally:
            # An answer that stops reading early leaves the input suspended; closed later by
            # the collector, it would resume inside another exercise's check, where this
            # function is a forbidden reference.
            try:
                items.close()
            except ValueError:  # still being read by a thread of the answer's
                pass
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
    got = expect_type(_not_hung(raw, "ordered output"), list, "ordered output")
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
    got = expect_type(_not_hung(raw, "edge cases"), list, "edge cases")
    want = [[], [_transform(x, offset) for x in values[:m - 1]], [_transform(values[0], offset)]]
    labels = ["no items", f"{m - 1} items with {m} workers", "one item, one worker"]
    for label, g, w in zip(labels, got, want, strict=True):
        if g != w:
            raise AssertionError(f"{label}: got {describe(g)}, expected {w}")


def _pm_concurrency_judge(raw, seed):
    m, n, delay = _concurrency_inputs(seed)
    got = expect_type(_not_hung(raw, "concurrency"), dict, "concurrency")
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
    got = expect_type(_not_hung(raw, "ownership"), dict, "ownership")
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
    got = expect_type(_not_hung(raw, "streaming"), dict, "streaming")
    if got.get("out") != [2 * x + 1 for x in range(n)]:
        raise AssertionError(f"a generator of {n} items: wrong results {describe(got.get('out'))}")
    bound = READ_AHEAD_PER_WORKER * m
    if got["max_ahead"] > bound:
        raise AssertionError(f"{got['max_ahead']} items were read from the input before the "
                             f"consumer took them (at most {bound} = {READ_AHEAD_PER_WORKER} x "
                             f"num_workers allowed): stream through bounded queues "
                             "(queue.Queue(maxsize=...)) instead of reading the whole input first")


def _pm_threads_judge(raw, seed):
    got = expect_type(_not_hung(raw, "thread clean-up"), dict, "thread clean-up")
    if got.get("out") != list(range(20)):
        raise AssertionError(f"20 items: wrong results {describe(got.get('out'))}")
    if got["extra"] > 0:
        raise AssertionError(f"{got['extra']} thread(s) started by parallel_map were still "
                             "running 2 s after the last result: send every worker an end "
                             "marker so it returns")


register(
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
)
