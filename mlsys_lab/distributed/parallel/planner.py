"""A 3-D parallel planner: memory per GPU and step time of a GPT on a DP x TP x PP mesh.

For a GPT-shaped model (:class:`GPT`: layers ``l``, hidden ``h``, heads ``a``, sequence ``s``,
vocabulary ``V``, global batch ``B``, microbatch ``b``) on ``dp x tp x pp`` GPUs of a two-level
cluster (NVLink inside a server, InfiniBand across: :func:`~..sim.topology.two_level`), laid
out as :class:`~.mesh.DeviceMesh` lays out Megatron's ranks (TP fastest, then DP, then PP):

**Memory** (:func:`memory_per_gpu`), bytes on the busiest GPU (pipeline stage 0):

* parameters: stage 0's ``l / pp`` layers, each ``12 h^2 + 13 h`` parameters of which
  ``12 h^2 + 7 h`` are split over ``tp`` (QKV, projection, fc1, fc2 and their column biases)
  and ``6 h`` replicated (two layer norms, the two row-parallel biases), plus the word
  embedding ``V h / tp`` and the position embedding ``s h``;
* with mixed-precision Adam, 2 bytes of fp16 weights, 2 of fp16 gradients and 12 of optimiser
  state (fp32 master weights, momentum, variance) per parameter, sharded over the DP group by
  ZeRO ``zero_stage`` (:func:`.zero.zero_memory_breakdown`, Rajbhandari et al. 2020);
* activations (Korthikanti et al. 2022, "Reducing activation recomputation", Eq. 2, no
  sequence parallelism): ``s b h (10 + 24 / tp + 5 a s / (h tp))`` bytes per layer and
  microbatch without recomputation; with full recomputation only each layer's input,
  ``2 s b h``, plus one layer's full activations while it is recomputed. Under 1F1B stage 0
  holds ``min(pp, m)`` microbatches in flight (``m = B / (dp b)``).

**Time** (:func:`step_time`), one optimiser step:

* FLOPs by Narayanan et al. 2021's formula, recomputation included:
  ``96 B s l h^2 (1 + s / 6h + V / 16 l h)`` (``72`` without recomputation); a stage's share
  of the transformer term per microbatch, plus the logits ``6 b s h V / tp`` on the last;
* GEMMs at ``peak x gemm_efficiency`` (:class:`Hardware`: one stated number, not fitted);
  the element-wise work between them (layer norms, softmax, dropout, GeLU, residual adds:
  memory-bound) at the HBM bandwidth, :func:`elementwise_bytes` per layer;
* tensor parallelism: per layer and microbatch 2 all-reduces of ``2 s b h`` bytes forward, 2
  backward and 2 more in the recomputed forward, ring over the TP group (NVLink when the group
  fits in a server, else InfiniBand);
* pipeline: per microbatch a stage receives its input and its output's gradient, ``2 s b h /
  tp`` bytes per GPU (Megatron's scatter/gather over the TP ranks' NICs), and 1F1B's bubble:
  the pipeline takes ``(m + pp - 1)`` microbatch slots, a bubble of ``(pp - 1) / m``;
* data parallelism: the fp16 gradients all-reduced (ring) over the DP group after the flush;
* the optimiser step, memory-bound: mixed-precision Adam reads the fp16 gradient and the fp32
  master weight, momentum and variance and writes all but the gradient and the fp16 weight,
  28 bytes per parameter of the GPU's (ZeRO-sharded) optimiser state, at the HBM bandwidth.

Collective times come from the simulator's cost functions (:func:`..collectives.cost.
collective_time`) with ``alpha`` and ``beta`` read off the ``two_level`` topology's route
between the group's ranks, so the planner and the simulator agree on the cluster.
``comm=False`` and ``bubble=False`` switch communication and the bubble off (the benchmark's
ablation). Not modelled: data loading, the cross-entropy's element-wise work, kernel launch
gaps, overlap of communication with compute (none in Megatron's 2021 schedule), the
interleaved schedule, collectives below link rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import ArgumentError
from ..collectives.cost import collective_time
from ..sim.topology import two_level
from .mesh import DeviceMesh
from .zero import zero_memory_breakdown

__all__ = ["A100", "GPT", "Hardware", "Plan", "elementwise_bytes", "memory_per_gpu", "plan",
           "step_time", "training_flops"]

GB = 1e9
ADAM_BYTES = 28  # HBM bytes per parameter of a mixed-precision Adam step (module docstring)


@dataclass(frozen=True)
class GPT:
    """A GPT's shape and batch: ``layers``, ``hidden``, ``heads``, ``seq``, ``vocab``,
    ``global_batch`` (sequences per step) and ``microbatch`` (sequences per pipeline
    microbatch)."""

    layers: int
    hidden: int
    heads: int
    seq: int = 2048
    vocab: int = 51200
    global_batch: int = 512
    microbatch: int = 1

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "seq", "vocab", "global_batch", "microbatch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArgumentError(f"GPT: {name}={v!r} must be an int >= 1")
        if self.hidden % self.heads:
            raise ArgumentError(f"GPT: hidden={self.hidden} is not a multiple of "
                                f"heads={self.heads}")

    @property
    def parameters(self):
        """``12 l h^2 (1 + 13 / 12h + (V + s) / 12 l h)`` (Narayanan et al. 2021, Eq. 2)."""
        l, h = self.layers, self.hidden
        return 12 * l * h * h + 13 * l * h + (self.vocab + self.seq) * h


def training_flops(model, recompute=True):
    """FLOPs of one step: ``96 B s l h^2 (1 + s / 6h + V / 16 l h)`` with recomputation (the
    forward runs twice), ``72 B s l h^2 (1 + s / 6h) + 6 B s h V`` without."""
    B, s, l, h, V = model.global_batch, model.seq, model.layers, model.hidden, model.vocab
    layers = (96 if recompute else 72) * B * s * l * h * h * (1 + s / (6 * h))
    return layers + 6 * B * s * h * V


@dataclass(frozen=True)
class Hardware:
    """One GPU type and its cluster.

    Attributes:
        peak_flops: dense fp16/bf16 tensor-core FLOP/s. gemm_efficiency: the fraction of it
            GEMMs reach (one stated number). hbm_bandwidth: bytes/s (element-wise work).
        memory: bytes per GPU. gpus_per_server: GPUs joined by NVLink.
        nvlink_bandwidth / nvlink_alpha: bytes/s per GPU per direction, and latency.
        ib_bandwidth / ib_alpha: each GPU's own NIC (bytes/s per direction), and latency.
    """

    name: str
    peak_flops: float
    gemm_efficiency: float
    hbm_bandwidth: float
    memory: float
    gpus_per_server: int
    nvlink_bandwidth: float
    nvlink_alpha: float
    ib_bandwidth: float
    ib_alpha: float

    def topology(self, gpus):
        """The ``two_level`` topology of ``gpus`` GPUs (whole servers)."""
        servers = -(-gpus // self.gpus_per_server)
        return two_level(servers, self.gpus_per_server, nvlink_alpha=self.nvlink_alpha,
                         nvlink_beta=1 / self.nvlink_bandwidth, ib_alpha=self.ib_alpha,
                         ib_beta=1 / self.ib_bandwidth,
                         flops=self.peak_flops * self.gemm_efficiency, memory=self.memory)


#: Narayanan et al. 2021's cluster (Selene, DGX A100 80 GB): 312 TFLOP/s bf16 per A100
#: (NVIDIA A100 datasheet), NVLink 3 with NVSwitch at 300 GB/s per GPU per direction (12
#: links x 25 GB/s), eight 200 Gb/s HDR InfiniBand NICs per 8-GPU server (25 GB/s per GPU),
#: HBM2e 2,039 GB/s. GEMM efficiency 0.80: "optimized GEMM ... can reach up to 80-90% of the
#: theoretical maximum device throughput" on A100 (Dao 2023, FlashAttention-2, sec. 1), the
#: lower end. Latencies 2 us (NVLink) and 5 us (IB): the simulator's defaults.
A100 = Hardware("A100-SXM4-80GB", 312e12, 0.80, 2039e9, 80 * GB, 8, 300e9, 2e-6, 25e9,
                5e-6)


def _check(model, mesh, where):
    if not isinstance(model, GPT):
        raise ArgumentError(f"{where}: need a planner.GPT, got {type(model).__name__}")
    if not isinstance(mesh, DeviceMesh):
        raise ArgumentError(f"{where}: need a DeviceMesh, got {type(mesh).__name__}")
    dp, tp, pp = mesh.shape["dp"], mesh.shape["tp"], mesh.shape["pp"]
    if model.layers % pp:
        raise ArgumentError(f"{where}: {model.layers} layers do not split into pp={pp} stages")
    if model.heads % tp or model.hidden % tp:
        raise ArgumentError(f"{where}: tp={tp} must divide heads={model.heads} and hidden="
                            f"{model.hidden}")
    if model.global_batch % (dp * model.microbatch):
        raise ArgumentError(f"{where}: global batch {model.global_batch} is not a multiple of "
                            f"dp x microbatch = {dp} x {model.microbatch}")
    return dp, tp, pp


def microbatches(model, mesh):
    """``m = B / (dp b)``: microbatches per pipeline per step."""
    return model.global_batch // (mesh.shape["dp"] * model.microbatch)


def stage_parameters(model, mesh, stage=0):
    """Parameters one GPU of pipeline ``stage`` holds (module docstring)."""
    tp, pp = mesh.shape["tp"], mesh.shape["pp"]
    h, l = model.hidden, model.layers // pp
    count = l * ((12 * h * h + 7 * h) / tp + 6 * h)
    if stage == 0:
        count += model.vocab * h / tp + model.seq * h
    if stage == pp - 1:
        count += 2 * h  # the final layer norm
        if pp > 1:
            count += model.vocab * h / tp  # the tied output embedding's copy
    return count


def activation_bytes_per_layer(model, tp, recompute):
    """Bytes one layer keeps per microbatch for its backward (Korthikanti et al. 2022)."""
    s, b, h, a = model.seq, model.microbatch, model.hidden, model.heads
    if recompute:
        return 2 * s * b * h
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))


def memory_per_gpu(model, mesh, hardware=A100, recompute=True, zero_stage=0):
    """Bytes on pipeline stage 0's GPUs (the busiest under 1F1B).

    Returns:
        ``{"params", "grads", "optimizer", "activations", "total", "fits", "in_flight"}``:
        byte counts, whether ``total <= hardware.memory`` and the microbatches held.
    """
    dp, tp, pp = _check(model, mesh, "memory_per_gpu")
    state = zero_memory_breakdown(stage_parameters(model, mesh, 0), dp, zero_stage)
    in_flight = min(pp, microbatches(model, mesh))
    layers = model.layers // pp
    acts = layers * in_flight * activation_bytes_per_layer(model, tp, recompute)
    if recompute:  # the layer being recomputed holds its full activations for a moment
        acts += activation_bytes_per_layer(model, tp, False)
    out = {"params": state["params"], "grads": state["grads"], "optimizer": state["optimizer"],
           "activations": acts, "in_flight": in_flight}
    out["total"] = state["total"] + acts
    out["fits"] = out["total"] <= hardware.memory
    return out


def elementwise_bytes(model, tp):
    """HBM bytes the memory-bound work of one layer moves per microbatch, forward only (fp16):
    two layer norms (read + write ``s b h`` each), two bias-dropout-residual adds (read two
    ``s b h``, write one, a 1-byte mask), the bias-GeLU on ``4 s b h / tp`` (read + write),
    and on the ``a s^2 b / tp`` attention scores a scale-mask-softmax (read + write) and a
    dropout (read + write + mask)."""
    s, b, h, a = model.seq, model.microbatch, model.hidden, model.heads
    sbh, scores = s * b * h, a * s * s * b / tp
    return 2 * (2 * 2 * sbh + 2 * 3 * sbh + 2 * 4 * sbh / tp + 4 * scores) + 2 * sbh + scores


def _route(topo, ranks):
    """``(alpha, beta)`` of a ring over ``ranks``: the slowest hop's route."""
    alpha = beta = 0.0
    for a, b in zip(ranks, ranks[1:] + ranks[:1]):
        if a != b:
            ra, rb = topo.route_cost(topo.route(a, b))
            alpha, beta = max(alpha, ra), max(beta, rb)
    return alpha, beta


def _allreduce(topo, ranks, nbytes):
    if len(ranks) < 2:
        return 0.0
    alpha, beta = _route(topo, ranks)
    return collective_time("allreduce", "ring", len(ranks), nbytes, alpha, beta)


def step_time(model, mesh, hardware=A100, recompute=True, comm=True, bubble=True,
              elementwise=True, zero_stage=0):
    """Seconds of one training step and where they go (module docstring).

    Returns:
        a dict: ``step``, ``compute`` (GEMMs and element-wise work of the slowest stage),
        ``tp`` (its TP all-reduces), ``pp`` (its point-to-point), ``bubble``, ``dp`` (the
        gradient all-reduce), ``optimizer`` (the Adam step), ``microbatches``,
        ``bubble_fraction`` ``(pp - 1) / m``, and ``flops`` (the formula's, the whole step).
    """
    dp, tp, pp = _check(model, mesh, "step_time")
    topo = hardware.topology(mesh.size)
    m = microbatches(model, mesh)
    s, b, h, l = model.seq, model.microbatch, model.hidden, model.layers // pp
    rate = hardware.peak_flops * hardware.gemm_efficiency
    passes = 4 if recompute else 3  # forward (+ recomputed forward) + backward = 2 x forward
    layer_flops = passes * 24 * s * b * h * h * (1 + s / (6 * h)) / tp  # per layer, per mb
    logits = 6 * s * b * h * model.vocab / tp
    per_mb_compute = (l * layer_flops + logits) / rate
    if elementwise:
        per_mb_compute += l * passes * elementwise_bytes(model, tp) / hardware.hbm_bandwidth
    last = mesh.rank(pp=pp - 1)
    per_mb_tp = per_mb_pp = dp_time = 0.0
    if comm:
        reduces = 6 if recompute else 4
        per_mb_tp = l * reduces * _allreduce(topo, mesh.group(last, "tp"), 2 * s * b * h)
        if pp > 1:
            alpha, beta = _route(topo, mesh.group(last, "pp"))
            per_mb_pp = 2 * (alpha + 2 * s * b * h / tp * beta)
        grads = 2 * stage_parameters(model, mesh, 0)
        dp_time = _allreduce(topo, mesh.group(0, "dp"), grads)
    optimizer = 0.0
    if elementwise:
        sharded = zero_memory_breakdown(stage_parameters(model, mesh, 0), dp, zero_stage)
        optimizer = ADAM_BYTES * sharded["optimizer"] / 12 / hardware.hbm_bandwidth
    slot = per_mb_compute + per_mb_tp + per_mb_pp
    bubble_time = (pp - 1) * slot if bubble else 0.0
    total = m * slot + bubble_time + dp_time + optimizer
    return {"step": total, "compute": m * per_mb_compute, "tp": m * per_mb_tp,
            "pp": m * per_mb_pp, "bubble": bubble_time, "dp": dp_time,
            "optimizer": optimizer, "microbatches": m,
            "bubble_fraction": (pp - 1) / m, "flops": training_flops(model, recompute)}


@dataclass
class Plan:
    """:func:`plan`'s answer: the mesh, memory (bytes), time (seconds), ``tflops_per_gpu``
    (the formula's FLOPs / step time / GPUs, as the paper reports) and ``fits``."""

    mesh: DeviceMesh
    memory: dict
    time: dict
    tflops_per_gpu: float
    fits: bool

    def __repr__(self):
        m = self.mesh.shape
        return (f"Plan(dp={m['dp']}, tp={m['tp']}, pp={m['pp']}: "
                f"{self.memory['total'] / GB:.1f} GB/GPU{'' if self.fits else ' (does not fit)'}"
                f", {self.time['step']:.2f} s/step, {self.tflops_per_gpu:.0f} TFLOP/s/GPU)")


def plan(model, dp=1, tp=1, pp=1, hardware=A100, recompute=True, zero_stage=0, **switches):
    """Memory and step time of ``model`` on a ``dp x tp x pp`` :class:`DeviceMesh`
    (``switches``: :func:`step_time`'s ``comm``, ``bubble``, ``elementwise``)."""
    mesh = DeviceMesh(dp=dp, tp=tp, pp=pp)
    memory = memory_per_gpu(model, mesh, hardware, recompute, zero_stage)
    time = step_time(model, mesh, hardware, recompute, zero_stage=zero_stage, **switches)
    tflops = training_flops(model, recompute) / time["step"] / mesh.size / 1e12
    return Plan(mesh, memory, time, tflops, memory["fits"])
