"""Recommender-system costs (book chapter 13): sparse embedding updates, parameter-server
traffic, and a DLRM training step against PyTorch.

    python benchmarks/recsys.py [--quick] [--rounds 5]

Prints three tables:

1. **Sparse vs dense embedding update** for a 10^6 x 64 float32 table and a batch touching
   10^4 rows: an embedding bag's forward, its backward from a given cotangent
   (``y.backward(g)``) and an SGD step, once with ``sparse=True`` (the gradient is a RowSparse
   of the touched rows; about 2.5 MB of rows move) and once dense (a 256 MB gradient table is
   built and the whole table is read and written: about 0.75 GB). Target: sparse >= 100x
   faster. Every step takes the next of 32 batches of distinct ids, so it touches rows that
   are not in the caches, as a training step does; each contestant is timed in its steady
   state (blocks of 6 steps, the first of each dropped). Two floors run the same way, each on
   its own table: numpy's gather + scatter of the same rows (``W[ids] = W[ids]``), and our
   prefetching gather and SGD row kernels called directly, without the framework (no hash
   merge, no tape). A line times the sparse step right after a dense one, whose 256 MB of
   dirty cache lines it must first write back; the last runs the same two steps in PyTorch
   (``nn.EmbeddingBag(sparse=...)``, ``optim.SGD``) when torch is installed.
2. **Bytes moved per worker per step**: the DLRM's 8 tables of 10^5 x 16 on 4 row-sharded
   parameter servers, pulling and pushing only a batch's touched rows, against a ring
   all-reduce of the dense table gradients over 8 workers.
   A last table times each dense optimiser update alone on the 10^6 x 64 float32 table
   (4 x 10^5 rows, 100 MB per array, to spare the shared machine's memory; 10^5 with
   ``--quick``): the fused in-place pass of :mod:`mlsys_lab.kernels.optim` that ``optim.SGD``,
   ``Adam``, ``RMSProp`` and ``Adagrad`` run, against the numpy formula it replaced (the same
   float operations through parameter-sized temporaries; bit-identical results).
3. **DLRM training step** (13 dense -> 13-64-16 bottom MLP, 8 tables of 10^5 x 16, dot
   interaction, top MLP, batch 512; SparseAdam on the tables, Adam on the MLPs), ours against
   the same model in PyTorch (``nn.EmbeddingBag(mode="sum", sparse=True)``,
   ``torch.optim.SparseAdam`` + ``Adam``) when torch is installed. Target: ours <= 1.5x torch.

Contestants run interleaved (``timing.compare``), best of ``--rounds``; the load average is
printed next to the times because the machine is shared. BLAS (threadpoolctl) and torch both
run ``--threads`` threads (default 1: on a loaded 2-core machine a 2-thread OpenBLAS call on a
512 x 64 matrix waits milliseconds for its second thread).
"""

import argparse
import os

import numpy as np
from threadpoolctl import threadpool_limits

import mlsys_lab as ml
from mlsys_lab import recsys as rs
from mlsys_lab import timing
from mlsys_lab.engine.sparse import RowSparse
from mlsys_lab.kernels import embedding as embedding_kernels
from mlsys_lab.kernels import optim as optim_kernels


def load():
    return "load average %.2f %.2f %.2f" % os.getloadavg()


# --- 1. sparse vs dense embedding update ---------------------------------------------------------
class _Batches:
    """Calls ``fn(ids)`` with the next of a pool of id batches: each step touches new rows, as
    in training (the pool's rows, 32 x 10^4 x 256 B = 82 MB, do not fit in the caches)."""

    def __init__(self, pool, fn):
        self.pool, self.fn, self.k = pool, fn, 0

    def __call__(self):
        self.k = (self.k + 1) % len(self.pool)
        self.fn(self.pool[self.k])


def embedding_update(args):
    rows, dim, touched = (10 ** 5 if args.quick else 10 ** 6), 64, 10 ** 4
    rng = np.random.default_rng(0)
    pool = [rng.choice(rows, touched, replace=False) for _ in range(32)]
    offsets = np.arange(touched)
    g = ml.tensor(rng.standard_normal((touched, dim)).astype(np.float32))
    tables = {s: ml.nn.Parameter(rng.standard_normal((rows, dim)).astype(np.float32))
              for s in (True, False)}
    opts = {s: ml.optim.SGD([tables[s]], lr=1e-3) for s in (True, False)}

    def step(sparse, ids):
        w = tables[sparse]
        w.grad = None
        ml.ops.embedding_bag(w, ids, offsets, "sum", sparse).backward(g)
        opts[sparse].step()

    # each floor has its own table, so its rows are as cold as the sparse step's
    floor_w = [rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(2)]
    pooled = np.empty((touched, dim), np.float32)

    def numpy_floor(ids):  # the rows' gather and scatter alone, with numpy's fancy indexing
        floor_w[0][ids] = floor_w[0][ids]

    def kernels_alone(ids):  # our two kernels without the framework: gather, then the SGD rows
        embedding_kernels.embedding_bag_out(pooled, floor_w[1], ids, offsets, mode="sum",
                                            sparse=True)
        embedding_kernels.sgd_rows(floor_w[1], RowSparse(ids, g.numpy(), rows, unique=True),
                                   0.0)

    fns = {"dense": _Batches(pool, lambda ids: step(False, ids)),
           "sparse": _Batches(pool, lambda ids: step(True, ids)),
           "numpy": _Batches(pool, numpy_floor), "kernels": _Batches(pool, kernels_alone)}
    torch_step = torch_embedding_step(rows, dim, g.numpy(), offsets, args.threads)
    if torch_step is not None:
        for sparse in (False, True):
            fns[f"torch {'sparse' if sparse else 'dense'}"] = _Batches(
                pool, lambda ids, s=sparse: torch_step(s, ids))
    # each in its steady state: blocks of 6 steps, the first of each dropped (it inherits the
    # caches of whichever contestant ran before)
    res = timing.compare(fns, rounds=args.rounds, block=6, discard=1, baseline="dense")
    med = timing.Comparison(res.samples, "dense", "median")
    # and the sparse step right after a dense one: the caches hold the dense step's 256 MB of
    # dirty lines, which must be written back before the sparse step's rows come in
    after = timing.compare({"dense": fns["dense"], "sparse": fns["sparse"]},
                           rounds=args.rounds, baseline="dense")
    table = rows * dim * 4
    print(f"\n1. Embedding update: {rows:.0e} x {dim} float32 table, {touched} rows touched "
          f"(embedding_bag forward, backward of a given cotangent, SGD step), new rows every "
          f"step; best and median of {len(res.samples['dense'])} steady-state steps each; "
          f"{load()}")
    print(f"  {'':8}{'best ms':>10}{'median ms':>11}{'gradient':>12}{'update r+w':>13}")
    print(f"  {'dense':8}{res['dense'] * 1e3:>10.2f}{med['dense'] * 1e3:>11.2f}"
          f"{table / 1e6:>9.1f} MB{3 * table / 1e9:>10.2f} GB")
    print(f"  {'sparse':8}{res['sparse'] * 1e3:>10.3f}{med['sparse'] * 1e3:>11.3f}"
          f"{touched * dim * 4 / 1e6:>9.1f} MB{3 * touched * dim * 4 / 1e6:>10.2f} MB")
    print(f"  sparse speed-up: {res.speedup('sparse'):.0f}x best, {med.speedup('sparse'):.0f}x "
          f"median (target >= 100x)")
    print(f"  floor, same run (best): numpy W[ids] = W[ids] {res['numpy'] * 1e3:.3f} ms "
          f"(sparse step / it: {res['sparse'] / res['numpy']:.2f}x); our gather + SGD kernels "
          f"alone {res['kernels'] * 1e3:.3f} ms (sparse step / them: "
          f"{res['sparse'] / res['kernels']:.2f}x)")
    print(f"  a sparse step right after a dense one (caches full of its dirty lines): "
          f"{after['sparse'] * 1e3:.3f} ms, {after.speedup('sparse'):.0f}x")
    if torch_step is None:
        print("  torch is not installed: no PyTorch comparison")
        return
    print(f"  PyTorch, same steps (nn.EmbeddingBag, optim.SGD): dense "
          f"{res['torch dense'] * 1e3:.2f} ms, sparse {res['torch sparse'] * 1e3:.3f} ms, "
          f"sparse speed-up {res['torch dense'] / res['torch sparse']:.0f}x; ours / torch: "
          f"dense {res['dense'] / res['torch dense']:.2f}x, sparse "
          f"{res['sparse'] / res['torch sparse']:.2f}x")


def dense_optimiser_updates(args):
    """Each dense optimiser's update alone: the fused in-place pass against the numpy formula
    (``*_dense_reference``, parameter-sized temporaries), on the same arrays, interleaved."""
    rows, dim = (10 ** 5 if args.quick else 4 * 10 ** 5), 64
    rng = np.random.default_rng(1)
    p, g = (rng.standard_normal((rows, dim)).astype(np.float32) for _ in range(2))
    m, v = np.zeros_like(p), np.ones_like(p)
    k = optim_kernels
    updates = {  # name: (fused, numpy formula), each a step on the same p and state
        "SGD": (lambda: k.sgd_dense(p, g, 1e-6),
                lambda: p.__isub__(np.asarray(1e-6, p.dtype) * g)),
        "Adam": (lambda: k.adam_dense(p, g, m, v, 1e-6, 0.9, 0.999, 1e-8, 0.0, 10),
                 lambda: k.adam_dense_reference(p, g, m, v, 1e-6, 0.9, 0.999, 1e-8, 0.0, 10)),
        "RMSProp": (lambda: k.rmsprop_dense(p, g, v, 1e-6, 0.99, 1e-8, 0.0),
                    lambda: k.rmsprop_dense_reference(p, g, v, 1e-6, 0.99, 1e-8, 0.0)),
        "Adagrad": (lambda: k.adagrad_dense(p, g, v, 1e-6, 1e-10, 0.0),
                    lambda: k.adagrad_dense_reference(p, g, v, 1e-6, 1e-10, 0.0)),
    }
    print(f"\n   Dense optimiser update alone, {rows:.0e} x {dim} float32 "
          f"({p.nbytes / 1e6:.0f} MB per array), best of {args.rounds}; {load()}")
    print(f"  {'':9}{'fused ms':>10}{'numpy ms':>10}{'speed-up':>10}")
    for name, (fused, formula) in updates.items():
        res = timing.compare({"numpy": formula, "fused": fused}, rounds=args.rounds,
                             baseline="numpy")
        print(f"  {name:9}{res['fused'] * 1e3:>10.2f}{res['numpy'] * 1e3:>10.2f}"
              f"{res.speedup('fused'):>9.2f}x")


def torch_embedding_step(rows, dim, g, offsets, threads):
    """The same step in PyTorch: ``step(sparse, ids)`` runs an ``nn.EmbeddingBag`` forward,
    ``backward(g)`` and ``optim.SGD``; None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    bags = {s: torch.nn.EmbeddingBag(rows, dim, mode="sum", sparse=s) for s in (True, False)}
    opts = {s: torch.optim.SGD(bags[s].parameters(), lr=1e-3) for s in (True, False)}
    g, offsets = torch.from_numpy(g), torch.from_numpy(offsets)

    def step(sparse, ids):
        opts[sparse].zero_grad(set_to_none=True)
        bags[sparse](torch.from_numpy(ids), offsets).backward(g)
        opts[sparse].step()

    return step


# --- 2. bytes moved: sparse PS vs dense all-reduce ------------------------------------------------
def ps_bytes(args):
    sizes, dim, batch, servers, workers = [10 ** 5] * 8, 16, 512, 4, 8
    log = rs.synthetic_click_log(batch * 4, sizes, seed=1)
    tables = [np.zeros((n, dim), np.float32) for n in sizes]
    ps = rs.ShardedTables(tables, servers, "row")
    steps = 4
    touched = 0
    for b in range(steps):
        _, ids, _ = log.batch(np.arange(b * batch, (b + 1) * batch))
        for t, i in enumerate(ids):
            rows = ps.pull(t, i)
            touched += rows.nnz_rows
            ps.push(t, rs.sharding.RowSparse(rows.indices, np.ones_like(rows.values),
                                             sizes[t]), lr=0.0)
    sparse = (ps.bytes_pulled + ps.bytes_pushed) / steps
    dense = rs.dense_allreduce_bytes(sum(t.nbytes for t in tables), workers)
    total_rows = sum(sizes)
    print(f"\n2. Bytes per worker per step: DLRM tables 8 x 1e5 x {dim}, batch {batch}, "
          f"{servers} row-sharded servers vs ring all-reduce over {workers} workers")
    print(f"  rows touched per step: {touched / steps:.0f} of {total_rows} "
          f"({touched / steps / total_rows:.2%})")
    print(f"  {'sparse PS pull + push':<28}{sparse / 1e6:>10.3f} MB")
    print(f"  {'dense all-reduce':<28}{dense / 1e6:>10.3f} MB")
    print(f"  ratio: {dense / sparse:.0f}x fewer bytes")
    print(f"  per-server bytes {[round(b / steps / 1e3) for b in ps.server_bytes]} kB")


# --- 3. DLRM step vs PyTorch -------------------------------------------------------------------
def dlrm_step(args):
    sizes = [10 ** 4 if args.quick else 10 ** 5] * 8
    batch = 512
    log = rs.synthetic_click_log(batch, sizes, seed=2)
    dense, ids, labels = log.batch(np.arange(batch))
    model = rs.DLRM(sizes, dim=16, bottom=(64,), top=(64, 32), rng=0)
    lazy = ml.optim.SparseAdam(model.embedding_parameters(), lr=1e-3)
    adam = ml.optim.Adam(model.dense_parameters(), lr=1e-3)

    def ours():
        loss = rs.bce_with_logits(model(dense, ids), labels)
        model.zero_grad()
        loss.backward()
        lazy.step()
        adam.step()

    fns = {"mlsys_lab": ours}
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
        fns["torch"] = torch_dlrm(torch, model, dense, ids, labels)
    res = timing.compare(fns, rounds=args.rounds, warmup=2, baseline="torch" if torch else
                         "mlsys_lab")
    print(f"\n3. DLRM training step (batch {batch}, 8 tables x {sizes[0]:.0e} x 16, "
          f"SparseAdam + Adam); {load()}")
    for name in fns:
        print(f"  {name:<10}{res[name] * 1e3:>9.2f} ms")
    if torch is not None:
        print(f"  ours / torch: {res.ratio('mlsys_lab'):.2f}x (target <= 1.5x); torch threads "
              f"{torch.get_num_threads()}")
    else:
        print("  torch is not installed: no comparison")


def torch_dlrm(torch, model, dense, ids, labels):
    """The same DLRM in PyTorch, initialised with our weights; returns one training step."""
    nn = torch.nn

    def linear(ours):
        lin = nn.Linear(*ours.weight.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(ours.weight.numpy().T.copy()))
            lin.bias.copy_(torch.from_numpy(ours.bias.numpy()))
        return lin

    def seq(ours):
        return nn.Sequential(*[linear(m) if isinstance(m, ml.nn.Linear) else nn.ReLU()
                               for m in ours])

    bottom, top = seq(model.bottom), seq(model.top)
    tables = nn.ModuleList()
    for t in model.tables:
        e = nn.EmbeddingBag(*t.weight.shape, mode="sum", sparse=True)
        with torch.no_grad():
            e.weight.copy_(torch.from_numpy(t.weight.numpy()))
        tables.append(e)
    f = len(tables) + 1
    li, lj = np.tril_indices(f, k=-1)
    li, lj = torch.from_numpy(li), torch.from_numpy(lj)
    x_dense = torch.from_numpy(dense)
    x_ids = [torch.from_numpy(i) for i in ids]
    y = torch.from_numpy(labels)
    lazy = torch.optim.SparseAdam(list(tables.parameters()), lr=1e-3)
    adam = torch.optim.Adam(list(bottom.parameters()) + list(top.parameters()), lr=1e-3)

    def step():
        x = bottom(x_dense)
        z = torch.stack([x] + [t(i) for t, i in zip(tables, x_ids)], dim=1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, li, lj]
        logit = top(torch.cat([x, inter], dim=1)).reshape(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logit, y)
        lazy.zero_grad()
        adam.zero_grad()
        loss.backward()
        lazy.step()
        adam.step()

    return step


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller tables (a smoke test)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="BLAS and torch threads")
    args = parser.parse_args()
    print(f"mlsys_lab recsys benchmark; {args.threads} BLAS/torch thread(s); {load()}")
    with threadpool_limits(args.threads):
        embedding_update(args)
        dense_optimiser_updates(args)
        ps_bytes(args)
        dlrm_step(args)


if __name__ == "__main__":
    main()
