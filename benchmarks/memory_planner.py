"""Memory planners on real graphs: arena size against the lower bound and against no reuse.

    python benchmarks/memory_planner.py

For the training graphs (forward + backward + SGD update) and the inference graphs of an MLP, a
ResNet-style CNN and a transformer block, prints for each strategy the arena size, arena / lower
bound (target for `best`: <= 1.05), naive / arena (the saving from reuse) and the planning time.
Then times planning of a 2,000-node graph (target: < 0.5 s).
"""

import numpy as np

import mlsys_lab as ml
from mlsys_lab import ops, timing
from mlsys_lab.engine import memory
from mlsys_lab.engine.compiler import value_lifetimes
from mlsys_lab.nn import zoo
from mlsys_lab.nn.train_step import trace_train_step

STRATEGIES = [*memory.STRATEGIES, "best"]


def graphs():
    rng = np.random.default_rng(0)
    cases = [
        ("MLP 784-256-256-10", zoo.mlp(), rng.standard_normal((64, 784)).astype(np.float32),
         rng.integers(0, 10, 64)),
        ("ResNet-style CNN", zoo.resnet_cnn(channels=16, blocks=2, image=16),
         rng.standard_normal((16, 1, 16, 16)).astype(np.float32), rng.integers(0, 10, 16)),
        ("transformer block", zoo.TransformerClassifier(dim=64, heads=4, hidden=256),
         rng.standard_normal((8, 32, 64)).astype(np.float32), rng.integers(0, 10, 8)),
    ]
    for name, model, x, y in cases:
        yield f"{name} (train)", trace_train_step(model, ops.cross_entropy, x, y)
        model.eval()
        with ml.no_grad():
            yield f"{name} (infer)", ml.trace(lambda a, m=model: m(a), x)


def chain_graph(n):
    """A 2,000-node graph: a long chain of matmul/add/tanh with skip connections."""
    w = np.eye(32, dtype=np.float32)

    def f(x):
        keep = [x]
        for _ in range(n // 4):
            x = ops.tanh(x @ w + keep[max(0, len(keep) - 3)])
            x = x * 0.5
            keep.append(x)
        return x

    return ml.trace(f, np.ones((64, 32), np.float32))


def main():
    print(f"{'graph':<30}{'nodes':>6}  {'strategy':<22}{'arena KiB':>10}{'arena/LB':>10}"
          f"{'naive/arena':>12}{'plan ms':>9}")
    worst_best = 0.0
    for name, g in graphs():
        recs, _ = value_lifetimes(g, list(g.nodes))
        lb = memory.lower_bound(recs, 64)
        naive = memory.naive_size(recs, 64)
        for s in STRATEGIES:
            p, dt = timing.timed(memory.plan, recs, s)
            memory.verify(p, recs)
            ratio = p.arena_size / lb
            if s == "best":
                worst_best = max(worst_best, ratio)
            print(f"{name:<30}{len(g.nodes):>6}  {p.strategy:<22}{p.arena_size / 1024:>10.1f}"
                  f"{ratio:>10.3f}{naive / p.arena_size:>11.2f}x{dt * 1e3:>9.1f}")
        print()
    print(f"worst best/lower-bound over all graphs: {worst_best:.3f} (target <= 1.05)")
    g = chain_graph(2000)
    recs, _ = value_lifetimes(g, list(g.nodes))
    for s in STRATEGIES:
        _, dt = timing.timed(memory.plan, recs, s)
        print(f"2,000-node graph ({len(g.nodes)} nodes, {len(recs)} tensors): {s:<18} "
              f"{dt * 1e3:7.1f} ms (target < 500 ms)")


if __name__ == "__main__":
    main()
