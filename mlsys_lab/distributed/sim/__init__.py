"""A deterministic discrete-event simulator of a cluster running rank programs.

Each rank runs an ordinary generator function over a :class:`~..comm.Communicator` and moves real
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
* Reductions cost ``device.gamma`` seconds per byte (the gamma of the alpha-beta-gamma model;
  ``ring(p, gamma=...)``, ``topology.set_device(r, gamma=...)``): wherever a collective
  combines two arrays (a ring reduce-scatter step, a tree or binomial reduce, recursive
  doubling, Rabenseifner) the rank that combines computes ``gamma * bytes`` seconds. The
  default 0 makes reductions free; :func:`..collectives.cost.collective_time` has the
  matching terms.
* A message of ``n`` bytes from ``a`` to ``b`` follows ``topology.route(a, b)`` and streams at
  the route's bottleneck rate ``1 / max(beta)``: it takes ``n * max(beta)`` seconds and arrives
  ``sum(alpha)`` after its last byte left (cut-through; see :mod:`.topology`).
* Contention (``Cluster(sharing="fifo")``, the default): a message *reserves* its rate on
  every link direction of its route, and starts once each of them has that much bandwidth to
  spare; link directions serve messages FIFO in the order they were issued (ties: lower rank
  first), without backfilling. So two messages that each need a whole link queue one behind
  the other, while a link with twice a NIC's bandwidth (a 1:1 uplink over two NICs) carries two
  NIC-rate messages side by side, and an oversubscribed one makes them wait. A message's
  arrival is fixed when it is sent. ``sharing="fair"``: max-min fair sharing instead, rates
  recomputed whenever a message starts or ends (:mod:`.network`); alone on its route a
  message costs the same in both. ``Result.link_busy`` is bytes carried times the link's beta.
* Ports: by default a rank's sends and receives of one ``exchange`` all proceed at once, and
  messages to one rank arrive side by side. ``Cluster(one_port=True)`` is the one-port model
  of the classic cost tables: a rank sends one message at a time and receives one at a time
  (each port held for the message's ``alpha + n beta``), while one send and one receive may
  overlap (full duplex).
* A rank is busy in a ``send`` until its message has arrived (one message at a time per rank,
  the classic alpha-beta accounting); ``sendrecv`` and ``exchange`` keep their sends and
  receives in flight together (full duplex). A receive completes at ``max(posted, arrival)``.
* ``comm.start(program)`` runs a generator as a background task on the rank's device (a
  communication stream: its messages and the rank's computes proceed at once); ``comm.wait``
  joins it. Tasks should talk over a ``comm.dup()``, whose messages never match the rank's own.
* Sends are eager: a message waits in the receiver's mailbox until a matching ``recv``.
  ``recv_any`` takes the message from any source that arrives first (ties: lowest rank).
* If every unfinished rank is blocked and nothing can arrive, ``run`` raises
  :class:`~..comm.DeadlockError` naming each rank and what it waits for. ``time_limit``
  (simulated) and ``wall_limit`` (real seconds) bound every run.

Batched collectives
-------------------
A 1,024-rank ring all-reduce has two million messages: too many to simulate one by one in a
second. Collectives therefore offer themselves whole (``comm.batched``); when *every* rank of
the cluster has entered the same one, no other message was issued meanwhile, the ring's routes
share no link and no earlier message still holds one, the batched strategy the event loop
consults (:mod:`.batch`) runs it in one go: the data by the algorithm's own order of
operations (:func:`..collectives.ring_plan`) and the times by the very same per-message
arithmetic, vectorised over ranks with numpy (per-link alpha and beta, so a slow link shows).
Otherwise it runs the collective's generator message by message from each rank's entry time
(exact too, since nothing else was sent meanwhile; the one inexact case: messages sent by ranks
*while* others waited to batch are ordered before the collective's on shared links, where a
run with ``batched=False`` could interleave them). Tests check that both paths give identical
times, trace and data at p = 64. At p = 1,024 x 256 MiB the data cannot exist, so
:class:`SymbolicArray` carries shape and dtype without values: its runs check timing only.

Modules: this one (``Cluster``, ``run``, ``Result``), :mod:`.engine` (the event loop:
event records, one handler per kind, device failures as events), :mod:`.network` (link
sharing, ports, routes, link failures), :mod:`.batch` (the batched ring strategy),
:mod:`.trace`, :mod:`.symbolic`; the package's ``README.md`` maps them.
"""

from __future__ import annotations

from ...errors import ArgumentError
from ..comm import Communicator
from .engine import Engine
from .symbolic import SymbolicArray
from .topology import Device, Topology, fully_connected, ring, tree, two_level
from .trace import spans as trace_spans
from .trace import trace_span

__all__ = ["SHARING", "Cluster", "Device", "Result", "SimCommunicator", "SymbolicArray",
           "Topology", "fully_connected", "ring", "run", "trace_span", "tree", "two_level"]

SHARING = ("fifo", "fair")


class Cluster:
    """A topology ready to run rank programs.

    Args:
        topology: from :func:`ring`, :func:`fully_connected`, :func:`tree`, :func:`two_level`
            or a hand-built :class:`Topology`.
        batch_collectives: let whole-cluster ring collectives run batched (same results).
        one_port: a rank sends one message at a time and receives one at a time.
        sharing: ``"fifo"`` (rate reservation, first come first served) or ``"fair"``
            (max-min fair sharing); see the module docstring.
    """

    def __init__(self, topology, batch_collectives=True, one_port=False, sharing="fifo"):
        if not isinstance(topology, Topology):
            raise ArgumentError(f"Cluster: need a Topology, got {type(topology).__name__}")
        if sharing not in SHARING:
            raise ArgumentError(f"Cluster: sharing={sharing!r} is not one of {SHARING}")
        if one_port and sharing == "fair":
            raise ArgumentError("Cluster: one_port=True works with sharing='fifo' only")
        self.topology = topology
        self.batch_collectives = bool(batch_collectives)
        self.one_port, self.sharing = bool(one_port), sharing

    @property
    def size(self):
        return self.topology.num_ranks

    def __repr__(self):
        extra = (", one_port=True" if self.one_port else "") + \
            (f", sharing={self.sharing!r}" if self.sharing != "fifo" else "")
        return f"Cluster({self.topology!r}{extra})"


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
        self._dups = 0

    def now(self):
        return self._engine.now()

    def _make_dup(self):
        self._dups += 1
        dup = SimCommunicator(self._engine, self.group, self.rank)
        dup.context = self._engine.context_id((self.group, "dup", self.context, self._dups))
        dup.supports_batching = False
        return dup

    def _make_sub(self, members):
        return SimCommunicator(self._engine, tuple(self.group[m] for m in members),
                               members.index(self.rank))


class Result:
    """What :func:`run` returns.

    Attributes:
        results: each rank's return value. time: the simulated makespan (seconds).
        rank_time: when each rank finished. trace: a list of :class:`~mlsys_lab.span.Span`
        (``trace=True``; one per compute, send and receive: :func:`.trace.trace_span`).
        link_busy: seconds each link direction carried bytes, by link name (only links used).
        messages, bytes: totals sent. unmatched: messages never received (src, dst, tag, bytes).
    """

    def __init__(self, engine):
        ranks = engine.agents[:engine.size]
        self.results = [agent.result for agent in ranks]
        self.rank_time = [agent.finish for agent in ranks]
        self.time = max((agent.finish for agent in engine.agents), default=0.0)  # tasks too
        self._recorded, self._trace = engine.trace, None
        topo = engine.topology
        self.link_busy = {topo.link_name(i): b for i, b in enumerate(engine.busy) if b > 0}
        self.messages, self.bytes = engine.messages, engine.bytes_sent
        self.unmatched = [(k[0], k[1], k[3], m[2]) for k, q in engine.mail.mailbox.items()
                          for m in q]

    @property
    def trace(self):
        """The timeline: one :class:`~mlsys_lab.span.Span` per compute, send and receive, made
        from what the event loop recorded when first read."""
        if self._trace is None:
            self._trace = trace_spans(self._recorded)
        return self._trace

    def seconds(self, kind, rank=None):
        """Total seconds of the timeline's ``kind`` intervals (``"compute"``, ``"send"`` or
        ``"recv"``) of ``rank`` (None: every rank), summed in timeline order from what the
        event loop recorded, without making the :attr:`trace` spans (~100k of them in a
        per-tensor data-parallel step)."""
        return sum(r[3] - r[2] for r in self._recorded
                   if r[1] == kind and (rank is None or r[0] == rank))

    def __repr__(self):
        return (f"<sim.Result: {len(self.results)} ranks, time {self.time:.6g} s, "
                f"{self.messages} messages, {self.bytes} bytes>")


def run(cluster, prog, args=None, kwargs=None, *, trace=True, batched=None, time_limit=None,
        wall_limit=120.0, failures=None, link_failures=None):
    """Run ``prog(comm, *args[rank], **kwargs)`` on every rank of ``cluster``.

    Args:
        cluster: a :class:`Cluster`.
        prog: a generator function ``prog(comm, ...)`` (a plain function runs without
            communicating).
        args: one tuple of arguments per rank (``None``: no arguments).
        kwargs: keyword arguments for every rank.
        trace: record the timeline (:class:`~mlsys_lab.span.Span` records, ``Result.trace``).
        batched: override ``cluster.batch_collectives``.
        time_limit: stop with :class:`~..comm.CommTimeoutError` past this simulated time.
        wall_limit: ... or after this many real seconds.
        failures: ``{rank: t}``: the device fails at simulated time ``t``; the run stops there
            with :class:`~..comm.DeviceFailure` (a synchronous job cannot go on without it).
        link_failures: ``{(u, v): t}``: a message that needs link ``u - v`` past ``t`` stops the
            run with :class:`~..comm.LinkFailure`.

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
    engine = Engine(cluster, trace, batched, time_limit, wall_limit, failures, link_failures)
    world = tuple(range(p))
    for rank in range(p):
        comm = SimCommunicator(engine, world, rank)
        rank_args = args[rank] if isinstance(args[rank], tuple) else (args[rank],)
        engine.start(rank, prog(comm, *rank_args, **(kwargs or {})))
    engine.loop()
    return Result(engine)
