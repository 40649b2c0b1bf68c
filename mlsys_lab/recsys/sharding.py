"""Embedding tables sharded over simulated parameter servers (row-wise, table-wise or
column-wise, as TorchRec shards them), pulls and pushes of only the touched rows, the bytes
that moves against a dense all-reduce, and the load that hot keys put on each server.

Each server really holds its shard (numpy arrays); a pull returns the current rows as a
:class:`~mlsys_lab.engine.sparse.RowSparse`, a push applies a RowSparse gradient on the owners.
Bytes are counted per message as keys (8 bytes each) plus row values; times follow the
alpha-beta model of :mod:`mlsys_lab.distributed.collectives.cost` (:meth:`ShardedTables.step_time`).

:meth:`ShardedTables.simulate` runs the same pulls and pushes as rank programs on the
distributed simulator (:func:`mlsys_lab.distributed.sim.run`): a worker (rank 0) and the servers
(ranks 1..S) exchange the real keys and rows as messages, so queueing on shared links shows in
the simulated time, while an uncontended step costs exactly the alpha-beta formula.
"""

import heapq
from dataclasses import dataclass

import numpy as np

from ..distributed import sim
from ..distributed.collectives.cost import collective_time
from ..engine.sparse import RowSparse
from ..errors import ArgumentError, ShapeError

KEY_BYTES = 8
SCHEMES = ("row", "table", "column")


def _check_count(n, what, owner):
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ArgumentError(f"{owner}: {what} must be a positive int, got {n!r}")
    return int(n)


class ShardedTables:
    """Embedding tables on ``num_servers`` simulated parameter servers.

    Args:
        tables: 2-D float arrays (rows, dim), copied onto the servers.
        num_servers: how many servers.
        scheme: ``"row"`` (each row on one server: ``placement[t][row]``, default ``row % S``),
            ``"table"`` (each whole table on one server: ``placement[t]``, default the
            largest table first onto the least-loaded server) or ``"column"`` (every server
            holds a block of every table's columns, all rows).
        placement: see ``scheme``.

    Attributes:
        bytes_pulled, bytes_pushed: bytes moved by pulls / pushes (keys plus values).
        server_bytes: bytes each server sent or received. server_lookups: rows each served.
        server_messages: messages each server handled. messages: messages exchanged.
    """

    def __init__(self, tables, num_servers, scheme="row", placement=None):
        self.S = _check_count(num_servers, "num_servers", "ShardedTables")
        if scheme not in SCHEMES:
            raise ArgumentError(f"ShardedTables: scheme must be one of {SCHEMES}, got "
                                f"{scheme!r}")
        tables = [np.asarray(t) for t in tables]
        for i, t in enumerate(tables):
            if t.ndim != 2 or t.dtype.kind != "f":
                raise ShapeError(f"ShardedTables: table {i} must be a 2-D float array, got "
                                 f"{t.dtype}{list(t.shape)}")
        self.scheme, self.shapes = scheme, [t.shape for t in tables]
        self.dtype = tables[0].dtype if tables else np.dtype(np.float32)
        self.home = self._placement(tables, placement)
        self.shards = [{} for _ in range(self.S)]  # server -> {table: local array}
        self.local = []  # table -> local row index of each row (row-wise)
        for t, w in enumerate(tables):
            if scheme == "row":
                local = np.zeros(w.shape[0], np.int64)
                for s in range(self.S):
                    mine = np.flatnonzero(self.home[t] == s)
                    local[mine] = np.arange(mine.size)
                    self.shards[s][t] = w[mine].copy()
                self.local.append(local)
            elif scheme == "table":
                self.shards[self.home[t]][t] = w.copy()
            else:
                for s, cols in enumerate(self.columns(t)):
                    self.shards[s][t] = w[:, cols].copy()
        self.reset_counters()

    def _placement(self, tables, placement):
        if self.scheme == "row":
            if placement is None:
                return [np.arange(t.shape[0]) % self.S for t in tables]
            homes = [np.asarray(p, np.int64) for p in placement]
            for t, (w, h) in enumerate(zip(tables, homes)):
                if h.shape != (w.shape[0],) or h.min(initial=0) < 0 or h.max(initial=0) >= self.S:
                    raise ArgumentError(f"ShardedTables: placement[{t}] must give a server in "
                                        f"[0, {self.S}) for each of the {w.shape[0]} rows")
            return homes
        if self.scheme == "table":
            if placement is None:
                load, homes = np.zeros(self.S), [0] * len(tables)
                for t in sorted(range(len(tables)), key=lambda t: -tables[t].nbytes):
                    homes[t] = int(np.argmin(load))
                    load[homes[t]] += tables[t].nbytes
                return homes
            homes = [int(p) for p in placement]
            if len(homes) != len(tables) or any(not 0 <= h < self.S for h in homes):
                raise ArgumentError(f"ShardedTables: placement must give a server in "
                                    f"[0, {self.S}) for each of the {len(tables)} tables")
            return homes
        return None

    def columns(self, t):
        """Column blocks of table ``t`` (column-wise sharding), one per server."""
        return np.array_split(np.arange(self.shapes[t][1]), self.S)

    def reset_counters(self):
        """Zero the byte, lookup and message counters."""
        self.bytes_pulled = self.bytes_pushed = self.messages = 0
        self.server_bytes = [0] * self.S
        self.server_lookups = [0] * self.S
        self.server_messages = [0] * self.S

    def _routes(self, t, ids):
        """``[(server, positions in ids, local rows, columns)]`` for unique ``ids``."""
        if self.scheme == "row":
            owner = self.home[t][ids]
            out = []
            for s in np.unique(owner):
                pos = np.flatnonzero(owner == s)
                out.append((int(s), pos, self.local[t][ids[pos]], slice(None)))
            return out
        every = np.arange(ids.size)
        if self.scheme == "table":
            return [(self.home[t], every, ids, slice(None))] if ids.size else []
        return [(s, every, ids, cols) for s, cols in enumerate(self.columns(t))
                if ids.size and cols.size]

    def _check(self, t, ids, owner):
        if not 0 <= t < len(self.shapes):
            raise ArgumentError(f"ShardedTables.{owner}: no table {t} (there are "
                                f"{len(self.shapes)})")
        ids = np.unique(np.asarray(ids, np.int64).reshape(-1))
        if ids.size and (ids[0] < 0 or ids[-1] >= self.shapes[t][0]):
            raise ArgumentError(f"ShardedTables.{owner}: ids outside [0, {self.shapes[t][0]}) "
                                f"of table {t}")
        return ids

    def _count(self, s, nbytes, rows):
        self.server_bytes[s] += nbytes
        self.server_lookups[s] += rows
        self.server_messages[s] += 2  # a request and its answer
        self.messages += 2

    def _place(self, values, pos, cols, block):
        if self.scheme == "column":
            values[np.ix_(pos, cols)] = block
        else:
            values[pos] = block

    def _apply(self, s, t, local, cols, block, lr):
        """Server ``s`` applies ``-lr * block`` to its rows ``local`` of table ``t``."""
        shard = self.shards[s][t]
        if self.scheme == "column":
            shard[np.ix_(local, cols - cols[0])] -= lr * block
        else:
            shard[local] -= lr * block

    def _push_plan(self, t, grad):
        if not isinstance(grad, RowSparse) or grad.shape != self.shapes[t]:
            raise ShapeError(f"ShardedTables.push: needs a RowSparse of shape "
                             f"{self.shapes[t]} for table {t} (the gradient of a table looked "
                             f"up with sparse=True: only its rows move), got {grad!r}")
        grad = grad.coalesce()
        ids = self._check(t, grad.indices, "push")
        values = grad.values.astype(self.dtype, copy=False)
        return [(s, pos, local, cols,
                 values[pos] if self.scheme != "column" else values[np.ix_(pos, cols)], ids[pos])
                for s, pos, local, cols in self._routes(t, ids)]

    def _local_rows(self, t, keys):
        """Where a server keeps the rows ``keys`` of table ``t`` in its shard."""
        return self.local[t][keys] if self.scheme == "row" else keys

    def pull(self, t, ids):
        """The current rows ``ids`` of table ``t`` (each fetched once) as a RowSparse."""
        ids = self._check(t, ids, "pull")
        values = np.empty((ids.size, self.shapes[t][1]), self.dtype)
        for s, pos, local, cols in self._routes(t, ids):
            block = self.shards[s][t][local]
            self._place(values, pos, cols, block)
            nbytes = KEY_BYTES * pos.size + block.nbytes
            self.bytes_pulled += nbytes
            self._count(s, nbytes, pos.size)
        return RowSparse(ids, values, self.shapes[t][0])

    def push(self, t, grad, lr):
        """Apply ``w[rows] -= lr * grad`` on the servers owning the gradient's rows."""
        for s, pos, local, cols, block, _ in self._push_plan(t, grad):
            self._apply(s, t, local, cols, block, lr)
            nbytes = KEY_BYTES * pos.size + block.nbytes
            self.bytes_pushed += nbytes
            self._count(s, nbytes, pos.size)

    def simulate(self, pulls=(), pushes=(), lr=0.0, alpha=5e-6, beta=1 / 12.5e9):
        """One worker's step as rank programs on :func:`mlsys_lab.distributed.sim.run`.

        Rank 0 is the worker, rank ``1 + s`` server ``s``, every pair joined by its own link
        (``sim.fully_connected(S + 1, alpha, beta)``). First the pulls: the worker sends each
        owning server the keys it wants (int64, one message per table and server, tag = the
        table) and the server answers with those rows of its shard. Then the pushes: each
        owner gets the keys and gradient rows in one message, applies ``-lr *`` them, and
        answers with an empty acknowledgement. Messages carry exactly the keys and rows (no
        headers), so ``SimStep.bytes`` is the touched rows' bytes; the counters
        (``bytes_pulled``, ``server_bytes``, ...) advance as :meth:`pull`/:meth:`push` do.

        Args:
            pulls: ``(table, ids)`` pairs. pushes: ``(table, RowSparse gradient)`` pairs.
            lr: the push's learning rate. alpha, beta: each link's latency and seconds per byte.

        Returns:
            a :class:`SimStep`: the pulled RowSparse per pull, the simulated time, bytes and
            messages, and the simulator's :class:`~mlsys_lab.distributed.sim.Result`.
        """
        pull_plans = []
        for t, ids in pulls:
            ids = self._check(t, ids, "simulate")
            pull_plans.append((t, ids, self._routes(t, ids)))
        push_plans = [(t, self._push_plan(t, grad)) for t, grad in pushes]
        dim_of = {t: self.shapes[t][1] for t in range(len(self.shapes))}
        rows_out = [np.empty((ids.size, dim_of[t]), self.dtype) for t, ids, _ in pull_plans]
        item = self.dtype.itemsize

        def worker(comm):
            sends, srcs, where = [], [], []
            for i, (t, ids, routes) in enumerate(pull_plans):
                for s, pos, _, cols in routes:
                    sends.append((ids[pos].astype(np.int64), 1 + s, t))
                    srcs.append((1 + s, t))
                    where.append((i, pos, cols))
            replies = yield comm.exchange(sends, srcs)
            for (i, pos, cols), block in zip(where, replies):
                self._place(rows_out[i], pos, cols, block.view(self.dtype).reshape(pos.size, -1))
            sends, srcs = [], []
            for t, plan in push_plans:
                for s, _, _, _, block, keys in plan:
                    msg = np.concatenate([np.ascontiguousarray(keys, np.int64).view(np.uint8),
                                          np.ascontiguousarray(block).reshape(-1).view(np.uint8)])
                    sends.append((msg, 1 + s, t))
                    srcs.append((1 + s, t))
            yield comm.exchange(sends, srcs)

        def server(comm, s):
            for t, _, routes in pull_plans:
                for _ in [r for r in routes if r[0] == s]:
                    keys = yield comm.recv(0, tag=t)
                    block = self.shards[s][t][self._local_rows(t, keys)]
                    yield comm.send(block, 0, tag=t)
                    nbytes = keys.nbytes + block.nbytes
                    self.bytes_pulled += nbytes
                    self._count(s, nbytes, keys.size)
            for t, plan in push_plans:
                for _, _, _, cols, block, _ in [r for r in plan if r[0] == s]:
                    msg = yield comm.recv(0, tag=t)
                    k = msg.nbytes // (KEY_BYTES + block.shape[1] * item)
                    keys = msg[:KEY_BYTES * k].view(np.int64)
                    got = msg[KEY_BYTES * k:].view(self.dtype).reshape(k, block.shape[1])
                    self._apply(s, t, self._local_rows(t, keys), cols, got, lr)
                    yield comm.send(np.zeros(0, np.uint8), 0, tag=t)
                    self.bytes_pushed += msg.nbytes
                    self._count(s, msg.nbytes, k)

        def program(comm):
            if comm.rank == 0:
                return (yield from worker(comm))
            return (yield from server(comm, comm.rank - 1))

        cluster = sim.Cluster(sim.fully_connected(self.S + 1, alpha=alpha, beta=beta),
                              batch_collectives=False)
        result = sim.run(cluster, program, trace=False)
        rows = [RowSparse(ids, values, self.shapes[t][0])
                for (t, ids, _), values in zip(pull_plans, rows_out)]
        return SimStep(rows, result.time, result.bytes, result.messages, result)

    def table(self, t):
        """Table ``t`` reassembled from the servers (for checking; moves nothing)."""
        out = np.empty(self.shapes[t], self.dtype)
        if self.scheme == "row":
            for s in range(self.S):
                out[self.home[t] == s] = self.shards[s][t]
        elif self.scheme == "table":
            out[:] = self.shards[self.home[t]][t]
        else:
            for s, cols in enumerate(self.columns(t)):
                out[:, cols] = self.shards[s][t]
        return out

    def step_time(self, alpha=5e-6, beta=1 / 12.5e9):
        """Simulated time of the traffic so far: the busiest server's messages and bytes
        (servers work in parallel; each has one NIC)."""
        return max(m * alpha + b * beta for m, b in zip(self.server_messages,
                                                        self.server_bytes))


@dataclass
class SimStep:
    """What :meth:`ShardedTables.simulate` returns: ``rows`` (one RowSparse per pull),
    ``time`` (simulated seconds), ``bytes`` and ``messages`` sent, ``result`` (the
    simulator's Result, for its per-link busy times)."""

    rows: list
    time: float
    bytes: int
    messages: int
    result: object


def dense_allreduce_bytes(table_bytes, num_workers):
    """Bytes each worker sends in a ring all-reduce of the dense gradient: ``2 (p-1)/p`` of it."""
    p = _check_count(num_workers, "num_workers", "dense_allreduce_bytes")
    return 2 * (p - 1) / p * table_bytes


def dense_allreduce_time(table_bytes, num_workers, alpha=5e-6, beta=1 / 12.5e9):
    """Ring all-reduce time of a dense gradient of ``table_bytes`` (alpha-beta model)."""
    return collective_time("allreduce", "ring", num_workers, table_bytes, alpha, beta)


# --- hot keys: load per server, placement, replication -------------------------------------------
def server_loads(freq, placement, num_servers):
    """Lookups each server serves: the sum of ``freq`` over the keys placed on it."""
    placement = np.asarray(placement, np.int64)
    return np.bincount(placement, weights=np.asarray(freq, np.float64), minlength=num_servers)


def load_imbalance(loads):
    """``max / mean`` of the loads (1.0 is perfect balance)."""
    loads = np.asarray(loads, np.float64)
    return float(loads.max() / loads.mean()) if loads.mean() > 0 else 1.0


def round_robin_placement(num_keys, num_servers):
    """Key ``i`` on server ``i % S`` (what hashing does, blind to frequency)."""
    return np.arange(num_keys) % num_servers


def balanced_placement(freq, num_servers, capacity):
    """Place keys so the hottest are spread out: keys in decreasing frequency, each onto the
    least-loaded server that still has room for a row (longest-processing-time greedy).

    Args:
        freq: lookups of each key.
        num_servers: how many servers.
        capacity: the most keys a server may hold.

    Returns:
        The server of each key.

    Raises:
        ArgumentError: the keys do not fit (``len(freq) > num_servers * capacity``).
    """
    freq = np.asarray(freq, np.float64)
    S = _check_count(num_servers, "num_servers", "balanced_placement")
    if freq.size > S * capacity:
        raise ArgumentError(f"balanced_placement: {freq.size} keys do not fit on {S} servers "
                            f"of capacity {capacity}")
    heap = [(0.0, s) for s in range(S)]
    held = np.zeros(S, np.int64)
    out = np.empty(freq.size, np.int64)
    for key in np.argsort(-freq, kind="stable"):
        load, s = heapq.heappop(heap)
        out[key] = s
        held[s] += 1
        if held[s] < capacity:
            heapq.heappush(heap, (load + freq[key], s))
    return out


def replicated_loads(freq, placement, num_servers, num_hot):
    """Server loads when the ``num_hot`` hottest keys are replicated on every server (their
    lookups spread evenly) and the rest stay where ``placement`` puts them."""
    freq = np.asarray(freq, np.float64)
    hot = np.argsort(-freq, kind="stable")[:num_hot]
    cold = freq.copy()
    cold[hot] = 0
    return server_loads(cold, placement, num_servers) + freq[hot].sum() / num_servers


__all__ = ["ShardedTables", "SimStep", "dense_allreduce_bytes", "dense_allreduce_time",
           "server_loads", "load_imbalance", "round_robin_placement", "balanced_placement",
           "replicated_loads", "KEY_BYTES", "SCHEMES"]
