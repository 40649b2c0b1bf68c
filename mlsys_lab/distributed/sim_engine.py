"""The simulator's event loop: drives the rank generators, matches messages, detects deadlock.

:mod:`.sim` holds the public face (``Cluster``, ``run``, ``Result``) and the model's
description; :mod:`.sim_network` how messages share links; :mod:`.sim_batch` the batched ring
path this engine mixes in.
"""

from __future__ import annotations

import heapq
import time as _time
from collections import deque

from ..errors import ArgumentError
from .comm import (
    ANY_SOURCE,
    TAG_LIMIT,
    Batched,
    CommTimeoutError,
    Compute,
    DeadlockError,
    DeviceFailure,
    LinkFailure,
    Recv,
    Request,
    Send,
    SendRecv,
    Start,
    Wait,
    fill,
    not_a_request,
)
from .sim_batch import BatchedRing
from .sim_network import FairNetwork, ReservationNetwork
from .sim_trace import TraceEvent

__all__ = ["Engine", "TraceEvent"]


_NET = -1  # heap entry: the fair network's next flow end (before ranks at the same time)
_TIMER = 1 << 62  # heap entry: look again at any-source receives (after ranks)
# heap entries -2 - rank: a one-port rank's next queued send of an exchange


class _Op:
    """A blocked operation: waits for its receives (and, under fair sharing, its sends), then
    resumes the rank at ``ready``."""

    __slots__ = ("rank", "dev", "posted", "ready", "outstanding", "values", "single", "what",
                 "out", "any")

    def __init__(self, rank, dev, posted, what, single):
        self.rank, self.dev, self.posted, self.ready, self.what = rank, dev, posted, posted, what
        self.outstanding, self.values, self.single = 0, [], single
        self.out = getattr(what, "out", None)
        self.any = None  # (ctx, tag) of an any-source receive


def _describe(req):
    tag = getattr(req, "tag", 0)
    tag = tag if tag < TAG_LIMIT else f"collective {tag}"
    if isinstance(req, Recv):
        src = "any" if req.src == ANY_SOURCE else req.src
        return f"recv(src={src}, tag={tag})"
    if isinstance(req, Send):
        return f"send(dst={req.dst}, tag={tag})"
    if isinstance(req, Wait):
        return "wait(background task)"
    if isinstance(req, SendRecv):
        return f"sendrecv(dst={req.dst}, src={req.src}, tag={tag})"
    return f"exchange(dsts={[d for _, d, _ in req.sends]}, srcs={[s for s, _ in req.srcs]})"


class _Task:
    """A background task's handle (what ``comm.start`` gives)."""

    __slots__ = ("agent", "engine")

    def __init__(self, agent, engine):
        self.agent, self.engine = agent, engine


class Engine(BatchedRing):
    """Agents ``0 .. p-1`` are the ranks' programs; background tasks (``comm.start``) are
    further agents on their rank's device (``dev``)."""

    def __init__(self, cluster, trace, batching, time_limit, wall_limit, failures,
                 link_failures):
        self.topology = cluster.topology
        self.size = cluster.size
        self.fair = cluster.sharing == "fair"
        self.network = FairNetwork(self.topology) if self.fair else \
            ReservationNetwork(self.topology, cluster.one_port)
        self.batching = cluster.batch_collectives if batching is None else bool(batching)
        self.record = bool(trace)
        self.time_limit, self.wall_limit = time_limit, wall_limit
        self.clock = [0.0] * self.size
        self.finish = [0.0] * self.size
        self.done = [False] * self.size
        self.results = [None] * self.size
        self.stacks = [[] for _ in range(self.size)]
        self.dev = list(range(self.size))  # agent -> device
        self.joiners, self.current = {}, 0  # task agent -> [(agent, posted)]
        self.trace = []
        self.heap, self.pending_value = [], {}
        self.mailbox, self.waiting, self.blocked = {}, {}, {}
        self.any_waiting, self.senders = {}, {}  # rank -> op; (dst, ctx, tag) -> sources
        self.send_queue = {}  # one-port: rank -> (op, sends not yet issued, group, ctx)
        self.one_port = cluster.one_port
        self.contexts, self.route_cache = {}, {}
        self.messages = self.bytes_sent = 0
        self.batch, self.batch_sends = {}, 0
        self.failures = dict(failures or {})
        self.link_failures = {self.topology.link(*k): (k, v)
                              for k, v in (link_failures or {}).items()}
        self.net_next = None

    @property
    def busy(self):
        return self.network.busy

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
            if rank == _NET:
                self.network_event(when)
                continue
            if rank == _TIMER:
                self.any_timer(when)
                continue
            if rank < 0:
                self.next_send(-2 - rank, when)
                continue
            self.clock[rank], self.current = when, rank
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
            who = f"rank {rank}" if 0 <= rank < self.size else "the network"
            raise CommTimeoutError(f"sim.run: simulated time passed time_limit="
                                   f"{self.time_limit} s ({who} at t={when:.6g} s)")

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
                    for agent, posted in self.joiners.pop(rank, ()):
                        self.blocked.pop(agent, None)
                        self.schedule(agent, max(posted, self.clock[rank]), value)
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
                raise not_a_request("sim.run", rank, request)
            if getattr(request.comm, "_engine", None) is not self:
                raise ArgumentError(f"sim.run: rank {rank} yielded a request of a communicator "
                                    f"from another run")
            return request

    # -- requests ---------------------------------------------------------------------------
    def dispatch(self, rank, now, req):
        group, dev = req.comm.group, self.dev[rank]
        if isinstance(req, Compute):
            seconds = req.seconds if req.seconds is not None else \
                req.flops / self.topology.devices[dev].flops
            end = now + seconds
            if self.record:
                self.trace.append(TraceEvent(dev, "compute", now, end, 0, None, None, None))
            self.schedule(rank, end)
        elif isinstance(req, Start):
            self.start_task(rank, now, req.program)
        elif isinstance(req, Wait):
            self.wait_task(rank, now, req)
        elif isinstance(req, Send):
            op = _Op(rank, dev, now, req, True)
            op.values = [None]
            arrival = self.transfer(dev, group[req.dst], req.comm.context, req.tag, req.array,
                                    now, op)
            if arrival is not None:
                self.schedule(rank, arrival)
            else:
                self.blocked[rank] = op
        elif isinstance(req, Batched):
            self.join_batch(rank, now, req)
        else:
            self.post(rank, now, req)

    def start_task(self, rank, now, program):
        agent = len(self.stacks)
        self.stacks.append([program])
        self.dev.append(self.dev[rank])
        self.clock.append(now)
        self.finish.append(0.0)
        self.done.append(False)
        self.results.append(None)
        self.schedule(agent, now)
        self.schedule(rank, now, _Task(agent, self))

    def wait_task(self, rank, now, req):
        task = req.task
        if not isinstance(task, _Task) or task.engine is not self:
            raise ArgumentError(f"sim.run: rank {self.dev[rank]} waited on {task!r}, not a "
                                f"task that comm.start gave in this run")
        if self.done[task.agent]:
            self.schedule(rank, max(now, self.finish[task.agent]), self.results[task.agent])
            return
        self.joiners.setdefault(task.agent, []).append((rank, now))
        self.blocked[rank] = _Op(rank, self.dev[rank], now, req, True)

    def post(self, rank, now, req):
        group, ctx, dev = req.comm.group, req.comm.context, self.dev[rank]
        if isinstance(req, Recv):
            if req.src == ANY_SOURCE:
                self.post_any(rank, now, req)
                return
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
        op = _Op(rank, dev, now, req, single)
        if self.one_port and len(sends) > 1:  # one send port: the rest go in turn
            self.send_queue[rank] = (op, deque(sends[1:]), group, ctx)
            op.outstanding += 1
            sends = sends[:1]
        for array, dst, tag in sends:
            arrival = self.transfer(dev, group[dst], ctx, tag, array, now, op)
            if arrival is not None:
                op.ready = max(op.ready, arrival)
        if rank in self.send_queue:
            heapq.heappush(self.heap, (op.ready, -2 - rank))
        op.values = [None] * len(srcs)
        for slot, (src, tag) in enumerate(srcs):
            key = (group[src], dev, ctx, tag)
            queue = self.mailbox.get(key)
            if queue:
                self.match(op, slot, key, self.take(key))
            else:
                op.outstanding += 1
                self.waiting.setdefault(key, deque()).append((op, slot))
        if op.outstanding:
            self.blocked[rank] = op
        else:
            self.complete(op)

    def next_send(self, rank, now):
        """A one-port rank's port is free again: send the next message of its exchange."""
        op, queue, group, ctx = self.send_queue[rank]
        array, dst, tag = queue.popleft()
        arrival = self.transfer(op.dev, group[dst], ctx, tag, array, now, op)
        op.ready = max(op.ready, arrival)
        if queue:
            heapq.heappush(self.heap, (arrival, -2 - rank))
            return
        del self.send_queue[rank]
        op.outstanding -= 1
        if not op.outstanding:
            self.complete(op)

    def take(self, key):
        queue = self.mailbox[key]
        message = queue.popleft()
        if not queue:
            del self.mailbox[key]
            self.senders[key[1:]].discard(key[0])
        return message

    def match(self, op, slot, key, message):
        arrival, array, nbytes = message
        done = max(op.posted, arrival)
        op.ready = max(op.ready, done)
        if op.out is not None:
            array = fill(op.out, array, key[0], f"rank {op.dev}: {_describe(op.what)}")
        op.values[slot] = array
        if self.record:
            self.trace.append(TraceEvent(op.dev, "recv", op.posted, done, nbytes, key[0],
                                         op.dev, None))

    def complete(self, op):
        self.blocked.pop(op.rank, None)
        self.schedule(op.rank, op.ready, op.values[0] if op.single else op.values)

    # -- any-source receives ----------------------------------------------------------------
    def post_any(self, rank, now, req):
        op = _Op(rank, self.dev[rank], now, req, True)
        op.values, op.any = [None], (req.comm.context, req.tag)
        self.blocked[rank] = op
        self.any_waiting[op.dev] = op
        self.try_any(op, now)

    def try_any(self, op, now):
        """Match the message that arrives first (ties: lowest source) once its arrival is
        due; a message that could still be overtaken by a later send waits for a timer."""
        ctx, tag = op.any
        best = None
        for src in self.senders.get((op.dev, ctx, tag), ()):
            arrival = self.mailbox[(src, op.dev, ctx, tag)][0][0]
            if best is None or (arrival, src) < best:
                best = (arrival, src)
        if best is None:
            return
        if best[0] > now:
            heapq.heappush(self.heap, (best[0], _TIMER))
            return
        key = (best[1], op.dev, ctx, tag)
        del self.any_waiting[op.dev]
        self.match(op, 0, key, self.take(key))
        group = op.what.comm.group
        op.values[0] = (group.index(best[1]), op.values[0])
        self.complete(op)

    def any_timer(self, now):
        for op in list(self.any_waiting.values()):
            self.try_any(op, now)

    # -- messages ---------------------------------------------------------------------------
    def route(self, src, dst):
        found = self.route_cache.get((src, dst))
        if found is None:
            route = self.topology.route(src, dst)
            self.network.grow()  # links made on first use
            found = self.route_cache[(src, dst)] = (route, *self.topology.route_cost(route))
        return found

    def transfer(self, src, dst, ctx, tag, array, now, op=None):
        """Send a message. Reservation: book the route, put the message in ``dst``'s mailbox
        and return its arrival. Fair sharing: start a flow and return ``None``; ``op`` is told
        when the flow has arrived."""
        route, alpha, beta = self.route(src, dst)
        nbytes = array.nbytes
        self.messages += 1
        self.bytes_sent += nbytes
        self.batch_sends += 1
        key = (src, dst, ctx, tag)
        if self.fair:
            self.network.start(src, dst, route, alpha, beta, nbytes, now, key,
                                      (array.copy(), op))
            if op is not None:
                op.outstanding += 1
            self.wake_network()
            return None
        start, end, arrival = self.network.reserve(src, dst, route, alpha, beta, nbytes, now)
        self.check_links(route, end, src, dst)
        if self.record:
            names = tuple(self.topology.link_name(link) for link in route)
            self.trace.append(TraceEvent(src, "send", start, arrival, nbytes, src, dst, names))
        self.deliver(key, (arrival, array.copy(), nbytes))
        return arrival

    def check_links(self, route, end, src, dst):
        for link in route:
            if link in self.link_failures and end > self.link_failures[link][1]:
                ends, at = self.link_failures[link]
                raise LinkFailure(f"sim.run: link {self.topology.link_name(link)} failed at "
                                  f"t={at:.6g} s (rank {src} -> {dst} needed it)",
                                  link=ends, time=at)

    def wake_network(self):
        when = self.network.next_event()
        if when is not None and when != self.net_next:
            self.net_next = when
            heapq.heappush(self.heap, (when, _NET))

    def network_event(self, now):
        if now != self.net_next:
            return  # superseded
        self.net_next = None
        self.hand_over(self.network.finish_due(now))
        self.wake_network()

    def hand_over(self, flows):
        for flow in flows:
            self.check_links(flow.route, flow.finish, flow.src, flow.dst)
            array, op = flow.payload
            if self.record:
                names = tuple(self.topology.link_name(link) for link in flow.route)
                self.trace.append(TraceEvent(flow.src, "send", flow.issued, flow.arrival,
                                             flow.nbytes, flow.src, flow.dst, names))
            self.deliver(flow.key, (flow.arrival, array, flow.nbytes))
            if op is not None:
                op.ready = max(op.ready, flow.arrival)
                op.outstanding -= 1
                if not op.outstanding:
                    self.complete(op)

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
            return
        self.mailbox.setdefault(key, deque()).append(message)
        self.senders.setdefault(key[1:], set()).add(key[0])
        op = self.any_waiting.get(key[1])
        if op is not None and op.any == key[2:]:
            heapq.heappush(self.heap, (message[0], _TIMER))

    def deadlock(self):
        lines, blocked = [], {}
        for rank in range(len(self.stacks)):
            if self.done[rank]:
                continue
            op = self.blocked.get(rank)
            what = _describe(op.what) if op else "nothing (never resumed)"
            if op and op.what.comm.size != self.size:
                what += f" in sub-communicator {list(op.what.comm.group)}"
            since = f" since t={op.posted:.6g} s" if op else ""
            who = f"rank {rank}" if rank < self.size else \
                f"rank {self.dev[rank]}'s background task"
            blocked[who if rank >= self.size else rank] = what
            lines.append(f"  {who}: {what}{since}")
        raise DeadlockError("sim.run: deadlock: every unfinished rank is blocked and no "
                            "message is in flight:\n" + "\n".join(lines), blocked)
