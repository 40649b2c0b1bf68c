"""Tiled (FlashAttention-style) attention against exact attention and PyTorch, and its memory.

    python benchmarks/llm_attention.py                 # L = 2048, d = 64, 8 heads, batch 1
    python benchmarks/llm_attention.py --haswell       # ... and again with AVX2 code only
    python benchmarks/llm_attention.py --quick         # L = 512, fewer repeats
    python benchmarks/llm_attention.py --gpu           # the CUDA kernel, on a real GPU

Rows (causal, float32):

* ``forward`` and ``forward+backward``: the tiled Numba kernels (:mod:`mlsys_lab.kernels.attention`)
  against the exact numpy path (scores, softmax and products as whole L × L arrays on BLAS; its
  backward from the saved probabilities) — target ≥ 2× — and against PyTorch CPU's
  ``scaled_dot_product_attention`` (a vectorised flash kernel in C++; target ≥ 0.5×) when
  ``import torch`` works. Best of ``--repeats`` runs, the contenders interleaved so a busy
  machine slows them alike, each after a short rest so that none pays for the previous one's
  spinning threads; every contender's answer is checked against the tiled one.
* ``peak working memory`` at L = 8192: the memory planner's peak for the compiled graph, kernel
  workspaces included, leaving out q, k, v and the output: the op on the tiled kernel (its
  declared workspace) against the same attention written as matmul / softmax / matmul (the
  L × L intermediates the planner sees). Target for the tiled kernel: ≤ 1/50 of one head's
  float32 L × L (268 MB).

``--haswell`` re-runs the timing rows in a subprocess with ``NUMBA_CPU_NAME=haswell
NUMBA_CPU_FEATURES=`` (Numba emits AVX2 + FMA code only, the code a Zen 3 gets) and
``OPENBLAS_CORETYPE=Haswell`` (the tile products' BLAS, and the exact path's, on AVX2 too;
PyTorch's kernels choose their own ISA). ``--gpu`` times
:mod:`mlsys_lab.kernels.attention_cuda` on a real GPU and writes
``benchmarks/results/gpu_attention.json`` (device, date, numba version, rows: the format of
:mod:`mlsys_lab.kernels.gpu_results`); it exits 2 without one.

``attention_rows()`` is what ``benchmarks/llm.py`` calls; it prints the table and returns the
rows as dicts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a plain checkout, too

# OPENBLAS_CORETYPE: the kernels' tile products run on OpenBLAS, which picks its own code from
# the CPU; Haswell's is the AVX2 + FMA code a Zen 3 gets.
HASWELL = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "", "OPENBLAS_CORETYPE": "Haswell"}
GPU_OUT = ROOT / "benchmarks" / "results" / "gpu_attention.json"
MEMORY_LENGTH = 8192


# --------------------------------------------------------------------------------------------
# The exact numpy path
# --------------------------------------------------------------------------------------------


def exact_forward(q, k, v, scale):
    """Causal attention with whole L × L arrays (BLAS products); returns (out, p)."""
    s = np.matmul(q, np.swapaxes(k, -1, -2))
    s *= scale
    L, S = s.shape[-2:]
    s[..., ~np.tril(np.ones((L, S), bool))] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return np.matmul(s, v), s


def exact_backward(g, q, k, v, out, p, scale):
    """The dense backward from the saved probabilities ``p``: (dq, dk, dv)."""
    dv = np.matmul(np.swapaxes(p, -1, -2), g)
    dp = np.matmul(g, np.swapaxes(v, -1, -2))
    dp -= np.sum(g * out, axis=-1, keepdims=True)
    dp *= p
    dq = np.matmul(dp, k) * scale
    dk = np.matmul(np.swapaxes(dp, -1, -2), q) * scale
    return dq, dk, dv


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _contenders(q, k, v, g, scale):
    """name -> (forward fn, forward+backward fn), each returning (out, grads or None)."""
    from mlsys_lab.kernels import attention

    def tiled_fwd():
        return attention.attention_forward(q, k, v, is_causal=True, scale=scale)[0], None

    def tiled_fb():
        out, lse = attention.attention_forward(q, k, v, is_causal=True, scale=scale)
        return out, attention.attention_backward(g, q, k, v, out, lse, is_causal=True,
                                                 scale=scale)

    def exact_fwd():
        return exact_forward(q, k, v, scale)[0], None

    def exact_fb():
        out, p = exact_forward(q, k, v, scale)
        return out, exact_backward(g, q, k, v, out, p, scale)

    found = {"tiled (numba)": (tiled_fwd, tiled_fb), "exact (numpy)": (exact_fwd, exact_fb)}
    torch = _torch()
    if torch is not None:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        tq, tk, tv, tg = (torch.from_numpy(a) for a in (q, k, v, g))

        def torch_fwd():
            with torch.no_grad():
                return sdpa(tq, tk, tv, is_causal=True, scale=scale).numpy(), None

        def torch_fb():
            xs = [t.detach().clone().requires_grad_() for t in (tq, tk, tv)]
            out = sdpa(*xs, is_causal=True, scale=scale)
            out.backward(tg)
            return out.detach().numpy(), tuple(x.grad.numpy() for x in xs)

        found[f"torch {torch.__version__} (threads {torch.get_num_threads()})"] = (torch_fwd,
                                                                                 torch_fb)
    return found


#: Seconds of rest before each timed call: the previous contender's thread pool must go idle
#: first (OpenBLAS's threads spin for a while after a call and take the cores from whatever
#: runs next: the tiled forward measured 65 ms alone, 101-112 ms right after the exact path,
#: 67 ms after a 0.2 s rest).
PAUSE = 0.25


def _best_of(fns, repeats):
    """Best wall time per function, the functions interleaved, each after a rest (``PAUSE``);
    plus each one's last result."""
    best = {name: math.inf for name in fns}
    results = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(PAUSE)
            t0 = time.perf_counter()
            results[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best, results


def _check(results, reference_name):
    """Largest difference of each contender's output (and gradients) from the reference's."""
    ref_out, ref_grads = results[reference_name]
    errors = {}
    for name, (out, grads) in results.items():
        err = float(np.abs(out - ref_out).max())
        if grads is not None and ref_grads is not None:
            err = max(err, *(float(np.abs(a - b).max() / max(1.0, np.abs(b).max()))
                             for a, b in zip(grads, ref_grads)))
        errors[name] = err
    return errors


def timing_rows(length=2048, heads=8, d=64, batch=1, repeats=5, seed=0):
    """The forward and forward+backward rows: seconds and ratios per contender."""
    import numba

    from mlsys_lab.kernels import attention

    rng = np.random.default_rng(seed)
    q, k, v, g = (rng.standard_normal((batch, heads, length, d)).astype(np.float32)
                  for _ in range(4))
    scale = 1.0 / math.sqrt(d)
    contenders = _contenders(q, k, v, g, scale)
    for fwd, fb in contenders.values():  # compile / warm up outside the clock
        fwd()
        fb()
    rows = []
    blocks = attention.fitted_blocks(d, d, length, length, np.float32)
    target = os.environ.get("NUMBA_CPU_NAME") or "native"
    for what, index in (("forward", 0), ("forward+backward", 1)):
        best, results = _best_of({n: fns[index] for n, fns in contenders.items()}, repeats)
        errors = _check(results, "tiled (numba)")
        tiled = best["tiled (numba)"]
        for name, seconds in best.items():
            rows.append({
                "row": what, "contender": name, "target": target, "length": length,
                "heads": heads, "d": d, "ms": round(seconds * 1e3, 2),
                "tiled_speedup": round(seconds / tiled, 2),
                "max_diff": errors[name], "numba_threads": numba.get_num_threads(),
                "blocks": f"Br={blocks.br} Bc={blocks.bc}",
            })
    return rows


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------


def planned_peak(f, *examples):
    """The planner's peak for ``f`` compiled on the CPU (passes, selection, the plan), kernel
    workspaces included and the graph's outputs left out (inputs are never in the plan). Nothing
    is run or allocated: tracing reads the examples' shapes only."""
    import mlsys_lab as ml
    from mlsys_lab.engine import memory
    from mlsys_lab.engine.compiler import value_lifetimes
    from mlsys_lab.engine.passes import default_pipeline, run_pipeline
    from mlsys_lab.engine.selection import select

    g = select(run_pipeline(ml.trace(f, *examples), default_pipeline()).graph, "cpu")
    records, _ = value_lifetimes(g, list(g.nodes))
    outputs = set(g.outputs)
    working = [r for r in records if r.id not in outputs]
    workspace = sum(r.size for r in working if isinstance(r.id, memory.Workspace))
    return memory.plan(working, "best").arena_size, workspace, g


def memory_rows(length=MEMORY_LENGTH, heads=8, d=64, batch=1):
    """Peak working memory (bytes) of the tiled op and of the composed exact form."""
    from mlsys_lab import ops
    from mlsys_lab.engine.ops_attention import attention_weights
    aval = np.broadcast_to(np.float32(0), (batch, heads, length, d))  # shape only, no memory
    scale = 1.0 / math.sqrt(d)

    def tiled(q, k, v):
        return ops.scaled_dot_product_attention(q, k, v, is_causal=True)

    def composed(q, k, v):
        return ops.matmul(attention_weights(q, k, is_causal=True, scale=scale), v)

    one_head = length * length * 4
    rows = []
    for name, f in (("tiled op (numba.flash_attention)", tiled),
                    ("matmul/softmax/matmul (exact)", composed)):
        peak, workspace, g = planned_peak(f, aval, aval, aval)
        kernels = sorted({n.meta["kernel"].name for n in g.nodes})
        rows.append({"row": f"peak working memory, L={length}", "contender": name,
                     "bytes": int(peak), "workspace_bytes": int(workspace),
                     "fraction_of_one_head_LxL": round(peak / one_head, 5),
                     "kernels": ", ".join(kernels)})
    return rows


# --------------------------------------------------------------------------------------------
# Printing and the entry points
# --------------------------------------------------------------------------------------------


def print_rows(rows):
    timed = [r for r in rows if "ms" in r]
    if timed:
        r0 = timed[0]
        print(f"causal attention, float32, batch 1, {r0['heads']} heads, L = {r0['length']}, "
              f"d = {r0['d']}; Numba target {r0['target']}, {r0['numba_threads']} threads, "
              f"tiles {r0['blocks']}; best of the interleaved runs")
        print(f"  {'row':<18}{'contender':<34}{'ms':>10}{'t / tiled':>11}{'max diff':>11}")
        for r in timed:
            print(f"  {r['row']:<18}{r['contender']:<34}{r['ms']:>10.1f}"
                  f"{r['tiled_speedup']:>10.2f}x{r['max_diff']:>11.1e}")
    for r in (r for r in rows if "bytes" in r):
        print(f"  {r['row']}: {r['contender']:<34}{r['bytes'] / 2**20:>10.2f} MiB "
              f"(workspace {r['workspace_bytes'] / 2**20:.2f} MiB; "
              f"{r['fraction_of_one_head_LxL']:.4f} of one head's L×L; {r['kernels']})")


def attention_rows(length=2048, heads=8, d=64, repeats=5, memory_length=MEMORY_LENGTH,
                   quiet=False):
    """Timing rows (forward, forward+backward) and memory rows; printed unless ``quiet``.

    Returns:
        A list of dicts: timing rows have ``row``, ``contender``, ``ms``, ``tiled_speedup``
        (the contender's time over the tiled kernel's), ``max_diff``; memory rows have
        ``bytes``, ``workspace_bytes`` and ``fraction_of_one_head_LxL``.
    """
    rows = timing_rows(length, heads, d, repeats=repeats)
    if memory_length:
        rows += memory_rows(memory_length, heads, d)
    if not quiet:
        print_rows(rows)
    return rows


def run_haswell(args):
    """This script again, timing rows only, with Numba limited to AVX2 + FMA."""
    env = dict(os.environ, **HASWELL)
    cmd = [sys.executable, __file__, "--length", str(args.length), "--repeats",
           str(args.repeats), "--no-memory"]
    subprocess.run(cmd, env=env, check=True)


def run_gpu(args):
    """Time the CUDA forward on a real GPU and write GPU_OUT; exit 2 without a GPU."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        print("llm_attention --gpu: the CUDA simulator is on; timings would mean nothing",
              file=sys.stderr)
        raise SystemExit(2)
    from numba import cuda

    if not cuda.is_available():
        print("llm_attention --gpu: no CUDA GPU found", file=sys.stderr)
        raise SystemExit(2)
    result = time_gpu(args.length, args.repeats)
    GPU_OUT.parent.mkdir(parents=True, exist_ok=True)
    GPU_OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def time_gpu(length, repeats, heads=8, d=64):
    """The causal forward of ``heads`` heads of ``length`` x ``d`` on the GPU: median time of
    ``repeats`` launches (CUDA events, after one that compiles), the largest difference from
    the CPU tiled kernel, as the results file's dict. Under the simulator too (the tests run
    it there; its times mean nothing)."""
    import numba
    from numba import cuda

    from mlsys_lab.kernels import attention, attention_cuda

    rng = np.random.default_rng(0)
    shape = (1, heads, length, d)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    dq, dk, dv = (cuda.to_device(a) for a in (q, k, v))
    out, _ = attention_cuda.attention_forward(dq, dk, dv, is_causal=True)  # compile, warm up
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        out, _ = attention_cuda.attention_forward(dq, dk, dv, is_causal=True)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    ref, _ = attention.attention_forward(q, k, v, is_causal=True)
    name = getattr(cuda.get_current_device(), "name", "Numba's CUDA simulator")
    return {
        "device": name.decode() if isinstance(name, bytes) else str(name),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "numba_version": numba.__version__, "host": platform.node(),
        "rows": [{"variant": "flash_forward_causal", "length": length, "heads": heads, "d": d,
                  "ms": float(np.median(times)),
                  "max_abs_error": float(np.abs(out.copy_to_host() - ref).max())}],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="L = 512, 3 repeats, memory at 2048")
    parser.add_argument("--haswell", action="store_true", help="also run with AVX2 code only")
    parser.add_argument("--no-memory", action="store_true", help="timing rows only")
    parser.add_argument("--gpu", action="store_true", help="time the CUDA kernel on a real GPU")
    args = parser.parse_args(argv)
    if args.quick:
        args.length, args.repeats = 512, 3
    if args.gpu:
        run_gpu(args)
        return
    attention_rows(args.length, repeats=args.repeats,
                   memory_length=0 if args.no_memory else (2048 if args.quick else MEMORY_LENGTH))
    if args.haswell:
        print()
        run_haswell(args)


if __name__ == "__main__":
    main()
