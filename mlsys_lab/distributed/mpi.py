"""The MPI backend: the same rank programs and collectives over real processes (mpi4py).

Inside ``mpiexec -n P python script.py``::

    from mlsys_lab.distributed import mpi
    from mlsys_lab.distributed.collectives import allreduce

    def prog(comm, x):
        return (yield from allreduce(comm, x, algo="ring"))

    out = mpi.run(prog, x)          # this rank's result

and from the shell, a check against ``MPI_Allreduce`` with nccl-tests' bandwidths::

    mpiexec -n 4 python -m mlsys_lab.distributed.mpi allreduce --algo ring --bytes 1M

How requests map to MPI. Every message is two MPI messages on the same tag: a small header
(dtype and shape) and the bytes, so a receiver needs to know nothing in advance. ``send`` is
buffered like the simulator's (the array is copied and sent with ``Isend``; the rank goes on),
``recv``, ``sendrecv`` and ``exchange`` post ``Irecv``/``Isend`` together and wait for all of
them. Waits poll ``Testall`` against a deadline (``timeout`` wall seconds) and raise
:class:`~.comm.CommTimeoutError` naming the rank and the operation instead of hanging; this is
also why ``sendrecv`` is an ``Isend``/``Irecv`` pair and not ``MPI_Sendrecv``, which cannot time
out. ``compute`` is free (the real work takes real time) and ``now()`` is ``MPI.Wtime()`` since
:func:`run` began. Batched collective requests run their message-by-message fallback.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from ..errors import ArgumentError, DTypeError
from .comm import (
    ANY_SOURCE,
    Batched,
    CommTimeoutError,
    Communicator,
    Compute,
    Exchange,
    Recv,
    Request,
    Send,
    SendRecv,
    Start,
    Wait,
    check_fits,
    fill,
    not_a_request,
)


def find_mpiexec():
    """The ``mpiexec`` that pip's ``mpich`` wheel installed (beside this Python, in the scripts
    folder of a ``--user`` install) or the first on ``PATH``; None when there is none."""
    import os
    import shutil
    import sysconfig

    folders = [os.path.dirname(sys.executable), sysconfig.get_path("scripts")]
    try:
        folders.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    except KeyError:
        pass
    return shutil.which("mpiexec", path=os.pathsep.join([*folders, os.environ.get("PATH", "")]))


try:
    from mpi4py import MPI
except ImportError as exc:  # pragma: no cover - exercised only without mpi4py
    raise ImportError("mlsys_lab.distributed.mpi needs mpi4py and an MPI library: "
                      "pip install mpich mpi4py") from exc

__all__ = ["MpiCommunicator", "run", "world"]

_HEADER = 40  # int64 words: ndim, 8 dtype characters, up to 31 dimensions
_SPIN_SECONDS = 0.05  # poll flat out this long, then nap between polls


def _header(array):
    """The message header: ``ndim``, the dtype's ``str`` code, the shape. A 0-d array is
    ``ndim`` 0 and arrives 0-d; the code keeps the byte order, so dtypes round-trip exactly."""
    dtype = array.dtype
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise DTypeError(f"mpi: cannot send an array of dtype {dtype} (objects and structured "
                         f"dtypes do not travel as raw bytes); send plain numeric arrays")
    code = dtype.str.encode()
    if array.ndim > _HEADER - 9 or len(code) > 8:
        raise ArgumentError(f"mpi: cannot send an array of {array.ndim} dims / dtype "
                            f"{array.dtype}")
    head = np.zeros(_HEADER, dtype=np.int64)
    head[0] = array.ndim
    head[1:1 + len(code)] = list(code)
    head[9:9 + array.ndim] = array.shape
    return head


def _decode(head):
    ndim = int(head[0])
    code = bytes(int(c) for c in head[1:9] if c).decode()
    return tuple(int(s) for s in head[9:9 + ndim]), np.dtype(code)


def _cancel(requests):
    """Withdraw the receives still posted, so that no later message lands in them."""
    for request in requests:
        if not request.Test():
            request.Cancel()


def _receive_buffer(out, head, src, what):
    """Where the message that ``head`` announces lands: a new array of its shape and dtype,
    or ``out`` once it is checked to fit exactly."""
    shape, dtype = _decode(head)
    if out is None:
        return np.empty(shape, dtype=dtype)
    check_fits(out, shape, dtype, src, what)
    return out


def _bytes_of(array):
    return array.reshape(-1).view(np.uint8)


class MpiCommunicator(Communicator):
    """A :class:`~.comm.Communicator` over an ``mpi4py`` communicator."""

    def __init__(self, mpi_comm, timeout=60.0, start=None):
        super().__init__(mpi_comm.Get_rank(), mpi_comm.Get_size())
        self._mpi = mpi_comm
        self.timeout = float(timeout)
        self._start = MPI.Wtime() if start is None else start
        self._subs = {}
        self.pending = []  # buffered sends: (requests, buffers, description)

    def now(self):
        return MPI.Wtime() - self._start

    def _make_dup(self):
        dup = MpiCommunicator(self._mpi.Dup(), self.timeout, self._start)
        self._subs[("dup", len(self._subs))] = dup
        return dup

    def _make_sub(self, members):
        key = tuple(members)
        if key not in self._subs:
            group = self._mpi.Get_group().Incl(list(members))
            self._subs[key] = MpiCommunicator(self._mpi.Create_group(group), self.timeout,
                                              self._start)
            group.Free()
        return self._subs[key]

    # -- waiting ----------------------------------------------------------------------------
    def wait_requests(self, requests, what, receives=()):
        """Wait for every request, polling against the deadline; on a timeout the pending
        ``receives`` are cancelled first."""
        if not requests:
            return
        started = time.monotonic()
        while not MPI.Request.Testall(requests):
            waited = time.monotonic() - started
            if waited > self.timeout:
                _cancel(receives)
                raise CommTimeoutError(f"mpi rank {self.rank} of {self.size}: {what} did not "
                                       f"complete within timeout={self.timeout} s")
            if waited > _SPIN_SECONDS:
                time.sleep(2e-4)

    def flush(self):
        """Wait for the buffered sends still in flight."""
        pending, self.pending = self.pending, []
        for requests, _, what in pending:
            self.wait_requests(requests, what)

    def _reap(self):
        self.pending = [item for item in self.pending if not MPI.Request.Testall(item[0])]

    # -- the operations ---------------------------------------------------------------------
    def _isend(self, array, dst, tag):
        # not np.ascontiguousarray: it makes a 0-d array 1-d, so a 0-d message arrived (1,)
        array = np.asarray(array, order="C")
        head = _header(array)
        requests = [self._mpi.Isend(head, dest=dst, tag=tag),
                    self._mpi.Isend(_bytes_of(array), dest=dst, tag=tag)]
        return requests, (head, array)

    def _irecv_header(self, src, tag):
        head = np.empty(_HEADER, dtype=np.int64)
        return head, self._mpi.Irecv(head, source=src, tag=tag)

    def execute(self, sends, srcs, what, out=None):
        """Post sends ``[(array, dst, tag)]`` and receives ``[(src, tag)]``; wait for all.
        ``out``: the buffer for the (single) receive."""
        self._reap()
        heads = [self._irecv_header(src, tag) for src, tag in srcs]
        send_requests, keep = [], []
        for array, dst, tag in sends:
            requests, buffers = self._isend(array, dst, tag)
            send_requests += requests
            keep.append(buffers)
        head_requests = [request for _, request in heads]
        self.wait_requests(head_requests, what, receives=head_requests)
        outs, data_requests = [], []
        for (src, tag), (head, _) in zip(srcs, heads):
            buffer = _receive_buffer(out, head, src, what)
            data_requests.append(self._mpi.Irecv(_bytes_of(buffer), source=src, tag=tag))
            outs.append(buffer)
        self.wait_requests(data_requests + send_requests, what, receives=data_requests)
        return outs

    def execute_any(self, tag, out=None):
        """An any-source receive: the header from whoever sends first, then its data from
        that rank; returns ``(src, array)``."""
        self._reap()
        what = f"recv_any(tag={tag})"
        head = np.empty(_HEADER, dtype=np.int64)
        request, status = self._mpi.Irecv(head, source=MPI.ANY_SOURCE, tag=tag), MPI.Status()
        started = time.monotonic()
        while not request.Test(status):
            waited = time.monotonic() - started
            if waited > self.timeout:
                _cancel([request])
                raise CommTimeoutError(f"mpi rank {self.rank} of {self.size}: {what} did not "
                                       f"complete within timeout={self.timeout} s")
            if waited > _SPIN_SECONDS:
                time.sleep(2e-4)
        src = status.Get_source()
        buffer = _receive_buffer(out, head, src, what)
        data = self._mpi.Irecv(_bytes_of(buffer), source=src, tag=tag)
        self.wait_requests([data], what, receives=[data])
        return src, buffer

    def serve(self, request):
        """Carry out one request; returns the value its ``yield`` gives."""
        if request.comm is not self:
            return request.comm.serve(request)
        if isinstance(request, Compute):
            return None
        if isinstance(request, Send):
            copy = np.array(request.array, copy=True, order="C")
            requests, buffers = self._isend(copy, request.dst, request.tag)
            self.pending.append((requests, buffers,
                                 f"send to rank {request.dst} (tag {request.tag})"))
            return None
        if isinstance(request, Recv) and request.src == ANY_SOURCE:
            return self.execute_any(request.tag, request.out)
        if isinstance(request, Recv):
            return self.execute([], [(request.src, request.tag)],
                                f"recv(src={request.src}, tag={request.tag})", request.out)[0]
        if isinstance(request, SendRecv):
            if request.dst == self.rank:
                if request.out is not None:
                    return fill(request.out, request.array, self.rank, "sendrecv")
                return np.array(request.array, copy=True)
            return self.execute([(request.array, request.dst, request.tag)],
                                [(request.src, request.tag)],
                                f"sendrecv(dst={request.dst}, src={request.src}, "
                                f"tag={request.tag})", request.out)[0]
        if isinstance(request, Exchange):
            return self.execute(request.sends, request.srcs,
                                f"exchange(dsts={[d for _, d, _ in request.sends]}, "
                                f"srcs={[s for s, _ in request.srcs]})")
        raise ArgumentError(f"mpi rank {self.rank}: cannot serve {type(request).__name__}")


def world(timeout=60.0):
    """A communicator over ``MPI.COMM_WORLD``."""
    return MpiCommunicator(MPI.COMM_WORLD, timeout)


def run(prog, *args, comm=None, timeout=60.0, **kwargs):
    """Drive the generator ``prog(comm, *args, **kwargs)`` on this MPI process.

    Args:
        prog: a rank program (generator function taking a communicator first).
        comm: an :class:`MpiCommunicator` (default: over ``MPI.COMM_WORLD``).
        timeout: wall seconds any one wait may take before :class:`CommTimeoutError`.

    Returns:
        this rank's return value of ``prog``.
    """
    comm = world(timeout) if comm is None else comm
    program = prog(comm, *args, **kwargs)
    if not (hasattr(program, "send") and hasattr(program, "throw")):
        return program
    value = _drive(comm, program)
    comm.flush()
    for sub in comm._subs.values():
        sub.flush()
    return value


class _Task:
    """``comm.start`` under MPI: the program already ran; this holds its value."""

    def __init__(self, value):
        self.value = value


def _drive(comm, program):
    stack, value, error = [program], None, None
    while True:
        try:
            request = stack[-1].throw(error) if error is not None else stack[-1].send(value)
        except StopIteration as stop:
            stack.pop()
            value, error = stop.value, None
            if not stack:
                return value
            continue
        except Exception as exc:  # noqa: BLE001 - rethrown into the caller generator
            stack.pop()
            if not stack:
                raise
            value, error = None, exc
            continue
        if isinstance(request, Batched):
            stack.append(request.fallback)
            value, error = None, None
        elif isinstance(request, Start):  # no concurrency here: run it to the end now
            value, error = _Task(_drive(comm, request.program)), None
        elif isinstance(request, Wait):
            if not isinstance(request.task, _Task):
                value, error = None, ArgumentError(f"mpi rank {comm.rank}: waited on "
                                                   f"{request.task!r}, not a started task")
            else:
                value, error = request.task.value, None
        elif isinstance(request, Request):
            value, error = comm.serve(request), None
        else:
            raise not_a_request("mpi.run", comm.rank, request)


def _parse_bytes(text):
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in units else ""
    try:
        return int(float(text[:-1] if unit else text) * units[unit])
    except ValueError:
        raise ArgumentError(f"--bytes {text!r}: use a number with K, M or G (binary)") from None


def _reference(kind, comm, x, op, root, out=None):
    """The same collective by MPI's own routine (all-reduce into ``out`` if given)."""
    mpi_op = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}[op]
    c, p = comm._mpi, comm.size
    if kind == "allreduce":
        out = np.empty_like(x) if out is None else out
        c.Allreduce(x, out, op=mpi_op)
        return out
    if kind == "allgather":
        out = np.empty(x.size * p, dtype=x.dtype)
        c.Allgather(x, out)
        return out
    if kind == "reduce_scatter":
        from .collectives import block_bounds

        counts = [b - a for a, b in block_bounds(x.size, p)]
        out = np.empty(counts[comm.rank], dtype=x.dtype)
        c.Reduce_scatter(x, out, recvcounts=counts, op=mpi_op)
        return out
    if kind == "broadcast":
        out = x.copy()
        c.Bcast(out, root=root)
        return out
    out = np.empty_like(x)  # alltoall: equal blocks
    c.Alltoall(x, out)
    return out


def _ours(kind, algo, op, root):
    from . import collectives as coll

    def prog(comm, x):
        if kind in ("allreduce", "reduce_scatter"):
            return (yield from getattr(coll, kind)(comm, x, op=op, algo=algo))
        if kind == "broadcast":
            return (yield from coll.broadcast(comm, x, root=root, algo=algo))
        return (yield from getattr(coll, kind)(comm, x, algo=algo))
    return prog


def _timed(comm, contestants, iters):
    """Best over ``iters`` rounds of the slowest rank's time, contestants interleaved (so
    drifting load hits them alike); returns ``[(seconds, last output)]``."""
    best = [float("inf")] * len(contestants)
    outs = [None] * len(contestants)
    for _ in range(iters):
        for i, fn in enumerate(contestants):
            comm._mpi.Barrier()
            start = MPI.Wtime()
            outs[i] = fn()
            elapsed = comm._mpi.allreduce(MPI.Wtime() - start, op=MPI.MAX)
            best[i] = min(best[i], elapsed)
    return list(zip(best, outs))


def benchmark(kind="allreduce", algo="ring", nbytes=2**20, dtype="float32", op="sum", iters=5,
              root=0, comm=None):
    """Run ``kind`` by ``algo`` and by MPI on this process's communicator; return a dict with
    the max difference, both times and nccl-tests' algbw/busbw (same on every rank)."""
    from .collectives import cost

    comm = world() if comm is None else comm
    dtype = np.dtype(dtype)
    p = comm.size
    count = max(nbytes // dtype.itemsize, 0)
    if kind in ("allgather", "alltoall"):
        count -= count % p if kind == "alltoall" else 0
        count = count // p if kind == "allgather" else count
    rng = np.random.default_rng(1234 + comm.rank)
    x = (rng.integers(-50, 50, count) if dtype.kind in "iu" else rng.standard_normal(count))
    x = x.astype(dtype)
    prog = _ours(kind, algo, op, root)
    warm = np.empty_like(x)  # MPI with an output buffer kept warm across rounds
    (t_ours, ours), (t_mpi, ref), (t_warm, _) = _timed(
        comm, [lambda: run(prog, x, comm=comm), lambda: _reference(kind, comm, x, op, root),
               lambda: _reference(kind, comm, x, op, root, warm)], iters)
    diff = float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64)),
                        initial=0.0))
    diff = comm._mpi.allreduce(diff, op=MPI.MAX)
    size = count * dtype.itemsize * (p if kind == "allgather" else 1)
    tol = 0.0 if dtype.kind in "iu" or op in ("max", "min") else 1e-3 * max(1.0, p)
    return {"kind": kind, "algo": algo, "p": p, "bytes": size, "dtype": str(dtype),
            "max_diff": diff, "ok": diff <= tol, "time": t_ours, "mpi_time": t_mpi,
            "algbw": cost.algbw(size, t_ours), "busbw": cost.busbw(kind, size, t_ours, p),
            "mpi_algbw": cost.algbw(size, t_mpi), "mpi_busbw": cost.busbw(kind, size, t_mpi, p),
            "mpi_warm_time": t_warm, "mpi_warm_busbw": cost.busbw(kind, size, t_warm, p)}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mlsys_lab.distributed.mpi",
                                     description="Check a collective against MPI's own and "
                                                 "print nccl-tests' bandwidths.")
    parser.add_argument("kind", choices=["allreduce", "reduce_scatter", "allgather",
                                         "broadcast", "alltoall"])
    parser.add_argument("--algo", default=None)
    parser.add_argument("--bytes", default="1M", help="e.g. 1M, 16M, 4096 (binary units)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--op", default="sum", choices=["sum", "prod", "max", "min"])
    parser.add_argument("--iters", type=int, default=5)
    options = parser.parse_args(argv)
    from .collectives import ALGORITHMS

    algo = options.algo or ALGORITHMS[options.kind][0]
    comm = world()
    try:
        row = benchmark(options.kind, algo, _parse_bytes(options.bytes), options.dtype,
                        options.op, options.iters, comm=comm)
    except Exception as exc:  # noqa: BLE001 - one rank's error must end every rank
        print(f"rank {comm.rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(1)
        return 1
    if comm.rank == 0:
        verdict = "OK" if row["ok"] else "MISMATCH"
        print(f"{row['kind']} algo={row['algo']} p={row['p']} bytes={row['bytes']} "
              f"dtype={row['dtype']}: max |ours - MPI| = {row['max_diff']:.3g} {verdict}")
        print(f"  ours: {row['time'] * 1e3:9.3f} ms  algbw {row['algbw'] / 1e9:7.3f} GB/s  "
              f"busbw {row['busbw'] / 1e9:7.3f} GB/s")
        print(f"  MPI : {row['mpi_time'] * 1e3:9.3f} ms  algbw {row['mpi_algbw'] / 1e9:7.3f} "
              f"GB/s  busbw {row['mpi_busbw'] / 1e9:7.3f} GB/s   "
              f"(ours/MPI busbw {row['busbw'] / row['mpi_busbw']:.2f}x)")
        if row["kind"] == "allreduce":
            print(f"  MPI, output buffer reused: {row['mpi_warm_time'] * 1e3:9.3f} ms  busbw "
                  f"{row['mpi_warm_busbw'] / 1e9:7.3f} GB/s   (ours/that "
                  f"{row['busbw'] / row['mpi_warm_busbw']:.2f}x)")
    return 0 if row["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
