"""Training large models (book chapter 19): what activation recomputation buys and costs.

    python benchmarks/large_models.py [--quick] [--rounds 5] [--threads 1]

Each section is a function returning printable rows, so further sections (FSDP, the 3-D
parallel planner) can sit beside it.

``recompute_rows`` — a 64-layer MLP (``relu(h @ W + b)`` per layer, width 320, batch 512,
float32, loss = mean of squares), trained on the eager tape with three schedules:

* **none** — every activation kept (the plain tape);
* **sqrt(n)** — Chen et al.: ``ml.recompute`` over segments of ceil(sqrt(64)) = 8 layers, the
  last layer of each segment kept;
* **optimal** — ``optimal_schedule``'s choice (the least recomputation whose peak fits the
  stated budget of 16 layers' activations, a quarter of keeping them all), same mechanism.

Peak activation memory is the memory planner's: the traced training graph (``grad_graph``) is
transformed by ``recompute_pass`` with the same saved layers, and ``peak_memory(...,
outputs=False)`` gives the most bytes live at one step among its intermediates other than the
gradients it returns (the activations and backward temporaries; ``plan``'s arena beside it).
The chain model's peak (``chain_peak``, in layers' activations) is printed too, against the
target "sqrt(n) peak <= 2 sqrt(n) layers' worth plus one segment".

Step time (forward + backward) is best-of-``--rounds``, all six contestants interleaved
(``timing.compare``), with one BLAS thread (``--threads``: on a small shared machine BLAS
threads that spin between calls make interleaved timings erratic), on two paths: **graph**
runs the transformed training graphs in the interpreter (the schedule exactly: the layers
not saved are computed twice), **tape** runs ``tape_step`` with ``ml.recompute`` per segment
(``torch.utils.checkpoint``'s semantics: a segment's last, kept layer runs again in the
replay too, so any schedule recomputes all n layers). The extra time is against no
recomputation on the same path, beside the book's 30-40 % (one more forward pass is about a
third of a step whose backward costs twice its forward).

Columns: layers recomputed and peak in layers' activations (the chain model), the planner's
peak and arena (MiB), then ms and extra time per path.
"""

import argparse
import math

import numpy as np

import mlsys_lab as ml
from mlsys_lab import timing
from mlsys_lab.engine.ops_nn import manual_seed
from mlsys_lab.engine.passes import recompute as R

BOOK_EXTRA = (30, 40)  # % extra time for recomputation the book quotes


def _mlp(n, width, batch, seed=0):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((width, width)) * math.sqrt(2 / width)).astype(np.float32)
          for _ in range(n)]
    bs = [np.zeros(width, np.float32) for _ in range(n)]
    x = rng.standard_normal((batch, width)).astype(np.float32)
    return ws, bs, x


def _layers(h, params):
    for w, b in params:
        h = ml.ops.relu(h @ w + b)
    return h


def _segments(saved):
    """Layer ranges [start, end) between saved layers (each range ends at a saved layer)."""
    out, start = [], 0
    for c in saved:
        out.append((start, c + 1))
        start = c + 1
    return out


def tape_step(params, x, saved=None):
    """One forward + backward on the tape; ``saved``: recompute between these layers."""
    for w, b in params:
        w.grad = b.grad = None
    h = ml.tensor(x)
    if saved is None:
        h = _layers(h, params)
    else:
        for start, end in _segments(saved):
            if end - start == 1:  # a saved layer alone: nothing inside to recompute
                h = _layers(h, params[start:end])
            else:
                h = ml.recompute(_layers, h, params[start:end])
    loss = (h * h).mean()
    loss.backward()
    return loss


def training_graph(ws, bs, x):
    """The traced training graph (loss and every parameter's gradient) and, per layer, the
    node producing its output (the activation the backward pass reads)."""
    def loss(x, *p):
        return (_layers(x, list(zip(p[0::2], p[1::2]))) ** 2).mean()

    flat = [a for wb in zip(ws, bs) for a in wb]
    g = ml.grad_graph(ml.trace(loss, x, *flat), wrt=tuple(range(1, len(flat) + 1)))
    forward = R.forward_nodes(g)
    outs = [nd for nd in g.nodes if nd.op == "relu" and nd.id in forward]
    return g, outs


def recompute_rows(n=64, width=320, batch=512, budget_layers=16, rounds=5, threads=1):
    """Peak activation memory (planner) and step time for no recomputation, sqrt(n) and the
    optimal schedule at ``budget_layers`` layers' activations, timed with ``threads`` BLAS
    threads; returns (header, rows)."""
    ws, bs, x = _mlp(n, width, batch)
    flat = [a for wb in zip(ws, bs) for a in wb]
    params = [(ml.tensor(w, requires_grad=True), ml.tensor(b, requires_grad=True))
              for w, b in zip(ws, bs)]
    layer_bytes = batch * width * 4
    sizes, costs = [layer_bytes] * n, [1.0] * n  # equal layers: cost in layers recomputed
    chen = R.sqrt_schedule(n, sizes, costs)
    best = R.optimal_schedule(sizes, costs, budget_layers * layer_bytes)
    schedules = {"none": None, f"sqrt(n): {len(chen.saved)} kept": chen.saved,
                 f"optimal @ {budget_layers}: {len(best.saved)} kept": best.saved}

    g, outs = training_graph(ws, bs, x)
    ref = [a.numpy() for a in g(x, *flat)]
    graphs, memory = {}, {}
    for label, saved in schedules.items():
        g2 = g if saved is None else R.recompute_pass(g, [outs[i].id for i in saved])
        got = [a.numpy() for a in g2(x, *flat)]
        assert all(np.array_equal(a, b) for a, b in zip(ref, got)), "gradients differ"
        graphs[label] = g2
        kept = range(n) if saved is None else saved
        memory[label] = (*R.peak_memory(g2, outputs=False), R.chain_peak([1] * n, kept),
                         R.chain_cost([1] * n, kept))

    manual_seed(0)
    steps = {}
    for label, saved in schedules.items():
        steps[("graph", label)] = lambda g2=graphs[label]: g2(x, *flat)
        steps[("tape", label)] = lambda s=saved: tape_step(params, x, s)
    with ml.limit_threads(blas=threads):
        times = timing.compare(steps, rounds=rounds, baseline=("graph", "none"))
    rows = []
    for label in schedules:
        peak, arena, model, cost = memory[label]
        row = [label, cost, model, peak / 2**20, arena / 2**20]
        for path in ("graph", "tape"):
            t, t0 = times[(path, label)], times[(path, "none")]
            row += [t * 1e3, "" if label == "none" else f"{100 * (t / t0 - 1):+.0f} %"]
        rows.append(tuple(row))
    bound = 2 * math.sqrt(n) + math.ceil(math.sqrt(n))
    header = (f"Activation recomputation: {n}-layer MLP, width {width}, batch {batch}, float32, "
              f"{threads} BLAS thread{'s' if threads != 1 else ''} "
              f"(one layer's activation {layer_bytes / 2**20:.2f} MiB); book: "
              f"+{BOOK_EXTRA[0]}-{BOOK_EXTRA[1]} % time; target: sqrt(n) peak <= 2 sqrt(n) + "
              f"one segment = {bound:g} layers")
    return header, rows


def print_recompute(header, rows):
    print(header)
    print(f"{'schedule':<22}{'recomp.':>8}{'model':>7}{'peak MiB':>10}{'arena MiB':>10}"
          f"{'graph ms':>10}{'extra':>8}{'tape ms':>9}{'extra':>8}")
    print(f"{'':<22}{'layers':>8}{'layers':>7}")
    for label, cost, model, peak, arena, gms, gx, tms, tx in rows:
        print(f"{label:<22}{cost:>8g}{model:>7g}{peak:>10.2f}{arena:>10.2f}{gms:>10.1f}{gx:>8}"
              f"{tms:>9.1f}{tx:>8}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 layers, width 64, 2 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads while timing")
    args = parser.parse_args()
    if args.quick:
        print_recompute(*recompute_rows(n=16, width=64, batch=64, budget_layers=8, rounds=2,
                                        threads=args.threads))
    else:
        print_recompute(*recompute_rows(rounds=args.rounds, threads=args.threads))


if __name__ == "__main__":
    main()
