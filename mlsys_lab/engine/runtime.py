"""Runtime: execute a Graph node by node and record a timeline.

* :func:`run_serial` — one worker, nodes in a topological order (the graph's, BFS or DFS).
* :func:`run_parallel` — a thread pool that launches each node as soon as its inputs are ready,
  so independent nodes (e.g. two matmuls) overlap; numpy kernels release the GIL.

Both return ``(outputs, timeline)``; a timeline is a list of :class:`Event` records.
"""

import concurrent.futures as cf
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, DTypeError, GraphError, MLSysError
from .graph import check_input
from .pytree import flatten
from .registry import get
from .tensor import run_kernel


@dataclass(frozen=True)
class Event:
    """One executed node: which node, where, and when (seconds, ``time.perf_counter``)."""

    node: str
    device: str
    worker: str
    start: float
    end: float
    node_id: int = -1

    @classmethod
    def of(cls, node, device, worker, start, end):
        """The Event of running graph node ``node``, labelled ``out=op``."""
        return cls(f"{node.outputs[0].name}={node.op}", device, worker, start, end, node.id)


class Timeline(list):
    """A list of Events with summary helpers."""

    @property
    def makespan(self):
        return max(e.end for e in self) - min(e.start for e in self) if self else 0.0

    def check_dependencies(self, graph):
        """Raise GraphError if some node started before one of its inputs finished."""
        end = {e.node_id: e.end for e in self}
        start = {e.node_id: e.start for e in self}
        for n in graph.nodes:
            for v in n.inputs:
                p = v.producer
                if p is not None and start[n.id] < end[p.id]:
                    raise GraphError(f"timeline: node #{n.id} ({n.op}) started before its input "
                                     f"#{p.id} ({p.op}) finished")
        return True


def as_input(a, dtype, where="input"):
    """An argument as an array: arrays keep their dtype (checked later); Python numbers and
    lists take the input's dtype, as scalars do next to tensors. ``where`` names the input in
    errors.

    Raises:
        DTypeError: ``a`` is None, a string or anything else that is not numeric data (numpy
            would turn None into NaN and ``"1.5"`` into 1.5 without a word).
    """
    if isinstance(a, np.ndarray) or hasattr(a, "__array__") and not isinstance(a, (list, tuple)):
        arr = np.asarray(a)
    elif a is None or isinstance(a, (str, bytes)):
        arr = None
    else:
        try:
            arr = np.asarray(a, dtype=dtype)
        except (TypeError, ValueError, OverflowError):
            arr = None
    if arr is None or arr.dtype.kind not in "biuf":
        raise DTypeError(f"{where}: expected numeric data for a {np.dtype(dtype).name} input, got "
                         f"{type(a).__name__}" + (f" of dtype {arr.dtype}" if arr is not None
                                                  else ""))
    return arr


def _bind(graph, args):
    flat, _ = flatten(args)
    if len(flat) != len(graph.inputs):
        raise GraphError(f"{graph.name}: expects {len(graph.inputs)} inputs, got {len(flat)}")
    env = {}
    for v, a in zip(graph.inputs, flat):
        a = as_input(a, v.dtype, f"{graph.name}: input {v.name}")
        check_input(graph.name, v, a.shape, a.dtype)
        env[id(v)] = a
    env.update({id(v): a for v, a in graph.consts.items()})
    return env


def _run_node(n, env):
    try:
        return run_kernel(get(n.op), [env[id(v)] for v in n.inputs], n.attrs)
    except MLSysError as e:
        raise type(e)(f"{e}\n  while running node #{n.id} {n.op}"
                      f"{chr(10) + '  at ' + n.source if n.source else ''}") from None


def topological_order(graph, strategy="graph"):
    """Node order: 'graph' (as stored), 'bfs' (Kahn, level by level) or 'dfs' (each output's
    dependencies depth-first, so a value is consumed soon after it is produced)."""
    if strategy == "graph":
        return list(graph.nodes)
    if strategy == "bfs":
        deg = {n.id: len({id(v) for v in n.inputs if v.producer is not None})
               for n in graph.nodes}
        ready = deque(n for n in graph.nodes if deg[n.id] == 0)
        order = []
        while ready:
            n = ready.popleft()
            order.append(n)
            for u in {u.id: u for o in n.outputs for u in o.users}.values():
                deg[u.id] -= 1
                if deg[u.id] == 0:
                    ready.append(u)
        return order
    if strategy == "dfs":
        order, seen = [], set()

        def visit(n):
            if n.id in seen:
                return
            seen.add(n.id)
            for v in n.inputs:
                if v.producer is not None:
                    visit(v.producer)
            order.append(n)

        for v in graph.outputs:
            if v.producer is not None:
                visit(v.producer)
        for n in graph.nodes:  # nodes no output needs still run
            visit(n)
        return order
    raise ArgumentError(f"topological_order: unknown order strategy {strategy!r}; known: "
                        f"graph, bfs, dfs")


def _outputs(graph, env):
    outs = [env[id(v)] for v in graph.outputs]
    return outs[0] if len(outs) == 1 else tuple(outs)


def run_serial(graph, *args, order="graph", device="cpu"):
    """Run ``graph`` on one worker in a topological order; returns (outputs, Timeline)."""
    env = _bind(graph, args)
    tl = Timeline()
    for n in topological_order(graph, order):
        t0 = time.perf_counter()
        env[id(n.outputs[0])] = _run_node(n, env)
        tl.append(Event.of(n, device, "worker0", t0, time.perf_counter()))
    return _outputs(graph, env), tl


def run_parallel(graph, *args, workers=2, device="cpu"):
    """Run ``graph`` on a thread pool, launching each node when all its inputs are ready."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ArgumentError(f"run_parallel: workers must be a positive integer, got {workers!r}")
    env = _bind(graph, args)
    deps = {n.id: {v.producer.id for v in n.inputs if v.producer is not None}
            for n in graph.nodes}
    users = {n.id: set() for n in graph.nodes}
    for nid, ds in deps.items():
        for d in ds:
            users[d].add(nid)
    remaining = {nid: len(ds) for nid, ds in deps.items()}
    tl, lock = Timeline(), threading.Lock()
    names = {}

    def task(n):
        t0 = time.perf_counter()
        out = _run_node(n, env)
        t1 = time.perf_counter()
        with lock:
            env[id(n.outputs[0])] = out
            name = threading.current_thread().name
            w = names.setdefault(name, f"worker{len(names)}")
            tl.append(Event.of(n, device, w, t0, t1))
        return n

    with cf.ThreadPoolExecutor(max_workers=workers) as pool:
        running = {pool.submit(task, n) for n in graph.nodes if remaining[n.id] == 0}
        while running:
            done, running = cf.wait(running, return_when=cf.FIRST_COMPLETED)
            for f in done:
                n = f.result()
                for u in sorted(users[n.id]):
                    remaining[u] -= 1
                    if remaining[u] == 0:
                        running.add(pool.submit(task, graph.nodes[u]))
    tl.sort(key=lambda e: e.start)
    return _outputs(graph, env), tl


# --- heterogeneous execution ------------------------------------------------------------------
@dataclass
class Subgraph:
    """A maximal run of consecutive nodes assigned to one device."""

    device: str
    nodes: list
    inputs: list  # values produced outside this subgraph
    outputs: list  # values used after it (or graph outputs)


def partition(graph):
    """Split an annotated graph (``node.meta['device']``, see selection.select) into per-device
    subgraphs, in execution order."""
    groups = []
    for n in graph.nodes:
        dev = n.meta.get("device", "cpu")
        if not groups or groups[-1][0] != dev:
            groups.append((dev, []))
        groups[-1][1].append(n)
    subs = []
    final = set(map(id, graph.outputs))
    for dev, nodes in groups:
        inside = {id(o) for n in nodes for o in n.outputs}
        ins = list({id(v): v for n in nodes for v in n.inputs if id(v) not in inside}.values())
        outs = [o for n in nodes for o in n.outputs
                if id(o) in final or any(u not in nodes for u in o.users)]
        subs.append(Subgraph(dev, nodes, ins, outs))
    return subs


def run_heterogeneous(graph, *args, mode="split"):
    """Execute an annotated graph across devices and return (outputs, Timeline).

    Kernels run for real; each device's per-launch cost (``Device.launch_overhead_s``) is added
    on a simulated clock, so the three modes of the book can be compared:

    * ``split``  — the host launches one subgraph at a time and waits for it (synchronous);
    * ``merged`` — the host launches every node on its own, asynchronously, in one stream per
      device (launches overlap with kernels, but every node pays a launch);
    * ``sunk``   — the whole graph is handed to the device once; nodes run back to back.
    """
    from .selection import DEVICES

    if mode not in ("split", "merged", "sunk"):
        raise ArgumentError(f"run_heterogeneous: mode must be split, merged or sunk, got "
                            f"{mode!r}")
    env = _bind(graph, args)
    tl = Timeline()
    host = 0.0
    free = {}  # device -> time its stream becomes free
    end = {}  # node id -> simulated time it finished

    def run(n, start):
        t0 = time.perf_counter()
        env[id(n.outputs[0])] = _run_node(n, env)
        end[n.id] = start + time.perf_counter() - t0
        tl.append(Event.of(n, n.meta.get("device", "cpu"), "stream", start, end[n.id]))
        return end[n.id]

    def launch(dev, what):
        nonlocal host
        cost = DEVICES[dev].launch_overhead_s if dev in DEVICES else 0.0
        tl.append(Event(f"launch {what}", "host", "cpu", host, host + cost, -1))
        host += cost
        return host

    if mode == "sunk":
        t = launch(graph.nodes[0].meta.get("device", "cpu") if graph.nodes else "cpu", "graph")
        for n in graph.nodes:
            t = run(n, t)
    elif mode == "split":
        for sub in partition(graph):
            t = launch(sub.device, f"{sub.device} subgraph")
            for n in sub.nodes:
                t = run(n, t)
            host = t  # synchronous: wait for the subgraph
    else:
        for n in graph.nodes:
            dev = n.meta.get("device", "cpu")
            ready = launch(dev, n.op)
            deps = [end[v.producer.id] for v in n.inputs if v.producer is not None]
            free[dev] = run(n, max([ready, free.get(dev, 0.0)] + deps))
    return _outputs(graph, env), tl
