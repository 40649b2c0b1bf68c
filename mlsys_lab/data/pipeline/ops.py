"""The operator nodes of a pipeline (source, map, filter, shuffle, batch, prefetch, cache,
repeat, shard, take), each iterating its input as a generator, and what maps apply: steps,
per-field application, collation.

A map with ``num_parallel=None`` runs inline in the thread that pulls from it; with
``num_parallel=k`` its items go to a pool of ``k`` workers (``pools``).
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentError, MLSysError
from ..item_rng import ItemRngs, item_rng
from .autotune import AUTOTUNE
from .pools import make_pool
from .runtime import (
    END,
    HASTY_JOIN_SECONDS,
    JOIN_SECONDS,
    OK,
    UPSTREAM_ERROR,
    Context,
    get,
    now,
    op_error,
    pulled,
    put,
)

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


class OnField:
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
        batched_fn: The same function over a collated batch (``batched_fn(batch[, rngs])``,
            ``rngs`` an ``ItemRngs``: the batch's items' generators, drawable at once).
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
        return self.fn(item, item_rng(self.seed, epoch, index))

    def apply_batch(self, batch, epoch: tuple, first: int):
        if self.seed is None:
            return self.batched_fn(batch)
        return self.batched_fn(batch, ItemRngs(self.seed, epoch, first, _batch_len(batch)))

    def keeps(self, fields: frozenset) -> bool:
        """Whether this step provably leaves ``fields`` unchanged (and ignores item order)."""
        if self.seed is not None:
            return False
        if self.preserves is not None and fields <= self.preserves:
            return True
        return self.changes is not None and not fields & self.changes



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

    def iterate(self, ctx: Context, epoch: tuple) -> Iterator:
        raise NotImplementedError


class Once:
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
            start = now()
            try:
                item = next(iterator)
            except StopIteration:
                return
            except MLSysError:
                raise
            except Exception as exc:
                raise op_error(self, n, exc) from exc
            ctx.work(self.name, 0, n, start, now())
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
            return inline_map(self, ctx, epoch, upstream)
        return make_pool(self, ctx, epoch, upstream).results()


def inline_map(node: MapNode, ctx, epoch, upstream):
    """A map with ``num_parallel=None``: ``node.apply`` on each item in the pulling thread."""
    try:
        for n in itertools.count():
            start = now()
            try:
                item = next(upstream)
            except StopIteration:
                return
            begin = now()
            try:
                out = node.apply(item, epoch, n)
            except Exception as exc:
                raise op_error(node, n, exc) from exc
            ctx.waited(node.name, 0, begin - start)
            ctx.work(node.name, 0, n, begin, now())
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
            for n, item in enumerate(pulled(upstream, ctx, self.name)):
                start = now()
                try:
                    keep = bool(self.pred(item))
                except Exception as exc:
                    raise op_error(self, n, exc) from exc
                ctx.work(self.name, 0, n, start, now())
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
        source = pulled(upstream, ctx, self.name)
        try:
            for k in itertools.count():
                chunk = list(itertools.islice(source, self.size))
                if not chunk or (len(chunk) < self.size and self.drop_remainder):
                    return
                start = now()
                try:
                    batch = collate_fn(chunk)
                except Exception as exc:
                    raise op_error(self, k, exc) from exc
                ctx.work(self.name, 0, k, start, now())
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
        return prefetch(self, ctx, self.input.iterate(ctx, epoch))


def prefetch(node, ctx, upstream):
    """``node.size`` items read ahead of the consumer by one background thread (a bounded
    queue); an upstream error is raised in the consumer, and closing stops the thread."""
    buffer = queue.Queue(maxsize=node.size)
    stop = threading.Event()

    def fill():
        try:
            for item in upstream:
                if not put(buffer, (OK, item), stop, ctx):
                    return
            put(buffer, (END, None), stop, ctx)
        except BaseException as exc:  # handed to the consumer, raised there
            put(buffer, (UPSTREAM_ERROR, exc), stop, ctx)

    thread = threading.Thread(target=fill, name=f"prefetch:{node.name}", daemon=True)
    thread.start()
    patience = JOIN_SECONDS
    try:
        while True:
            status, value = get(buffer, ctx, node, lambda: None)
            if status == END:
                return
            if status == UPSTREAM_ERROR:
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


class CacheStore:
    """Where a ``CacheNode`` keeps the items of its first complete pass (shared by copies)."""

    def __init__(self):
        self.items = None
        self.lock = threading.Lock()


@dataclass(frozen=True, eq=False)
class CacheNode(Node):
    """Keep the items of the first complete pass in memory and replay them afterwards."""

    store: CacheStore = None
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

