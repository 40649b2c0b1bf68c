"""A deterministic discrete-event simulator of a cluster running rank programs.

Each rank runs an ordinary generator function over a :class:`~.comm.Communicator` and moves real
numpy arrays, so one run gives both the values and the simulated time::

    from mlsys_lab.distributed import sim
    from mlsys_lab.distributed.collectives import allreduce

    def prog(comm, x):
        return (yield from allreduce(comm, x))

    cluster = sim.Cluster(sim.ring(4, alpha=5e-6, beta=1 / 25e9))
    res = sim.run(cluster, prog, args=[(np.arange(8.0) * r,) for r in range(4)])
    res.results[0], res.time, res.trace[:3]

The model
---------
* Time advances per rank. ``compute(flops=f)`` costs ``f / device.flops`` seconds.
* A message of ``n`` bytes from ``a`` to ``b`` follows ``topology.route(a, b)`` and streams at
  the route's bottleneck rate ``1 / max(beta)``: it takes ``n * max(beta)`` seconds and arrives
  ``sum(alpha)`` after its last byte left (cut-through; see :mod:`.topology`).
* Contention: a message *reserves* its rate on every link direction of its route, and starts
  once each of them has that much bandwidth to spare; link directions serve messages FIFO in
  the order they were issued (ties: lower rank first), without backfilling. So two messages
  that each need a whole link queue one behind the other, while a link with twice a NIC's
  bandwidth (a 1:1 uplink over two NICs) carries two NIC-rate messages side by side, and an
  oversubscribed one makes them wait. A message's arrival is fixed when it is sent: nothing
  issued later can slow it down. ``Result.link_busy`` is bytes carried times the link's beta.
* A rank is busy in a ``send`` until its message has arrived (one message at a time per rank,
  the classic alpha-beta accounting); ``sendrecv`` and ``exchange`` keep their sends and
  receives in flight together (full duplex). A receive completes at ``max(posted, arrival)``.
* Sends are eager: a message waits in the receiver's mailbox until a matching ``recv``.
* If every unfinished rank is blocked and nothing can arrive, ``run`` raises
  :class:`~.comm.DeadlockError` naming each rank and what it waits for. ``time_limit``
  (simulated) and ``wall_limit`` (real seconds) bound every run.

Batched collectives
-------------------
A 1,024-rank ring all-reduce has two million messages: too many to simulate one by one in a
second. Collectives therefore offer themselves whole (``comm.batched``); when *every* rank of
the cluster has entered the same one, no other message was issued meanwhile, the ring's routes
share no link and no earlier message still holds one, the engine runs it in one go: the data
by the algorithm's own order of operations (:func:`.collectives.ring_plan`) and the times by
the very same per-message arithmetic, vectorised over ranks with numpy (per-link alpha and
beta, so a slow link shows).
Otherwise it runs the collective's generator message by message from each rank's entry time
(exact too, since nothing else was sent meanwhile; the one inexact case: messages sent by ranks
*while* others waited to batch are ordered before the collective's on shared links, where a
run with ``batched=False`` could interleave them). Tests check that both paths give identical
times, trace and data at p = 64. At p = 1,024 x 256 MiB the data cannot exist, so
:class:`SymbolicArray` carries shape and dtype without values: its runs check timing only.
"""

from __future__ import annotations

import heapq
import time as _time
from collections import deque, namedtuple

import numpy as np

from ..errors import ArgumentError, ShapeError
from .comm import (
    TAG_LIMIT,
    Batched,
    CommTimeoutError,
    Communicator,
    Compute,
    DeadlockError,
    DeviceFailure,
    LinkFailure,
    Recv,
    Request,
    Send,
    SendRecv,
    fill,
)
from .topology import Device, Topology, fully_connected, ring, tree, two_level

__all__ = ["Cluster", "Device", "Result", "SimCommunicator", "SymbolicArray", "Topology",
           "TraceEvent", "fully_connected", "ring", "run", "tree", "two_level"]

TraceEvent = namedtuple("TraceEvent", "rank kind start end bytes src dst link")
TraceEvent.__doc__ = """One interval of the timeline: ``kind`` is ``compute``, ``send`` (a
transfer, on the sender's row, ``link`` the names of the link directions it held), or ``recv``
(from posting to completion, on the receiver's row)."""


class SymbolicArray:
    """Shape and dtype without values: lets the simulator time collectives whose data could
    not fit in memory. Slicing, reshaping, ufuncs and concatenation give symbolic results;
    asking for values raises."""

    __mlsys_symbolic__ = True

    def __init__(self, shape, dtype="float32"):
        self.shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    def __repr__(self):
        return f"SymbolicArray(shape={self.shape}, dtype={self.dtype})"

    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    ndim = property(lambda self: len(self.shape))
    itemsize = property(lambda self: self.dtype.itemsize)
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def __len__(self):
        return self.shape[0]

    def copy(self):
        return SymbolicArray(self.shape, self.dtype)

    def astype(self, dtype):
        return SymbolicArray(self.shape, dtype)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and not np.isscalar(shape[0]) else shape
        return SymbolicArray(_reshaped(self.size, shape), self.dtype)

    def __getitem__(self, index):
        if self.ndim != 1 or not isinstance(index, slice):
            raise ArgumentError("SymbolicArray: only 1-d slices are supported")
        return SymbolicArray(len(range(self.shape[0])[index]), self.dtype)

    def __array__(self, *args, **kwargs):
        raise ArgumentError("SymbolicArray has no values (it models size only)")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs:
            return NotImplemented
        shapes = [np.shape(x) if not isinstance(x, SymbolicArray) else x.shape for x in inputs]
        dtypes = [x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype for x in inputs]
        if len(set(shapes)) != 1:
            raise ShapeError(f"{ufunc.__name__}: symbolic operands of shapes {shapes}")
        return SymbolicArray(shapes[0], np.result_type(*dtypes))


def _reshaped(size, shape):
    shape = [int(s) for s in shape]
    if shape.count(-1) == 1:
        known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
        shape[shape.index(-1)] = size // known if known else 0
    if int(np.prod(shape, dtype=np.int64)) != size:
        raise ShapeError(f"SymbolicArray.reshape: cannot reshape size {size} into {shape}")
    return tuple(shape)


class Cluster:
    """A topology ready to run rank programs.

    Args:
        topology: from :func:`ring`, :func:`fully_connected`, :func:`tree`, :func:`two_level`
            or a hand-built :class:`Topology`.
        batch_collectives: let whole-cluster ring collectives run batched (same results).
    """

    def __init__(self, topology, batch_collectives=True):
        if not isinstance(topology, Topology):
            raise ArgumentError(f"Cluster: need a Topology, got {type(topology).__name__}")
        self.topology = topology
        self.batch_collectives = bool(batch_collectives)

    @property
    def size(self):
        return self.topology.num_ranks

    def __repr__(self):
        return f"Cluster({self.topology!r})"


class SimCommunicator(Communicator):
    """The simulator's communicator; ``group`` holds the global ranks of its members."""

    def __init__(self, engine, group, rank):
        super().__init__(rank, len(group))
        self._engine = engine
        self.group = group
        self.global_rank = group[rank]
        self.context = engine.context_id(group)
        self.device = engine.topology.devices[self.global_rank]
        self.supports_batching = engine.batching and len(group) == engine.size

    def now(self):
        return self._engine.clock[self.global_rank]

    def _make_sub(self, members):
        return SimCommunicator(self._engine, tuple(self.group[m] for m in members),
                               members.index(self.rank))


class Result:
    """What :func:`run` returns.

    Attributes:
        results: each rank's return value. time: the simulated makespan (seconds).
        rank_time: when each rank finished. trace: :class:`TraceEvent` list (``trace=True``).
        link_busy: seconds each link direction carried bytes, by link name (only links used).
        messages, bytes: totals sent. unmatched: messages never received (src, dst, tag, bytes).
    """

    def __init__(self, engine):
        self.results = engine.results
        self.rank_time = list(engine.finish)
        self.time = max(self.rank_time) if self.rank_time else 0.0
        self.trace = engine.trace
        topo = engine.topology
        self.link_busy = {topo.link_name(i): b for i, b in enumerate(engine.busy) if b > 0}
        self.messages, self.bytes = engine.messages, engine.bytes_sent
        self.unmatched = [(k[0], k[1], k[3], m[2]) for k, q in engine.mailbox.items() for m in q]

    def __repr__(self):
        return (f"<sim.Result: {len(self.results)} ranks, time {self.time:.6g} s, "
                f"{self.messages} messages, {self.bytes} bytes>")


def _capacity(beta):
    """Bytes per second of a link, with a hair of slack for rounding in sums of rates."""
    return float("inf") if beta == 0 else (1.0 / beta) * (1 + 1e-9)


class _Op:
    """A blocked operation: waits for its receives, then resumes the rank at ``ready``."""

    __slots__ = ("rank", "posted", "ready", "outstanding", "values", "single", "what", "out")

    def __init__(self, rank, posted, what, single):
        self.rank, self.posted, self.ready, self.what = rank, posted, posted, what
        self.outstanding, self.values, self.single = 0, [], single
        self.out = getattr(what, "out", None)


def _describe(req):
    tag = req.tag if getattr(req, "tag", 0) < TAG_LIMIT else f"collective {req.tag}"
    if isinstance(req, Recv):
        return f"recv(src={req.src}, tag={tag})"
    if isinstance(req, SendRecv):
        return f"sendrecv(dst={req.dst}, src={req.src}, tag={tag})"
    return f"exchange(dsts={[d for _, d, _ in req.sends]}, srcs={[s for s, _ in req.srcs]})"


class _Engine:
    def __init__(self, cluster, trace, batching, time_limit, wall_limit, failures,
                 link_failures):
        self.topology = cluster.topology
        self.size = cluster.size
        self.batching = cluster.batch_collectives if batching is None else bool(batching)
        self.record = bool(trace)
        self.time_limit, self.wall_limit = time_limit, wall_limit
        self.clock = [0.0] * self.size
        self.finish = [0.0] * self.size
        self.done = [False] * self.size
        self.results = [None] * self.size
        self.stacks = [[] for _ in range(self.size)]
        self.trace = []
        links = len(self.topology.link_ends)
        self.last_start = [0.0] * links  # FIFO: no message starts before an earlier one
        self.reserved = [[] for _ in range(links)]  # (end, rate) of messages on each link
        self.busy = [0.0] * links
        self.heap, self.pending_value = [], {}
        self.mailbox, self.waiting, self.blocked = {}, {}, {}
        self.contexts, self.route_cache = {}, {}
        self.messages = self.bytes_sent = 0
        self.batch, self.batch_sends = {}, 0
        self.failures = dict(failures or {})
        self.link_failures = {self.topology.link(*k): (k, v)
                              for k, v in (link_failures or {}).items()}

    def context_id(self, group):
        return self.contexts.setdefault(group, len(self.contexts))

    # -- scheduling -------------------------------------------------------------------------
    def schedule(self, rank, when, value=None):
        self.pending_value[rank] = value
        heapq.heappush(self.heap, (when, rank))

    def loop(self):
        started, events = _time.perf_counter(), 0
        while True:
            if not self.heap:
                if self.batch:
                    self.unbatch()
                    continue
                if not all(self.done):
                    self.deadlock()
                return
            when, rank = heapq.heappop(self.heap)
            self.check_limits(when, rank)
            events += 1
            if self.wall_limit is not None and events % 4096 == 0 and \
                    _time.perf_counter() - started > self.wall_limit:
                raise CommTimeoutError(f"sim.run: more than wall_limit={self.wall_limit} s of "
                                       f"real time (simulated time {when:.6g} s)")
            self.clock[rank] = when
            value = self.pending_value.pop(rank)
            request = self.advance(rank, value)
            if request is not None:
                self.dispatch(rank, when, request)

    def check_limits(self, when, rank):
        for failed, at in self.failures.items():
            if when >= at:
                raise DeviceFailure(f"sim.run: device {failed} failed at t={at:.6g} s",
                                    rank=failed, time=at)
        if self.time_limit is not None and when > self.time_limit:
            raise CommTimeoutError(f"sim.run: simulated time passed time_limit="
                                   f"{self.time_limit} s (rank {rank} at t={when:.6g} s)")

    def advance(self, rank, value, error=None):
        stack = self.stacks[rank]
        while True:
            gen = stack[-1]
            try:
                request = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                stack.pop()
                value, error = stop.value, None
                if not stack:
                    self.done[rank], self.results[rank] = True, value
                    self.finish[rank] = self.clock[rank]
                    return None
                continue
            except Exception as exc:
                stack.pop()
                if not stack:
                    if hasattr(exc, "add_note"):
                        exc.add_note(f"(in simulated rank {rank} at t={self.clock[rank]:.6g} s)")
                    raise
                error = exc
                continue
            if not isinstance(request, Request):
                raise ArgumentError(f"sim.run: rank {rank} yielded {type(request).__name__} "
                                    f"{request!r:.60}; yield the requests comm methods return")
            if getattr(request.comm, "_engine", None) is not self:
                raise ArgumentError(f"sim.run: rank {rank} yielded a request of a communicator "
                                    f"from another run")
            return request

    # -- requests ---------------------------------------------------------------------------
    def dispatch(self, rank, now, req):
        group = req.comm.group
        if isinstance(req, Compute):
            seconds = req.seconds if req.seconds is not None else \
                req.flops / self.topology.devices[rank].flops
            end = now + seconds
            if self.record:
                self.trace.append(TraceEvent(rank, "compute", now, end, 0, None, None, None))
            self.schedule(rank, end)
        elif isinstance(req, Send):
            self.schedule(rank, self.transfer(rank, group[req.dst], req.comm.context, req.tag,
                                              req.array, now))
        elif isinstance(req, Batched):
            self.join_batch(rank, now, req)
        else:
            self.post(rank, now, req)

    def post(self, rank, now, req):
        group, ctx = req.comm.group, req.comm.context
        if isinstance(req, Recv):
            sends, srcs, single = (), ((req.src, req.tag),), True
        elif isinstance(req, SendRecv):
            if req.dst == req.comm.rank:
                out = req.array.copy() if req.out is None else \
                    fill(req.out, req.array, rank, "sendrecv")
                self.schedule(rank, now, out)
                return
            sends, srcs, single = ((req.array, req.dst, req.tag),), ((req.src, req.tag),), True
        else:
            sends, srcs, single = req.sends, req.srcs, False
        op = _Op(rank, now, req, single)
        for array, dst, tag in sends:
            arrival = self.transfer(rank, group[dst], ctx, tag, array, now)
            op.ready = max(op.ready, arrival)
        op.values = [None] * len(srcs)
        for slot, (src, tag) in enumerate(srcs):
            key = (group[src], rank, ctx, tag)
            queue = self.mailbox.get(key)
            if queue:
                self.match(op, slot, key, queue.popleft())
                if not queue:
                    del self.mailbox[key]
            else:
                op.outstanding += 1
                self.waiting.setdefault(key, deque()).append((op, slot))
        if op.outstanding:
            self.blocked[rank] = op
        else:
            self.complete(op)

    def match(self, op, slot, key, message):
        arrival, array, nbytes = message
        done = max(op.posted, arrival)
        op.ready = max(op.ready, done)
        if op.out is not None:
            array = fill(op.out, array, key[0], f"rank {op.rank}: {_describe(op.what)}")
        op.values[slot] = array
        if self.record:
            self.trace.append(TraceEvent(op.rank, "recv", op.posted, done, nbytes, key[0],
                                         op.rank, None))

    def complete(self, op):
        self.blocked.pop(op.rank, None)
        self.schedule(op.rank, op.ready, op.values[0] if op.single else op.values)

    def route(self, src, dst):
        found = self.route_cache.get((src, dst))
        if found is None:
            route = self.topology.route(src, dst)
            grow = len(self.topology.link_ends) - len(self.busy)  # links made on first use
            if grow > 0:
                self.last_start += [0.0] * grow
                self.reserved += [[] for _ in range(grow)]
                self.busy += [0.0] * grow
            found = self.route_cache[(src, dst)] = (route, *self.topology.route_cost(route))
        return found

    def transfer(self, src, dst, ctx, tag, array, now):
        """Reserve the route, put the message in ``dst``'s mailbox; returns its arrival."""
        route, alpha, beta = self.route(src, dst)
        nbytes = array.nbytes
        duration = nbytes * beta
        start = now
        for link in route:
            if self.last_start[link] > start:
                start = self.last_start[link]
        if duration > 0:
            start = self.earliest_start(route, start, 1.0 / beta)
        end = start + duration
        topo = self.topology
        for link in route:
            self.last_start[link] = start
            if duration > 0:
                self.reserved[link].append((end, 1.0 / beta))
            self.busy[link] += nbytes * topo.beta[link]
            if link in self.link_failures and end > self.link_failures[link][1]:
                ends, at = self.link_failures[link]
                raise LinkFailure(f"sim.run: link {topo.link_name(link)} failed at "
                                  f"t={at:.6g} s (rank {src} -> {dst} needed it)",
                                  link=ends, time=at)
        arrival = end + alpha
        self.messages += 1
        self.bytes_sent += nbytes
        self.batch_sends += 1
        if self.record:
            names = tuple(topo.link_name(link) for link in route)
            self.trace.append(TraceEvent(src, "send", start, arrival, nbytes, src, dst, names))
        self.deliver((src, dst, ctx, tag), (arrival, array.copy(), nbytes))
        return arrival

    def earliest_start(self, route, t0, rate):
        """The first time from ``t0`` at which every link of ``route`` has ``rate`` bytes/s
        to spare. Messages on a link all started by ``t0``, so its load only falls later."""
        ends = [t0]
        for link in route:
            live = [item for item in self.reserved[link] if item[0] > t0]
            self.reserved[link] = live
            ends += [end for end, _ in live]
        if len(ends) == 1:
            return t0
        beta = self.topology.beta
        for when in sorted(set(ends)):
            if all(sum(r for end, r in self.reserved[link] if end > when) + rate
                   <= _capacity(beta[link]) for link in route):
                return when
        return max(ends)  # unreachable: once every earlier message ended, any link has room

    def deliver(self, key, message):
        waiters = self.waiting.get(key)
        if waiters:
            op, slot = waiters.popleft()
            if not waiters:
                del self.waiting[key]
            self.match(op, slot, key, message)
            op.outstanding -= 1
            if not op.outstanding:
                self.complete(op)
        else:
            self.mailbox.setdefault(key, deque()).append(message)

    def deadlock(self):
        lines, blocked = [], {}
        for rank in range(self.size):
            if self.done[rank]:
                continue
            op = self.blocked.get(rank)
            what = _describe(op.what) if op else "nothing (never resumed)"
            if op and op.what.comm.size != self.size:
                what += f" in sub-communicator {list(op.what.comm.group)}"
            since = f" since t={op.posted:.6g} s" if op else ""
            blocked[rank] = what
            lines.append(f"  rank {rank}: {what}{since}")
        raise DeadlockError("sim.run: deadlock: every unfinished rank is blocked and no "
                            "message is in flight:\n" + "\n".join(lines), blocked)

    # -- batched collectives ----------------------------------------------------------------
    def join_batch(self, rank, now, req):
        if not (req.comm.supports_batching and self.ring_routes_disjoint()):
            self.fall_back(rank, now, req)
            return
        if not self.batch:
            self.batch_sends = 0
        self.batch[rank] = (now, req)
        if len(self.batch) == self.size:
            self.run_batch()

    def fall_back(self, rank, now, req):
        self.stacks[rank].append(req.fallback)
        self.schedule(rank, now)

    def unbatch(self):
        batch, self.batch = self.batch, {}
        for rank, (now, req) in sorted(batch.items()):
            self.fall_back(rank, now, req)

    def ring_routes_disjoint(self):
        """Batching needs the ring's routes to share no link (and no link to fail)."""
        if not hasattr(self, "_disjoint"):
            links = [link for r in range(self.size)
                     for link in self.route(r, (r + 1) % self.size)[0]]
            self._disjoint = len(links) == len(set(links)) and \
                not self.link_failures.keys() & set(links)
        return self._disjoint

    def ring_links_idle(self, since):
        """No earlier message still holds a link of the ring after ``since``."""
        p = self.size
        return all(end <= since for r in range(p) for link in self.route(r, (r + 1) % p)[0]
                   for end, _ in self.reserved[link])

    def run_batch(self):
        entries = [self.batch[r] for r in range(self.size)]
        first = entries[0][1]
        same = all(req.name == first.name and req.op == first.op for _, req in entries)
        if not same or self.batch_sends:
            self.unbatch()
            return
        plan = first.plan([req.array for _, req in entries], first.op)
        if plan is None:  # the plan found mismatched inputs: the fallback reports them
            self.unbatch()
            return
        results, step_bytes = plan
        start = np.array([now for now, _ in entries])
        if not self.ring_links_idle(start.min()):
            self.unbatch()
            return
        if self.failures and self.time_ring_steps(start, step_bytes, probe=True) is None:
            self.unbatch()
            return
        ends = self.time_ring_steps(start, step_bytes, probe=False)
        self.batch = {}
        for rank in range(self.size):
            self.schedule(rank, float(ends[rank]), results[rank])

    def time_ring_steps(self, t, step_bytes, probe):
        """Times of ``len(step_bytes)`` ring-shift steps (rank r sends ``step_bytes[s, r]``
        bytes to r + 1 and receives from r - 1), by the same arithmetic as ``transfer``."""
        p = self.size
        routes = [self.route(r, (r + 1) % p) for r in range(p)]
        alpha = np.array([a for _, a, _ in routes])
        beta = np.array([b for _, _, b in routes])
        free = np.zeros(p)
        names = [tuple(self.topology.link_name(link) for link in route)
                 for route, _, _ in routes] if self.record and not probe else None
        ranks = np.arange(p)
        busy = np.zeros(p)
        for nbytes in step_bytes:
            start = np.maximum(t, free)
            duration = nbytes * beta
            end = start + duration
            free = end
            arrival = end + alpha
            done = np.maximum(arrival, np.maximum(t, np.roll(arrival, 1)))
            if probe:
                if self.failures and done.max() >= min(self.failures.values()):
                    return None
            else:
                busy += nbytes
                self.account_step(ranks, t, start, arrival, nbytes, names)
            t = done
        if not probe:
            topo = self.topology
            for r, (route, _, rbeta) in enumerate(routes):
                for link in route:
                    self.last_start[link] = float(start[r])
                    if end[r] > start[r]:
                        self.reserved[link] = [(float(end[r]), 1.0 / rbeta)]
                    self.busy[link] += float(busy[r]) * topo.beta[link]
        return t

    def account_step(self, ranks, posted, start, arrival, nbytes, names):
        p = self.size
        self.messages += p
        self.bytes_sent += int(nbytes.sum())
        if names is None:
            return
        left = np.roll(ranks, 1)
        recv_done = np.maximum(posted, np.roll(arrival, 1))
        for r in range(p):
            self.trace.append(TraceEvent(r, "send", float(start[r]), float(arrival[r]),
                                         int(nbytes[r]), r, (r + 1) % p, names[r]))
            self.trace.append(TraceEvent(r, "recv", float(posted[r]), float(recv_done[r]),
                                         int(nbytes[left[r]]), int(left[r]), r, None))


def run(cluster, prog, args=None, kwargs=None, *, trace=True, batched=None, time_limit=None,
        wall_limit=120.0, failures=None, link_failures=None):
    """Run ``prog(comm, *args[rank], **kwargs)`` on every rank of ``cluster``.

    Args:
        cluster: a :class:`Cluster`.
        prog: a generator function ``prog(comm, ...)`` (a plain function runs without
            communicating).
        args: one tuple of arguments per rank (``None``: no arguments).
        kwargs: keyword arguments for every rank.
        trace: record the :class:`TraceEvent` timeline.
        batched: override ``cluster.batch_collectives``.
        time_limit: stop with :class:`~.comm.CommTimeoutError` past this simulated time.
        wall_limit: ... or after this many real seconds.
        failures: ``{rank: t}``: the device fails at simulated time ``t``; the run stops there
            with :class:`~.comm.DeviceFailure` (a synchronous job cannot go on without it).
        link_failures: ``{(u, v): t}``: a message that needs link ``u - v`` past ``t`` stops the
            run with :class:`~.comm.LinkFailure`.

    Returns:
        a :class:`Result`.
    """
    if not isinstance(cluster, Cluster):
        raise ArgumentError(f"sim.run: need a Cluster, got {type(cluster).__name__}")
    if not callable(prog):
        raise ArgumentError(f"sim.run: prog must be a generator function, got {prog!r}")
    p = cluster.size
    if args is None:
        args = [()] * p
    args = list(args)
    if len(args) != p:
        raise ArgumentError(f"sim.run: args has {len(args)} entries for {p} ranks")
    for rank, at in (failures or {}).items():
        if not (isinstance(rank, int) and 0 <= rank < p and at >= 0):
            raise ArgumentError(f"sim.run: failures={{{rank!r}: {at!r}}} needs a rank of {p} "
                                f"and a time >= 0")
    engine = _Engine(cluster, trace, batched, time_limit, wall_limit, failures, link_failures)
    world = tuple(range(p))
    for rank in range(p):
        comm = SimCommunicator(engine, world, rank)
        rank_args = args[rank] if isinstance(args[rank], tuple) else (args[rank],)
        program = prog(comm, *rank_args, **(kwargs or {}))
        if hasattr(program, "send") and hasattr(program, "throw"):
            engine.stacks[rank].append(program)
            engine.schedule(rank, 0.0)
        else:
            engine.done[rank], engine.results[rank] = True, program
    engine.loop()
    return Result(engine)
