"""Pipeline parallelism: GPipe and 1F1B schedules, their checks, timing, memory and execution.

A model is cut into ``p`` stages, one per device, and a batch into ``m`` micro-batches. A
*schedule* says, for each stage, the order of its operations: ``("F", j)`` runs the forward of
micro-batch ``j`` on that stage, ``("B", j)`` its backward. Stage ``s`` can run ``("F", j)`` only
after stage ``s - 1`` did, and ``("B", j)`` only after stage ``s + 1`` did (the last stage after
its own forward). :func:`run_pipeline` executes a schedule on the simulator with real arrays.
"""

import copy
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np

from ...engine.autodiff import tape_order
from ...engine.tensor import Tensor, no_grad
from ...errors import ArgumentError, DTypeError, UnknownNameError
from ...nn.layers import Sequential
from ...span import Span
from .. import sim

FORWARD, BACKWARD = "F", "B"


def _check_counts(p, m, owner):
    for name, n in (("p (stages)", p), ("m (micro-batches)", m)):
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)):
            raise DTypeError(f"{owner}: {name} must be an int, got {n!r}")
        if n < 1:
            raise ArgumentError(f"{owner}: {name} must be >= 1, got {n}")


# --- schedules ----------------------------------------------------------------------------------
def gpipe_schedule(p, m):
    """GPipe: every stage runs all ``m`` forwards, then all ``m`` backwards (in reverse order).

    Returns:
        A list of ``p`` lists of ``(kind, micro_batch)`` operations.
    """
    _check_counts(p, m, "gpipe_schedule")
    ops = [(FORWARD, j) for j in range(m)] + [(BACKWARD, j) for j in reversed(range(m))]
    return [list(ops) for _ in range(p)]


def one_f_one_b_schedule(p, m):
    """1F1B (PipeDream-flush): stage ``s`` runs ``min(p - s - 1, m)`` warm-up forwards, then
    alternates one forward and one backward, then drains the remaining backwards. At most
    ``min(p - s, m)`` micro-batches are in flight on stage ``s``, against ``m`` under GPipe.
    """
    _check_counts(p, m, "one_f_one_b_schedule")
    schedule = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        ops = [(FORWARD, j) for j in range(warmup)]
        for i in range(m - warmup):
            ops += [(FORWARD, warmup + i), (BACKWARD, i)]
        ops += [(BACKWARD, j) for j in range(m - warmup, m)]
        schedule.append(ops)
    return schedule


SCHEDULES = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}


def make_schedule(name, p, m):
    """``gpipe_schedule`` or ``one_f_one_b_schedule`` by name ("gpipe" / "1f1b")."""
    if name not in SCHEDULES:
        raise UnknownNameError(f"make_schedule: unknown schedule {name!r} (known: "
                               f"{', '.join(SCHEDULES)})")
    return SCHEDULES[name](p, m)


def dependencies(p, stage, op):
    """The ``(stage, op)`` pairs that must finish before ``op`` may start on ``stage``."""
    kind, j = op
    if kind == FORWARD:
        return [(stage - 1, (FORWARD, j))] if stage > 0 else []
    deps = [(stage, (FORWARD, j))]
    if stage < p - 1:
        deps.append((stage + 1, (BACKWARD, j)))
    return deps


# --- timing -------------------------------------------------------------------------------------
def op_span(stage, op, start, end):
    """The :class:`~mlsys_lab.span.Span` of ``op`` (``("F", j)`` or ``("B", j)``) on ``stage``:
    lane ``"stage s"``, name ``"F3"``, kind ``"F"`` or ``"B"``; details ``stage`` and
    ``micro_batch`` (also ``span.stage``, ``span.micro_batch``)."""
    kind, j = op
    return Span(f"stage {stage}", f"{kind}{j}", start, end, kind,
                {"stage": stage, "micro_batch": j})


def span_op(span):
    """``(stage, (kind, micro_batch))`` of a span made by :func:`op_span`."""
    return span.stage, (span.kind, span.micro_batch)


class Timeline(list):
    """When each operation ran: one :class:`~mlsys_lab.span.Span` per ``(stage, op)``
    (:func:`op_span`), for ``p`` stages and ``m`` micro-batches, with the schedule's numbers."""

    def __init__(self, p, m, spans=()):
        super().__init__(spans)
        self.p, self.m = p, m

    def by_op(self):
        """``{(stage, (kind, micro_batch)): Span}``."""
        return {span_op(span): span for span in self}

    @property
    def makespan(self):
        return max(span.end for span in self) if self else 0.0

    def busy(self, stage):
        """Total time ``stage`` spent computing."""
        return sum(span.end - span.start for span in self if span.stage == stage)

    def bubble_fraction(self):
        """Idle share of the ``p x makespan`` device-time: 1 - sum(busy) / (p * makespan)."""
        total = self.p * self.makespan
        return 1.0 - sum(self.busy(s) for s in range(self.p)) / total if total else 0.0

    def stage_ops(self, stage):
        """``(start, end, op)`` of one stage, in time order."""
        return sorted((span.start, span.end, span_op(span)[1]) for span in self
                      if span.stage == stage)


def bubble_fraction_standard(p, m):
    """The standard result for equal stage times: (p - 1) / (m + p - 1)."""
    _check_counts(p, m, "bubble_fraction_standard")
    return (p - 1) / (m + p - 1)


def _per_stage(value, p, name):
    values = np.broadcast_to(np.asarray(value, dtype=float), (p,))
    if np.any(values < 0) or not np.all(np.isfinite(values)):
        raise ArgumentError(f"simulate_schedule: {name} must be finite and >= 0, got {value!r}")
    return [float(v) for v in values]


def simulate_schedule(schedule, t_forward=1.0, t_backward=2.0, t_comm=0.0, recompute=False):
    """Time a schedule: each stage runs its operations in order, each as soon as the stage is
    free and its dependencies have finished (plus ``t_comm`` when they ran on another stage).

    Args:
        schedule: per-stage operation lists (from a schedule generator).
        t_forward, t_backward: seconds per micro-batch, one number or one per stage.
        t_comm: seconds to pass an activation or gradient to the neighbouring stage.
        recompute: each backward first re-runs its forward (adds ``t_forward``).

    Returns:
        A :class:`Timeline`.

    Raises:
        ArgumentError: the schedule deadlocks (names each stage's stuck operation).
    """
    p = len(schedule)
    m = sum(1 for kind, _ in schedule[0] if kind == FORWARD) if p else 0
    tf, tb = _per_stage(t_forward, p, "t_forward"), _per_stage(t_backward, p, "t_backward")
    duration = {FORWARD: tf, BACKWARD: [b + (f if recompute else 0.0) for f, b in zip(tf, tb)]}
    done, nxt, free = {}, [0] * p, [0.0] * p
    remaining = sum(len(ops) for ops in schedule)
    while remaining:
        progressed = False
        for s, ops in enumerate(schedule):
            while nxt[s] < len(ops):
                op = ops[nxt[s]]
                deps = dependencies(p, s, op)
                if any(d not in done for d in deps):
                    break
                ready = max([free[s]] + [done[d].end + (t_comm if d[0] != s else 0.0)
                                         for d in deps])
                done[(s, op)] = op_span(s, op, ready, ready + duration[op[0]][s])
                free[s], nxt[s], remaining = done[(s, op)].end, nxt[s] + 1, remaining - 1
                progressed = True
        if not progressed:
            stuck = {s: ops[nxt[s]] for s, ops in enumerate(schedule) if nxt[s] < len(ops)}
            raise ArgumentError(f"simulate_schedule: the schedule deadlocks; each stage waits "
                                f"on its next operation: {stuck}")
    return Timeline(p, m, done.values())


# --- validation ---------------------------------------------------------------------------------
def schedule_problems(schedule, p, m, timeline=None):
    """Everything wrong with a schedule (an empty list when it is valid).

    Checks that there are ``p`` stages, each running ``("F", j)`` and ``("B", j)`` exactly once
    for every micro-batch ``j < m``, each forward before its backward, and that the orders
    can run without deadlock. With a ``timeline`` (e.g. measured on the simulator) also checks
    that no stage runs two operations at once and every operation starts after its
    dependencies end.
    """
    problems = []
    if len(schedule) != p:
        return [f"expected {p} stages, got {len(schedule)}"]
    want = sorted((k, j) for k in (FORWARD, BACKWARD) for j in range(m))
    for s, ops in enumerate(schedule):
        if sorted(tuple(op) for op in ops) != want:
            problems.append(f"stage {s} does not run F and B of each of the {m} micro-batches "
                            f"exactly once: {ops}")
            continue
        position = {tuple(op): i for i, op in enumerate(ops)}
        late = [j for j in range(m) if position[(BACKWARD, j)] < position[(FORWARD, j)]]
        if late:
            problems.append(f"stage {s} runs the backward of micro-batches {late} before "
                            f"their forward")
    if problems:
        return problems
    try:
        simulate_schedule(schedule)
    except ArgumentError as e:
        problems.append(str(e))
    if timeline is not None:
        problems += _timeline_problems(schedule, p, timeline)
    return problems


def _timeline_problems(schedule, p, timeline, eps=1e-12):
    problems, spans_of = [], timeline.by_op()
    for s in range(p):
        spans = timeline.stage_ops(s)
        for (_, e0, op0), (s1, _, op1) in zip(spans, spans[1:]):
            if s1 < e0 - eps:
                problems.append(f"stage {s} runs {op1} at {s1:g} while {op0} runs until {e0:g}")
        for op in schedule[s]:
            start = spans_of[(s, tuple(op))].start
            for d in dependencies(p, s, tuple(op)):
                if start < spans_of[d].end - eps:
                    problems.append(f"stage {s} starts {op} at {start:g} before its dependency "
                                    f"{d} ends at {spans_of[d].end:g}")
    return problems


def validate_schedule(schedule, p, m, timeline=None):
    """Raise ArgumentError listing :func:`schedule_problems` if there are any."""
    problems = schedule_problems(schedule, p, m, timeline)
    if problems:
        raise ArgumentError("invalid pipeline schedule:\n  " + "\n  ".join(problems))


# --- memory -------------------------------------------------------------------------------------
def in_flight_peak(schedule):
    """Per stage, the most micro-batches whose forward ran and backward has not yet run."""
    peaks = []
    for ops in schedule:
        live = peak = 0
        for kind, _ in ops:
            live += 1 if kind == FORWARD else -1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def activation_memory(schedule, activation_bytes, input_bytes=None, recompute=False):
    """Peak bytes of stashed activations per stage.

    Without recomputation a stage keeps all ``activation_bytes`` of every in-flight
    micro-batch. With it, only the stage's input (``input_bytes``) is kept, and one micro-batch's
    activations are rebuilt during each backward.

    Args:
        activation_bytes: bytes of activations one micro-batch leaves on a stage (number or
            one per stage).
        input_bytes: bytes of one micro-batch's input to a stage (needed with ``recompute``).
    """
    p = len(schedule)
    act = np.broadcast_to(np.asarray(activation_bytes, dtype=float), (p,))
    peaks = np.asarray(in_flight_peak(schedule), dtype=float)
    if not recompute:
        return [float(v) for v in peaks * act]
    if input_bytes is None:
        raise ArgumentError("activation_memory: recompute=True needs input_bytes")
    inp = np.broadcast_to(np.asarray(input_bytes, dtype=float), (p,))
    return [float(v) for v in peaks * inp + act]


# --- execution on the simulator -----------------------------------------------------------------
def split_sequential(model, p):
    """Cut an ``ml.nn.Sequential`` into ``p`` consecutive stages (Sequentials sharing the
    layers) with about equal parameter counts (layers without parameters join the stage of
    the layer before them)."""
    layers = list(model)
    if not 1 <= p <= len(layers):
        raise ArgumentError(f"split_sequential: cannot cut {len(layers)} layers into {p} stages")
    weights = np.array([max(sum(q.size for q in layer.parameters()), 0) for layer in layers])
    cum = np.cumsum(weights) / max(weights.sum(), 1)
    cuts = [0]
    for s in range(1, p):
        i = int(np.searchsorted(cum, s / p, side="left")) + 1
        while i < len(layers) and not layers[i].parameters():
            i += 1  # an activation stays with its layer
        cuts.append(min(max(i, cuts[-1] + 1), len(layers) - (p - s)))
    cuts.append(len(layers))
    return [Sequential(*layers[a:b]) for a, b in zip(cuts, cuts[1:])]


def _tape_bytes(out):
    """Bytes of every intermediate the backward pass of ``out`` keeps alive."""
    return int(sum(t.data.nbytes for t in tape_order([out]) if t.data is not None))


@dataclass
class _StageMemory:
    live: int = 0
    peak_live: int = 0
    stash_bytes: int = 0
    peak_bytes: int = 0

    def push(self, nbytes):
        self.live, self.stash_bytes = self.live + 1, self.stash_bytes + nbytes
        self.peak_live = max(self.peak_live, self.live)
        self.peak_bytes = max(self.peak_bytes, self.stash_bytes)

    def pop(self, nbytes, transient=0):
        self.peak_bytes = max(self.peak_bytes, self.stash_bytes + transient)
        self.live, self.stash_bytes = self.live - 1, self.stash_bytes - nbytes


def _stage_output(stage, cfg, j, x, last):
    out = stage(x)
    return cfg["loss_fn"](out, cfg["targets"][j]) * cfg["weights"][j] if last else out


def _forward(comm, stage, cfg, j, inputs, stash, memory):
    s, p = comm.rank, comm.size
    a = inputs[j] if s == 0 else (yield comm.recv(s - 1, tag=2 * j))
    x = Tensor(a, requires_grad=s > 0)
    with no_grad() if cfg["recompute"] else nullcontext():
        out = _stage_output(stage, cfg, j, x, s == p - 1)
    if cfg["recompute"]:
        stash[j] = (a, None, None)
        memory.push(a.nbytes)
    else:
        stash[j] = (a, x, out)
        memory.push(_tape_bytes(out) + a.nbytes)
    yield comm.compute(flops=cfg["flops"][s] * len(a))
    if s == p - 1:
        cfg["losses"][j] = float(out.numpy()) / cfg["weights"][j]
    else:
        yield comm.send(out.numpy(), s + 1, tag=2 * j)


def _backward(comm, stage, cfg, j, stash, memory):
    s, p = comm.rank, comm.size
    a, x, out = stash.pop(j)
    flops = 2 * cfg["flops"][s] * len(a)
    transient = 0
    if cfg["recompute"]:
        x = Tensor(a, requires_grad=s > 0)
        out = _stage_output(stage, cfg, j, x, s == p - 1)
        transient = _tape_bytes(out)
        flops += cfg["flops"][s] * len(a)
    if s == p - 1:
        out.backward()
    else:
        g = yield comm.recv(s + 1, tag=2 * j + 1)
        out.backward(Tensor(g))
    memory.pop(a.nbytes + (0 if cfg["recompute"] else _tape_bytes(out)), transient)
    yield comm.compute(flops=flops)
    if s > 0:
        yield comm.send(x.grad.numpy(), s - 1, tag=2 * j + 1)


def _stage_program(comm, stage, schedule, batches, cfg, make_optimizer):
    stage.zero_grad()
    optimizer = make_optimizer(stage.parameters()) if make_optimizer else None
    memory, losses = _StageMemory(), []
    for x, y in batches:
        m = len(schedule[0]) // 2
        inputs = np.array_split(x, m)
        step_cfg = dict(cfg, targets=np.array_split(y, m), losses=[0.0] * m,
                        weights=[len(b) / len(x) for b in inputs])
        stash = {}
        stage.zero_grad()
        for kind, j in schedule[comm.rank]:
            if kind == FORWARD:
                yield from _forward(comm, stage, step_cfg, j, inputs, stash, memory)
            else:
                yield from _backward(comm, stage, step_cfg, j, stash, memory)
        if optimizer is not None:
            optimizer.step()
        losses.append(sum(w * v for w, v in zip(step_cfg["weights"], step_cfg["losses"])))
    return {"state": stage.state_dict(), "memory": memory, "losses": losses}


@dataclass
class PipelineRun:
    """What :func:`run_pipeline` measured.

    Attributes:
        states: each stage's final ``state_dict``. losses: loss per batch (last stage).
        time: simulated makespan. timeline: the compute spans per stage, as a
        :class:`Timeline` of :func:`op_span` spans (the simulator's compute spans, matched to
        the schedule's operations). bubble: its bubble fraction.
        peak_in_flight: most micro-batches stashed per stage. peak_activation_bytes: most
        bytes of stashed activations per stage (measured from the autodiff tape).
    """

    states: list
    losses: list
    time: float
    timeline: Timeline
    bubble: float
    peak_in_flight: list
    peak_activation_bytes: list
    result: object = field(repr=False, default=None)


def _timeline_from_trace(trace, schedule, steps):
    """The schedule's ops, in order, matched to each rank's compute spans of the trace."""
    p, m = len(schedule), len(schedule[0]) // 2
    timeline = Timeline(p, m * steps)
    per_rank = [[e for e in trace if e.rank == s and e.kind == "compute"] for s in range(p)]
    for s, computes in enumerate(per_rank):
        ops = [(kind, step * m + j) for step in range(steps) for kind, j in schedule[s]]
        timeline += [op_span(s, op, e.start, e.end) for op, e in zip(ops, computes)]
    return timeline


def run_pipeline(model, batches, loss_fn, cluster, *, schedule="1f1b", micro_batches=4,
                 make_optimizer=None, recompute=False, flops_per_sample=None):
    """Train ``model`` (an ``ml.nn.Sequential``) pipelined over the ranks of ``cluster``.

    Stage ``s`` (rank ``s``) runs its layers; activations go to stage ``s + 1`` and their
    gradients come back as real arrays. Each batch is cut into ``micro_batches`` pieces whose
    gradients accumulate (each loss weighted by its share of the batch) before one optimiser
    step per stage, so the parameters equal full-batch training on one device.

    Args:
        model: the Sequential to split (:func:`split_sequential`); it is not changed.
        batches: ``[(x, y)]``, one per training step.
        loss_fn: ``(prediction Tensor, target array) -> scalar mean loss``.
        schedule: "gpipe", "1f1b", or per-stage operation lists.
        recompute: keep only each stage's input per micro-batch and re-run the forward
            inside the backward (activation checkpointing).
        flops_per_sample: per-stage forward FLOPs per sample (default 2 x the stage's
            parameters; the backward costs twice the forward).

    Returns:
        A :class:`PipelineRun`.
    """
    p = cluster.size
    stages = split_sequential(copy.deepcopy(model), p)
    sched = make_schedule(schedule, p, micro_batches) if isinstance(schedule, str) else schedule
    m = len(sched[0]) // 2
    validate_schedule(sched, p, m)
    short = [t for t, (x, _) in enumerate(batches) if len(x) < m]
    if short:
        raise ArgumentError(f"run_pipeline: batches {short} have fewer samples than the {m} "
                            f"micro-batches")
    flops = flops_per_sample or [2.0 * st.num_parameters() for st in stages]
    cfg = {"loss_fn": loss_fn, "recompute": bool(recompute), "flops": list(flops)}
    args = [(stages[s], sched, batches, cfg, make_optimizer) for s in range(p)]
    res = sim.run(cluster, _stage_program, args=args)
    outs = res.results
    timeline = _timeline_from_trace(res.trace, sched, len(batches))
    return PipelineRun([o["state"] for o in outs], outs[-1]["losses"], res.time, timeline,
                       timeline.bubble_fraction(), [o["memory"].peak_live for o in outs],
                       [o["memory"].peak_bytes for o in outs], res)
