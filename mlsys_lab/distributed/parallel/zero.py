"""ZeRO: how much memory each device needs for a model, and what sharding costs in traffic.

Mixed-precision Adam keeps, per parameter, 2 bytes of fp16 weights, 2 bytes of fp16 gradients
and K = 12 bytes of optimiser state (an fp32 master copy, momentum and variance). Plain data
parallelism replicates all of it on each of the N devices; ZeRO stage 1 shards the optimiser
state, stage 2 also the gradients, stage 3 also the weights (Rajbhandari et al., 2020).
:func:`zero_train` runs the sharded update on the simulator with real arrays; its parameters
equal plain data parallelism's. Stage 3 there is FSDP (:mod:`.fsdp`): per-layer gathers.
"""

import copy
from dataclasses import dataclass, field

import numpy as np

from ...engine.tensor import Tensor
from ...errors import ArgumentError, DTypeError
from ...nn.module import Parameter
from .. import sim
from ..collectives import allgather, block_bounds, reduce_scatter
from .fsdp import fsdp_train

GB = 1e9
#: bytes per parameter of (weights, gradients, optimiser state) for each optimiser and precision
BYTES_PER_PARAM = {
    ("adam", "mixed"): (2, 2, 12),   # fp16 w, fp16 g, fp32 master w + m + v
    ("adam", "fp32"): (4, 4, 8),     # fp32 w, fp32 g, fp32 m + v
    ("sgd", "fp32"): (4, 4, 0),
    ("momentum", "fp32"): (4, 4, 4),
    ("sgd", "mixed"): (2, 2, 4),     # fp32 master copy
    ("momentum", "mixed"): (2, 2, 8),
}


def _positive(owner, **values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise DTypeError(f"{owner}: {name} must be a number, got {v!r}")
        if not v > 0:
            raise ArgumentError(f"{owner}: {name} must be > 0, got {v!r}")


def _stage(owner, stage):
    if stage not in (0, 1, 2, 3):
        raise ArgumentError(f"{owner}: stage must be 0 (plain DP), 1, 2 or 3, got {stage!r}")


def zero_memory_breakdown(num_params, num_devices, stage, k=12, weight_bytes=2, grad_bytes=2):
    """Bytes per device of weights, gradients and optimiser state under ZeRO ``stage``.

    Returns:
        ``{"params": ..., "grads": ..., "optimizer": ..., "total": ...}`` in bytes.
    """
    _positive("zero_memory_breakdown", num_params=num_params, num_devices=num_devices)
    _stage("zero_memory_breakdown", stage)
    if k < 0:
        raise ArgumentError(f"zero_memory_breakdown: k must be >= 0, got {k!r}")
    n = num_devices
    params = num_params * weight_bytes / (n if stage >= 3 else 1)
    grads = num_params * grad_bytes / (n if stage >= 2 else 1)
    optimizer = num_params * k / (n if stage >= 1 else 1)
    return {"params": params, "grads": grads, "optimizer": optimizer,
            "total": params + grads + optimizer}


def zero_memory_per_device(num_params, num_devices, stage, k=12):
    """Model-state bytes per device: the ZeRO paper's formulas with 2 + 2 + K bytes per param.

    stage 0: (2 + 2 + K) P; stage 1: 2P + 2P + K P / N; stage 2: 2P + (2 + K) P / N;
    stage 3: (2 + 2 + K) P / N.
    """
    return zero_memory_breakdown(num_params, num_devices, stage, k)["total"]


def zero_communication(num_params, num_devices, stage, bytes_per_element=2):
    """Bytes each device sends per training step (ring collectives).

    Plain DP and stages 1-2 move one reduce-scatter plus one all-gather of the model,
    2 (N - 1) / N * P elements; stage 3 all-gathers the weights again for the backward pass,
    3 (N - 1) / N * P elements: 1.5x.
    """
    _positive("zero_communication", num_params=num_params, num_devices=num_devices)
    _stage("zero_communication", stage)
    n = num_devices
    passes = 3 if stage == 3 else 2
    return passes * (n - 1) / n * num_params * bytes_per_element


def training_memory(num_params, optimizer="adam", precision="fp32", activation_bytes=0.0,
                    stage=0, num_devices=1):
    """A memory calculator: bytes per device for weights, gradients, optimiser state and
    activations (activations are per device and not sharded by ZeRO).

    Args:
        optimizer: "adam", "momentum" or "sgd".
        precision: "fp32" or "mixed" (fp16 weights/grads with an fp32 master copy).

    Returns:
        dict of ``params``, ``grads``, ``optimizer``, ``activations``, ``total`` (bytes).
    """
    key = (optimizer, precision)
    if key not in BYTES_PER_PARAM:
        raise ArgumentError(f"training_memory: unknown optimizer/precision {key} (known: "
                            f"{sorted(BYTES_PER_PARAM)})")
    w, g, k = BYTES_PER_PARAM[key]
    out = zero_memory_breakdown(num_params, num_devices, stage, k, w, g)
    if activation_bytes < 0:
        raise ArgumentError(f"training_memory: activation_bytes must be >= 0, got "
                            f"{activation_bytes!r}")
    out["activations"] = float(activation_bytes)
    out["total"] += out["activations"]
    return out


def devices_needed(total_bytes, device_memory=80 * GB):
    """How many devices of ``device_memory`` bytes hold ``total_bytes`` (ceil)."""
    _positive("devices_needed", total_bytes=total_bytes, device_memory=device_memory)
    return int(-(-total_bytes // device_memory))


def smallest_stage_that_fits(num_params, num_devices, device_memory=80 * GB, k=12):
    """The lowest ZeRO stage whose model state fits in ``device_memory``, or None."""
    for stage in range(4):
        if zero_memory_per_device(num_params, num_devices, stage, k) <= device_memory:
            return stage
    return None


# --- a real ZeRO run on the simulator -----------------------------------------------------------
def _flatten(arrays):
    return np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0)


def _unflatten(flat, params):
    out, offset = [], 0
    for p in params:
        out.append(flat[offset:offset + p.size].reshape(p.shape))
        offset += p.size
    return out


def _zero_program(comm, model, make_optimizer, loss_fn, batches, stage, algo, flops):
    """Stages 1 and 2 (stage 3 is FSDP: :mod:`.fsdp`)."""
    model = copy.deepcopy(model)
    params = model.parameters()
    lo, hi = block_bounds(sum(p.size for p in params), comm.size)[comm.rank]
    shard = Parameter(_flatten([p.data for p in params])[lo:hi].copy())
    optimizer = make_optimizer([shard])
    for x, y in batches:
        xs = np.array_split(x, comm.size)[comm.rank]
        ys = np.array_split(y, comm.size)[comm.rank]
        model.zero_grad()
        loss = loss_fn(model(Tensor(xs)), ys) if len(xs) else None
        yield comm.compute(flops=flops * len(xs))
        if loss is not None:
            loss.backward()
        grads = [p.grad.numpy() if p.grad is not None else np.zeros_like(p.data) for p in params]
        flat = _flatten(grads) * (len(xs) / len(x))
        shard.grad = Tensor((yield from reduce_scatter(comm, flat, algo=algo)))
        optimizer.step()
        full = yield from allgather(comm, shard.data, algo=algo)
        for p, value in zip(params, _unflatten(full, params)):
            p.data[...] = value
    held = _held_bytes(params, shard, optimizer, stage, comm.size)
    return {"state": model.state_dict(), "held": held}


def _held_bytes(params, shard, optimizer, stage, n):
    """Model-state bytes this rank keeps between steps (weights, gradients, optimiser);
    stages 1-2 (stage 3's come from :mod:`.fsdp`, measured)."""
    full = sum(p.data.nbytes for p in params)
    weights = full
    grads = shard.data.nbytes if stage >= 2 else full
    opt = sum(a.nbytes for st in optimizer.state for a in st.values())
    return {"params": weights, "grads": grads, "optimizer": opt,
            "total": weights + grads + opt}


@dataclass
class ZeroRun:
    """A ZeRO run: rank 0's final parameters, bytes each rank held, simulated time and bytes
    sent (all ranks)."""

    state: dict
    held: list
    time: float
    bytes_sent: int
    result: object = field(repr=False, default=None)
    fsdp: object = field(repr=False, default=None)  # stage 3: the FSDPRun


def zero_train(model, make_optimizer, loss_fn, batches, cluster, stage=1, algo="ring",
               flops_per_sample=None, prefetch=True):
    """Data-parallel training with ZeRO ``stage`` (1, 2 or 3) on the simulator.

    Stages 1-2: each rank owns a contiguous 1/N of the flattened parameters and the optimiser
    state for it only. Per step: gradients are reduce-scattered (each rank gets the sum over
    ranks of its block), the rank updates its block, and the blocks are all-gathered.

    Stage 3 is FSDP (:func:`.fsdp.fsdp_train`): parameters, gradients and optimiser state
    sharded per layer (each layer's flat vector padded to a multiple of N), each layer
    all-gathered before its forward and again before its backward and freed after use, its
    gradient reduce-scattered, the next layer's gather prefetched (``prefetch``). ``held``
    is then the padded shards' bytes, and ``result`` the :class:`.fsdp.FSDPRun`'s simulator
    result (the run itself is ``run.fsdp``).

    Args:
        make_optimizer: ``params -> optimizer``; element-wise optimisers (SGD, Adam, RMSProp)
            give the same update on a shard as on the whole.
        prefetch: stage 3 only: prefetch the next layer's all-gather.

    Returns:
        A :class:`ZeroRun`.
    """
    _stage("zero_train", stage)
    flops = flops_per_sample or 6.0 * model.num_parameters()
    if stage == 3:
        run = fsdp_train(model, make_optimizer, loss_fn, batches, cluster, prefetch=prefetch,
                         algo=algo, flops_per_sample=flops)
        return ZeroRun(run.state, run.held, run.time, run.bytes_sent, run.result, run)
    args = [(model, make_optimizer, loss_fn, list(batches), stage, algo, flops)] * cluster.size
    res = sim.run(cluster, _zero_program, args=args)
    return ZeroRun(res.results[0]["state"], [r["held"] for r in res.results], res.time,
                   res.bytes, res)
