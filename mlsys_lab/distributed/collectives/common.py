"""What every collective shares: ops, tags, algorithm names, argument checks, block bounds and
the piece-combining helpers (see :mod:`mlsys_lab.distributed.collectives` for the collectives
themselves). Public inside the package: the collective modules import these, nothing else
should."""

from __future__ import annotations

import numpy as np

from ...errors import ArgumentError, DTypeError, ShapeError
from ..comm import TAG_LIMIT

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


def sendrecv(comm, array, dst, src, tag=TAG, out=None):
    """Send ``array`` to ``dst`` and receive from ``src`` on the collectives' tag."""
    return comm.sendrecv(array, dst, src, tag=tag, out=out, _internal=True)


def send(comm, array, dst):
    """Send ``array`` to ``dst`` on the collectives' tag."""
    return comm.send(array, dst, tag=TAG, _internal=True)


def recv(comm, src):
    """Receive from ``src`` on the collectives' tag."""
    return comm.recv(src, tag=TAG, _internal=True)


def exchange(comm, sends, srcs, tag=TAG):
    """Post ``sends`` (``[(array, dst)]``) and receives from ``srcs`` at once."""
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


def is_symbolic(x):
    """Whether ``x`` is a :class:`~..sim.symbolic.SymbolicArray` (shape and dtype, no values)."""
    return hasattr(x, "__mlsys_symbolic__")


def as_array(x, where):
    """``x`` as an array (symbolic ones pass through); ``None`` is an error naming ``where``."""
    if x is None:
        raise ArgumentError(f"{where}: got None where this rank must pass an array")
    if is_symbolic(x) or isinstance(x, np.ndarray):
        return x
    return np.asarray(x)


def as_flat(x):
    """``x`` flattened to one axis (reduce-scatter and all-reduce split the flat data)."""
    return x.reshape(-1)


def as_rows(x):
    """``x`` with at least one axis: a 0-d array counts as shape ``(1,)``."""
    return x.reshape(1) if x.ndim == 0 else x


def concat(parts):
    """``parts`` concatenated along axis 0 (symbolic when any part is)."""
    if any(is_symbolic(p) for p in parts):
        from ..sim.symbolic import SymbolicArray

        first = parts[0]
        return SymbolicArray((sum(p.shape[0] for p in parts), *first.shape[1:]), first.dtype)
    return np.concatenate(parts, axis=0)


def ufunc_of(op, where):
    """The numpy ufunc of ``op`` (``sum``, ``prod``, ``max``, ``min``)."""
    if op not in OPS:
        raise ArgumentError(f"{where}: op={op!r} is not one of {sorted(OPS)}")
    return OPS[op]


def check_algo(kind, algo, where):
    """``algo`` if it is one of ``ALGORITHMS[kind]``, else an ``ArgumentError``."""
    if algo not in ALGORITHMS[kind]:
        raise ArgumentError(f"{where}: algo={algo!r} is not one of {list(ALGORITHMS[kind])}")
    return algo


def check_segments(segments, where):
    """``segments`` if it is an int >= 1, else an ``ArgumentError``."""
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ArgumentError(f"{where}: segments={segments!r} must be an int >= 1")
    return segments


def combine(fn, got, mine, where, comm, src):
    """``fn(got, mine)`` after checking that the peer's piece matches this rank's."""
    if got.shape != mine.shape:
        raise ShapeError(f"{where}: rank {comm.rank} received a piece of shape {got.shape} from "
                         f"rank {src} where it holds {mine.shape}: every rank must pass an "
                         f"array of the same shape")
    if got.dtype != mine.dtype:
        raise DTypeError(f"{where}: rank {comm.rank} received {got.dtype} from rank {src} but "
                         f"holds {mine.dtype}: every rank must pass the same dtype")
    return fn(got, mine)


def charge(comm, nbytes):
    """The reduction's cost: ``compute(seconds=gamma * nbytes)`` on this rank, where ``gamma``
    is its device's seconds per byte reduced (``topology.Device.gamma``). Used with
    ``yield from`` right after a combine; yields nothing when ``gamma`` is 0 or there is no
    simulated device (MPI, where the real ufunc takes real time), so such runs are unchanged."""
    gamma = getattr(comm.device, "gamma", 0.0)
    if gamma and nbytes:
        yield comm.compute(seconds=gamma * nbytes)


def _power_of_two(p):
    return p & (p - 1) == 0


def need_power_of_two(comm, where):
    """An ``ArgumentError`` unless the communicator's size is a power of two."""
    if not _power_of_two(comm.size):
        raise ArgumentError(f"{where}: needs a power-of-two number of ranks, got {comm.size}")


def check_trailing(blocks, comm, where):
    """A ``ShapeError`` unless the blocks agree in trailing shape and dtype."""
    shapes = [b.shape[1:] for b in blocks]
    if len(set(shapes)) > 1 or len({b.dtype for b in blocks}) > 1:
        detail = {r: (b.shape, str(b.dtype)) for r, b in enumerate(blocks)}
        raise ShapeError(f"{where}: rank {comm.rank} cannot concatenate along axis 0: shapes "
                         f"and dtypes by rank {detail}")


def check_root(comm, root, where):
    """``root`` as an int if it is a rank of ``comm``, else an ``ArgumentError``."""
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or \
            not 0 <= root < comm.size:
        raise ArgumentError(f"{where}: root={root!r} is not a rank of {comm.size}")
    return int(root)
