"""Runtime: execute a Graph node by node and record a timeline.

* :func:`run_serial` — one worker, nodes in a topological order (the graph's, BFS or DFS).
* :func:`run_parallel` — a thread pool that launches each node as soon as its inputs are ready,
  so independent nodes (e.g. two matmuls) overlap; numpy kernels release the GIL.
* :func:`run_heterogeneous` — an annotated graph across devices, split / merged / sunk.

Each returns ``(outputs, timeline)``; a :class:`Timeline` is a list of
:class:`~mlsys_lab.span.Span` records (:func:`node_span`: lane ``"device/worker"``, the node
``out=op``, kind the op; details ``device``, ``worker``, ``node_id``). All three
drive the one :class:`~mlsys_lab.engine.interpreter.Interpreter` (its input check, its
``run_node``, its freeing after the last use and its error naming the node).
"""

import concurrent.futures as cf
import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, GraphError
from ..span import Span
from .interpreter import Interpreter, as_input  # noqa: F401 - as_input: public here
from .pytree import flatten
from .selection import call_kernel, kernel_for


def Event(node, device, worker, start, end, node_id=-1):  # noqa: N802 - the ch. 7 exercise's name
    """The :class:`~mlsys_lab.span.Span` of one executed node: ``node`` (its label ``"out=op"``)
    ran on ``device`` and ``worker`` from ``start`` to ``end`` (seconds).

    The span's lane is ``"device/worker"``, its kind the op (the label after ``=``), and its
    details ``device``, ``worker`` and ``node_id`` (the graph node's id; -1 for a host launch),
    readable as attributes (``span.device``).
    """
    return Span(f"{device}/{worker}", node, start, end, node.split("=")[-1].strip(),
                {"device": device, "worker": worker, "node_id": node_id})


def node_span(node, device, worker, start, end):
    """The :class:`~mlsys_lab.span.Span` of running graph node ``node``, labelled ``out=op``."""
    return Span(f"{device}/{worker}", f"{node.outputs[0].name}={node.op}", start, end, node.op,
                {"device": device, "worker": worker, "node_id": node.id})


class Timeline(list):
    """The :class:`~mlsys_lab.span.Span` records of a run (one per executed node), with its
    makespan and a dependency check."""

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


class TimedInterpreter(Interpreter):
    """An :class:`~mlsys_lab.engine.interpreter.Interpreter` that records a :class:`Timeline`:
    one span per node, on ``device`` (a name, or None for each node's ``meta['device']``) and
    ``worker``, in the ``order`` of :func:`topological_order`."""

    def __init__(self, graph, order="graph", device="cpu", worker="worker0", free=True):
        super().__init__(graph, free)
        self.order, self.device, self.worker = order, device, worker
        self.timeline = Timeline()

    def schedule(self):
        return topological_order(self.graph, self.order)

    def step(self, node):
        t0 = time.perf_counter()
        result = super().step(node)
        device = self.device or node.meta.get("device", "cpu")
        self.timeline.append(node_span(node, device, self.worker, t0, time.perf_counter()))
        return result


def run_graph(graph, *args, device=None):
    """Run ``graph`` on numpy arrays and return its outputs as a list of arrays.

    With ``device`` (e.g. ``"cpu-numba"``), a node runs the kernel operator selection would give
    it on that device (``selection.kernel_for``: the device's most preferred kernel that accepts
    the node); a node with none runs the op's numpy ``compute``. Inputs are checked (one
    argument per graph input, of its shape and dtype), each intermediate array is released
    after its last reader, and a failing node is named: the
    :class:`~mlsys_lab.engine.interpreter.Interpreter` does all three.
    """
    return DeviceInterpreter(graph, device).run_flat(list(args))


class DeviceInterpreter(Interpreter):
    """The Interpreter with ``device``'s registered kernels where they accept a node (the op's
    numpy kernel elsewhere, and everywhere when ``device`` is None)."""

    def __init__(self, graph, device=None):
        super().__init__(graph)
        self.device = device

    def run_node(self, node, args):
        kernel = kernel_for(node, self.device) if self.device else None
        if kernel is None:
            return super().run_node(node, args)
        return call_kernel(kernel, node, args)


def _start(graph, args):
    """A numpy Interpreter for ``graph``, bound to ``args`` (checked)."""
    interp = Interpreter(graph)
    interp.bind(flatten(args)[0])
    return interp


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
        return _depth_first(graph)
    raise ArgumentError(f"topological_order: unknown order strategy {strategy!r}; known: "
                        f"graph, bfs, dfs")


def _depth_first(graph):
    """Post-order of a depth-first walk from each output's producer, then from every node in
    graph order; an explicit stack, so a chain of any length is fine."""
    order, seen = [], set()
    for root in [v.producer for v in graph.outputs if v.producer is not None] + graph.nodes:
        if id(root) in seen:
            continue
        seen.add(id(root))
        path, inputs = [root], [iter(root.inputs)]
        while inputs:
            for v in inputs[-1]:
                p = v.producer
                if p is not None and id(p) not in seen:
                    seen.add(id(p))
                    path.append(p)
                    inputs.append(iter(p.inputs))
                    break
            else:
                inputs.pop()
                order.append(path.pop())
    return order


def _outputs(outs):
    return outs[0] if len(outs) == 1 else tuple(outs)


def run_serial(graph, *args, order="graph", device="cpu"):
    """Run ``graph`` on one worker in a topological order; returns (outputs, Timeline)."""
    interp = TimedInterpreter(graph, order, device)
    return _outputs(interp.run(*args)), interp.timeline


def run_parallel(graph, *args, workers=2, device="cpu"):
    """Run ``graph`` on a thread pool, launching each node when all its inputs are ready."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
        raise ArgumentError(f"run_parallel: workers must be a positive integer, got {workers!r}")
    interp = _start(graph, args)
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
        out = interp.call(n, interp.fetch(n))  # inputs stay until this node's store
        t1 = time.perf_counter()
        with lock:
            interp.store(n, out)
            name = threading.current_thread().name
            w = names.setdefault(name, f"worker{len(names)}")
            tl.append(node_span(n, device, w, t0, t1))
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
    return _outputs(interp.outputs()), tl


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
    interp = _start(graph, args)
    tl = Timeline()
    host = 0.0
    free = {}  # device -> time its stream becomes free
    end = {}  # node id -> simulated time it finished

    def run(n, start):
        t0 = time.perf_counter()
        interp.step(n)
        end[n.id] = start + time.perf_counter() - t0
        tl.append(node_span(n, n.meta.get("device", "cpu"), "stream", start, end[n.id]))
        return end[n.id]

    def launch(dev, what):
        nonlocal host
        cost = DEVICES[dev].launch_overhead_s if dev in DEVICES else 0.0
        tl.append(Span("host/cpu", f"launch {what}", host, host + cost, "launch",
                       {"device": "host", "worker": "cpu", "node_id": -1}))
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
    return _outputs(interp.outputs()), tl
