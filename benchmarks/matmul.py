"""Time the CPU GEMM ladder against numpy's ``@`` (BLAS) and the machine's measured peak.

    python benchmarks/matmul.py [--sizes 256 512 1024 2048] [--variants tiled packed] [--repeats 5]

For each size n (float32, n×n @ n×n) numpy and every variant are warmed up (compiled) once,
then timed ``--repeats`` times back to back; the best time of each is reported. ``naive`` and
``loop_order`` are skipped above n = 1024 (they take minutes) unless ``--no-skip`` is given.
Timings on a shared machine are noisy: compare ratios measured in the same run.
"""

from __future__ import annotations

import argparse
import os

import numba
import numpy as np

from mlsys_lab import timing
from mlsys_lab.kernels import cpu, roofline

SLOW_VARIANTS = ("naive", "loop_order")
SLOW_LIMIT = 1024
# Each function is timed in its own block (one warm-up, then back to back), after a pause:
# OpenBLAS and OpenMP worker threads spin for a while after a call, and would steal a core from
# whatever runs next.
PAUSE = 0.2


def blas_threads():
    """The BLAS library and its thread count, via threadpoolctl when installed."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "unknown (threadpoolctl not installed)"
    blas = [p for p in threadpool_info() if p.get("user_api") == "blas"]
    return ", ".join(f"{p['internal_api']} {p['num_threads']} threads" for p in blas) or "none"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--variants", nargs="+", default=list(cpu.VARIANTS),
                        choices=list(cpu.VARIANTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-skip", action="store_true", help="also run slow variants at n>1024")
    args = parser.parse_args(argv)

    print(f"numba threads: {numba.get_num_threads()}   BLAS: {blas_threads()}")
    for var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        print(f"{var}={os.environ.get(var, '(unset)')}")
    peak = roofline.measure_peak_flops(seconds=1.0, n=1024)
    bandwidth = roofline.measure_bandwidth()
    print(f"measured peak (numpy float32 GEMM n=1024): {peak / 1e9:.1f} GFLOP/s; "
          f"triad bandwidth: {bandwidth / 1e9:.1f} GB/s; "
          f"ridge {roofline.ridge_point(peak, bandwidth):.1f} FLOP/byte\n")

    print(f"{'variant':<12}{'n':>6}{'ms':>11}{'GFLOP/s':>10}{'vs numpy':>10}{'% peak':>8}")
    rng = np.random.default_rng(0)
    for n in args.sizes:
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        names = [v for v in args.variants
                 if args.no_skip or v not in SLOW_VARIANTS or n <= SLOW_LIMIT]
        repeats = args.repeats if n <= SLOW_LIMIT else max(2, args.repeats // 2)
        contestants = {"numpy @": np.matmul, **{v: cpu.VARIANTS[v] for v in names}}
        times = {name: timing.best_of(fn, a, b, repeats=repeats, pause=PAUSE)
                 for name, fn in contestants.items()}
        for name in ["numpy @"] + list(args.variants):
            if name not in times:
                print(f"{name:<12}{n:>6}  skipped (too slow)")
                continue
            t = times[name]
            rate = cpu.flops(n, n, n) / t
            print(f"{name:<12}{n:>6}{t * 1e3:>11.2f}{rate / 1e9:>10.1f}"
                  f"{times['numpy @'] / t:>9.2f}x{rate / peak * 100:>7.0f}%")
        print()


if __name__ == "__main__":
    main()
