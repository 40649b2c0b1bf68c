"""Collective communication as generator functions over a :class:`~.comm.Communicator`.

Every collective is called on every rank of the communicator, in the same order, and composed
with ``yield from``::

    total = yield from allreduce(comm, grad, op="sum", algo="ring")

so the same code runs in the simulator and under MPI. Chunks move as real arrays; reductions
apply numpy ufuncs (``op``: ``sum``, ``prod``, ``max``, ``min``) in the algorithm's own order,
and after each combine the rank is charged ``gamma`` seconds per byte combined as compute
(its simulated device's ``gamma``, default 0; nothing under MPI, where the ufunc itself
takes the time).

Data layout: all-reduce, reduce and broadcast keep the input's shape. Reduce-scatter splits the
*flattened* input into ``p`` blocks (``block_bounds``: the first ``n % p`` blocks one element
longer, like ``np.array_split``) and returns block ``rank``. All-gather and gather concatenate
the ranks' arrays along axis 0 (a 0-d array counts as shape ``(1,)``); scatter and all-to-all
split along axis 0 the same way.

Algorithms (``algo=``) and where they need more than any ``p``:

=================  ====================================================================
all-reduce         ring, tree (binary, NCCL-style in-order tree), double_tree (two
                   complementary binary trees, half the data each), recursive_doubling,
                   rabenseifner (recursive halving + doubling); the last two fold a
                   non-power-of-two ``p`` onto the largest power of two first
reduce-scatter     ring, recursive_halving (``p`` a power of two)
all-gather         ring, recursive_doubling (``p`` a power of two, equal shapes)
broadcast          binomial, ring (a pipelined chain), scatter_allgather (van de Geijn;
                   every rank passes an array of the right shape)
reduce             binomial, ring (ring reduce-scatter, then the blocks to the root)
gather             binomial (equal shapes), direct
scatter            binomial (``len(x)`` divisible by ``p``), direct
all-to-all         pairwise, direct
=================  ====================================================================

``segments=k`` pipelines the tree algorithms and the ring broadcast in ``k`` pieces.
"""

from __future__ import annotations

import numpy as np

from .collective_allreduce import (  # noqa: F401
    allgather,
    allreduce,
    reduce_scatter,
    ring_plan,
)
from .collective_common import (  # noqa: F401
    ALGORITHMS,
    OPS,
    TAG,
    TAG_B,
    _algo,
    _array,
    _check_trailing,
    _concat,
    _exchange,
    _rows,
    _sendrecv,
    block_bounds,
)
from .collective_rooted import broadcast, gather, reduce, scatter
from .collective_trees import binomial_tree, tree_links

__all__ = ["ALGORITHMS", "OPS", "allgather", "allreduce", "alltoall", "barrier", "binomial_tree",
           "block_bounds", "broadcast", "gather", "reduce", "reduce_scatter", "ring_plan",
           "scatter", "tree_links"]


def alltoall(comm, x, algo="pairwise"):
    """Rank ``r`` sends block ``d`` of ``x`` (along axis 0, :func:`block_bounds`) to rank
    ``d`` and returns the blocks it received, concatenated in source-rank order."""
    where = f"alltoall(algo={algo!r})"
    algo = _algo("alltoall", algo, where)
    x = _rows(_array(x, where))
    p, r = comm.size, comm.rank
    bounds = block_bounds(x.shape[0], p)
    blocks = [x[a:b] for a, b in bounds]
    received = [None] * p
    received[r] = blocks[r].copy()
    if algo == "pairwise":
        for k in range(1, p):
            dst, src = (r + k) % p, (r - k) % p
            received[src] = yield _sendrecv(comm, blocks[dst], dst, src)
    elif p > 1:  # posted in the pairwise order, so one-port ranks never queue at a receiver
        others = [(r + k) % p for k in range(1, p)]
        srcs = [(r - k) % p for k in range(1, p)]
        got = yield _exchange(comm, [(blocks[d], d) for d in others], srcs)
        others = srcs
        for d, value in zip(others, got):
            received[d] = value
    _check_trailing(received, comm, where)
    return _concat(received)


def barrier(comm):
    """Wait until every rank has arrived (dissemination: ceil(log2 p) rounds)."""
    p, r, distance = comm.size, comm.rank, 1
    token = np.zeros(0, dtype=np.uint8)
    while distance < p:
        yield _sendrecv(comm, token, (r + distance) % p, (r - distance) % p)
        distance <<= 1
