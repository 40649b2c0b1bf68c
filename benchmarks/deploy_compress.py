"""Model compression for deployment (book ch. 10), side by side in one run:

    python benchmarks/deploy_compress.py [--quick] [--targets native haswell]

The sections of ``benchmarks/deploy.py`` that go beyond its summary table; the data, the
chapter's models and the per-target kernel runs come from there. ``deploy.py --all`` runs these
sections too.

1. int8 vs float32 GEMM: the Numba dot-product kernel in int8 (int32 accumulator) and in float32
   (the same loops), the int8 kernel with its requantisation epilogue, and numpy's float32 BLAS,
   on one core; each rate as a share of the core's float32 peak (the best single-thread BLAS rate
   seen, n = 1024 or the shapes measured) and the instructions LLVM chose for the int8 loop.
   ``--targets haswell`` re-runs this section with Numba limited to AVX2
   (``NUMBA_CPU_NAME=haswell``): the code a Zen 3 gets, no VNNI.
   Target: int8 >= 1.5x the float32 kernel.
2. BN folding: the chapter's conv-BN-ReLU CNN compiled unfolded vs folded (interleaved timing,
   max error).
3. Size: bytes of the float32 and int8 weights (int8 = 1/4) and of the whole int8 graph.
4. Accuracy on scikit-learn's digits: float32, int8 PTQ (min-max, percentile, KL), 4/3/2-bit
   weight PTQ with and without bias correction, 4- and 2-bit QAT; latency of the int8 graph vs
   the float32 one.
5. Pruning: accuracy vs sparsity (magnitude, before and after fine-tuning), channel pruning, and
   the CSR kernel vs dense at each density (where sparse starts to win).
6. Distillation (student with vs without the teacher) and the obfuscated model's output error.

Timings on a shared machine are noisy: the ratios measured in the same run are what count.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

import numba
import numpy as np
from threadpoolctl import threadpool_limits

import mlsys_lab as ml
from mlsys_lab import nn, timing
from mlsys_lab.deploy import obfuscate as O
from mlsys_lab.deploy import passes as P
from mlsys_lab.deploy import quant as Q
from mlsys_lab.deploy.compress import distill as D
from mlsys_lab.deploy.compress import prune as PR
from mlsys_lab.deploy.quant import int8_kernels as K
from mlsys_lab.kernels import roofline

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deploy import TARGET_ENV, cnn, digits, mlp, run_kernel_targets  # noqa: E402 - shared

PAUSE = 0.05
TARGET_INT8 = 1.5


# --- 1. kernels ---------------------------------------------------------------------------------
def loop_instructions():
    """The SIMD instructions in the compiled int8 dot-product loop, counted."""
    found = Counter()
    for asm in K._int8_dot.inspect_asm().values():
        found.update(re.findall(r"\b(vpdpbusd|vpdpwssd|vpmaddwd|vpmaddubsw|vpmulld)\b", asm))
    return ", ".join(f"{n}x {op}" for op, n in found.most_common()) or "scalar code"


def kernel_section(shapes, rounds):
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    with threadpool_limits(1):
        peak = roofline.measure_peak_flops(seconds=0.5, n=1024) / 2  # MAC/s of one core
        rows = []
        for m, k, n in shapes:
            a8 = rng.integers(0, 256, (m, k)).astype(np.uint8)
            b8 = rng.integers(-127, 128, (n, k)).astype(np.int8)
            af, bf = a8.astype(np.float32), b8.astype(np.float32)
            bfk = np.ascontiguousarray(bf.T)
            w_sum = b8.sum(1, dtype=np.int64).astype(np.int32)
            bias, w_zp = np.zeros(n, np.int32), np.zeros(n, np.int8)
            ws = np.full(n, 0.01)
            fns = {"float32 (Numba)": lambda: K.float32_matmul(af, bf),
                   "int8 (Numba)": lambda: K.int8_matmul(a8, b8),
                   "int8 + requant": lambda: K.qgemm(a8, b8, w_sum, 0.02, 3, ws, w_zp, 0.5, 128,
                                                      bias, None, np.uint8),
                   "numpy f32 BLAS": lambda: af @ bfk}
            exact = a8.astype(np.int64) @ b8.T.astype(np.int64)
            assert np.array_equal(K.int8_matmul(a8, b8), exact)
            times = timing.compare(fns, rounds=rounds, pause=PAUSE)
            rows.append(((m, k, n), times))
            peak = max(peak, m * k * n / times["numpy f32 BLAS"])
    print(f"one core ({os.getloadavg()[0]:.1f} load average on {os.cpu_count()} CPUs); float32 "
          f"peak = the best single-thread BLAS rate seen (n=1024 or below): {peak / 1e9:.1f} "
          f"GMAC/s; Numba target {numba.config.CPU_NAME or 'host'}; int8 loop: "
          f"{loop_instructions()}")
    print(f"{'M x K x N':<18}{'kernel':<18}{'ms':>9}{'GMAC/s':>9}{'% f32 peak':>11}"
          f"{'vs f32 Numba':>13}{'vs BLAS':>9}")
    ratios = []
    for (m, k, n), t in rows:
        for name, sec in t.times.items():
            rate = m * k * n / sec
            print(f"{f'{m} x {k} x {n}':<18}{name:<18}{sec * 1e3:>9.3f}{rate / 1e9:>9.1f}"
                  f"{rate / peak * 100:>10.0f}%{t['float32 (Numba)'] / sec:>12.2f}x"
                  f"{t['numpy f32 BLAS'] / sec:>8.2f}x")
        ratios.append(t["float32 (Numba)"] / t["int8 (Numba)"])
    print("(an int8 MAC through vpmaddwd has twice the lanes of a float32 FMA, so the int8 "
          "roof is ~2x the float32 peak; VNNI's vpdpbusd would make it 4x)")
    verdict = "met" if min(ratios) >= TARGET_INT8 else "NOT met"
    print(f"int8 / float32 Numba speed-up: {', '.join(f'{r:.2f}x' for r in ratios)} "
          f"(target >= {TARGET_INT8}x: {verdict} on every shape)")


# --- data and models: digits, mlp, cnn from deploy.py ---------------------------------------
def accuracy_of(run, x, y, batch):
    return float(np.mean(P.run_batched(run, x, batch).argmax(1) == y))


# --- 2. BN folding ------------------------------------------------------------------------------
def bn_section(model, x, rounds, title="== 2. BN folding: the chapter CNN, batch 32, compiled "
                                       "(default pipeline) =="):
    print("\n" + title)
    model.eval()
    graph = ml.trace(model, x)
    folded = P.fold_batch_norm(graph)
    base = ml.compile(graph, x)
    fold = ml.compile(folded, x)
    t = timing.compare({"unfolded": lambda: base(x, profile=False),
                        "folded": lambda: fold(x, profile=False)}, rounds=rounds, pause=PAUSE)
    err = np.abs(np.asarray(base(x)) - np.asarray(fold(x))).max()
    saved = 100 * (1 - t["folded"] / t["unfolded"])
    print(f"unfolded {len(graph.nodes)} nodes -> {len(base.graph.nodes)} compiled: "
          f"{t['unfolded'] * 1e3:.3f} ms")
    print(f"folded   {len(folded.nodes)} nodes -> {len(fold.graph.nodes)} compiled: "
          f"{t['folded'] * 1e3:.3f} ms   ({t.speedup('folded'):.2f}x, {saved:.1f} % less time)")
    print(f"max |folded - unfolded| = {err:.2e} (float32)")


# --- 3 + 4. quantisation --------------------------------------------------------------------
def size_rows(name, graph, int8):
    f32 = sum(a.nbytes for a in graph.consts.values() if a.dtype == np.float32 and a.ndim >= 2)
    i8 = sum(a.nbytes for a in int8.consts.values() if a.dtype == np.int8 and a.ndim >= 2)
    print(f"{name:<6} weights float32 {f32:>8,} B   int8 {i8:>7,} B   ratio {i8 / f32:.3f}   "
          f"whole graph {Q.model_bytes(graph):>8,} B -> {Q.model_bytes(int8):>7,} B "
          f"({Q.model_bytes(int8) / Q.model_bytes(graph):.3f}, scales and int32 biases "
          f"included)")


def quant_section(epochs, rounds):
    xtr, ytr, xte, yte = digits()
    batch = 397
    model = mlp()
    D.train(model, ml.optim.Adam(model.parameters(), lr=1e-2), xtr, ytr, epochs=epochs)
    graph = P.to_inference(model, xte, passes=P.inference_pipeline(fuse=False)).graph
    calib = [xtr[i:i + batch] for i in range(0, 1191, batch)]
    results, int8_graphs = {}, {}
    results["float32"] = accuracy_of(graph, xte, yte, batch)
    for method in ("minmax", "percentile", "kl"):
        qdq = Q.quantize_static(graph, Q.calibrate(graph, calib, method))
        int8_graphs[method] = K.lower_qdq(qdq)
        results[f"int8 PTQ {method}"] = accuracy_of(int8_graphs[method], xte, yte, batch)
    cal = Q.calibrate(graph, calib)
    for bits in (4, 3, 2):
        for bc in (False, True):
            qdq = Q.quantize_static(graph, cal, weight_bits=bits, act_bits=8, bias_correction=bc)
            key = f"{bits}-bit weights PTQ" + (" + bias corr." if bc else "")
            results[key] = accuracy_of(qdq, xte, yte, batch)
    for bits in (4, 2):
        student = mlp()
        student.load_state_dict(model.state_dict())
        qat = Q.prepare_qat(student, weight_bits=bits, act_bits=8)
        D.train(qat, ml.optim.Adam(qat.parameters(), lr=2e-3), xtr, ytr,
                epochs=max(2, epochs // 3))
        qat_int8 = K.lower_qdq(Q.qat_to_qdq(qat, xte))
        results[f"{bits}-bit weights QAT (int8 kernels)"] = accuracy_of(qat_int8, xte, yte,
                                                                        batch)

    print("\n== 3. size: MLP 64-64-64-10 and the conv net ==")
    size_rows("MLP", graph, int8_graphs["minmax"])
    x_img = digits(flat=False)
    c = cnn()
    D.train(c, ml.optim.Adam(c.parameters(), lr=1e-2), x_img[0], x_img[1], epochs=1)
    c_graph = P.to_inference(c, x_img[2][:32], passes=P.inference_pipeline(fuse=False)).graph
    c_int8 = K.lower_qdq(Q.quantize_static(c_graph, Q.calibrate(c_graph, [x_img[0][:32]])))
    size_rows("CNN", c_graph, c_int8)
    print("(1-bit weights would be 1/32 of float32)")

    print("\n== 4. accuracy on digits (397 test images) ==")
    for name, acc in results.items():
        print(f"{name:<40}{acc * 100:6.1f} %")
    latency_rows("MLP 64-64-64-10, batch 397", graph, int8_graphs["minmax"], xte, rounds)
    wide = mlp(hidden=1024)
    xw = np.random.default_rng(0).uniform(0, 1, (256, 64)).astype(np.float32)
    w_graph = P.to_inference(wide, xw, passes=P.inference_pipeline(fuse=False)).graph
    w_int8 = K.lower_qdq(Q.quantize_static(w_graph, Q.calibrate(w_graph, [xw])))
    latency_rows("MLP 64-1024-1024-10, batch 256", w_graph, w_int8, xw, rounds)
    return model, (xtr, ytr, xte, yte)


def latency_rows(name, graph, int8, x, rounds):
    f32c = ml.compile(graph, x)
    i8c = ml.compile(int8, x, passes=None)
    t = timing.compare({"float32": lambda: f32c(x, profile=False),
                        "int8": lambda: i8c(x, profile=False)}, rounds=rounds, pause=PAUSE)
    print(f"latency {name:<32} float32 (BLAS, fused) {t['float32'] * 1e3:7.3f} ms   int8 "
          f"{t['int8'] * 1e3:7.3f} ms   ({t.speedup('int8'):.2f}x)")


# --- 5. pruning -----------------------------------------------------------------------------
def prune_section(model, data, epochs):
    xtr, ytr, xte, yte = data
    print("\n== 5. pruning the MLP: accuracy vs sparsity (global magnitude) ==")
    print(f"{'sparsity':>9}{'pruned':>9}{'fine-tuned':>12}")
    for s in (0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98):
        m = mlp()
        m.load_state_dict(model.state_dict())
        masks = PR.magnitude_masks(m, s)
        PR.apply_masks(m, masks)
        before = D.accuracy(m, xte, yte)
        opt = ml.optim.Adam(m.parameters(), lr=3e-3)

        def batches():
            return [(xtr[i:i + 64], ytr[i:i + 64]) for i in range(0, 1400, 64)]
        PR.fine_tune(m, ml.ops.cross_entropy, opt, batches, masks, epochs=max(1, epochs // 3))
        print(f"{s * 100:>8.0f}%{before * 100:>8.1f}%{D.accuracy(m, xte, yte) * 100:>11.1f}%")
    small = PR.prune_channels(PR.prune_channels(model, 0, 0.5), 2, 0.5)
    before = D.accuracy(small, xte, yte)
    D.train(small, ml.optim.Adam(small.parameters(), lr=3e-3), xtr, ytr, epochs=max(1, epochs // 3))
    print(f"channel pruning 64-64 -> 32-32 hidden units ({small.num_parameters()} of "
          f"{model.num_parameters()} parameters): {before * 100:.1f} % -> fine-tuned "
          f"{D.accuracy(small, xte, yte) * 100:.1f} %")


def csr_section(m, k, n, rounds):
    print(f"\n== 5b. CSR sparse x dense ({m} x {k} @ {k} x {n}, float32, one core) ==")
    numba.set_num_threads(1)
    b = np.random.default_rng(1).standard_normal((k, n)).astype(np.float32)
    bt = np.ascontiguousarray(b.T)
    print(f"{'density':>8}{'CSR ms':>9}{'dense Numba ms':>16}{'BLAS ms':>9}{'CSR vs Numba':>14}"
          f"{'CSR vs BLAS':>13}")
    crossover, densities = {}, (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)
    with threadpool_limits(1):
        for density in densities:
            a = PR.random_sparse((m, k), density, 0)
            csr = PR.CSRMatrix.from_dense(a)
            assert np.allclose(PR.csr_matmul(csr, b), a @ b, rtol=1e-3, atol=1e-3)
            t = timing.compare({"csr": lambda: PR.csr_matmul(csr, b),
                                "numba": lambda: K.float32_matmul(a, bt),
                                "blas": lambda: a @ b}, rounds=rounds, pause=PAUSE)
            for other in ("numba", "blas"):
                if t[other] > t["csr"]:
                    crossover[other] = density
            print(f"{density * 100:>7.1f}%{t['csr'] * 1e3:>9.3f}{t['numba'] * 1e3:>16.3f}"
                  f"{t['blas'] * 1e3:>9.3f}{t['numba'] / t['csr']:>13.2f}x"
                  f"{t['blas'] / t['csr']:>12.2f}x")
    for other, name in (("numba", "the dense Numba kernel"), ("blas", "BLAS")):
        if other not in crossover:
            where = "at none of these densities"
        elif crossover[other] == densities[-1]:
            where = f"at every density measured (up to {densities[-1] * 100:g} %)"
        else:
            where = f"up to about {crossover[other] * 100:g} % density"
        print(f"CSR beats {name} {where}")


# --- 6. distillation and obfuscation -------------------------------------------------------------
def distill_section(data, epochs, seeds):
    xtr, ytr, xte, yte = data
    print("\n== 6. distillation: student 64-16-10 on 300 labelled digits, teacher 64-256-256-10 "
          "on 1400 ==")
    teacher = nn.Sequential(nn.Linear(64, 256, rng=0), nn.ReLU(), nn.Linear(256, 256, rng=1),
                            nn.ReLU(), nn.Linear(256, 10, rng=2))
    D.train(teacher, ml.optim.Adam(teacher.parameters(), lr=1e-3), xtr, ytr, epochs=epochs)
    print(f"teacher: {D.accuracy(teacher, xte, yte) * 100:.1f} %")
    for label, kwargs in (("without teacher", {}),
                          ("with teacher (T=4, lambda=1, x T^2)",
                           dict(teacher=teacher, temperature=4.0, lam=1.0, tau_squared=True))):
        accs = []
        for seed in range(seeds):
            s = nn.Sequential(nn.Linear(64, 16, rng=10 + seed), nn.ReLU(),
                              nn.Linear(16, 10, rng=20 + seed))
            D.train(s, ml.optim.Adam(s.parameters(), lr=3e-3), xtr[:300], ytr[:300],
                    epochs=60, batch=32, seed=seed, **kwargs)
            accs.append(D.accuracy(s, xte, yte))
        print(f"student {label:<38}{np.mean(accs) * 100:6.1f} % (mean of {seeds} seeds: "
              f"{', '.join(f'{a * 100:.1f}' for a in accs)})")


def obfuscation_section(model, xte):
    scrambled, key = O.obfuscate(model, seed=1)
    want, got = model(ml.tensor(xte)).numpy(), scrambled(ml.tensor(xte)).numpy()
    moved = np.mean([not np.array_equal(a.numpy(), b.numpy())
                     for a, b in zip(model.parameters(), scrambled.parameters())])
    print(f"\nobfuscated MLP: {moved * 100:.0f} % of the parameter tensors changed, max |output "
          f"difference| {np.abs(got - want).max():.2e} (float32), same predictions: "
          f"{bool(np.all(got.argmax(1) == want.argmax(1)))}")


def kernel_shapes(quick):
    return [(128, 512, 512), (64, 1024, 1024)] if quick else \
        [(256, 512, 512), (128, 1024, 1024), (64, 2048, 1024)]


def compression_sections(quick, rounds):
    """Sections 3-6 (size, accuracy, pruning, CSR, distillation, obfuscation) on one core."""
    numba.set_num_threads(1)
    epochs = 6 if quick else 15
    with threadpool_limits(1):
        model, data = quant_section(epochs, rounds)
        prune_section(model, data, epochs)
    csr_section(256, 1024, 256, rounds)
    with threadpool_limits(1):
        distill_section(data, epochs, 2 if quick else 3)
        obfuscation_section(model, data[2])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer rounds")
    parser.add_argument("--targets", nargs="+", default=["native", "haswell"],
                        choices=sorted(TARGET_ENV))
    args = parser.parse_args()
    rounds = 3 if args.quick else 7
    run_kernel_targets(args.targets, args.quick)
    numba.set_num_threads(1)
    with threadpool_limits(1):
        x_img = digits(flat=False)
        c = cnn()
        D.train(c, ml.optim.Adam(c.parameters(), lr=1e-2), x_img[0], x_img[1], epochs=1)
        bn_section(c, x_img[2][:32], rounds)
    compression_sections(args.quick, rounds)


if __name__ == "__main__":
    main()
