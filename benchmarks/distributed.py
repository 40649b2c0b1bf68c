"""The distributed simulator and the MPI backend.

    python benchmarks/distributed.py [--repeats 3] [--no-mpi]

Sections:
1. Wall time to simulate a 1,024-rank ring all-reduce of 256 MiB (target <= 1 s; the data is
   symbolic at this size, see ``sim.SymbolicArray``), the same with one link 10x slower, and
   the batched path against the message-by-message path at p = 64 (same times, data, trace).
2. Simulated / analytic time per algorithm (alpha-beta formulas of ``cost``), with nccl-tests'
   algbw and busbw of the simulated run.
2b. The one-port model (``sim.Cluster(one_port=True)``) against the book's cost table for the
   rooted collectives and the direct algorithms, at a power of two and not.
2c. Max-min fair sharing against first-come-first-served reservation where links are shared.
3. On 2 real MPI processes: the ring all-reduce's bus bandwidth against ``MPI_Allreduce`` on
   the same 16 MiB buffer (target >= 0.7x); 4 processes only check correctness (on 2 cores they
   measure the OS scheduler).
4. A 64-rank data-parallel training step (``dp_step_section``).
"""

import argparse
import os
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


def one_port_section():
    print("\n2b. One-port model (a rank sends one and receives one message at a time) vs the "
          "cost table")
    print(f"   {'collective':10s} {'algo':9s} {'p':>3s} {'default':>9s} {'one-port':>9s} "
          f"{'formula':>9s} {'ratio':>7s} {'busbw default':>13s} {'busbw 1-port':>12s}")
    n = 4 * 2**20
    for p in (12, 16):
        for kind, algo in (("broadcast", "binomial"), ("reduce", "binomial"),
                           ("gather", "binomial"), ("gather", "direct"),
                           ("scatter", "binomial"), ("scatter", "direct"),
                           ("alltoall", "direct"), ("reduce", "ring")):
            per = n // 4 // p if kind == "gather" else n // 4
            if kind == "scatter":
                per -= per % p
            nbytes = per * 4 * (p if kind == "gather" else 1)
            xs = [np.ones(per, np.float32) for _ in range(p)]
            if kind in ("scatter", "broadcast"):
                xs = [xs[0] if r == 0 else None for r in range(p)]
            times = {}
            for one_port in (False, True):
                cluster = sim.Cluster(sim.fully_connected(p, ALPHA, BETA), one_port=one_port)
                times[one_port] = sim.run(cluster, _call, args=[(x, kind, algo) for x in xs],
                                          trace=False).time
            formula = cost.collective_time(kind, algo, p, nbytes, ALPHA, BETA, one_port=True)
            print(f"   {kind:10s} {algo:9s} {p:3d} {times[False] * 1e3:9.3f} "
                  f"{times[True] * 1e3:9.3f} {formula * 1e3:9.3f} {times[True] / formula:7.4f} "
                  f"{cost.busbw(kind, nbytes, times[False], p) / 1e9:13.1f} "
                  f"{cost.busbw(kind, nbytes, times[True], p) / 1e9:12.1f}")
    print("   (ms; without the port limit a root takes all its messages at once, so 'direct' "
          "looks like one message)")


def sharing_section():
    print("\n2c. Link sharing: first come first served vs max-min fair (p=16, 1 MiB float32)")
    p, n = 16, 2**18
    xs = [(np.ones(n, np.float32),)] * p
    cases = (("recursive_doubling", "ring", lambda: sim.ring(p, ALPHA, BETA)),
             ("ring", "tree (fat=1)", lambda: sim.tree(p, 2, ALPHA, BETA)),
             ("pairwise a2a", "fully connected", lambda: sim.fully_connected(p, ALPHA, BETA)))
    print(f"   {'algo':19s} {'topology':16s} {'fifo ms':>9s} {'fair ms':>9s} "
          f"{'formula (no contention)':>24s}")
    for algo, name, topo in cases:
        kind, algo = ("alltoall", "pairwise") if algo == "pairwise a2a" else ("allreduce", algo)
        times = [sim.run(sim.Cluster(topo(), sharing=sharing), _call,
                         args=[(x, kind, algo) for (x,) in xs], trace=False,
                         batched=False).time for sharing in ("fifo", "fair")]
        formula = cost.collective_time(kind, algo, p, 4 * n, ALPHA, BETA)
        print(f"   {algo:19s} {name:16s} {times[0] * 1e3:9.3f} {times[1] * 1e3:9.3f} "
              f"{formula * 1e3:24.3f}")


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
    print("load average (1, 5, 15 min): " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))
    scale_section(options.repeats)
    algorithm_section()
    one_port_section()
    sharing_section()
    if not options.no_mpi:
        mpi_section()
    dp_step_section()


if __name__ == "__main__":
    main()
