"""The actor-learner system (IMPALA) and A3C on the cluster simulator, to 1,000 actors.

Each actor and the learner is a rank program on :mod:`mlsys_lab.distributed.sim`: actors spend
simulated seconds playing (``unroll * step_time``) and send their unroll to the learner (rank
0); the learner takes unrolls in arrival order (``recv_any``), sends the unroll's actor the
current parameters in the background (so its link and its compute overlap) and, every
``batch`` unrolls, computes an update. An actor waits for those parameters before its next
unroll, so a busy learner holds actors back (the bounded queue's back-pressure: at most one
unroll per actor in flight). Which resource saturates — the actors, the learner's compute or
the learner's link — shows in the throughput and in the busy fractions.

A3C (Mnih et al. 2016) is the contrast: each worker computes a *gradient* on its own unroll
and sends it to a parameter server, which applies it and returns the parameters; the server's
link then carries a model-sized gradient in and the model out per unroll, where IMPALA's
carries the unroll in and the model out (each direction of a full-duplex link separately).
"""

from dataclasses import dataclass, field

import numpy as np

from ...distributed import sim
from ...distributed.sim.symbolic import SymbolicArray
from ...errors import ArgumentError

PAYLOAD, PARAMS = 1, 2


@dataclass
class SimulatedRun:
    """What :func:`simulate_actor_learner` and :func:`simulate_a3c` return.

    Attributes:
        n_actors, frames, time: actors, environment steps consumed, simulated seconds.
        frames_per_s: ``frames / time``.
        learner_busy: fraction of ``time`` the learner (or server) computed.
        link_busy: fraction of ``time`` the learner's link carried bytes (the busier of its
            two directions).
        lag: policy lag of every consumed unroll (learner updates between the parameters the
            actor used and the update that consumed it).
        bounds: frames/s each resource alone would allow (``actors``, ``learner``,
            ``network``); the smallest is the bottleneck.
        bottleneck: its name.
    """

    n_actors: int
    frames: int
    time: float
    frames_per_s: float
    learner_busy: float
    link_busy: float
    lag: np.ndarray
    bounds: dict = field(default_factory=dict)

    @property
    def bottleneck(self):
        return min(self.bounds, key=self.bounds.get)


def _check(n_actors, unrolls_per_actor):
    if not isinstance(n_actors, (int, np.integer)) or n_actors < 1:
        raise ArgumentError(f"simulate: n_actors must be a positive int, got {n_actors!r}")
    if not isinstance(unrolls_per_actor, (int, np.integer)) or unrolls_per_actor < 1:
        raise ArgumentError(f"simulate: unrolls_per_actor must be a positive int, got "
                            f"{unrolls_per_actor!r}")


def _star(n_actors, bandwidth, alpha, learner_bandwidth):
    """Every device on one switch; the learner's link (rank 0) may be faster."""
    topo = sim.tree(n_actors + 1, fanout=n_actors + 1, alpha=alpha / 2, beta=1.0 / bandwidth)
    switch = n_actors + 1
    topo.set_link(0, switch, beta=1.0 / (learner_bandwidth or bandwidth))
    return topo, switch


def _learner_link_busy(res, topo, switch):
    """Seconds the learner's link was busy, in its busier direction."""
    return max(res.link_busy.get(topo.link_name(topo.link(a, b)), 0.0)
               for a, b in ((switch, 0), (0, switch)))


def _send_in_background(comm, array, dst, tag):
    yield comm.send(array, dst, tag=tag)


def _worker(comm, state, unrolls, seconds, payload):
    """An actor (or A3C worker) rank: ``unrolls`` times, compute for ``seconds``, send
    ``payload`` float32s to rank 0 noting the parameter version it played with, and wait for
    the parameters rank 0 sends back."""
    side = comm.dup()
    version = 0
    for _ in range(unrolls):
        yield comm.compute(seconds=seconds)
        state["queued"][comm.rank].append(version)
        yield comm.send(SymbolicArray(payload), 0, tag=PAYLOAD)
        yield side.recv(0, tag=PARAMS)
        version = int(state["sent_version"][comm.rank])


def simulate_actor_learner(n_actors, unrolls_per_actor=4, unroll=32, step_time=1e-3,
                           frame_bytes=16, param_bytes=40_000, batch=1,
                           learner_time_per_frame=2e-5, learner_overhead=1e-3,
                           bandwidth=1.25e9, learner_bandwidth=None, alpha=10e-6):
    """Simulate IMPALA with ``n_actors`` actors and one learner.

    Args:
        n_actors: actors (ranks 1..n; the learner is rank 0).
        unrolls_per_actor: unrolls each actor produces.
        unroll: environment steps per unroll. step_time: an actor's seconds per step
            (environment and policy inference).
        frame_bytes: bytes per step in an unroll (observation, action, reward, log-prob).
        param_bytes: bytes of the policy parameters an actor pulls per unroll.
        batch: unrolls per learner update.
        learner_time_per_frame, learner_overhead: an update of ``batch`` unrolls takes
            ``learner_overhead + learner_time_per_frame * batch * unroll`` seconds.
        bandwidth: bytes/s of every actor's link. learner_bandwidth: the learner's link
            (default: the same). alpha: latency of one message end to end.

    Returns:
        a :class:`SimulatedRun`.
    """
    _check(n_actors, unrolls_per_actor)
    topo, switch = _star(n_actors, bandwidth, alpha, learner_bandwidth)
    total = n_actors * unrolls_per_actor
    state = {"version": 0, "sent_version": np.zeros(n_actors + 1, np.int64),
             "queued": [[] for _ in range(n_actors + 1)], "lag": [], "busy": 0.0}
    update_time = learner_overhead + learner_time_per_frame * batch * unroll

    def learner(comm):
        side = comm.dup()
        consumed, in_batch = 0, 0
        while consumed < total:
            src, _ = yield comm.recv_any(tag=PAYLOAD)
            state["lag"].append(state["version"] - state["queued"][src].pop(0))
            consumed += 1
            in_batch += 1
            if in_batch == batch or consumed == total:
                yield comm.compute(seconds=update_time)
                state["busy"] += update_time
                state["version"] += 1
                in_batch = 0
            state["sent_version"][src] = state["version"]
            yield comm.start(_send_in_background(side, SymbolicArray(param_bytes // 4), src,
                                                 PARAMS))

    def prog(comm):
        if comm.rank == 0:
            return (yield from learner(comm))
        return (yield from _worker(comm, state, unrolls_per_actor, unroll * step_time,
                                   max(1, unroll * frame_bytes // 4)))

    res = sim.run(sim.Cluster(topo), prog, trace=False, wall_limit=600.0)
    inbound = _learner_link_busy(res, topo, switch)
    frames = total * unroll
    bounds = {"actors": n_actors / step_time,
              "learner": batch * unroll / update_time,
              "network": min(learner_bandwidth or bandwidth, bandwidth * n_actors)
              / max(frame_bytes, param_bytes / unroll)}  # full duplex: unrolls in, models out
    return SimulatedRun(n_actors, frames, res.time, frames / res.time,
                        state["busy"] / res.time, inbound / res.time,
                        np.asarray(state["lag"]), bounds)


def simulate_a3c(n_actors, unrolls_per_actor=4, unroll=32, step_time=1e-3,
                 grad_time_per_frame=2e-4, param_bytes=40_000, apply_time=2e-4,
                 bandwidth=1.25e9, server_bandwidth=None, alpha=10e-6):
    """Simulate A3C-style asynchronous updates through one parameter server (rank 0).

    Each worker plays ``unroll`` steps, computes the gradient itself
    (``grad_time_per_frame * unroll`` seconds on its CPU), sends it (``param_bytes``) and
    waits for the updated parameters (``param_bytes`` back); the server applies each gradient
    as it arrives (``apply_time``). ``lag`` counts the updates other workers applied between
    a worker's parameters and its gradient: Hogwild-style staleness.

    Returns:
        a :class:`SimulatedRun` (``learner_busy``: the server's compute).
    """
    _check(n_actors, unrolls_per_actor)
    topo, switch = _star(n_actors, bandwidth, alpha, server_bandwidth)
    total = n_actors * unrolls_per_actor
    state = {"version": 0, "sent_version": np.zeros(n_actors + 1, np.int64),
             "queued": [[] for _ in range(n_actors + 1)], "lag": [], "busy": 0.0}

    def server(comm):
        side = comm.dup()
        for _ in range(total):
            src, _ = yield comm.recv_any(tag=PAYLOAD)
            state["lag"].append(state["version"] - state["queued"][src].pop(0))
            yield comm.compute(seconds=apply_time)
            state["busy"] += apply_time
            state["version"] += 1
            state["sent_version"][src] = state["version"]
            yield comm.start(_send_in_background(side, SymbolicArray(param_bytes // 4), src,
                                                 PARAMS))

    def prog(comm):
        if comm.rank == 0:
            return (yield from server(comm))
        return (yield from _worker(comm, state, unrolls_per_actor,
                                   unroll * (step_time + grad_time_per_frame), param_bytes // 4))

    res = sim.run(sim.Cluster(topo), prog, trace=False, wall_limit=600.0)
    inbound = _learner_link_busy(res, topo, switch)
    frames = total * unroll
    bounds = {"actors": n_actors / (step_time + grad_time_per_frame),
              "learner": unroll / apply_time,
              "network": min(server_bandwidth or bandwidth, bandwidth * n_actors)
              / (param_bytes / unroll)}
    return SimulatedRun(n_actors, frames, res.time, frames / res.time,
                        state["busy"] / res.time, inbound / res.time,
                        np.asarray(state["lag"]), bounds)
