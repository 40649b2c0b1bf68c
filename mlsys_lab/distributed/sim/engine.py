"""The simulator's event loop: events on one heap, one handler per kind of event.

Everything that happens in a run is an :class:`Event` record ``(time, kind, target)`` on one
heap; :meth:`Engine.loop` pops the earliest and hands it to the handler of its kind:

=========== ================================================ ======================
kind        what happened                                    handler
=========== ================================================ ======================
``FAULT``   device ``target`` fails (``sim.run(failures=)``)   ``Engine.on_fault``
``PORT``    one-port rank ``target``'s send port is free     ``Engine.on_port``
``NETWORK`` the fair-shared network's next flow ends         ``Engine.on_network``
``RESUME``  agent ``target`` continues with ``value``        ``Engine.on_resume``
``ANY``     an any-source receive may match now              ``Engine.on_any``
=========== ================================================ ======================

At one instant the kinds go in that order: a failure before anything else at its time, a
resumed rank after every message that arrived at that time, an any-source receive last.
Within a kind, resumes go by agent id and ports from the highest rank down; ``seq`` (push
order) breaks the last ties, so two records never compare their payloads. Simulated times
depend on this order (links serve messages in the order they are issued), and it is the order
the engine has always used.

An *agent* is a rank's program or a background task (``comm.start``). Resuming one runs its
generator to its next request; the request then books messages on the network
(:mod:`.network`), waits for messages in the mailboxes (MPI's matching: source, context,
tag), or pushes the agent's next event. A whole-cluster ring collective goes to the batched
strategy (:mod:`.batch`), which the loop consults again when no event is left. The run
ends when no event but a fault is pending; an unfinished agent then is a deadlock.
"""

from __future__ import annotations

import heapq
import time as _time
from collections import deque
from typing import Any, NamedTuple

from ...errors import ArgumentError
from ..comm import (
    ANY_SOURCE,
    TAG_LIMIT,
    Batched,
    CommTimeoutError,
    Compute,
    DeadlockError,
    DeviceFailure,
    Recv,
    Request,
    Send,
    SendRecv,
    Start,
    Wait,
    fill,
    not_a_request,
)
from .batch import BatchedRing
from .network import FairNetwork, ReservationNetwork
from .trace import TraceEvent

__all__ = ["ANY", "FAULT", "KINDS", "NETWORK", "PORT", "RESUME", "Engine", "Event", "TraceEvent"]

FAULT, PORT, NETWORK, RESUME, ANY = range(5)  # the kinds, in their order at one instant
KINDS = ("fault", "port", "network", "resume", "any")
_record = tuple.__new__  # Event(...) without the Python-level __new__ (one per event)


class Event(NamedTuple):
    """One entry of the event heap; records sort by ``(time, kind, order, seq)``.

    ``order`` is the tie-break within a kind at one instant (the agent for ``RESUME``, minus
    the rank for ``PORT``, 0 otherwise) and ``seq`` the push count, unique per run.
    """

    time: float
    kind: int
    order: int
    seq: int
    target: int = -1  # the agent, rank or device the event is for
    value: Any = None  # what a resumed agent's ``yield`` gives


class Engine:
    """Runs the agents of one ``sim.run``: ranks ``0 .. size-1``, then background tasks."""

    def __init__(self, cluster, trace, batching, time_limit, wall_limit, failures,
                 link_failures):
        self.topology, self.size = cluster.topology, cluster.size
        self.fair, self.one_port = cluster.sharing == "fair", cluster.one_port
        self.network = FairNetwork(self.topology, link_failures) if self.fair else \
            ReservationNetwork(self.topology, cluster.one_port, link_failures)
        self.batching = cluster.batch_collectives if batching is None else bool(batching)
        self.record, self.trace = bool(trace), []
        self.time_limit, self.wall_limit = time_limit, wall_limit
        self.agents = [_Agent(rank) for rank in range(self.size)]
        self.current = 0  # the agent being resumed
        self.events, self.seq, self.live, self.popped = [], 0, 0, 0  # live: pending non-faults
        self.handlers = (self.on_fault, self.on_port, self.on_network, self.on_resume,
                         self.on_any)
        self.requests = {Compute: self.compute, Start: self.start_task, Wait: self.wait_task,
                         Send: self.send}
        self.ring = BatchedRing(self)  # the batched strategy for whole-cluster rings
        self.mail = _Mail(self)  # messages: booking and matching
        self.send_queue = {}  # one-port: agent -> (op, sends not yet issued, group, ctx)
        self.contexts = {}
        self.messages = self.bytes_sent = 0
        self.failures = dict(failures or {})
        for device, at in self.failures.items():
            self.push(at, FAULT, target=device)

    @property
    def busy(self):
        return self.network.busy

    def context_id(self, group):
        return self.contexts.setdefault(group, len(self.contexts))

    def now(self):
        return self.agents[self.current].clock

    # -- the loop -----------------------------------------------------------------------------
    def push(self, time, kind, order=0, target=-1, value=None):
        self.seq += 1
        self.live += kind != FAULT
        heapq.heappush(self.events, _record(Event, (time, kind, order, self.seq, target, value)))

    def schedule(self, agent, when, value=None):
        """Resume ``agent`` at ``when``; its ``yield`` gives ``value``."""
        self.push(when, RESUME, agent, agent, value)

    def start(self, rank, program):
        """Make ``program`` rank ``rank``'s program (a plain value: the rank is done)."""
        if hasattr(program, "send") and hasattr(program, "throw"):
            self.agents[rank].stack.append(program)
            self.schedule(rank, 0.0)
        else:
            self.agents[rank].done, self.agents[rank].result = True, program

    def loop(self):
        """Hand every event to its kind's handler, earliest first, until only faults are left
        (then ask the batched strategy to give up a batch that can no longer complete). A run
        that stops with an error closes the programs still suspended (``close``)."""
        started = _time.perf_counter()
        try:
            while self.live or self.ring.waiting:
                if not self.live:
                    self.ring.release()
                    continue
                event = heapq.heappop(self.events)
                if event.kind != FAULT:
                    self.live -= 1
                    self.check_limits(event, started)
                self.handlers[event.kind](event)
            if not all(agent.done for agent in self.agents):
                raise _deadlock(self)
        except BaseException:
            self.close()
            raise

    def close(self):
        """Close every generator still suspended, innermost first: their ``finally`` blocks
        run now, inside the failed run, rather than whenever the collector frees them (which
        can be in the middle of some later, unrelated code)."""
        for agent in self.agents:
            while agent.stack:
                try:
                    agent.stack.pop().close()
                except Exception:  # a program that raised while closing: the run's error stands
                    pass

    def check_limits(self, event, started):
        self.popped += 1
        if self.time_limit is not None and event.time > self.time_limit:
            who = f"rank {event.target}" if event.kind == RESUME and event.target < self.size \
                else "the network"
            raise CommTimeoutError(f"sim.run: simulated time passed time_limit="
                                   f"{self.time_limit} s ({who} at t={event.time:.6g} s)")
        if self.wall_limit is not None and self.popped % 4096 == 0 and \
                _time.perf_counter() - started > self.wall_limit:
            raise CommTimeoutError(f"sim.run: more than wall_limit={self.wall_limit} s of "
                                   f"real time (simulated time {event.time:.6g} s)")

    # -- one handler per kind -------------------------------------------------------------------
    def on_fault(self, event):
        """Events are still pending past the failure: the synchronous job stops here."""
        raise DeviceFailure(f"sim.run: device {event.target} failed at t={event.time:.6g} s",
                            rank=event.target, time=event.time)

    def on_port(self, event):
        """A one-port rank's send port is free again: send the next message of its exchange."""
        op, queue, group, ctx = self.send_queue[event.target]
        array, dst, tag = queue.popleft()
        arrival = self.mail.transfer(op.dev, group[dst], ctx, tag, array, event.time, op)
        op.ready = max(op.ready, arrival)
        if queue:
            self.push(arrival, PORT, -event.target, event.target)
            return
        del self.send_queue[event.target]
        self.settle(op)

    def on_network(self, event):
        """Fair sharing: flows may have ended; deliver them (a superseded event does nothing)."""
        self.mail.flows_done(event.time)

    def on_resume(self, event):
        """Run the agent to its next request and hand that to the request's method."""
        agent, rank = self.agents[event.target], event.target
        agent.clock, self.current = event.time, rank
        request = agent.advance(event.value, rank)
        if request is None:
            for joiner, posted in agent.joiners:
                self.agents[joiner].blocked = None
                self.schedule(joiner, max(posted, agent.clock), agent.result)
            return
        if not isinstance(request, Request):
            raise not_a_request("sim.run", rank, request)
        if getattr(request.comm, "_engine", None) is not self:
            raise ArgumentError(f"sim.run: rank {rank} yielded a request of a communicator "
                                f"from another run")
        if isinstance(request, Batched):
            self.ring.offer(rank, event.time, request)
        else:
            self.requests.get(type(request), self.post)(rank, event.time, request)

    def on_any(self, event):
        """A message for an any-source receive is due: the first to arrive is taken."""
        self.mail.retry_any(event.time)

    # -- requests -----------------------------------------------------------------------------
    def compute(self, rank, now, req):
        dev = self.agents[rank].device
        end = now + (req.seconds if req.seconds is not None else
                     req.flops / self.topology.devices[dev].flops)
        self.note("compute", dev, now, end, 0, None, None, None)
        self.schedule(rank, end)

    def start_task(self, rank, now, req):
        agent = len(self.agents)
        self.agents.append(_Agent(self.agents[rank].device, now, req.program))
        self.schedule(agent, now)
        self.schedule(rank, now, _Task(agent, self))

    def wait_task(self, rank, now, req):
        task = req.task
        if not isinstance(task, _Task) or task.engine is not self:
            raise ArgumentError(f"sim.run: rank {self.agents[rank].device} waited on {task!r}, "
                                f"not a task that comm.start gave in this run")
        background = self.agents[task.agent]
        if background.done:
            self.schedule(rank, max(now, background.finish), background.result)
            return
        background.joiners.append((rank, now))
        self.agents[rank].blocked = _Op(rank, self.agents[rank].device, now, req, True)

    def send(self, rank, now, req):
        """A rank is busy in a ``send`` until its message has arrived."""
        op = _Op(rank, self.agents[rank].device, now, req, True)
        arrival = self.mail.transfer(op.dev, req.comm.group[req.dst], req.comm.context,
                                     req.tag, req.array, now, op)
        if arrival is not None:
            self.schedule(rank, arrival)
        else:
            self.agents[rank].blocked = op

    def post(self, rank, now, req):
        """Recv, SendRecv and Exchange: issue the sends, then match or await each receive."""
        group, ctx, dev = req.comm.group, req.comm.context, self.agents[rank].device
        if isinstance(req, Recv):
            if req.src == ANY_SOURCE:
                op = self.agents[rank].blocked = _Op(rank, dev, now, req, True)
                return self.mail.expect_any(op, now)
            sends, srcs, single = (), ((req.src, req.tag),), True
        elif isinstance(req, SendRecv):
            if req.dst == req.comm.rank:
                out = req.array.copy() if req.out is None else \
                    fill(req.out, req.array, rank, "sendrecv")
                return self.schedule(rank, now, out)
            sends, srcs, single = ((req.array, req.dst, req.tag),), ((req.src, req.tag),), True
        else:
            sends, srcs, single = req.sends, req.srcs, False
        op = _Op(rank, dev, now, req, single)
        if self.one_port and len(sends) > 1:  # one send port: the rest go in turn (on_port)
            self.send_queue[rank] = (op, deque(sends[1:]), group, ctx)
            op.outstanding += 1
            sends = sends[:1]
        for array, dst, tag in sends:
            arrival = self.mail.transfer(dev, group[dst], ctx, tag, array, now, op)
            if arrival is not None:
                op.ready = max(op.ready, arrival)
        if rank in self.send_queue:
            self.push(op.ready, PORT, -rank, rank)
        self.mail.expect(op, [(group[src], dev, ctx, tag) for src, tag in srcs])
        if op.outstanding:
            self.agents[rank].blocked = op
        else:
            self.complete(op)

    def settle(self, op):
        """One of ``op``'s messages is done; complete it if it was the last."""
        op.outstanding -= 1
        if not op.outstanding:
            self.complete(op)

    def complete(self, op):
        self.agents[op.rank].blocked = None
        self.schedule(op.rank, op.ready, op.values[0] if op.single else op.values)

    def note(self, kind, rank, start, end, nbytes, src, dst, route):
        """Record a trace event (``route``: the link ids a send held)."""
        if self.record:
            names = None if route is None else tuple(self.topology.link_name(link)
                                                     for link in route)
            self.trace.append(TraceEvent(rank, kind, start, end, nbytes, src, dst, names))


class _Agent:
    """A rank's program or a background task: its generator stack, device and clock."""

    __slots__ = ("stack", "device", "clock", "finish", "done", "result", "blocked", "joiners")

    def __init__(self, device, clock=0.0, program=None):
        self.stack = [] if program is None else [program]
        self.device, self.clock, self.finish = device, clock, 0.0
        self.done, self.result = False, None
        self.blocked = None  # the _Op it waits in
        self.joiners = []  # (agent, posted) of the agents waiting for this task

    def advance(self, value, rank):
        """Run the generator stack to its next request (``None``: the agent finished). An
        exception travels down the stack like ``yield from``."""
        stack, error = self.stack, None
        while True:
            gen = stack[-1]
            try:
                request = gen.throw(error) if error is not None else gen.send(value)
            except StopIteration as stop:
                stack.pop()
                value, error = stop.value, None
                if not stack:
                    self.done, self.result, self.finish = True, value, self.clock
                    return None
                continue
            except Exception as exc:
                stack.pop()
                if not stack:
                    if hasattr(exc, "add_note"):
                        exc.add_note(f"(in simulated rank {rank} at t={self.clock:.6g} s)")
                    raise
                error = exc
                continue
            return request


class _Op:
    """A blocked operation: waits for its receives (and, under fair sharing, its sends), then
    resumes the agent at ``ready``."""

    __slots__ = ("rank", "dev", "posted", "ready", "outstanding", "values", "single", "what",
                 "out", "any")

    def __init__(self, rank, dev, posted, what, single):
        self.rank, self.dev, self.posted, self.ready, self.what = rank, dev, posted, posted, what
        self.outstanding, self.values, self.single = 0, [None], single
        self.out = getattr(what, "out", None)
        self.any = None  # (ctx, tag) of an any-source receive


class _Task:
    """A background task's handle (what ``comm.start`` gives)."""

    __slots__ = ("agent", "engine")

    def __init__(self, agent, engine):
        self.agent, self.engine = agent, engine


class _Mail:
    """The engine's messages: each is booked on the network (:mod:`.network`), then
    matched to its receive as MPI does. A message waits in the mailbox under its key (source
    device, destination device, context, tag) until a receive for the key is posted; a posted
    receive waits under the key for its message. One key keeps send order (non-overtaking)."""

    def __init__(self, engine):
        self.engine, self.network = engine, engine.network
        self.mailbox, self.waiting = {}, {}  # key -> deque of messages; of (op, slot)
        self.senders, self.any_waiting = {}, {}  # (dst, ctx, tag) -> sources; dev -> op
        self.net_next = None  # the time of the NETWORK event pending (fair sharing)

    def transfer(self, src, dst, ctx, tag, array, now, op=None):
        """Send a message. Reservation: book the route, put the message in ``dst``'s mailbox
        and return its arrival. Fair sharing: start a flow and return ``None``; ``op`` is
        settled when the flow has arrived (:meth:`flows_done`)."""
        e = self.engine
        route, alpha, beta = self.network.route(src, dst)
        nbytes, key = array.nbytes, (src, dst, ctx, tag)
        e.messages += 1
        e.bytes_sent += nbytes
        if e.fair:
            self.network.start(src, dst, route, alpha, beta, nbytes, now, key, (array.copy(), op))
            if op is not None:
                op.outstanding += 1
            self.wake_network()
            return None
        start, end, arrival = self.network.reserve(src, dst, route, alpha, beta, nbytes, now)
        self.network.check_links(route, end, src, dst)
        e.note("send", src, start, arrival, nbytes, src, dst, route)
        self.deliver(key, (arrival, array.copy(), nbytes))
        return arrival

    def wake_network(self):
        """Push a NETWORK event for the fair network's next flow end (unless one is due)."""
        when = self.network.next_event()
        if when is not None and when != self.net_next:
            self.net_next = when
            self.engine.push(when, NETWORK)

    def flows_done(self, now):
        """The NETWORK event at ``now``: deliver the flows that arrived."""
        if now != self.net_next:
            return  # superseded by an earlier flow end
        self.net_next = None
        for flow in self.network.finish_due(now):
            self.network.check_links(flow.route, flow.finish, flow.src, flow.dst)
            array, op = flow.payload
            self.engine.note("send", flow.src, flow.issued, flow.arrival, flow.nbytes,
                             flow.src, flow.dst, flow.route)
            self.deliver(flow.key, (flow.arrival, array, flow.nbytes))
            if op is not None:
                op.ready = max(op.ready, flow.arrival)
                self.engine.settle(op)
        self.wake_network()

    def expect(self, op, keys):
        """Post ``op``'s receives, one per key: match each now or wait for its message."""
        op.values = [None] * len(keys)
        for slot, key in enumerate(keys):
            if self.mailbox.get(key):
                self.match(op, slot, key, self.take(key))
            else:
                op.outstanding += 1
                self.waiting.setdefault(key, deque()).append((op, slot))

    def deliver(self, key, message):
        """``message`` = (arrival, array, bytes) for ``key``: hand it to the receive that waits
        for it, or leave it in the mailbox (and look out for an any-source receive)."""
        waiters = self.waiting.get(key)
        if waiters:
            op, slot = waiters.popleft()
            if not waiters:
                del self.waiting[key]
            self.match(op, slot, key, message)
            return self.engine.settle(op)
        self.mailbox.setdefault(key, deque()).append(message)
        self.senders.setdefault(key[1:], set()).add(key[0])
        op = self.any_waiting.get(key[1])
        if op is not None and op.any == key[2:]:
            self.engine.push(message[0], ANY)

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
        self.engine.note("recv", op.dev, op.posted, done, nbytes, key[0], op.dev, None)

    def expect_any(self, op, now):
        """Post an any-source receive (``comm.recv_any``)."""
        op.any = (op.what.comm.context, op.what.tag)
        self.any_waiting[op.dev] = op
        self.try_any(op, now)

    def retry_any(self, now):
        for op in list(self.any_waiting.values()):
            self.try_any(op, now)

    def try_any(self, op, now):
        """Match the message that arrives first (ties: lowest source) once its arrival is
        due; a message that could still be overtaken by a later send waits for an ANY event."""
        ctx, tag = op.any
        best = min(((self.mailbox[(src, op.dev, ctx, tag)][0][0], src)
                    for src in self.senders.get((op.dev, ctx, tag), ())), default=None)
        if best is None:
            return
        if best[0] > now:
            return self.engine.push(best[0], ANY)
        key = (best[1], op.dev, ctx, tag)
        del self.any_waiting[op.dev]
        self.match(op, 0, key, self.take(key))
        op.values[0] = (op.what.comm.group.index(best[1]), op.values[0])
        self.engine.complete(op)


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


def _deadlock(engine):
    """The error for a run that ran out of events with agents unfinished, naming each one and
    what it waits for."""
    lines, blocked = [], {}
    for rank, agent in enumerate(engine.agents):
        if agent.done:
            continue
        op = agent.blocked
        what = _describe(op.what) if op else "nothing (never resumed)"
        if op and op.what.comm.size != engine.size:
            what += f" in sub-communicator {list(op.what.comm.group)}"
        since = f" since t={op.posted:.6g} s" if op else ""
        who = f"rank {rank}" if rank < engine.size else \
            f"rank {agent.device}'s background task"
        blocked[who if rank >= engine.size else rank] = what
        lines.append(f"  {who}: {what}{since}")
    return DeadlockError("sim.run: deadlock: every unfinished rank is blocked and no message is "
                         "in flight:\n" + "\n".join(lines), blocked)
