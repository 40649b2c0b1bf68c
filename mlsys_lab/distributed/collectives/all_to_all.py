"""All-to-all (pairwise or direct) and the barrier (dissemination): the collectives that are
neither rooted nor a reduction."""

from __future__ import annotations

import numpy as np

from .common import (
    as_array,
    as_rows,
    block_bounds,
    check_algo,
    check_trailing,
    concat,
    exchange,
    sendrecv,
)

__all__ = ["alltoall", "barrier"]


def alltoall(comm, x, algo="pairwise"):
    """Rank ``r`` sends block ``d`` of ``x`` (along axis 0, :func:`block_bounds`) to rank
    ``d`` and returns the blocks it received, concatenated in source-rank order."""
    where = f"alltoall(algo={algo!r})"
    algo = check_algo("alltoall", algo, where)
    x = as_rows(as_array(x, where))
    p, r = comm.size, comm.rank
    bounds = block_bounds(x.shape[0], p)
    blocks = [x[a:b] for a, b in bounds]
    received = [None] * p
    received[r] = blocks[r].copy()
    if algo == "pairwise":
        for k in range(1, p):
            dst, src = (r + k) % p, (r - k) % p
            received[src] = yield sendrecv(comm, blocks[dst], dst, src)
    elif p > 1:  # posted in the pairwise order, so one-port ranks never queue at a receiver
        others = [(r + k) % p for k in range(1, p)]
        srcs = [(r - k) % p for k in range(1, p)]
        got = yield exchange(comm, [(blocks[d], d) for d in others], srcs)
        others = srcs
        for d, value in zip(others, got):
            received[d] = value
    check_trailing(received, comm, where)
    return concat(received)


def barrier(comm):
    """Wait until every rank has arrived (dissemination: ceil(log2 p) rounds)."""
    p, r, distance = comm.size, comm.rank, 1
    token = np.zeros(0, dtype=np.uint8)
    while distance < p:
        yield sendrecv(comm, token, (r + distance) % p, (r - distance) % p)
        distance <<= 1
