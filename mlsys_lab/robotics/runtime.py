"""A small publish/subscribe runtime with ROS 2's concepts, on the cluster simulator's event loop.

There is no second event loop here: a :class:`Runtime` builds one
:class:`mlsys_lab.distributed.sim.engine.Engine` over a fully connected topology with one
device per node plus one for the middleware, and everything runs as that engine's agents and
events, on its simulated clock:

* each **node** is one agent: a single-threaded executor (rclpy's ``SingleThreadedExecutor``)
  that takes its next ready callback — the one that became ready first — runs it for its
  declared cost as a ``comm.compute(seconds=...)`` on its device, and waits (an ``Idle``
  request the runtime registers with the engine) when nothing is ready;
* the **middleware** (DDS) is one more agent that delivers what is due: a published message
  arrives ``alpha + bytes·beta`` after it left (the topology's link; 0 within a node), a timer
  fires, a service request or response or an action message arrives; it wakes the node that
  has work.

Concepts, as in rclpy:

* **topics** with a QoS history: ``depth=k`` is KEEP_LAST (a subscription keeps at most the
  ``k`` newest unprocessed messages; a message that arrives to a full queue pushes out the
  *oldest*, counted in ``Subscription.dropped``), ``depth=None`` is KEEP_ALL;
* **timers** (a timer that fires while its previous tick has not run yet counts an overrun);
* **services** (requests queue without bound at the server — none is lost — and each
  response goes back to its caller's :class:`Future`);
* **actions** (a goal, a stream of feedback, a result; ``cancel()`` asks the server to stop,
  and the server stops at its next step: status ``"canceled"``);
* **parameters** (declared with a default, validated by ``on_set`` callbacks).

Every callback that runs is an :class:`mlsys_lab.span.Span` on its node's lane
(``Runtime.spans``), ``kind`` one of ``"subscription"``, ``"timer"``, ``"service"``,
``"response"``, ``"feedback"``, ``"action"``; ``detail`` carries the topic and the message's
``stamp`` (its origin time, passed along by callbacks that republish), so end-to-end latency is
``span.end - span.stamp``.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..distributed.comm import Request
from ..distributed.sim import Cluster, SimCommunicator, fully_connected
from ..distributed.sim.engine import Engine
from ..errors import ArgumentError
from ..span import Span

__all__ = ["ActionClientGoal", "Future", "Msg", "Node", "Runtime", "Subscription", "Timer"]


@dataclass(eq=False)
class Idle(Request):
    """What an agent yields when it has nothing to do: no event is scheduled; the runtime
    resumes it when work arrives."""


_STOP = object()


@dataclass(frozen=True)
class Msg:
    """A message as a callback sees it: ``data``, ``stamp`` (when its origin was sensed),
    ``sent`` (when it was published), ``topic`` and the publisher's ``seq`` number."""

    data: Any
    stamp: float
    sent: float
    topic: str
    seq: int


class Subscription:
    """A node's subscription to a topic; ``queue`` holds the unprocessed messages.

    Attributes: ``received`` (messages that arrived), ``dropped`` (pushed out of a full
    KEEP_LAST queue), ``taken`` (callbacks started), ``processed`` (callbacks finished before
    the run ended), ``dropped_seqs`` (which ones were dropped).
    """

    def __init__(self, node, topic, callback, depth, cost):
        if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int)
                                  or depth < 1):
            raise ArgumentError(f"create_subscription({topic!r}): depth must be a positive int "
                                f"(KEEP_LAST) or None (KEEP_ALL), got {depth!r}")
        self.node, self.topic, self.callback, self.depth, self.cost = \
            node, topic, callback, depth, cost
        self.queue = deque()
        self.received = self.dropped = self.processed = self.taken = 0
        self.dropped_seqs = []

    def offer(self, entry):
        """Put an arrived ``(ready time, seq, Msg)`` in the queue (KEEP_LAST: drop the oldest
        when full)."""
        self.received += 1
        if self.depth is not None and len(self.queue) >= self.depth:
            old = self.queue.popleft()
            self.dropped += 1
            self.dropped_seqs.append(old[2].seq)
        self.queue.append(entry)


class Timer:
    """A periodic timer; ``overruns`` counts ticks that came while the previous one waited."""

    def __init__(self, node, period, callback, cost, offset):
        if not period > 0:
            raise ArgumentError(f"create_timer: period must be positive, got {period}")
        self.node, self.period, self.callback, self.cost = node, period, callback, cost
        self.offset = offset
        self.pending = None
        self.ticks = self.overruns = 0


class Future:
    """The result of a service call: ``done()``, ``result()``, and when it was answered."""

    def __init__(self):
        self._done, self._result, self.sent, self.answered = False, None, None, None
        self.callbacks = []

    def done(self):
        return self._done

    def result(self):
        if not self._done:
            raise ArgumentError("Future.result: the call has not been answered yet")
        return self._result


@dataclass(eq=False)
class ActionClientGoal:
    """The client's handle on an action goal: ``status`` (``"sent"``, ``"executing"``,
    ``"succeeded"``, ``"canceled"``), ``feedback`` (every feedback value received, in order)
    and ``result``; ``cancel()`` sends a cancel request."""

    runtime: Any
    client_node: Any
    server_node: Any
    goal: Any
    status: str = "sent"
    feedback: list = field(default_factory=list)
    result: Any = None
    cancel_requested: bool = False
    cancel_sent: float | None = None
    finished: float | None = None
    on_feedback: Any = None
    on_result: Any = None
    steps: int = 0

    def cancel(self):
        """Ask the server to cancel (delivered like any message)."""
        rt = self.runtime
        self.cancel_sent = rt.now()
        rt._send(self.client_node, self.server_node, 64, self._server_cancel)

    def _server_cancel(self, now):
        self.cancel_requested = True


class Node:
    """A node: create its subscriptions, publishers (``publish``), timers, services, action
    servers and clients, and parameters. Make nodes with :meth:`Runtime.create_node`."""

    def __init__(self, runtime, name, rank):
        self.runtime, self.name, self.rank = runtime, name, rank
        self.subscriptions, self.timers = [], []
        self.services = {}
        self.ready = deque()  # (ready time, seq, kind, item) of timers, services, responses...
        self.parameters, self.validators = {}, []
        self.idle = False
        self.published = {}

    # -- topics -------------------------------------------------------------------------------
    def create_subscription(self, topic, callback, depth=10, cost=0.0):
        """Subscribe ``callback(msg: Msg)`` to ``topic``; ``depth``: KEEP_LAST depth (``None``:
        KEEP_ALL); ``cost``: seconds the callback takes (or ``cost(msg)``)."""
        sub = Subscription(self, topic, callback, depth, cost)
        self.subscriptions.append(sub)
        self.runtime.topics.setdefault(topic, []).append(sub)
        return sub

    def publish(self, topic, data, stamp=None, nbytes=None):
        """Publish ``data`` on ``topic`` now; ``stamp`` defaults to now (pass the input
        message's stamp along to measure end-to-end latency); ``nbytes`` sizes the message
        on the wire (default: the array's bytes, or 64)."""
        rt = self.runtime
        now = rt.now()
        seq = self.published[topic] = self.published.get(topic, -1) + 1
        msg = Msg(data, now if stamp is None else stamp, now, topic, seq)
        size = nbytes if nbytes is not None else \
            (data.nbytes if isinstance(data, np.ndarray) else 64)
        for sub in rt.topics.get(topic, ()):
            rt._send(self, sub.node, size, lambda t, sub=sub: rt._arrive(sub, msg, t))
        return msg

    # -- timers -------------------------------------------------------------------------------
    def create_timer(self, period, callback, cost=0.0, offset=0.0):
        """Call ``callback()`` every ``period`` seconds (first at ``offset + period``)."""
        timer = Timer(self, period, callback, cost, offset)
        self.timers.append(timer)
        self.runtime._timers.append(timer)
        return timer

    # -- services -----------------------------------------------------------------------------
    def create_service(self, name, handler, cost=0.0):
        """Serve ``name``: ``handler(request) -> response`` takes ``cost`` seconds; requests
        wait in an unbounded queue."""
        if name in self.runtime.services:
            raise ArgumentError(f"create_service: service {name!r} exists already")
        self.runtime.services[name] = (self, handler, cost)

    def call_async(self, name, request, callback=None):
        """Call service ``name``; returns a :class:`Future` (``callback(future)`` runs on
        this node when the response arrives)."""
        rt = self.runtime
        if name not in rt.services:
            raise ArgumentError(f"call_async: no service {name!r} (services: "
                                f"{sorted(rt.services)})")
        server, handler, cost = rt.services[name]
        fut = Future()
        fut.sent = rt.now()
        if callback is not None:
            fut.callbacks.append(callback)
        rt.calls += 1

        def arrive(t):
            rt._ready(server, t, "service", (name, handler, cost, request, fut, self))
        rt._send(self, server, 64, arrive)
        return fut

    # -- actions ------------------------------------------------------------------------------
    def create_action_server(self, name, execute, step_cost=0.0):
        """Serve action ``name``: ``execute(goal)`` is a generator that yields one feedback
        value per step (each step costs ``step_cost`` seconds) and returns the result."""
        if name in self.runtime.actions:
            raise ArgumentError(f"create_action_server: action {name!r} exists already")
        self.runtime.actions[name] = (self, execute, step_cost)

    def send_goal(self, name, goal, on_feedback=None, on_result=None):
        """Send a goal to action ``name``; returns an :class:`ActionClientGoal`."""
        rt = self.runtime
        if name not in rt.actions:
            raise ArgumentError(f"send_goal: no action {name!r}")
        server, execute, step_cost = rt.actions[name]
        handle = ActionClientGoal(rt, self, server, goal, on_feedback=on_feedback,
                                  on_result=on_result)

        def arrive(t):
            gen = execute(goal)
            rt._ready(server, t, "action", (name, handle, gen, step_cost))
        rt._send(self, server, 64, arrive)
        return handle

    # -- parameters ---------------------------------------------------------------------------
    def declare_parameter(self, name, default):
        """Declare parameter ``name`` with its default value."""
        if name in self.parameters:
            raise ArgumentError(f"{self.name}.declare_parameter: {name!r} declared already")
        self.parameters[name] = default
        return default

    def get_parameter(self, name):
        if name not in self.parameters:
            raise ArgumentError(f"{self.name}.get_parameter: {name!r} is not declared "
                                f"(declared: {sorted(self.parameters)})")
        return self.parameters[name]

    def add_on_set_parameters_callback(self, fn):
        """``fn(name, value) -> (ok, reason)`` vets every later ``set_parameter``."""
        self.validators.append(fn)

    def set_parameter(self, name, value):
        """Set a declared parameter; returns ``(ok, reason)`` (a rejected value is not set)."""
        self.get_parameter(name)
        for fn in self.validators:
            ok, reason = fn(name, value)
            if not ok:
                return False, reason
        self.parameters[name] = value
        return True, ""

    # -- the executor -------------------------------------------------------------------------
    def _next(self):
        """The ready item that became ready first (ties: first queued)."""
        best, where = None, None
        for sub in self.subscriptions:
            if sub.queue and (best is None or sub.queue[0][:2] < best[:2]):
                best, where = sub.queue[0], sub
        if self.ready and (best is None or self.ready[0][:2] < best[:2]):
            best, where = self.ready[0], self.ready
        if best is None:
            return None
        if where is self.ready:
            self.ready.popleft()
            return best[2], best[3], None
        where.queue.popleft()
        where.taken += 1
        return "subscription", where, best[2]


class Runtime:
    """The runtime: nodes and their topics, services and actions on one simulated clock.

    Args:
        alpha: per-message latency between nodes (s). beta: seconds per byte.
        time_limit: passed to the engine (simulated seconds).
    """

    def __init__(self, alpha=50e-6, beta=1 / 1e9):
        self.alpha, self.beta = alpha, beta
        self.nodes, self.topics, self.services, self.actions = [], {}, {}, {}
        self._timers, self._pending, self._seq = [], [], 0
        self.spans, self.calls = [], 0
        self.engine = None
        self.until = None

    def create_node(self, name):
        if self.engine is not None:
            raise ArgumentError("Runtime.create_node: nodes must be created before run()")
        if any(n.name == name for n in self.nodes):
            raise ArgumentError(f"Runtime.create_node: a node named {name!r} exists")
        node = Node(self, name, len(self.nodes))
        self.nodes.append(node)
        return node

    def node(self, name):
        for n in self.nodes:
            if n.name == name:
                return n
        raise ArgumentError(f"Runtime.node: no node {name!r}")

    def now(self):
        """The simulated time (s)."""
        return 0.0 if self.engine is None else self.engine.now()

    def at(self, when, fn):
        """Call ``fn()`` at simulated time ``when`` (from the middleware): a scheduled
        parameter change, a cancel, a load step."""
        self._schedule(when, lambda t: fn())

    # -- running --------------------------------------------------------------------------------
    def run(self, until):
        """Run everything until simulated time ``until`` (s); what is due later is dropped."""
        if self.engine is not None:
            raise ArgumentError("Runtime.run: a runtime runs once; build a new one")
        if not until > 0:
            raise ArgumentError(f"Runtime.run: until must be positive, got {until}")
        n = len(self.nodes)
        cluster = Cluster(fully_connected(n + 1, alpha=self.alpha, beta=self.beta),
                          batch_collectives=False)
        self.engine = engine = Engine(cluster, trace=False, batching=False, time_limit=None,
                                      wall_limit=None, failures=None, link_failures=None)
        engine.requests[Idle] = lambda rank, now, req: None  # wait: nothing scheduled
        group = tuple(range(n + 1))
        self._comms = [SimCommunicator(engine, group, r) for r in range(n + 1)]
        self.until = until
        for node in self.nodes:
            engine.start(node.rank, self._executor(node))
        engine.start(n, self._middleware())
        engine.schedule(n, until)  # the middleware stops everything then
        for when, _, _ in self._pending:  # what `at` queued before the run
            engine.schedule(n, when)
        for timer in self._timers:
            self._schedule(timer.offset + timer.period, lambda t, tm=timer: self._tick(tm, t))
        self._stop = False
        engine.loop()
        return self

    def _schedule(self, when, fn):
        if self.until is not None and when >= self.until:
            return  # past the end of the run
        self._seq += 1
        heapq.heappush(self._pending, (when, self._seq, fn))
        if self.engine is not None:
            self.engine.schedule(len(self.nodes), when)

    def _send(self, src, dst, nbytes, on_arrival):
        """Deliver after the route's ``alpha + bytes * beta`` (the topology's link between the
        two nodes' devices; 0 within a node). Links are not reserved: messages do not queue
        behind each other on the wire, only in the subscribers' queues."""
        if src is dst:
            latency = 0.0
        else:
            _, alpha, beta = self.engine.network.route(src.rank, dst.rank)
            latency = alpha + nbytes * beta
        self._schedule(self.now() + latency, on_arrival)

    def _ready(self, node, t, kind, item):
        self._seq += 1
        node.ready.append((t, self._seq, kind, item))
        self._wake(node, t)

    def _arrive(self, sub, msg, t):
        self._seq += 1
        sub.offer((t, self._seq, msg))
        self._wake(sub.node, t)

    def _wake(self, node, t):
        if node.idle:
            node.idle = False
            self.engine.schedule(node.rank, t)

    def _tick(self, timer, t):
        timer.ticks += 1
        if timer.pending is not None:
            timer.overruns += 1
        else:
            timer.pending = t
            self._ready(timer.node, t, "timer", timer)
        self._schedule(t + timer.period, lambda t2: self._tick(timer, t2))

    def _middleware(self):
        comm = self._comms[len(self.nodes)]
        while True:
            now = self.engine.now()
            while self._pending and self._pending[0][0] <= now:
                _, _, fn = heapq.heappop(self._pending)
                fn(now)
            if now >= self.until:
                for node in self.nodes:
                    if node.idle:
                        node.idle = False
                        self.engine.schedule(node.rank, now, _STOP)
                self._stop = True
                return
            yield Idle(comm)

    def _executor(self, node):
        comm = self._comms[node.rank]
        engine = self.engine
        while True:
            if self._stop:
                return
            item = node._next()
            if item is None:
                node.idle = True
                if (yield Idle(comm)) is _STOP:
                    return
                continue
            kind, what, payload = item
            start = engine.now()
            cost = self._cost(what, payload, kind)
            if cost > 0:
                yield comm.compute(seconds=cost)
            end = engine.now()
            if end > self.until:
                return  # the run ended while this callback ran: its outputs are not sent
            self._run(node, kind, what, payload, start, end)

    @staticmethod
    def _cost(what, payload, kind):
        if kind == "subscription":
            cost = what.cost
            return float(cost(payload) if callable(cost) else cost)
        if kind == "timer":
            return float(what.cost() if callable(what.cost) else what.cost)
        if kind == "service":
            return float(what[2])
        if kind == "action":
            return float(what[3])
        return 0.0

    def _run(self, node, kind, what, payload, start, end):
        detail = {}
        if kind == "subscription":
            what.processed += 1
            detail = dict(topic=what.topic, stamp=payload.stamp, seq=payload.seq)
            name = what.topic
            what.callback(payload)
        elif kind == "timer":
            what.pending = None
            name = "timer"
            detail = dict(stamp=start)
            what.callback()
        elif kind == "service":
            sname, handler, _, request, fut, client = what
            name = sname
            detail = dict(stamp=fut.sent)
            response = handler(request)

            def answer(t, fut=fut, response=response, client=client):
                self._ready(client, t, "response", (fut, response))
            self._send(node, client, 64, answer)
        elif kind == "response":
            fut, response = what
            fut._done, fut._result, fut.answered = True, response, end
            name = "response"
            detail = dict(stamp=fut.sent)
            for cb in fut.callbacks:
                cb(fut)
        elif kind == "feedback":
            handle, value = what
            name = "feedback"
            detail = dict(stamp=start)
            handle.feedback.append(value)
            if handle.on_feedback is not None:
                handle.on_feedback(value)
        elif kind == "result":
            handle, status, value = what
            name = "result"
            detail = dict(stamp=start)
            handle.status, handle.result, handle.finished = status, value, end
            if handle.on_result is not None:
                handle.on_result(status, value)
        else:  # one step of an action goal on the server
            aname, handle, gen, step_cost = what
            name = aname
            detail = dict(stamp=start, step=handle.steps)
            self._action_step(node, aname, handle, gen, step_cost)
        self.spans.append(Span(node.name, name, start, end, kind=kind, detail=detail))

    def _action_step(self, node, name, handle, gen, step_cost):
        client = handle.client_node
        if handle.cancel_requested:
            gen.close()
            self._send(node, client, 64, lambda t: self._ready(
                client, t, "result", (handle, "canceled", None)))
            return
        if handle.status == "sent":
            handle.status = "executing"
        try:
            value = next(gen)
        except StopIteration as stop:
            self._send(node, client, 64, lambda t, v=stop.value: self._ready(
                client, t, "result", (handle, "succeeded", v)))
            return
        handle.steps += 1
        self._send(node, client, 64, lambda t, v=value: self._ready(
            client, t, "feedback", (handle, v)))
        self._ready(node, self.engine.now(), "action", (name, handle, gen, step_cost))

    # -- what happened --------------------------------------------------------------------------
    def latencies(self, node=None, topic=None):
        """End-to-end latencies (``span.end − stamp``) of the subscription callbacks of
        ``node`` (a name) on ``topic``."""
        return np.array([s.end - s.detail["stamp"] for s in self.spans
                         if s.kind == "subscription" and (node is None or s.lane == node)
                         and (topic is None or s.detail["topic"] == topic)])
