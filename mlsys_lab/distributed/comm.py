"""The Communicator contract, shared by the simulator (``sim``) and the MPI backend (``mpi``).

A rank program is a generator function whose first argument is a communicator. Every
communicator method except :meth:`Communicator.now` returns a *request*; the program ``yield``\\ s
it, and the value of the ``yield`` expression is the request's result (``yield from`` a
request works the same, so ``x = yield from comm.recv(0)`` is no error)::

    def shift(comm, x):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        got = yield comm.sendrecv(x, dst=right, src=left)
        yield comm.compute(flops=2 * x.size)
        return x + got

Requests are plain data (which communicator, which ranks, which array); the backend that drives
the generator (``sim.run`` or ``mpi.run``) decides what they cost and how the bytes move.

Semantics both backends share:

* ``send`` is *eager*: the sender never waits for the receiver to post ``recv`` (messages are
  buffered), so no program deadlocks because both sides send first.
* Messages between one pair of ranks with one tag arrive in the order they were sent (MPI's
  non-overtaking rule).
* The receiver gets a copy; it never aliases the sender's array.
* User tags are ``0 <= tag < TAG_LIMIT``; collectives use the tags above it, so a pending user
  message is never taken by a collective.
* ``recv_any`` receives from whichever rank's message comes first and gives ``(src, array)``
  (MPI's ``MPI_ANY_SOURCE``): what a server answering many clients needs.
* ``start(program)`` runs a generator in the background (a communication stream next to the
  compute, as PyTorch DDP's all-reduces run beside the backward pass) and gives a task;
  ``wait(task)`` gives its return value. The background program should talk over its own
  ``dup()`` of the communicator, so its messages never meet the foreground's. In the simulator
  the two run concurrently on the rank's device; under MPI ``start`` runs the program to the
  end at once (same values, no overlap).

Extensions beyond the shared contract (both backends implement them): ``exchange`` posts several
sends and receives at once (MPI's Isend/Irecv/Waitall); ``recv`` and ``sendrecv`` take
``out=`` (receive into a buffer of the message's shape and dtype, as MPI does); ``sub`` makes a
sub-communicator; ``device`` names the simulated device (``None`` under MPI); ``batched`` lets
a collective offer itself whole to the simulator (see ``sim``).

Choices the contract left open: ``send``/``recv`` to this rank itself are refused (a blocking
self-message is a deadlock under MPI); ``sendrecv`` with ``dst == src == rank`` is allowed and
free. Under MPI, ``sendrecv`` is an Isend/Irecv pair, not ``MPI_Sendrecv``, so that its wait can
time out (``mpi``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ArgumentError, DTypeError, MLSysError, ShapeError

TAG_LIMIT = 30000  # user tags are below, collectives' tags above (MPI guarantees >= 32767)
ANY_SOURCE = -1  # Recv.src of an any-source receive (``Communicator.recv_any``)


class CommError(MLSysError, RuntimeError):
    """A distributed program failed: deadlock, timeout, failed device or link."""


class DeadlockError(CommError):
    """Every live rank is blocked and no message can arrive. ``.blocked`` maps each blocked
    rank to a description of the operation it waits in."""

    def __init__(self, message, blocked=None):
        super().__init__(message)
        self.blocked = dict(blocked or {})


class CommTimeoutError(CommError, TimeoutError):
    """A blocking operation waited longer than its timeout (wall seconds under MPI, simulated
    seconds in the simulator)."""


class DeviceFailure(CommError):
    """A simulated device failed at ``.time``; ``.rank`` names it."""

    def __init__(self, message, rank=None, time=None):
        super().__init__(message)
        self.rank, self.time = rank, time


class LinkFailure(CommError):
    """A message needed a link after it failed at ``.time``; ``.link`` names it."""

    def __init__(self, message, link=None, time=None):
        super().__init__(message)
        self.link, self.time = link, time


# ------------------------------------------------------------------------------------ requests
@dataclass(eq=False)
class Request:
    """Base of everything a rank program may yield.

    ``x = yield request`` is the documented form; ``x = yield from request`` (the form of the
    collectives, and an easy slip) works too and gives the same value: iterating a request
    yields it once and returns what the backend sent back.
    """

    comm: Any

    def __iter__(self):
        return (yield self)


@dataclass(eq=False)
class Send(Request):
    array: Any
    dst: int
    tag: int = 0


@dataclass(eq=False)
class Recv(Request):
    src: int
    tag: int = 0
    out: Any = None


@dataclass(eq=False)
class SendRecv(Request):
    array: Any
    dst: int
    src: int
    tag: int = 0
    out: Any = None


@dataclass(eq=False)
class Exchange(Request):
    """Several sends and receives posted together; completes when all have."""

    sends: list = field(default_factory=list)  # [(array, dst, tag)]
    srcs: list = field(default_factory=list)  # [(src, tag)]
    tag: int = 0


@dataclass(eq=False)
class Compute(Request):
    flops: float | None = None
    seconds: float | None = None


@dataclass(eq=False)
class Start(Request):
    """Run ``program`` (a generator) in the background on this rank's device."""

    program: Any


@dataclass(eq=False)
class Wait(Request):
    """Wait for a background task started by :class:`Start`; gives its return value."""

    task: Any


@dataclass(eq=False)
class Batched(Request):
    """A whole collective offered to a backend that can run it for all ranks at once.

    ``fallback`` is the generator that runs the same collective message by message; a backend
    that cannot (or chooses not to) batch drives it instead, so results never depend on it.
    """

    name: str
    array: Any
    op: str
    fallback: Any
    plan: Any = None  # plan(arrays of all ranks, op) -> (results, step_bytes) or None


def as_message(array, where):
    """The array a request carries: a numpy array (lists and scalars are converted; a 0-d
    array stays 0-d). Object and structured dtypes are refused: under MPI a message is raw
    bytes plus shape and dtype code, which cannot carry them, and both backends must agree."""
    if hasattr(array, "__mlsys_symbolic__"):
        return array
    if not isinstance(array, np.ndarray):
        try:
            array = np.asarray(array)
        except Exception as exc:  # noqa: BLE001 - any conversion failure is the caller's
            raise ArgumentError(f"{where}: cannot send {type(array).__name__} (need an "
                                f"array)") from exc
    if array.dtype.hasobject or array.dtype.fields is not None:
        raise DTypeError(f"{where}: cannot send an array of dtype {array.dtype}: messages carry "
                         f"plain numeric, bool, complex or datetime arrays (send the fields "
                         f"as separate arrays)")
    return array


def _out(out, where):
    if out is None:
        return None
    if not (isinstance(out, np.ndarray) and out.flags.c_contiguous and out.flags.writeable):
        raise ArgumentError(f"{where}: out= must be a writeable C-contiguous numpy array, got "
                            f"{type(out).__name__}")
    return out


def check_fits(out, shape, dtype, src, where):
    """Raise unless a message of ``shape`` and ``dtype`` from ``src`` fits ``out`` exactly."""
    hint = "(in a collective: every rank must pass the same shape and dtype)"
    if tuple(shape) != out.shape:
        raise ShapeError(f"{where}: the message from rank {src} has shape {tuple(shape)} but "
                         f"the receive buffer has {out.shape} {hint}")
    if dtype != out.dtype:
        raise DTypeError(f"{where}: the message from rank {src} is {dtype} but the receive "
                         f"buffer is {out.dtype} {hint}")


def fill(out, received, src, where):
    """Copy a received array into ``out`` after checking that it fits; returns ``out``."""
    check_fits(out, received.shape, received.dtype, src, where)
    out[...] = received
    return out


# --------------------------------------------------------------------------------- the contract
class Communicator:
    """A group of ``size`` ranks seen from rank ``rank``; backends subclass it.

    Subclasses implement :meth:`now`, :meth:`_make_sub` and set ``device``.
    """

    supports_batching = False
    device = None

    def __init__(self, rank: int, size: int):
        self.rank, self.size = int(rank), int(size)

    def __repr__(self):
        return f"{type(self).__name__}(rank={self.rank}, size={self.size})"

    # -- checks -----------------------------------------------------------------------------
    def _peer(self, value, what, where):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ArgumentError(f"{where}: {what}={value!r} must be an int rank "
                                f"(rank {self.rank} of {self.size})")
        value = int(value)
        if not 0 <= value < self.size:
            raise ArgumentError(f"{where}: {what}={value} is not a rank of this communicator "
                                f"(size {self.size}); called on rank {self.rank}")
        return value

    def _tag(self, tag, where, internal=False):
        if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
            raise ArgumentError(f"{where}: tag={tag!r} must be an int")
        limit = 2 * TAG_LIMIT if internal else TAG_LIMIT
        if not 0 <= int(tag) < limit:
            raise ArgumentError(f"{where}: tag={tag} must be in 0..{TAG_LIMIT - 1} "
                                f"(rank {self.rank})")
        return int(tag)

    def _not_self(self, peer, what, where):
        if peer == self.rank:
            raise ArgumentError(f"{where}: {what}={peer} is this rank itself; a rank cannot "
                                f"send a message to itself")

    # -- requests ---------------------------------------------------------------------------
    def send(self, array, dst, tag=0, *, _internal=False):
        """Request: send ``array`` to rank ``dst``; the yield gives ``None``."""
        where = f"comm.send (rank {self.rank})"
        dst = self._peer(dst, "dst", where)
        self._not_self(dst, "dst", where)
        return Send(self, as_message(array, where), dst, self._tag(tag, where, _internal))

    def recv(self, src, tag=0, out=None, *, _internal=False):
        """Request: receive from rank ``src``; the yield gives the array (a copy), or ``out``
        filled with it (a contiguous array of the message's shape and dtype)."""
        where = f"comm.recv (rank {self.rank})"
        src = self._peer(src, "src", where)
        self._not_self(src, "src", where)
        return Recv(self, src, self._tag(tag, where, _internal), _out(out, where))

    def recv_any(self, tag=0, out=None):
        """Request: receive the first message with ``tag`` from any rank; the yield gives
        ``(src, array)`` (``array`` is ``out``, filled, when given). The simulator picks the
        message that arrives first (ties: the lowest source rank)."""
        where = f"comm.recv_any (rank {self.rank})"
        return Recv(self, ANY_SOURCE, self._tag(tag, where), _out(out, where))

    def sendrecv(self, array, dst, src, tag=0, out=None, *, _internal=False):
        """Request: send ``array`` to ``dst`` and receive from ``src`` at the same time; the
        yield gives the received array (or ``out``, filled, as for :meth:`recv`).
        ``dst == src == rank`` returns a copy, free."""
        where = f"comm.sendrecv (rank {self.rank})"
        dst, src = self._peer(dst, "dst", where), self._peer(src, "src", where)
        if (dst == self.rank) != (src == self.rank):
            raise ArgumentError(f"{where}: dst={dst}, src={src}: only both may be this rank")
        return SendRecv(self, as_message(array, where), dst, src,
                        self._tag(tag, where, _internal), _out(out, where))

    def exchange(self, sends=(), srcs=(), tag=0, *, _internal=False):
        """Request: post every ``(array, dst)`` in ``sends`` and a receive from every rank in
        ``srcs`` at once; the yield gives the received arrays in ``srcs`` order. An item may
        carry its own tag: ``(array, dst, tag)`` and ``(src, tag)``."""
        where = f"comm.exchange (rank {self.rank})"
        checked, peers = [], []
        for item in sends:
            if not (isinstance(item, tuple) and len(item) in (2, 3)):
                raise ArgumentError(f"{where}: sends must hold (array, dst) pairs, got {item!r}")
            dst = self._peer(item[1], "dst", where)
            self._not_self(dst, "dst", where)
            item_tag = self._tag(item[2] if len(item) == 3 else tag, where, _internal)
            checked.append((as_message(item[0], where), dst, item_tag))
        for item in srcs:
            src, item_tag = item if isinstance(item, tuple) else (item, tag)
            src = self._peer(src, "src", where)
            self._not_self(src, "src", where)
            peers.append((src, self._tag(item_tag, where, _internal)))
        return Exchange(self, checked, peers, self._tag(tag, where, _internal))

    def compute(self, flops=None, seconds=None):
        """Request: local work of ``flops`` operations or ``seconds`` (free under MPI, where the
        real work takes real time)."""
        where = f"comm.compute (rank {self.rank})"
        if (flops is None) == (seconds is None):
            raise ArgumentError(f"{where}: give exactly one of flops= or seconds=")
        value = flops if seconds is None else seconds
        if not isinstance(value, (int, float, np.integer, np.floating)) or not value >= 0:
            raise ArgumentError(f"{where}: flops/seconds must be a number >= 0, got {value!r}")
        return Compute(self, None if flops is None else float(flops),
                       None if seconds is None else float(seconds))

    def start(self, program):
        """Request: run the generator ``program`` in the background; the yield gives a task
        for :meth:`wait`."""
        if not (hasattr(program, "send") and hasattr(program, "throw")):
            raise ArgumentError(f"comm.start (rank {self.rank}): need a generator (call the "
                                f"generator function), got {type(program).__name__}")
        return Start(self, program)

    def wait(self, task):
        """Request: wait for a background ``task``; the yield gives its return value."""
        return Wait(self, task)

    def dup(self) -> Communicator:
        """A communicator over the same ranks whose messages never match this one's (every
        rank must call it, in the same order)."""
        return self._make_dup()

    def _make_dup(self):
        raise NotImplementedError

    def batched(self, name, array, op, fallback, plan):
        """Request used by the collectives: offer the whole collective to the backend."""
        return Batched(self, name, array, op, fallback, plan)

    def now(self) -> float:
        """This rank's current time in seconds (simulated, or wall since start under MPI)."""
        raise NotImplementedError

    # -- groups -----------------------------------------------------------------------------
    def sub(self, ranks) -> Communicator:
        """A communicator over ``ranks`` (ranks of this communicator, in the new order).

        Every member must call it with the same list; this rank must be in it. Ranks, sizes and
        tags of the result are local to the group.
        """
        where = f"comm.sub (rank {self.rank})"
        members = [self._peer(r, "ranks[i]", where) for r in ranks]
        if len(set(members)) != len(members):
            raise ArgumentError(f"{where}: ranks {list(ranks)} repeat a rank")
        if self.rank not in members:
            raise ArgumentError(f"{where}: this rank ({self.rank}) is not in {members}")
        return self._make_sub(members)

    def _make_sub(self, members):
        raise NotImplementedError


def not_a_request(backend, rank, value):
    """The error for a rank program that yielded ``value``, which is no request; a generator
    (a collective called with ``yield``) is told to use ``yield from``."""
    if hasattr(value, "send") and hasattr(value, "throw"):
        name = getattr(value, "__name__", type(value).__name__)
        return ArgumentError(f"{backend}: rank {rank} yielded the generator {name}(...); call "
                             f"collectives (generator functions) with `yield from`, e.g. "
                             f"`x = yield from allreduce(comm, x)`, and requests with `yield`")
    return ArgumentError(f"{backend}: rank {rank} yielded {type(value).__name__} "
                         f"{value!r:.60}; yield the requests comm methods return")
