"""The cryptography of federated learning (book chapter 14): what secure aggregation costs a
client against the plain upload, and how fast PSI and Paillier run at the chapter's key sizes.

    python benchmarks/federated_crypto.py [--quick]

``benchmarks/federated.py`` calls ``main()``; it also runs on its own. Prints:

1. **Secure aggregation** (Bonawitz et al. 2017, ``federated.crypto.secure_agg``) of the
   digits MLP's update (64-32-10: 2,410 parameters, fixed point in Z_2^32, 4 bytes each, so
   the masked vector is the size of a float32 upload), n clients, threshold ⌈2n/3⌉, 10 % of
   them dropping after sharing keys (their masks rebuilt from Shamir shares): per client the
   messages, bytes sent and received against the plain upload's 9,640 bytes, and the wall
   seconds of the whole protocol per client and of the server's unmasking; with the toy
   256-bit group for n = 10, 30, 60 and RFC 3526's 2048-bit group for n = 10 (20 in the full
   run). The unmasked sum is checked against the plain sum (bit-exact) in every run.
2. **PSI** (RSA blind signatures, ``federated.crypto.psi``) at 512 and 1024 bits: signatures
   per second (A's side, CRT), blind + unblind per second (B's side), and a whole 1,000 × 1,000
   id intersection.
3. **Paillier** at 512 (the chapter's) and 1024 bits: encryptions, decryptions (CRT),
   ciphertext additions and plaintext multiplications (by a 32-bit scalar) per second.
4. **Vertical logistic regression** (``federated.vertical``): seconds per encrypted gradient
   step for N samples and 10 + 10 features (seeded Gaussian data), against the plaintext step,
   and the largest weight difference from the float64 model after 3 steps.

Times are best-of-3 on a shared 2-core machine; pure-Python big-integer arithmetic, one core.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time

import numpy as np

from mlsys_lab.federated import vertical
from mlsys_lab.federated.crypto import dh, paillier, prg, psi, rsa
from mlsys_lab.federated.crypto import secure_agg as sa

DIM = 64 * 32 + 32 + 32 * 10 + 10  # the digits MLP 64-32-10


def _best(fn, repeat=3):
    best, out = math.inf, None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _rate(fn, count, repeat=3):
    seconds, _ = _best(fn, repeat)
    return count / seconds


def secure_aggregation_rows(sizes):
    print("\n## Secure aggregation: cost per client vs the plain upload "
          f"(d = {DIM} parameters, Z_2^32, 10 % drop after sharing)")
    print(f"{'group':<10} {'n':>4} {'t':>4} {'msgs':>5} {'sent B':>9} {'recv B':>9} "
          f"{'sent/plain':>10} {'s/client':>9} {'server s':>9}  exact")
    rng = np.random.default_rng(0)
    for group, n in sizes:
        t = math.ceil(2 * n / 3)
        updates = {u: rng.normal(scale=0.05, size=DIM) for u in range(1, n + 1)}
        inputs = {u: prg.encode_fixed(v, 16, 32) for u, v in updates.items()}
        dropped = list(range(1, n + 1))[:max(1, n // 10)]
        params = sa.SecAggParams(t, 32, group)
        res = sa.secure_aggregate(inputs, params, drop_before_upload=dropped, rng=n)
        plain = [sum(int(inputs[u][i]) for u in res.included) % 2 ** 32 for i in range(DIM)]
        exact = [int(v) for v in res.total] == plain
        c = res.cost[res.included[0]]
        name = "toy-256" if group is dh.TOY_256 else "modp-2048"
        print(f"{name:<10} {n:>4} {t:>4} {c.total_messages:>5} {c.total_sent:>9,} "
              f"{c.total_received:>9,} {c.total_sent / res.plain_bytes:>10.2f} "
              f"{res.seconds['clients'] / n:>9.3f} {res.seconds['server']:>9.3f}  {exact}")
    print(f"plain upload: 1 message, {sa.plain_upload_bytes(DIM):,} B (float32)")


def psi_rows(bits_list, items):
    print(f"\n## PSI by RSA blind signatures ({items:,} x {items:,} ids, half in common)")
    print(f"{'bits':>5} {'sign/s (A)':>11} {'blind+unblind/s (B)':>20} {'whole PSI s':>12} "
          f"{'bytes':>10}  exact")
    for bits in bits_list:
        key = rsa.generate(bits, rng=bits)
        pub = key.public
        xs = [psi.hash_to_ring(k, key.n) for k in range(200)]
        sign = _rate(lambda: [rsa.sign_raw(key, x) for x in xs], len(xs))
        r = random.Random(0)
        rs = [r.randrange(2, key.n - 1) for _ in xs]
        blind = _rate(lambda: [psi.unblind(psi.blind(x, q, pub), q, pub)
                               for x, q in zip(xs, rs)], len(xs))
        a = [f"id-{k}" for k in range(items)]
        b = [f"id-{k}" for k in range(items // 2, items + items // 2)]
        seconds, res = _best(lambda: psi.private_set_intersection(a, b, key, rng=1), 1)
        exact = res.intersection == [x for x in b if x in set(a)]
        print(f"{bits:>5} {sign:>11,.0f} {blind:>20,.0f} {seconds:>12.2f} "
              f"{sum(res.bytes.values()):>10,}  {exact}")


def paillier_rows(bits_list):
    print("\n## Paillier (operations per second)")
    print(f"{'bits':>5} {'encrypt':>9} {'decrypt':>9} {'add':>10} {'mul 32-bit':>11} "
          f"{'ct bytes':>9}  homomorphic")
    for bits in bits_list:
        sk = paillier.generate(bits, rng=bits)
        pk = sk.public
        r = random.Random(1)
        ms = [r.randrange(-2 ** 40, 2 ** 40) for _ in range(100)]
        enc = _rate(lambda: [paillier.encrypt(pk, m, r) for m in ms], len(ms))
        cts = [paillier.encrypt(pk, m, r) for m in ms]
        dec = _rate(lambda: [paillier.decrypt(sk, c) for c in cts], len(cts))
        add = _rate(lambda: [paillier.add(pk, c, d) for c, d in zip(cts, cts[1:] * 10)],
                    len(cts) - 1)
        ks = [r.randrange(-2 ** 31, 2 ** 31) for _ in cts]
        mul = _rate(lambda: [paillier.mul_plain(pk, c, k) for c, k in zip(cts, ks)], len(cts))
        ok = all(paillier.decrypt(sk, paillier.add(pk, paillier.mul_plain(pk, c, k), d),
                                  signed=True) == k * m + n
                 for c, d, k, m, n in zip(cts, cts[1:], ks, ms, ms[1:]))
        print(f"{bits:>5} {enc:>9,.0f} {dec:>9,.0f} {add:>10,.0f} {mul:>11,.0f} "
              f"{pk.ciphertext_bytes:>9}  {ok}")


def vertical_rows(runs):
    print("\n## Vertical logistic regression (Paillier, 10 + 10 features, 3 steps)")
    print(f"{'bits':>5} {'N':>5} {'s/step':>8} {'plain s/step':>13} {'ratio':>8} {'max |dθ|':>9}")
    data_rng = np.random.default_rng(0)
    for bits, n in runs:
        key = paillier.generate(bits, rng=bits)
        Xa, Xb = data_rng.normal(size=(n, 10)), data_rng.normal(size=(n, 10))
        y = np.where(Xa[:, 0] + Xb[:, 0] > 0, 1.0, -1.0)
        secs, res = _best(lambda: vertical.train_vertical(Xa, Xb, y, iterations=3, key=key,
                                                         rng=0), 1)
        plain_secs, (pa, pb) = _best(lambda: vertical.train_plain(Xa, Xb, y, iterations=3))
        diff = max(np.abs(res.theta_a - pa).max(), np.abs(res.theta_b - pb).max())
        print(f"{bits:>5} {n:>5} {secs / 3:>8.3f} {plain_secs / 3:>13.6f} "
              f"{secs / plain_secs:>8,.0f} {diff:>9.1e}")


def main(quick: bool | None = None) -> None:
    """Print the four tables (``quick``: smaller runs; None reads ``--quick`` from argv)."""
    if quick is None:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--quick", action="store_true")
        quick = parser.parse_known_args()[0].quick
    print("# Federated learning: cryptography (chapter 14)")
    print("load average %.2f %.2f %.2f" % os.getloadavg(), "| python", sys.version.split()[0])
    sizes = [(dh.TOY_256, 10), (dh.TOY_256, 30), (dh.MODP_2048, 10)]
    if not quick:
        sizes = [(dh.TOY_256, 10), (dh.TOY_256, 30), (dh.TOY_256, 60), (dh.MODP_2048, 10),
                 (dh.MODP_2048, 20)]
    secure_aggregation_rows(sizes)
    psi_rows([512, 1024], 200 if quick else 1000)
    paillier_rows([512, 1024])
    vertical_rows([(512, 100)] if quick else [(512, 100), (512, 400), (1024, 100)])


if __name__ == "__main__":
    main()
