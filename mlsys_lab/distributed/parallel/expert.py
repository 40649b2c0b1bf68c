"""Expert parallelism: the ``E`` experts of an :class:`~mlsys_lab.nn.MoE` spread over ``R`` ranks.

Rank ``r`` holds experts ``r * E/R .. (r + 1) * E/R - 1`` and a replica of the gate, and feeds
the layer its own shard of the tokens (one GShard group per rank: routing and capacity are
per rank, which is ``MoE(groups=R)`` on one device). One layer's forward is

1. gate and route the local tokens (:meth:`MoE.route`);
2. **dispatch all-to-all**: the kept tokens of expert ``e``, in slot order, go to ``e``'s rank;
3. each rank runs its experts on what arrived (source ranks in order, so an expert's rows are
   in the single-device order: group, then slot);
4. **combine all-to-all**: the expert outputs go back to the tokens' ranks, which weight and
   sum them (:meth:`MoE.combine`).

The backward runs the two all-to-alls the other way: output gradients to the experts' ranks,
input gradients back. The gate's gradient is all-reduced (it is data parallel); an expert's
gradient is complete on its rank (it saw every rank's tokens). Only routed tokens travel:
each (source, destination, expert) pair is one message of exactly the kept rows (a message
with no rows is empty), sent pairwise over ``p - 1`` steps (:func:`exchange_rows`). The
rows travel as raw arrays through the :class:`~..comm.Communicator`, so the same code runs on
the simulator and under MPI (:func:`expert_parallel_train_mpi`).

Simulated compute: the gate ``2 T d E`` FLOPs, an expert ``4 n d h`` forward (two matmuls on
``n`` rows) and twice that backward, so a rank whose experts got more tokens computes longer
and the others wait for it in the combine all-to-all: :attr:`EPRun.timeline` has one
:class:`~mlsys_lab.span.Span` per rank and phase (gate, dispatch, experts, combine, ...).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from ... import ops
from ...engine.tensor import Tensor
from ...errors import ArgumentError, ShapeError
from ...nn.moe import MoE
from ...span import Span
from .. import sim
from ..collectives import allreduce

__all__ = ["EPRun", "ExpertParallelMoE", "expert_parallel_program", "expert_parallel_train",
           "expert_parallel_train_mpi", "exchange_rows", "expert_owner", "moe_step_time"]


def expert_owner(e, num_experts, size):
    """The rank holding expert ``e`` (``E / R`` consecutive experts per rank)."""
    return e // (num_experts // size)


def exchange_rows(comm, sends):
    """Generator: an all-to-all of variable-length row blocks, one message per block.

    ``sends[d]`` lists the arrays for rank ``d`` (the same number ``n`` of blocks for every
    ``d``: one per expert of ``d``); the blocks for this rank itself are kept, not sent.
    Pairwise order: in step ``k`` rank ``r`` sends to ``r + k`` and receives from ``r - k``
    (block ``j`` on tag ``j``). Returns ``received[s]``: the blocks rank ``s`` sent here.
    """
    p, r = comm.size, comm.rank
    if len(sends) != p:
        raise ArgumentError(f"exchange_rows: need one list of blocks per rank ({p}), got "
                            f"{len(sends)} (rank {r})")
    n = len(sends[r])
    received = [None] * p
    received[r] = [np.array(b, copy=True) for b in sends[r]]
    for k in range(1, p):
        dst, src = (r + k) % p, (r - k) % p
        out = [(np.ascontiguousarray(b), dst, j) for j, b in enumerate(sends[dst])]
        received[src] = list((yield comm.exchange(out, [(src, j) for j in range(n)])))
    return received


def _bytes(blocks):
    return sum(int(b.nbytes) for b in blocks)


@dataclass
class _State:
    """What a forward keeps for its backward."""

    x: Tensor
    routing: object
    inputs: dict          # expert -> the Tensor of its dispatched rows (on the tape from x)
    outputs: list         # expert -> the leaf Tensor of its returned rows (or None)
    saved: list           # local expert j -> (input leaf, output, counts per source)
    sent: dict = field(default_factory=dict)  # phase -> bytes this rank sent


class ExpertParallelMoE:
    """Rank ``rank``'s part of an expert-parallel :class:`~mlsys_lab.nn.MoE`.

    Args:
        moe: the layer (copied; its ``groups`` is ignored: each rank's tokens are one group).
        rank, size: this rank and the number of ranks; ``size`` must divide the experts.
    """

    def __init__(self, moe, rank, size):
        if not isinstance(moe, MoE):
            raise ArgumentError(f"ExpertParallelMoE: need an nn.MoE, got {type(moe).__name__}")
        if moe.num_experts % size:
            raise ArgumentError(f"ExpertParallelMoE: {moe.num_experts} experts do not split "
                                f"over {size} ranks (E must be a multiple of R)")
        self.moe = copy.deepcopy(moe)
        self.rank, self.size = rank, size
        self.per_rank = moe.num_experts // size
        self.local = list(range(rank * self.per_rank, (rank + 1) * self.per_rank))
        self.spans = []

    def parameters(self):
        """The gate's weight (replicated) and this rank's experts' parameters."""
        params = self.moe.gate.parameters()
        for e in self.local:
            params += self.moe.experts[e].parameters()
        return params

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def _span(self, comm, name, start, **detail):
        self.spans.append(Span(f"rank {self.rank}", name, start, comm.now(), name,
                               {"rank": self.rank, **detail}))

    def _expert_flops(self, rows):
        return 4.0 * rows * self.moe.d_model * self.moe.d_hidden

    def forward(self, comm, x):
        """Generator: ``(out, aux, state)`` for this rank's ``(T, d)`` tokens; ``out`` and
        ``aux`` are Tensors on this rank's tape (backprop the loss, then :meth:`backward`)."""
        m, p = self.moe, comm.size
        x = Tensor(np.asarray(x), requires_grad=True)
        if x.ndim != 2 or x.shape[1] != m.d_model:
            raise ShapeError(f"ExpertParallelMoE.forward: rank {self.rank} got tokens of shape "
                             f"{tuple(x.shape)}, need (T, {m.d_model})")
        t0 = comm.now()
        probs, weights, routing = m.route(x, groups=1)
        aux = m.aux_loss(probs, routing)
        yield comm.compute(flops=2.0 * x.shape[0] * m.d_model * m.num_experts)
        self._span(comm, "gate", t0)
        inputs, sends = {}, [[] for _ in range(p)]
        for e in range(m.num_experts):
            tok, _ = routing.expert_tokens(e)
            inputs[e] = ops.take(x, tok, axis=0)
            sends[expert_owner(e, m.num_experts, p)].append(inputs[e].numpy())
        state = _State(x, routing, inputs, [None] * m.num_experts, [])
        t0 = comm.now()
        received = yield from exchange_rows(comm, sends)
        state.sent["dispatch"] = _bytes(b for d in range(p) if d != comm.rank for b in sends[d])
        self._span(comm, "dispatch", t0, bytes=state.sent["dispatch"])
        back = [[] for _ in range(p)]
        t0, rows = comm.now(), 0
        for j, e in enumerate(self.local):
            pieces = [received[s][j] for s in range(p)]
            counts = [len(piece) for piece in pieces]
            xin = Tensor(np.concatenate(pieces, axis=0), requires_grad=True)
            y = m.experts[e](xin) if xin.shape[0] else None
            ynp = y.numpy() if y is not None else np.zeros((0, m.d_model), x.dtype)
            state.saved.append((xin, y, counts))
            bounds = np.cumsum([0] + counts)
            for s in range(p):
                back[s].append(ynp[bounds[s]:bounds[s + 1]])
            rows += xin.shape[0]
        yield comm.compute(flops=self._expert_flops(rows))
        self._span(comm, "experts", t0, tokens=rows)
        t0 = comm.now()
        got = yield from exchange_rows(comm, back)
        state.sent["combine"] = _bytes(b for d in range(p) if d != comm.rank for b in back[d])
        self._span(comm, "combine", t0, bytes=state.sent["combine"])
        for e in range(m.num_experts):
            owner = expert_owner(e, m.num_experts, p)
            rows_e = got[owner][e - owner * self.per_rank]
            if len(rows_e):
                state.outputs[e] = Tensor(rows_e, requires_grad=True)
        if any(o is not None for o in state.outputs):
            out = MoE.combine(state.outputs, weights, routing)
        else:
            out = x * 0.0
        return out, aux, state

    def backward(self, comm, state):
        """Generator, after the local loss's ``backward()``: send the output gradients to the
        experts' ranks, backprop the experts, send the input gradients back and backprop the
        dispatch. Returns this rank's ``dx`` (numpy, gate path included)."""
        m, p = self.moe, comm.size
        sends = [[] for _ in range(p)]
        for e, out in enumerate(state.outputs):
            if out is None or out.grad is None:
                g = np.zeros((0 if out is None else out.shape[0], m.d_model), state.x.dtype)
            else:
                g = out.grad.numpy()
            sends[expert_owner(e, m.num_experts, p)].append(g)
        t0 = comm.now()
        received = yield from exchange_rows(comm, sends)
        state.sent["grad combine"] = _bytes(b for d in range(p) if d != comm.rank
                                            for b in sends[d])
        self._span(comm, "grad combine", t0, bytes=state.sent["grad combine"])
        back = [[] for _ in range(p)]
        t0, rows = comm.now(), 0
        for j, (xin, y, counts) in enumerate(state.saved):
            if y is not None:
                y.backward(Tensor(np.concatenate([received[s][j] for s in range(p)], axis=0)))
                dx = xin.grad.numpy()
            else:
                dx = np.zeros((0, m.d_model), state.x.dtype)
            bounds = np.cumsum([0] + counts)
            for s in range(p):
                back[s].append(dx[bounds[s]:bounds[s + 1]])
            rows += xin.shape[0]
        yield comm.compute(flops=2 * self._expert_flops(rows))
        self._span(comm, "experts backward", t0, tokens=rows)
        t0 = comm.now()
        got = yield from exchange_rows(comm, back)
        state.sent["grad dispatch"] = _bytes(b for d in range(p) if d != comm.rank
                                             for b in back[d])
        self._span(comm, "grad dispatch", t0, bytes=state.sent["grad dispatch"])
        for e, rows_in in state.inputs.items():
            owner = expert_owner(e, m.num_experts, p)
            g = got[owner][e - owner * self.per_rank]
            if rows_in.shape[0]:
                rows_in.backward(Tensor(g))
        if state.x.grad is None:
            return np.zeros(state.x.shape, state.x.dtype)
        return state.x.grad.numpy()


def _sum_squares(out, y):
    diff = out - Tensor(np.asarray(y, dtype=out.dtype))
    return ops.sum(diff * diff)


def expert_parallel_program(comm, moe, make_optimizer, batches, aux_weight=0.01,
                            algo="ring"):
    """The rank program: train ``moe`` expert-parallel on ``batches`` (``[(x, y)]`` global
    batches of ``(T, d)`` tokens; rank ``r`` takes rows ``r*T/R .. (r+1)*T/R``) with loss
    ``sum((out - y)^2) / (T d) + aux_weight * mean over ranks of aux``.

    Returns a dict: ``gate`` (the gate's weight), ``experts`` (``{e: [arrays]}`` of this
    rank's experts), ``routing``, ``dx``, ``loss`` (this rank's share), ``sent`` (bytes sent
    per phase) per step, and ``spans`` (the rank's :class:`~mlsys_lab.span.Span` timeline).
    """
    layer = ExpertParallelMoE(moe, comm.rank, comm.size)
    a2a = comm.dup()
    optimizer = make_optimizer(layer.parameters())
    history = {"routing": [], "dx": [], "loss": [], "sent": []}
    for x, y in batches:
        x, y = np.asarray(x), np.asarray(y)
        if len(x) % comm.size:
            raise ArgumentError(f"expert_parallel_program: a batch of {len(x)} tokens does not "
                                f"split into {comm.size} equal shards")
        n = len(x) // comm.size
        rows = slice(comm.rank * n, (comm.rank + 1) * n)
        layer.zero_grad()
        out, aux, state = yield from layer.forward(a2a, x[rows])
        loss = _sum_squares(out, y[rows]) * (1.0 / x.size) + aux * (aux_weight / comm.size)
        loss.backward()
        dx = yield from layer.backward(a2a, state)
        gate = layer.moe.gate.weight
        g = gate.grad.numpy() if gate.grad is not None else np.zeros_like(gate.data)
        gate.grad = Tensor((yield from allreduce(comm, g, algo=algo)))
        optimizer.step()
        history["routing"].append(state.routing)
        history["dx"].append(dx)
        history["loss"].append(float(loss.numpy()))
        history["sent"].append(dict(state.sent))
    history["gate"] = layer.moe.gate.weight.data.copy()
    history["experts"] = {e: [p.data.copy() for p in layer.moe.experts[e].parameters()]
                          for e in layer.local}
    history["spans"] = list(layer.spans)
    return history


@dataclass
class EPRun:
    """What :func:`expert_parallel_train` returns.

    Attributes:
        model: the trained :class:`~mlsys_lab.nn.MoE` reassembled (gate of rank 0, each expert
            from its rank). ranks: each rank's :func:`expert_parallel_program` dict.
        result: the ``sim.Result`` (its ``trace`` has the messages). timeline: every rank's
            phase spans (gate, dispatch, experts, combine and their gradients).
    """

    model: MoE
    ranks: list
    result: object

    @property
    def timeline(self):
        return sorted(s for r in self.ranks for s in r["spans"])


def _assemble(moe, ranks):
    model = copy.deepcopy(moe)
    model.gate.weight.data = ranks[0]["gate"].copy()
    for r in ranks:
        for e, arrays in r["experts"].items():
            for p, a in zip(model.experts[e].parameters(), arrays):
                p.data = a.copy()
    return model


def expert_parallel_train(moe, batches, cluster, make_optimizer, aux_weight=0.01,
                          algo="ring"):
    """Train ``moe`` expert-parallel on the simulator (one rank per device of ``cluster``).

    Equal to training ``MoE(groups=R)`` (the same layer, one routing group per rank's shard)
    on one device with the same loss (:func:`expert_parallel_program`).

    Returns:
        an :class:`EPRun`.
    """
    if not isinstance(cluster, sim.Cluster):
        raise ArgumentError(f"expert_parallel_train: need a sim.Cluster, got "
                            f"{type(cluster).__name__}")
    res = sim.run(cluster, expert_parallel_program,
                  args=[(moe, make_optimizer, list(batches), aux_weight, algo)] * cluster.size)
    return EPRun(_assemble(moe, res.results), res.results, res)


def expert_parallel_train_mpi(moe, batches, make_optimizer, aux_weight=0.01, algo="ring",
                              comm=None, timeout=60.0):
    """:func:`expert_parallel_program` on this MPI process (run under ``mpiexec -n R``).

    Returns:
        ``(model, mine)``: the trained model reassembled on every rank (the experts'
        parameters all-gathered once at the end) and this rank's program dict.
    """
    from .. import mpi
    from ..collectives import allgather

    def program(cm):
        mine = yield from expert_parallel_program(cm, moe, make_optimizer, list(batches),
                                                  aux_weight, algo)
        flat = np.concatenate([a.reshape(-1) for e in sorted(mine["experts"])
                               for a in mine["experts"][e]])
        every = yield from allgather(cm, flat)
        return mine, every

    mine, every = mpi.run(program, comm=comm, timeout=timeout)
    model = copy.deepcopy(moe)
    model.gate.weight.data = mine["gate"].copy()
    offset = 0
    for expert in model.experts:  # ranks in order, each with its experts in order
        for p in expert.parameters():
            p.data = every[offset:offset + p.size].reshape(p.shape).copy()
            offset += p.size
    return model, mine


def moe_step_time(moe, x, cluster):
    """One expert-parallel forward and backward of ``moe`` on ``x`` (split over the cluster's
    ranks) on the simulator, no optimiser step.

    Returns:
        ``(time, spans, result)``: the simulated step time, the phase spans of every rank
        (:attr:`EPRun.timeline`) and the ``sim.Result``.
    """

    def program(comm, shard):
        layer = ExpertParallelMoE(moe, comm.rank, comm.size)
        out, aux, state = yield from layer.forward(comm, shard)
        ops.sum(out).backward()
        yield from layer.backward(comm, state)
        return layer.spans, state.sent

    shards = np.array_split(np.asarray(x), cluster.size)
    res = sim.run(cluster, program, args=[(s,) for s in shards])
    return res.time, sorted(s for spans, _ in res.results for s in spans), res
