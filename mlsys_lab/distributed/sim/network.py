"""How the simulator's messages share links and ports (used by :mod:`.engine`).

Two sharing models, chosen by ``Cluster(sharing=...)``:

* :class:`ReservationNetwork` (``"fifo"``): a message reserves its route's bottleneck rate on
  every link direction of its route when it is sent, and starts once each has that much
  bandwidth to spare; link directions serve messages in the order they were issued. A
  message's arrival is fixed when it is sent. ``one_port=True`` adds the one-port model of the
  classic cost tables: a rank sends one message at a time and receives one message at a time,
  each port held from the message's start until it has arrived (``alpha + n beta``).
* :class:`FairNetwork` (``"fair"``): max-min fair sharing. Every message in flight is a flow;
  each time a flow starts or ends the rates are recomputed by progressive filling (raise all
  rates together; a link that fills freezes the flows crossing it; repeat), so two flows on one
  link get half each, and a flow held back elsewhere leaves its share to the others. A flow
  alone on its route runs at ``1 / max(beta)``, exactly as in the reservation model.
"""

from __future__ import annotations

from collections import deque

from ..comm import LinkFailure

__all__ = ["FairNetwork", "ReservationNetwork", "max_min_rates"]


def _capacity(beta):
    """Bytes per second of a link, with a hair of slack for rounding in sums of rates."""
    return float("inf") if beta == 0 else (1.0 / beta) * (1 + 1e-9)


class _Links:
    """Per-link-direction bookkeeping that grows when a topology makes links on first use;
    routes (cached) and the links' failure times (``sim.run(link_failures=...)``)."""

    def __init__(self, topology, link_failures=None):
        self.topology = topology
        self.busy = []
        self.routes = {}
        self.link_failures = {topology.link(*k): (k, v) for k, v in (link_failures or {}).items()}
        self.grow()

    def route(self, src, dst):
        """``(link ids, alpha, beta)`` of the route from ``src`` to ``dst``."""
        found = self.routes.get((src, dst))
        if found is None:
            route = self.topology.route(src, dst)
            self.grow()  # links made on first use
            found = self.routes[(src, dst)] = (route, *self.topology.route_cost(route))
        return found

    def check_links(self, route, end, src, dst):
        """A link failure stops the run when a message needs the link past the failure."""
        for link in route:
            if link in self.link_failures and end > self.link_failures[link][1]:
                ends, at = self.link_failures[link]
                raise LinkFailure(f"sim.run: link {self.topology.link_name(link)} failed at "
                                  f"t={at:.6g} s (rank {src} -> {dst} needed it)",
                                  link=ends, time=at)

    def grow(self):
        extra = len(self.topology.link_ends) - len(self.busy)
        if extra > 0:
            self.busy += [0.0] * extra
            self._grow(extra)

    def _grow(self, extra):
        pass


class ReservationNetwork(_Links):
    """First-come-first-served rate reservation (the module docstring), optionally one-port."""

    def __init__(self, topology, one_port=False, link_failures=None):
        self.last_start, self.reserved = [], []
        super().__init__(topology, link_failures)
        self.one_port = bool(one_port)
        p = topology.num_ranks
        self.send_free, self.recv_free = [0.0] * p, [0.0] * p

    def _grow(self, extra):
        self.last_start += [0.0] * extra  # FIFO: no message starts before an earlier one
        self.reserved += [[] for _ in range(extra)]  # (end, rate) of messages on each link

    def reserve(self, src, dst, route, alpha, beta, nbytes, now):
        """Book a message of ``nbytes`` on ``route``; returns ``(start, end, arrival)``."""
        duration = nbytes * beta
        start = now
        if self.one_port:
            start = max(start, self.send_free[src], self.recv_free[dst])
        for link in route:
            if self.last_start[link] > start:
                start = self.last_start[link]
        if duration > 0:
            start = self.earliest_start(route, start, 1.0 / beta)
        end = start + duration
        topo_beta = self.topology.beta
        for link in route:
            self.last_start[link] = start
            if duration > 0:
                self.reserved[link].append((end, 1.0 / beta))
            self.busy[link] += nbytes * topo_beta[link]
        arrival = end + alpha
        if self.one_port:
            self.send_free[src] = self.recv_free[dst] = arrival
        return start, end, arrival

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

    def idle_after(self, links, since, ranks=()):
        """No earlier message holds any of ``links`` (or, one-port, a port of ``ranks``)
        after ``since``."""
        if any(end > since for link in links for end, _ in self.reserved[link]):
            return False
        return not self.one_port or all(self.send_free[r] <= since and
                                        self.recv_free[r] <= since for r in ranks)

    def set_after_batch(self, route, start, end, rate, nbytes_total, send_done, recv_done,
                        src, dst):
        """Leave the state a batched run of messages would have left (see ``batch``)."""
        for link in route:
            self.last_start[link] = start
            if end > start:
                self.reserved[link] = [(end, rate)]
            self.busy[link] += nbytes_total * self.topology.beta[link]
        if self.one_port:
            self.send_free[src] = max(self.send_free[src], send_done)
            self.recv_free[dst] = max(self.recv_free[dst], recv_done)


def max_min_rates(routes, beta):
    """Max-min fair rates (bytes/s) of flows on ``routes`` (tuples of link ids), links of
    inverse bandwidth ``beta[link]``, by progressive filling. A flow whose links are all
    infinitely fast (beta 0) gets ``inf``."""
    users, left = {}, {}
    rates = [float("inf")] * len(routes)
    for f, route in enumerate(routes):
        for link in route:
            if beta[link] > 0:
                users.setdefault(link, []).append(f)
                left[link] = 1.0 / beta[link]
    count = {link: len(fs) for link, fs in users.items()}
    fixed = [False] * len(routes)
    while count:
        link = min(count, key=lambda k: (left[k] / count[k], k))
        share = left[link] / count[link]
        for f in users[link]:
            if fixed[f]:
                continue
            fixed[f] = True
            rates[f] = share
            for other in routes[f]:
                if other in count:
                    left[other] = max(0.0, left[other] - share)
                    count[other] -= 1
                    if count[other] == 0:
                        del count[other]
    return rates


class _Flow:
    __slots__ = ("src", "dst", "route", "alpha", "beta", "nbytes", "issued", "anchor_t",
                 "anchor_bytes", "inv", "finish", "payload", "done", "arrival", "key")

    def __init__(self, src, dst, route, alpha, beta, nbytes, now, key, payload):
        self.key = key
        self.src, self.dst, self.route, self.alpha, self.beta = src, dst, route, alpha, beta
        self.nbytes, self.issued, self.payload = nbytes, now, payload
        self.anchor_t, self.anchor_bytes, self.inv = now, float(nbytes), None
        self.finish = now if nbytes == 0 else float("inf")
        self.done, self.arrival = False, None


class FairNetwork(_Links):
    """Max-min fair sharing of link directions among the flows in flight (module docstring).

    ``start`` adds a flow; the engine asks :meth:`next_event` when the next flow ends and calls
    :meth:`finish_due` then. Flows with one key (source, destination, context, tag) go in
    the order they were sent (MPI's non-overtaking rule): :meth:`finish_due` returns the flows
    whose turn has come, each with its ``arrival``.
    """

    def __init__(self, topology, link_failures=None):
        super().__init__(topology, link_failures)
        self.flows, self.instant = [], []  # flows sharing links; flows of no bytes
        self.order = {}  # key -> deque of flows in issue order

    def start(self, src, dst, route, alpha, beta, nbytes, now, key, payload):
        flow = _Flow(src, dst, route, alpha, beta, nbytes, now, key, payload)
        topo_beta = self.topology.beta
        for link in route:
            self.busy[link] += nbytes * topo_beta[link]
        self.order.setdefault(key, deque()).append(flow)
        if nbytes > 0:
            self.flows.append(flow)
            self.rerate(now)
        else:
            self.instant.append(flow)
        return flow

    def rerate(self, now):
        """Recompute every flow's rate at ``now``; a flow whose rate is unchanged keeps its
        anchor, so an uncontended flow ends at exactly ``start + n beta``."""
        rates = max_min_rates([f.route for f in self.flows], self.topology.beta)
        for flow, rate in zip(self.flows, rates):
            inv = 0.0 if rate == float("inf") else (
                flow.beta if rate >= (1 - 1e-12) / flow.beta else 1.0 / rate)
            if inv == flow.inv:
                continue
            if flow.inv is not None:
                sent = (now - flow.anchor_t) / flow.inv if flow.inv > 0 else flow.anchor_bytes
                flow.anchor_bytes = max(0.0, flow.anchor_bytes - sent)
                flow.anchor_t = now
            flow.inv = inv
            flow.finish = flow.anchor_t + flow.anchor_bytes * inv

    def next_event(self):
        """When the next flow ends (``None``: nothing in flight)."""
        return min((f.finish for f in self.flows + self.instant), default=None)

    def finish_due(self, now):
        """Flows done by ``now``: drop them, re-rate the rest, and return the flows that may
        be handed over, in order (each with ``.arrival``)."""
        ended = [f for f in self.flows if f.finish <= now]
        if ended:
            self.flows = [f for f in self.flows if f.finish > now]
            self.rerate(now)
        ended, self.instant = self.instant + ended, []
        return self.handover(ended)

    def handover(self, ended):
        ready = []
        for flow in ended:
            flow.done = True
        for key in dict.fromkeys(f.key for f in ended):
            queue, last = self.order[key], None
            while queue and queue[0].done:
                flow = queue.popleft()
                flow.arrival = flow.finish + flow.alpha
                if last is not None and last > flow.arrival:
                    flow.arrival = last
                last = flow.arrival
                ready.append(flow)
            if not queue:
                del self.order[key]
        return ready

    def idle(self):
        return not self.flows and not self.order
