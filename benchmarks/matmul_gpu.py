"""Time the CUDA GEMM ladder (book §8.4) on a real GPU, beside cuBLAS.

Run on a machine with an NVIDIA GPU (no network needed):

    python benchmarks/matmul_gpu.py                      # 2048×2048×1024 and 4096³
    python benchmarks/matmul_gpu.py --quick              # 2048×2048×1024 only
    python benchmarks/matmul_gpu.py --out results.json

For every variant and shape it checks the result against cuBLAS (through PyTorch or CuPy, TF32
off) and against a float64 numpy reference on sampled rows, times it with CUDA events (median
of ``--repeats`` samples, each the mean of ``--batch`` back-to-back launches, after warm-up),
prints a table and writes a JSON results file that
``mlsys_lab.kernels.gpu_results.load_gpu_results`` reads and the chapter-8 notebook shows next
to the book's RTX 3080 numbers.

Exit status: 0 all variants correct; 1 a variant gave a wrong result; 2 no real GPU (or the
CUDA simulator is switched on).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a plain checkout, too

DEFAULT_OUT = ROOT / "benchmarks" / "results" / "gpu_matmul.json"
SHAPES = ((2048, 2048, 1024), (4096, 4096, 4096))
REL_TOL = 1e-4  # max |c - ref| / max |ref| for float32


def refuse(message: str) -> None:
    print(f"matmul_gpu: {message}", file=sys.stderr)
    raise SystemExit(2)


def require_gpu():
    """Return numba.cuda if a real GPU is usable; exit 2 otherwise."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        refuse("NUMBA_ENABLE_CUDASIM is set: timings under the simulator mean nothing. "
               "Unset it and run on a machine with an NVIDIA GPU.")
    from numba import config, cuda

    if config.ENABLE_CUDASIM:
        refuse("Numba's CUDA simulator is on; run on a machine with an NVIDIA GPU.")
    try:
        available = cuda.is_available()
    except Exception as exc:  # a broken driver install raises rather than returning False
        refuse(f"CUDA is not usable here ({exc}).")
    if not available:
        refuse("no CUDA GPU found (numba.cuda.is_available() is False).")
    return cuda


class CuBLAS:
    """cuBLAS SGEMM/DGEMM through PyTorch or CuPy (TF32 disabled), or None if neither exists."""

    def __init__(self):
        self.name, self._lib = None, None
        try:
            import torch

            if torch.cuda.is_available():
                torch.backends.cuda.matmul.allow_tf32 = False
                torch.backends.cudnn.allow_tf32 = False
                torch.set_float32_matmul_precision("highest")
                self.name, self._lib = f"torch {torch.__version__}", torch
        except ImportError:
            pass
        if self._lib is None:
            try:
                import cupy

                os.environ["CUPY_TF32"] = "0"
                self.name, self._lib = f"cupy {cupy.__version__}", cupy
            except ImportError:
                pass

    def setup(self, a: np.ndarray, b: np.ndarray):
        """Upload a, b; return (run, result) callables: run() enqueues C = A @ B."""
        lib = self._lib
        if self.name.startswith("torch"):
            ta, tb = lib.from_numpy(a).cuda(), lib.from_numpy(b).cuda()
            tc = lib.empty((a.shape[0], b.shape[1]), dtype=ta.dtype, device="cuda")
            return (lambda: lib.matmul(ta, tb, out=tc)), (lambda: tc.cpu().numpy())
        ca, cb = lib.asarray(a), lib.asarray(b)
        cc = lib.empty((a.shape[0], b.shape[1]), dtype=ca.dtype)
        return (lambda: lib.matmul(ca, cb, out=cc)), (lambda: lib.asnumpy(cc))


def time_ms(cuda, enqueue, warmup: int, repeats: int, batch: int) -> float:
    """Median over ``repeats`` of the mean time of ``batch`` back-to-back launches, in ms.

    Numba's default stream is the legacy default stream, which PyTorch and CuPy also use by
    default, so one pair of Numba events times either library's kernels as well.
    """
    for _ in range(warmup):
        enqueue()
    cuda.synchronize()
    samples = []
    start, end = cuda.event(), cuda.event()
    for _ in range(repeats):
        start.record()
        for _ in range(batch):
            enqueue()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / batch)
    return statistics.median(samples)


def relative_error(c: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(c.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


def sampled_reference(a, b, rows):
    """Float64 reference for a handful of rows (cheap even at 4096³)."""
    return a[rows].astype(np.float64) @ b.astype(np.float64)


def bench_shape(cuda, kc, cublas, shape, args):
    """Check and time every variant (and cuBLAS) at one (M, N, K); return result rows."""
    m, n, k = shape
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    rows_checked = rng.choice(m, size=min(m, 64), replace=False)
    ref_rows = sampled_reference(a, b, rows_checked)
    flop = 2.0 * m * n * k
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    d_c = cuda.device_array((m, n), np.float32)

    cublas_ms, c_cublas, rows = None, None, []
    if cublas.name:
        run, result = cublas.setup(a, b)
        run()
        c_cublas = result()
        cublas_ms = time_ms(cuda, run, args.warmup, args.repeats, args.batch)
        rows.append(dict(variant="cublas", m=m, n=n, k=k, ms=cublas_ms,
                         gflops=flop / cublas_ms / 1e6, ratio_to_cublas=1.0,
                         max_rel_error=relative_error(c_cublas[rows_checked], ref_rows),
                         correct=True))
    for variant in kc.VARIANTS:
        if variant in args.skip:
            continue
        launch = kc.make_launcher(variant, d_a, d_b, d_c)
        launch()
        c = d_c.copy_to_host()
        err = relative_error(c[rows_checked], ref_rows)
        if c_cublas is not None:
            err = max(err, relative_error(c, c_cublas.astype(np.float64)))
        ms = time_ms(cuda, launch, args.warmup, args.repeats, args.batch)
        rows.append(dict(variant=variant, m=m, n=n, k=k, ms=ms, gflops=flop / ms / 1e6,
                         ratio_to_cublas=(cublas_ms / ms) if cublas_ms else None,
                         max_rel_error=err, correct=err <= REL_TOL))
        print(f"  {m}×{n}×{k} {variant:18s} {ms:9.3f} ms  err {err:.1e}", flush=True)
    return rows


def print_table(rows):
    print(f"\n{'shape':>16s} {'variant':18s} {'ms':>9s} {'GFLOP/s':>10s} {'×cuBLAS':>8s} "
          f"{'rel err':>8s}")
    for r in rows:
        ratio = "—" if r["ratio_to_cublas"] is None else f"{r['ratio_to_cublas']:.2f}"
        flag = "" if r["correct"] else "  WRONG"
        shape = f"{r['m']}×{r['n']}×{r['k']}"
        print(f"{shape:>16s} {r['variant']:18s} {r['ms']:9.3f} "
              f"{r['gflops']:10.1f} {ratio:>8s} {r['max_rel_error']:8.1e}{flag}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON results file")
    parser.add_argument("--quick", action="store_true", help="only the book's 2048×2048×1024")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=11, help="timed samples (median)")
    parser.add_argument("--batch", type=int, default=5, help="launches per timed sample")
    parser.add_argument("--skip", nargs="*", default=[], help="variants to leave out")
    args = parser.parse_args(argv)

    cuda = require_gpu()
    import numba

    from mlsys_lab.kernels import cuda as kc

    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    cublas = CuBLAS()
    print(f"device: {name} (cc {device.compute_capability[0]}.{device.compute_capability[1]}), "
          f"numba {numba.__version__}, reference: {cublas.name or 'none (cuBLAS missing)'}")
    if not cublas.name:
        print("note: neither PyTorch nor CuPy is importable: numpy check only, no cuBLAS column")

    rows = []
    for shape in SHAPES[:1] if args.quick else SHAPES:
        rows += bench_shape(cuda, kc, cublas, shape, args)
    print_table(rows)

    results = dict(
        device=name,
        compute_capability=list(device.compute_capability),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        numba_version=numba.__version__,
        numba_cuda_version=_version("numba-cuda"),
        python=platform.python_version(),
        reference=cublas.name,
        timing=dict(warmup=args.warmup, repeats=args.repeats, batch=args.batch,
                    statistic="median of per-launch means, CUDA events"),
        rows=rows,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {args.out}")

    ours = [r for r in rows if r["variant"] != "cublas" and r["ratio_to_cublas"] is not None]
    if ours:
        best = max(ours, key=lambda r: r["ratio_to_cublas"])
        verdict = "meets" if best["ratio_to_cublas"] >= 0.9 else "misses"
        print(f"best: {best['variant']} at {best['m']}×{best['n']}×{best['k']}: "
              f"{best['ratio_to_cublas']:.2f}× cuBLAS ({verdict} the 0.9× target)")
    wrong = [f"{r['variant']} {r['m']}×{r['n']}×{r['k']}" for r in rows if not r["correct"]]
    if wrong:
        print("WRONG RESULTS: " + ", ".join(wrong), file=sys.stderr)
        return 1
    return 0


def _version(dist: str):
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
