"""A tf.data / MindSpore-style data pipeline: an immutable chain of operator nodes.

    pipe = (Pipeline.from_records(paths)
            .map(Decode(), field="image", num_parallel=3)
            .map(Resize(32), field="image", num_parallel=2)
            .filter(lambda r: r["label"] < 5, reads="label")
            .batch(64).prefetch(2))
    for batch in pipe: ...
    report = pipe.profile(200)          # items/s, busy and waiting per operator, a timeline

Every method returns a new ``Pipeline``; nodes are never changed, so passes
(``pipeline_passes``) can rewrite a graph and leave the original intact.

Execution. Iterating opens the chain from the source to the sink as generators. A map with
``num_parallel=None`` (the default) runs inline in the thread that pulls from it; with
``num_parallel=k`` it runs on ``k`` worker threads (or forked processes, ``executor="process"``)
fed by a dispatcher thread. With ``deterministic=True`` (the default) producer ``i`` of ``M``
owns items ``i + M*k``: the dispatcher sends item ``n`` to producer ``n % M``'s input queue,
each producer writes to its own output queue, and the consumer reads those queues round-robin,
so results come out in input order. With ``deterministic=False`` all producers share one input
and one output queue and results come out as they finish. Every blocking wait polls, so closing
(an early ``break``, an exception, ``take``) stops and joins every thread and process.

A user function that raises surfaces as ``PipelineError`` naming the operator and the index of
the item in that operator's input, with the original exception as ``__cause__``.

Randomness. ``map(fn, seed=s)`` calls ``fn(item, rng)`` with ``rng`` derived from ``(s, epoch,
item index)``: the same for every thread count, ordering and vectorisation.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import os
import pickle  # only to hand items to worker processes, never for files
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, MLSysError
from .autotune import AUTOTUNE, choose_degrees

__all__ = ["Pipeline", "PipelineError", "PipelineTimeout", "AUTOTUNE", "Report",
           "StageReport", "Event", "collate", "with_degrees", "measure_costs", "autotune"]

CPU_COUNT = os.cpu_count() or 1
POLL_SECONDS = 0.02
JOIN_SECONDS = 5.0   # waiting for workers to finish their current item on a normal close
HASTY_JOIN_SECONDS = 0.2  # ... when an error is already on its way to the caller
_now = time.perf_counter


class PipelineError(MLSysError, RuntimeError):
    """An operator's function failed; ``.op`` and ``.index`` say which operator and item."""

    def __init__(self, message, op=None, index=None):
        super().__init__(message)
        self.op, self.index = op, index


class PipelineTimeout(MLSysError, TimeoutError):
    """No item arrived from a parallel operator within the iteration's ``timeout``."""


# ---------------------------------------------------------------------------------------------
# Collation and item helpers.

def collate(items: Sequence):
    """Stack a list of items into a batch: arrays → ``np.stack``, numbers → an array, dicts
    and tuples field by field (lists are treated as tuples), anything else (bytes, str) → a list.
    """
    first = items[0]
    if isinstance(first, np.ndarray):
        return np.stack(items)
    if isinstance(first, (bool, int, float, np.number)):
        return np.asarray(items)
    if isinstance(first, Mapping):
        return {key: collate([item[key] for item in items]) for key in first}
    if isinstance(first, (tuple, list)):
        return tuple(collate(list(field)) for field in zip(*items))
    return list(items)


def _batch_len(batch) -> int:
    if isinstance(batch, Mapping):
        return _batch_len(next(iter(batch.values())))
    if isinstance(batch, tuple):
        return _batch_len(batch[0])
    return len(batch)


def _item_rng(seed: int, epoch: tuple, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, *epoch, index])


class _OnField:
    """Apply ``fn`` to one field of a dict/tuple item (or of a collated batch)."""

    def __init__(self, fn: Callable, field):
        self.fn, self.field = fn, field
        self.__name__ = f"{getattr(fn, '__name__', type(fn).__name__)}[{field!r}]"

    def __call__(self, item, *rng):
        if isinstance(item, Mapping):
            if self.field not in item:
                raise KeyError(f"item has no field {self.field!r} (fields: {list(item)})")
            return {**item, self.field: self.fn(item[self.field], *rng)}
        if isinstance(item, (tuple, list)):
            fields = list(item)
            fields[self.field] = self.fn(fields[self.field], *rng)
            return type(item)(fields) if isinstance(item, list) else tuple(fields)
        raise TypeError(f"field={self.field!r} needs dict or tuple items, got "
                        f"{type(item).__name__}")


@dataclass(frozen=True, eq=False)
class MapStep:
    """One user function of a map node (fusion puts several in one node).

    Attributes:
        fn: ``fn(item)``, or ``fn(item, rng)`` when ``seed`` is set.
        batched_fn: The same function over a collated batch (``batched_fn(batch[, rngs])``).
        seed: Seed of the per-item generator, or None.
        changes: Fields the step may change (None: unknown, i.e. anything).
        preserves: Fields it declares unchanged (None: unknown).
        name: For reports.
    """

    fn: Callable
    batched_fn: Callable | None
    seed: int | None
    changes: frozenset | None
    preserves: frozenset | None
    name: str

    def apply(self, item, epoch: tuple, index: int):
        if self.seed is None:
            return self.fn(item)
        return self.fn(item, _item_rng(self.seed, epoch, index))

    def apply_batch(self, batch, epoch: tuple, first: int):
        if self.seed is None:
            return self.batched_fn(batch)
        count = _batch_len(batch)
        return self.batched_fn(batch, [_item_rng(self.seed, epoch, first + j)
                                       for j in range(count)])

    def keeps(self, fields: frozenset) -> bool:
        """Whether this step provably leaves ``fields`` unchanged (and ignores item order)."""
        if self.seed is not None:
            return False
        if self.preserves is not None and fields <= self.preserves:
            return True
        return self.changes is not None and not fields & self.changes


# ---------------------------------------------------------------------------------------------
# Run-time context: stop flag, timeout, recorder.

@dataclass(frozen=True)
class Event:
    """One piece of work: ``stage``'s ``worker`` processed ``item`` from ``start`` to ``end``
    (seconds since the run began)."""

    stage: str
    worker: int
    item: int
    start: float
    end: float


class _Recorder:
    def __init__(self):
        self.origin = _now()
        self.events: list[Event] = []
        self.busy: dict = {}
        self.wait: dict = {}
        self.items: dict = {}

    def work(self, stage, worker, item, start, end):
        key = (stage, worker)  # each key is written by one thread only
        self.busy[key] = self.busy.get(key, 0.0) + (end - start)
        self.items[key] = self.items.get(key, 0) + 1
        self.events.append(Event(stage, worker, item, start - self.origin, end - self.origin))

    def waited(self, stage, worker, seconds):
        key = (stage, worker)
        self.wait[key] = self.wait.get(key, 0.0) + seconds


class _Context:
    def __init__(self, recorder: _Recorder | None, timeout: float | None):
        self.closing = threading.Event()
        self.recorder = recorder
        self.timeout = timeout

    def work(self, stage, worker, item, start, end):
        if self.recorder is not None:
            self.recorder.work(stage, worker, item, start, end)

    def waited(self, stage, worker, seconds):
        if self.recorder is not None:
            self.recorder.waited(stage, worker, seconds)


def _pulled(upstream, ctx: _Context, stage: str):
    """``upstream``, with the time spent waiting for each item recorded when profiling."""
    if ctx.recorder is None:
        return upstream
    return _timed_pull(upstream, ctx, stage)


def _timed_pull(upstream, ctx, stage):
    while True:
        start = _now()
        try:
            item = next(upstream)
        except StopIteration:
            return
        ctx.waited(stage, 0, _now() - start)
        yield item


def _op_error(node, index, exc) -> PipelineError:
    per_batch = node.kind == "batch" or getattr(node, "batch_size", None) is not None
    what = "batch" if per_batch else "item"
    return PipelineError(f"{node.kind} operator {node.name!r} failed on {what} {index}: "
                         f"{type(exc).__name__}: {exc}", op=node.name, index=index)


# ---------------------------------------------------------------------------------------------
# Nodes.

@dataclass(frozen=True, eq=False)
class Node:
    """Base of the operator nodes; ``input`` is the upstream node (None for a source)."""

    input: Node | None
    name: str
    kind = "node"

    @property
    def degree(self) -> int:
        return 1

    def describe(self) -> str:
        return self.name

    def iterate(self, ctx: _Context, epoch: tuple) -> Iterator:
        raise NotImplementedError


class _Once:
    """Lets a one-shot iterator be opened once, with a clear error the second time."""

    def __init__(self, iterator):
        self.iterator, self.used = iterator, False

    def __call__(self):
        if self.used:
            raise ArgumentError("Pipeline.from_iterable was given an iterator, which can be "
                                "read only once; pass a list or a zero-argument callable that "
                                "returns a fresh iterator")
        self.used = True
        return self.iterator


@dataclass(frozen=True, eq=False)
class SourceNode(Node):
    """Where items come from: ``open()`` returns a fresh iterator for each pass."""

    open: Callable[[], Iterable] = None
    length: int | None = None
    kind = "source"

    def iterate(self, ctx, epoch):
        iterator = iter(self.open())
        for n in itertools.count():
            start = _now()
            try:
                item = next(iterator)
            except StopIteration:
                return
            except MLSysError:
                raise
            except Exception as exc:
                raise _op_error(self, n, exc) from exc
            ctx.work(self.name, 0, n, start, _now())
            yield item


@dataclass(frozen=True, eq=False)
class MapNode(Node):
    """Apply ``steps`` to every item (to every batch when ``batch_size`` is set)."""

    steps: tuple = ()
    num_parallel: object = None
    deterministic: bool = True
    executor: str = "thread"
    batch_size: int | None = None
    kind = "map"

    @property
    def degree(self) -> int:
        return self.num_parallel if isinstance(self.num_parallel, int) else 1

    def describe(self):
        parts = [] if self.num_parallel is None else [f"x{self.num_parallel}"]
        if self.num_parallel is not None and not self.deterministic:
            parts.append("unordered")
        if self.num_parallel is not None and self.executor == "process":
            parts.append("processes")
        if self.batch_size is not None:
            parts.append(f"per batch of {self.batch_size}")
        return self.name + (f"({', '.join(parts)})" if parts else "")

    def apply(self, item, epoch, index):
        for step in self.steps:
            if self.batch_size is None:
                item = step.apply(item, epoch, index)
            else:
                item = step.apply_batch(item, epoch, index * self.batch_size)
        return item

    def iterate(self, ctx, epoch):
        if self.num_parallel is AUTOTUNE:
            raise ArgumentError(f"map {self.name!r}: AUTOTUNE was not resolved")
        upstream = self.input.iterate(ctx, epoch)
        if self.num_parallel is None:
            return _inline_map(self, ctx, epoch, upstream)
        runner = _ProcessPool if self.executor == "process" else _ThreadPool
        return runner(self, ctx, epoch, upstream).results()


def _inline_map(node: MapNode, ctx, epoch, upstream):
    try:
        for n in itertools.count():
            start = _now()
            try:
                item = next(upstream)
            except StopIteration:
                return
            begin = _now()
            try:
                out = node.apply(item, epoch, n)
            except Exception as exc:
                raise _op_error(node, n, exc) from exc
            ctx.waited(node.name, 0, begin - start)
            ctx.work(node.name, 0, n, begin, _now())
            yield out
    finally:
        upstream.close()


@dataclass(frozen=True, eq=False)
class FilterNode(Node):
    """Keep the items for which ``pred`` is true; ``reads``: the fields ``pred`` looks at."""

    pred: Callable = None
    reads: frozenset | None = None
    kind = "filter"

    def iterate(self, ctx, epoch):
        upstream = self.input.iterate(ctx, epoch)
        try:
            for n, item in enumerate(_pulled(upstream, ctx, self.name)):
                start = _now()
                try:
                    keep = bool(self.pred(item))
                except Exception as exc:
                    raise _op_error(self, n, exc) from exc
                ctx.work(self.name, 0, n, start, _now())
                if keep:
                    yield item
        finally:
            upstream.close()


@dataclass(frozen=True, eq=False)
class ShuffleNode(Node):
    """A shuffle buffer of ``buffer`` items, seeded by ``(seed, epoch)``."""

    buffer: int = 1
    seed: int | None = None
    kind = "shuffle"

    def describe(self):
        return f"{self.name}({self.buffer})"

    def iterate(self, ctx, epoch):
        rng = np.random.default_rng(None if self.seed is None else [self.seed, *epoch])
        upstream = self.input.iterate(ctx, epoch)
        pool = []
        try:
            for item in upstream:
                if len(pool) < self.buffer:
                    pool.append(item)
                    continue
                j = int(rng.integers(len(pool)))
                yield pool[j]
                pool[j] = item
            for j in rng.permutation(len(pool)):
                yield pool[j]
        finally:
            upstream.close()


@dataclass(frozen=True, eq=False)
class BatchNode(Node):
    """Group ``size`` items and collate them (``collate_fn`` None: ``collate``)."""

    size: int = 1
    drop_remainder: bool = False
    collate_fn: Callable | None = None
    kind = "batch"

    def describe(self):
        return f"{self.name}({self.size}{', drop_remainder' if self.drop_remainder else ''})"

    def iterate(self, ctx, epoch):
        upstream = self.input.iterate(ctx, epoch)
        collate_fn = self.collate_fn or collate
        pulled = _pulled(upstream, ctx, self.name)
        try:
            for k in itertools.count():
                chunk = list(itertools.islice(pulled, self.size))
                if not chunk or (len(chunk) < self.size and self.drop_remainder):
                    return
                start = _now()
                try:
                    batch = collate_fn(chunk)
                except Exception as exc:
                    raise _op_error(self, k, exc) from exc
                ctx.work(self.name, 0, k, start, _now())
                yield batch
        finally:
            upstream.close()


@dataclass(frozen=True, eq=False)
class PrefetchNode(Node):
    """Read ahead up to ``size`` items on a background thread."""

    size: int = 1
    kind = "prefetch"

    def describe(self):
        return f"{self.name}({self.size})"

    def iterate(self, ctx, epoch):
        return _prefetch(self, ctx, self.input.iterate(ctx, epoch))


def _prefetch(node, ctx, upstream):
    buffer = queue.Queue(maxsize=node.size)
    stop = threading.Event()

    def fill():
        try:
            for item in upstream:
                if not _put(buffer, (_OK, item), stop, ctx):
                    return
            _put(buffer, (_END, None), stop, ctx)
        except BaseException as exc:  # handed to the consumer, raised there
            _put(buffer, (_UPSTREAM_ERROR, exc), stop, ctx)

    thread = threading.Thread(target=fill, name=f"prefetch:{node.name}", daemon=True)
    thread.start()
    patience = JOIN_SECONDS
    try:
        while True:
            status, value = _get(buffer, ctx, node, lambda: None)
            if status == _END:
                return
            if status == _UPSTREAM_ERROR:
                raise value
            yield value
    except GeneratorExit:
        raise
    except BaseException:
        patience = HASTY_JOIN_SECONDS
        raise
    finally:
        stop.set()
        thread.join(patience)
        if not thread.is_alive():
            upstream.close()


class _CacheStore:
    def __init__(self):
        self.items = None
        self.lock = threading.Lock()


@dataclass(frozen=True, eq=False)
class CacheNode(Node):
    """Keep the items of the first complete pass in memory and replay them afterwards."""

    store: _CacheStore = None
    kind = "cache"

    def iterate(self, ctx, epoch):
        if self.store.items is not None:
            yield from self.store.items
            return
        filled = []
        upstream = self.input.iterate(ctx, epoch)
        try:
            for item in upstream:
                filled.append(item)
                yield item
        finally:
            upstream.close()
        with self.store.lock:
            if self.store.items is None:
                self.store.items = filled


@dataclass(frozen=True, eq=False)
class RepeatNode(Node):
    """Re-open the upstream ``count`` times (None: forever; stops if a pass is empty)."""

    count: int | None = None
    kind = "repeat"

    def describe(self):
        return f"{self.name}({'' if self.count is None else self.count})"

    def iterate(self, ctx, epoch):
        for r in (itertools.count() if self.count is None else range(self.count)):
            produced = 0
            upstream = self.input.iterate(ctx, (*epoch, r))
            try:
                for item in upstream:
                    produced += 1
                    yield item
            finally:
                upstream.close()
            if not produced:
                return


@dataclass(frozen=True, eq=False)
class ShardNode(Node):
    """Keep items whose position ``n`` has ``n % num_shards == index``."""

    num_shards: int = 1
    index: int = 0
    kind = "shard"

    def describe(self):
        return f"{self.name}({self.num_shards}, {self.index})"

    def iterate(self, ctx, epoch):
        upstream = self.input.iterate(ctx, epoch)
        try:
            for n, item in enumerate(upstream):
                if n % self.num_shards == self.index:
                    yield item
        finally:
            upstream.close()


@dataclass(frozen=True, eq=False)
class TakeNode(Node):
    """The first ``count`` items, then close the upstream."""

    count: int = 0
    kind = "take"

    def describe(self):
        return f"{self.name}({self.count})"

    def iterate(self, ctx, epoch):
        if self.count == 0:
            return
        upstream = self.input.iterate(ctx, epoch)
        try:
            for n, item in enumerate(upstream):
                yield item
                if n + 1 >= self.count:
                    return
        finally:
            upstream.close()


# ---------------------------------------------------------------------------------------------
# Parallel map: worker threads or forked processes, ordered by ownership or as ready.

_OK, _ERROR, _UPSTREAM_ERROR, _END = 0, 1, 2, 3
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_STOPPED = (None, None, None)


def _put(q, message, stop, ctx) -> bool:
    while True:
        try:
            q.put(message, timeout=POLL_SECONDS)
            return True
        except queue.Full:
            if stop.is_set() or ctx.closing.is_set():
                return False


def _get(q, ctx, node, check_alive):
    """Wait for a message (the consumer side): honours ``ctx.timeout`` and dead workers."""
    waited = 0.0
    while True:
        try:
            return q.get(timeout=POLL_SECONDS)
        except queue.Empty:
            waited += POLL_SECONDS
            check_alive()
            if ctx.timeout is not None and waited >= ctx.timeout:
                raise PipelineTimeout(f"{node.kind} operator {node.name!r}: no item within "
                                      f"{ctx.timeout} s") from None


def _worker_get(q, stop, ctx):
    while True:
        try:
            return q.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if stop.is_set() or ctx.closing.is_set():
                return _STOPPED


class _Pool:
    """Shared logic of the thread and process pools: dispatcher, queues, ordered reading.

    Ordered: lane ``i`` (input and output queue) belongs to producer ``i``, and item ``n``
    travels in lane ``n % M``. Unordered: one lane shared by every producer.
    """

    def __init__(self, node: MapNode, ctx: _Context, epoch: tuple, upstream):
        self.node, self.ctx, self.epoch, self.upstream = node, ctx, epoch, upstream
        self.degree = node.num_parallel
        self.ordered = node.deterministic
        lanes = self.degree if self.ordered else 1
        depth = 2 if self.ordered else 2 * self.degree
        self.inputs = [self.make_queue(depth) for _ in range(lanes)]
        self.outputs = [self.make_queue(depth) for _ in range(lanes)]
        self.stop = threading.Event()
        self.workers = []
        self.upstream_error = None
        self.dispatcher = threading.Thread(target=self.dispatch, daemon=True,
                                           name=f"dispatch:{node.name}")

    def lane(self, n: int) -> int:
        return n % len(self.inputs)

    def dispatch(self):
        n = 0
        try:
            for item in self.upstream:
                item = self.pack(n, item)
                if not _put(self.inputs[self.lane(n)], (n, _OK, item), self.stop, self.ctx):
                    return
                n += 1
        except BaseException as exc:  # raised by the consumer, in order, at position n
            self.upstream_error = exc
            _put(self.inputs[self.lane(n)], (n, _UPSTREAM_ERROR, None), self.stop, self.ctx)
            return
        for w in range(self.degree):
            if not _put(self.inputs[self.lane(n + w)], (n + w, _END, None), self.stop, self.ctx):
                return

    def results(self):
        self.start_workers()
        self.dispatcher.start()
        ended, k, failed = 0, 0, False
        try:
            while True:
                lane = self.lane(k)
                n, status, value = _get(self.outputs[lane], self.ctx, self.node,
                                        lambda lane=lane: self.check_alive(lane))
                if status == _END:
                    ended += 1
                    if self.ordered or ended == self.degree:
                        return
                    continue
                if status == _UPSTREAM_ERROR:
                    raise self.upstream_error
                if status == _ERROR:
                    raise self.worker_error(n, value)
                yield self.unwrap(n, value)
                k += 1
        except GeneratorExit:
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self.shutdown(HASTY_JOIN_SECONDS if failed else JOIN_SECONDS)

    def shutdown(self, patience: float):
        """Stop the dispatcher and workers; a worker still inside the user's function is
        left to finish that item (it exits by itself: it checks ``stop`` before the next)."""
        self.stop.set()
        deadline = _now() + patience
        self.stop_workers(deadline)
        self.dispatcher.join(max(0.0, deadline - _now()))
        if not self.dispatcher.is_alive():
            self.upstream.close()


class _ThreadPool(_Pool):
    make_queue = staticmethod(lambda depth: queue.Queue(maxsize=depth))

    def start_workers(self):
        self.workers = [threading.Thread(target=self.work, args=(w,), daemon=True,
                                         name=f"{self.node.name}:{w}")
                        for w in range(self.degree)]
        for thread in self.workers:
            thread.start()

    def work(self, w: int):
        lane = w if self.ordered else 0
        node, ctx = self.node, self.ctx
        while not self.stop.is_set():
            start = _now()
            n, status, item = _worker_get(self.inputs[lane], self.stop, ctx)
            if n is None:
                return
            begin = end = _now()
            ctx.waited(node.name, w, begin - start)
            if status == _OK:
                try:
                    item = node.apply(item, self.epoch, n)
                except Exception as exc:
                    item, status = exc, _ERROR
                end = _now()
                ctx.work(node.name, w, n, begin, end)
            if not _put(self.outputs[lane], (n, status, item), self.stop, ctx):
                return
            ctx.waited(node.name, w, _now() - end)
            if status != _OK:
                return

    @staticmethod
    def pack(n, item):
        return item

    @staticmethod
    def unwrap(n, value):
        return value

    def worker_error(self, n, exc):
        error = _op_error(self.node, n, exc)
        error.__cause__ = exc
        return error

    def check_alive(self, lane):
        pass

    def stop_workers(self, deadline):
        for thread in self.workers:
            thread.join(max(0.0, deadline - _now()))


def _process_worker(node, epoch, w, inbox, outbox, parent):
    """Body of a forked worker: results and timings go back through ``outbox``."""
    while True:
        start = _now()
        try:
            n, status, item = inbox.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent:  # the parent died: do not linger
                return
            continue
        begin = _now()
        if status == _OK:
            try:
                result = node.apply(pickle.loads(item), epoch, n)
            except Exception as exc:
                status, item = _ERROR, (type(exc).__name__, str(exc), traceback.format_exc())
            else:
                try:  # pickled here, not in the queue's feeder thread, so failures are reported
                    item = pickle.dumps((result, (w, begin - start, begin, _now())), _PROTOCOL)
                except Exception as exc:
                    status, item = _ERROR, (type(exc).__name__, "its result cannot be sent back "
                                            f"to the main process: {exc}", "")
        outbox.put((n, status, item))
        if status != _OK:
            return


class _ProcessPool(_Pool):
    """Forked worker processes (fork: functions defined in a notebook need no pickling)."""

    def __init__(self, node, ctx, epoch, upstream):
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ArgumentError(f"map {node.name!r}: executor='process' needs the fork start "
                                "method, which this platform lacks; use threads")
        self._mp = multiprocessing.get_context("fork")
        super().__init__(node, ctx, epoch, upstream)

    def make_queue(self, depth):
        return self._mp.Queue(maxsize=depth)

    def start_workers(self):
        for w in range(self.degree):
            lane = w if self.ordered else 0
            proc = self._mp.Process(target=_process_worker, daemon=True,
                                    name=f"{self.node.name}:{w}",
                                    args=(self.node, self.epoch, w, self.inputs[lane],
                                          self.outputs[lane], os.getpid()))
            proc.start()
            self.workers.append(proc)

    def pack(self, n, item):
        try:
            return pickle.dumps(item, _PROTOCOL)
        except Exception as exc:
            raise PipelineError(f"map operator {self.node.name!r}: item {n} cannot be sent to a "
                                f"worker process ({type(exc).__name__}: {exc}); use threads",
                                op=self.node.name, index=n) from exc

    def unwrap(self, n, value):
        item, (w, wait, begin, end) = pickle.loads(value)
        self.ctx.waited(self.node.name, w, wait)
        self.ctx.work(self.node.name, w, n, begin, end)
        return item

    def worker_error(self, n, info):
        name, message, trace = info
        return PipelineError(f"map operator {self.node.name!r} failed on item {n}: {name}: "
                             f"{message}\n--- worker traceback ---\n{trace}",
                             op=self.node.name, index=n)

    def check_alive(self, lane):
        for proc in self.workers if not self.ordered else [self.workers[lane]]:
            if proc.exitcode not in (None, 0):
                raise PipelineError(f"map operator {self.node.name!r}: worker process "
                                    f"{proc.name} died (exit code {proc.exitcode})",
                                    op=self.node.name)

    def stop_workers(self, deadline):
        for proc in self.workers:
            if proc.is_alive():
                proc.terminate()
        for proc in self.workers:
            proc.join(max(0.1, deadline - _now()))
            if proc.is_alive():
                proc.kill()
                proc.join(JOIN_SECONDS)
        for q in (*self.inputs, *self.outputs):
            q.cancel_join_thread()
            q.close()


# ---------------------------------------------------------------------------------------------
# Report.

@dataclass(frozen=True)
class StageReport:
    """One operator's numbers from a profiled run.

    Attributes:
        items: Items (or batches) the operator produced work for.
        items_per_s: ``items`` over the run's wall time.
        busy: Fraction of ``degree x wall`` spent in the operator's own work.
        waiting: Fraction of ``degree x wall`` its workers spent waiting for input or for room
            downstream (for an inline operator, the time its upstream took to deliver).
        busy_seconds, wait_seconds: The totals behind those fractions.
    """

    name: str
    kind: str
    degree: int
    items: int
    items_per_s: float
    busy: float
    waiting: float
    busy_seconds: float
    wait_seconds: float


@dataclass(frozen=True)
class Report:
    """What ``Pipeline.profile`` measured: per-stage numbers and the work timeline."""

    stages: tuple
    wall: float
    outputs: int
    timeline: tuple

    @property
    def bottleneck(self) -> str:
        """The operator with the highest busy fraction (the one to give more workers)."""
        return max(self.stages, key=lambda s: s.busy).name

    @property
    def throughput(self) -> float:
        """Outputs per second."""
        return self.outputs / self.wall if self.wall > 0 else 0.0

    def stage(self, name: str) -> StageReport:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ArgumentError(f"Report.stage: no stage {name!r}; stages: "
                            f"{[s.name for s in self.stages]}")

    def table(self) -> str:
        lines = [f"{'stage':<28}{'workers':>8}{'items':>8}{'items/s':>11}{'busy':>7}{'wait':>7}"]
        for s in self.stages:
            lines.append(f"{s.name:<28}{s.degree:>8}{s.items:>8}{s.items_per_s:>11.1f}"
                         f"{s.busy:>7.0%}{s.waiting:>7.0%}")
        lines.append(f"{self.outputs} outputs in {self.wall:.3f} s "
                     f"({self.throughput:.1f}/s); bottleneck: {self.bottleneck}")
        return "\n".join(lines)

    __str__ = table


def _make_report(nodes, recorder: _Recorder, wall: float, outputs: int) -> Report:
    stages = []
    for node in nodes:
        busy = sum(v for (stage, _), v in recorder.busy.items() if stage == node.name)
        wait = sum(v for (stage, _), v in recorder.wait.items() if stage == node.name)
        items = sum(v for (stage, _), v in recorder.items.items() if stage == node.name)
        capacity = node.degree * wall if wall > 0 else 1.0
        stages.append(StageReport(node.name, node.kind, node.degree, items,
                                  items / wall if wall > 0 else 0.0, min(busy / capacity, 1.0),
                                  min(wait / capacity, 1.0), busy, wait))
    return Report(tuple(stages), wall, outputs, tuple(recorder.events))


# ---------------------------------------------------------------------------------------------
# The Pipeline.

def _check_int(fn: str, name: str, value, low: int, allow_none=False):
    if value is None and allow_none:
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
        raise ArgumentError(f"Pipeline.{fn}: {name} must be an int >= {low}, got {value!r}")
    return int(value)


def _fields(value) -> frozenset | None:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return frozenset([value])
    return frozenset(value)


def _callable_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


class Pipeline:
    """An immutable chain of operators; iterate it to get items (see the module docstring)."""

    def __init__(self, node: Node):
        self._node = node
        self._tuned = None

    # -- sources ------------------------------------------------------------------------------
    @classmethod
    def from_dataset(cls, dataset, name: str = "source") -> Pipeline:
        """Items ``iter(dataset)`` if it defines ``__iter__`` (iterable-style datasets, lists,
        arrays), else ``dataset[0] .. dataset[len - 1]`` (map-style datasets)."""
        if not hasattr(dataset, "__iter__") and hasattr(dataset, "__len__") \
                and hasattr(dataset, "__getitem__"):
            opener = lambda: (dataset[i] for i in range(len(dataset)))
            return cls(SourceNode(None, name, open=opener, length=len(dataset)))
        return cls.from_iterable(dataset, name)

    @classmethod
    def from_iterable(cls, iterable, name: str = "source") -> Pipeline:
        """Items of a re-iterable (list, range, ...), a zero-argument callable returning an
        iterator, or a one-shot iterator (which can then be read once)."""
        if callable(iterable) and not hasattr(iterable, "__iter__"):
            return cls(SourceNode(None, name, open=iterable))
        if not hasattr(iterable, "__iter__"):
            raise ArgumentError(f"Pipeline.from_iterable: {type(iterable).__name__} is not "
                                "iterable")
        if iter(iterable) is iterable:
            return cls(SourceNode(None, name, open=_Once(iterable)))
        return cls(SourceNode(None, name, open=lambda: iterable))

    @classmethod
    def from_records(cls, paths, num_shards: int = 1, shard_id: int = 0,
                     name: str = "records") -> Pipeline:
        """Records of one or more record files; this shard's share (see ``records.read_shard``)."""
        from .records import _as_paths, _check_shards, read_shard

        _check_shards("Pipeline.from_records", num_shards, shard_id)
        paths = _as_paths(paths)
        return cls(SourceNode(None, name, open=lambda: read_shard(paths, num_shards, shard_id)))

    # -- operators ------------------------------------------------------------------------------
    def _then(self, make, base: str) -> Pipeline:
        taken = {n.name for n in self.nodes}
        name = base
        for k in itertools.count(2):
            if name not in taken:
                break
            name = f"{base}#{k}"
        return Pipeline(make(name))

    def map(self, fn: Callable, num_parallel=None, batched_fn: Callable | None = None,
            name: str | None = None, *, seed: int | None = None, field=None,
            preserves=None, deterministic: bool = True, executor: str = "thread") -> Pipeline:
        """Apply ``fn`` to every item.

        Args:
            fn: ``fn(item) -> item``; ``fn(item, rng)`` when ``seed`` is given.
            num_parallel: None (inline, the default), a worker count, or ``AUTOTUNE``.
            batched_fn: The same function over a collated batch (default: ``fn.batched``);
                lets ``vectorize_maps`` turn ``map(f).batch(b)`` into ``batch(b).map(vf)``.
            name: For reports (default ``map:<fn name>``).
            seed: Give ``fn`` a generator derived from ``(seed, epoch, item index)``, the index
                being the item's position in this map's input (so an unordered map upstream
                makes the assignment follow arrival order).
            field: Apply ``fn`` to ``item[field]`` only; the other fields are kept, which makes
                pushing a filter on them above this map legal.
            preserves: Fields ``fn`` promises to leave unchanged (for filter pushdown).
            deterministic: Keep input order when parallel (producer ``i`` owns items
                ``i + M*k``); False yields results as they finish.
            executor: ``"thread"`` or ``"process"`` (forked workers).
        """
        if not callable(fn):
            raise ArgumentError(f"Pipeline.map: fn must be callable, got {type(fn).__name__}")
        if num_parallel is not None and num_parallel is not AUTOTUNE:
            _check_int("map", "num_parallel", num_parallel, 1)
        if executor not in ("thread", "process"):
            raise ArgumentError(f"Pipeline.map: executor must be 'thread' or 'process', got "
                                f"{executor!r}")
        if getattr(fn, "needs_rng", False) and seed is None:
            raise ArgumentError(f"Pipeline.map: {_callable_name(fn)} draws random numbers; "
                                "pass seed=<int> so each item gets its own generator")
        batched = batched_fn if batched_fn is not None else getattr(fn, "batched", None)
        changes = None
        if field is not None:
            fn = _OnField(fn, field)
            batched = _OnField(batched, field) if batched is not None else None
            changes = frozenset([field])
        step = MapStep(fn, batched, seed, changes, _fields(preserves),
                       _callable_name(fn))
        return self._then(lambda n: MapNode(self._node, n, steps=(step,),
                                            num_parallel=num_parallel,
                                            deterministic=deterministic, executor=executor),
                          name or f"map:{step.name}")

    def filter(self, pred: Callable, reads=None, name: str | None = None) -> Pipeline:
        """Keep items with ``pred(item)`` true; ``reads`` names the fields ``pred`` reads."""
        if not callable(pred):
            raise ArgumentError(f"Pipeline.filter: pred must be callable, got "
                                f"{type(pred).__name__}")
        return self._then(lambda n: FilterNode(self._node, n, pred=pred,
                                               reads=_fields(reads)),
                          name or f"filter:{_callable_name(pred)}")

    def shuffle(self, buffer: int, seed: int | None = None) -> Pipeline:
        """Shuffle with a buffer of ``buffer`` items (seeded per epoch from ``seed``)."""
        buffer = _check_int("shuffle", "buffer", buffer, 1)
        return self._then(lambda n: ShuffleNode(self._node, n, buffer=buffer, seed=seed),
                          "shuffle")

    def batch(self, size: int, drop_remainder: bool = False,
              collate_fn: Callable | None = None) -> Pipeline:
        """Collate every ``size`` consecutive items into a batch."""
        size = _check_int("batch", "size", size, 1)
        return self._then(lambda n: BatchNode(self._node, n, size=size,
                                              drop_remainder=bool(drop_remainder),
                                              collate_fn=collate_fn), "batch")

    def prefetch(self, size: int = 2) -> Pipeline:
        """Read up to ``size`` items ahead on a background thread."""
        size = _check_int("prefetch", "size", size, 1)
        return self._then(lambda n: PrefetchNode(self._node, n, size=size), "prefetch")

    def cache(self) -> Pipeline:
        """Replay the first complete pass from memory on later passes."""
        return self._then(lambda n: CacheNode(self._node, n, store=_CacheStore()), "cache")

    def repeat(self, count: int | None = None) -> Pipeline:
        """Repeat the upstream ``count`` times (None: forever)."""
        count = _check_int("repeat", "count", count, 0, allow_none=True)
        return self._then(lambda n: RepeatNode(self._node, n, count=count), "repeat")

    def shard(self, num_shards: int, index: int) -> Pipeline:
        """Keep every ``num_shards``-th item, starting at ``index``."""
        num_shards = _check_int("shard", "num_shards", num_shards, 1)
        index = _check_int("shard", "index", index, 0)
        if index >= num_shards:
            raise ArgumentError(f"Pipeline.shard: index {index} must be < num_shards "
                                f"{num_shards}")
        return self._then(lambda n: ShardNode(self._node, n, num_shards=num_shards,
                                              index=index), "shard")

    def take(self, count: int) -> Pipeline:
        """The first ``count`` items."""
        count = _check_int("take", "count", count, 0)
        return self._then(lambda n: TakeNode(self._node, n, count=count), "take")

    # -- the graph ------------------------------------------------------------------------------
    @property
    def nodes(self) -> list:
        """The operator nodes, source first."""
        chain, node = [], self._node
        while node is not None:
            chain.append(node)
            node = node.input
        return chain[::-1]

    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> Pipeline:
        """Relink ``nodes`` (source first) into a chain of new nodes (used by the passes).

        A cache whose upstream changed gets a fresh store; names stay unique.
        """
        previous, taken, relinked = None, set(), []
        for node in nodes:
            name = node.name
            for k in itertools.count(2):
                if name not in taken:
                    break
                name = f"{node.name}#{k}"
            taken.add(name)
            changes = {"input": previous, "name": name}
            if isinstance(node, CacheNode) and previous is not node.input:
                changes["store"] = _CacheStore()
            same = previous is node.input and name == node.name
            node = node if same else dataclasses.replace(node, **changes)
            relinked.append(node)
            previous = node
        return cls(previous)

    def __repr__(self):
        return "Pipeline(" + " -> ".join(n.describe() for n in self.nodes) + ")"

    # -- running --------------------------------------------------------------------------------
    def _resolved(self) -> Pipeline:
        if not any(getattr(n, "num_parallel", None) is AUTOTUNE for n in self.nodes):
            return self
        if self._tuned is None:
            self._tuned = autotune(self)
        return self._tuned

    def iter(self, timeout: float | None = None) -> Iterator:
        """Iterate; a parallel operator that delivers nothing for ``timeout`` s raises
        ``PipelineTimeout``."""
        return _drive(self._resolved(), _Context(None, timeout))

    def __iter__(self) -> Iterator:
        return self.iter()

    def profile(self, limit: int | None = None, timeout: float | None = None) -> Report:
        """Run up to ``limit`` outputs (all if None) and report each operator's numbers."""
        pipe = self._resolved()
        recorder = _Recorder()
        count = 0
        iterator = _drive(pipe, _Context(recorder, timeout))
        try:
            for _ in iterator if limit is None else itertools.islice(iterator, limit):
                count += 1
        finally:
            iterator.close()
        return _make_report(pipe.nodes, recorder, _now() - recorder.origin, count)

    def run(self, report: bool = False, limit: int | None = None):
        """Consume the pipeline; return the number of outputs, or a ``Report`` if asked."""
        if report:
            return self.profile(limit)
        iterator = self.iter()
        try:
            return sum(1 for _ in (iterator if limit is None else
                                   itertools.islice(iterator, limit)))
        finally:
            iterator.close()

    def to_list(self, limit: int | None = None) -> list:
        """All outputs (or the first ``limit``) as a list."""
        iterator = self.iter()
        try:
            return list(iterator if limit is None else itertools.islice(iterator, limit))
        finally:
            iterator.close()


def _drive(pipe: Pipeline, ctx: _Context):
    stream = pipe._node.iterate(ctx, ())
    try:
        yield from stream
    finally:
        ctx.closing.set()
        stream.close()


def with_degrees(pipe: Pipeline, degrees: Mapping) -> Pipeline:
    """``pipe`` with the named map nodes' ``num_parallel`` replaced (None: inline)."""
    names = {n.name for n in pipe.nodes if n.kind == "map"}
    unknown = set(degrees) - names
    if unknown:
        raise ArgumentError(f"with_degrees: no map named {sorted(unknown)}; maps: "
                            f"{sorted(names)}")
    return Pipeline.from_nodes([dataclasses.replace(n, num_parallel=degrees[n.name])
                                if n.name in degrees else n for n in pipe.nodes])


# ---------------------------------------------------------------------------------------------
# Tuning: measure per-item stage costs, choose degrees (autotune.choose_degrees), apply them.

def measure_costs(pipe, sample: int = 64) -> dict:
    """Seconds of each operator's work per *source* item, measured on ``sample`` outputs.

    Per source item, so that every stage's rate is in the same unit: a batch operator's cost
    is spread over the items of its batch, and a stage after a filter pays only for the items
    that reach it.

    Running every map inline (in one thread) keeps the measurement free of contention; a
    short untimed pass first keeps compilation out of it. The source is read twice.
    """
    names = [n.name for n in pipe.nodes if n.kind == "map"]
    inline = with_degrees(pipe, dict.fromkeys(names))
    inline.profile(min(sample, 4))  # warm-up: compile Numba kernels, fault in pages
    report = inline.profile(sample)
    read = max(report.stages[0].items, 1)
    return {stage.name: stage.busy_seconds / read for stage in report.stages}


def autotune(pipe, budget: int | None = None, *, sample: int = 64, cores: float | None = None,
             costs: Mapping | None = None):
    """Return ``pipe`` with every ``AUTOTUNE`` map's degree chosen by ``choose_degrees``.

    If no map says ``AUTOTUNE``, every map is tuned. Operators that run inline (source, filter,
    batch, maps not tuned) cap the rate as fixed one-worker stages.

    Args:
        pipe: The pipeline (its source must be re-iterable: it is read once to measure).
        budget: Workers for the tuned maps (default: ``os.cpu_count()``).
        sample: Outputs to profile when measuring.
        cores: CPUs shared by all stages, if fewer than the workers (see ``choose_degrees``).
        costs: Per-stage costs to use instead of measuring (``{stage name: seconds}``).
    """
    maps = [n for n in pipe.nodes if n.kind == "map"]
    tuned = [n.name for n in maps if n.num_parallel is AUTOTUNE] or [n.name for n in maps]
    if not tuned:
        return pipe
    costs = dict(costs) if costs is not None else measure_costs(pipe, sample)
    missing = [name for name in tuned if name not in costs]
    if missing:
        raise ArgumentError(f"autotune: no cost for stage(s) {missing}; known: {sorted(costs)}")
    budget = budget if budget is not None else max(CPU_COUNT, len(tuned))
    fixed = {n.name: n.degree for n in pipe.nodes if n.name in costs and n.name not in tuned}
    fixed.update({name: 1 for name in costs if name not in tuned and name not in fixed})
    degrees = choose_degrees(costs, budget, fixed=fixed, cores=cores)
    return with_degrees(pipe, {name: degrees[name] for name in tuned})
