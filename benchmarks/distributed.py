"""The distributed simulator and the MPI backend.

    python benchmarks/distributed.py [--repeats 3] [--no-mpi]

Sections:
1. Wall time to simulate a 1,024-rank ring all-reduce of 256 MiB (target <= 1 s; the data is
   symbolic at this size, see ``sim.SymbolicArray``), the same with one link 10x slower, and
   the batched path against the message-by-message path at p = 64 (same times, data, trace).
2. Simulated / analytic time per algorithm (alpha-beta formulas of ``cost``), with nccl-tests'
   algbw and busbw of the simulated run.
3. On 2 real MPI processes: the ring all-reduce's bus bandwidth against ``MPI_Allreduce`` on
   the same 16 MiB buffer (target >= 0.7x); 4 processes only check correctness (on 2 cores they
   measure the OS scheduler).
4. A 64-rank data-parallel training step (``dp_step_section``).
"""

import argparse
import subprocess
import sys

import numpy as np

from mlsys_lab import timing
from mlsys_lab.distributed import collectives as coll
from mlsys_lab.distributed import cost, sim

ALPHA, BETA = 5e-6, 1 / 25e9  # 5 us, 25 GB/s


def ring_allreduce(comm, x):
    return (yield from coll.allreduce(comm, x, algo="ring"))


def scale_section(repeats):
    print("1. Simulating a ring all-reduce at scale")
    p, n = 1024, 256 * 2**20 // 4
    args = [(sim.SymbolicArray(n, "float32"),)] * p
    slow = sim.ring(p, ALPHA, BETA)
    slow.slow_link(511, 512, 10.0)
    runs = {}

    def simulate(topology):
        runs[topology.name] = sim.run(sim.Cluster(topology), ring_allreduce, args=args,
                                      trace=False)

    fast = sim.ring(p, ALPHA, BETA)
    wall = timing.best_of(simulate, fast, repeats=repeats)
    res = runs["ring"]
    formula = cost.collective_time("allreduce", "ring", p, n * 4, ALPHA, BETA)
    print(f"   p=1024, 256 MiB float32: wall {wall:.3f} s (target <= 1 s), "
          f"{res.messages:,} messages, simulated {res.time * 1e3:.3f} ms = "
          f"{res.time / formula:.6f} x formula")
    slow_wall = timing.best_of(simulate, slow, repeats=repeats)
    slow_res = runs["ring"]
    busiest = max(slow_res.link_busy, key=slow_res.link_busy.get)
    print(f"   one link 10x slower: wall {slow_wall:.3f} s, simulated "
          f"{slow_res.time * 1e3:.3f} ms = {slow_res.time / res.time:.2f} x the healthy ring "
          f"(busiest link {busiest})")
    p, n = 64, 1 << 18
    rng = np.random.default_rng(0)
    xs = [(rng.standard_normal(n).astype(np.float32),) for _ in range(p)]
    topo = sim.ring(p, ALPHA, BETA)
    topo.slow_link(7, 8, 10.0)
    out = {}

    def run_path(batched):
        out[batched] = sim.run(sim.Cluster(topo), ring_allreduce, args=xs, batched=batched)

    result = timing.compare({"message by message": lambda: run_path(False),
                             "batched": lambda: run_path(True)}, rounds=repeats)
    same = out[False].rank_time == out[True].rank_time and sorted(out[False].trace) == \
        sorted(out[True].trace) and all(np.array_equal(a, b) for a, b in
                                        zip(out[False].results, out[True].results))
    print(f"   p=64, 1 MiB, a slow link: batched path identical to message by message: {same}")
    print("   " + str(result).replace("\n", "\n   "))


def algorithm_section():
    print("\n2. Simulated time / alpha-beta formula (alpha 5 us, 25 GB/s)")
    print(f"   {'collective':15s} {'algo':19s} {'p':>3s} {'topology':16s} {'sim ms':>9s} "
          f"{'formula':>9s} {'ratio':>7s} {'algbw GB/s':>10s} {'busbw':>7s}")
    ring_kinds = ("allreduce", "reduce_scatter", "allgather", "broadcast")
    for p in (16, 64):
        n = 4 * 2**20
        for kind, algos in coll.ALGORITHMS.items():
            for algo in algos:
                on_ring = algo == "ring" and kind in ring_kinds
                topo = sim.ring(p, ALPHA, BETA) if on_ring else sim.fully_connected(p, ALPHA,
                                                                                     BETA)
                per_rank = n // 4 // p if kind in ("allgather", "gather") else n // 4
                xs = [np.ones(per_rank, np.float32) for _ in range(p)]
                if kind == "scatter":
                    xs = [xs[0] if r == 0 else None for r in range(p)]
                res = sim.run(sim.Cluster(topo), _call, args=[(x, kind, algo) for x in xs],
                              trace=False)
                formula = cost.collective_time(kind, algo, p, n, ALPHA, BETA)
                print(f"   {kind:15s} {algo:19s} {p:3d} {topo.name:16s} {res.time * 1e3:9.3f} "
                      f"{formula * 1e3:9.3f} {res.time / formula:7.4f} "
                      f"{cost.algbw(n, res.time) / 1e9:10.3f} "
                      f"{cost.busbw(kind, n, res.time, p) / 1e9:7.3f}")
    p, n = 64, 4 * 2**20
    xs = [(np.ones(n // 4, np.float32),)] * p
    rd = sim.run(sim.Cluster(sim.ring(p, ALPHA, BETA)), lambda c, x: coll.allreduce(
        c, x, algo="recursive_doubling"), args=xs, trace=False).time
    print(f"   contention: recursive doubling on a ring topology (p=64) takes "
          f"{rd / cost.collective_time('allreduce', 'recursive_doubling', p, n, ALPHA, BETA):.2f}"
          f" x its formula (partners far apart share the ring's links)")


def _call(comm, x, kind, algo):
    fn = getattr(coll, kind)
    return (yield from fn(comm, x, algo=algo))


def mpi_section():
    print("\n3. Real processes (MPI, MPICH from PyPI)")
    try:
        import mpi4py  # noqa: F401

        from mlsys_lab.distributed.mpi import find_mpiexec

        mpiexec = find_mpiexec()
    except ImportError:
        mpiexec = None
    if mpiexec is None:
        print("   skipped: pip install mpich mpi4py")
        return
    for n, size, iters in ((2, "16M", 20), (4, "1M", 2)):
        cmd = [mpiexec, "-n", str(n), "-launcher", "fork", "-hosts", "localhost",
               sys.executable, "-m", "mlsys_lab.distributed.mpi", "allreduce", "--algo",
               "ring", "--bytes", size, "--iters", str(iters)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            text = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            text = "timed out after 120 s"
        if n == 4:
            text = text.splitlines()[0] + "   (4 processes on 2 cores: correctness only)"
        print("   " + text.strip().replace("\n", "\n   "))


def dp_step_section():
    """Wall time to simulate one 64-rank data-parallel training step, and bucketing's effect
    (``benchmarks/distributed_parallel.py``, which also runs on its own)."""
    print("\n4. 64-rank data-parallel step")
    from distributed_parallel import dp_step_section as section  # the script beside this one

    section()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-mpi", action="store_true")
    options = parser.parse_args()
    scale_section(options.repeats)
    algorithm_section()
    if not options.no_mpi:
        mpi_section()
    dp_step_section()


if __name__ == "__main__":
    main()
