"""Vertical federated logistic regression: two parties hold different features of the same
samples, a coordinator holds the Paillier key, and nobody sees another party's data.

Party A holds features X_A; party B holds features X_B and the labels y ∈ {−1, +1}; the
coordinator C generates the Paillier key pair and gives the public key to A and B. The loss is
the second-order Taylor expansion of the logistic loss at 0 (so that it is a polynomial,
computable on ciphertexts): ℓ(θ) ≈ (1/N) Σ_i [log 2 − ½ y_i θ·x_i + ⅛ (θ·x_i)²], with gradient
(1/N) Σ_i d_i x_i, d_i = ¼ θ·x_i − ½ y_i. One step of gradient descent:

1. A computes u_A = X_A θ_A and sends [[¼ u_A]] (encrypted, fixed point 2^f) to B.
2. B adds its plaintext part: [[d]] = [[¼ u_A]] ⊕ (¼ u_B − ½ y) and sends [[d]] to A.
3. Each party computes its encrypted gradient Σ_i x_ij ⊗ [[d_i]] (fixed point 2^2f), adds a
   random mask R uniform in Z_n and sends it to C.
4. C decrypts the masked gradients and returns them; each party removes its mask, divides by
   N and updates its own weights.

A sees only ciphertexts, B sees only ciphertexts, C sees only masked values. Every number on
the ciphertexts is an integer, so the run equals, bit for bit, the same integer arithmetic
done in the clear (``train_fixed_point``), and that is within fixed-point rounding of the
float64 model (``train_plain``). The sample alignment before training is RSA-blind-signature
PSI (``align``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.federated.crypto import paillier, psi
from mlsys_lab.federated.crypto.primes import as_rng

__all__ = ["VerticalResult", "train_vertical", "train_fixed_point", "train_plain",
           "taylor_loss", "align", "predict_proba"]


@dataclass
class VerticalResult:
    """Weights of both parties and what crossed the wire.

    Attributes:
        theta_a: A's weights (one per column of X_A).
        theta_b: B's weights (one per column of X_B, the intercept last when added).
        history: ``[(theta_a, theta_b)]`` after every iteration.
        messages: ``{"A->B": ..., "B->A": ..., "A->C": ..., "B->C": ..., "C->A": ...,
            "C->B": ...}`` messages sent.
        bytes: the same keys, bytes sent.
        key_bits: size of the Paillier n.
    """

    theta_a: np.ndarray
    theta_b: np.ndarray
    history: list = field(default_factory=list)
    messages: dict = field(default_factory=dict)
    bytes: dict = field(default_factory=dict)
    key_bits: int = 0


def _check(X_a, X_b, y, who):
    X_a, X_b, y = (np.asarray(v, dtype=np.float64) for v in (X_a, X_b, y))
    if X_a.ndim != 2 or X_b.ndim != 2 or y.ndim != 1 or not len(X_a) == len(X_b) == len(y):
        raise ShapeError(f"{who}: need X_a (N, d_a), X_b (N, d_b), y (N,); got {X_a.shape}, "
                         f"{X_b.shape}, {y.shape}")
    if not np.isin(y, (-1.0, 1.0)).all():
        raise ArgumentError(f"{who}: labels must be -1 or +1")
    return X_a, X_b, y


def _with_intercept(X_b, fit_intercept):
    return np.hstack([X_b, np.ones((len(X_b), 1))]) if fit_intercept else X_b


def taylor_loss(theta_a, theta_b, X_a, X_b, y, fit_intercept: bool = True) -> float:
    """The Taylor-expanded logistic loss the protocol minimises."""
    X_a, X_b, y = _check(X_a, X_b, y, "taylor_loss")
    z = X_a @ theta_a + _with_intercept(X_b, fit_intercept) @ theta_b
    return float(np.mean(np.log(2.0) - 0.5 * y * z + 0.125 * z * z))


def predict_proba(theta_a, theta_b, X_a, X_b, fit_intercept: bool = True) -> np.ndarray:
    """σ(θ_A·x_A + θ_B·x_B) (for evaluation, with both halves of a test sample at hand)."""
    z = np.asarray(X_a) @ theta_a + _with_intercept(np.asarray(X_b), fit_intercept) @ theta_b
    return 1.0 / (1.0 + np.exp(-z))


def train_plain(X_a, X_b, y, *, lr: float = 0.5, iterations: int = 20,
                fit_intercept: bool = True):
    """The same gradient descent in float64, no encryption (the reference).

    Returns:
        ``(theta_a, theta_b)``.
    """
    X_a, X_b, y = _check(X_a, X_b, y, "train_plain")
    X_b = _with_intercept(X_b, fit_intercept)
    ta, tb = np.zeros(X_a.shape[1]), np.zeros(X_b.shape[1])
    for _ in range(iterations):
        d = 0.25 * (X_a @ ta + X_b @ tb) - 0.5 * y
        ta = ta - lr * (X_a.T @ d) / len(y)
        tb = tb - lr * (X_b.T @ d) / len(y)
    return ta, tb


def _fx(x, f):
    """round(x · 2^f) as Python ints (exact, any size)."""
    return [int(v) for v in np.round(np.asarray(x, dtype=np.float64) * 2.0 ** f)]


def train_fixed_point(X_a, X_b, y, *, lr: float = 0.5, iterations: int = 20,
                      frac_bits: int = 16, fit_intercept: bool = True):
    """The protocol's integer arithmetic in the clear: what :func:`train_vertical` computes on
    ciphertexts, step for step (so their weights agree exactly)."""
    X_a, X_b, y = _check(X_a, X_b, y, "train_fixed_point")
    X_b = _with_intercept(X_b, fit_intercept)
    f, N = frac_bits, len(y)
    xa = [_fx(row, f) for row in X_a.T]
    xb = [_fx(row, f) for row in X_b.T]
    ta, tb = np.zeros(X_a.shape[1]), np.zeros(X_b.shape[1])
    for _ in range(iterations):
        d = [a + b for a, b in zip(_fx(0.25 * (X_a @ ta), f), _fx(0.25 * (X_b @ tb) - 0.5 * y, f))]
        ga = np.array([sum(x * di for x, di in zip(col, d)) for col in xa], dtype=np.float64)
        gb = np.array([sum(x * di for x, di in zip(col, d)) for col in xb], dtype=np.float64)
        ta = ta - lr * ga / 2.0 ** (2 * f) / N
        tb = tb - lr * gb / 2.0 ** (2 * f) / N
    return ta, tb


def _encrypted_gradient(pk, cts, cts_inv, column):
    """Π_i [[d_i]]^{x_i} with negative x_i taken from the inverted ciphertexts."""
    acc = 1
    for c, ci, x in zip(cts, cts_inv, column):
        if x > 0:
            acc = acc * pow(c, x, pk.n2) % pk.n2
        elif x < 0:
            acc = acc * pow(ci, -x, pk.n2) % pk.n2
    return acc


def train_vertical(X_a, X_b, y, *, lr: float = 0.5, iterations: int = 20,
                   frac_bits: int = 16, key_bits: int = 512, key=None,
                   fit_intercept: bool = True, rng=None) -> VerticalResult:
    """Train the logistic regression jointly with Paillier encryption and a coordinator.

    Args:
        X_a: party A's features (N, d_a), rows aligned with B's (see :func:`align`).
        X_b: party B's features (N, d_b).
        y: B's labels in {−1, +1}.
        lr: learning rate of full-batch gradient descent.
        iterations: gradient steps.
        frac_bits: f of the fixed-point encoding (gradients carry 2^2f).
        key_bits: size of the coordinator's Paillier n (512 in the chapter: teaching only).
        key: a ``paillier.PaillierPrivateKey`` to use instead of generating one.
        fit_intercept: B adds a column of ones (the intercept is B's last weight).
        rng: keys, encryption randomness and masks (``primes.as_rng``).
    """
    X_a, X_b, y = _check(X_a, X_b, y, "train_vertical")
    X_b = _with_intercept(X_b, fit_intercept)
    r = as_rng(rng)
    sk = key or paillier.generate(key_bits, r)  # the coordinator's key pair
    pk = sk.public
    f, N = frac_bits, len(y)
    bound = 2 ** (2 * f) * N * 4 * max(1.0, float(np.abs(X_a).max(initial=1)),
                                       float(np.abs(X_b).max(initial=1))) ** 2 * 64
    if bound >= pk.n // 2:
        raise ArgumentError(f"train_vertical: a {pk.bits}-bit key is too small for 2^{2 * f} "
                            f"fixed point over {N} samples")
    xa = [_fx(col, f) for col in X_a.T]
    xb = [_fx(col, f) for col in X_b.T]
    ta, tb = np.zeros(X_a.shape[1]), np.zeros(X_b.shape[1])
    ct, pt = pk.ciphertext_bytes, (pk.n.bit_length() + 7) // 8
    links = ("A->B", "B->A", "A->C", "B->C", "C->A", "C->B")
    messages, nbytes = dict.fromkeys(links, 0), dict.fromkeys(links, 0)
    history = []
    for _ in range(iterations):
        # 1. A -> B: [[¼ u_A]]
        enc_ua = [paillier.encrypt(pk, v, r) for v in _fx(0.25 * (X_a @ ta), f)]
        # 2. B -> A: [[d]] = [[¼ u_A]] + (¼ u_B − ½ y)
        enc_d = [paillier.add_plain(pk, c, v)
                 for c, v in zip(enc_ua, _fx(0.25 * (X_b @ tb) - 0.5 * y, f))]
        enc_d_inv = [pow(c, -1, pk.n2) for c in enc_d]
        # 3. each party: masked encrypted gradient -> C
        masked, masks = {}, {}
        for party, cols in (("A", xa), ("B", xb)):
            masks[party] = [r.randrange(pk.n) for _ in cols]
            masked[party] = [paillier.add_plain(pk, _encrypted_gradient(pk, enc_d, enc_d_inv, col),
                                                m) for col, m in zip(cols, masks[party])]
        # 4. C decrypts the masked values; each party unmasks and steps
        grads = {}
        for party in ("A", "B"):
            plain = [paillier.decrypt(sk, c) for c in masked[party]]
            fp = paillier.FixedPoint(pk.n, f)
            grads[party] = np.array([fp.decode(m - R, scale=2)
                                     for m, R in zip(plain, masks[party])])
        ta = ta - lr * grads["A"] / N
        tb = tb - lr * grads["B"] / N
        history.append((ta.copy(), tb.copy()))
        for link, count, size in (("A->B", N, ct), ("B->A", N, ct), ("A->C", len(xa), ct),
                                  ("B->C", len(xb), ct), ("C->A", len(xa), pt),
                                  ("C->B", len(xb), pt)):
            messages[link] += 1
            nbytes[link] += count * size
    return VerticalResult(ta, tb, history, messages, nbytes, pk.bits)


def align(ids_a, ids_b, *, bits: int = 1024, key=None, rng=None):
    """Sample alignment by RSA-blind-signature PSI: A signs, B learns the common ids and tells
    A which they are (in B's order).

    Returns:
        ``(common, rows_a, rows_b)``: the common ids and their row indices in each party's list.
    """
    result = psi.private_set_intersection(ids_a, ids_b, key, bits=bits, rng=rng)
    pos_a = {v: i for i, v in enumerate(ids_a)}
    pos_b = {v: i for i, v in enumerate(ids_b)}
    common = result.intersection
    return common, np.array([pos_a[v] for v in common], dtype=np.int64), \
        np.array([pos_b[v] for v in common], dtype=np.int64)
