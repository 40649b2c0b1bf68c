"""FSDP (ZeRO stage 3): parameters, gradients and optimiser state sharded per layer.

A model is cut into *units* (PyTorch FSDP's wrapped modules; here each child of an
``ml.nn.Sequential`` that has parameters, together with the parameterless children after it:
``Linear, Tanh`` is one unit). Each unit's parameters are flattened into one vector, padded
with zeros to a multiple of the number of ranks N, and rank r keeps block r of it: a *flat
shard* (a :class:`~mlsys_lab.nn.module.Parameter` the optimiser updates, so the Adam or SGD
state is sharded per unit too). Per step (Zhao et al. 2023, Rajbhandari et al. 2020):

* forward, unit by unit: all-gather the unit's shards into its full parameters, run the unit on
  this rank's slice of the batch, free the gathered parameters;
* backward, last unit first: all-gather again, run the unit's backward (the tape reads the
  parameters when it runs, so a missed gather is an error, not a silent zero), free them,
  reduce-scatter the unit's gradient so each rank keeps the sum of its block;
* the optimiser steps on the shards.

With ``prefetch=True`` the next unit's all-gather is issued *before* this unit computes, on a
communication stream (``comm.start`` over a ``dup``, as data parallelism's overlapped
buckets), so it runs while this unit computes; the reduce-scatters go on the same stream. The
order is :func:`fsdp_schedule`'s, and what stays exposed is, slot by slot,
``max(0, communication - compute)`` (:func:`schedule_slots`, :func:`exposed_communication`).
Without prefetch every collective waits in the open.

Memory: between steps a rank holds its shards of parameters, gradients and optimiser state,
``(w + g + K) P' / N`` bytes for the padded parameter count ``P'`` -- the ZeRO-3 formula
(:func:`.zero.zero_memory_per_device`), exactly when every unit's size divides by N; during a
step at most two units' gathered parameters (this one and the prefetched next) and one unit's
full gradient come on top. :class:`FSDPRun` reports both, measured from the arrays each rank
held: a gathered unit counts from its gather's issue to its free, a unit's full (flat) gradient
from the backward to the first wait that proves its reduce-scatter done (the stream is FIFO),
so with prefetch two units' gradients may be counted at once.

The same rank program (:func:`fsdp_program`) runs on the simulator (:func:`fsdp_train`) and over
MPI (:func:`fsdp_train_mpi`, under ``mpiexec``); ``zero.zero_train(stage=3)`` is this.
"""

import copy
from dataclasses import dataclass, field

import numpy as np

from ...engine.tensor import Tensor
from ...errors import ArgumentError, DTypeError, ShapeError
from ...nn.module import Parameter
from ...span import Span
from .. import sim
from ..collectives import allgather, reduce_scatter

__all__ = ["FSDPRun", "UnitLayout", "exposed_communication", "fsdp_program", "fsdp_schedule",
           "fsdp_train", "fsdp_train_mpi", "fsdp_units", "schedule_slots", "unit_layouts"]


# --- units and their flat shards ------------------------------------------------------------
def fsdp_units(model):
    """The units FSDP gathers one at a time: lists of modules applied in order.

    For an ``ml.nn.Sequential``, each child with parameters starts a unit and the
    parameterless children after it (activations, dropout) join it (leading parameterless
    children join the first unit). Any other module is one unit: the whole model gathered at
    once.
    """
    if type(model).__name__ == "Sequential":
        children = list(model.children())
    else:
        children = [model]
    units, pending = [], []
    for child in children:
        if child.parameters():
            units.append(pending + [child])
            pending = []
        elif units:
            units[-1].append(child)
        else:
            pending.append(child)
    seen = {}
    for i, unit in enumerate(units):
        for p in _unit_params(unit):
            if id(p) in seen and seen[id(p)] != i:
                raise ArgumentError(f"fsdp: a parameter of shape {p.shape} is shared by units "
                                    f"{seen[id(p)]} and {i}; FSDP shards each unit's own "
                                    f"parameters (tie weights inside one unit)")
            seen[id(p)] = i
    if not seen:
        raise ArgumentError(f"fsdp: {type(model).__name__} has no parameters to shard")
    return units


def _unit_params(unit):
    out, seen = [], set()
    for m in unit:
        for p in m.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


@dataclass(frozen=True)
class UnitLayout:
    """One unit's flat layout on N ranks: ``size`` parameters, padded to ``padded`` (a multiple
    of N), ``shard = padded / N`` per rank, in ``dtype``."""

    size: int
    padded: int
    shard: int
    dtype: np.dtype

    @property
    def shard_bytes(self):
        """Bytes of one rank's shard."""
        return self.shard * np.dtype(self.dtype).itemsize

    @property
    def full_bytes(self):
        """Bytes of the gathered (padded) unit."""
        return self.padded * np.dtype(self.dtype).itemsize


def unit_layouts(model, num_ranks):
    """The :class:`UnitLayout` of each of ``fsdp_units(model)`` on ``num_ranks`` ranks."""
    if isinstance(num_ranks, bool) or not isinstance(num_ranks, (int, np.integer)) \
            or num_ranks < 1:
        raise ArgumentError(f"unit_layouts: num_ranks must be an int >= 1, got {num_ranks!r}")
    out = []
    for i, unit in enumerate(fsdp_units(model)):
        params = _unit_params(unit)
        dtypes = {p.data.dtype for p in params}
        if len(dtypes) > 1:
            raise DTypeError(f"fsdp: unit {i} mixes parameter dtypes {sorted(map(str, dtypes))}; "
                             f"a flat shard has one dtype (cast the unit's parameters)")
        size = sum(p.size for p in params)
        padded = -(-size // num_ranks) * num_ranks
        out.append(UnitLayout(size, padded, padded // num_ranks, dtypes.pop()))
    return out


def _flat(arrays, padded, dtype):
    out = np.zeros(padded, dtype)
    offset = 0
    for a in arrays:
        out[offset:offset + a.size] = a.reshape(-1)
        offset += a.size
    return out


def _assign_views(params, flat):
    """Point each parameter at its slice of the gathered flat buffer (views, no copies)."""
    offset = 0
    for p, shape, n in params:
        p.data = flat[offset:offset + n].reshape(shape)
        offset += n


# --- the schedule ----------------------------------------------------------------------------
def fsdp_schedule(num_units, prefetch=True):
    """The order of one FSDP step, as ``(action, unit)`` pairs.

    Actions: ``"gather"`` issues unit's all-gather on the communication stream; ``"wait"``
    waits for it; ``"forward"`` / ``"backward"`` compute the unit; ``"free"`` drops its
    gathered parameters; ``"reduce_scatter"`` issues the reduce-scatter of its gradient on the
    stream; ``("loss", None)``, ``("sync", None)`` (wait for the stream to drain) and
    ``("step", None)`` (the optimiser on the shards). With ``prefetch`` the next unit's
    gather is issued right after this unit's wait, before its compute; without, right before
    its own wait. Backward visits the units last to first.
    """
    if isinstance(num_units, bool) or not isinstance(num_units, (int, np.integer)) \
            or num_units < 1:
        raise ArgumentError(f"fsdp_schedule: num_units must be an int >= 1, got {num_units!r}")
    ops = []

    def phase(order, compute):
        if prefetch:
            ops.append(("gather", order[0]))
        for i, u in enumerate(order):
            if not prefetch:
                ops.append(("gather", u))
            ops.append(("wait", u))
            if prefetch and i + 1 < len(order):
                ops.append(("gather", order[i + 1]))
            ops.extend([(compute, u), ("free", u)])
            if compute == "backward":
                ops.append(("reduce_scatter", u))

    phase(list(range(num_units)), "forward")
    ops.append(("loss", None))
    phase(list(reversed(range(num_units))), "backward")
    ops.extend([("sync", None), ("step", None)])
    return ops


def schedule_slots(ops, comm_seconds, compute_seconds):
    """Cut a schedule into *slots* of communication and the compute that may hide it.

    The stream is FIFO, so a wait needs every item issued before the one it awaits. A slot is
    a group of those items issued at one point of the schedule, with the computes from there
    to the next group or the wait: those alone can hide it (without prefetch, nothing is
    hidden). ``max(0, communication - compute)`` per slot is what stays exposed, exactly as
    long as a slot's communication never spills past the next group of the same wait (true of
    :func:`fsdp_schedule` unless the last reduce-scatters outlast the first unit's backward).

    Args:
        ops: :func:`fsdp_schedule`'s list.
        comm_seconds: ``(action, unit) -> seconds`` of a gather or reduce-scatter alone, or a
            list of seconds, one per gather and reduce-scatter in schedule order.
        compute_seconds: ``(action, unit) -> seconds`` of a forward or backward, or a list,
            one per forward and backward in schedule order.

    Returns:
        A list of ``(communication seconds, compute seconds)``, one per slot.
    """
    comm_of, compute_of = _durations(comm_seconds), _durations(compute_seconds)
    queue, computes, done, since = [], [], 0, 0  # queue: (item, seconds, computes before it)
    slots = []
    for action, unit in ops:
        if action in ("gather", "reduce_scatter"):
            queue.append(((action, unit), comm_of(action, unit), len(computes)))
        elif action in ("forward", "backward"):
            computes.append(compute_of(action, unit))
        elif action in ("wait", "sync"):
            upto = len(queue) if action == "sync" else \
                max(i for i, (item, *_) in enumerate(queue) if item == ("gather", unit)) + 1
            items = queue[done:upto]
            starts = sorted({max(since, k) for *_, k in items})
            for i, k in enumerate(starts):  # one slot per point of issue
                end = starts[i + 1] if i + 1 < len(starts) else len(computes)
                comm = sum(t for _, t, k2 in items if max(since, k2) == k)
                slots.append((comm, sum(computes[k:end])))
            done, since = max(done, upto), len(computes)
    if len(computes) > since:
        slots.append((0.0, sum(computes[since:])))
    return slots


def _durations(given):
    if callable(given):
        return given
    it = iter(list(given))
    return lambda action, unit: next(it)


def exposed_communication(slots):
    """``sum(max(0, communication - compute))`` over :func:`schedule_slots`' slots: the
    communication a perfectly overlapped schedule leaves exposed."""
    return float(sum(max(0.0, c - k) for c, k in slots))


# --- the rank program ------------------------------------------------------------------------
class _Memory:
    """What a rank holds, measured from its arrays at each point of the schedule."""

    def __init__(self, shards, optimizer):
        self.shards, self.optimizer = shards, optimizer
        self.gathered, self.grads = {}, {}   # unit -> bytes; stream item -> flat gradient
        self.peak = {"gathered": 0, "unsharded_grads": 0, "total": 0}

    def held(self):
        params = sum(s.data.nbytes for s in self.shards)
        grads = sum(s.grad.numpy().nbytes for s in self.shards if s.grad is not None)
        opt = sum(a.nbytes for st in self.optimizer.state for a in st.values())
        return {"params": params, "grads": grads, "optimizer": opt,
                "total": params + grads + opt}

    def sample(self):
        gathered = sum(self.gathered.values())
        grads = sum(g.nbytes for g in self.grads.values())
        total = self.held()["total"] + gathered + grads
        for key, v in (("gathered", gathered), ("unsharded_grads", grads), ("total", total)):
            self.peak[key] = max(self.peak[key], v)


def _collective_task(stream, kind, unit, array, algo, previous, record):
    """Background: wait for the stream's previous item, then run one collective."""
    if previous is not None:
        yield stream.wait(previous)
    t0 = stream.now()
    if kind == "gather":
        out = yield from allgather(stream, array, algo=algo)
    else:
        out = yield from reduce_scatter(stream, array, algo=algo)
    record.append((kind, unit, t0, stream.now()))
    return out


def _check_batches(batches):
    batches = list(batches)
    for t, (x, y) in enumerate(batches):
        if len(x) != len(y):
            raise ShapeError(f"fsdp: batch {t} has {len(x)} inputs but {len(y)} targets")
        if len(x) == 0:
            raise ShapeError(f"fsdp: batch {t} is empty")
    return batches


def _run_unit(unit, x):
    for m in unit:
        x = m(x)
    return x


def fsdp_program(comm, model, make_optimizer, loss_fn, batches, prefetch=True, algo="ring",
                 flops_per_sample=None):
    """The FSDP rank program (runs under ``sim.run`` or ``mpi.run``).

    Trains a copy of ``model`` on this rank's slice (``np.array_split``) of every global batch,
    following :func:`fsdp_schedule`. Compute is modelled as ``flops_per_sample`` (default
    6 x parameters) per sample, split over units by their parameter counts, a third forward
    and two thirds backward.

    Returns:
        ``{"state": final state_dict (every rank gathers it at the end), "loss_sums": this rank's
        loss x its samples per step, "held": bytes of model state held after the last step
        (``params``, ``grads``, ``optimizer``, ``total``), "peak": peak bytes during the steps
        (``gathered``, ``unsharded_grads``, ``total``), "compute": (action, unit, start, end)
        per compute, "comm": (kind, unit, start, end) per collective, "waits": seconds this
        rank waited on communication, "layouts": the units' :class:`UnitLayout`}``.
    """
    batches = _check_batches(batches)
    model = copy.deepcopy(model)
    units = fsdp_units(model)
    layouts = unit_layouts(model, comm.size)
    params = [[(p, p.shape, p.size) for p in _unit_params(u)] for u in units]
    shards = []
    for ps, lay in zip(params, layouts):
        flat = _flat([p.data for p, _, _ in ps], lay.padded, lay.dtype)
        shards.append(Parameter(flat[comm.rank * lay.shard:(comm.rank + 1) * lay.shard].copy()))
        for p, _, _ in ps:  # freed: a use before the gather fails loudly
            p.data = np.zeros(0, lay.dtype)
    optimizer = make_optimizer(shards)
    total_params = sum(lay.size for lay in layouts) or 1
    if flops_per_sample is None:
        flops_per_sample = 6.0 * total_params
    share = [lay.size / total_params for lay in layouts]
    stream = comm.dup()
    memory = _Memory(shards, optimizer)
    record, computes = [], []
    state = {"last": None, "items": [], "tasks": {}, "waits": 0.0}

    def issue(kind, u, array):
        task = yield comm.start(_collective_task(stream, kind, u, array, algo, state["last"],
                                                record))
        state["last"] = task
        state["items"].append(task)
        state["tasks"][(kind, u)] = task
        return task

    def wait_for(task):
        t0 = comm.now()
        value = yield comm.wait(task)
        state["waits"] += comm.now() - t0
        done = state["items"].index(task) + 1
        for item in state["items"][:done]:
            memory.grads.pop(id(item), None)
        return value

    loss_sums, ops = [], fsdp_schedule(len(units), prefetch)
    for x, y in batches:
        xs, ys = np.array_split(x, comm.size)[comm.rank], np.array_split(y, comm.size)[comm.rank]
        n, scale = len(xs), len(xs) / len(x)
        acts, outs, loss_sum = [None] * len(units), [None] * len(units), 0.0
        grad_out = None
        for action, u in ops:
            if action == "gather":
                yield from issue("gather", u, shards[u].data)
                memory.gathered[u] = layouts[u].full_bytes
            elif action == "wait":
                full = yield from wait_for(state["tasks"].pop(("gather", u)))
                _assign_views(params[u], full)
                memory.gathered[u] = full.nbytes
                del full  # the parameters' views are all that keep it alive
            elif action == "forward":
                inp = xs if u == 0 else outs[u - 1].numpy()
                acts[u] = Tensor(inp, requires_grad=u > 0 and n > 0)
                outs[u] = _run_unit(units[u], acts[u])
                yield from _compute(comm, computes, "forward", u,
                                    flops_per_sample * share[u] * n / 3)
            elif action == "free":
                for p, _, _ in params[u]:
                    p.data = np.zeros(0, layouts[u].dtype)
                memory.gathered.pop(u, None)
            elif action == "loss":
                pred = Tensor(outs[-1].numpy(), requires_grad=True)
                if n:
                    loss = loss_fn(pred, ys)
                    loss.backward()
                    loss_sum = float(loss.numpy()) * n
                    grad_out = pred.grad
            elif action == "backward":
                if n and grad_out is not None:
                    outs[u].backward(grad_out)
                    grad_out = acts[u].grad if u > 0 else None
                yield from _compute(comm, computes, "backward", u,
                                    flops_per_sample * share[u] * n * 2 / 3)
            elif action == "reduce_scatter":
                grads = [p.grad.numpy() if p.grad is not None else np.zeros(s, layouts[u].dtype)
                         for p, _, s in params[u]]
                flat = _flat(grads, layouts[u].padded, layouts[u].dtype) * scale
                for p, _, _ in params[u]:
                    p.grad = None
                task = yield from issue("reduce_scatter", u, flat)
                memory.grads[id(task)] = flat
                del flat, grads
            elif action == "sync":
                if state["last"] is not None:
                    yield from wait_for(state["last"])
                for v in range(len(units)):
                    value = yield comm.wait(state["tasks"].pop(("reduce_scatter", v)))
                    shards[v].grad = Tensor(value)
            elif action == "step":
                optimizer.step()
            memory.sample()
        outs = acts = None
        loss_sums.append(loss_sum)
    held, waits = memory.held(), state["waits"]
    for u in range(len(units)):  # hand back the whole model (not part of a step)
        yield from issue("gather", u, shards[u].data)
        _assign_views(params[u], (yield from wait_for(state["tasks"].pop(("gather", u)))))
    return {"state": {k: v.copy() for k, v in model.state_dict().items()},
            "loss_sums": loss_sums, "held": held, "peak": dict(memory.peak),
            "compute": computes, "comm": record[:3 * len(units) * len(batches)], "waits": waits,
            "layouts": layouts}


def _compute(comm, computes, action, unit, flops):
    t0 = comm.now()
    yield comm.compute(flops=flops)
    computes.append((action, unit, t0, comm.now()))


# --- runs --------------------------------------------------------------------------------------
@dataclass
class FSDPRun:
    """An FSDP run on the simulator.

    Attributes:
        state: rank 0's final ``state_dict`` (equal to single-device training's).
        losses: the mean training loss of each global batch.
        time: simulated seconds of the steps and the final gather. bytes_sent: all ranks.
        held: per rank, model-state bytes held between steps (``params``, ``grads``,
            ``optimizer``, ``total``: the ZeRO-3 formula for the padded parameter count).
        peak: per rank, the peak bytes during the steps (``gathered`` parameters,
            ``unsharded_grads``, ``total`` with the held state).
        layouts: each unit's :class:`UnitLayout`.
        compute: rank 0's seconds of forward and backward compute over the steps.
        exposed: rank 0's seconds waiting for communication over the steps.
        timeline: one :class:`~mlsys_lab.span.Span` per unit's forward or backward (lane
            ``"rank r"``, names ``"F3"``, ``"B3"``) and per collective (lane ``"rank r
            stream"``, ``"AG3"``, ``"RS3"``) of every rank and step; the simulator's own
            message-level trace is ``result.trace``.
        prefetch: whether the next unit's all-gather was prefetched.
    """

    state: dict
    losses: list
    time: float
    bytes_sent: int
    held: list
    peak: list
    layouts: list
    compute: float
    exposed: float
    timeline: list
    prefetch: bool
    result: object = field(repr=False, default=None)
    rank_results: list = field(repr=False, default=None)

    def slots(self, rank=0):
        """Per step, :func:`schedule_slots` of ``rank`` with the durations its collectives
        and computes took in this run."""
        out = self.rank_results[rank]
        units = len(self.layouts)
        ops = fsdp_schedule(units, self.prefetch)
        per_comm, per_compute = 3 * units, 2 * units
        steps = len(out["comm"]) // per_comm
        result = []
        for t in range(steps):
            comm = [e - s for _, _, s, e in out["comm"][t * per_comm:(t + 1) * per_comm]]
            comp = [e - s for _, _, s, e in out["compute"][t * per_compute:(t + 1) * per_compute]]
            result.append(schedule_slots(ops, comm, comp))
        return result

    def predicted_exposed(self, rank=0):
        """``sum(max(0, communication - compute))`` over the slots of every step: what a
        perfect overlap of this run's collectives with its computes leaves exposed."""
        return sum(exposed_communication(s) for s in self.slots(rank))


def _timeline(outs, units):
    spans = []
    names = {"forward": "F", "backward": "B", "gather": "AG", "reduce_scatter": "RS"}
    kinds = {"gather": "all-gather", "reduce_scatter": "reduce-scatter"}
    for rank, out in enumerate(outs):
        for i, (action, u, start, end) in enumerate(out["compute"]):
            spans.append(Span(f"rank {rank}", f"{names[action]}{u}", start, end, action,
                              {"rank": rank, "unit": u, "step": i // (2 * units)}))
        for i, (kind, u, start, end) in enumerate(out["comm"]):
            spans.append(Span(f"rank {rank} stream", f"{names[kind]}{u}", start, end,
                              kinds[kind], {"rank": rank, "unit": u, "step": i // (3 * units)}))
    return sorted(spans)


def fsdp_train(model, make_optimizer, loss_fn, batches, cluster, *, prefetch=True, algo="ring",
               flops_per_sample=None):
    """Train ``model`` with FSDP on the simulated ranks of ``cluster``.

    Args:
        model: an ``ml.nn.Module`` (units: :func:`fsdp_units`); not changed.
        make_optimizer: ``params -> optimizer``, given the flat shards (element-wise
            optimisers, SGD, Adam, RMSProp, update a shard as they would the whole).
        loss_fn: ``(prediction Tensor, target array) -> scalar Tensor``, a mean over samples.
        batches: global ``(x, y)`` batches, one per step, split over the ranks.
        cluster: a ``sim.Cluster``.
        prefetch: issue the next unit's all-gather before this unit computes.
        algo: the all-gather / reduce-scatter algorithm.
        flops_per_sample: modelled compute per sample (default 6 x parameters).

    Returns:
        An :class:`FSDPRun`.
    """
    batches = _check_batches(batches)
    args = [(model, make_optimizer, loss_fn, batches, prefetch, algo, flops_per_sample)
            for _ in range(cluster.size)]
    res = sim.run(cluster, fsdp_program, args=args)
    outs = res.results
    n_per_batch = [len(x) for x, _ in batches]
    losses = [sum(o["loss_sums"][t] for o in outs) / n for t, n in enumerate(n_per_batch)]
    units = len(outs[0]["layouts"])
    steps = 2 * units * len(batches)
    compute = sum(e - s for _, _, s, e in outs[0]["compute"][:steps])
    return FSDPRun(outs[0]["state"], losses, res.time, res.bytes, [o["held"] for o in outs],
                   [o["peak"] for o in outs], outs[0]["layouts"], compute, outs[0]["waits"],
                   _timeline(outs, units), bool(prefetch), res, outs)


def fsdp_train_mpi(model, make_optimizer, loss_fn, batches, *, prefetch=True, algo="ring",
                   flops_per_sample=None, comm=None, timeout=60.0):
    """:func:`fsdp_program` on this MPI process (run the script under ``mpiexec -n N``).

    Under MPI, ``comm.start`` runs the collective at once, so nothing overlaps and the
    values equal the simulator's bit for bit (the same collectives in the same order).

    Returns:
        This rank's :func:`fsdp_program` result.
    """
    from .. import mpi

    return mpi.run(fsdp_program, model, make_optimizer, loss_fn, list(batches), prefetch,
                   algo, flops_per_sample, comm=comm, timeout=timeout)
