"""One federated round as rank programs on the cluster simulator (``distributed.sim``).

The cluster of a round is a star: the server (rank 0) and the sampled clients (ranks 2, 3,
...) each hang off one switch (the Internet); a deadline timer (rank 1, only when the round
has a deadline) is co-located with the server (a free link of its own, so its tick never
queues behind uploads). A client's link carries its own latency and its uplink
and downlink rates (one direction each); the server's link is the data centre's. The programs:

* **server**: posts the global model to every sampled client at once (``exchange``), then
  takes uploads in arrival order (``recv_any``) until every sampled client has reported or the
  timer's tick arrives; the uploads it took, and only those, go to ``aggregate`` (so a
  dropped or late client's update never reaches the model); aggregation is charged as
  compute on the server. With ``accept`` it closes the round after that many uploads
  (over-selection: sample more clients than needed, keep the first to arrive).
* **timer**: computes for ``deadline`` seconds, then sends the server a tick.
* **client**: receives the model, computes its local training (FLOPs over its device's
  FLOP/s), uploads its trained parameters with its sample count appended; a client that drops
  out stops part-way through its training and sends nothing.

Local training itself runs before the simulation, vectorised over clients
(:mod:`.training`): the clients are independent, so only the messages and the clocks need
the simulator. Uploads that arrive after the tick stay in the server's mailbox
(``Result.unmatched``): the round's late clients.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..distributed import sim
from ..errors import ArgumentError
from ..span import Span

__all__ = ["RoundTiming", "simulate_round"]

MODEL, UPDATE = 1, 2
SERVER, TIMER = 0, 1


@dataclass
class RoundTiming:
    """What the simulator says about one round."""

    received: list                 # positions (into the sampled list) whose uploads were taken
    late: list                     # positions whose uploads arrived after the deadline
    dropped: list                  # positions that dropped out
    aggregate: object              # what ``aggregate`` returned inside the server program
    sim_time: float                # when the server finished the round (simulated seconds)
    last_arrival: float            # when the last upload it took arrived
    bytes_down: int
    bytes_up: int
    messages: int
    trace: list = field(default_factory=list)


def _server(comm, model, count, has_timer, aggregate, aggregate_flops, accept):
    first = 2 if has_timer else 1
    yield comm.exchange(sends=[(model, first + i, MODEL) for i in range(count)])
    got, last = {}, 0.0
    while len(got) < accept:
        src, array = yield comm.recv_any(tag=UPDATE)
        if has_timer and src == TIMER:
            break
        got[src - first] = array
        last = comm.now()
    order = sorted(got)
    yield comm.compute(flops=aggregate_flops * max(len(order), 1))
    return order, aggregate([(i, got[i]) for i in order]), last


def _timer(comm, deadline):
    yield comm.compute(seconds=deadline)
    yield comm.send(np.zeros(1, dtype=np.float32), SERVER, tag=UPDATE)


def _client(comm, payload, train_flops, drop_at):
    yield comm.recv(SERVER, tag=MODEL)
    if drop_at is not None:
        yield comm.compute(flops=train_flops * drop_at)
        return None
    yield comm.compute(flops=train_flops)
    yield comm.send(payload, SERVER, tag=UPDATE)
    return True


def simulate_round(fleet, cids, model_vector, payloads, train_flops, *, aggregate,
                   deadline=None, drop_at=None, accept=None, server_bandwidth=1.25e9,
                   server_latency=1e-3, server_flops=1e12, trace=False):
    """Run one round's messages and clocks.

    Args:
        fleet: the :class:`~.fleet.Fleet`; ``cids``: the sampled clients (ids into it).
        model_vector: the flat global model the server sends.
        payloads: per sampled client, the flat vector it uploads.
        train_flops: per sampled client, the FLOPs of its local training.
        aggregate: ``aggregate([(position, payload), ...]) -> anything``, called inside the
            server program with the uploads it took.
        deadline: simulated seconds from the round's start (None: wait for every client,
            which needs a fleet without drop-outs).
        drop_at: per sampled client, None or the fraction of its training done when it drops.
        accept: close the round after this many uploads (None: all sampled clients); the
            later ones count as late.
        server_bandwidth, server_latency, server_flops: the server's link and compute.
        trace: keep one ``ml.Span`` per compute, send and receive, on lanes ``"server"``,
            ``"deadline"`` and ``"client <cid>"``.

    Returns:
        a :class:`RoundTiming`.
    """
    cids = [int(c) for c in cids]
    count = len(cids)
    if count == 0:
        raise ArgumentError("simulate_round: no clients sampled")
    if not (len(payloads) == len(train_flops) == count):
        raise ArgumentError(f"simulate_round: {count} clients but {len(payloads)} payloads and "
                            f"{len(train_flops)} FLOP counts")
    drop_at = [None] * count if drop_at is None else list(drop_at)
    accept = count if accept is None else int(accept)
    if not 1 <= accept <= count:
        raise ArgumentError(f"simulate_round: accept={accept} must be in 1..{count}")
    if deadline is None and accept > sum(d is None for d in drop_at):
        raise ArgumentError("simulate_round: clients drop out but the round has no deadline; "
                            "the server would wait for them forever")
    has_timer = deadline is not None
    first = 2 if has_timer else 1
    topo = sim.Topology(first + count, flops=server_flops, name="federation")
    hub = topo.add_switch("internet")
    topo.add_link(SERVER, hub, server_latency, 1.0 / server_bandwidth)
    if has_timer:
        topo.add_link(TIMER, SERVER, 0.0, 0.0)     # co-located: its own path to the server
    for i, c in enumerate(cids):
        r = first + i
        topo.set_device(r, flops=float(fleet.flops[c]))
        topo.add_link(r, hub, float(fleet.latency[c]), 1.0 / float(fleet.uplink[c]))
        topo.set_link(hub, r, beta=1.0 / float(fleet.downlink[c]), both=False)
    agg_flops = 2.0 * np.asarray(model_vector).size
    args = [(model_vector, count, has_timer, aggregate, agg_flops, accept)]
    progs = {SERVER: _server}
    if has_timer:
        args.append((float(deadline),))
        progs[TIMER] = _timer
    args += [(payloads[i], float(train_flops[i]), drop_at[i]) for i in range(count)]

    def prog(comm, *a):
        return (progs.get(comm.rank, _client))(comm, *a)

    res = sim.run(sim.Cluster(topo), prog, args=args, trace=trace, wall_limit=600.0)
    order, aggregated, last = res.results[SERVER]
    late = sorted(src - first for src, dst, tag, _ in res.unmatched
                  if dst == SERVER and tag == UPDATE and src >= first)
    dropped = [i for i in range(count) if drop_at[i] is not None]
    model_bytes = np.asarray(model_vector).nbytes
    up = sum(np.asarray(payloads[i]).nbytes for i in range(count) if drop_at[i] is None)
    spans = []
    if trace:
        names = {SERVER: "server", TIMER: "deadline"} if has_timer else {SERVER: "server"}
        for s in res.trace:
            lane = names.get(s.rank, f"client {cids[s.rank - first]}" if s.rank >= first
                             else s.lane)
            spans.append(Span(lane, s.name, s.start, s.end, s.kind, dict(s.detail)))
    return RoundTiming(list(order), late, dropped, aggregated, float(res.rank_time[SERVER]),
                       float(last), model_bytes * count, int(up),
                       res.messages - (1 if has_timer else 0), spans)
