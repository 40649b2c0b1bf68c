"""Collective communication as generator functions over a :class:`~..comm.Communicator`.

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

Modules: :mod:`.all_reduce` (all-reduce, reduce-scatter, all-gather, ``ring_plan``),
:mod:`.rooted` (broadcast, scatter, reduce, gather), :mod:`.all_to_all` (all-to-all, barrier),
:mod:`.trees` (the trees), :mod:`.common` (ops, tags, ``ALGORITHMS``, ``block_bounds``, the
helpers the modules share) and :mod:`.cost` (the alpha-beta(-gamma) time of each of them).
"""

from __future__ import annotations

from . import cost
from .all_reduce import allgather, allreduce, reduce_scatter, ring_plan
from .all_to_all import alltoall, barrier
from .common import ALGORITHMS, OPS, block_bounds
from .rooted import broadcast, gather, reduce, scatter
from .trees import binomial_tree, tree_links

__all__ = ["ALGORITHMS", "OPS", "allgather", "allreduce", "alltoall", "barrier", "binomial_tree",
           "block_bounds", "broadcast", "cost", "gather", "reduce", "reduce_scatter", "ring_plan",
           "scatter", "tree_links"]
