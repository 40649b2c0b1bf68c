"""All-reduce (ring, trees, recursive doubling, Rabenseifner), reduce-scatter and all-gather.

(The module is ``all_reduce``, not ``allreduce``, so that it never shadows the function
``collectives.allreduce``.)"""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from .common import (
    OPS,
    as_array,
    as_flat,
    as_rows,
    block_bounds,
    charge,
    check_algo,
    check_segments,
    check_trailing,
    combine,
    concat,
    is_symbolic,
    need_power_of_two,
    recv,
    send,
    sendrecv,
    ufunc_of,
)
from .trees import complementary_trees, tree_allreduce


def allreduce(comm, x, op="sum", algo="ring", segments=1):
    """Every rank gets the elementwise reduction of every rank's ``x`` (same shape).

    Args:
        comm: the communicator. x: this rank's array (the same shape and dtype everywhere).
        op: ``sum``, ``prod``, ``max`` or ``min``. algo: see the module table.
        segments: pipeline depth of ``tree`` / ``double_tree``.
    """
    where = f"allreduce(algo={algo!r})"
    fn, algo = ufunc_of(op, where), check_algo("allreduce", algo, where)
    x, segments = as_array(x, where), check_segments(segments, where)
    if comm.size == 1:
        return x.copy()
    if algo == "ring":
        flow = ring_allreduce(comm, x, fn, where)
        if comm.supports_batching:
            return (yield comm.batched("allreduce/ring", x, op, flow, ring_plan))
        return (yield from flow)
    if algo in ("tree", "double_tree"):
        flat = as_flat(x)
        trees = complementary_trees(comm.size, 2 if algo == "double_tree" else 1)
        return (yield from tree_allreduce(comm, flat, fn, trees, segments, where)).reshape(
            x.shape)
    if algo == "recursive_doubling":
        body = _recursive_doubling_body
    else:
        body = _rabenseifner_body
    return (yield from _folded(comm, as_flat(x), fn, body, where)).reshape(x.shape)


def ring_reduce_scatter(comm, flat, fn, where):
    """Ring reduce-scatter in place over ``p`` blocks; afterwards block ``rank`` is reduced."""
    p, r = comm.size, comm.rank
    bounds = block_bounds(flat.shape[0], p)
    blocks = [flat[a:b] for a, b in bounds]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send_idx, recv_idx = (r - s - 1) % p, (r - s - 2) % p
        got = yield sendrecv(comm, blocks[send_idx], right, left)
        blocks[recv_idx] = combine(fn, got, blocks[recv_idx], where, comm, left)
        yield from charge(comm, blocks[recv_idx].nbytes)
    return blocks


def ring_allgather_blocks(comm, blocks):
    """Ring all-gather of ``p`` blocks in place: rank ``r`` starts with block ``r`` filled and
    ends with every block (the second half of the ring all-reduce)."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        blocks[(r - s - 1) % p] = yield sendrecv(comm, blocks[(r - s) % p], right, left)
    return blocks


def ring_allreduce(comm, x, fn, where):
    """The ring all-reduce of ``x`` with the ufunc ``fn``: a ring reduce-scatter, then a ring
    all-gather, ``2 (p - 1)`` steps of one block each; what ``allreduce(algo="ring")`` runs."""
    flat = as_flat(x)
    if is_symbolic(flat):
        blocks = yield from ring_reduce_scatter(comm, flat, fn, where)
        blocks = yield from ring_allgather_blocks(comm, blocks)
        return concat(blocks).reshape(x.shape)
    # Real data: every piece lands straight in the output buffer (no temporaries; under MPI
    # fresh memory costs page faults). Block i arrives once in the reduce-scatter, into
    # out[i], and is reduced there with this rank's own x[i].
    p, r = comm.size, comm.rank
    bounds = block_bounds(flat.shape[0], p)
    out = np.empty_like(flat)
    held = [flat[a:b] for a, b in bounds]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send_idx, recv_idx = (r - s - 1) % p, (r - s - 2) % p
        a, b = bounds[recv_idx]
        got = yield sendrecv(comm, held[send_idx], right, left, out=out[a:b])
        fn(got, held[recv_idx], out=got)
        held[recv_idx] = got
        yield from charge(comm, got.nbytes)
    for s in range(p - 1):
        a, b = bounds[(r - s - 1) % p]
        yield sendrecv(comm, held[(r - s) % p], right, left, out=out[a:b])
        held[(r - s - 1) % p] = out[a:b]
    return out.reshape(x.shape)


def ring_plan(arrays, op):
    """The ring all-reduce of ``arrays`` (one per rank) done at once, for the simulator's
    batched path: ``(results, step_bytes)`` where ``step_bytes[s, r]`` is what rank ``r`` sends
    in step ``s``. The reduction follows the ring's own order, so values match the message-by-
    message run bit for bit. ``None`` when the inputs disagree (the fallback reports it)."""
    p, first = len(arrays), arrays[0]
    symbolic = is_symbolic(first)
    if any(is_symbolic(a) != symbolic or a.size != first.size or a.dtype != first.dtype
           for a in arrays):
        return None
    bounds = block_bounds(first.size, p)
    lengths = np.array([b - a for a, b in bounds], dtype=np.int64)
    ranks = np.arange(p)
    item = first.dtype.itemsize
    reduce_steps = [lengths[(ranks - s - 1) % p] * item for s in range(p - 1)]
    gather_steps = [lengths[(ranks - s) % p] * item for s in range(p - 1)]
    step_bytes = np.array(reduce_steps + gather_steps, dtype=np.int64).reshape(-1, p)
    if symbolic:
        return [a.copy() for a in arrays], step_bytes
    fn = OPS[op]
    flats = [as_flat(a) for a in arrays]
    reduced = []
    for c, (a, b) in enumerate(bounds):
        acc = flats[(c + 1) % p][a:b]
        for k in range(2, p + 1):
            acc = fn(acc, flats[(c + k) % p][a:b])
        reduced.append(acc)
    total = np.concatenate(reduced)
    return [total.reshape(arr.shape).copy() for arr in arrays], step_bytes


def _folded(comm, flat, fn, body, where):
    """Fold ``p`` onto the largest power of two ``q``, run ``body`` on the ``q`` survivors,
    unfold (MPICH's scheme): ranks ``< 2 * (p - q)`` pair up, the even one hands its data to
    the odd one and gets the result back at the end."""
    p, r = comm.size, comm.rank
    q = 1 << (p.bit_length() - 1)
    extra = p - q
    if r < 2 * extra:
        if r % 2 == 0:
            yield send(comm, flat, r + 1)
            return (yield recv(comm, r + 1))
        got = yield recv(comm, r - 1)
        flat = combine(fn, got, flat, where, comm, r - 1)
        yield from charge(comm, flat.nbytes)
        virtual = r // 2
    else:
        virtual = r - extra

    def real(v):
        return 2 * v + 1 if v < extra else v + extra

    flat = yield from body(comm, flat, fn, virtual, q, real, where)
    if r < 2 * extra:
        yield send(comm, flat, r - 1)
    return flat


def _recursive_doubling_body(comm, flat, fn, virtual, q, real, where):
    mask = 1
    while mask < q:
        peer = real(virtual ^ mask)
        got = yield sendrecv(comm, flat, peer, peer)
        flat = combine(fn, got, flat, where, comm, peer)
        yield from charge(comm, flat.nbytes)
        mask <<= 1
    return flat


def _halving(comm, flat, fn, virtual, q, real, where):
    """Recursive halving over ``q`` blocks: returns ``(blocks, lo, hi)``, block ``virtual``
    reduced and ``lo..hi`` the block range this rank holds."""
    bounds = block_bounds(flat.shape[0], q)
    lo, hi, mask = 0, q, q >> 1
    part = flat
    while mask:
        peer_v = virtual ^ mask
        mid = lo + (hi - lo) // 2
        keep, give = ((lo, mid), (mid, hi)) if virtual < peer_v else ((mid, hi), (lo, mid))
        base = bounds[lo][0]
        outgoing = part[bounds[give[0]][0] - base:bounds[give[1] - 1][1] - base]
        mine = part[bounds[keep[0]][0] - base:bounds[keep[1] - 1][1] - base]
        peer = real(peer_v)
        got = yield sendrecv(comm, outgoing, peer, peer)
        part = combine(fn, got, mine, where, comm, peer)
        yield from charge(comm, part.nbytes)
        lo, hi = keep
        mask >>= 1
    return part, lo, hi


def _doubling_gather(comm, part, virtual, q, real, where, equal_rows=None):
    """Recursive doubling all-gather of contiguous pieces: ``part`` is this rank's piece
    (rows ``virtual``); returns the whole in virtual-rank order."""
    mask = 1
    while mask < q:
        peer_v = virtual ^ mask
        peer = real(peer_v)
        got = yield sendrecv(comm, part, peer, peer)
        if equal_rows is not None and as_rows(got).shape != (mask * equal_rows, *part.shape[1:]):
            raise ShapeError(f"{where}: rank {comm.rank} received shape {got.shape} from rank "
                             f"{peer}, expected {(mask * equal_rows, *part.shape[1:])}: this "
                             f"algorithm needs every rank's array to have the same shape "
                             f"(use algo='ring')")
        part = concat([part, got] if virtual < peer_v else [got, part])
        mask <<= 1
    return part


def _rabenseifner_body(comm, flat, fn, virtual, q, real, where):
    part, _, _ = yield from _halving(comm, flat, fn, virtual, q, real, where)
    return (yield from _doubling_gather(comm, part, virtual, q, real, where))


def reduce_scatter(comm, x, op="sum", algo="ring"):
    """Reduce every rank's ``x`` and give rank ``r`` block ``r`` of the flattened result
    (blocks by :func:`block_bounds`)."""
    where = f"reduce_scatter(algo={algo!r})"
    fn, algo = ufunc_of(op, where), check_algo("reduce_scatter", algo, where)
    flat = as_flat(as_array(x, where))
    if comm.size == 1:
        return flat.copy()
    if algo == "ring":
        blocks = yield from ring_reduce_scatter(comm, flat, fn, where)
        return blocks[comm.rank]
    need_power_of_two(comm, where)
    part, _, _ = yield from _halving(comm, flat, fn, comm.rank, comm.size, lambda v: v, where)
    return part


def allgather(comm, x, algo="ring"):
    """Every rank gets every rank's ``x`` concatenated along axis 0, in rank order."""
    where = f"allgather(algo={algo!r})"
    algo = check_algo("allgather", algo, where)
    x = as_rows(as_array(x, where))
    if comm.size == 1:
        return x.copy()
    if algo == "ring":
        blocks = [None] * comm.size
        blocks[comm.rank] = x
        blocks = yield from ring_allgather_blocks(comm, blocks)
        check_trailing(blocks, comm, where)
        return concat(blocks)
    need_power_of_two(comm, where)
    return (yield from _doubling_gather(comm, x, comm.rank, comm.size, lambda v: v, where,
                                        equal_rows=x.shape[0]))
