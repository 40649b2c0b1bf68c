"""Alpha-beta cost formulas for the collectives, and nccl-tests' bandwidth definitions.

A message of ``m`` bytes costs ``alpha + m * beta``. ``n`` is the collective's size in bytes as
nccl-tests counts it: the buffer for all-reduce, broadcast and reduce; the *whole* gathered or
scattered buffer (all ranks' parts) for reduce-scatter, all-gather, gather and scatter; one
rank's send buffer for all-to-all.

The formulas are exact in the simulator's model when ``n`` divides evenly, ``p`` is a power of
two where the algorithm folds (recursive doubling, Rabenseifner, halving) and no two concurrent
messages share a link direction: the ring algorithms on a ring, the others on a fully connected
topology. ``tree`` and ``double_tree`` use the depth of the trees
:func:`.collectives.tree_links` builds.

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

from ..errors import ArgumentError
from .collectives import ALGORITHMS, tree_links

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


def _tree_time(p, n, alpha, beta, algo, segments):
    trees = tree_links(p, algo)
    share = n / len(trees) / segments
    height = max(max(h) for *_, h, _ in trees)
    depth = max(max(d) for *_, d in trees)
    return (2 * (segments - 1) + height + depth) * (alpha + share * beta)


def _allreduce(algo, p, n, a, b, segments):
    t = lambda m: a + m * b
    q = 1 << (p.bit_length() - 1)
    if algo == "ring":
        return 2 * (p - 1) * t(n / p)
    if algo in ("tree", "double_tree"):
        return _tree_time(p, n, a, b, algo, segments)
    if algo == "recursive_doubling":
        return int(math.log2(q)) * t(n) + _fold_extra(p, t(n))
    return 2 * int(math.log2(q)) * a + 2 * (q - 1) / q * n * b + _fold_extra(p, t(n))


def _rooted(kind, algo, p, n, a, b, segments, one_port):
    t = lambda m: a + m * b
    if one_port and (kind, algo) in (("gather", "direct"), ("scatter", "direct")):
        return (p - 1) * t(n / p)
    if one_port and (kind, algo) == ("reduce", "ring"):
        return 2 * (p - 1) * t(n / p)
    if kind in ("broadcast", "reduce") and algo == "binomial":
        return _log2(p) * t(n)
    if kind == "broadcast" and algo == "ring":
        return (p + segments - 2) * t(n / segments)
    if kind == "broadcast":  # scatter_allgather
        return _log2(p) * a + (p - 1) * t(n / p) + (p - 1) / p * n * b
    if kind == "reduce":  # ring reduce-scatter, then every block to the root at once
        return p * t(n / p)
    if algo == "binomial":  # gather, scatter
        return _log2(p) * a + (p - 1) / p * n * b
    return t(n / p)  # direct gather / scatter: all blocks at once


def collective_time(kind, algo, p, n, alpha, beta, segments=1, one_port=False):
    """Alpha-beta time (seconds) of collective ``kind`` by ``algo`` on ``p`` ranks.

    Args:
        kind: ``allreduce``, ``reduce_scatter``, ``allgather``, ``broadcast``, ``reduce``,
            ``gather``, ``scatter`` or ``alltoall``.
        algo: one of ``collectives.ALGORITHMS[kind]``.
        p: ranks. n: bytes (module docstring). alpha: seconds. beta: seconds per byte.
        segments: pipeline depth (trees, ring broadcast).
        one_port: the one-port model's cost (module docstring).
    """
    where = "collective_time"
    if kind not in ALGORITHMS:
        raise ArgumentError(f"{where}: kind={kind!r} is not one of {sorted(ALGORITHMS)}")
    if algo not in ALGORITHMS[kind]:
        raise ArgumentError(f"{where}: algo={algo!r} is not one of {list(ALGORITHMS[kind])}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise ArgumentError(f"{where}: p={p!r} must be an int >= 1")
    if not (n >= 0 and alpha >= 0 and beta >= 0):
        raise ArgumentError(f"{where}: n, alpha and beta must be >= 0, got {n}, {alpha}, {beta}")
    if one_port and algo in ("tree", "double_tree"):
        raise ArgumentError(f"{where}: no one-port formula for algo={algo!r}")
    if p == 1:
        return 0.0
    t = lambda m: alpha + m * beta
    if kind == "allreduce":
        return _allreduce(algo, p, n, alpha, beta, segments)
    if kind in ("reduce_scatter", "allgather"):
        if algo == "ring":
            return (p - 1) * t(n / p)
        return _log2(p) * alpha + (p - 1) / p * n * beta
    if kind == "alltoall":
        return (p - 1) * t(n / p) if algo == "pairwise" or one_port else t(n / p)
    return _rooted(kind, algo, p, n, alpha, beta, segments, one_port)


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


def best_algorithm(kind, p, n, alpha, beta, one_port=False):
    """``(algo, seconds)`` of the cheapest algorithm for ``kind`` by the formulas above."""
    times = {algo: collective_time(kind, algo, p, n, alpha, beta, one_port=one_port)
             for algo in ALGORITHMS[kind]
             if not (one_port and algo in ("tree", "double_tree"))}
    best = min(times, key=times.get)
    return best, times[best]
