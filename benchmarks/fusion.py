"""Elementwise fusion: a 5-op chain on 10^6 float32 values, unfused vs one generated Numba loop.

    python benchmarks/fusion.py [--size 1000000] [--repeats 50]

The chain is ``tanh(relu(x * a + b)) * c``. "unfused" runs the ops one at a time with numpy, as
the graph interpreter does (each op a full pass over memory and a fresh temporary); "fused" runs
the ``fused_elementwise`` node's Numba kernel, compiled once and warmed up before timing. Also
shown: the same two graphs run node by node through the interpreter's machinery
(``run_graph``). Prints the median of ``--repeats`` runs and the speed-up (target: >= 2x).
"""

import argparse
import statistics
import time

import numpy as np

import mlsys_lab as ml
from mlsys_lab.engine.passes import fuse_elementwise
from mlsys_lab.engine.passes.fusion import fused_elementwise_numba
from mlsys_lab.engine.passes.testing import run_graph

A, B, C = np.float32(1.5), np.float32(0.25), np.float32(0.5)


def chain(x):
    return ml.ops.tanh(ml.ops.relu(x * A + B)) * C


def numpy_chain(x):
    t = np.multiply(x, A)
    t = np.add(t, B)
    t = np.maximum(t, 0)
    t = np.tanh(t)
    return np.multiply(t, C)


def median_ms(fn, repeats):
    fn()  # warm-up (and, for Numba, compilation)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10**6)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    x = np.random.default_rng(0).standard_normal(args.size).astype(np.float32)

    graph = ml.trace(chain, x)
    fused = fuse_elementwise(graph)
    (node,) = fused.nodes
    inputs = [fused.consts.get(v, x) for v in node.inputs]
    program = node.attrs["program"]
    np.testing.assert_allclose(fused_elementwise_numba(*inputs, program=program),
                               numpy_chain(x), rtol=1e-5, atol=1e-6)

    rows = [
        ("unfused: numpy, one op at a time", median_ms(lambda: numpy_chain(x), args.repeats)),
        ("fused: generated Numba kernel",
         median_ms(lambda: fused_elementwise_numba(*inputs, program=program), args.repeats)),
        (f"unfused graph ({len(graph.nodes)} nodes), run_graph",
         median_ms(lambda: run_graph(graph, x), args.repeats)),
        (f"fused graph ({len(fused.nodes)} node), run_graph cpu-numba",
         median_ms(lambda: run_graph(fused, x, device="cpu-numba"), args.repeats)),
    ]
    print(f"tanh(relu(x*a + b)) * c on {args.size:,} float32 values, median of "
          f"{args.repeats} runs")
    for name, ms in rows:
        print(f"  {name:<45} {ms:8.3f} ms")
    print(f"  speed-up, fused kernel vs unfused numpy:     {rows[0][1] / rows[1][1]:8.2f}x "
          f"(target >= 2x)")
    print(f"  speed-up, fused graph vs unfused graph:      {rows[2][1] / rows[3][1]:8.2f}x")


if __name__ == "__main__":
    main()
