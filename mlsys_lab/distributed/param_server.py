"""A parameter server: keys sharded over server ranks, workers that pull rows and push
row-sparse gradients, in synchronous, asynchronous or bounded-staleness mode.

Servers and workers are devices of a simulator topology (``sim.fully_connected`` etc.):
servers are ranks ``0 .. S-1``, workers ``S .. S+W-1``. Messages cost what they cost in
:mod:`.sim` (route latency plus bytes at the bottleneck's rate, links FIFO), and compute costs
``flops / device.flops``, so a straggler is a slower device (``topology.set_device``). A server
must answer whichever worker's message arrives first, which the rank-program contract (receives
name their source) cannot express, so the servers' and workers' logic runs on the small event
loop below over the same cost model.

Modes:

* ``"sync"`` (BSP): each server waits for the pushes of ``ceil(fraction x W)`` workers of the
  current version, applies ``w -= lr x mean(g)``, and only then answers pulls of the next
  version. ``fraction < 1`` is the backup-worker mitigation of stragglers: late gradients are
  dropped. With ``fraction=1`` this is exactly large-batch SGD.
* ``"async"``: every push is applied on arrival, ``w -= lr / W x g``; pulls never wait.
* ``"ssp"`` (bounded staleness ``s``): async updates, but a worker may start step ``c`` only
  when every worker has pushed ``c - s`` steps (no worker runs more than ``s`` steps ahead of
  the slowest).

Only rows a batch touches move (:class:`~.sparse.RowSparse`); ``replicate_hot=h`` (sync mode)
keeps the ``h`` most frequently touched keys on every server: pulls of a hot key go to the
worker's own replica; the key's home server applies the update and refreshes the replicas.
"""

import heapq
import math
import time as _time
from dataclasses import dataclass, field

import numpy as np

from ..errors import ArgumentError
from .comm import CommTimeoutError, DeadlockError
from .sparse import RowSparse

KEY_BYTES = 8
HEADER_BYTES = 16
MODES = ("sync", "async", "ssp")


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


# --- the event loop and the network ---------------------------------------------------------------
class _Loop:
    def __init__(self, wall_limit):
        self.heap, self.seq, self.now, self.wall_limit = [], 0, 0.0, wall_limit

    def at(self, when, fn, *args):
        self.seq += 1
        heapq.heappush(self.heap, (when, self.seq, fn, args))

    def run(self):
        started, events = _time.perf_counter(), 0
        while self.heap:
            self.now, _, fn, args = heapq.heappop(self.heap)
            fn(*args)
            events += 1
            if events % 2048 == 0 and _time.perf_counter() - started > self.wall_limit:
                raise CommTimeoutError(f"ParameterServer: more than wall_limit="
                                       f"{self.wall_limit} s of real time")


class _Network:
    """The simulator's message cost: route reserved FIFO, bytes at the bottleneck's beta."""

    def __init__(self, topology):
        self.topology = topology
        self.free = {}  # link direction -> when it is next free (links may be made lazily)

    def arrival(self, src, dst, nbytes, now):
        route = self.topology.route(src, dst)
        alpha, beta = self.topology.route_cost(route)
        start = max([now] + [self.free.get(link, 0.0) for link in route])
        end = start + nbytes * beta
        for link in route:
            self.free[link] = end
        return end + alpha


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
        topology: a :mod:`.topology` topology with ``num_servers + num_workers`` devices.
        mode: "sync", "async" or "ssp".
        lr: step size on the mean gradient of one round of W workers.
        staleness: the bound ``s`` for "ssp".
        fraction: for "sync", aggregate after this fraction of workers.
        sparse: move only touched rows (``False``: every worker pulls and pushes every row).
        replicate_hot: replicate this many hottest keys on every server ("sync" only).
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
        if replicate_hot and mode != "sync":
            raise ArgumentError("ParameterServer: replicate_hot needs mode='sync' (replicas "
                                "are refreshed once per version)")
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
        """Simulate the job; returns a :class:`PSResult`."""
        self._reset()
        for w in range(self.W):
            self.loop.at(0.0, self._start_step, w)
        self.loop.run()
        stuck = {w: self.done_steps[w] for w in range(self.W) if not self._finished(w)}
        if stuck:
            parked = {s: [w for w, _ in q] for s, q in enumerate(self.parked) if q}
            raise DeadlockError(f"ParameterServer: workers {stuck} (steps done) never finished; "
                                f"pulls parked at servers {parked}", parked)
        return PSResult(self.w.copy(), self.curve, max(self.finish), self.updates, self.dropped,
                        self.bytes_pulled, self.bytes_pushed, list(self.server_bytes),
                        list(self.done_steps), list(self.wait_time), self.max_lead)

    def _reset(self):
        n, S, W = self.problem.num_features, self.S, self.W
        self.loop, self.net = _Loop(self.wall_limit), _Network(self.topology)
        self.w = np.zeros(n)
        self.replica = [self.w.copy() for _ in range(S)]
        self.replica_version = [[0] * S for _ in range(S)]  # [server][home]
        self.version = [0] * S
        self.pending = [{} for _ in range(S)]  # version -> [RowSparse]
        self.clocks = [[0] * W for _ in range(S)]  # pushes each server got from each worker
        self.parked = [[] for _ in range(S)]
        self.server_free = [0.0] * S
        self.server_bytes = [0] * S
        self.rngs = [np.random.default_rng([self.seed, w]) for w in range(W)]
        self.worker_version = [[0] * S for _ in range(W)]
        self.done_steps, self.finish, self.wait_time = [0] * W, [0.0] * W, [0.0] * W
        self.inbox = [None] * W
        self.curve, self.updates, self.dropped = [(0.0, self.problem.loss(self.w))], 0, 0
        self.bytes_pulled = self.bytes_pushed = self.max_lead = 0

    def _device(self, worker):
        return self.S + worker

    def _serve(self, server, nbytes):
        """The server handles a message of ``nbytes``; returns when it is done."""
        start = max(self.loop.now, self.server_free[server])
        self.server_free[server] = start + self.server_overhead + nbytes / self.server_bandwidth
        self.server_bytes[server] += nbytes
        return self.server_free[server]

    def _send(self, src, dst, nbytes, fn, *args):
        arrival = self.net.arrival(src, dst, nbytes, self.loop.now)
        self.loop.at(arrival, fn, *args)
        return arrival

    # -- worker -------------------------------------------------------------------------------
    def _finished(self, w):
        if self.mode == "sync":  # a late worker skips the versions it missed
            return self.done_steps[w] > 0 and min(self.worker_version[w]) + 1 >= self.steps
        return self.done_steps[w] >= self.steps

    def _start_step(self, w):
        if self._finished(w):
            self.finish[w] = self.loop.now
            return
        idx = self.rngs[w].choice(self.shards[w], self.batch_size)
        keys = self.problem.keys(idx) if self.sparse else np.arange(self.problem.num_features)
        targets = self._pull_targets(w, keys)
        self.inbox[w] = {"idx": idx, "rows": np.zeros_like(self.w), "waiting": len(targets),
                         "asked": self.loop.now}
        for server, wanted in targets.items():
            nbytes = HEADER_BYTES + KEY_BYTES * len(wanted)
            self._send(self._device(w), server, nbytes, self._on_pull, server, w, wanted)

    def _pull_targets(self, w, keys):
        """{server: keys to pull from it}: a hot key from the worker's own replica. In sync and
        ssp modes every server is asked (its answer carries its version / clock gate)."""
        where = np.where(self.hot[keys], w % self.S, self.home[keys])
        targets = {s: keys[where == s] for s in range(self.S)}
        if self.mode == "async":
            targets = {s: k for s, k in targets.items() if len(k)}
        return targets

    def _on_reply(self, w, server, version):
        self.worker_version[w][server] = version
        box = self.inbox[w]
        box["waiting"] -= 1
        if box["waiting"] == 0:
            self.wait_time[w] += self.loop.now - box["asked"]
            seconds = self.flops_per_sample * len(box["idx"]) / \
                self.topology.devices[self._device(w)].flops
            self.loop.at(self.loop.now + seconds, self._push, w)

    def _push(self, w):
        """The batch's gradient, computed on the rows as the servers sent them, split by home
        server (sync/ssp: an empty push too, which counts for versions and clocks)."""
        box = self.inbox[w]
        _, grad = self.problem.gradient(box["rows"], box["idx"])
        if not self.sparse:
            grad = RowSparse.from_dense(grad.to_dense(), indices=np.arange(grad.num_rows))
        self.done_steps[w] += 1
        owner = self.home[grad.indices]
        sent = [self.loop.now]
        for s in range(self.S):
            part = grad.select(owner == s)
            if self.mode == "async" and part.nnz_rows == 0:
                continue
            self.bytes_pushed += part.nbytes
            sent.append(self._send(self._device(w), s, HEADER_BYTES + part.nbytes,
                                   self._on_push, s, w, self.worker_version[w][s], part))
        self.loop.at(max(sent), self._start_step, w)  # busy until its pushes arrived

    # -- server -------------------------------------------------------------------------------
    def _on_pull(self, server, w, keys):
        if self._may_answer(server, w, keys):
            self._answer(server, w, keys)
        else:
            self.parked[server].append((w, keys))

    def _may_answer(self, server, w, keys):
        if self.mode == "sync":
            want = self.worker_version[w][server] + (1 if self.done_steps[w] else 0)
            homes = set(self.home[keys[self.hot[keys]]].tolist()) - {server}
            return self.version[server] >= want and all(
                self.replica_version[server][h] >= want for h in homes)
        if self.mode == "ssp":
            return min(self.clocks[server]) >= self.done_steps[w] - self.staleness
        return True

    def _answer(self, server, w, keys):
        self.max_lead = max(self.max_lead, self.done_steps[w] - min(self.clocks[server]))
        values = np.where(self.hot[keys] & (self.home[keys] != server),
                          self.replica[server][keys], self.w[keys])
        self.inbox[w]["rows"][keys] = values
        nbytes = HEADER_BYTES + KEY_BYTES * len(keys) + values.nbytes
        self.bytes_pulled += KEY_BYTES * len(keys) + values.nbytes
        done = self._serve(server, nbytes)
        arrival = self.net.arrival(server, self._device(w), nbytes, done)
        self.loop.at(arrival, self._on_reply, w, server, self.version[server])

    def _release(self, server):
        parked, self.parked[server] = self.parked[server], []
        for w, keys in parked:
            self._on_pull(server, w, keys)

    def _on_push(self, server, w, version, grad):
        self._serve(server, HEADER_BYTES + grad.nbytes)
        self.clocks[server][w] += 1
        if self.mode == "sync":
            self._aggregate(server, version, grad)
        else:
            grad.add_to(self.w, scale=-self.lr / self.W)
            self._updated()
        self._release(server)

    def _aggregate(self, server, version, grad):
        if version < self.version[server]:
            self.dropped += 1
            return
        bucket = self.pending[server].setdefault(version, [])
        bucket.append(grad)
        while len(self.pending[server].get(self.version[server], ())) >= self.needed:
            grads = self.pending[server].pop(self.version[server])
            total = grads[0]
            for g in grads[1:]:
                total = total + g
            total.add_to(self.w, scale=-self.lr / len(grads))
            self.version[server] += 1
            self._updated()
            self._refresh_replicas(server)

    def _refresh_replicas(self, server):
        mine = np.flatnonzero(self.hot & (self.home == server))
        if not len(mine):
            for other in range(self.S):
                self.replica_version[other][server] = self.version[server]
            return
        values, version = self.w[mine].copy(), self.version[server]
        nbytes = HEADER_BYTES + (KEY_BYTES + 8) * len(mine)
        for other in range(self.S):
            if other != server:
                self._send(server, other, nbytes, self._on_refresh, other, server, mine,
                           values, version)

    def _on_refresh(self, server, home, keys, values, version):
        self._serve(server, values.nbytes)
        self.replica[server][keys] = values
        self.replica_version[server][home] = version
        self._release(server)

    def _updated(self):
        self.updates += 1
        self.curve.append((self.loop.now, self.problem.loss(self.w)))
