"""The simulator's batched path for whole-cluster ring collectives (mixed into the engine).

When every rank has entered the same ring collective, no other message was issued meanwhile,
the ring's routes share no link and nothing still holds one, the collective runs in one go:
the data by the algorithm's own order of operations (:func:`.collectives.ring_plan`), the times
by the engine's per-message arithmetic vectorised over ranks (including the reduction's
``gamma`` compute after each reduce-scatter step, as the generator charges it). Otherwise each
rank runs the collective's generator message by message from its entry time.
"""

from __future__ import annotations

import numpy as np

from .sim_trace import TraceEvent

__all__ = ["BatchedRing"]


class BatchedRing:
    """Engine methods of the batched ring path (needs the engine's state)."""

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
        """No earlier message still holds a link (or a port) of the ring after ``since``."""
        if self.fair:
            return self.network.idle()
        p = self.size
        links = [link for r in range(p) for link in self.route(r, (r + 1) % p)[0]]
        return self.network.idle_after(links, since, range(p))

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
        reducing = self.size - 1 if first.name == "allreduce/ring" else 0
        if self.failures and self.time_ring_steps(start, step_bytes, probe=True,
                                                  reducing=reducing) is None:
            self.unbatch()
            return
        ends = self.time_ring_steps(start, step_bytes, probe=False, reducing=reducing)
        self.batch = {}
        for rank in range(self.size):
            self.schedule(rank, float(ends[rank]), results[rank])

    def time_ring_steps(self, t, step_bytes, probe, reducing=0):
        """Times of ``len(step_bytes)`` ring-shift steps (rank r sends ``step_bytes[s, r]``
        bytes to r + 1 and receives from r - 1), by the same arithmetic as ``transfer``. After
        each of the first ``reducing`` steps a rank reduces what it received: a compute of
        ``gamma`` seconds per byte (``collective_common._charge``)."""
        p = self.size
        gamma = np.array([self.topology.devices[r].gamma for r in range(p)])
        routes = [self.route(r, (r + 1) % p) for r in range(p)]
        alpha = np.array([a for _, a, _ in routes])
        beta = np.array([b for _, _, b in routes])
        free = np.zeros(p)
        names = [tuple(self.topology.link_name(link) for link in route)
                 for route, _, _ in routes] if self.record and not probe else None
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
                if self.failures and done.max() >= min(self.failures.values()):
                    return None
            else:
                busy += nbytes
                self.account_step(ranks, t, start, arrival, nbytes, names)
            t = done
            if step < reducing and gamma.any():
                t = self.charge_reduction(t, gamma, np.roll(nbytes, 1), probe)
        if not probe:
            if self.fair:
                for r, (route, _, _) in enumerate(routes):
                    for link in route:
                        self.network.busy[link] += float(busy[r]) * self.topology.beta[link]
            else:
                for r, (route, _, rbeta) in enumerate(routes):
                    self.network.set_after_batch(route, float(start[r]), float(end[r]),
                                                 1.0 / rbeta, float(busy[r]),
                                                 float(arrival[r]), float(arrival[r]), r,
                                                 (r + 1) % p)
        return t

    def charge_reduction(self, t, gamma, nbytes, probe):
        """Each rank reduces the ``nbytes`` it received: compute from ``t`` for ``gamma *
        nbytes`` seconds where that is charged (gamma > 0 and bytes > 0, as ``_charge``)."""
        charged = (gamma > 0) & (nbytes > 0)
        end = np.where(charged, t + gamma * nbytes, t)  # IEEE: as now + seconds in dispatch
        if self.record and not probe:
            for r in np.flatnonzero(charged):
                self.trace.append(TraceEvent(int(r), "compute", float(t[r]), float(end[r]), 0,
                                             None, None, None))
        return end

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
