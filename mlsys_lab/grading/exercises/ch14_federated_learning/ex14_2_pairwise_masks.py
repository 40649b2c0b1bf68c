"""Exercise 14.2: pairwise masks that cancel (secure aggregation, Bonawitz et al. 2017).

The student writes ``masked_upload(u, x, seeds, bits, prg)``: client ``u`` holds ``x``, a
``uint64`` vector of elements of the ring Z_{2^bits}; ``seeds`` maps each peer ``v`` to the
seed s_uv that u and v agreed on (both hold the same seed); ``prg(seed, n)`` expands a seed
into n ring elements (a ``uint64`` array). The upload is
``y_u = x_u + Σ_v p_uv mod 2^bits`` with ``p_uv = +prg(s_uv)`` when ``u < v`` and
``−prg(s_uv)`` when ``u > v`` — so p_uv = −p_vu and, summed over the clients, every mask
cancels exactly. (The opposite convention, − for u < v, is accepted when every client uses
it: the masks cancel all the same.) Return a ``uint64`` array of ring elements; leave ``x``
as it is.

Wrong ideas rejected: masks drawn as floats (cancel only approximately, and are not ring
elements: the 64-bit case needs every bit); the same sign on both sides of a pair (the masks
then double instead of cancelling); no reduction mod 2^bits (Python ints or int64 that grow
past the ring, or ``uint64`` arithmetic never masked to ``bits``: the 8-bit ring case wraps
on almost every entry); a sign chosen by the peer's position in ``seeds`` instead of by the
ids; masking with some peers only; adding the mask into ``x`` in place. ``forbidden`` is the
library's ``mlsys_lab.federated.crypto.secure_agg`` (its ``pairwise_mask`` and ``mask_input``
are this exercise).
"""

from __future__ import annotations

import hashlib

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


def _expand(seed: bytes, n: int, bits: int) -> np.ndarray:
    """The exercise's PRG: SHAKE-256 of the seed read as little-endian uint64, mod 2^bits."""
    words = np.frombuffer(hashlib.shake_256(seed).digest(8 * n), dtype="<u8").astype(np.uint64)
    return words if bits == 64 else words & np.uint64((1 << bits) - 1)


def _clients(seed: int, kind: str):
    """(ids, inputs, pair seeds {(u, v): seed} for u < v, bits, dim)."""
    rng = np.random.default_rng(14200 + seed + 17 * len(kind))
    bits, n, dim = {"sum": (32, 5, 12), "ring8": (8, 4, 64), "ring64": (64, 4, 8),
                    "ids": (16, 6, 10)}[kind]
    ids = sorted(int(i) for i in rng.choice(np.arange(1, 60), n, replace=False))
    if kind == "ids":  # ids whose order differs from any dict order the seeds might come in
        ids = sorted(int(i) for i in rng.choice(np.arange(1, 10_000), n, replace=False))
    top = (1 << bits) - 1
    inputs = {u: (rng.integers(0, 2 ** 62, dim, dtype=np.uint64) & np.uint64(top)) for u in ids}
    if kind == "ring8":  # near the top of the ring
        inputs = {u: np.uint64(top) - (v % np.uint64(8)) for u, v in inputs.items()}
    pair = {(u, v): hashlib.sha256(f"{seed}|{kind}|{u}|{v}".encode()).digest()
            for u in ids for v in ids if u < v}
    return ids, inputs, pair, bits, dim


def _seeds_of(u, ids, pair, shuffle_seed):
    peers = [v for v in ids if v != u]
    order = np.random.default_rng(shuffle_seed).permutation(len(peers))
    return {peers[i]: pair[(min(u, peers[i]), max(u, peers[i]))] for i in order}


def _reference(u, x, seeds, bits, sign):
    m = (1 << bits) - 1
    y = [int(v) for v in x]
    for v, s in seeds.items():
        mask = [int(w) for w in _expand(s, len(x), bits)]
        sgn = sign if u < v else -sign
        y = [(a + sgn * b) & m for a, b in zip(y, mask)]
    return y


# ----------------------------------------------------------------------------- probes


def _probe(kind):
    def probe(masked_upload, seed):
        ids, inputs, pair, bits, dim = _clients(seed, kind)

        def run():
            out = {}
            for k, u in enumerate(ids):
                x = inputs[u].copy()
                seeds = _seeds_of(u, ids, pair, seed + k)
                y = masked_upload(u, x, seeds, bits, lambda s, n: _expand(s, n, bits))
                out[str(u)] = {"y": y if isinstance(y, np.ndarray) else
                               np.asarray(y, dtype=object).tolist() if isinstance(y, list) else y,
                               "untouched": bool(np.array_equal(x, inputs[u]))}
            return out
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _ints(y, dim, what, u):
    if isinstance(y, np.ndarray):
        if y.shape != (dim,):
            raise AssertionError(f"{what}: client {u} uploaded shape {y.shape}, expected "
                                 f"({dim},)")
        if not np.issubdtype(y.dtype, np.integer):
            raise AssertionError(f"{what}: client {u} uploaded {y.dtype} values; ring elements "
                                 f"are integers (float masks cancel only approximately)")
        return [int(v) for v in y]
    if isinstance(y, list) and len(y) == dim and all(isinstance(v, int) for v in y):
        return y
    raise AssertionError(f"{what}: client {u} uploaded {describe(y)}, expected {dim} ring "
                         f"elements (a uint64 array)")


def _uploads(raw, seed, kind, what):
    ids, inputs, pair, bits, dim = _clients(seed, kind)
    if isinstance(raw, dict) is False or sorted(raw) != sorted(str(u) for u in ids):
        raise AssertionError(f"{what}: masked_upload raised or returned nothing usable: "
                             f"{describe(raw)}")
    ys = {u: _ints(raw[str(u)]["y"], dim, what, u) for u in ids}
    return ids, inputs, pair, bits, dim, ys


def _sum_judge(kind, what):
    def judge(raw, seed):
        ids, inputs, pair, bits, dim, ys = _uploads(raw, seed, kind, what)
        m = 1 << bits
        got = [sum(ys[u][i] for u in ids) % m for i in range(dim)]
        want = [sum(int(inputs[u][i]) for u in ids) % m for i in range(dim)]
        if got != want:
            raise AssertionError(f"{what}: Σ y_u mod 2^{bits} = {describe(got)}, Σ x_u = "
                                 f"{describe(want)}: the masks do not cancel (p_uv must be "
                                 f"−p_vu)")
    return judge


def _exact_judge(kind, what):
    def judge(raw, seed):
        ids, inputs, pair, bits, dim, ys = _uploads(raw, seed, kind, what)
        for u in ids:
            if not raw[str(u)]["untouched"]:
                raise AssertionError(f"{what}: client {u}'s x changed (build y, leave x)")
            if any(not 0 <= v < 1 << bits for v in ys[u]):
                raise AssertionError(f"{what}: client {u} uploaded values outside "
                                     f"[0, 2^{bits}), e.g. {max(ys[u], key=abs)}: reduce "
                                     f"mod 2^{bits}")
        for sign in (1, -1):
            if all(ys[u] == _reference(u, inputs[u], _seeds_of(u, ids, pair, 0), bits, sign)
                   for u in ids):
                return
        u = ids[0]
        want = _reference(u, inputs[u], _seeds_of(u, ids, pair, 0), bits, 1)
        raise AssertionError(f"{what}: client {u} uploaded {describe(ys[u])}, expected "
                             f"{describe(want)} (x + Σ_v ±prg(s_uv), + when u < v, − when "
                             f"u > v)")
    return judge


register(
    Exercise(
        id="14.2",
        title="Pairwise masks that cancel",
        target="masked_upload",
        task="the pairwise masking",
        forbidden=("mlsys_lab.federated.crypto.secure_agg",),
        cases=(
            Case("the masks cancel: Σ y_u = Σ x_u exactly", 2,
                 feedback="p_uv = −p_vu: add prg(s_uv) on one side of each pair, subtract it "
                          "on the other",
                 probe=_probe("sum"), judge=_sum_judge("sum", "five clients in Z_2^32")),
            Case("each upload is x_u + Σ ±prg(s_uv) in Z_2^32", 2,
                 feedback="the sign comes from comparing the ids u and v; reduce mod 2^bits",
                 probe=_probe("sum"), judge=_exact_judge("sum", "five clients in Z_2^32")),
            Case("an 8-bit ring wraps", 1,
                 feedback="every entry is reduced mod 2^bits",
                 probe=_probe("ring8"), judge=_exact_judge("ring8", "four clients in Z_2^8")),
            Case("a 64-bit ring: every bit exact", 1,
                 feedback="ring arithmetic on uint64, no floats",
                 probe=_probe("ring64"), judge=_exact_judge("ring64", "four clients in Z_2^64")),
            Case("large ids in shuffled order", 1,
                 feedback="the sign depends on the ids, not on the order of the seeds",
                 probe=_probe("ids"), judge=_exact_judge("ids", "six clients with large ids")),
        ),
    ),
)
