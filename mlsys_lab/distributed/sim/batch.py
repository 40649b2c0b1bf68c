"""The simulator's batched path for whole-cluster ring collectives: a strategy the event loop
consults.

A collective offers itself whole (``comm.batched``); :meth:`BatchedRing.offer` collects the
offers. When every rank has entered the same ring collective, no other message was issued
meanwhile, the ring's routes share no link and nothing still holds one, the collective runs in
one go: the data by the algorithm's own order of operations (:func:`..collectives.ring_plan`),
the times by the engine's per-message arithmetic vectorised over ranks (including the
reduction's ``gamma`` compute after each reduce-scatter step, as the generator charges it),
and each rank is resumed at its end. Otherwise each rank runs the collective's generator
message by message from its entry time (:meth:`BatchedRing.fall_back`); the loop calls
:meth:`BatchedRing.release` when no event is left while offers wait (a batch that cannot
complete).
"""

from __future__ import annotations

import numpy as np

from .trace import TraceEvent

__all__ = ["BatchedRing"]


class BatchedRing:
    """The batched ring strategy of one engine (reads the engine's network and routes)."""

    def __init__(self, engine):
        self.engine = engine
        self.entries = {}  # rank -> (entry time, Batched request)
        self.messages_at_start = 0  # the engine's message count at the first offer
        self.disjoint = None  # the ring's routes share no link (computed on first use)

    @property
    def waiting(self):
        """Offers are waiting for the rest of the cluster."""
        return bool(self.entries)

    def offer(self, rank, now, req):
        """Rank ``rank`` entered the collective ``req`` (a ``Batched`` request) at ``now``."""
        if not (req.comm.supports_batching and self.ring_routes_disjoint()):
            self.fall_back(rank, now, req)
            return
        if not self.entries:
            self.messages_at_start = self.engine.messages
        self.entries[rank] = (now, req)
        if len(self.entries) == self.engine.size:
            self.run()

    def fall_back(self, rank, now, req):
        """Run the collective's generator on ``rank`` from ``now``, message by message."""
        self.engine.agents[rank].stack.append(req.fallback)
        self.engine.schedule(rank, now)

    def release(self):
        """Give up: every waiting rank falls back (in rank order)."""
        entries, self.entries = self.entries, {}
        for rank, (now, req) in sorted(entries.items()):
            self.fall_back(rank, now, req)

    def ring_links(self):
        """The link ids of the routes from each rank to the next."""
        p = self.engine.size
        return [link for r in range(p) for link in self.engine.network.route(r, (r + 1) % p)[0]]

    def ring_routes_disjoint(self):
        """Batching needs the ring's routes to share no link (and no link to fail)."""
        if self.disjoint is None:
            links = self.ring_links()
            self.disjoint = len(links) == len(set(links)) and \
                not self.engine.network.link_failures.keys() & set(links)
        return self.disjoint

    def ring_links_idle(self, since):
        """No earlier message still holds a link (or a port) of the ring after ``since``."""
        e = self.engine
        if e.fair:
            return e.network.idle()
        return e.network.idle_after(self.ring_links(), since, range(e.size))

    def run(self):
        e = self.engine
        entries = [self.entries[r] for r in range(e.size)]
        first = entries[0][1]
        same = all(req.name == first.name and req.op == first.op for _, req in entries)
        if not same or e.messages != self.messages_at_start:
            self.release()
            return
        plan = first.plan([req.array for _, req in entries], first.op)
        if plan is None:  # the plan found mismatched inputs: the fallback reports them
            self.release()
            return
        results, step_bytes = plan
        start = np.array([now for now, _ in entries])
        if not self.ring_links_idle(start.min()):
            self.release()
            return
        reducing = e.size - 1 if first.name == "allreduce/ring" else 0
        if e.failures and self.time_ring_steps(start, step_bytes, probe=True,
                                               reducing=reducing) is None:
            self.release()
            return
        ends = self.time_ring_steps(start, step_bytes, probe=False, reducing=reducing)
        self.entries = {}
        for rank in range(e.size):
            e.schedule(rank, float(ends[rank]), results[rank])

    def time_ring_steps(self, t, step_bytes, probe, reducing=0):
        """Times of ``len(step_bytes)`` ring-shift steps (rank r sends ``step_bytes[s, r]``
        bytes to r + 1 and receives from r - 1), by the same arithmetic as ``transfer``. After
        each of the first ``reducing`` steps a rank reduces what it received: a compute of
        ``gamma`` seconds per byte (``collectives.common.charge``). A probe only asks whether
        the collective ends before the first device failure (``None``: it does not)."""
        e = self.engine
        p = e.size
        gamma = np.array([e.topology.devices[r].gamma for r in range(p)])
        routes = [e.network.route(r, (r + 1) % p) for r in range(p)]
        alpha = np.array([a for _, a, _ in routes])
        beta = np.array([b for _, _, b in routes])
        free = np.zeros(p)
        names = [tuple(e.topology.link_name(link) for link in route)
                 for route, _, _ in routes] if e.record and not probe else None
        ranks = np.arange(p)
        busy = np.zeros(p)
        for step, nbytes in enumerate(step_bytes):
            start = np.maximum(t, free)
            duration = nbytes * beta
            end = start + duration
            free = end
            arrival = end + alpha
            done = np.maximum(arrival, np.maximum(t, np.roll(arrival, 1)))
            if probe:
                if e.failures and done.max() >= min(e.failures.values()):
                    return None
            else:
                busy += nbytes
                self.account_step(ranks, t, start, arrival, nbytes, names)
            t = done
            if step < reducing and gamma.any():
                t = self.charge_reduction(t, gamma, np.roll(nbytes, 1), probe)
        if not probe:
            if e.fair:
                for r, (route, _, _) in enumerate(routes):
                    for link in route:
                        e.network.busy[link] += float(busy[r]) * e.topology.beta[link]
            else:
                for r, (route, _, rbeta) in enumerate(routes):
                    e.network.set_after_batch(route, float(start[r]), float(end[r]),
                                              1.0 / rbeta, float(busy[r]), float(arrival[r]),
                                              float(arrival[r]), r, (r + 1) % p)
        return t

    def charge_reduction(self, t, gamma, nbytes, probe):
        """Each rank reduces the ``nbytes`` it received: compute from ``t`` for ``gamma *
        nbytes`` seconds where that is charged (gamma > 0 and bytes > 0, as ``_charge``)."""
        charged = (gamma > 0) & (nbytes > 0)
        end = np.where(charged, t + gamma * nbytes, t)  # IEEE: as now + seconds in dispatch
        if self.engine.record and not probe:
            for r in np.flatnonzero(charged):
                self.engine.trace.append(TraceEvent(int(r), "compute", float(t[r]),
                                                    float(end[r]), 0, None, None, None))
        return end

    def account_step(self, ranks, posted, start, arrival, nbytes, names):
        e = self.engine
        p = e.size
        e.messages += p
        e.bytes_sent += int(nbytes.sum())
        if names is None:
            return
        left = np.roll(ranks, 1)
        recv_done = np.maximum(posted, np.roll(arrival, 1))
        for r in range(p):
            e.trace.append(TraceEvent(r, "send", float(start[r]), float(arrival[r]),
                                      int(nbytes[r]), r, (r + 1) % p, names[r]))
            e.trace.append(TraceEvent(r, "recv", float(posted[r]), float(recv_done[r]),
                                      int(nbytes[left[r]]), int(left[r]), r, None))
