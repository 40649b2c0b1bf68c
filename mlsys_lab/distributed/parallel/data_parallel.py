"""Data parallelism: every rank holds a replica, trains on its shard of the batch, and the
gradients are all-reduced so every replica takes the same optimiser step.

Gradients are all-reduced in *buckets*: consecutive gradients (last layer first, the order the
backward pass produces them) are flattened into one buffer of about ``bucket_bytes`` and sent as
one message. This is chapter 7's memory fusion applied to communication: one big message pays
the latency ``alpha`` once instead of once per tensor (PyTorch DDP's default is 25 MiB).

``overlap=False`` starts the all-reduces after the whole backward pass. ``overlap=True`` does
what DDP does: the backward is timed bucket by bucket (each bucket's share of the backward
FLOPs, last layer first), and as soon as a bucket's gradients exist its all-reduce starts in
the background (``comm.start`` on a ``dup`` of the communicator: DDP's communication stream),
one bucket after another, while the backward of the earlier layers goes on. The step ends when
the last bucket is reduced; only what is left of the communication then is exposed.
"""

import copy
from dataclasses import dataclass, field

import numpy as np

from ...engine.tensor import Tensor
from ...errors import ArgumentError, ShapeError
from .. import sim
from ..collectives import allreduce

DEFAULT_BUCKET_BYTES = 25 * 2**20


def make_buckets(params, bucket_bytes):
    """Group parameter indices into all-reduce buckets, last parameter first.

    A bucket is closed once adding the next gradient would exceed ``bucket_bytes``; a
    gradient larger than that gets a bucket of its own. ``bucket_bytes=0`` gives one bucket per
    parameter (no fusion), ``float("inf")`` a single bucket.

    Returns:
        A list of lists of indices into ``params``.
    """
    if not bucket_bytes >= 0:
        raise ArgumentError(f"make_buckets: bucket_bytes must be >= 0, got {bucket_bytes!r}")
    buckets, current, size = [], [], 0
    for i in reversed(range(len(params))):
        nbytes = params[i].data.nbytes
        if current and size + nbytes > bucket_bytes:
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
    if current:
        buckets.append(current)
    return buckets


def _grad_array(p):
    if p.grad is None:
        return np.zeros_like(p.data)
    return p.grad.numpy() if isinstance(p.grad, Tensor) else np.asarray(p.grad)


def allreduce_gradients(comm, params, buckets, scale=1.0, algo="ring"):
    """Generator: replace every ``p.grad`` by ``scale`` x the sum of it over all ranks, one
    flattened all-reduce per bucket. Returns the number of all-reduces issued."""
    for bucket in buckets:
        grads = [_grad_array(params[i]) for i in bucket]
        flat = np.concatenate([g.reshape(-1) for g in grads]) * scale
        total = yield from allreduce(comm, flat, algo=algo)
        offset = 0
        for i, g in zip(bucket, grads):
            params[i].grad = Tensor(total[offset:offset + g.size].reshape(g.shape))
            offset += g.size
    return len(buckets)


def shard(array, rank, size):
    """Rank ``rank``'s contiguous slice of the first axis (``np.array_split`` sizes)."""
    return np.array_split(array, size)[rank]


def _check_batches(batches):
    batches = list(batches)
    for t, (x, y) in enumerate(batches):
        if len(x) != len(y):
            raise ShapeError(f"data_parallel_train: batch {t} has {len(x)} inputs but "
                             f"{len(y)} targets")
    return batches


def _local_grads(model, loss_fn, x, y):
    """Forward and backward on this rank's shard; returns (sum of per-sample losses, count)."""
    model.zero_grad()
    if len(x) == 0:
        return 0.0, 0
    loss = loss_fn(model(Tensor(x)), y)
    loss.backward()
    return float(loss.numpy()) * len(x), len(x)


def _bucket_task(stream, params, bucket, scale, algo, previous):
    """Background: wait for the previous bucket's all-reduce (one stream, in order), then
    all-reduce this bucket."""
    if previous is not None:
        yield stream.wait(previous)
    return (yield from allreduce_gradients(stream, params, [bucket], scale, algo))


def _overlapped_step(comm, stream, params, buckets, scale, algo, flops):
    """Forward (a third of the FLOPs), then each bucket's backward followed by its
    all-reduce started in the background; waits for the last."""
    sizes = [p.data.size for p in params]
    total = sum(sizes) or 1
    yield comm.compute(flops=flops / 3)
    task = None
    for bucket in buckets:
        share = sum(sizes[i] for i in bucket) / total
        yield comm.compute(flops=flops * 2 / 3 * share)
        task = yield comm.start(_bucket_task(stream, params, bucket, scale, algo, task))
    if task is not None:
        yield comm.wait(task)  # the tasks run in order: the last one done means all are
    return len(buckets)


def dp_program(comm, model, make_optimizer, loss_fn, batches, bucket_bytes=DEFAULT_BUCKET_BYTES,
               algo="ring", flops_per_sample=None, overlap=False):
    """The rank program of data parallelism (runs under ``sim.run`` or ``mpi.run``).

    Trains a copy of ``model`` on this rank's slice of every global batch, all-reducing the
    bucketed gradients (weighted by slice size) before each optimiser step; ``overlap``
    overlaps the all-reduces with the backward (module docstring).

    Returns:
        ``{"state": final state_dict, "loss_sums": per step, this rank's loss x its share of the
        batch, "collectives": all-reduces issued, "optimizer": optimizer.state_dict()}``.
    """
    if flops_per_sample is None:
        flops_per_sample = 6.0 * model.num_parameters()
    model = copy.deepcopy(model)
    params = model.parameters()
    optimizer = make_optimizer(params)
    buckets = make_buckets(params, bucket_bytes)
    stream = comm.dup() if overlap else None
    losses, collectives = [], 0
    for x, y in batches:
        xs, ys = shard(x, comm.rank, comm.size), shard(y, comm.rank, comm.size)
        loss_sum, n = _local_grads(model, loss_fn, xs, ys)
        if overlap:
            collectives += yield from _overlapped_step(comm, stream, params, buckets,
                                                       n / len(x), algo, flops_per_sample * n)
        else:
            if n:
                yield comm.compute(flops=flops_per_sample * n)
            collectives += yield from allreduce_gradients(comm, params, buckets, n / len(x),
                                                          algo)
        optimizer.step()
        losses.append(loss_sum)
    return {"state": model.state_dict(), "loss_sums": losses, "collectives": collectives,
            "optimizer": optimizer.state_dict()}


@dataclass
class DPResult:
    """What a data-parallel run produced."""

    state: dict                 # rank 0's final model.state_dict()
    losses: list                # mean training loss of each global batch
    time: float                 # simulated seconds
    collectives: int            # all-reduces issued per rank
    buckets: int                # buckets per step
    max_replica_difference: float  # largest |param| difference between replicas
    result: object = field(repr=False, default=None)  # the sim.run result (trace, times)
    compute: float = 0.0        # simulated seconds rank 0 spent computing
    exposed: float = 0.0        # time - compute: communication not hidden behind compute


def data_parallel_train(model, make_optimizer, loss_fn, batches, cluster, *,
                        bucket_bytes=DEFAULT_BUCKET_BYTES, algo="ring", flops_per_sample=None,
                        overlap=False):
    """Train copies of ``model`` on the simulated ranks of ``cluster``.

    Args:
        model: an ``ml.nn.Module``; every rank starts from a copy (``model`` is not changed).
        make_optimizer: ``params -> optimizer`` (e.g. ``lambda ps: ml.optim.SGD(ps, lr=0.1)``).
        loss_fn: ``(prediction Tensor, target array) -> scalar Tensor``, a mean over the
            samples (as ``ml.ops.mse_loss``), so shard gradients weighted by shard size and
            summed give the large-batch gradient.
        batches: a list of global ``(x, y)`` batches, one per step; each is split over ranks.
        cluster: a ``sim.Cluster``; its size is the number of replicas.
        bucket_bytes: gradient bucket size (see :func:`make_buckets`).
        flops_per_sample: modelled compute per sample (default 6 x parameters: forward 2,
            backward 4).
        overlap: overlap each bucket's all-reduce with the rest of the backward (DDP).

    Returns:
        A :class:`DPResult`.
    """
    batches = _check_batches(batches)
    if flops_per_sample is None:
        flops_per_sample = 6.0 * model.num_parameters()
    size = cluster.size
    args = [(model, make_optimizer, loss_fn, batches, bucket_bytes, algo, flops_per_sample,
             overlap) for _ in range(size)]
    res = sim.run(cluster, dp_program, args=args)
    outs = res.results
    ref = outs[0]["state"]
    diff = max((float(np.max(np.abs(o["state"][k] - ref[k]))) if ref[k].size else 0.0)
               for o in outs for k in ref)
    n_per_batch = [len(x) for x, _ in batches]
    losses = [sum(o["loss_sums"][t] for o in outs) / n for t, n in enumerate(n_per_batch)]
    buckets = len(make_buckets(model.parameters(), bucket_bytes))
    compute = res.seconds("compute", rank=0)
    return DPResult(ref, losses, res.time, outs[0]["collectives"], buckets, diff, res,
                    compute, res.time - compute)


def single_device_train(model, make_optimizer, loss_fn, batches):
    """The oracle: the same steps on one device with the whole batch.

    Returns:
        ``(final state_dict, per-step losses)``; ``model`` is not changed.
    """
    model = copy.deepcopy(model)
    optimizer = make_optimizer(model.parameters())
    losses = []
    for x, y in _check_batches(batches):
        model.zero_grad()
        loss = loss_fn(model(Tensor(x)), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.numpy()))
    return model.state_dict(), losses
