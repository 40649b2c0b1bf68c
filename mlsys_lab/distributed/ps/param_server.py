"""A parameter server: keys sharded over server ranks, workers that pull rows and push
row-sparse gradients, in synchronous, asynchronous or bounded-staleness mode.

Servers and workers are devices of a simulator topology (``sim.fully_connected`` etc.):
servers are ranks ``0 .. S-1``, workers ``S .. S+W-1``. Messages cost what they cost in
:mod:`..sim` (route latency plus bytes at the bottleneck's rate, links FIFO), and compute costs
``flops / device.flops``, so a straggler is a slower device (``topology.set_device``). Servers
and workers are rank programs run by :func:`..sim.run`: a server answers whichever message comes
first (``comm.recv_any``), charging a service time per message; messages are int64 words
(a header, keys, values). The table lives in one array that each server writes only at its own
keys (so the loss curve can be read off at every update); workers see values only through
the servers' replies.

Modes:

* ``"sync"`` (BSP): each server waits for the pushes of ``ceil(fraction x W)`` workers of the
  current version, applies ``w -= lr x mean(g)``, and only then answers pulls of the next
  version. ``fraction < 1`` is the backup-worker mitigation of stragglers: late gradients are
  dropped. With ``fraction=1`` this is exactly large-batch SGD.
* ``"async"``: every push is applied on arrival, ``w -= lr / W x g``; pulls never wait.
* ``"ssp"`` (bounded staleness ``s``): async updates, but a worker may start step ``c`` only
  when every worker has pushed ``c - s`` steps (no worker runs more than ``s`` steps ahead of
  the slowest).

Only rows a batch touches move (:class:`~mlsys_lab.engine.sparse.RowSparse`);
``replicate_hot=h`` keeps the ``h`` most frequently touched keys on every server: pulls of a
hot key go to the worker's own replica; the key's home server applies the update and refreshes
the replicas (sync: once per version, and a pull waits until its replica has that version;
async/ssp: after every update that touched them, so a replica may lag by the refresh's flight
time).
"""

import math
from dataclasses import dataclass, field

import numpy as np

from ...engine.sparse import RowSparse
from ...errors import ArgumentError
from .. import sim
from ..comm import DeadlockError

KEY_BYTES = 8
HEADER_WORDS = 3  # int64 words: kind, version, steps done / clock
HEADER_BYTES = 8 * HEADER_WORDS
MODES = ("sync", "async", "ssp")
PULL, REPLY, PUSH, REFRESH, DONE = range(5)
TAG = 1


# --- a regression problem with sparse features ----------------------------------------------------
class SparseRegression:
    """``y = X w* + noise`` where each sample has ``nnz`` non-zero features out of
    ``num_features`` (feature ids drawn from a Zipf-like law, so a few keys are hot).
    ``nnz=None`` makes every feature present (a dense problem). The loss is
    ``0.5 x mean((X w - y)^2)``.
    """

    def __init__(self, num_features=64, num_samples=2048, nnz=None, skew=1.1, noise=0.01,
                 seed=0):
        rng = np.random.default_rng(seed)
        self.num_features, self.num_samples = num_features, num_samples
        if nnz is None:
            self.cols = np.tile(np.arange(num_features), (num_samples, 1))
        else:
            weights = 1.0 / np.arange(1, num_features + 1) ** skew
            self.cols = np.stack([rng.choice(num_features, nnz, replace=False,
                                             p=weights / weights.sum())
                                  for _ in range(num_samples)])
        self.vals = rng.standard_normal(self.cols.shape)
        self.w_true = rng.standard_normal(num_features)
        self.y = self.predict(self.w_true, np.arange(num_samples)) + \
            noise * rng.standard_normal(num_samples)

    def predict(self, w, idx):
        return np.sum(self.vals[idx] * w[self.cols[idx]], axis=1)

    def keys(self, idx):
        """The feature ids (keys) a batch touches, sorted."""
        return np.unique(self.cols[idx])

    def gradient(self, w, idx):
        """(loss on the batch, RowSparse gradient over the touched keys)."""
        err = self.predict(w, idx) - self.y[idx]
        contrib = (err[:, None] * self.vals[idx]) / len(idx)
        grad = RowSparse(self.cols[idx].reshape(-1), contrib.reshape(-1), self.num_features)
        return 0.5 * float(np.mean(err ** 2)), grad.coalesce()

    def loss(self, w):
        """The full-data loss."""
        err = self.predict(w, np.arange(self.num_samples)) - self.y
        return 0.5 * float(np.mean(err ** 2))

    def key_frequency(self):
        """How many samples touch each key."""
        return np.bincount(self.cols.reshape(-1), minlength=self.num_features)


# --- the parameter server -------------------------------------------------------------------------
@dataclass
class PSResult:
    """What a parameter-server run measured.

    Attributes:
        weights: the final table. curve: ``[(simulated time, full-data loss)]`` after each
        update. time: when the last worker finished. updates: updates applied. dropped: pushes
        discarded as late (sync with ``fraction < 1``). bytes_pulled / bytes_pushed: row bytes
        moved (values plus indices). server_bytes: bytes each server sent and received.
        steps: steps each worker completed. waits: simulated seconds workers spent waiting for
        pulls to be answered. max_lead: the most steps a worker was ahead of the slowest
        worker (as the answering server saw it) when its pull was answered.
    """

    weights: np.ndarray
    curve: list
    time: float
    updates: int
    dropped: int
    bytes_pulled: int
    bytes_pushed: int
    server_bytes: list
    steps: list
    waits: list = field(default_factory=list)
    max_lead: int = 0

    def time_to_loss(self, target):
        """First simulated time the loss is at most ``target`` (None: never)."""
        return next((t for t, loss in self.curve if loss <= target), None)


class ParameterServer:
    """A parameter-server job over a topology's devices (see the module docstring).

    Args:
        problem: e.g. :class:`SparseRegression` (``keys``, ``gradient``, ``loss``).
        topology: a :mod:`..sim.topology` topology with ``num_servers + num_workers`` devices.
        mode: "sync", "async" or "ssp".
        lr: step size on the mean gradient of one round of W workers.
        staleness: the bound ``s`` for "ssp".
        fraction: for "sync", aggregate after this fraction of workers.
        sparse: move only touched rows (``False``: every worker pulls and pushes every row).
        replicate_hot: replicate this many hottest keys on every server.
        partition: "hash" (key % S) or "range" (contiguous key ranges).
        flops_per_sample: worker compute per sample.
        server_bandwidth: bytes/s a server copies (its service time per message).
    """

    def __init__(self, problem, topology, num_servers, num_workers, *, mode="sync", lr=0.1,
                 batch_size=32, steps=50, staleness=2, fraction=1.0, sparse=True,
                 replicate_hot=0, partition="hash", flops_per_sample=1e6,
                 server_bandwidth=10e9, server_overhead=1e-6, seed=0, wall_limit=60.0):
        self._check(problem, topology, num_servers, num_workers, mode, fraction, replicate_hot,
                    partition, staleness)
        self.problem, self.topology = problem, topology
        self.S, self.W, self.mode = num_servers, num_workers, mode
        self.lr, self.batch_size, self.steps = lr, batch_size, steps
        self.staleness, self.sparse = staleness, sparse
        self.needed = max(1, math.ceil(fraction * num_workers - 1e-9))
        self.flops_per_sample = flops_per_sample
        self.server_bandwidth, self.server_overhead = server_bandwidth, server_overhead
        n = problem.num_features
        self.home = np.arange(n) % num_servers if partition == "hash" else \
            np.minimum(np.arange(n) * num_servers // n, num_servers - 1)
        order = np.argsort(-problem.key_frequency(), kind="stable")
        self.hot = np.zeros(n, dtype=bool)
        self.hot[order[:replicate_hot]] = True
        self.seed, self.wall_limit = seed, wall_limit
        self.shards = np.array_split(np.random.default_rng(seed).permutation(
            problem.num_samples), num_workers)

    @staticmethod
    def _check(problem, topology, S, W, mode, fraction, replicate_hot, partition, staleness):
        if mode not in MODES:
            raise ArgumentError(f"ParameterServer: mode must be one of {MODES}, got {mode!r}")
        if not (isinstance(S, int) and isinstance(W, int) and S >= 1 and W >= 1):
            raise ArgumentError(f"ParameterServer: need >= 1 servers and workers, got {S}, {W}")
        if topology.num_ranks != S + W:
            raise ArgumentError(f"ParameterServer: the topology has {topology.num_ranks} "
                                f"devices for {S} servers + {W} workers")
        if not 0 < fraction <= 1:
            raise ArgumentError(f"ParameterServer: fraction must be in (0, 1], got {fraction}")
        if partition not in ("hash", "range"):
            raise ArgumentError(f"ParameterServer: partition must be 'hash' or 'range', got "
                                f"{partition!r}")
        if mode == "ssp" and not (isinstance(staleness, int) and staleness >= 0):
            raise ArgumentError(f"ParameterServer: staleness must be an int >= 0, got "
                                f"{staleness!r}")
        if not 0 <= replicate_hot <= problem.num_features:
            raise ArgumentError(f"ParameterServer: replicate_hot={replicate_hot} is outside "
                                f"0..{problem.num_features}")

    # -- run ----------------------------------------------------------------------------------
    def run(self):
        """Simulate the job on :func:`..sim.run`; returns a :class:`PSResult`."""
        n, S, W = self.problem.num_features, self.S, self.W
        self.w = np.zeros(n)
        self.curve, self.updates, self.dropped = [(0.0, self.problem.loss(self.w))], 0, 0
        self.bytes_pulled = self.bytes_pushed = self.max_lead = 0
        self.server_bytes = [0] * S
        self.done_steps, self.finish, self.wait_time = [0] * W, [0.0] * W, [0.0] * W
        cluster = sim.Cluster(self.topology, batch_collectives=False)
        try:
            sim.run(cluster, self._program, trace=False, wall_limit=self.wall_limit)
        except DeadlockError as exc:
            stuck = {w: self.done_steps[w] for w in range(W) if self.finish[w] == 0.0}
            raise DeadlockError(f"ParameterServer: workers {stuck} (steps done) never "
                                f"finished:\n{exc}", exc.blocked) from exc
        return PSResult(self.w.copy(), self.curve, max(self.finish), self.updates, self.dropped,
                        self.bytes_pulled, self.bytes_pushed, list(self.server_bytes),
                        list(self.done_steps), list(self.wait_time), self.max_lead)

    def _program(self, comm):
        if comm.rank < self.S:
            return (yield from self._server(comm, comm.rank))
        return (yield from self._worker(comm, comm.rank - self.S))

    def _updated(self, comm):
        self.updates += 1
        self.curve.append((comm.now(), self.problem.loss(self.w)))

    # -- worker -------------------------------------------------------------------------------
    def _pull_targets(self, w, keys):
        """{server: keys to pull from it}: a hot key from the worker's own replica. In sync and
        ssp modes every server is asked (its answer carries its version / clock gate)."""
        where = np.where(self.hot[keys], w % self.S, self.home[keys])
        targets = {s: keys[where == s] for s in range(self.S)}
        if self.mode == "async":
            targets = {s: k for s, k in targets.items() if len(k)}
        return targets

    def _worker(self, comm, w):
        """Pull the batch's rows, compute, push the row-sparse gradient split by home server
        (sync/ssp: an empty push too, which counts for versions and clocks); repeat."""
        S, rng = self.S, np.random.default_rng([self.seed, w])
        version, done = [0] * S, 0
        flops = self.topology.devices[comm.rank].flops

        def finished():
            if self.mode == "sync":  # a late worker skips the versions it missed
                return done > 0 and min(version) + 1 >= self.steps
            return done >= self.steps

        while not finished():
            idx = rng.choice(self.shards[w], self.batch_size)
            keys = self.problem.keys(idx) if self.sparse else \
                np.arange(self.problem.num_features)
            targets = self._pull_targets(w, keys)
            asked, step = comm.now(), 1 if done else 0
            pulls = [(_message(PULL, version[s] + step, done, wanted), s)
                     for s, wanted in targets.items()]
            replies = yield comm.exchange(pulls, list(targets), tag=TAG)
            rows = np.zeros(self.problem.num_features)
            for s, reply in zip(targets, replies):
                _, version[s], _, got, values = _parse(reply)
                rows[got] = values
            self.wait_time[w] += comm.now() - asked
            yield comm.compute(seconds=self.flops_per_sample * len(idx) / flops)
            _, grad = self.problem.gradient(rows, idx)
            if not self.sparse:
                grad = RowSparse.from_dense(grad.to_dense(), indices=np.arange(grad.num_rows))
            done += 1
            self.done_steps[w] = done
            owner = self.home[grad.indices]
            pushes = []
            for s in range(S):
                part = grad.select(owner == s)
                if self.mode == "async" and part.nnz_rows == 0:
                    continue
                self.bytes_pushed += part.nbytes
                pushes.append((_message(PUSH, version[s], done, part.indices, part.values), s))
            yield comm.exchange(pushes, [], tag=TAG)  # busy until its pushes arrived
        self.finish[w] = comm.now()
        yield comm.exchange([(_message(DONE, 0, 0), s) for s in range(S)], [], tag=TAG)

    # -- server -------------------------------------------------------------------------------
    def _server(self, comm, s):
        """Answer whichever message comes first (``recv_any``) until every worker is done."""
        S, W, n = self.S, self.W, self.problem.num_features
        state = {"version": 0, "pending": {}, "clocks": [0] * W, "parked": [],
                 "replica": np.zeros(n), "replica_version": [0] * S}
        finished = 0
        while finished < W:
            src, msg = yield comm.recv_any(tag=TAG)
            kind, a, b, keys, values = _parse(msg)
            if kind == DONE:
                finished += 1
            elif kind == PULL:
                state["parked"].append((src - S, a, b, keys))
                yield from self._release(comm, s, state)
            elif kind == PUSH:
                yield self._serve(comm, s, msg.nbytes)
                state["clocks"][src - S] += 1
                grad = RowSparse(keys, values, n)
                if self.mode == "sync":
                    yield from self._aggregate(comm, s, state, a, grad)
                else:
                    grad.add_to(self.w, scale=-self.lr / W)
                    self._updated(comm)
                    yield from self._refresh(comm, s, keys[self.hot[keys]], 0)
                yield from self._release(comm, s, state)
            else:  # REFRESH from the home server ``src`` of these hot keys
                yield self._serve(comm, s, values.nbytes)
                state["replica"][keys] = values
                state["replica_version"][src] = a
                yield from self._release(comm, s, state)

    def _serve(self, comm, s, nbytes):
        """The server's service time for a message of ``nbytes``."""
        self.server_bytes[s] += nbytes
        return comm.compute(seconds=self.server_overhead + nbytes / self.server_bandwidth)

    def _may_answer(self, s, state, want, steps, keys):
        if self.mode == "sync":
            homes = set(self.home[keys[self.hot[keys]]].tolist()) - {s}
            return state["version"] >= want and all(
                state["replica_version"][h] >= want for h in homes)
        if self.mode == "ssp":
            return min(state["clocks"]) >= steps - self.staleness
        return True

    def _release(self, comm, s, state):
        """Answer every parked pull whose gate is open (in arrival order)."""
        parked, state["parked"] = state["parked"], []
        for w, want, steps, keys in parked:
            if not self._may_answer(s, state, want, steps, keys):
                state["parked"].append((w, want, steps, keys))
                continue
            self.max_lead = max(self.max_lead, steps - min(state["clocks"]))
            values = np.where(self.hot[keys] & (self.home[keys] != s), state["replica"][keys],
                              self.w[keys])
            reply = _message(REPLY, state["version"], 0, keys, values)
            self.bytes_pulled += KEY_BYTES * len(keys) + values.nbytes
            yield self._serve(comm, s, reply.nbytes)
            yield comm.send(reply, self.S + w, tag=TAG)

    def _aggregate(self, comm, s, state, version, grad):
        if version < state["version"]:
            self.dropped += 1
            return
        pending = state["pending"]
        pending.setdefault(version, []).append(grad)
        while len(pending.get(state["version"], ())) >= self.needed:
            grads = pending.pop(state["version"])
            total = grads[0]
            for g in grads[1:]:
                total = total + g
            total.add_to(self.w, scale=-self.lr / len(grads))
            state["version"] += 1
            self._updated(comm)
            mine = np.flatnonzero(self.hot & (self.home == s))
            yield from self._refresh(comm, s, mine, state["version"])

    def _refresh(self, comm, s, keys, version):
        """Send the current values of hot ``keys`` (homed here) to every other server."""
        if not len(keys) or self.S == 1:
            return
        msg = _message(REFRESH, version, 0, keys, self.w[keys])
        yield comm.exchange([(msg, other) for other in range(self.S) if other != s], [],
                            tag=TAG)


def _message(kind, a, b, keys=(), values=None):
    """A message as int64 words: ``[kind, a, b]``, the keys, then the float64 values' bits."""
    parts = [np.array([kind, a, b], dtype=np.int64), np.asarray(keys, dtype=np.int64)]
    if values is not None:
        parts.append(np.ascontiguousarray(values, dtype=np.float64).reshape(-1).view(np.int64))
    return np.concatenate(parts)


def _parse(msg):
    """``(kind, a, b, keys, values)`` of a :func:`_message` (pulls carry keys only)."""
    kind, a, b = (int(v) for v in msg[:HEADER_WORDS])
    body = msg[HEADER_WORDS:]
    if kind == PULL:
        return kind, a, b, body, None
    half = len(body) // 2
    return kind, a, b, body[:half], body[half:].view(np.float64)
