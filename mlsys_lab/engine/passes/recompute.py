"""Activation recomputation as a graph pass, and the schedules that decide what to save (ch. 19).

A traced training graph (``grad_graph``, or a training step whose first output is the loss)
holds its forward pass and its backward pass in one node list; every forward value the backward
pass reads (an *activation*) lives from its forward step to its last backward use, and at the
turn from forward to backward they are all live at once. :func:`recompute_pass` keeps the ones
a *policy* saves and drops the others from the forward -> backward edges: right before the first
backward node that needs a dropped value, it inserts copies of the forward nodes that compute it
from saved values (recomputation nodes), and the backward pass reads those. Same ops on the same
inputs: the gradients are bit-identical. :func:`peak_memory` is the memory planner's view of a
graph, before and after.

Which activations to save, for a chain of layers (layer ``i`` stores ``sizes[i]`` bytes and
costs ``costs[i]`` to recompute):

* :func:`sqrt_schedule` — Chen et al. (2016): a checkpoint every ceil(sqrt(n)) layers, so about
  ``2 sqrt(n)`` layers' activations are live at the peak for one extra forward pass;
* :func:`optimal_schedule` — the least recomputation whose peak fits a byte budget, by dynamic
  programming over the last checkpoint (revolve / Checkmate restricted to chains; exact);
  :func:`exhaustive_schedule` tries every subset (the reference the tests compare it with).

The chain model (:func:`chain_peak`, :func:`chain_cost`): with saved layers
``c_0 < c_1 < ... < c_m = n - 1`` (the last layer's output is always kept: backward starts
there), backward reaches segment ``t`` (layers ``c_{t-1}+1 .. c_t``) holding the checkpoints
``c_0 .. c_t`` and recomputes the segment's other layers once, keeping them until their own
backward step. So the peak is ``max_t (sizes[c_0] + ... + sizes[c_t] + the interior of segment
t)`` and the extra cost is the sum of ``costs`` over the layers not saved.
"""

import math
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from ...errors import ArgumentError, DTypeError, OutOfMemoryError
from .. import memory
from ..graph import Node, Value
from ..registry import get
from .rewrite import Rewriter, graph_pass

__all__ = [
    "Schedule", "chain_cost", "chain_peak", "exhaustive_schedule", "forward_nodes",
    "optimal_schedule", "peak_memory", "recompute_pass", "saved_activations", "sqrt_schedule",
]


# --- the graph pass ------------------------------------------------------------------------------
def forward_nodes(graph):
    """Ids of the forward nodes of a training graph: those its first output (the loss) depends
    on. With one output every node is forward (there is no backward pass to feed)."""
    if len(graph.outputs) < 2:
        return {n.id for n in graph.nodes}
    producer = {id(o): n for n in graph.nodes for o in n.outputs}
    forward, stack = set(), [graph.outputs[0]]
    while stack:
        n = producer.get(id(stack.pop()))
        if n is not None and n.id not in forward:
            forward.add(n.id)
            stack.extend(n.inputs)
    return forward


def saved_activations(graph):
    """The forward values the backward pass reads, in forward order: what a training graph
    keeps alive from forward to backward (graph inputs and constants are not activations)."""
    forward = forward_nodes(graph)
    producer = {id(o): n for n in graph.nodes for o in n.outputs}
    seen = {}
    for n in graph.nodes:
        if n.id in forward:
            continue
        for v in n.inputs:
            p = producer.get(id(v))
            if p is not None and p.id in forward:
                seen[id(v)] = (p.id, v)
    return [v for _, v in sorted(seen.values(), key=lambda pv: pv[0])]


def _policy(graph, policy):
    """``policy`` as a predicate ``keep(node) -> bool`` over forward nodes."""
    if policy == "everything":
        return lambda n: True
    if policy == "nothing":
        return lambda n: False
    if callable(policy) and not isinstance(policy, (Node, Value)):
        return policy
    if isinstance(policy, (str, int, Node, Value)):
        policy = [policy]
    try:
        items = list(policy)
    except TypeError:
        raise DTypeError(f"recompute_pass: policy must be 'everything', 'nothing', a predicate "
                         f"on nodes or a list of node ids / value names / Values / Nodes, got "
                         f"{type(policy).__name__}") from None
    ids = set()
    for item in items:
        if isinstance(item, Value):
            item = item.name
        if isinstance(item, Node):
            ids.add(item.id)
            continue
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, (str, int, np.integer)):
            raise DTypeError(f"recompute_pass: a policy entry must be a node id, a value name, a "
                             f"Value or a Node, got {item!r}")
        try:
            ids.add(graph.node(item if isinstance(item, str) else int(item)).id)
        except Exception:
            raise ArgumentError(f"recompute_pass: the policy names {item!r}, which is no node "
                                f"of {graph.name} (node ids run 0..{len(graph.nodes) - 1})"
                                ) from None
    return lambda n: n.id in ids


@graph_pass
def recompute_pass(graph, policy="nothing"):
    """Save only the activations ``policy`` keeps; recompute the rest in the backward pass.

    Works on a training graph whose first output is the loss and whose other outputs are
    computed by the backward pass (``grad_graph``'s, a traced training step's). Forward nodes
    are those the loss depends on; a forward value read by a backward node is an activation.

    Args:
        graph: the training graph (not modified).
        policy: which forward nodes' outputs are saved: ``"nothing"`` (recompute every
            activation from the inputs), ``"everything"`` (the graph unchanged), a predicate
            ``keep(node) -> bool``, or a list of node ids, value names, Values or Nodes (a
            schedule's checkpoints). Impure nodes (``rng_seed``: a dropout seed) are always
            saved: recomputing them would draw another mask.

    Returns:
        A new graph: the forward nodes unchanged; before the first backward node that reads a
        dropped activation, copies of the forward nodes that compute it from saved values,
        inputs and constants (each forward node copied at most once); the backward nodes read
        the copies. Run it after CSE, which would merge the copies back into the originals.
    """
    keep_node = _policy(graph, policy)
    forward = forward_nodes(graph)
    if len(forward) == len(graph.nodes):
        return graph.copy()
    producer = {id(o): n for n in graph.nodes for o in n.outputs}
    outputs = set(map(id, graph.outputs))

    def available(v):
        """Whether backward may read the forward value ``v`` as it is (not dropped)."""
        p = producer.get(id(v))
        return (p is None or p.id not in forward or id(v) in outputs or get(p.op).impure
                or bool(keep_node(p)))

    rw = Rewriter(graph)
    clones = {}  # id(old forward value) -> its recomputed new value
    for n in graph.nodes:
        if n.id in forward:
            rw.copy(n)
            continue
        ins = []
        for v in n.inputs:
            if id(v) in producer and producer[id(v)].id in forward and not available(v):
                _recompute(rw, v, producer, available, clones)
                ins.append(clones[id(v)])
            else:
                ins.append(rw[v])
        _append_copy(rw, n, ins)
    return rw.build()


def _recompute(rw, value, producer, available, clones):
    """Emit copies of the forward nodes computing ``value`` from available values (inputs
    first; an explicit stack, so a long chain never meets the recursion limit)."""
    stack = [value]
    while stack:
        v = stack[-1]
        if id(v) in clones:
            stack.pop()
            continue
        node = producer[id(v)]
        missing = [u for u in node.inputs if id(u) in producer and not available(u)
                   and id(u) not in clones]
        if missing:
            stack.extend(missing)
            continue
        stack.pop()
        ins = [clones[id(u)] if id(u) in clones else rw[u] for u in node.inputs]
        outs = [Value(f"{o.name}_r", o.shape, o.dtype) for o in node.outputs]
        rw._append(Node(node.op, ins, node.attrs, outs, node.source,
                        meta={"recomputes": node.id}))
        for o, new in zip(node.outputs, outs):
            clones[id(o)] = new


def _append_copy(rw, node, ins):
    """Copy the old ``node`` reading the new values ``ins``; bind its outputs."""
    outs = [Value(o.name, o.shape, o.dtype) for o in node.outputs]
    rw._append(Node(node.op, ins, node.attrs, outs, node.source))
    for o, new in zip(node.outputs, outs):
        rw.bind(o, new)


def _fold_views(graph, records):
    """Records without view outputs: a view needs no arena bytes, and keeps the tensor it looks
    into alive until its own last use (as ``ml.compile`` plans)."""
    recs = {r.id: r for r in records}
    root = {}
    for n in graph.nodes:
        if get(n.op).view is not None:
            src = n.inputs[0]
            root[n.outputs[0]] = root.get(src, src)
    for view, src in root.items():
        r = recs.pop(view, None)
        if r is not None and src in recs:
            s = recs[src]
            recs[src] = memory.Lifetime(s.id, s.size, s.start, max(s.end, r.end), s.long_lived)
    return list(recs.values())


def peak_memory(graph, strategy="best", alignment=64, outputs=True):
    """The memory planner's bytes for ``graph``'s intermediates, scheduled in node order.

    Inputs and constants (the caller's memory) are left out, views fold into what they look
    into (as in ``ml.compile``); ``outputs=False`` leaves out the graph's outputs too (a
    training graph's gradients), which leaves the activations and backward temporaries.

    Returns:
        ``(peak, arena)``: the most bytes live at one step (``memory.lower_bound``) and the
        arena the ``strategy`` planner needs for them (``memory.plan(...).arena_size``).
    """
    records = _fold_views(graph, memory.lifetimes(graph, include_inputs=False))
    if not outputs:
        outs = set(graph.outputs)
        records = [r for r in records if r.id not in outs]
    if not records:
        return 0, 0
    return (memory.lower_bound(records, alignment),
            memory.plan(records, strategy, alignment).arena_size)


# --- schedules for a chain -------------------------------------------------------------------
@dataclass(frozen=True)
class Schedule:
    """Which layers of a chain keep their activations, and what that costs.

    Attributes:
        saved: the saved layers' indices, increasing; the last layer is always among them.
        peak: the chain model's peak bytes (:func:`chain_peak`).
        cost: the recomputation cost (:func:`chain_cost`): the costs of the layers not saved.
    """

    saved: tuple
    peak: float
    cost: float


def _check_chain(name, sizes, costs=None):
    sizes = [float(s) for s in sizes]
    if not sizes:
        raise ArgumentError(f"{name}: the chain has no layers")
    if costs is not None:
        costs = [float(c) for c in costs]
        if len(costs) != len(sizes):
            raise ArgumentError(f"{name}: {len(sizes)} sizes but {len(costs)} costs; give one "
                                f"of each per layer")
    if any(not math.isfinite(x) or x < 0 for x in sizes + (costs or [])):
        raise ArgumentError(f"{name}: sizes and costs must be finite and >= 0")
    return sizes, costs


def _segments(n, saved):
    saved = sorted(set(int(s) for s in saved) | {n - 1})
    if saved[0] < 0 or saved[-1] >= n:
        raise ArgumentError(f"chain: saved layers {saved} fall outside 0..{n - 1}")
    return saved


def chain_peak(sizes, saved):
    """Peak bytes of the chain model when the layers ``saved`` keep their activations."""
    sizes, _ = _check_chain("chain_peak", sizes)
    saved = _segments(len(sizes), saved)
    peak, held, prev = 0.0, 0.0, -1
    for c in saved:
        held += sizes[c]
        peak = max(peak, held + sum(sizes[prev + 1:c]))
        prev = c
    return peak


def chain_cost(costs, saved):
    """Recomputation cost of the chain model: the costs of the layers not saved."""
    keep = _segments(len(costs), saved)
    return float(sum(c for i, c in enumerate(costs) if i not in set(keep)))


def sqrt_schedule(n, sizes=None, costs=None):
    """Chen et al.'s schedule: a checkpoint every ``ceil(sqrt(n))`` layers (and the last).

    With equal layers the peak is at most ``ceil(n / k) + k - 1 <= 2 sqrt(n) + 1`` layers'
    activations (``k = ceil(sqrt(n))``), for one extra forward pass over the layers not saved.
    ``sizes`` and ``costs`` (default: 1 per layer) only fill in the Schedule's peak and cost.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ArgumentError(f"sqrt_schedule: n must be a positive int, got {n!r}")
    k = math.ceil(math.sqrt(n))
    saved = tuple(sorted(set(range(k - 1, n, k)) | {n - 1}))
    sizes = [1.0] * n if sizes is None else sizes
    costs = [1.0] * n if costs is None else costs
    sizes, costs = _check_chain("sqrt_schedule", sizes, costs)
    return Schedule(saved, chain_peak(sizes, saved), chain_cost(costs, saved))


def optimal_schedule(sizes, costs, budget):
    """The schedule with the least recomputation cost whose peak is at most ``budget``.

    Dynamic programming over the last checkpoint: a state is a saved layer ``j`` with the
    bytes ``held`` by the checkpoints up to it and the cost paid so far; from it the next
    checkpoint ``k > j`` is allowed when ``held + sizes[k] + sum(sizes[j+1:k]) <= budget``
    (segment ``k``'s peak), and adds the costs of layers ``j+1 .. k-1``. Per ``j`` only the
    Pareto-optimal ``(held, cost)`` pairs are kept (more held bytes and more cost is never
    better later), which keeps it exact; it is polynomial in practice (a chain of 64 layers
    in milliseconds).

    Raises:
        OutOfMemoryError: no schedule fits the budget (names the smallest possible peak).
    """
    sizes, costs = _check_chain("optimal_schedule", sizes, costs)
    n = len(sizes)
    frontier = {-1: [(0.0, 0.0, None)]}  # j -> [(held, cost, (prev j, prev entry))]
    for k in range(n):
        cands = []
        for j in range(-1, k):
            interior = sum(sizes[j + 1:k])  # summed as chain_peak sums it
            extra = sum(costs[j + 1:k])
            for e, (held, cost, _) in enumerate(frontier.get(j, ())):
                if held + sizes[k] + interior <= budget:
                    cands.append((held + sizes[k], cost + extra, (j, e)))
        frontier[k] = _pareto(cands)
    if not frontier[n - 1]:
        raise OutOfMemoryError(
            f"optimal_schedule: no schedule of the {n}-layer chain fits a budget of {budget:g} "
            f"bytes (saving only the last layer peaks at {chain_peak(sizes, ()):g}, saving "
            f"every layer at {chain_peak(sizes, range(n)):g})")
    best = len(frontier[n - 1]) - 1  # the Pareto list's cheapest entry
    saved, j, e = [], n - 1, best
    while j != -1:
        saved.append(j)
        j, e = frontier[j][e][2]
    saved = tuple(reversed(saved))
    return Schedule(saved, chain_peak(sizes, saved), chain_cost(costs, saved))


def _pareto(cands):
    """The (held, cost, back) entries no other entry beats in both held and cost."""
    out = []
    for held, cost, back in sorted(cands, key=lambda t: (t[0], t[1])):
        if not out or cost < out[-1][1]:
            out.append((held, cost, back))
    return out


def exhaustive_schedule(sizes, costs, budget):
    """:func:`optimal_schedule` by trying every set of saved layers (2**(n-1) of them): the
    reference the DP is tested against. Ties go to the smaller peak. Returns None when no
    schedule fits."""
    sizes, costs = _check_chain("exhaustive_schedule", sizes, costs)
    n, best = len(sizes), None
    for r in range(n):
        for rest in combinations(range(n - 1), r):
            saved = rest + (n - 1,)
            peak = chain_peak(sizes, saved)
            if peak <= budget:
                cand = Schedule(saved, peak, chain_cost(costs, saved))
                if best is None or (cand.cost, cand.peak) < (best.cost, best.peak):
                    best = cand
    return best
