"""Rooted collectives: broadcast, scatter, reduce and gather."""

from __future__ import annotations

import numpy as np

from ...errors import ArgumentError, ShapeError
from .all_reduce import ring_allgather_blocks, ring_reduce_scatter
from .common import (
    as_array,
    as_flat,
    as_rows,
    block_bounds,
    charge,
    check_algo,
    check_root,
    check_segments,
    check_trailing,
    combine,
    concat,
    exchange,
    recv,
    send,
    ufunc_of,
)
from .trees import binomial_tree


def broadcast(comm, x, root=0, algo="binomial", segments=1):
    """Every rank gets the root's ``x``. Other ranks may pass ``None`` (``scatter_allgather``
    needs an array of the root's shape and dtype there, for the sizes)."""
    where = f"broadcast(algo={algo!r})"
    algo, root = check_algo("broadcast", algo, where), check_root(comm, root, where)
    segments = check_segments(segments, where)
    p, r = comm.size, comm.rank
    if r == root or algo == "scatter_allgather":
        x = as_array(x, where)
    if p == 1:
        return x.copy()
    v = (r - root) % p
    if algo == "binomial":
        return (yield from _binomial_bcast(comm, x if v == 0 else None, v, root))
    if algo == "ring":
        return (yield from _chain_bcast(comm, x if v == 0 else None, v, root, segments))
    flat = as_flat(x)
    bounds = block_bounds(flat.shape[0], p)
    mine = yield from _scatter_known(comm, flat if v == 0 else None, bounds, root)
    blocks = [None] * p
    blocks[r] = mine
    blocks = yield from ring_allgather_blocks(comm, blocks)
    return concat(blocks).reshape(x.shape)


def _binomial_bcast(comm, x, v, root):
    p = comm.size
    parent, children, _ = binomial_tree(p)
    if parent[v] is not None:
        x = yield recv(comm, (parent[v] + root) % p)
    for child in reversed(children[v]):  # the largest subtree first
        yield send(comm, x, (child + root) % p)
    return x


def _chain_bcast(comm, x, v, root, segments):
    """Pipelined chain along the ring; segments split axis 0, so shapes survive."""
    p = comm.size
    nxt, prev = (v + 1 + root) % p, (v - 1 + root) % p
    if v == 0:
        rows = as_rows(x)
        pieces = [rows[a:b] for a, b in block_bounds(len(rows), segments)]
        if x.ndim == 0:  # a 0-d value travels whole in the first segment
            pieces[0] = x
    else:
        pieces = [None] * segments
    for s in range(segments + 1):
        sends = [(pieces[s - 1], nxt)] if s >= 1 and v < p - 1 else []
        srcs = [prev] if s < segments and v > 0 else []
        got = yield exchange(comm, sends, srcs)
        if srcs:
            pieces[s] = got[0]
    if v == 0:
        return x.copy()
    return pieces[0] if pieces[0].ndim == 0 or len(pieces) == 1 else concat(pieces)


def _binomial_scatter(comm, data, v, root, offsets):
    """Binomial scatter down the tree (:func:`.trees.binomial_tree`): ``data`` at
    the root holds every rank's rows in relative-rank order; ``offsets(piece)`` gives the
    starting row of each relative rank (``p + 1`` entries) from the piece this rank got."""
    p = comm.size
    parent, children, span = binomial_tree(p)
    if parent[v] is not None:
        data = yield recv(comm, (parent[v] + root) % p)
    off = offsets(data)
    for child in reversed(children[v]):  # the largest subtree first
        piece = data[off[child] - off[v]:off[child + span[child]] - off[v]]
        yield send(comm, piece, (child + root) % p)
    return data[:off[v + 1] - off[v]]


def _scatter_known(comm, flat, bounds, root):
    """Binomial scatter of ``flat`` (at the root) when every rank knows ``bounds``."""
    p = comm.size
    v = (comm.rank - root) % p
    lengths = [bounds[(u + root) % p][1] - bounds[(u + root) % p][0] for u in range(p)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    data = None
    if v == 0:  # lay the root's blocks out in relative-rank order
        data = concat([flat[bounds[(u + root) % p][0]:bounds[(u + root) % p][1]]
                        for u in range(p)])
    return (yield from _binomial_scatter(comm, data, v, root, lambda _: offsets))


def scatter(comm, x, root=0, algo="binomial"):
    """Rank ``r`` gets block ``r`` (along axis 0, :func:`block_bounds`) of the root's ``x``;
    other ranks pass ``None``. ``binomial`` needs ``len(x)`` divisible by ``p``."""
    where = f"scatter(algo={algo!r})"
    algo, root = check_algo("scatter", algo, where), check_root(comm, root, where)
    p, r = comm.size, comm.rank
    if r == root:
        x = as_rows(as_array(x, where))
        bounds = block_bounds(x.shape[0], p)
    if p == 1:
        return x.copy()
    if algo == "direct":
        if r == root:
            sends = [(x[a:b], d) for d, (a, b) in enumerate(bounds) if d != root]
            yield exchange(comm, sends, [])
            a, b = bounds[root]
            return x[a:b].copy()
        return (yield recv(comm, root))
    if r == root and x.shape[0] % p:
        raise ArgumentError(f"{where}: len(x)={x.shape[0]} is not divisible by {p} ranks "
                            f"(use algo='direct')")
    v = (r - root) % p
    data, span = None, binomial_tree(p)[2][v]
    if v == 0:
        rows = x.shape[0] // p
        data = concat([x[((u + root) % p) * rows:((u + root) % p + 1) * rows]
                        for u in range(p)])

    def offsets(piece):
        rows = piece.shape[0] // span
        return [u * rows for u in range(p + 1)]

    return (yield from _binomial_scatter(comm, data, v, root, offsets))


def reduce(comm, x, root=0, op="sum", algo="binomial"):
    """The root gets the reduction of every rank's ``x``; the others get ``None``."""
    where = f"reduce(algo={algo!r})"
    fn, algo = ufunc_of(op, where), check_algo("reduce", algo, where)
    root, x = check_root(comm, root, where), as_array(x, where)
    p, r = comm.size, comm.rank
    if p == 1:
        return x.copy()
    v = (r - root) % p
    if algo == "binomial":
        parent, children, _ = binomial_tree(p)
        acc = x
        for child in children[v]:  # the smallest subtree first
            src = (child + root) % p
            got = yield recv(comm, src)
            acc = combine(fn, got, acc, where, comm, src)
            yield from charge(comm, acc.nbytes)
        if parent[v] is not None:
            yield send(comm, acc, (parent[v] + root) % p)
            return None
        return acc
    blocks = yield from ring_reduce_scatter(comm, as_flat(x), fn, where)
    if r != root:
        yield send(comm, blocks[r], root)
        return None
    others = [d for d in range(p) if d != root]
    got = yield exchange(comm, [], others)
    for d, value in zip(others, got):
        blocks[d] = value
    return concat(blocks).reshape(x.shape)


def gather(comm, x, root=0, algo="binomial"):
    """The root gets every rank's ``x`` concatenated along axis 0 in rank order; the others
    get ``None``. ``binomial`` needs equal shapes."""
    where = f"gather(algo={algo!r})"
    algo, root = check_algo("gather", algo, where), check_root(comm, root, where)
    x = as_rows(as_array(x, where))
    p, r = comm.size, comm.rank
    if p == 1:
        return x.copy()
    if algo == "direct":
        if r != root:
            yield send(comm, x, root)
            return None
        others = [d for d in range(p) if d != root]
        got = yield exchange(comm, [], others)
        blocks = dict(zip(others, got))
        blocks[root] = x
        ordered = [blocks[d] for d in range(p)]
        check_trailing(ordered, comm, where)
        return concat(ordered)
    v = (r - root) % p
    parent, children, span = binomial_tree(p)
    acc, rows = x, x.shape[0]
    for child in children[v]:  # the smallest subtree first
        src = (child + root) % p
        got = yield recv(comm, src)
        expect = (span[child] * rows, *x.shape[1:])
        if as_rows(got).shape != expect:
            raise ShapeError(f"{where}: rank {r} received shape {got.shape} from rank {src}, "
                             f"expected {expect}: binomial gather needs equal shapes (use "
                             f"algo='direct')")
        acc = concat([acc, got])
    if parent[v] is not None:
        yield send(comm, acc, (parent[v] + root) % p)
        return None
    shift = (p - root) % p * rows  # relative order starts at the root: rotate to rank order
    return concat([acc[shift:], acc[:shift]])
