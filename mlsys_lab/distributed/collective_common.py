"""What every collective shares: ops, tags, algorithm names, argument checks, block bounds and
the piece-combining helpers (see :mod:`.collectives` for the collectives themselves)."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError
from .comm import TAG_LIMIT

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
        from .symbolic import SymbolicArray

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


def _charge(comm, nbytes):
    """The reduction's cost: ``compute(seconds=gamma * nbytes)`` on this rank, where ``gamma``
    is its device's seconds per byte reduced (``topology.Device.gamma``). Used with
    ``yield from`` right after a combine; yields nothing when ``gamma`` is 0 or there is no
    simulated device (MPI, where the real ufunc takes real time), so such runs are unchanged."""
    gamma = getattr(comm.device, "gamma", 0.0)
    if gamma and nbytes:
        yield comm.compute(seconds=gamma * nbytes)


def _power_of_two(p):
    return p & (p - 1) == 0


def _need_power_of_two(comm, where):
    if not _power_of_two(comm.size):
        raise ArgumentError(f"{where}: needs a power-of-two number of ranks, got {comm.size}")


def _check_trailing(blocks, comm, where):
    shapes = [b.shape[1:] for b in blocks]
    if len(set(shapes)) > 1 or len({b.dtype for b in blocks}) > 1:
        detail = {r: (b.shape, str(b.dtype)) for r, b in enumerate(blocks)}
        raise ShapeError(f"{where}: rank {comm.rank} cannot concatenate along axis 0: shapes "
                         f"and dtypes by rank {detail}")


def _root(comm, root, where):
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
            not 0 <= root < comm.size:
        raise ArgumentError(f"{where}: root={root!r} is not a rank of {comm.size}")
    return int(root)
