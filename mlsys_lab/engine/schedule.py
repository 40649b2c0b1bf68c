"""Scheduling: Kahn's topological sort (with in-degrees, as in the book) and cycle reporting."""

from collections import deque

from ..errors import CycleError


def in_degrees(nodes, edges):
    """Number of incoming edges of each node: {node: count}."""
    deg = {n: 0 for n in nodes}
    for _, dst in edges:
        deg[dst] += 1
    return deg


def kahn(nodes, edges, steps=None):
    """Topological order of ``nodes`` under ``edges`` [(src, dst), ...] by Kahn's algorithm.

    Ties are broken by the order of ``nodes``. If ``steps`` is a list, each step appends
    ``(node_taken, ready_queue_after, in_degrees_after)`` so a notebook can show the algorithm.
    Raises CycleError naming a cycle when no order exists.
    """
    nodes = list(nodes)
    deg = in_degrees(nodes, edges)
    succ = {n: [] for n in nodes}
    for s, d in edges:
        succ[s].append(d)
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
        cycle = _cycle(nodes, succ, {n for n in nodes if n not in order})
        raise CycleError(f"kahn: no topological order: cycle {' -> '.join(map(str, cycle))}",
                         cycle)
    return order


def _cycle(nodes, succ, remaining):
    """Walk successors inside the unsortable remainder until a node repeats."""
    start = next(n for n in nodes if n in remaining)
    path, seen = [], {}
    n = start
    while n not in seen:
        seen[n] = len(path)
        path.append(n)
        n = next(m for m in succ[n] if m in remaining)
    return path[seen[n]:] + [n]


def graph_edges(graph):
    """(producer node id, consumer node id) pairs of a Graph."""
    return [(v.producer.id, n.id) for n in graph.nodes for v in n.inputs
            if v.producer is not None]
