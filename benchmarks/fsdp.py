"""FSDP (ZeRO stage 3) on 4 simulated ranks: exposed communication with and without prefetch.

    python benchmarks/fsdp.py

An MLP of ``layers`` Linear(width, width) + Tanh units (float32) trains for ``steps`` steps
with FSDP on a ring of 4 simulated devices (alpha 5 us, the given link bandwidths, a modelled
50 GFLOP/s per device so that a unit's forward and a gather are of the same order). Each row
is one run: simulated step time, compute, the exposed communication measured (rank 0's time
waiting on collectives) against ``sum(max(0, communication - compute))`` over the schedule's
slots with the collectives' alpha-beta costs (``fsdp.schedule_slots``), the peak of gathered
parameters against the whole model, and the model state held per rank against the ZeRO-3
formula. ``benchmarks/large_models.py`` imports :func:`fsdp_rows`.
"""

import numpy as np

import mlsys_lab as ml
from mlsys_lab.distributed import fsdp, sim, zero
from mlsys_lab.distributed.collectives import cost


def _model(layers, width):
    mods = []
    for i in range(layers):
        mods += [ml.nn.Linear(width, width, rng=i), ml.nn.Tanh()]
    return ml.nn.Sequential(*mods)


def _predicted(run, ranks, alpha, beta, flops, samples_per_rank, steps):
    layouts = run.layouts

    def comm(action, u):
        kind = "allgather" if action == "gather" else "reduce_scatter"
        return cost.collective_time(kind, "ring", ranks, layouts[u].full_bytes, alpha, beta)

    def compute(action, u):
        share = 1 / 3 if action == "forward" else 2 / 3
        return 6 * layouts[u].size * samples_per_rank * share / flops

    slots = fsdp.schedule_slots(fsdp.fsdp_schedule(len(layouts), run.prefetch), comm, compute)
    return steps * fsdp.exposed_communication(slots), steps * sum(c for c, _ in slots)


def fsdp_rows(ranks=4, layers=8, width=128, batch=64, steps=2, bandwidths=(25e9, 5e9),
              alpha=5e-6, flops=5e10):
    """One row per (link bandwidth, prefetch): FSDP's simulated step on ``ranks`` ranks.

    Returns:
        A list of dicts: ``bandwidth`` (bytes/s), ``prefetch``, ``step`` (simulated seconds per
        step), ``compute`` and ``exposed`` (rank 0, per step), ``predicted`` (per step,
        ``sum(max(0, comm - compute))`` from the alpha-beta costs), ``communication`` (per
        step, all collectives back to back), ``peak_gathered`` and ``model_bytes`` (bytes),
        ``held`` and ``formula`` (model-state bytes per rank, measured and ZeRO-3's).
    """
    model = _model(layers, width)
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((batch, width)).astype(np.float32),
             rng.standard_normal((batch, width)).astype(np.float32)) for _ in range(steps)]
    loss = lambda pred, y: ml.ops.mse_loss(pred, ml.tensor(y))  # noqa: E731
    opt = lambda ps: ml.optim.Adam(ps, lr=1e-3)  # noqa: E731
    rows = []
    for bandwidth in bandwidths:
        for prefetch in (False, True):
            cluster = sim.Cluster(sim.ring(ranks, alpha=alpha, beta=1 / bandwidth, flops=flops))
            run = fsdp.fsdp_train(model, opt, loss, data, cluster, prefetch=prefetch)
            predicted, communication = _predicted(run, ranks, alpha, 1 / bandwidth, flops,
                                                  batch // ranks, steps)
            steps_time = run.compute + run.exposed
            rows.append({
                "bandwidth": bandwidth, "prefetch": prefetch, "step": steps_time / steps,
                "compute": run.compute / steps, "exposed": run.exposed / steps,
                "predicted": predicted / steps, "communication": communication / steps,
                "peak_gathered": run.peak[0]["gathered"],
                "model_bytes": sum(lay.full_bytes for lay in run.layouts),
                "held": run.held[0]["total"],
                "formula": zero.zero_memory_per_device(model.num_parameters(), ranks, 3),
            })
    return rows


def format_rows(rows):
    """The rows as a printed table (times in microseconds per step)."""
    head = (f"{'link':>8} {'prefetch':>8} {'step us':>9} {'compute':>9} {'comm':>9} "
            f"{'exposed':>9} {'sum max(0,c-k)':>15} {'diff':>6} {'peak gathered':>14} "
            f"{'held/rank':>10} {'ZeRO-3':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        diff = (r["exposed"] - r["predicted"]) / r["predicted"] if r["predicted"] else 0.0
        lines.append(
            f"{r['bandwidth'] / 1e9:>5.0f}GB/s {str(r['prefetch']):>8} {r['step'] * 1e6:>9.1f} "
            f"{r['compute'] * 1e6:>9.1f} {r['communication'] * 1e6:>9.1f} "
            f"{r['exposed'] * 1e6:>9.1f} {r['predicted'] * 1e6:>15.1f} {diff:>6.1%} "
            f"{r['peak_gathered'] / 1024:>6.0f}/{r['model_bytes'] / 1024:.0f} KiB "
            f"{r['held'] / 1024:>7.1f}KiB {r['formula'] / 1024:>6.1f}KiB")
    return "\n".join(lines)


def main():
    rows = fsdp_rows()
    print("FSDP on 4 simulated ranks (ring, alpha 5 us, 50 GFLOP/s modelled), 8 units of "
          "Linear(128, 128) + Tanh,\nfloat32 Adam, global batch 64; per step; exposed = rank 0 "
          "waiting on collectives:")
    print(format_rows(rows))
    for bw in sorted({r["bandwidth"] for r in rows}, reverse=True):
        off, on = (next(r for r in rows if r["bandwidth"] == bw and r["prefetch"] is p)
                   for p in (False, True))
        print(f"{bw / 1e9:.0f} GB/s: prefetch hides {1 - on['exposed'] / off['exposed']:.0%} of "
              f"the exposed communication; step {off['step'] / on['step']:.2f}x faster")


if __name__ == "__main__":
    main()
