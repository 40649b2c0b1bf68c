"""A tf.data / MindSpore-style data pipeline: an immutable chain of operator nodes.

    pipe = (Pipeline.from_records(paths)
            .map(Decode(), field="image", num_parallel=3)
            .map(Resize(32), field="image", num_parallel=2)
            .filter(lambda r: r["label"] < 5, reads="label")
            .batch(64).prefetch(2))
    for batch in pipe: ...
    report = pipe.profile(200)          # items/s, busy and waiting per operator, a timeline

Every method returns a new ``Pipeline``; nodes are never changed, so passes
(``passes``) can rewrite a graph and leave the original intact.

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
item index)`` (``item_rng``): the same for every thread count, ordering and vectorisation.

Where things live (all in this folder, ``mlsys_lab/data/pipeline/``): the operator nodes in
``ops``, the parallel map's workers in ``pools``, the per-stage report in ``report``, the clock,
context and ``PipelineTimeout`` in ``runtime`` (``PipelineError`` is in ``mlsys_lab.errors``);
this module holds ``Pipeline`` itself and the tuning entry points.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from ...errors import ArgumentError, PipelineError
from .autotune import AUTOTUNE, choose_degrees, refine_degrees
from .ops import (
    BatchNode,
    CacheNode,
    CacheStore,
    FilterNode,
    MapNode,
    MapStep,
    Node,
    Once,
    OnField,
    PrefetchNode,
    RepeatNode,
    ShardNode,
    ShuffleNode,
    SourceNode,
    TakeNode,
    collate,
)
from .report import Recorder, Report, StageReport, make_report
from .runtime import CPU_COUNT, Context, PipelineTimeout, now

__all__ = ["Pipeline", "PipelineError", "PipelineTimeout", "AUTOTUNE", "Report",
           "StageReport", "collate", "with_degrees", "measure_costs", "autotune",
           "measured_rate",
           "Node", "SourceNode", "MapNode", "FilterNode", "ShuffleNode", "BatchNode",
           "PrefetchNode", "CacheNode", "RepeatNode", "ShardNode", "TakeNode", "MapStep"]

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
            return cls(SourceNode(None, name, open=Once(iterable)))
        return cls(SourceNode(None, name, open=lambda: iterable))

    @classmethod
    def from_records(cls, paths, num_shards: int = 1, shard_id: int = 0,
                     name: str = "records") -> Pipeline:
        """Records of one or more record files; this shard's share (see ``records.read_shard``)."""
        from ..records import as_paths, check_shards, read_shard

        check_shards("Pipeline.from_records", num_shards, shard_id)
        paths = as_paths(paths)
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
            fn = OnField(fn, field)
            batched = OnField(batched, field) if batched is not None else None
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
        return self._then(lambda n: CacheNode(self._node, n, store=CacheStore()), "cache")

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
                changes["store"] = CacheStore()
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
        return _drive(self._resolved(), Context(None, timeout))

    def __iter__(self) -> Iterator:
        return self.iter()

    def profile(self, limit: int | None = None, timeout: float | None = None) -> Report:
        """Run up to ``limit`` outputs (all if None) and report each operator's numbers."""
        pipe = self._resolved()
        recorder = Recorder()
        count = 0
        iterator = _drive(pipe, Context(recorder, timeout))
        try:
            for _ in iterator if limit is None else itertools.islice(iterator, limit):
                count += 1
        finally:
            iterator.close()
        return make_report(pipe.nodes, recorder, now() - recorder.origin, count)

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


def _drive(pipe: Pipeline, ctx: Context):
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
             costs: Mapping | None = None, refine: int = 0, repeats: int = 2):
    """Return ``pipe`` with every ``AUTOTUNE`` map's degree chosen by ``choose_degrees``.

    If no map says ``AUTOTUNE``, every map is tuned. Operators that run inline (source, filter,
    batch, maps not tuned) cap the rate as fixed one-worker stages.

    The model assumes the stages overlap perfectly on ``cores`` CPUs. What it leaves out
    (threads contending for the CPUs and the GIL, the hand-off between workers, uneven items)
    is measured with ``refine``: that many hill-climbing rounds (``refine_degrees``) over
    neighbouring allocations, each timed on ``sample`` outputs (best of ``repeats`` runs).

    Args:
        pipe: The pipeline (its source must be re-iterable: it is read once to measure).
        budget: Workers for the tuned maps (default: ``os.cpu_count()``).
        sample: Outputs to profile when measuring.
        cores: CPUs shared by all stages, if fewer than the workers (see ``choose_degrees``).
        costs: Per-stage costs to use instead of measuring (``{stage name: seconds}``).
        refine: Rounds of measured hill-climbing after the model's choice (0: the model only).
        repeats: Timed runs per allocation while refining (the best counts).
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
    chosen = {name: degrees[name] for name in tuned}
    if refine:
        evaluate = lambda candidate: measured_rate(with_degrees(pipe, candidate), sample,
                                                   repeats)
        chosen, _ = refine_degrees(chosen, budget, evaluate, rounds=refine)
    return with_degrees(pipe, chosen)


def measured_rate(pipe, outputs: int, repeats: int = 2) -> float:
    """Outputs per second of ``pipe`` over its first ``outputs`` outputs, best of ``repeats``."""
    best = 0.0
    for _ in range(repeats):
        start = now()
        count = pipe.run(limit=outputs)
        elapsed = now() - start
        best = max(best, count / elapsed if elapsed > 0 else float("inf"))
    return best
