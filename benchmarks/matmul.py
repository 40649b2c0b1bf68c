"""Time the CPU GEMM ladder against numpy's ``@`` (BLAS), per instruction set, and the thread pools.

    python benchmarks/matmul.py [--sizes 256 512 1024 2048] [--variants tiled packed]
                                [--repeats 5] [--targets native haswell] [--interference 512]

For each target, in a process of its own (Numba and OpenBLAS read these variables at start-up):

* ``native``: whatever Numba and OpenBLAS pick for this machine (the variables below unset);
* ``haswell``: ``NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=`` (Numba emits AVX2+FMA code only)
  and ``OPENBLAS_CORETYPE=Haswell`` (numpy's BLAS runs its AVX2 kernels), so an AVX-512 host
  measures the AVX2 configuration against AVX2 BLAS;
* ``nospin``: the thread-pool section only, with ``OPENBLAS_THREAD_TIMEOUT=4`` (OpenBLAS workers
  go to sleep 16 cycles after a call instead of spinning ~2^28): the control that shows spinning
  is the cause.

Each prints the packed rung's configuration and why it was chosen, then for each size n (float32,
n×n @ n×n) times numpy and every variant interleaved: ``--repeats`` rounds, each turn a pause (so
the other pool's threads are quiet) and three calls back to back, the first dropped (it wakes
the pool's sleeping workers); the best of all kept calls. ``naive`` and
``loop_order`` are skipped above n = 512 (seconds a call) unless ``--no-skip`` is given.
``--threads 1`` runs Numba and numpy's BLAS on one thread each: a per-core comparison that other
programs' load disturbs far less than a two-thread one.
The thread-pool section measures how long each pool's idle workers spin after a call (OpenBLAS's
for ~0.1 s: 2^28 cycles), then times a Numba kernel started right after a numpy product and the
reverse, and numpy and Numba back to back with numpy's BLAS at its threads and at one thread
(``threadpoolctl``): one BLAS thread wakes no workers, so none spin. Last, the compiled
executor on a graph that alternates the two pools, with ``threads=None`` against its default
``threads="coordinate"`` (BLAS at one thread while such a graph runs).
Timings on a shared machine are noisy: compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numba
import numpy as np

from mlsys_lab import timing
from mlsys_lab.kernels import cpu, roofline

SLOW_VARIANTS = ("naive", "loop_order")
SLOW_LIMIT = 512
PAUSE = 0.2  # seconds before each timed turn: OpenBLAS and OpenMP workers stop spinning
TARGET = 0.8  # the goal: best Numba variant >= 0.8x numpy at n = 1024 and 2048
TARGET_ENV = {
    "native": {},
    "haswell": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "",
                "OPENBLAS_CORETYPE": "Haswell"},
    "nospin": {"OPENBLAS_THREAD_TIMEOUT": "4"},  # thread-pool section only
}
TARGET_VARS = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE",
               "OPENBLAS_THREAD_TIMEOUT")  # unset, then set per target
ENV_VARS = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE", "OPENBLAS_NUM_THREADS",
            "OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY",
            "OPENBLAS_THREAD_TIMEOUT")


def blas_threads():
    """The BLAS library, its kernel family and thread count, via threadpoolctl."""
    from threadpoolctl import threadpool_info

    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return ", ".join(f"{p['internal_api']} {p.get('architecture', '?')} kernels, "
                     f"{p['num_threads']} threads" for p in blas) or "none"


def load_average():
    """The 1, 5 and 15 minute load averages, for judging how quiet the machine was."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def print_setup():
    print(f"numba {numba.__version__}: {numba.get_num_threads()} threads   BLAS: {blas_threads()}"
          f"   {load_average()}")
    print("  ".join(f"{var}={os.environ[var]!r}" for var in ENV_VARS if var in os.environ)
          or "(no NUMBA_/OPENBLAS_/OMP_ variables set)")
    print(cpu.CONFIG.describe())
    fmas = cpu.emitted_fmas()
    print("  micro-kernel as compiled (float32): "
          + ", ".join(f"{count} vfmadd on {reg}" if reg != "v" else f"{count} fmla"
                      for reg, count in fmas.items()))


def time_ladder(sizes, variants, repeats, no_skip):
    """``{n: {name: seconds}}`` for numpy and the variants, interleaved per size."""
    rng = np.random.default_rng(0)
    results = {}
    for n in sizes:
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        names = [v for v in variants if no_skip or v not in SLOW_VARIANTS or n <= SLOW_LIMIT]
        contestants = {"numpy @": np.matmul, **{v: cpu.VARIANTS[v] for v in names}}
        for name, fn in contestants.items():
            if name != "numpy @" and not np.allclose(fn(a, b), a @ b, rtol=1e-3, atol=1e-2):
                raise SystemExit(f"{name} gives a wrong product at n = {n}")
        rounds = repeats if n <= 1024 else max(3, repeats // 2)
        result = timing.compare(contestants, a, b, rounds=rounds, pause=PAUSE, block=3,
                                discard=1)  # the first call after a pause wakes sleeping workers
        results[n] = result.times
    return results


def print_ladder(results, peak):
    print(f"\n{'variant':<12}{'n':>6}{'ms':>11}{'GFLOP/s':>10}{'vs numpy':>10}{'% peak':>8}")
    for n, times in results.items():
        for name, t in times.items():
            rate = cpu.flops(n, n, n) / t
            print(f"{name:<12}{n:>6}{t * 1e3:>11.2f}{rate / 1e9:>10.1f}"
                  f"{times['numpy @'] / t:>9.2f}x{rate / peak * 100:>7.0f}%")
        best, ratio = best_variant(times)
        print(f"{'':<12}{n:>6}  best Numba variant: {best} at {ratio:.2f}x numpy   "
              f"({load_average()})\n")


def best_variant(times):
    """The fastest Numba variant and its speed relative to numpy (>1: faster than numpy)."""
    best = min((name for name in times if name != "numpy @"), key=times.get)
    return best, times["numpy @"] / times[best]


# ------------------------------------------------------------------------------------------------
# Thread pools
# ------------------------------------------------------------------------------------------------


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _other_threads_cpu():
    """CPU seconds used so far by each thread of this process but the calling one (Linux)."""
    me, ticks, used = threading.get_native_id(), os.sysconf("SC_CLK_TCK"), {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended
            continue
        if int(tid) != me:
            used[tid] = (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return used


def spin_after(fn, window=0.3):
    """CPU seconds the other threads burn in the ``window`` seconds after one ``fn()``: their
    spinning, since nothing else runs. Immune to other programs' load, unlike a timing."""
    time.sleep(PAUSE + 0.3)  # any earlier spinning has stopped
    fn()
    before = _other_threads_cpu()
    time.sleep(window)
    after = _other_threads_cpu()
    return sum(t - before.get(tid, 0.0) for tid, t in after.items())


def interference(n, trials):
    """``(spin, samples)``: CPU seconds spun after each kind of call, and the seconds of each
    timed scenario per trial (every trial starts after PAUSE with quiet pools)."""
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(1)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    blas = lambda: a @ b  # noqa: E731
    packed = lambda: cpu.matmul_packed(a, b)  # noqa: E731
    one_blas_thread = lambda: threadpool_limits(limits=1, user_api="blas")  # noqa: E731

    def blas_one_thread():
        with one_blas_thread():
            blas()

    def packed_after(before):
        return lambda: (before(), _timed(packed))[1]

    def mixed(limit):
        def run():
            with one_blas_thread() if limit else contextlib.nullcontext():
                return _timed(lambda: [(blas(), packed()) for _ in range(5)])
        return run

    blas(), packed()
    spin = {}
    if os.path.isdir("/proc/self/task"):
        spin = {"numpy @ (BLAS threads as set)": spin_after(blas),
                "numpy @ under threadpool_limits(1)": spin_after(blas_one_thread),
                "Numba packed": spin_after(packed)}
    scenarios = {
        "Numba packed, pools quiet": lambda: _timed(packed),
        "Numba packed right after numpy @": packed_after(blas),
        "  numpy @ under threadpool_limits(1)": packed_after(blas_one_thread),
        "numpy @, pools quiet": lambda: _timed(blas),
        "numpy @ right after Numba packed": lambda: (packed(), _timed(blas))[1],
        "5 x (numpy @, packed) back to back": mixed(False),
        "  with BLAS at 1 thread (threadpoolctl)": mixed(True),
    }
    samples = {name: [] for name in scenarios}
    for _ in range(trials):
        for name, run in scenarios.items():
            time.sleep(PAUSE)
            samples[name].append(run())
    return spin, samples


def print_interference(n, spin, samples):
    print(f"\nThread pools, n = {n} float32: CPU seconds other threads spin in the 0.3 s after "
          "one call (not a timing: load-proof)")
    for name, seconds in spin.items():
        print(f"  {name:<38}{seconds:>7.3f} s")
    print(f"Timed, {len(next(iter(samples.values())))} trials each after a {PAUSE} s pause:")
    print(f"  {'scenario':<42}{'median ms':>10}{'best ms':>9}")
    for name, ts in samples.items():
        print(f"  {name:<42}{statistics.median(ts) * 1e3:>10.3f}{min(ts) * 1e3:>9.3f}")
    names = list(samples)

    def ratio(slow, fast):
        median = statistics.median(samples[slow]) / statistics.median(samples[fast])
        return f"{median:.2f}x median, {min(samples[slow]) / min(samples[fast]):.2f}x best"

    print(f"  Numba packed right after numpy @ / quiet:     {ratio(names[1], names[0])}")
    print(f"    after numpy @ at 1 BLAS thread / quiet:     {ratio(names[2], names[0])}")
    print(f"  numpy @ right after Numba packed / quiet:     {ratio(names[4], names[3])}")
    print(f"  back to back, default / BLAS at 1 thread:     {ratio(names[5], names[6])}")


def executor_interference(n, trials):
    """The compiled executor on a ``cpu-numba`` graph that alternates BLAS and Numba's parallel
    packed kernel (a batched product, which the packed rung refuses, then a plain one, three
    times): seconds per call, per trial, with ``threads=None`` (the pools as set: BLAS workers
    spin into the Numba kernels) and ``threads="coordinate"`` (BLAS held at one thread while
    the graph runs, the executor's default for such graphs)."""
    import mlsys_lab as ml
    from mlsys_lab import ops

    rng = np.random.default_rng(2)
    a = rng.standard_normal((1, n, n)).astype(np.float32)
    b, c = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))

    def f(a, b, c):
        h = ops.reshape(ops.matmul(a, b), (1, n, n))  # rank 3: BLAS (numpy.matmul)
        for _ in range(3):
            h = ops.reshape(ops.matmul(ops.reshape(h, (n, n)), c) * 0.01, (1, n, n))  # Numba
            h = ops.matmul(h, b) * 0.01  # BLAS
        return h

    runs = {}
    for setting in (None, "coordinate"):
        exe = ml.compile(f, a, b, c, device="cpu-numba", threads=setting)
        exe(a, b, c, profile=False)
        runs[setting] = exe
    names = {None: "threads=None (pools as set)", "coordinate": "threads='coordinate'"}
    kernels = sorted({n_.meta["kernel_name"] for n_ in runs[None].graph.nodes})
    samples = {names[k]: [] for k in runs}
    for _ in range(trials):
        for key, exe in runs.items():
            time.sleep(PAUSE)
            samples[names[key]].append(_timed(lambda: exe(a, b, c, profile=False)))
    return kernels, runs["coordinate"].thread_limits, samples


def print_executor(n, kernels, limits, samples):
    print(f"\nCompiled executor, cpu-numba graph of BLAS and Numba products, n = {n}: kernels "
          f"{', '.join(kernels)}; 'coordinate' limits {limits}")
    print(f"  {'setting':<42}{'median ms':>10}{'best ms':>9}")
    for name, ts in samples.items():
        print(f"  {name:<42}{statistics.median(ts) * 1e3:>10.3f}{min(ts) * 1e3:>9.3f}")
    (slow, fast) = list(samples.values())
    print(f"  pools as set / coordinated:                   "
          f"{statistics.median(slow) / statistics.median(fast):.2f}x median, "
          f"{min(slow) / min(fast):.2f}x best")


# ------------------------------------------------------------------------------------------------
# Targets in their own processes
# ------------------------------------------------------------------------------------------------


def run_target(name, argv):
    """Run this script for ``name`` in a fresh process (its env is read at import); return the
    results it wrote."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = {k: v for k, v in os.environ.items() if k not in TARGET_VARS}
        env.update(TARGET_ENV[name])
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--targets", "self",
               "--label", name, "--json", out]
        settings = " ".join(f"{k}={v!r}" for k, v in TARGET_ENV[name].items()) or "as is"
        print(f"\n{'=' * 30} target {name}: {settings}", flush=True)
        subprocess.run(cmd, env=env, check=True, timeout=3600)
        with open(out) as f:
            return json.load(f)


def summary(records):
    print(f"\n{'=' * 30} summary: best Numba variant vs numpy (target {TARGET}x at n >= 1024), "
          f"{load_average()}")
    print(f"  {'target':<10}{'config':<10}{'BLAS kernels':<14}{'n':>6}{'best':>9}{'ratio':>8}")
    for rec in records:
        for n, times in rec["times"].items():
            best, ratio = best_variant(times)
            mark = "" if int(n) < 1024 else ("  meets" if ratio >= TARGET else "  BELOW")
            print(f"  {rec['label']:<10}{rec['config']:<10}{rec['blas']:<14}{n:>6}{best:>9}"
                  f"{ratio:>7.2f}x{mark}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--variants", nargs="+", default=list(cpu.VARIANTS),
                        choices=list(cpu.VARIANTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-skip", action="store_true", help="also run slow variants at n>1024")
    parser.add_argument("--targets", nargs="+", default=["native", "haswell", "nospin"],
                        choices=[*TARGET_ENV, "self"])
    parser.add_argument("--interference", type=int, default=512, metavar="N",
                        help="matrix size of the thread-pool measurement (0: skip it)")
    parser.add_argument("--trials", type=int, default=20, help="thread-pool trials")
    parser.add_argument("--threads", type=int, help="Numba and BLAS threads (default: all)")
    parser.add_argument("--label", default="native", help=argparse.SUPPRESS)
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.targets != ["self"]:
        passed = ["--sizes", *map(str, args.sizes), "--variants", *args.variants,
                  "--repeats", str(args.repeats), "--interference", str(args.interference),
                  "--trials", str(args.trials), *(["--no-skip"] if args.no_skip else []),
                  *(["--threads", str(args.threads)] if args.threads else [])]
        records = [run_target(name, passed) for name in args.targets
                   if name != "nospin" or args.interference]
        summary([rec for rec in records if rec["times"]])
        return

    if args.threads:
        from threadpoolctl import threadpool_limits

        numba.set_num_threads(args.threads)
        threadpool_limits(limits=args.threads, user_api="blas")
    print_setup()
    results = {}
    if args.label != "nospin":
        peak = roofline.measure_peak_flops(seconds=1.0, n=1024)
        bandwidth = roofline.measure_bandwidth()
        print(f"measured peak (numpy float32 GEMM n=1024): {peak / 1e9:.1f} GFLOP/s; "
              f"triad bandwidth: {bandwidth / 1e9:.1f} GB/s; "
              f"ridge {roofline.ridge_point(peak, bandwidth):.1f} FLOP/byte")
        results = time_ladder(args.sizes, args.variants, args.repeats, args.no_skip)
        print_ladder(results, peak)
    if args.interference:
        print_interference(args.interference, *interference(args.interference, args.trials))
        print_executor(args.interference,
                       *executor_interference(args.interference, max(3, args.trials // 2)))
    if args.json:
        from threadpoolctl import threadpool_info

        arch = [p.get("architecture", "?") for p in threadpool_info() if p["user_api"] == "blas"]
        with open(args.json, "w") as f:
            json.dump({"label": args.label, "config": cpu.CONFIG.config.name,
                       "blas": ",".join(arch), "times": results}, f)


if __name__ == "__main__":
    main()
