"""Gradient-checking helpers: float64 central differences as the independent oracle."""

import numpy as np

import mlsys_lab as ml


def as_fn(fn):
    """numpy arrays in, numpy array out."""
    return lambda *arrs: np.asarray(fn(*[ml.tensor(a) for a in arrs]).numpy(), dtype=np.float64)


def numeric_vjp(fn, xs, u, diff, eps=1e-6):
    """Central-difference gradient of <fn(xs), u> w.r.t. each input listed in ``diff``."""
    f = as_fn(fn)
    out = []
    for i in diff:
        g = np.zeros(xs[i].shape)
        for idx in np.ndindex(xs[i].shape):
            plus = [a.copy() for a in xs]
            minus = [a.copy() for a in xs]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            g[idx] = (np.sum(f(*plus) * u) - np.sum(f(*minus) * u)) / (2 * eps)
        out.append(g)
    return out


def tape_vjp(fn, xs, u, diff):
    ts = [ml.tensor(a, requires_grad=(i in diff)) for i, a in enumerate(xs)]
    y = fn(*ts)
    (y * ml.tensor(u)).sum().backward()
    return [ts[i].grad.numpy() if ts[i].grad is not None else np.zeros(xs[i].shape)
            for i in diff]


def noncontiguous(a):
    """The same values in a non-contiguous layout (a strided view of a bigger array)."""
    if a.ndim == 0:
        return a
    big = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
    big[..., ::2] = a
    view = big[..., ::2]
    assert not view.flags.c_contiguous or a.shape[-1] <= 1
    return view
