"""Scheduling: Kahn's topological sort (with in-degrees, as in the book) and cycle reporting.

Every traversal here is a loop over explicit queues and lists, never recursion, so a graph of any
depth (a 100 000-node chain) is handled without touching Python's recursion limit.
"""

from collections import deque

from ..errors import CycleError, GraphError


def in_degrees(nodes, edges):
    """Number of incoming edges of each node: {node: count}.

    Raises:
        GraphError: an edge ends at a node that is not in ``nodes``.
    """
    deg = {n: 0 for n in nodes}
    for src, dst in edges:
        if dst not in deg:
            raise GraphError(f"in_degrees: edge {src!r} -> {dst!r} ends at an unknown node {dst!r}")
        deg[dst] += 1
    return deg


def kahn(nodes, edges, steps=None):
    """Topological order of ``nodes`` under ``edges`` [(src, dst), ...] by Kahn's algorithm.

    Ties are broken by the order of ``nodes``. If ``steps`` is a list, each step appends
    ``(node_taken, ready_queue_after, in_degrees_after)`` so a notebook can show the algorithm.

    Raises:
        CycleError: no order exists; the message and ``.cycle`` name the nodes of one cycle, in
            edge order, first node repeated at the end (``a -> b -> c -> a``).
        GraphError: an edge names a node that is not in ``nodes``.
    """
    nodes, edges = list(nodes), list(edges)
    deg = in_degrees(nodes, edges)
    succ = {n: [] for n in nodes}
    pred = {n: [] for n in nodes}
    for s, d in edges:
        if s not in succ:
            raise GraphError(f"kahn: edge {s!r} -> {d!r} starts at an unknown node {s!r}")
        succ[s].append(d)
        pred[d].append(s)
    rank = {n: i for i, n in enumerate(nodes)}
    ready = deque(n for n in nodes if deg[n] == 0)
    order = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for m in sorted(succ[n], key=rank.get):
            deg[m] -= 1
            if deg[m] == 0:
                ready.append(m)
        if steps is not None:
            steps.append((n, list(ready), dict(deg)))
    if len(order) < len(nodes):
        done = set(order)
        cycle = _cycle(nodes, pred, rank, {n for n in nodes if n not in done})
        raise CycleError(f"kahn: no topological order: cycle {' -> '.join(map(str, cycle))}",
                         cycle)
    return order


def _cycle(nodes, pred, rank, remaining):
    """One cycle among the nodes Kahn's algorithm could not take, in edge order.

    Every leftover node still has an in-degree above zero, so at least one of its predecessors
    is also left over. Walking predecessors inside the leftovers therefore never gets stuck and,
    the set being finite, must revisit a node: the walk from that node back to itself is a
    cycle. (Walking successors instead can run into a node downstream of a cycle that has no
    successors at all.) The cycle is reported from its node that comes first in ``nodes``.
    """
    n = next(m for m in nodes if m in remaining)
    path, seen = [], {}
    while n not in seen:
        seen[n] = len(path)
        path.append(n)
        n = min((m for m in pred[n] if m in remaining), key=rank.get)
    loop = path[seen[n]:][::-1]    # each entry's predecessor followed it: reversed, edge order
    first = min(range(len(loop)), key=lambda i: rank[loop[i]])
    loop = loop[first:] + loop[:first]      # start at the cycle's earliest node in ``nodes``
    return [*loop, loop[0]]


def graph_edges(graph):
    """(producer node id, consumer node id) pairs of a Graph."""
    return [(v.producer.id, n.id) for n in graph.nodes for v in n.inputs
            if v.producer is not None]
