"""A DP x TP x PP device mesh: which global rank holds which (data, tensor, pipeline) slot.

Ranks are laid out as in Megatron-LM: the tensor-parallel index varies fastest (so a TP group is
a run of consecutive ranks, the devices of one node joined by NVLink), then the data-parallel
index, then the pipeline stage: ``rank = (pp * dp_size + dp) * tp_size + tp``.
"""

import copy
from dataclasses import dataclass

import numpy as np

from ... import ops
from ...engine.tensor import Tensor
from ...errors import ArgumentError, DTypeError, UnknownNameError
from ...nn.layers import ReLU, Sequential
from .. import sim
from .data_parallel import allreduce_gradients, make_buckets
from .pipeline_parallel import FORWARD, make_schedule
from .tensor_parallel import ParallelMLP

AXES = ("dp", "tp", "pp")


@dataclass(frozen=True)
class Coord:
    """A rank's position on the mesh."""

    dp: int
    tp: int
    pp: int


class DeviceMesh:
    """``dp x tp x pp`` devices.

    Args:
        dp, tp, pp: sizes of the data-, tensor- and pipeline-parallel axes (each >= 1).

    Raises:
        DTypeError / ArgumentError: a size is not a positive int.
    """

    def __init__(self, dp=1, tp=1, pp=1):
        for name, n in (("dp", dp), ("tp", tp), ("pp", pp)):
            if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
                raise DTypeError(f"DeviceMesh: {name} must be an int, got {n!r}")
            if n < 1:
                raise ArgumentError(f"DeviceMesh: {name} must be >= 1, got {n}")
        self.shape = {"dp": int(dp), "tp": int(tp), "pp": int(pp)}

    @property
    def size(self):
        return self.shape["dp"] * self.shape["tp"] * self.shape["pp"]

    def __repr__(self):
        return f"DeviceMesh(dp={self.shape['dp']}, tp={self.shape['tp']}, pp={self.shape['pp']})"

    def _check_rank(self, rank, owner):
        if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < self.size:
            raise ArgumentError(f"DeviceMesh.{owner}: rank {rank!r} is outside 0..{self.size - 1}")

    def _check_axis(self, axis, owner):
        if axis not in AXES:
            raise UnknownNameError(f"DeviceMesh.{owner}: unknown axis {axis!r} (known: "
                                   f"{', '.join(AXES)})")

    def coords(self, rank):
        """The :class:`Coord` of a global rank."""
        self._check_rank(rank, "coords")
        tp = rank % self.shape["tp"]
        dp = (rank // self.shape["tp"]) % self.shape["dp"]
        pp = rank // (self.shape["tp"] * self.shape["dp"])
        return Coord(dp=int(dp), tp=int(tp), pp=int(pp))

    def rank(self, dp=0, tp=0, pp=0):
        """The global rank at a position."""
        for axis, i in (("dp", dp), ("tp", tp), ("pp", pp)):
            if not isinstance(i, (int, np.integer)) or not 0 <= i < self.shape[axis]:
                raise ArgumentError(f"DeviceMesh.rank: {axis}={i!r} is outside "
                                    f"0..{self.shape[axis] - 1}")
        return int((pp * self.shape["dp"] + dp) * self.shape["tp"] + tp)

    def group(self, rank, axis):
        """The ranks that share every coordinate with ``rank`` except ``axis``, in axis order
        (so ``group(r, "tp")[c.tp] == r``)."""
        self._check_axis(axis, "group")
        c = self.coords(rank)
        pos = {"dp": c.dp, "tp": c.tp, "pp": c.pp}
        out = []
        for i in range(self.shape[axis]):
            pos[axis] = i
            out.append(self.rank(**pos))
        return out

    def groups(self, axis):
        """Every group along ``axis``: a partition of all ranks."""
        self._check_axis(axis, "groups")
        seen, out = set(), []
        for r in range(self.size):
            if r not in seen:
                g = self.group(r, axis)
                seen.update(g)
                out.append(g)
        return out

    def sub(self, comm, axis):
        """The communicator over ``comm.rank``'s group along ``axis`` (``comm.sub``)."""
        return comm.sub(self.group(comm.rank, axis))


# --- hybrid DP x TP x PP training ---------------------------------------------------------------
def mlp_blocks_model(blocks):
    """The unsplit model of ``[(fc1, fc2)]`` blocks: ``Sequential(fc1, ReLU, fc2, ...)``."""
    layers = []
    for fc1, fc2 in blocks:
        layers += [fc1, ReLU(), fc2]
    return Sequential(*layers)


def _hybrid_program(comm, mesh, blocks, batches, schedule, micro_batches, make_optimizer,
                    algo):
    c = mesh.coords(comm.rank)
    tp_comm, dp_comm = mesh.sub(comm, "tp"), mesh.sub(comm, "dp")
    pp_size, per_stage = mesh.shape["pp"], len(blocks) // mesh.shape["pp"]
    mine = copy.deepcopy(blocks[c.pp * per_stage:(c.pp + 1) * per_stage])
    layers = [ParallelMLP(fc1, fc2, c.tp, mesh.shape["tp"], algo=algo) for fc1, fc2 in mine]
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = make_optimizer(params)
    buckets = make_buckets(params, float("inf"))
    prev = mesh.rank(dp=c.dp, tp=c.tp, pp=c.pp - 1) if c.pp > 0 else None
    nxt = mesh.rank(dp=c.dp, tp=c.tp, pp=c.pp + 1) if c.pp < pp_size - 1 else None
    ops_order = make_schedule(schedule, pp_size, micro_batches)[c.pp]
    for x, y in batches:
        xs = np.array_split(x, mesh.shape["dp"])[c.dp]
        ys = np.array_split(y, mesh.shape["dp"])[c.dp]
        mx, my = np.array_split(xs, micro_batches), np.array_split(ys, micro_batches)
        for layer in layers:
            layer.zero_grad()
        grads_out = {}
        for kind, j in ops_order:
            if kind == FORWARD:
                h = mx[j] if prev is None else (yield comm.recv(prev, tag=2 * j))
                for layer in layers:
                    h = yield from layer.forward(tp_comm, h, key=j)
                if nxt is None:
                    out = Tensor(h, requires_grad=True)
                    (ops.mse_loss(out, Tensor(my[j])) * (len(my[j]) / len(x))).backward()
                    grads_out[j] = out.grad.numpy()
                else:
                    yield comm.send(h, nxt, tag=2 * j)
            else:
                g = grads_out.pop(j) if nxt is None else (yield comm.recv(nxt, tag=2 * j + 1))
                for layer in reversed(layers):
                    g = yield from layer.backward(tp_comm, g, key=j)
                if prev is not None:
                    yield comm.send(g, prev, tag=2 * j + 1)
        if dp_comm.size > 1:
            yield from allreduce_gradients(dp_comm, params, buckets, 1.0, algo)
        optimizer.step()
    return [[p.data.copy() for p in layer.parameters()] for layer in layers]


def hybrid_train(blocks, batches, cluster, mesh, make_optimizer, *, schedule="1f1b",
                 micro_batches=2, algo="ring"):
    """Train a stack of MLP blocks with data, tensor and pipeline parallelism at once.

    Each pipeline stage holds ``len(blocks) / pp`` consecutive blocks; each block is a
    Megatron :class:`~.tensor_parallel.ParallelMLP` over the stage's ``tp`` ranks; each
    ``(tp, pp)`` slot is replicated ``dp`` times on shards of the batch, whose gradients are
    all-reduced along the DP axis after the pipeline flush. The loss is the mean squared error.

    Args:
        blocks: ``[(fc1, fc2)]`` pairs of ``ml.nn.Linear`` (not changed).
        batches: ``[(x, y)]`` global batches, one per step.
        cluster: a ``sim.Cluster`` of ``mesh.size`` ranks.
        mesh: a :class:`DeviceMesh`.

    Returns:
        ``(weights, result)``: ``weights[i] = (fc1.weight, fc1.bias, fc2.weight, fc2.bias)``
        of block ``i`` reassembled from the shards of DP replica 0, and the ``sim.run``
        result.
    """
    if cluster.size != mesh.size:
        raise ArgumentError(f"hybrid_train: the cluster has {cluster.size} ranks, the mesh "
                            f"{mesh!r} needs {mesh.size}")
    if len(blocks) % mesh.shape["pp"]:
        raise ArgumentError(f"hybrid_train: {len(blocks)} blocks do not split into "
                            f"pp={mesh.shape['pp']} equal stages")
    short = [t for t, (x, _) in enumerate(batches) if len(x) < mesh.shape["dp"] * micro_batches]
    if short:
        raise ArgumentError(f"hybrid_train: batches {short} have fewer samples than dp x "
                            f"micro_batches = {mesh.shape['dp'] * micro_batches}")
    args = [(mesh, blocks, batches, schedule, micro_batches, make_optimizer, algo)] * mesh.size
    res = sim.run(cluster, _hybrid_program, args=args)
    per_stage, weights = len(blocks) // mesh.shape["pp"], []
    for i in range(len(blocks)):
        stage, local = divmod(i, per_stage)
        shards = [res.results[mesh.rank(dp=0, tp=t, pp=stage)][local]
                  for t in range(mesh.shape["tp"])]
        weights.append((np.concatenate([s[0] for s in shards], axis=1),
                        np.concatenate([s[1] for s in shards]),
                        np.concatenate([s[2] for s in shards], axis=0), shards[0][3]))
    return weights, res
