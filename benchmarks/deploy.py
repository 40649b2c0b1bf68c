"""Model deployment (book ch. 10), side by side in one run:

    python benchmarks/deploy.py [--quick] [--targets native haswell] [--sections 1 2 3] [--all]

1. The chapter's CNN (conv-BN-ReLU-pool x 2, dropout, linear) and MLP 64-64-64-10, trained on
   digits, exported to ONNX at batch 1 and 32: onnxruntime vs mlsys_lab's compiled executor on
   the same file (``deploy_onnx.onnx_vs_compiled``). Target: compiled within 2x of onnxruntime on
   the MLP at batch 32.
2. int8 vs float32 GEMM kernel of the same loop nest, and numpy's float32 BLAS, on one core, with
   each rate's share of the core's float32 peak (``deploy_compress.kernel_section``), once per
   Numba target: ``native`` and ``haswell`` (AVX2 only, as a Zen 3 has it: no VNNI). Target:
   int8 >= 1.5x the float32 kernel.
3. BN folding: the chapter CNN compiled unfolded vs folded (``deploy_compress.bn_section``).

``--all`` adds the compression sections of ``deploy_compress.py`` (size, accuracy of PTQ / QAT,
pruning, CSR vs dense, distillation, obfuscation) and the light ONNX zoo of
``deploy_onnx.py``; each of those scripts also runs on its own. Timings on a shared machine are
noisy: the ratios measured in the same run are what count (the load average is printed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import numba
import numpy as np
from threadpoolctl import threadpool_limits

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.data.datasets import load_digits
from mlsys_lab.deploy.compress import distill as D

TARGET_ENV = {"native": {}, "haswell": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "",
                                        "OPENBLAS_CORETYPE": "Haswell"}}


# --- the chapter's data and models (shared by deploy_compress.py) --------------------------------
def digits(flat=True):
    """scikit-learn's digits in a fixed shuffle: 1400 to train, 397 to test."""
    x, y = load_digits(flat)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    if not flat:
        x = x[:, None]
    return x[:1400], y[:1400], x[1400:1797], y[1400:1797]


def mlp(seed=0, hidden=64):
    """The chapter's MLP 64-hidden-hidden-10."""
    return nn.Sequential(nn.Linear(64, hidden, rng=seed), nn.ReLU(),
                         nn.Linear(hidden, hidden, rng=seed + 1), nn.ReLU(),
                         nn.Linear(hidden, 10, rng=seed + 2))


def cnn(seed=0):
    """The chapter's CNN: conv-BN-ReLU-pool twice, dropout, linear (1x8x8 digits)."""
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, rng=seed), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, rng=seed + 1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.2), nn.Linear(64, 10, rng=seed + 2))


def trained(model, x, y, epochs):
    D.train(model, ml.optim.Adam(model.parameters(), lr=1e-2), x, y, epochs=epochs)
    return model.eval()


def load_note():
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


# --- sections -------------------------------------------------------------------------------------
def models_section(models, rounds):
    import deploy_onnx as DO  # noqa: E402 - the sibling script (benchmarks/ is sys.path[0])

    print(f"== 1. chapter models: onnxruntime vs mlsys_lab compiled, one thread each "
          f"({load_note()}) ==")
    print(DO.MODELS_HEADER)
    ratios = {}
    for name, (model, shape) in models.items():
        for batch in (1, 32):
            x = np.random.default_rng(batch).uniform(0, 1, (batch,) + shape).astype(np.float32)
            result = DO.onnx_vs_compiled(name, model, x, rounds, threads=1)
            ratios[(name, batch)] = result.ratio("ml compiled")
    r = ratios[("MLP 64-64-64-10", 32)]
    print(f"MLP at batch 32: compiled / onnxruntime = {r:.2f}x (target <= 2x: "
          f"{'met' if r <= 2 else 'NOT met'})")


def run_kernel_targets(targets, quick):
    for target in targets:
        print(f"\n== 2. int8 vs float32 GEMM kernel, same loops and shapes [{target}] ==")
        env = {k: v for k, v in os.environ.items() if k not in TARGET_ENV["haswell"]}
        env.update(TARGET_ENV[target])
        # compile in the child: code loaded from Numba's disk cache has no assembly to inspect,
        # and the section prints the instructions of the int8 loop
        env["MLSYS_LAB_NUMBA_CACHE"] = "0"
        args = [sys.executable, __file__, "--kernels-only"] + (["--quick"] if quick else [])
        sys.stdout.flush()
        subprocess.run(args, env=env, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer rounds")
    parser.add_argument("--targets", nargs="+", default=["native", "haswell"],
                        choices=sorted(TARGET_ENV))
    parser.add_argument("--all", action="store_true",
                        help="also the compression sections and the light ONNX zoo")
    parser.add_argument("--sections", nargs="+", type=int, default=[1, 2, 3], choices=[1, 2, 3],
                        help="which numbered sections to run (default all three)")
    parser.add_argument("--kernels-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import deploy_compress as DC  # noqa: E402 - the sibling script

    rounds = 3 if args.quick else 7
    if args.kernels_only:
        DC.kernel_section(DC.kernel_shapes(args.quick), rounds)
        return
    numba.set_num_threads(1)
    with threadpool_limits(1):
        xtr, ytr, xte, _ = digits(flat=False)
        c = trained(cnn(), xtr, ytr, epochs=2)
        m = trained(mlp(), xtr.reshape(len(xtr), -1), ytr, epochs=5)
        if 1 in args.sections:
            models_section({"CNN (chapter) 1x8x8": (c, (1, 8, 8)),
                            "MLP 64-64-64-10": (m, (64,))},
                           max(rounds, 10) if not args.quick else 5)
    if 2 in args.sections:
        run_kernel_targets(args.targets, args.quick)
    numba.set_num_threads(1)
    with threadpool_limits(1):
        if 3 in args.sections:
            DC.bn_section(c, xte[:32], rounds, title="== 3. BN folding: the chapter CNN, batch "
                                                     "32, compiled (default pipeline) ==")
    if args.all:
        print("\n==== the sections of benchmarks/deploy_compress.py (numbered as there) ====")
        DC.compression_sections(args.quick, rounds)
        import deploy_onnx as DO  # noqa: E402

        DO.bench_zoo(argparse.Namespace(quick=args.quick, rounds=20, threads=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
