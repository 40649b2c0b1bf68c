"""Data-parallel training on the simulator: wall time of a 64-rank step, and bucketing.

    python benchmarks/distributed_parallel.py

Prints the real time to simulate one data-parallel training step on 64 ranks (best of N,
interleaved with the same step on one device as the named baseline), the largest parameter
difference between the 64-rank run and single-device large-batch training (float64), and what
gradient bucketing does to the number of messages and the simulated step time, and the
simulated step with each bucket's all-reduce overlapped with the rest of the backward (DDP).
"""

import numpy as np

import mlsys_lab as ml
from mlsys_lab import timing
from mlsys_lab.distributed import data_parallel as dp
from mlsys_lab.distributed import sim

RANKS = 64


def _model():
    model = ml.nn.Sequential(ml.nn.Linear(32, 64, rng=0), ml.nn.ReLU(), ml.nn.Linear(64, 64, rng=1),
                             ml.nn.ReLU(), ml.nn.Linear(64, 10, rng=2))
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    return model


def _loss(pred, y):
    return ml.ops.mse_loss(pred, ml.tensor(y))


def _opt(params):
    return ml.optim.SGD(params, lr=0.05, momentum=0.9)


def dp_step_section(repeats=5):
    """Time and check a 64-rank data-parallel step; returns the numbers it prints."""
    model, rng = _model(), np.random.default_rng(0)
    batch = [(rng.standard_normal((4 * RANKS, 32)), rng.standard_normal((4 * RANKS, 10)))]
    cluster = lambda: sim.Cluster(sim.ring(RANKS, alpha=5e-6, beta=1 / 25e9))
    runs = {name: (lambda b=b: dp.data_parallel_train(model, _opt, _loss, batch, cluster(),
                                                      bucket_bytes=b))
            for name, b in (("64 ranks, 1 bucket", float("inf")),
                            ("64 ranks, per-tensor", 0))}
    contestants = {"1 device": lambda: dp.single_device_train(model, _opt, _loss, batch),
                   **runs}
    table = timing.compare(contestants, rounds=repeats)
    print(f"simulating one data-parallel step ({model.num_parameters():,} parameters, global "
          f"batch {4 * RANKS}), wall time, best of {repeats}:")
    print(table)

    want, _ = dp.single_device_train(model, _opt, _loss, batch)
    print(f"\n{'buckets':>10}{'messages':>10}{'sim step (us)':>15}{'max |dp - 1 device|':>22}")
    out = {}
    for name, b in (("per-tensor", 0), ("16 KiB", 16384), ("1 bucket", float("inf"))):
        r = dp.data_parallel_train(model, _opt, _loss, batch, cluster(), bucket_bytes=b)
        diff = max(float(np.max(np.abs(r.state[k] - want[k]))) for k in want)
        out[name] = (r.buckets, r.result.messages, r.time, diff)
        print(f"{r.buckets:>10}{r.result.messages:>10}{r.time * 1e6:>15.1f}{diff:>22.2e}  {name}")
    fused, unfused = out["1 bucket"], out["per-tensor"]
    alpha_saved = (unfused[0] - fused[0]) * 2 * (RANKS - 1) * 5e-6
    print(f"bucketing: {unfused[1] / fused[1]:.0f}x fewer messages, simulated step "
          f"{unfused[2] / fused[2]:.2f}x shorter; the saving equals (buckets - 1) x 2(p-1) x "
          f"alpha = {alpha_saved * 1e6:.1f} us (measured {(unfused[2] - fused[2]) * 1e6:.1f} us)")
    print("\noverlap of the bucketed all-reduce with the backward (DDP), 64 ranks, 8 steps:")
    print(f"{'buckets':>10}{'overlap':>9}{'sim time (us)':>15}{'compute (us)':>14}"
          f"{'exposed comm (us)':>19}")
    batches = [batch[0]] * 8
    overlap = {}
    for b in (16384, float("inf")):
        for ov in (False, True):
            r = dp.data_parallel_train(model, _opt, _loss, batches, cluster(), bucket_bytes=b,
                                       overlap=ov, flops_per_sample=5e10)
            overlap[(b, ov)] = r
            print(f"{r.buckets:>10}{str(ov):>9}{r.time * 1e6:>15.1f}{r.compute * 1e6:>14.1f}"
                  f"{r.exposed * 1e6:>19.1f}")
    same = all(np.array_equal(overlap[(16384, True)].state[k], overlap[(16384, False)].state[k])
               for k in want)
    several = [overlap[(16384, ov)].exposed for ov in (False, True)]
    print(f"same parameters with and without overlap: {same}; overlap hides "
          f"{1 - several[1] / several[0]:.0%} of the exposed communication with "
          f"{overlap[(16384, True)].buckets} buckets; one bucket can only start after the whole "
          f"backward, so nothing overlaps")
    return {"table": table, "buckets": out, "overlap": overlap}


if __name__ == "__main__":
    dp_step_section()
