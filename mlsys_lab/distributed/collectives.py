"""Collective communication as generator functions over a :class:`~.comm.Communicator`.

Every collective is called on every rank of the communicator, in the same order, and composed
with ``yield from``::

    total = yield from allreduce(comm, grad, op="sum", algo="ring")

so the same code runs in the simulator and under MPI. Chunks move as real arrays; reductions
apply numpy ufuncs (``op``: ``sum``, ``prod``, ``max``, ``min``) in the algorithm's own order.

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

from ..errors import ArgumentError, DTypeError, ShapeError
from .comm import TAG_LIMIT

__all__ = ["ALGORITHMS", "OPS", "allgather", "allreduce", "alltoall", "barrier", "block_bounds",
           "broadcast", "gather", "reduce", "reduce_scatter", "ring_plan", "scatter",
           "tree_links"]

OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
TAG = TAG_LIMIT  # collectives' messages: one reserved tag (FIFO keeps their order)
TAG_B = TAG_LIMIT + 1  # the second tree of double_tree

ALGORITHMS = {
    "allreduce": ("ring", "tree", "double_tree", "recursive_doubling", "rabenseifner"),
    "reduce_scatter": ("ring", "recursive_halving"),
    "allgather": ("ring", "recursive_doubling"),
    "broadcast": ("binomial", "ring", "scatter_allgather"),
    "reduce": ("binomial", "ring"),
    "gather": ("binomial", "direct"),
    "scatter": ("binomial", "direct"),
    "alltoall": ("pairwise", "direct"),
}


# ------------------------------------------------------------------------------------ helpers
def _sendrecv(comm, array, dst, src, tag=TAG, out=None):
    return comm.sendrecv(array, dst, src, tag=tag, out=out, _internal=True)


def _send(comm, array, dst):
    return comm.send(array, dst, tag=TAG, _internal=True)


def _recv(comm, src):
    return comm.recv(src, tag=TAG, _internal=True)


def _exchange(comm, sends, srcs, tag=TAG):
    return comm.exchange(sends, srcs, tag=tag, _internal=True)


def block_bounds(n, p):
    """``[(start, stop)]`` of ``p`` blocks covering ``range(n)``; the first ``n % p`` are one
    longer (``np.array_split``'s rule)."""
    base, extra = divmod(int(n), int(p))
    bounds, start = [], 0
    for b in range(p):
        stop = start + base + (1 if b < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _is_symbolic(x):
    return hasattr(x, "__mlsys_symbolic__")


def _array(x, where):
    if x is None:
        raise ArgumentError(f"{where}: got None where this rank must pass an array")
    if _is_symbolic(x) or isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def _flat(x):
    return x.reshape(-1)


def _rows(x):
    return x.reshape(1) if x.ndim == 0 else x


def _concat(parts):
    if any(_is_symbolic(p) for p in parts):
        from .sim import SymbolicArray

        first = parts[0]
        return SymbolicArray((sum(p.shape[0] for p in parts), *first.shape[1:]), first.dtype)
    return np.concatenate(parts, axis=0)


def _ufunc(op, where):
    if op not in OPS:
        raise ArgumentError(f"{where}: op={op!r} is not one of {sorted(OPS)}")
    return OPS[op]


def _algo(kind, algo, where):
    if algo not in ALGORITHMS[kind]:
        raise ArgumentError(f"{where}: algo={algo!r} is not one of {list(ALGORITHMS[kind])}")
    return algo


def _segments(segments, where):
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ArgumentError(f"{where}: segments={segments!r} must be an int >= 1")
    return segments


def _combine(fn, got, mine, where, comm, src):
    """``fn(got, mine)`` after checking that the peer's piece matches this rank's."""
    if got.shape != mine.shape:
        raise ShapeError(f"{where}: rank {comm.rank} received a piece of shape {got.shape} from "
                         f"rank {src} where it holds {mine.shape}: every rank must pass an "
                         f"array of the same shape")
    if got.dtype != mine.dtype:
        raise DTypeError(f"{where}: rank {comm.rank} received {got.dtype} from rank {src} but "
                         f"holds {mine.dtype}: every rank must pass the same dtype")
    return fn(got, mine)


def _power_of_two(p):
    return p & (p - 1) == 0


def _need_power_of_two(comm, where):
    if not _power_of_two(comm.size):
        raise ArgumentError(f"{where}: needs a power-of-two number of ranks, got {comm.size}")


# ----------------------------------------------------------------------------------- all-reduce
def allreduce(comm, x, op="sum", algo="ring", segments=1):
    """Every rank gets the elementwise reduction of every rank's ``x`` (same shape).

    Args:
        comm: the communicator. x: this rank's array (the same shape and dtype everywhere).
        op: ``sum``, ``prod``, ``max`` or ``min``. algo: see the module table.
        segments: pipeline depth of ``tree`` / ``double_tree``.
    """
    where = f"allreduce(algo={algo!r})"
    fn, algo = _ufunc(op, where), _algo("allreduce", algo, where)
    x, segments = _array(x, where), _segments(segments, where)
    if comm.size == 1:
        return x.copy()
    if algo == "ring":
        flow = _ring_allreduce(comm, x, fn, where)
        if comm.supports_batching:
            return (yield comm.batched("allreduce/ring", x, op, flow, ring_plan))
        return (yield from flow)
    if algo in ("tree", "double_tree"):
        flat = _flat(x)
        trees = _trees(comm.size, 2 if algo == "double_tree" else 1)
        return (yield from _tree_allreduce(comm, flat, fn, trees, segments, where)).reshape(
            x.shape)
    if algo == "recursive_doubling":
        body = _recursive_doubling_body
    else:
        body = _rabenseifner_body
    return (yield from _folded(comm, _flat(x), fn, body, where)).reshape(x.shape)


def _ring_reduce_scatter(comm, flat, fn, where):
    """Ring reduce-scatter in place over ``p`` blocks; afterwards block ``rank`` is reduced."""
    p, r = comm.size, comm.rank
    bounds = block_bounds(flat.shape[0], p)
    blocks = [flat[a:b] for a, b in bounds]
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        send_idx, recv_idx = (r - s - 1) % p, (r - s - 2) % p
        got = yield _sendrecv(comm, blocks[send_idx], right, left)
        blocks[recv_idx] = _combine(fn, got, blocks[recv_idx], where, comm, left)
    return blocks


def _ring_allgather_blocks(comm, blocks):
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    for s in range(p - 1):
        blocks[(r - s - 1) % p] = yield _sendrecv(comm, blocks[(r - s) % p], right, left)
    return blocks


def _ring_allreduce(comm, x, fn, where):
    flat = _flat(x)
    if _is_symbolic(flat):
        blocks = yield from _ring_reduce_scatter(comm, flat, fn, where)
        blocks = yield from _ring_allgather_blocks(comm, blocks)
        return _concat(blocks).reshape(x.shape)
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
        got = yield _sendrecv(comm, held[send_idx], right, left, out=out[a:b])
        fn(got, held[recv_idx], out=got)
        held[recv_idx] = got
    for s in range(p - 1):
        a, b = bounds[(r - s - 1) % p]
        yield _sendrecv(comm, held[(r - s) % p], right, left, out=out[a:b])
        held[(r - s - 1) % p] = out[a:b]
    return out.reshape(x.shape)


def ring_plan(arrays, op):
    """The ring all-reduce of ``arrays`` (one per rank) done at once, for the simulator's
    batched path: ``(results, step_bytes)`` where ``step_bytes[s, r]`` is what rank ``r`` sends
    in step ``s``. The reduction follows the ring's own order, so values match the message-by-
    message run bit for bit. ``None`` when the inputs disagree (the fallback reports it)."""
    p, first = len(arrays), arrays[0]
    symbolic = _is_symbolic(first)
    if any(_is_symbolic(a) != symbolic or a.size != first.size or a.dtype != first.dtype
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
    flats = [_flat(a) for a in arrays]
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
            yield _send(comm, flat, r + 1)
            return (yield _recv(comm, r + 1))
        got = yield _recv(comm, r - 1)
        flat = _combine(fn, got, flat, where, comm, r - 1)
        virtual = r // 2
    else:
        virtual = r - extra

    def real(v):
        return 2 * v + 1 if v < extra else v + extra

    flat = yield from body(comm, flat, fn, virtual, q, real, where)
    if r < 2 * extra:
        yield _send(comm, flat, r - 1)
    return flat


def _recursive_doubling_body(comm, flat, fn, virtual, q, real, where):
    mask = 1
    while mask < q:
        peer = real(virtual ^ mask)
        got = yield _sendrecv(comm, flat, peer, peer)
        flat = _combine(fn, got, flat, where, comm, peer)
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
        send = part[bounds[give[0]][0] - base:bounds[give[1] - 1][1] - base]
        mine = part[bounds[keep[0]][0] - base:bounds[keep[1] - 1][1] - base]
        peer = real(peer_v)
        got = yield _sendrecv(comm, send, peer, peer)
        part = _combine(fn, got, mine, where, comm, peer)
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
        got = yield _sendrecv(comm, part, peer, peer)
        if equal_rows is not None and _rows(got).shape != (mask * equal_rows, *part.shape[1:]):
            raise ShapeError(f"{where}: rank {comm.rank} received shape {got.shape} from rank "
                             f"{peer}, expected {(mask * equal_rows, *part.shape[1:])}: this "
                             f"algorithm needs every rank's array to have the same shape "
                             f"(use algo='ring')")
        part = _concat([part, got] if virtual < peer_v else [got, part])
        mask <<= 1
    return part


def _rabenseifner_body(comm, flat, fn, virtual, q, real, where):
    part, _, _ = yield from _halving(comm, flat, fn, virtual, q, real, where)
    return (yield from _doubling_gather(comm, part, virtual, q, real, where))


# ------------------------------------------------------------------------------------- trees
def _btree(p):
    """NCCL-style in-order binary tree over ranks ``0..p-1``: ``(parent, children, root)``.

    Label ``x = rank + 1``; a label with lowest set bit ``b`` has children ``x - b/2`` and
    ``x + b/2`` (the latter walked down while it is past ``p``). Leaves are the even ranks."""
    parent, children = [None] * p, [[] for _ in range(p)]
    root = 1 << (p.bit_length() - 1)
    stack = [root]
    while stack:
        x = stack.pop()
        b = x & -x
        if b == 1:
            continue
        kids = [x - b // 2]
        right = x + b // 2
        while right > p and (right & -right) > 1:
            right -= (right & -right) // 2
        if right <= p:
            kids.append(right)
        for kid in kids:
            parent[kid - 1] = x - 1
            children[x - 1].append(kid - 1)
            stack.append(kid)
    return parent, children, root - 1


def _trees(p, count):
    """One tree, or two complementary ones (mirrored for even ``p``, shifted for odd)."""
    parent, children, root = _btree(p)
    trees = [(parent, children, root)]
    if count == 2:
        role = (lambda r: p - 1 - r) if p % 2 == 0 else (lambda r: (r - 1) % p)
        inverse = {role(r): r for r in range(p)}
        parent_b = [None] * p
        children_b = [[] for _ in range(p)]
        for r in range(p):
            pa = parent[role(r)]
            parent_b[r] = None if pa is None else inverse[pa]
            children_b[r] = [inverse[c] for c in children[role(r)]]
        trees.append((parent_b, children_b, inverse[root]))
    return trees


def _levels(parent, children, root):
    """Height (leaves 0) and depth (root 0) of every node of a tree."""
    p = len(parent)
    depth, order, stack = [0] * p, [], [root]
    while stack:
        node = stack.pop()
        order.append(node)
        for kid in children[node]:
            depth[kid] = depth[node] + 1
            stack.append(kid)
    height = [0] * p
    for node in reversed(order):
        if children[node]:
            height[node] = 1 + max(height[k] for k in children[node])
    return height, depth


def tree_links(p, algo="tree"):
    """The trees of ``algo`` (``tree`` or ``double_tree``) over ``p`` ranks, for cost formulas
    and pictures: ``[(parent, children, root, height, depth)]`` per tree."""
    return [(pa, ch, root, *_levels(pa, ch, root))
            for pa, ch, root in _trees(p, 2 if algo == "double_tree" else 1)]


def _tree_allreduce(comm, flat, fn, trees, segments, where):
    """Pipelined tree reduce, then broadcast. A node of height ``h`` sends segment ``j`` up in
    step ``j + h`` and receives it from its children in step ``j + h - 1``; going down, a node
    of depth ``d`` receives segment ``j`` in step ``j + d - 1`` and passes it on in step
    ``j + d``. Every wait is on an earlier step, so the steps never deadlock, and with two
    trees (each carrying half the data) one ``exchange`` per step serves both."""
    r, k = comm.rank, segments
    levels = [(pa, ch, *_levels(pa, ch, root)) for pa, ch, root in trees]
    pieces = []  # per tree: the segments of this rank's share of the data
    for a, b in block_bounds(flat.shape[0], len(trees)):
        pieces.append([flat[a + s:a + e] for s, e in block_bounds(b - a, k)])
    tags = [TAG, TAG_B]
    up_steps = k - 1 + max(max(h) for _, _, h, _ in levels)
    for g in range(up_steps):
        sends, srcs, slots = [], [], []
        for t, (parent, children, height, _) in enumerate(levels):
            h = height[r]
            if parent[r] is not None and 0 <= g - h < k:
                sends.append((pieces[t][g - h], parent[r], tags[t]))
            if 0 <= g - h + 1 < k:
                srcs += [(c, tags[t]) for c in children[r]]
                slots += [(t, g - h + 1)] * len(children[r])
        got = yield _exchange(comm, sends, srcs)
        for (src, _), (t, j), value in zip(srcs, slots, got):
            pieces[t][j] = _combine(fn, value, pieces[t][j], where, comm, src)
    down_steps = k - 1 + max(max(d) for _, _, _, d in levels)
    for g in range(down_steps):
        sends, srcs, slots = [], [], []
        for t, (parent, children, _, depth) in enumerate(levels):
            d = depth[r]
            if 0 <= g - d < k:
                sends += [(pieces[t][g - d], c, tags[t]) for c in children[r]]
            if parent[r] is not None and 0 <= g - d + 1 < k:
                srcs.append((parent[r], tags[t]))
                slots.append((t, g - d + 1))
        got = yield _exchange(comm, sends, srcs)
        for (t, j), value in zip(slots, got):
            pieces[t][j] = value
    return _concat([seg for piece in pieces for seg in piece])


# ------------------------------------------------------------------- reduce-scatter, all-gather
def reduce_scatter(comm, x, op="sum", algo="ring"):
    """Reduce every rank's ``x`` and give rank ``r`` block ``r`` of the flattened result
    (blocks by :func:`block_bounds`)."""
    where = f"reduce_scatter(algo={algo!r})"
    fn, algo = _ufunc(op, where), _algo("reduce_scatter", algo, where)
    flat = _flat(_array(x, where))
    if comm.size == 1:
        return flat.copy()
    if algo == "ring":
        blocks = yield from _ring_reduce_scatter(comm, flat, fn, where)
        return blocks[comm.rank]
    _need_power_of_two(comm, where)
    part, _, _ = yield from _halving(comm, flat, fn, comm.rank, comm.size, lambda v: v, where)
    return part


def allgather(comm, x, algo="ring"):
    """Every rank gets every rank's ``x`` concatenated along axis 0, in rank order."""
    where = f"allgather(algo={algo!r})"
    algo = _algo("allgather", algo, where)
    x = _rows(_array(x, where))
    if comm.size == 1:
        return x.copy()
    if algo == "ring":
        blocks = [None] * comm.size
        blocks[comm.rank] = x
        blocks = yield from _ring_allgather_blocks(comm, blocks)
        _check_trailing(blocks, comm, where)
        return _concat(blocks)
    _need_power_of_two(comm, where)
    return (yield from _doubling_gather(comm, x, comm.rank, comm.size, lambda v: v, where,
                                        equal_rows=x.shape[0]))


def _check_trailing(blocks, comm, where):
    shapes = [b.shape[1:] for b in blocks]
    if len(set(shapes)) > 1 or len({b.dtype for b in blocks}) > 1:
        detail = {r: (b.shape, str(b.dtype)) for r, b in enumerate(blocks)}
        raise ShapeError(f"{where}: rank {comm.rank} cannot concatenate along axis 0: shapes "
                         f"and dtypes by rank {detail}")


# ------------------------------------------------------------------------- rooted collectives
def _root(comm, root, where):
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
            not 0 <= root < comm.size:
        raise ArgumentError(f"{where}: root={root!r} is not a rank of {comm.size}")
    return int(root)


def broadcast(comm, x, root=0, algo="binomial", segments=1):
    """Every rank gets the root's ``x``. Other ranks may pass ``None`` (``scatter_allgather``
    needs an array of the root's shape and dtype there, for the sizes)."""
    where = f"broadcast(algo={algo!r})"
    algo, root = _algo("broadcast", algo, where), _root(comm, root, where)
    segments = _segments(segments, where)
    p, r = comm.size, comm.rank
    if r == root or algo == "scatter_allgather":
        x = _array(x, where)
    if p == 1:
        return x.copy()
    v = (r - root) % p
    if algo == "binomial":
        return (yield from _binomial_bcast(comm, x if v == 0 else None, v, root))
    if algo == "ring":
        return (yield from _chain_bcast(comm, x if v == 0 else None, v, root, segments))
    flat = _flat(x)
    bounds = block_bounds(flat.shape[0], p)
    mine = yield from _scatter_known(comm, flat if v == 0 else None, bounds, root)
    blocks = [None] * p
    blocks[r] = mine
    blocks = yield from _ring_allgather_blocks(comm, blocks)
    return _concat(blocks).reshape(x.shape)


def _binomial_bcast(comm, x, v, root):
    p = comm.size
    mask = 1
    while mask < p:
        if v & mask:
            x = yield _recv(comm, (v - mask + root) % p)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < p:
            yield _send(comm, x, (v + mask + root) % p)
        mask >>= 1
    return x


def _chain_bcast(comm, x, v, root, segments):
    """Pipelined chain along the ring; segments split axis 0, so shapes survive."""
    p = comm.size
    nxt, prev = (v + 1 + root) % p, (v - 1 + root) % p
    if v == 0:
        rows = _rows(x)
        pieces = [rows[a:b] for a, b in block_bounds(len(rows), segments)]
        if x.ndim == 0:  # a 0-d value travels whole in the first segment
            pieces[0] = x
    else:
        pieces = [None] * segments
    for s in range(segments + 1):
        sends = [(pieces[s - 1], nxt)] if s >= 1 and v < p - 1 else []
        srcs = [prev] if s < segments and v > 0 else []
        got = yield _exchange(comm, sends, srcs)
        if srcs:
            pieces[s] = got[0]
    if v == 0:
        return x.copy()
    return pieces[0] if pieces[0].ndim == 0 or len(pieces) == 1 else _concat(pieces)


def _scatter_known(comm, flat, bounds, root):
    """Binomial scatter of ``flat`` (at the root) when every rank knows ``bounds``."""
    p, r = comm.size, comm.rank
    v = (r - root) % p
    lengths = [bounds[(u + root) % p][1] - bounds[(u + root) % p][0] for u in range(p)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    if v == 0:  # lay the root's blocks out in relative-rank order
        data = _concat([flat[bounds[(u + root) % p][0]:bounds[(u + root) % p][1]]
                        for u in range(p)])
        span = p
    mask = 1
    while mask < p:
        if v & mask:
            data = yield _recv(comm, (v - mask + root) % p)
            span = min(mask, p - v)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if v + mask < p and mask < span:
            lo, hi = offsets[v + mask] - offsets[v], offsets[min(v + span, p)] - offsets[v]
            yield _send(comm, data[lo:hi], (v + mask + root) % p)
            data = data[:lo]
            span = mask
        mask >>= 1
    return data


def scatter(comm, x, root=0, algo="binomial"):
    """Rank ``r`` gets block ``r`` (along axis 0, :func:`block_bounds`) of the root's ``x``;
    other ranks pass ``None``. ``binomial`` needs ``len(x)`` divisible by ``p``."""
    where = f"scatter(algo={algo!r})"
    algo, root = _algo("scatter", algo, where), _root(comm, root, where)
    p, r = comm.size, comm.rank
    if r == root:
        x = _rows(_array(x, where))
        bounds = block_bounds(x.shape[0], p)
    if p == 1:
        return x.copy()
    if algo == "direct":
        if r == root:
            sends = [(x[a:b], d) for d, (a, b) in enumerate(bounds) if d != root]
            yield _exchange(comm, sends, [])
            a, b = bounds[root]
            return x[a:b].copy()
        return (yield _recv(comm, root))
    if r == root and x.shape[0] % p:
        raise ArgumentError(f"{where}: len(x)={x.shape[0]} is not divisible by {p} ranks "
                            f"(use algo='direct')")
    v = (r - root) % p
    mask, span = 1, p
    if v == 0:
        rows = x.shape[0] // p
        data = _concat([x[((u + root) % p) * rows:((u + root) % p + 1) * rows]
                        for u in range(p)])
    while mask < p:
        if v & mask:
            data = yield _recv(comm, (v - mask + root) % p)
            span = min(mask, p - v)
            break
        mask <<= 1
    rows = data.shape[0] // span
    mask >>= 1
    while mask:
        if v + mask < p and mask < span:
            yield _send(comm, data[mask * rows:span * rows], (v + mask + root) % p)
            data, span = data[:mask * rows], mask
        mask >>= 1
    return data


def reduce(comm, x, root=0, op="sum", algo="binomial"):
    """The root gets the reduction of every rank's ``x``; the others get ``None``."""
    where = f"reduce(algo={algo!r})"
    fn, algo = _ufunc(op, where), _algo("reduce", algo, where)
    root, x = _root(comm, root, where), _array(x, where)
    p, r = comm.size, comm.rank
    if p == 1:
        return x.copy()
    v = (r - root) % p
    if algo == "binomial":
        acc, mask = x, 1
        while mask < p:
            if v & mask:
                yield _send(comm, acc, (v - mask + root) % p)
                return None
            if v + mask < p:
                src = (v + mask + root) % p
                got = yield _recv(comm, src)
                acc = _combine(fn, got, acc, where, comm, src)
            mask <<= 1
        return acc
    blocks = yield from _ring_reduce_scatter(comm, _flat(x), fn, where)
    if r != root:
        yield _send(comm, blocks[r], root)
        return None
    others = [d for d in range(p) if d != root]
    got = yield _exchange(comm, [], others)
    for d, value in zip(others, got):
        blocks[d] = value
    return _concat(blocks).reshape(x.shape)


def gather(comm, x, root=0, algo="binomial"):
    """The root gets every rank's ``x`` concatenated along axis 0 in rank order; the others
    get ``None``. ``binomial`` needs equal shapes."""
    where = f"gather(algo={algo!r})"
    algo, root = _algo("gather", algo, where), _root(comm, root, where)
    x = _rows(_array(x, where))
    p, r = comm.size, comm.rank
    if p == 1:
        return x.copy()
    if algo == "direct":
        if r != root:
            yield _send(comm, x, root)
            return None
        others = [d for d in range(p) if d != root]
        got = yield _exchange(comm, [], others)
        blocks = dict(zip(others, got))
        blocks[root] = x
        ordered = [blocks[d] for d in range(p)]
        _check_trailing(ordered, comm, where)
        return _concat(ordered)
    v = (r - root) % p
    acc, mask, rows = x, 1, x.shape[0]
    while mask < p:
        if v & mask:
            yield _send(comm, acc, (v - mask + root) % p)
            return None
        if v + mask < p:
            src = (v + mask + root) % p
            got = yield _recv(comm, src)
            expect = (min(mask, p - v - mask) * rows, *x.shape[1:])
            if _rows(got).shape != expect:
                raise ShapeError(f"{where}: rank {r} received shape {got.shape} from rank "
                                 f"{src}, expected {expect}: binomial gather needs equal "
                                 f"shapes (use algo='direct')")
            acc = _concat([acc, got])
        mask <<= 1
    shift = (p - root) % p * rows  # relative order starts at the root: rotate to rank order
    return _concat([acc[shift:], acc[:shift]])


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
    elif p > 1:
        others = [d for d in range(p) if d != r]
        got = yield _exchange(comm, [(blocks[d], d) for d in others], others)
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
