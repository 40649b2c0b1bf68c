"""Shapley values of a tabular model: exact (all 2^M coalitions) and KernelSHAP.

A coalition z in {0, 1}^M keeps the features where z_i = 1 and takes the others from each row of
a background set; its value v(z) is the mean target output over the background (SHAP's
interventional value, its ``Independent`` masker). Exact Shapley values weight each marginal
contribution by |S|! (M - |S| - 1)! / M!. KernelSHAP (Lundberg & Lee 2017) fits a linear model
g(z) = phi_0 + sum_i z_i phi_i to v by weighted least squares with the Shapley kernel
pi(z) = (M - 1) / (C(M, |z|) |z| (M - |z|)); the empty and full coalitions have infinite weight,
so they become the constraints phi_0 = v(0) and phi_0 + sum phi = v(1). With every coalition the
fit is exactly the Shapley values; with sampled coalitions it is an estimate.
"""

from math import comb, factorial

import numpy as np

from ..errors import ArgumentError, ShapeError
from .core import CountedModel, check_count, check_input


def shapley_kernel(M: int, size):
    """The Shapley kernel weight of a coalition of ``size`` features out of ``M`` (``inf`` for
    size 0 and M). ``size`` may be an array."""
    M = check_count("shapley_kernel", "M", M, 2)
    s = np.asarray(size)
    if np.any((s < 0) | (s > M)):
        raise ArgumentError(f"shapley_kernel: sizes must be in [0, {M}], got {size!r}")
    binom = np.vectorize(lambda k: float(comb(M, int(k))), otypes=[float])(s)
    with np.errstate(divide="ignore"):
        w = (M - 1) / (binom * s * (M - s))
    return w if w.ndim else float(w)


def all_coalitions(M: int) -> np.ndarray:
    """Every coalition as a (2^M, M) 0/1 array; row k is the binary digits of k (feature i is
    bit i)."""
    M = check_count("all_coalitions", "M", M)
    if M > 20:
        raise ArgumentError(f"all_coalitions: 2^{M} coalitions is too many (M <= 20)")
    k = np.arange(2 ** M)
    return ((k[:, None] >> np.arange(M)) & 1).astype(np.int8)


class CoalitionGame:
    """v(z) for a model, one input ``x`` and a ``background`` set (rows like x), counted.

    Args:
        model, target: as for every explainer; x: (M,) features; background: (B, M).
    """

    def __init__(self, model, x, background, target=None, fn="shapley"):
        self.x = check_input(fn, x, 1)
        bg = np.asarray(background, dtype=self.x.dtype)
        if bg.ndim != 2 or bg.shape[1] != self.x.shape[0]:
            raise ShapeError(f"{fn}: background must be (B, {self.x.shape[0]}) rows like x, "
                             f"got shape {bg.shape}")
        self.background = bg
        self.M = self.x.shape[0]
        self.model = CountedModel(model, target, fn)

    def __call__(self, Z, batch_rows: int = 65536) -> np.ndarray:
        """v(z) for each row of Z (n, M): the mean target over the background."""
        Z = np.asarray(Z).astype(bool)
        if Z.ndim != 2 or Z.shape[1] != self.M:
            raise ShapeError(f"CoalitionGame: coalitions must be (n, {self.M}), got {Z.shape}")
        B = len(self.background)
        out = np.empty(len(Z))
        per = max(1, batch_rows // B)
        for start in range(0, len(Z), per):
            z = Z[start:start + per]
            rows = np.where(z[:, None, :], self.x[None, None, :], self.background[None])
            out[start:start + per] = self.model.values(rows.reshape(-1, self.M)) \
                .reshape(len(z), B).mean(axis=1)
        return out


def shapley_from_values(v: np.ndarray, M: int) -> np.ndarray:
    """Exact Shapley values from v over :func:`all_coalitions` (M) order."""
    v = np.asarray(v, np.float64)
    k = np.arange(2 ** M)
    sizes = np.array([bin(i).count("1") for i in range(2 ** M)])
    weight = np.array([factorial(s) * factorial(M - s - 1) / factorial(M) if s < M else 0.0
                       for s in range(M + 1)])
    phi = np.empty(M)
    for i in range(M):
        without = k[(k >> i) & 1 == 0]
        phi[i] = np.sum(weight[sizes[without]] * (v[without | (1 << i)] - v[without]))
    return phi


def exact_shapley(model, x, background, target=None):
    """Exact (interventional) Shapley values of ``x`` (M,) against ``background`` (B, M).

    Returns:
        An :class:`Explanation`: ``attributions`` (M,), ``info['base_value']`` = v(empty set),
        ``info['coalitions']`` = 2^M. Cost: 2^M * B forward.
    """
    game = CoalitionGame(model, x, background, target, "exact_shapley")
    Z = all_coalitions(game.M)
    v = game(Z)
    phi = shapley_from_values(v, game.M)
    return game.model.explanation(phi, "exact_shapley", base_value=float(v[0]),
                                  coalitions=len(Z))


def kernel_shap_solve(Z, v, weights, v_empty, v_full):
    """The constrained weighted least squares of KernelSHAP.

    Minimises sum_k w_k (phi_0 + z_k . phi - v_k)^2 subject to phi_0 = v_empty and
    phi_0 + sum(phi) = v_full, by eliminating the last feature's phi.

    Args:
        Z: (n, M) coalitions (neither empty nor full); v: (n,) their values; weights: (n,).
    """
    Z = np.asarray(Z, np.float64)
    M = Z.shape[1]
    y = np.asarray(v, np.float64) - v_empty - Z[:, -1] * (v_full - v_empty)
    X = Z[:, :-1] - Z[:, -1:]
    sw = np.sqrt(np.asarray(weights, np.float64))
    head, *_ = np.linalg.lstsq(X * sw[:, None], y * sw, rcond=None)
    phi = np.empty(M)
    phi[:-1] = head
    phi[-1] = (v_full - v_empty) - head.sum()
    return phi


def sample_coalitions(M: int, n: int, rng, paired: bool = True) -> np.ndarray:
    """``n`` coalitions drawn with probability proportional to the Shapley kernel: a size k in
    1..M-1 with probability proportional to (M - 1) / (k (M - k)), then k features uniformly.
    With ``paired`` each draw is followed by its complement (same weight, lower variance)."""
    sizes = np.arange(1, M)
    p = 1.0 / (sizes * (M - sizes))
    p /= p.sum()
    out = np.zeros((n, M), np.int8)
    k = 0
    while k < n:
        s = rng.choice(sizes, p=p)
        idx = rng.permutation(M)[:s]
        out[k, idx] = 1
        k += 1
        if paired and k < n:
            out[k] = 1 - out[k - 1]
            k += 1
    return out


def kernel_shap(model, x, background, target=None, samples=None, seed: int = 0,
                paired: bool = True):
    """KernelSHAP attributions of ``x`` (M,) against ``background`` (B, M).

    Args:
        samples: ``None`` (or >= 2^M - 2) enumerates every coalition with its kernel weight
            (the result then equals :func:`exact_shapley`); otherwise that many coalitions are
            sampled from the kernel and fitted with equal weights.
        seed, paired: the sampling's seed and whether complements are paired.

    Returns:
        An :class:`Explanation` with ``info['coalitions']`` (the model is run on
        coalitions + 2 of them, each over the background) and ``info['base_value']``.
    """
    game = CoalitionGame(model, x, background, target, "kernel_shap")
    M = game.M
    if M < 2:
        raise ArgumentError(f"kernel_shap: needs at least 2 features, got {M}")
    ends = game(np.array([np.zeros(M), np.ones(M)]))
    if samples is None or samples >= 2 ** M - 2:
        Z = all_coalitions(M)[1:-1]
        weights = shapley_kernel(M, Z.sum(axis=1))
        method = "kernel_shap (all coalitions)"
    else:
        samples = check_count("kernel_shap", "samples", samples, M)
        Z = sample_coalitions(M, samples, np.random.default_rng(seed), paired)
        weights = np.ones(len(Z))
        method = "kernel_shap"
    phi = kernel_shap_solve(Z, game(Z), weights, ends[0], ends[1])
    return game.model.explanation(phi, method, base_value=float(ends[0]),
                                  coalitions=len(Z))
