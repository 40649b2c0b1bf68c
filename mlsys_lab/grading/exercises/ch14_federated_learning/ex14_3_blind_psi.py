"""Exercise 14.3: private set intersection by RSA blind signatures (B's side).

Party A holds ids and an RSA key (n, e, d); it published ``t_j = H′(H(a_j)^d mod n)`` for
its ids. The student writes B's side, ``blind_psi(items, n, e, published, sign_blinded, H,
H_prime, rng)``: for each of B's ids b_i draw a fresh blinding factor R_i (``rng.randrange(2,
n - 1)``), send ``y_i = H(b_i) · R_i^e mod n`` — all of them in one call
``sign_blinded(list_of_y)``, which returns A's ``y_i^d mod n`` —, unblind with
``z_i = y_i^d · R_i^-1 mod n`` (= H(b_i)^d) and keep b_i when ``H_prime(z_i)`` is in
``published``. Return the kept ids in B's order.

Wrong ideas rejected: sending the plain hashes H(b_i) (the intersection comes out right, but
A then holds H(b_i) and can test any guessed id against it: the judge, who knows d, recovers
each R_i = y_i^d · H(b_i)^-d from what A saw and requires fresh, distinct, non-trivial
factors); one R for all ids (A sees y_i / y_j = H(b_i) / H(b_j)); forgetting to unblind
(z_i = y_i^d = H(b_i)^d · R_i: nothing matches), unblinding by multiplying with R_i instead of
its inverse, or by R_i^-e; comparing raw values (H(b_i), or z_i itself, against the published
H′ digests); losing B's order. ``forbidden`` is the library's ``mlsys_lab.federated.crypto.psi``;
``secrets`` is allowed besides the default modules (drawing R with it is what real code does).
"""

from __future__ import annotations

import hashlib
import random

from mlsys_lab.grading.core.exercise import (
    DEFAULT_ALLOWED,
    Case,
    Exercise,
    attempt,
    describe,
    register,
)

# ----------------------------------------------------------------------------- inputs (both sides)

_KEY = None


def _key():
    """(n, e, d): a 256-bit RSA key from two 128-bit primes drawn by a fixed-seed generator
    (Fermat-tested to 11 bases: the same key on both sides of the wire, every run)."""
    global _KEY
    if _KEY is None:
        rng = random.Random(1403)

        def prime(bits):
            while True:
                c = rng.getrandbits(bits) | (3 << (bits - 2)) | 1
                if all(pow(a, c - 1, c) == 1 for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31)):
                    return c
        p, q, e = prime(128), prime(128), 65537
        while (p - 1) % e == 0 or (q - 1) % e == 0 or p == q:
            q = prime(128)
        lam = (p - 1) * (q - 1)
        _KEY = (p * q, e, pow(e, -1, lam))
    return _KEY


def H(item) -> int:
    """Full-domain hash of an id into Z_n."""
    n = _key()[0]
    data = item.encode() if isinstance(item, str) else str(item).encode()
    return int.from_bytes(hashlib.shake_256(b"H|" + data).digest(48), "big") % n


def H_prime(z: int) -> str:
    """Outer hash of a signature (hex digest)."""
    return hashlib.sha256(b"H'|" + int(z).to_bytes(32, "big")).hexdigest()


def _sets(seed: int, kind: str):
    rng = random.Random(14300 + seed + 19 * len(kind))
    universe = [f"user-{k}" for k in range(300)] + list(range(5000, 5100))
    if kind == "mixed":
        a, b = rng.sample(universe, 40), rng.sample(universe, 30)
        b = b[:20] + rng.sample(a, 10)  # some certainly in common
    elif kind == "disjoint":
        a, b = universe[:20], universe[20:35]
    else:  # "all": every id of B is A's, in another order
        a = rng.sample(universe, 25)
        b = rng.sample(a, 25)
    seen, bb = set(), []
    for x in b:  # no duplicates in B
        if x not in seen:
            seen.add(x)
            bb.append(x)
    return a, bb


def _published(a):
    n, _, d = _key()
    return {H_prime(pow(H(x), d, n)) for x in a}


# ----------------------------------------------------------------------------- probes


def _probe(kind, runs=1):
    def probe(blind_psi, seed):
        n, e, d = _key()
        a, b = _sets(seed, kind)
        published = _published(a)

        def run():
            out = []
            for k in range(runs):
                seen = []

                def sign_blinded(ys, seen=seen):
                    ys = [int(y) for y in ys]
                    seen.append(ys)
                    return [pow(y % n, d, n) for y in ys]

                got = blind_psi(list(b), n, e, set(published), sign_blinded, H, H_prime,
                                random.Random(seed * 10 + k))
                out.append({"result": list(got) if isinstance(got, (list, tuple)) else got,
                            "seen": seen})
            return out
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _runs(raw, runs, what):
    if not isinstance(raw, list) or len(raw) != runs:
        raise AssertionError(f"{what}: blind_psi raised or returned nothing usable: "
                             f"{describe(raw)}")
    return raw


def _intersection_judge(kind, what):
    def judge(raw, seed):
        a, b = _sets(seed, kind)
        want = [x for x in b if x in set(a)]
        got = _runs(raw, 1, what)[0]["result"]
        if got != want:
            raise AssertionError(f"{what}: returned {describe(got)}, expected {describe(want)} "
                                 f"(unblind y^d with R^-1 mod n, compare H_prime of it with "
                                 f"the published values; keep B's order)")
    return judge


def _blinding_judge(raw, seed):
    """What A saw: one y per id; R_i = y_i^d · H(b_i)^-d must be fresh and distinct."""
    n, _, d = _key()
    a, b = _sets(seed, "mixed")
    factors = []
    for k, run in enumerate(_runs(raw, 2, "two runs")):
        ys = [y for batch in run["seen"] for y in batch]
        if len(ys) != len(b):
            raise AssertionError(f"run {k + 1}: A was asked to sign {len(ys)} values for "
                                 f"{len(b)} ids (one blinded value per id)")
        rs = []
        for x, y in zip(b, ys):
            h_d = pow(H(x), d, n)
            r = pow(y, d, n) * pow(h_d, -1, n) % n
            if r in (0, 1, n - 1) or y == H(x):
                raise AssertionError(f"A received H({x!r}) itself (or ± it): A could test any "
                                     f"guessed id against it; multiply by R^e with a random R")
            rs.append(r)
        if len(set(rs)) != len(rs):
            raise AssertionError("the same blinding factor R served several ids: A sees "
                                 "y_i / y_j = H(b_i) / H(b_j); draw a fresh R per id")
        factors.append(set(rs))
    if factors[0] & factors[1]:
        raise AssertionError("two runs reused blinding factors: draw R from rng every time")


register(
    Exercise(
        id="14.3",
        title="Private set intersection by RSA blind signatures",
        target="blind_psi",
        task="the blind-signature PSI",
        forbidden=("mlsys_lab.federated.crypto.psi",),
        allowed=DEFAULT_ALLOWED + ("secrets",),  # drawing R with secrets is right, not a cheat
        cases=(
            Case("finds exactly the intersection, in B's order", 2,
                 feedback="unblind with R^-1, then compare H_prime(z) with the published set",
                 probe=_probe("mixed"), judge=_intersection_judge("mixed", "40 and 30 ids")),
            Case("B's ids all in A: all of them, in B's order", 1,
                 feedback="keep exactly the ids whose H_prime(z) was published",
                 probe=_probe("all"), judge=_intersection_judge("all", "B's ids all in A")),
            Case("no id in common", 1,
                 feedback="an empty list when nothing matches",
                 probe=_probe("disjoint"), judge=_intersection_judge("disjoint", "disjoint")),
            Case("A sees only blinded values, a fresh R per id", 2,
                 feedback="y_i = H(b_i) · R_i^e mod n with a new random R_i for every id",
                 probe=_probe("mixed", runs=2), judge=_blinding_judge),
        ),
    ),
)
