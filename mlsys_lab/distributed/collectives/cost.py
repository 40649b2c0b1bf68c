"""Alpha-beta-gamma cost formulas for the collectives, and nccl-tests' bandwidth definitions.

A message of ``m`` bytes costs ``alpha + m * beta``; reducing ``m`` bytes (combining two arrays
of ``m`` bytes elementwise) costs ``m * gamma`` on the rank that combines (Thakur, Rabenseifner
and Gropp 2005; the simulator's ``Device.gamma``, default 0). So, for example, the ring
all-reduce costs ``2 (p - 1) alpha + 2 (p - 1) / p n beta + (p - 1) / p n gamma``, recursive
doubling ``log2 p (alpha + n beta + n gamma)`` and Rabenseifner ``2 log2 p alpha +
2 (p - 1) / p n beta + (p - 1) / p n gamma``. ``gamma=0`` (the default) gives the alpha-beta
costs. ``n`` is the collective's size in bytes as
nccl-tests counts it: the buffer for all-reduce, broadcast and reduce; the *whole* gathered or
scattered buffer (all ranks' parts) for reduce-scatter, all-gather, gather and scatter; one
rank's send buffer for all-to-all.

The formulas are exact in the simulator's model when ``n`` divides evenly, ``p`` is a power of
two where the algorithm folds (recursive doubling, Rabenseifner, halving) and no two concurrent
messages share a link direction: the ring algorithms on a ring, the others on a fully connected
topology. ``tree`` and ``double_tree`` use the depth of the trees
:func:`.trees.tree_links` builds. With ``gamma > 0`` the binomial reduce's
``ceil(log2 p) (alpha + n beta + n gamma)`` is exact for ``p`` a power of two (otherwise a
bound: a rank's combine can overlap a later child's message), and the pipelined trees have no
closed form (a node's combine overlaps its children's next sends, so how much of it shows
depends on ``gamma`` against ``alpha + m beta``): their time is the critical path of the
algorithm's step schedule over the trees, computed step by step.

``one_port=True`` gives the costs of the one-port model (``sim.Cluster(one_port=True)``; a rank
sends one message and receives one message at a time), the model of the classic cost tables:
binomial broadcast, reduce, gather and scatter cost ``ceil(log2 p)`` rounds for *any* ``p``
(without the port limit a rank of a non-power-of-two binomial tree takes several messages at
once and beats it), and the "direct" gather, scatter and all-to-all pay ``p - 1`` messages in
turn at the root. The one-port model has no closed form here for ``tree``/``double_tree``
(a node hears its two children in turn, interleaved with the pipeline).

Bandwidths (nccl-tests, ``PERFORMANCE.md``): algorithm bandwidth ``algbw = n / t``; bus
bandwidth ``busbw = algbw * factor``, the factor making busbw comparable with the hardware's
link bandwidth whatever ``p``: ``2 (p - 1) / p`` for all-reduce, ``(p - 1) / p`` for
reduce-scatter, all-gather, gather, scatter and all-to-all, ``1`` for broadcast and reduce.
"""

from __future__ import annotations

import math

from ...errors import ArgumentError
from .common import ALGORITHMS
from .trees import tree_links

__all__ = ["BUS_FACTOR", "algbw", "best_algorithm", "busbw", "collective_time"]

BUS_FACTOR = {
    "allreduce": lambda p: 2 * (p - 1) / p,
    "reduce_scatter": lambda p: (p - 1) / p,
    "allgather": lambda p: (p - 1) / p,
    "gather": lambda p: (p - 1) / p,
    "scatter": lambda p: (p - 1) / p,
    "alltoall": lambda p: (p - 1) / p,
    "broadcast": lambda p: 1.0,
    "reduce": lambda p: 1.0,
}


def _log2(p):
    return math.ceil(math.log2(p)) if p > 1 else 0


def _fold_extra(p, message):
    """Cost of folding a non-power-of-two ``p`` (two extra full messages), else 0."""
    return 0.0 if p & (p - 1) == 0 else 2 * message


def _tree_time(p, n, alpha, beta, algo, segments, gamma=0.0):
    trees = tree_links(p, algo)
    share = n / len(trees) / segments
    height = max(max(h) for *_, h, _ in trees)
    depth = max(max(d) for *_, d in trees)
    if gamma:
        return _tree_schedule(trees, segments, height, depth, alpha + share * beta,
                              share * gamma)
    return (2 * (segments - 1) + height + depth) * (alpha + share * beta)


def _tree_schedule(trees, k, height, depth, step, combine):
    """The pipelined tree all-reduce's critical path (``trees.tree_allreduce``'s
    steps): in each step a rank posts its sends and receives together; they are done once its
    own messages have arrived (``step`` after it posted) and the ones it receives have (``step``
    after their sender posted them, maybe in an earlier step); going up it then combines what
    it received, ``combine`` seconds per segment."""
    p = len(trees[0][0])
    post = [0.0] * p
    arrival = {}  # (tree, sender, segment) -> when it arrived
    for g in range(k - 1 + height):  # up: a rank of height h sends segment g - h to its parent
        ready, reduced = list(post), [0] * p
        for t, (parent, _, _, level, _) in enumerate(trees):
            for r in range(p):
                if parent[r] is not None and 0 <= g - level[r] < k:
                    arrival[t, r, g - level[r]] = post[r] + step
                    ready[r] = max(ready[r], post[r] + step)
        for t, (_, children, _, level, _) in enumerate(trees):
            for r in range(p):
                j = g - level[r] + 1  # ... and receives segment j from its children
                if 0 <= j < k:
                    for c in children[r]:
                        ready[r] = max(ready[r], arrival[t, c, j])
                        reduced[r] += 1
        post = [ready[r] + reduced[r] * combine for r in range(p)]
    for g in range(k - 1 + depth):  # down: depth d sends segment g - d to its children
        ready = list(post)
        for _, children, _, _, level in trees:
            for r in range(p):
                if children[r] and 0 <= g - level[r] < k:
                    ready[r] = max(ready[r], post[r] + step)
                    for c in children[r]:  # who receive it in this very step
                        ready[c] = max(ready[c], post[r] + step)
        post = ready
    return max(post)


def _allreduce(algo, p, n, a, b, segments, g=0.0):
    t = lambda m: a + m * b
    q = 1 << (p.bit_length() - 1)
    fold = _fold_extra(p, t(n)) + (0.0 if p == q else n * g)  # the folded rank's combine
    if algo == "ring":
        return 2 * (p - 1) * t(n / p) + (p - 1) / p * n * g
    if algo in ("tree", "double_tree"):
        return _tree_time(p, n, a, b, algo, segments, g)
    if algo == "recursive_doubling":
        return int(math.log2(q)) * (t(n) + n * g) + fold
    return 2 * int(math.log2(q)) * a + 2 * (q - 1) / q * n * b + (q - 1) / q * n * g + fold


def _rooted(kind, algo, p, n, a, b, segments, one_port, g=0.0):
    t = lambda m: a + m * b
    if one_port and (kind, algo) in (("gather", "direct"), ("scatter", "direct")):
        return (p - 1) * t(n / p)
    if one_port and (kind, algo) == ("reduce", "ring"):
        return 2 * (p - 1) * t(n / p) + (p - 1) / p * n * g
    if kind == "reduce" and algo == "binomial":
        return _log2(p) * (t(n) + n * g)
    if kind == "broadcast" and algo == "binomial":
        return _log2(p) * t(n)
    if kind == "broadcast" and algo == "ring":
        return (p + segments - 2) * t(n / segments)
    if kind == "broadcast":  # scatter_allgather
        return _log2(p) * a + (p - 1) * t(n / p) + (p - 1) / p * n * b
    if kind == "reduce":  # ring reduce-scatter, then every block to the root at once
        return p * t(n / p) + (p - 1) / p * n * g
    if algo == "binomial":  # gather, scatter
        return _log2(p) * a + (p - 1) / p * n * b
    return t(n / p)  # direct gather / scatter: all blocks at once


def collective_time(kind, algo, p, n, alpha, beta, segments=1, one_port=False, gamma=0.0):
    """Alpha-beta-gamma time (seconds) of collective ``kind`` by ``algo`` on ``p`` ranks.

    Args:
        kind: ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``,
            ``gather``, ``scatter`` or ``alltoall``.
        algo: one of ``collectives.ALGORITHMS[kind]``.
        p: ranks. n: bytes (module docstring). alpha: seconds. beta: seconds per byte.
        segments: pipeline depth (trees, ring broadcast).
        one_port: the one-port model's cost (module docstring).
        gamma: seconds per byte reduced (0: the alpha-beta cost). Only the reducing
            collectives (all-reduce, reduce-scatter, reduce) pay it.
    """
    where = "collective_time"
    if kind not in ALGORITHMS:
        raise ArgumentError(f"{where}: kind={kind!r} is not one of {sorted(ALGORITHMS)}")
    if algo not in ALGORITHMS[kind]:
        raise ArgumentError(f"{where}: algo={algo!r} is not one of {list(ALGORITHMS[kind])}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ArgumentError(f"{where}: p={p!r} must be an int >= 1")
    if not (n >= 0 and alpha >= 0 and beta >= 0 and gamma >= 0):
        raise ArgumentError(f"{where}: n, alpha, beta and gamma must be >= 0, got {n}, {alpha}, "
                            f"{beta}, {gamma}")
    if one_port and algo in ("tree", "double_tree"):
        raise ArgumentError(f"{where}: no one-port formula for algo={algo!r}")
    if p == 1:
        return 0.0
    t = lambda m: alpha + m * beta
    if kind == "allreduce":
        return _allreduce(algo, p, n, alpha, beta, segments, gamma)
    if kind in ("reduce_scatter", "allgather"):
        g = gamma if kind == "reduce_scatter" else 0.0
        if algo == "ring":
            return (p - 1) * t(n / p) + (p - 1) / p * n * g
        return _log2(p) * alpha + (p - 1) / p * n * beta + (p - 1) / p * n * g
    if kind == "alltoall":
        return (p - 1) * t(n / p) if algo == "pairwise" or one_port else t(n / p)
    return _rooted(kind, algo, p, n, alpha, beta, segments, one_port, gamma)


def algbw(n, seconds):
    """Algorithm bandwidth ``n / t`` in bytes per second (nccl-tests)."""
    if not seconds > 0:
        raise ArgumentError(f"algbw: seconds={seconds!r} must be > 0")
    return n / seconds


def busbw(kind, n, seconds, p):
    """Bus bandwidth: :func:`algbw` times the collective's factor (module docstring)."""
    if kind not in BUS_FACTOR:
        raise ArgumentError(f"busbw: kind={kind!r} is not one of {sorted(BUS_FACTOR)}")
    return algbw(n, seconds) * BUS_FACTOR[kind](p)


def best_algorithm(kind, p, n, alpha, beta, one_port=False, gamma=0.0):
    """``(algo, seconds)`` of the cheapest algorithm for ``kind`` by the formulas above."""
    times = {algo: collective_time(kind, algo, p, n, alpha, beta, one_port=one_port,
                                   gamma=gamma)
             for algo in ALGORITHMS[kind]
             if not (one_port and algo in ("tree", "double_tree"))}
    best = min(times, key=times.get)
    return best, times[best]
