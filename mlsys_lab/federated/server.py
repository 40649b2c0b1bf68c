"""The federation: clients' data, the server loop, and what each round records.

:class:`Server` runs rounds the way Flower's server does — the strategy configures the round,
the sampled clients train, the strategy aggregates what came back and evaluates — with the
clients' training vectorised (:mod:`.training`) and the round's messages and clocks on the
cluster simulator (:mod:`.simulation`). Everything random in a round (sampling, shuffles,
drop-outs, local-DP noise) comes from generators seeded by ``(seed, round, ...)``, so a run is
reproducible by its seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ArgumentError
from ..span import Span
from . import model as mdl
from .fleet import Fleet
from .simulation import simulate_round
from .strategies import FitRes
from .training import local_sgd

__all__ = ["ClientData", "RoundRecord", "Server"]


class ClientData:
    """One data set split over clients: ``x``, ``y`` and one index array per client."""

    def __init__(self, x, y, parts):
        self.x, self.y = np.asarray(x), np.asarray(y)
        self.parts = [np.asarray(p, dtype=np.int64) for p in parts]
        if len(self.x) != len(self.y):
            raise ArgumentError(f"ClientData: x has {len(self.x)} rows, y {len(self.y)}")
        if not self.parts or min(len(p) for p in self.parts) < 1:
            raise ArgumentError("ClientData: every client needs at least one sample")
        if max(int(p.max()) for p in self.parts) >= len(self.y) or min(
                int(p.min()) for p in self.parts) < 0:
            raise ArgumentError("ClientData: a partition index is out of range")

    def __len__(self):
        return len(self.parts)

    @property
    def sizes(self):
        return np.array([len(p) for p in self.parts])


@dataclass
class RoundRecord:
    """One round: who was sampled, whose update reached the model, time, bytes, metrics.

    ``sim_time`` and ``last_arrival`` count from the round's start; ``start`` is the simulated
    time the round began (rounds follow each other on one clock), and ``spans`` (with
    ``trace=True``) sit on that clock: one ``"round r"`` span on lane ``"rounds"``, then the
    simulator's compute/send/recv spans on lanes ``"server"``, ``"deadline"``,
    ``"client <cid>"`` (``ml.viz.plot_spans`` draws them)."""

    round: int
    sampled: list
    completed: list
    dropped: list
    late: list
    sim_time: float
    last_arrival: float
    bytes_down: int
    bytes_up: int
    messages: int
    wall: float
    metrics: dict | None = None
    spans: list = field(default_factory=list)
    start: float = 0.0


class Server:
    """A federated server over a fleet of simulated clients.

    Args:
        strategy: a :class:`~.strategies.Strategy` (FedAvg, FedProx, FedAvgM, FedAdam).
        clients: a :class:`ClientData`.
        parameters: the initial global model (dict of arrays; its dtype is the wire's).
        fleet: a :class:`~.fleet.Fleet` with one profile per client (default: identical
            data-centre clients).
        deadline: simulated seconds a round waits for uploads (None: wait for all; needs a
            fleet without drop-outs).
        seed: seeds every random choice of every round.
        update_transform: ``f(global, trained, rng) -> params`` applied on each client to its
            trained model before upload (e.g. :class:`~.privacy.LocalDP`).
        trace: keep each round's ``ml.Span`` records (``RoundRecord.spans``), on one simulated
            clock across rounds (``Server.clock``).
        accept: close a round once this share of the sampled clients has uploaded (over-
            selection, as in Bonawitz et al. 2019: sample more than needed, keep the first);
            None: wait for all (or the deadline).
    """

    def __init__(self, strategy, clients, parameters, fleet=None, deadline=None, seed=0,
                 update_transform=None, trace=False, server_bandwidth=1.25e9, accept=None):
        if not isinstance(clients, ClientData):
            raise ArgumentError(f"Server: clients must be a ClientData, got "
                                f"{type(clients).__name__}")
        self.fleet = Fleet.cloud_cloud(len(clients)) if fleet is None else fleet
        if len(self.fleet) != len(clients):
            raise ArgumentError(f"Server: the fleet has {len(self.fleet)} devices for "
                                f"{len(clients)} clients")
        if accept is not None and not 0 < accept <= 1:
            raise ArgumentError(f"Server: accept={accept!r} must be a share in (0, 1]")
        if deadline is None and np.any(self.fleet.drop_prob > 0):
            raise ArgumentError("Server: the fleet has drop-outs, so a round needs a deadline")
        self.strategy, self.clients = strategy, clients
        self.parameters = {k: np.array(v) for k, v in parameters.items()}
        self.deadline, self.seed, self.update_transform = deadline, seed, update_transform
        self.trace, self.server_bandwidth, self.accept = trace, server_bandwidth, accept
        self.rounds_done = 0
        self.clock = 0.0
        self.history = []

    def round(self):
        """Run one round; returns its :class:`RoundRecord` (also appended to ``history``)."""
        start = time.perf_counter()
        r = self.rounds_done + 1
        params = self.parameters
        rng = np.random.default_rng([self.seed, r, 0])
        instructions = self.strategy.configure_fit(r, params, len(self.clients), rng)
        cids = [ins.cid for ins in instructions]
        trained = [None] * len(cids)
        groups = {}
        for i, ins in enumerate(instructions):
            cfg = ins.config
            key = (cfg["epochs"], cfg["batch_size"], cfg["lr"], cfg.get("mu", 0.0),
                   cfg.get("shuffle", True))
            groups.setdefault(key, []).append(i)
        sizes = self.clients.sizes
        for (epochs, batch, lr, mu, shuffle), members in groups.items():
            stacked, _ = local_sgd(params, self.clients.x, self.clients.y,
                                   [self.clients.parts[cids[i]] for i in members],
                                   epochs=epochs, batch_size=batch, lr=lr, mu=mu,
                                   seeds=[[self.seed, r, cids[i]] for i in members],
                                   shuffle=shuffle)
            for j, i in enumerate(members):
                trained[i] = mdl.unstack(stacked, j)
        if self.update_transform is not None:
            trained = [self.update_transform(params, t, np.random.default_rng(
                [self.seed, r, 1, c])) for t, c in zip(trained, cids)]
        dtype = np.asarray(params["W1"]).dtype
        payloads = [np.concatenate([mdl.flatten(t).astype(dtype, copy=False),
                                    np.array([sizes[c]], dtype=dtype)])
                    for t, c in zip(trained, cids)]
        drop_rng = np.random.default_rng([self.seed, r, 2])
        drops = drop_rng.random(len(cids)) < self.fleet.drop_prob[cids]
        fractions = drop_rng.random(len(cids))
        drop_at = [float(f) if d else None for d, f in zip(drops, fractions)]
        epochs_of = [ins.config["epochs"] for ins in instructions]
        flops = [mdl.train_flops(params, sizes[c] * e) for c, e in zip(cids, epochs_of)]
        failures = []

        def aggregate(received):
            taken = {i for i, _ in received}
            results = [FitRes(cids[i], mdl.unflatten(vec[:-1], params), int(vec[-1]))
                       for i, vec in received]
            failures[:] = [cids[i] for i in range(len(cids)) if i not in taken]
            return self.strategy.aggregate_fit(r, results, list(failures))

        timing = simulate_round(self.fleet, cids, mdl.flatten(params), payloads, flops,
                                aggregate=aggregate, deadline=self.deadline, drop_at=drop_at,
                                accept=None if self.accept is None else max(
                                    1, int(np.ceil(self.accept * len(cids)))),
                                server_bandwidth=self.server_bandwidth, trace=self.trace)
        self.parameters = {k: np.asarray(v) for k, v in timing.aggregate.items()}
        metrics = self.strategy.evaluate(r, self.parameters)
        self.rounds_done = r
        begin, self.clock = self.clock, self.clock + timing.sim_time
        spans = []
        if self.trace:
            spans = [Span("rounds", f"round {r}", begin, self.clock, "round",
                          {"round": r, "sampled": len(cids), "completed": len(timing.received)})]
            spans += [Span(sp.lane, sp.name, sp.start + begin, sp.end + begin, sp.kind,
                           sp.detail) for sp in timing.trace]
        record = RoundRecord(r, cids, [cids[i] for i in timing.received],
                             [cids[i] for i in timing.dropped], [cids[i] for i in timing.late],
                             timing.sim_time, timing.last_arrival, timing.bytes_down,
                             timing.bytes_up, timing.messages, time.perf_counter() - start,
                             metrics, spans, begin)
        self.history.append(record)
        return record

    def fit(self, rounds):
        """Run ``rounds`` rounds; returns their records."""
        return [self.round() for _ in range(int(rounds))]
