"""Elementwise fusion: a 5-op chain on 10^6 float32 values, unfused vs one generated Numba loop.

    python benchmarks/fusion.py [--size 1000000] [--repeats 50] [--dtype float32]

The chain is ``tanh(relu(x * a + b)) * c``. "unfused" runs the ops one at a time with numpy's
ufuncs, as the graph interpreter does (each op a full pass over memory and a fresh temporary);
"fused" runs the ``fused_elementwise`` node's Numba kernel (one loop, vectorised: its tanh is
plain arithmetic, within 1 ulp of the correctly rounded value), compiled once and warmed up
before timing. Also shown: the same two graphs run node by node through the interpreter's
machinery (``run_graph``). The four are timed interleaved (one run of each in turn, so drift in
the machine's speed hits all alike); prints the median of ``--repeats`` rounds, the largest
difference between fused and unfused results in ulps, and the speed-up (target for float32:
>= 2x; ``--dtype float64`` shows the float64 kernels, whose tanh is vectorised the same way).
"""

import argparse

import numpy as np

import mlsys_lab as ml
from mlsys_lab import timing
from mlsys_lab.engine.dtypes import ulp_distance
from mlsys_lab.engine.passes import fuse_elementwise
from mlsys_lab.engine.passes.fusion import fused_elementwise_numba
from mlsys_lab.engine.runtime import run_graph


def numpy_chain(x, a, b, c):
    t = np.multiply(x, a)
    t = np.add(t, b)
    t = np.maximum(t, 0)
    t = np.tanh(t)
    return np.multiply(t, c)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=10**6)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    args = parser.parse_args()
    dt = np.dtype(args.dtype)
    x = np.random.default_rng(0).standard_normal(args.size).astype(dt)
    a, b, c = dt.type(1.5), dt.type(0.25), dt.type(0.5)

    graph = ml.trace(lambda v: ml.ops.tanh(ml.ops.relu(v * a + b)) * c, x)
    fused = fuse_elementwise(graph)
    (node,) = fused.nodes
    inputs = [fused.consts.get(v, x) for v in node.inputs]
    program = node.attrs["program"]
    ulps = ulp_distance(fused_elementwise_numba(*inputs, program=program),
                        numpy_chain(x, a, b, c)).max()
    assert ulps <= 2, f"fused result is {ulps} ulp from numpy's"

    names = ["unfused: numpy, one op at a time", "fused: generated Numba kernel",
             f"unfused graph ({len(graph.nodes)} nodes), run_graph",
             f"fused graph ({len(fused.nodes)} node), run_graph cpu-numba"]
    fns = [lambda: numpy_chain(x, a, b, c),
           lambda: fused_elementwise_numba(*inputs, program=program),  # warm-up compiles it
           lambda: run_graph(graph, x),
           lambda: run_graph(fused, x, device="cpu-numba")]
    result = timing.compare(dict(zip(names, fns)), rounds=args.repeats, stat="median")
    ms = [1e3 * result[name] for name in names]
    print(f"tanh(relu(x*a + b)) * c on {args.size:,} {dt.name} values, median of "
          f"{args.repeats} interleaved runs; fused vs numpy: at most {ulps:.0f} ulp apart")
    for name, t in zip(names, ms):
        print(f"  {name:<45} {t:8.3f} ms")
    target = " (target >= 2x)" if dt == np.float32 else ""
    print(f"  speed-up, fused kernel vs unfused numpy:     {ms[0] / ms[1]:8.2f}x{target}")
    print(f"  speed-up, fused graph vs unfused graph:      {ms[2] / ms[3]:8.2f}x")


if __name__ == "__main__":
    main()
