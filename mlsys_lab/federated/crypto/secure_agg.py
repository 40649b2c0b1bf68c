"""Secure aggregation with pairwise masks and drop-out recovery (Bonawitz et al., CCS 2017).

Every client u holds a vector x_u in the ring Z_{2^k} (``uint64`` arrays; reals go through
``prg.encode_fixed``). The server must learn Σ x_u over the clients that finished, and nothing
else. The rounds, for the honest-but-curious server of the paper's §4 (no consistency round):

0. **AdvertiseKeys** — u sends two Diffie–Hellman public keys: c_u (to encrypt shares) and
   s_u (to agree mask seeds). The server forwards the list.
1. **ShareKeys** — u draws a self-mask seed b_u, splits b_u and its secret s_u^SK into t-of-n
   Shamir shares, and sends each peer v its two shares encrypted under KA(c_u, c_v) (a SHAKE
   keystream and an HMAC tag), through the server. U2 = clients whose shares arrived.
2. **MaskedInputCollection** — u agrees s_uv = KA(s_u, s_v) with each peer in U2 and uploads
   y_u = x_u + PRG(b_u) + Σ_{v∈U2} σ_uv PRG(s_uv) mod 2^k with σ_uv = +1 if u < v, −1 if
   u > v, so p_uv = −p_vu and the pairwise masks of two uploading clients cancel exactly.
   U3 = clients whose upload arrived.
3. **Unmasking** — each u in U4 ⊆ U3 sends, for every peer, one share only: of s_v^SK if v
   dropped after sharing (v ∈ U2 \\ U3), of b_v if v uploaded (v ∈ U3). With ≥ t of them the
   server rebuilds the dropped clients' pairwise masks and the survivors' self-masks and
   removes both: Σ_{U3} y_u − Σ_{U3} PRG(b_u) + Σ_{u∈U3, v∈U2\\U3} σ_vu PRG(s_uv)
   = Σ_{U3} x_u.

The self-mask b_u is what keeps a late upload private: if u's upload arrives after the server
asked for s_u^SK (thinking u dropped), the pairwise masks come off but PRG(b_u) stays.
Bytes and messages are counted per client and round (``SecAggCost``).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass, field

import numpy as np

from mlsys_lab.errors import ArgumentError, MLSysError
from mlsys_lab.federated.crypto import dh, shamir
from mlsys_lab.federated.crypto.prg import check_bits, decode_fixed, encode_fixed, expand, ring_mask
from mlsys_lab.federated.crypto.primes import as_rng, int_to_bytes

__all__ = ["SecAggParams", "SecAggClient", "SecAggCost", "SecAggResult", "SecAggAbort",
           "pairwise_mask", "mask_input", "secure_aggregate", "plain_upload_bytes",
           "encrypt_share", "decrypt_share", "secure_weighted_average"]

_ID_BYTES = 4
_TAG_BYTES = 32


class SecAggAbort(MLSysError, RuntimeError):
    """Fewer than ``threshold`` clients survived a round: the protocol stops, nothing leaks."""


@dataclass(frozen=True)
class SecAggParams:
    """Protocol parameters.

    Attributes:
        threshold: t, the number of clients that must survive every round (and the Shamir
            threshold). The server learns nothing about one client while fewer than t collude.
        bits: k of the ring Z_{2^k} (1..64). The true sum must fit: n · max|x| < 2^(k-1).
        group: the Diffie–Hellman group (``dh.MODP_2048`` by default; ``dh.TOY_256`` for speed).
    """

    threshold: int
    bits: int = 32
    group: dh.DHGroup = dh.MODP_2048

    def __post_init__(self):
        check_bits(self.bits, "SecAggParams")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, int) \
                or self.threshold < 1:
            raise ArgumentError(f"SecAggParams: threshold must be an int >= 1, "
                                f"got {self.threshold!r}")

    @property
    def element_bytes(self) -> int:
        """Bytes of a group element (public key, Shamir share) on the wire."""
        return self.group.element_bytes

    @property
    def word_bytes(self) -> int:
        """Bytes of one ring element on the wire, ⌈k / 8⌉."""
        return (self.bits + 7) // 8


def pairwise_mask(seed: bytes, u: int, v: int, dim: int, bits: int) -> np.ndarray:
    """p_uv = σ_uv · PRG(seed) mod 2^bits with σ_uv = +1 if u < v, −1 if u > v, so
    ``pairwise_mask(s, u, v) + pairwise_mask(s, v, u) == 0`` in the ring."""
    if u == v:
        raise ArgumentError(f"pairwise_mask: a client has no mask with itself (u = v = {u})")
    stream = expand(seed, dim, bits)
    return stream if u < v else (np.uint64(0) - stream) & ring_mask(bits)


def mask_input(x, u: int, pair_seeds: dict, self_seed: bytes | None, bits: int) -> np.ndarray:
    """y_u = x_u + PRG(self_seed) + Σ_v p_uv mod 2^bits.

    Args:
        x: the client's vector, ring elements (``uint64``, each < 2^bits).
        u: the client's id.
        pair_seeds: ``{v: seed}`` agreed with each peer v.
        self_seed: the self-mask seed b_u as bytes, or ``None`` for pairwise masks only.
        bits: the ring's k.
    """
    x = np.asarray(x)
    if x.dtype != np.uint64 or x.ndim != 1:
        raise ArgumentError(f"mask_input: x must be a 1-d uint64 vector of ring elements, got "
                            f"{x.dtype} of shape {x.shape}")
    m = ring_mask(bits)
    if (x > m).any():
        raise ArgumentError(f"mask_input: x has entries >= 2^{bits}")
    y = x.copy()
    if self_seed is not None:
        y = y + expand(self_seed, x.size, bits)
    for v, seed in pair_seeds.items():
        y = y + pairwise_mask(seed, u, v, x.size, bits)
    return y & m


def plain_upload_bytes(dim: int, dtype_bytes: int = 4) -> int:
    """Bytes of the unprotected upload the comparison starts from (float32 by default)."""
    return dim * dtype_bytes


def _keystream(key: bytes, label: bytes, n: int) -> bytes:
    return hashlib.shake_256(key + b"|stream|" + label).digest(n)


def encrypt_share(key: bytes, sender: int, receiver: int, payload: bytes) -> bytes:
    """Authenticated encryption of one share message under a 32-byte agreed key: XOR with a
    SHAKE-256 keystream bound to (sender, receiver), then an HMAC-SHA256 tag. The key is used
    once per direction (teaching construction, not a vetted AEAD)."""
    label = int_to_bytes(sender, _ID_BYTES) + int_to_bytes(receiver, _ID_BYTES)
    body = bytes(a ^ b for a, b in zip(payload, _keystream(key, label, len(payload))))
    return body + hmac.new(key, label + body, hashlib.sha256).digest()


def decrypt_share(key: bytes, sender: int, receiver: int, ciphertext: bytes) -> bytes:
    """Inverse of :func:`encrypt_share`; raises ``ArgumentError`` when the tag does not match."""
    label = int_to_bytes(sender, _ID_BYTES) + int_to_bytes(receiver, _ID_BYTES)
    body, tag = ciphertext[:-_TAG_BYTES], ciphertext[-_TAG_BYTES:]
    if not hmac.compare_digest(tag, hmac.new(key, label + body, hashlib.sha256).digest()):
        raise ArgumentError(f"decrypt_share: the tag of the share from {sender} to {receiver} "
                            f"does not match (tampered, or the wrong key)")
    return bytes(a ^ b for a, b in zip(body, _keystream(key, label, len(body))))


class SecAggClient:
    """One client's side of the protocol (its keys, its shares of the others' secrets).

    Args:
        uid: the client's id, a positive int (also its Shamir x-coordinate).
        x: its input vector (``uint64`` ring elements).
        params: ``SecAggParams``.
        rng: randomness for keys, seeds and share polynomials (``primes.as_rng``).
    """

    def __init__(self, uid: int, x, params: SecAggParams, rng=None):
        if isinstance(uid, bool) or not isinstance(uid, int) or uid < 1 or \
                uid >= 1 << (8 * _ID_BYTES):
            raise ArgumentError(f"SecAggClient: uid must be a positive int below 2^32, got "
                                f"{uid!r}")
        self.uid, self.params, self._rng = uid, params, as_rng(rng)
        self.x = np.asarray(x)
        g = params.group
        self._c_sk, self.c_pk = dh.keypair(g, self._rng)
        self._s_sk, self.s_pk = dh.keypair(g, self._rng)
        self._b = self._rng.randrange(g.p)
        self.peers: dict[int, tuple[int, int]] = {}
        self.received: dict[int, tuple[int, int]] = {}  # v -> (share of s_v^SK, share of b_v)
        self._agreed: dict[tuple[str, int], bytes] = {}

    # round 0
    def advertise_keys(self) -> tuple[int, int]:
        """``(c_pk, s_pk)``."""
        return self.c_pk, self.s_pk

    def _enc_key(self, v: int) -> bytes:
        if ("c", v) not in self._agreed:
            g = self.params.group
            self._agreed["c", v] = dh.shared_seed(g, dh.agree(g, self._c_sk, self.peers[v][0]),
                                                  b"share-encryption")
        return self._agreed["c", v]

    def _mask_seed(self, v: int) -> bytes:
        if ("s", v) not in self._agreed:
            g = self.params.group
            self._agreed["s", v] = dh.shared_seed(g, dh.agree(g, self._s_sk, self.peers[v][1]),
                                                  b"pairwise-mask")
        return self._agreed["s", v]

    # round 1
    def share_keys(self, keys: dict[int, tuple[int, int]]) -> dict[int, bytes]:
        """Shares of s_u^SK and b_u for every peer, each encrypted for its receiver.

        Args:
            keys: ``{v: (c_pk, s_pk)}`` of every client the server listed (this one included).
        """
        t, g = self.params.threshold, self.params.group
        if len(keys) < t:
            raise SecAggAbort(f"share_keys: {len(keys)} clients advertised keys, threshold {t}")
        self.peers = {v: k for v, k in keys.items() if v != self.uid}
        ids = sorted(keys)
        s_shares = dict(shamir.share(self._s_sk, t, len(ids), g.p, self._rng, xs=ids))
        b_shares = dict(shamir.share(self._b, t, len(ids), g.p, self._rng, xs=ids))
        self.received[self.uid] = (s_shares[self.uid], b_shares[self.uid])
        e = self.params.element_bytes
        out = {}
        for v in self.peers:
            payload = (int_to_bytes(s_shares[v], e) + int_to_bytes(b_shares[v], e))
            out[v] = encrypt_share(self._enc_key(v), self.uid, v, payload)
        return out

    def receive_shares(self, ciphertexts: dict[int, bytes]) -> None:
        """Decrypt and keep the shares the peers sent this client (``{sender: ciphertext}``)."""
        e = self.params.element_bytes
        for v, ct in ciphertexts.items():
            payload = decrypt_share(self._enc_key(v), v, self.uid, ct)
            self.received[v] = (int.from_bytes(payload[:e], "big"),
                                int.from_bytes(payload[e:], "big"))

    # round 2
    def masked_input(self, u2) -> np.ndarray:
        """y_u for the clients ``u2`` whose shares were delivered (this one included)."""
        if len(u2) < self.params.threshold:
            raise SecAggAbort(f"masked_input: {len(u2)} clients shared keys, threshold "
                              f"{self.params.threshold}")
        seeds = {v: self._mask_seed(v) for v in u2 if v != self.uid}
        return mask_input(self.x, self.uid, seeds, self.self_seed_bytes(self._b),
                          self.params.bits)

    def self_seed_bytes(self, b: int) -> bytes:
        """The self-mask seed b as PRG key bytes."""
        return int_to_bytes(b, self.params.element_bytes)

    # round 3
    def unmask(self, u2, u3) -> dict[int, tuple[str, int]]:
        """One share per peer of U2: ``("s", share of s_v^SK)`` for v that dropped after
        sharing, ``("b", share of b_v)`` for v that uploaded. Never both for one v."""
        u2, u3 = set(u2), set(u3)
        if len(u3) < self.params.threshold:
            raise SecAggAbort(f"unmask: {len(u3)} clients uploaded, threshold "
                              f"{self.params.threshold}")
        if not u3 <= u2:
            raise ArgumentError("unmask: the upload list names clients that never shared keys")
        out = {}
        for v in sorted(u2):
            s_share, b_share = self.received[v]
            out[v] = ("b", b_share) if v in u3 else ("s", s_share)
        return out


@dataclass
class SecAggCost:
    """What one client sent and received, per round: ``messages``, ``sent``, ``received``
    (bytes), each ``{round name: count}``."""

    messages: dict = field(default_factory=dict)
    sent: dict = field(default_factory=dict)
    received: dict = field(default_factory=dict)

    def add(self, round_name: str, sent: int = 0, received: int = 0, messages: int = 1):
        self.messages[round_name] = self.messages.get(round_name, 0) + messages
        self.sent[round_name] = self.sent.get(round_name, 0) + sent
        self.received[round_name] = self.received.get(round_name, 0) + received

    @property
    def total_sent(self) -> int:
        return sum(self.sent.values())

    @property
    def total_received(self) -> int:
        return sum(self.received.values())

    @property
    def total_messages(self) -> int:
        return sum(self.messages.values())


@dataclass
class SecAggResult:
    """The outcome of one aggregation.

    Attributes:
        total: Σ x_u over ``included`` mod 2^k (``uint64``).
        included: clients whose inputs are in the sum (U3).
        dropped: clients that shared keys but never uploaded (U2 \\ U3).
        uploads: what the server saw, ``{u: y_u}`` (masked; for the uniformity test).
        cost: ``{u: SecAggCost}`` for every client that started.
        plain_bytes: bytes of one unprotected float32 upload of the same vector.
        seconds: wall seconds spent ``{"clients": all clients' work, summed, "server": the
            server's unmasking}``.
    """

    total: np.ndarray
    included: list
    dropped: list
    uploads: dict
    cost: dict
    plain_bytes: int
    seconds: dict = field(default_factory=dict)


def secure_aggregate(inputs: dict, params: SecAggParams, *, drop_before_sharing=(),
                     drop_before_upload=(), drop_before_unmasking=(), rng=None) -> SecAggResult:
    """Run the four rounds for ``inputs`` (``{uid: uint64 vector}``) and return the sum.

    Args:
        inputs: each client's ring vector, all the same length.
        params: threshold, ring size, group.
        drop_before_sharing: clients that advertise keys and then vanish (never in U2).
        drop_before_upload: clients that shared keys but never upload (their pairwise masks
            are rebuilt from the shares of their s^SK).
        drop_before_unmasking: clients that uploaded but send no shares in the last round
            (their inputs are in the sum).
        rng: randomness of every client (``primes.as_rng``); seeded for reproducible runs.

    Raises:
        SecAggAbort: a round ends with fewer than ``threshold`` clients.
    """
    r = as_rng(rng)
    ids = sorted(inputs)
    if len(ids) < 1 or any(not isinstance(u, int) for u in ids):
        raise ArgumentError("secure_aggregate: inputs must map positive int ids to vectors")
    dims = {np.asarray(inputs[u]).shape for u in ids}
    if len(dims) != 1:
        raise ArgumentError(f"secure_aggregate: inputs have different shapes {sorted(dims)}")
    for name, group in (("drop_before_sharing", drop_before_sharing),
                        ("drop_before_upload", drop_before_upload),
                        ("drop_before_unmasking", drop_before_unmasking)):
        if not set(group) <= set(ids):
            raise ArgumentError(f"secure_aggregate: {name} names unknown clients "
                                f"{sorted(set(group) - set(ids))}")
    dim = int(np.asarray(inputs[ids[0]]).size)
    t, e, w = params.threshold, params.element_bytes, params.word_bytes
    start = time.perf_counter()
    clients = {u: SecAggClient(u, inputs[u], params, r) for u in ids}
    cost = {u: SecAggCost() for u in ids}

    # round 0: advertise keys; the server broadcasts the list to everyone
    keys = {u: clients[u].advertise_keys() for u in ids}
    if len(keys) < t:
        raise SecAggAbort(f"advertise: {len(keys)} clients, threshold {t}")
    for u in ids:
        cost[u].add("advertise keys", sent=2 * e, received=len(ids) * (_ID_BYTES + 2 * e))

    # round 1: encrypted shares, routed through the server
    u1 = [u for u in ids if u not in set(drop_before_sharing)]
    outbox = {u: clients[u].share_keys(keys) for u in u1}
    if len(u1) < t:
        raise SecAggAbort(f"share keys: {len(u1)} clients shared, threshold {t}")
    for u in u1:
        inbox = {v: outbox[v][u] for v in u1 if v != u}
        clients[u].receive_shares(inbox)
        cost[u].add("share keys", sent=sum(_ID_BYTES + len(c) for c in outbox[u].values()),
                    received=sum(_ID_BYTES + len(c) for c in inbox.values()))
    u2 = u1

    # round 2: masked inputs
    u3 = [u for u in u2 if u not in set(drop_before_upload)]
    uploads = {u: clients[u].masked_input(u2) for u in u3}
    if len(u3) < t:
        raise SecAggAbort(f"masked input: {len(u3)} clients uploaded, threshold {t}")
    for u in u3:
        cost[u].add("masked input", sent=dim * w, received=len(u2) * _ID_BYTES)

    # round 3: unmasking
    u4 = [u for u in u3 if u not in set(drop_before_unmasking)]
    responses = {u: clients[u].unmask(u2, u3) for u in u4}
    if len(u4) < t:
        raise SecAggAbort(f"unmasking: {len(u4)} clients answered, threshold {t}")
    for u in u4:
        cost[u].add("unmasking", sent=len(responses[u]) * (_ID_BYTES + 1 + e),
                    received=len(u3) * _ID_BYTES)

    client_seconds = time.perf_counter() - start
    start = time.perf_counter()
    total = _server_unmask(params, keys, uploads, responses, u2, u3, dim)
    seconds = {"clients": client_seconds, "server": time.perf_counter() - start}
    dropped = sorted(set(u2) - set(u3))
    return SecAggResult(total, u3, dropped, uploads, cost, plain_upload_bytes(dim), seconds)


def _server_unmask(params, keys, uploads, responses, u2, u3, dim) -> np.ndarray:
    g, t, bits = params.group, params.threshold, params.bits
    m = ring_mask(bits)
    total = np.zeros(dim, dtype=np.uint64)
    for u in u3:
        total = total + uploads[u]
    for v in u2:
        kind = "b" if v in u3 else "s"
        shares = [(u, resp[v][1]) for u, resp in responses.items() if resp[v][0] == kind]
        secret = shamir.reconstruct(shares[:t], g.p, threshold=t)
        if kind == "b":  # remove the survivor's self-mask
            total = total - expand(int_to_bytes(secret, params.element_bytes), dim, bits)
        else:  # rebuild the dropped client's masks with every survivor and take them off
            for u in u3:
                seed = dh.shared_seed(g, dh.agree(g, secret, keys[u][1]), b"pairwise-mask")
                total = total - pairwise_mask(seed, u, v, dim, bits)
    return total & m


def secure_weighted_average(models, num_examples, params: SecAggParams, *, frac_bits: int = 16,
                            drop_before_upload=(), rng=None):
    """FedAvg's server step through secure aggregation: the server learns Σ n_k w_k and Σ n_k
    over the clients that uploaded, never one client's model.

    Client k (id k + 1) uploads one ring vector: its model times its sample count, in fixed
    point, followed by the count itself. The server divides the two sums.

    Args:
        models: one ``{name: array}`` per client, all with the same names and shapes.
        num_examples: each client's sample count (non-negative ints).
        params: ``SecAggParams``; ``bits`` must hold Σ n_k |w_k| 2^frac_bits (checked).
        frac_bits: fixed-point fractional bits of n_k w_k.
        drop_before_upload: indices (0-based, in ``models``) of clients that drop after
            sharing keys: their updates are left out of both sums.
        rng: see ``primes.as_rng``.

    Returns:
        ``(average, result)``: the model ``Σ n_k w_k / Σ n_k`` over the uploaded clients (its
        error against the float average is below 2^-frac_bits per entry) and the
        ``SecAggResult`` (costs, what the server saw).
    """
    models = list(models)
    counts = [int(n) for n in num_examples]
    if not models or len(counts) != len(models) or min(counts) < 0:
        raise ArgumentError(f"secure_weighted_average: need one non-negative count per model, "
                            f"got {len(models)} models and {len(counts)} counts")
    names = sorted(models[0])
    shapes = {k: np.shape(models[0][k]) for k in names}
    for m in models[1:]:
        if sorted(m) != names or any(np.shape(m[k]) != shapes[k] for k in names):
            raise ArgumentError("secure_weighted_average: models differ in names or shapes")
    flat = [np.concatenate([np.asarray(m[k], dtype=np.float64).ravel() for k in names])
            for m in models]
    bound = sum(n * float(np.abs(f).max(initial=0.0)) for n, f in zip(counts, flat))
    if (bound + 1) * 2.0 ** frac_bits >= 2.0 ** (params.bits - 1) or sum(counts) >= 2 ** (
            params.bits - 1):
        raise ArgumentError(f"secure_weighted_average: Σ n_k |w_k| · 2^{frac_bits} = "
                            f"{bound * 2.0 ** frac_bits:.3g} does not fit in Z_2^{params.bits}; "
                            f"use more bits or fewer fractional bits")
    inputs = {}
    for k, (n, f) in enumerate(zip(counts, flat)):
        body = encode_fixed(n * f, frac_bits, params.bits)
        inputs[k + 1] = np.concatenate([body, np.array([n], dtype=np.uint64)])
    result = secure_aggregate(inputs, params, drop_before_upload=[k + 1 for k in
                                                                  drop_before_upload], rng=rng)
    total_n = int(result.total[-1])
    if total_n == 0:
        raise ArgumentError("secure_weighted_average: the uploaded clients hold no examples")
    mean = decode_fixed(result.total[:-1], frac_bits, params.bits) / total_n
    out, start = {}, 0
    for k in names:
        size = int(np.prod(shapes[k], dtype=np.int64))
        out[k] = mean[start:start + size].reshape(shapes[k])
        start += size
    return out, result
