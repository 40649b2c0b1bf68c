"""Faults: a device or link fails mid-run, and training restarts from the last checkpoint.

Synchronous data parallelism cannot go on without one of its ranks, so a failure stops the job;
it restarts from the last checkpoint on replacement hardware and replays the lost steps. For
the restarted run to end with exactly the parameters of a run without the failure, the
checkpoint must hold everything the future depends on: the model, the optimiser's state
(Adam's moments and step count), every random generator's state and the sampler's position.
Checkpoints are written with ``ml.save`` (``.npz``, no pickle), one file per rank.
"""

import copy
import os
from dataclasses import dataclass, field

import numpy as np

from ...data.loader.sampler import BatchSampler, RandomSampler
from ...engine.ops_nn import get_rng_state
from ...engine.ops_nn import set_rng_state as set_rng_state_of_dropout
from ...engine.tensor import Tensor, no_grad
from ...errors import ArgumentError, CheckpointError
from ...nn.checkpoint import load, save
from .. import sim
from ..comm import DeviceFailure, LinkFailure
from .data_parallel import allreduce_gradients, make_buckets, shard


# --- random generators --------------------------------------------------------------------------
def rng_state(generator):
    """A numpy Generator's state as a checkpointable dict (``ml.save`` keeps its 128-bit ints)."""
    return generator.bit_generator.state


def set_rng_state(generator, state):
    """Restore a state from :func:`rng_state` (in place).

    Raises:
        CheckpointError: the state is not one of this generator's kind.
    """
    try:
        generator.bit_generator.state = state
    except (TypeError, ValueError, KeyError) as e:
        raise CheckpointError(f"set_rng_state: cannot restore a "
                              f"{type(generator.bit_generator).__name__} from {state!r:.80}: "
                              f"{e}") from None
    return generator


def dropout_rng_state():
    """The state of the generator that ``ml.ops.manual_seed`` resets (every dropout mask)."""
    return get_rng_state()


def set_dropout_rng_state(state):
    """Restore the dropout generator (:func:`dropout_rng_state`)."""
    set_rng_state_of_dropout(state)


# --- a resumable stream of batches -------------------------------------------------------------
class BatchStream:
    """Endless batches of sample indices: ``mlsys_lab.data``'s seeded ``RandomSampler``
    grouped by a ``BatchSampler`` (``drop_last``), a new epoch started whenever one runs out.
    Its :meth:`state_dict` is the samplers' (epoch seed and position within the epoch), so a
    restored stream yields exactly the batches that followed.
    """

    def __init__(self, n, batch_size, seed=0):
        if not isinstance(n, (int, np.integer)) or not 1 <= batch_size <= n:
            raise ArgumentError(f"BatchStream: need 1 <= batch_size <= n, got batch_size="
                                f"{batch_size!r}, n={n!r}")
        self.batches = BatchSampler(RandomSampler(range(int(n)), seed=seed), batch_size,
                                    drop_last=True)
        self._iterator = None

    def next_batch(self):
        """The next batch's indices (an int64 array)."""
        for _ in range(2):
            if self._iterator is None:
                self._iterator = iter(self.batches)
            batch = next(self._iterator, None)
            if batch is not None:
                return np.asarray(batch, dtype=np.int64)
            self._iterator = None  # the epoch ran out: the next iter() starts a new one
        raise ArgumentError("BatchStream: an epoch yielded no batch")

    def state_dict(self):
        return self.batches.state_dict()

    def load_state_dict(self, state):
        self.batches.load_state_dict(state)
        self._iterator = None


# --- the training state -------------------------------------------------------------------------
def training_state(step, model, optimizer, sampler, generators):
    """Everything a restart needs, as a dict ``ml.save`` accepts: the step, the model, the
    optimiser (hyper-parameters, step count, per-parameter state such as Adam's ``m`` and
    ``v``), the sampler's position, each named generator and the dropout generator (which is
    process-wide: every simulated rank of one process shares it)."""
    return {"step": int(step), "model": dict(model.state_dict()),
            "optimizer": optimizer.state_dict(), "sampler": sampler.state_dict(),
            "rngs": {name: rng_state(g) for name, g in generators.items()},
            "dropout_rng": dropout_rng_state()}


def restore_training_state(state, model, optimizer, sampler, generators):
    """Load :func:`training_state` into live objects; returns the step to continue from."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    sampler.load_state_dict(state["sampler"])
    for name, g in generators.items():
        set_rng_state(g, state["rngs"][name])
    set_dropout_rng_state(state["dropout_rng"])
    return int(state["step"])


def checkpoint_path(folder, step, rank):
    """The checkpoint file ``rank`` writes after ``step`` in ``folder``. Each step has its own
    files, so a failure during a save never leaves a mix of old and new states."""
    return os.path.join(os.fspath(folder), f"step{step:06d}-rank{rank:04d}.npz")


# --- failure-tolerant synchronous data parallelism ----------------------------------------------
@dataclass
class FaultConfig:
    """How a run may fail and what recovery costs (all in simulated seconds).

    Attributes:
        device_failures: ``{rank: t}``: the device fails at simulated time ``t`` of the first
            attempt (``sim.run(failures=...)``).
        link_failures: ``{(u, v): t}``: the link fails at ``t`` of the first attempt.
        detect_seconds: time until the survivors' watchdog notices (a collective timeout).
        restart_seconds: time to get a replacement and relaunch every rank.
        checkpoint_seconds: time each checkpoint write costs a rank.
    """

    device_failures: dict = field(default_factory=dict)
    link_failures: dict = field(default_factory=dict)
    detect_seconds: float = 0.0
    restart_seconds: float = 0.0
    checkpoint_seconds: float = 0.0


@dataclass
class FaultRunResult:
    """A possibly interrupted run.

    Attributes:
        state: the final model ``state_dict`` (rank 0).
        curve: ``[(simulated time, step, loss on all the data)]`` of the steps that count
            (a replayed step replaces the one lost).
        total_time: simulated seconds from the first launch to the end, failures included.
        attempts: one dict per launch: ``started_from`` (checkpoint step, 0 = scratch),
            ``failed`` (the error's class name or None), ``at`` (when it failed or ended) and,
            for a failed launch, ``resume_from`` (the last complete checkpoint) and ``detail``.
        lost_steps: steps done after the last checkpoint that had to be redone.
    """

    state: dict
    curve: list
    total_time: float
    attempts: list
    lost_steps: int


def _rank_program(comm, cfg, model, make_optimizer, loss_fn, data, start_from, log):
    X, Y = data
    model = copy.deepcopy(model)
    params = model.parameters()
    optimizer = make_optimizer(params)
    sampler = BatchStream(len(X), cfg["batch_size"], seed=cfg["seed"])
    noise = {"noise": np.random.default_rng([cfg["seed"], 1 + comm.rank])}
    step = 0
    if start_from:
        state = load(checkpoint_path(cfg["folder"], start_from, comm.rank))
        step = restore_training_state(state, model, optimizer, sampler, noise)
    buckets = make_buckets(params, cfg["bucket_bytes"])
    while step < cfg["steps"]:
        idx = sampler.next_batch()
        x, y = shard(X[idx], comm.rank, comm.size), shard(Y[idx], comm.rank, comm.size)
        x = x + cfg["input_noise"] * noise["noise"].standard_normal(x.shape)
        model.zero_grad()
        loss = loss_fn(model(Tensor(x)), y)
        loss.backward()
        yield comm.compute(flops=cfg["flops_per_sample"] * len(x))
        yield from allreduce_gradients(comm, params, buckets, len(x) / len(idx), cfg["algo"])
        optimizer.step()
        step += 1
        log.append((comm.rank, step, comm.now(), _full_loss(model, loss_fn, X, Y)
                    if comm.rank == 0 else 0.0))
        if step % cfg["checkpoint_every"] == 0 or step == cfg["steps"]:
            save(training_state(step, model, optimizer, sampler, noise),
                 checkpoint_path(cfg["folder"], step, comm.rank))
            yield comm.compute(seconds=cfg["checkpoint_seconds"])
            log.append((comm.rank, -step, comm.now(), 0.0))  # a negative step: checkpointed
    return model.state_dict()


def _full_loss(model, loss_fn, X, Y):
    """The loss on all the data (what time-to-accuracy watches); costs no simulated time."""
    with no_grad():
        return float(loss_fn(model(Tensor(X)), Y).numpy())


def _steps_from_log(log, size):
    """{step: (finish time over all ranks, rank 0's full-data loss)}, and the last step every
    rank saved."""
    done, saved = {}, {}
    for _rank, step, t, loss in log:
        table = done if step > 0 else saved
        key = abs(step)
        t0, l0, n = table.get(key, (0.0, 0.0, 0))
        table[key] = (max(t0, t), l0 + loss, n + 1)
    steps = {s: (t, loss) for s, (t, loss, n) in done.items() if n == size}
    complete = [s for s, (_, _, n) in saved.items() if n == size]
    return steps, max(complete, default=0)


def fault_tolerant_train(model, make_optimizer, loss_fn, X, Y, make_cluster, folder, *,
                         steps, batch_size, checkpoint_every, faults=None, seed=0,
                         input_noise=0.0, bucket_bytes=2**20, algo="ring",
                         flops_per_sample=None, max_attempts=5):
    """Synchronous DP on the simulator with checkpoints every ``checkpoint_every`` steps; when
    a device or link fails (:class:`FaultConfig`), restart every rank from the last complete
    checkpoint and go on until ``steps`` steps are done.

    Args:
        make_cluster: ``() -> sim.Cluster``, called for each launch (replacement hardware).
        folder: where each rank writes its checkpoint file.
        input_noise: std of Gaussian noise each rank adds to its inputs from its own
            generator (data augmentation, so per-rank RNG state matters).

    Returns:
        A :class:`FaultRunResult`.
    """
    faults = faults or FaultConfig()
    if not (isinstance(checkpoint_every, int) and checkpoint_every >= 1):
        raise ArgumentError(f"fault_tolerant_train: checkpoint_every must be an int >= 1, got "
                            f"{checkpoint_every!r}")
    if not os.path.isdir(folder):
        raise CheckpointError(f"fault_tolerant_train: folder {folder} does not exist")
    cfg = {"seed": seed, "steps": steps, "batch_size": batch_size, "folder": folder,
           "checkpoint_every": checkpoint_every, "checkpoint_seconds": faults.checkpoint_seconds,
           "input_noise": input_noise, "bucket_bytes": bucket_bytes, "algo": algo,
           "flops_per_sample": flops_per_sample or 6.0 * model.num_parameters()}
    offset, start_from, attempts, curve, lost = 0.0, 0, [], {}, 0
    for attempt in range(max_attempts):
        cluster, log = make_cluster(), []
        first = attempt == 0
        args = [(cfg, model, make_optimizer, loss_fn, (X, Y), start_from, log)] * cluster.size
        try:
            res = sim.run(cluster, _rank_program, args=args,
                          failures=faults.device_failures if first else None,
                          link_failures=faults.link_failures if first else None)
        except (DeviceFailure, LinkFailure) as failure:
            done, saved = _steps_from_log(log, cluster.size)
            resume = max(saved, start_from)
            for s, (t, loss) in done.items():
                if s <= resume:
                    curve[s] = (offset + t, loss)
            lost += max(done, default=0) - resume
            end = failure.time + faults.detect_seconds + faults.restart_seconds
            attempts.append({"started_from": start_from, "failed": type(failure).__name__,
                             "at": offset + failure.time, "resume_from": resume,
                             "detail": str(failure)})
            offset += end
            start_from = resume
            continue
        done, _ = _steps_from_log(log, cluster.size)
        for s, (t, loss) in done.items():
            curve[s] = (offset + t, loss)
        attempts.append({"started_from": start_from, "failed": None, "at": offset + res.time})
        ordered = [(t, s, loss) for s, (t, loss) in sorted(curve.items())]
        return FaultRunResult(res.results[0], ordered, offset + res.time, attempts, lost)
    raise ArgumentError(f"fault_tolerant_train: still failing after {max_attempts} attempts")


def time_to_accuracy(curve, target_loss):
    """The first simulated time at which the loss is at most ``target_loss`` (None: never)."""
    for t, _, loss in curve:
        if loss <= target_loss:
            return t
    return None
