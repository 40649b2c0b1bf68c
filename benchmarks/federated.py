"""Federated learning (book chapter 14): a 1,000-client round on the simulator, accuracy on
non-IID digits against centralised training, local DP, then the cryptography tables.

    python benchmarks/federated.py [--quick]

Prints:

1. **1,000 simulated clients, 10 % sampled per round** — the digits MLP (64-32-10, float32,
   2,410 parameters: 9.6 kB on the wire), IID data (1.4 samples per client), FedAvg with one
   local epoch, ``Fleet.device_cloud(1000)`` (phones: ~2 GFLOP/s, ~2 Mbit/s uplinks, 50–300 ms,
   10 % stragglers 10x slower, 10 % drop-outs) and a 20 s deadline. Real seconds per round
   (median of the rounds; target <= 2 s on 2 cores) split into local training (vectorised over
   the sampled clients) and the rest (simulator, aggregation), simulated seconds per round
   (the deadline when a client dropped out) and when the last upload arrived, bytes up and
   down, the clients completed / dropped / late; then the same with over-selection (the round
   closes at the first 80 % of uploads). Baseline measured in the same run: the same
   round's local training one client at a time (100 calls) — the ratio is what vectorising
   over clients buys. A second fleet without drop-outs and no deadline shows the straggler
   setting the pace.
2. **Accuracy after R rounds vs centralised** — 20 clients, half sampled per round, 5 local
   epochs of SGD (batch 10, lr 0.1), R = 30 rounds; IID and Dirichlet label skew
   alpha = 100, 1, 0.1; FedAvg, FedProx (mu = 0.1) and FedAvgM (server momentum 0.5). The
   reference: centralised SGD for 20 epochs on the same data and initial model. Test accuracy
   on the held-out 20 % and its ratio to the centralised model's.
3. **Local DP** — Gaussian noise on clipped updates (clip 0.5; noise std = multiplier x clip)
   for 10 and 100 IID clients (all sampled, 15 rounds, 5 local epochs): test accuracy vs the
   noise multiplier. Without noise 10 clients win (more data each); with noise 100 clients
   win, since the average of n uploads keeps 1/sqrt(n) of the noise.
4. The rows of ``benchmarks/federated_crypto.py``'s ``main()`` (secure aggregation, PSI,
   Paillier), when that file is present.

Times are single runs / medians on a shared 2-core machine (the load average is printed).
"""

import argparse
import importlib.util
import os
import sys
import time

import numpy as np

from mlsys_lab import federated as fl

HERE = os.path.dirname(os.path.abspath(__file__))


def thousand_clients(rounds):
    x, y, xt, yt = fl.load_digits(dtype=np.float32)
    parts = fl.partition.iid(len(y), 1000, seed=0)
    data = fl.ClientData(x, y, parts)
    p0 = fl.model.init_mlp((64, 32, 10), seed=0, dtype=np.float32)
    print(f"\n## 1. 1,000 simulated clients, 10 % sampled (digits MLP, "
          f"{fl.model.num_params(p0)} parameters, {rounds} rounds)")
    print("| fleet | real s/round | of which training | sim s/round | last upload at | "
          "completed / dropped / late | kB up | kB down |")
    print("|---|---|---|---|---|---|---|---|")
    fleets = [("device-cloud, 10 % drop-out, deadline 20 s", fl.Fleet.device_cloud(1000), 20.0,
               None),
              ("same, closing at the first 80 % of uploads", fl.Fleet.device_cloud(1000), 20.0,
               0.8),
              ("device-cloud, no drop-out, no deadline",
               fl.Fleet.device_cloud(1000, drop_prob=0.0), None, None)]
    train_share = None
    for name, fleet, deadline, accept in fleets:
        server = fl.Server(fl.FedAvg(fraction_fit=0.1, local_epochs=1, batch_size=10, lr=0.1),
                           data, p0, fleet=fleet, deadline=deadline, seed=0, accept=accept)
        server.round()                                             # warm-up (first dispatch)
        train_times, recs = [], []
        for _ in range(rounds):
            sampled = fl.FedAvg(fraction_fit=0.1).configure_fit(
                0, p0, 1000, np.random.default_rng(len(recs)))
            t = time.perf_counter()
            fl.training.local_sgd(server.parameters, x, y, [parts[i.cid] for i in sampled],
                                  epochs=1, batch_size=10, lr=0.1)
            train_times.append(time.perf_counter() - t)
            recs.append(server.round())
        wall = float(np.median([r.wall for r in recs]))
        train = float(np.median(train_times))
        train_share = train_share or train
        print(f"| {name} | {wall:.3f} | {train:.3f} | "
              f"{np.median([r.sim_time for r in recs]):.2f} | "
              f"{np.median([r.last_arrival for r in recs]):.2f} | "
              f"{np.mean([len(r.completed) for r in recs]):.1f} / "
              f"{np.mean([len(r.dropped) for r in recs]):.1f} / "
              f"{np.mean([len(r.late) for r in recs]):.1f} | "
              f"{np.mean([r.bytes_up for r in recs]) / 1e3:.0f} | "
              f"{np.mean([r.bytes_down for r in recs]) / 1e3:.0f} |")
        print(f"  real s/round vs the 2 s target: {wall / 2.0:.3f}x")
    sampled = [parts[i] for i in np.random.default_rng(0).choice(1000, 100, replace=False)]
    t = time.perf_counter()
    for part in sampled:
        fl.training.local_sgd(p0, x, y, [part], epochs=1, batch_size=10, lr=0.1)
    loop = time.perf_counter() - t
    t = time.perf_counter()
    fl.training.local_sgd(p0, x, y, sampled, epochs=1, batch_size=10, lr=0.1)
    vec = time.perf_counter() - t
    print(f"  baseline: 100 clients' local training one by one {loop:.3f} s, vectorised "
          f"{vec:.3f} s: {loop / vec:.1f}x")


def accuracy_table(rounds, quick):
    x, y, xt, yt = fl.load_digits(dtype=np.float32)
    p0 = fl.model.init_mlp((64, 32, 10), seed=0, dtype=np.float32)
    t = time.perf_counter()
    central = fl.model.accuracy(fl.centralised(p0, x, y, epochs=20, batch_size=10, lr=0.1),
                                xt, yt)
    t_central = time.perf_counter() - t
    print(f"\n## 2. Accuracy after {rounds} rounds vs centralised (20 clients, 10 per round, "
          f"5 local epochs)")
    print(f"centralised SGD, 20 epochs: test accuracy {central:.4f} ({t_central:.1f} s)")
    print("| partition | strategy | test accuracy | vs centralised | real s (all rounds) |")
    print("|---|---|---|---|---|")
    partitions = [("IID", fl.partition.iid(len(y), 20, seed=0))]
    alphas = (0.1,) if quick else (100.0, 1.0, 0.1)
    partitions += [(f"Dirichlet alpha={a:g}", fl.partition.dirichlet(y, 20, alpha=a, seed=0))
                   for a in alphas]
    strategies = [("FedAvg", lambda **k: fl.FedAvg(**k)),
                  ("FedProx mu=0.1", lambda **k: fl.FedProx(mu=0.1, **k)),
                  ("FedAvgM 0.5", lambda **k: fl.FedAvgM(server_lr=1.0, momentum=0.5, **k))]
    for pname, parts in partitions:
        for sname, make in strategies:
            server = fl.Server(make(fraction_fit=0.5, local_epochs=5, batch_size=10, lr=0.1),
                               fl.ClientData(x, y, parts), p0, seed=0)
            t = time.perf_counter()
            server.fit(rounds)
            acc = fl.model.accuracy(server.parameters, xt, yt)
            print(f"| {pname} | {sname} | {acc:.4f} | {acc / central:.3f} | "
                  f"{time.perf_counter() - t:.2f} |")


def local_dp_table(quick):
    x, y, xt, yt = fl.load_digits(dtype=np.float32)
    p0 = fl.model.init_mlp((64, 32, 10), seed=0, dtype=np.float32)
    noises = (0.0, 1.0) if quick else (0.0, 0.5, 1.0, 2.0)
    counts = (10, 100)
    print("\n## 3. Local DP: accuracy vs noise multiplier vs clients (Gaussian, clip 0.5, "
          "15 rounds, all clients, 5 local epochs)")
    print("| noise multiplier | " + " | ".join(f"{n} clients" for n in counts) + " |")
    print("|---|" + "---|" * len(counts))
    for noise in noises:
        row = []
        for n in counts:
            server = fl.Server(fl.FedAvg(local_epochs=5, batch_size=10, lr=0.1),
                               fl.ClientData(x, y, fl.partition.iid(len(y), n, seed=0)), p0,
                               seed=0, update_transform=fl.privacy.LocalDP(
                                   "gaussian", clip=0.5, noise=noise))
            server.fit(15)
            row.append(f"{fl.model.accuracy(server.parameters, xt, yt):.4f}")
        print(f"| {noise:g} | " + " | ".join(row) + " |")


def crypto_tables(quick):
    path = os.path.join(HERE, "federated_crypto.py")
    if not os.path.exists(path):
        print("\n(benchmarks/federated_crypto.py is not there: no cryptography tables)")
        return
    spec = importlib.util.spec_from_file_location("federated_crypto", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    print()
    module.main(quick=quick)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and cases")
    args = parser.parse_args()
    print("# Federated learning (chapter 14)")
    print("load average %.2f %.2f %.2f" % os.getloadavg(), "| python", sys.version.split()[0])
    thousand_clients(3 if args.quick else 10)
    accuracy_table(10 if args.quick else 30, args.quick)
    local_dp_table(args.quick)
    crypto_tables(args.quick)


if __name__ == "__main__":
    main()
