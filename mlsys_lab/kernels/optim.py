"""Dense optimiser updates in one fused pass each, in place, with no temporary.

numpy's ``p -= lr * g`` first writes ``lr * g`` into a fresh array the size of ``p``. For a
10^6 x 64 float32 embedding table that is 256 MB of new pages to fault in and zero, written and
read again: the update took 34 ms where one pass over ``p`` and ``g`` takes 13 ms
(``benchmarks/recsys.py`` times the dense embedding step that uses it). Adam's numpy update
builds about eight such temporaries (``(1 - b1) * g``, ``g * g``, ``sqrt(v)``, ...), RMSProp's
and Adagrad's five. Each loop here does the numpy formula's float operations one by one, in
the same order and in the same dtypes, so it leaves the parameter and the state arrays
bit-identical to numpy's:

* a hyper-parameter (a Python number) meets an array of the parameter's dtype, so numpy
  rounds it to that dtype and computes in that dtype (NEP 50), and so does the loop;
* Adam's step size ``lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)`` is a NumPy float64 (it comes out
  of ``np.sqrt``), so numpy computes ``lr_t * m / (sqrt(v) + eps)`` in float64 even for a
  float32 parameter and rounds it to float32 before the subtraction: the loop does the same;
* no fused multiply-add: Numba compiles without fast-math, so LLVM never contracts ``a * b + c``.

``*_dense_reference`` are the numpy formulas (what ``optim.Adam``, ``RMSProp`` and ``Adagrad``
ran before), the oracles of the tests and the benchmark's baseline. The row-sparse updates are
in :mod:`mlsys_lab.kernels.embedding`.
"""

import numba
import numpy as np

from ..engine.numba_cache import CACHE
from .embedding import _KERNEL_DTYPES


def _fusable(p, *arrays):
    """Whether the fused loops take these arrays: C-contiguous float32/float64 of one shape
    and dtype, non-empty, all written ones writeable (else the numpy formula runs)."""
    return (p.dtype in _KERNEL_DTYPES and p.size and p.flags.c_contiguous
            and all(a.dtype == p.dtype and a.shape == p.shape and a.flags.c_contiguous
                    for a in arrays))


def _writeable(*arrays):
    return all(a.flags.writeable for a in arrays)


# --- SGD -----------------------------------------------------------------------------------------
@numba.njit(cache=CACHE, error_model="numpy")
def _sgd_kernel(p, g, lr):
    for i in range(p.shape[0]):
        p[i] -= lr * g[i]


def sgd_dense(p, g, lr):
    """``p -= p.dtype(lr) * g`` in place (float ops as numpy's); returns ``p``. A fused Numba
    pass for C-contiguous float32/float64 arrays of one shape and dtype, numpy otherwise."""
    if _fusable(p, g) and _writeable(p):
        _sgd_kernel(p.reshape(-1), g.reshape(-1), p.dtype.type(lr))
    else:
        p -= np.asarray(lr, p.dtype) * g
    return p


# --- Adam ----------------------------------------------------------------------------------------
@numba.njit(cache=CACHE, error_model="numpy")
def _adam_kernel(p, g, m, v, c_b1, c_1b1, c_b2, c_1b2, lr_t, eps, wd, use_wd, rounded):
    """One Adam step, element by element, in numpy's order; ``rounded`` is a 1-element array
    of the parameter's dtype that rounds the float64 step to it (as numpy's ``astype``)."""
    for i in range(p.shape[0]):
        gi = g[i]
        if use_wd:
            gi = gi + wd * p[i]
        mi = m[i] * c_b1
        mi = mi + c_1b1 * gi
        m[i] = mi
        vi = v[i] * c_b2
        vi = vi + c_1b2 * gi * gi
        v[i] = vi
        den = np.sqrt(vi) + eps
        rounded[0] = lr_t * np.float64(mi) / np.float64(den)
        p[i] = p[i] - rounded[0]


def adam_step_size(lr, beta1, beta2, t):
    """Adam's bias-corrected step ``lr sqrt(1 - beta2^t) / (1 - beta1^t)`` (a NumPy float64,
    as ``optim.Adam`` has always computed it)."""
    return lr * np.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)


def adam_dense(p, g, m, v, lr, beta1, beta2, eps, weight_decay, t):
    """Adam's step ``t`` in place on ``p`` and its moments ``m``, ``v`` (the float ops of
    :func:`adam_dense_reference`, bit-identical, in one pass without temporaries); returns
    ``p``. Hyper-parameters are Python numbers (``optim.Optimizer`` makes them so)."""
    if not (_fusable(p, g, m, v) and _writeable(p, m, v)):
        return adam_dense_reference(p, g, m, v, lr, beta1, beta2, eps, weight_decay, t)
    d = p.dtype.type
    _adam_kernel(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), d(beta1),
                 d(1 - beta1), d(beta2), d(1 - beta2),
                 np.float64(adam_step_size(lr, beta1, beta2, t)), d(eps), d(weight_decay),
                 bool(weight_decay), np.empty(1, p.dtype))
    return p


def adam_dense_reference(p, g, m, v, lr, beta1, beta2, eps, weight_decay, t):
    """The numpy formula of :func:`adam_dense` (``optim.Adam``'s update before it was fused)."""
    if weight_decay:
        g = g + weight_decay * p
    m *= beta1
    m += (1 - beta1) * g
    v *= beta2
    v += (1 - beta2) * g * g
    lr_t = adam_step_size(lr, beta1, beta2, t)
    p -= (lr_t * m / (np.sqrt(v) + eps)).astype(p.dtype, copy=False)
    return p


# --- RMSProp -------------------------------------------------------------------------------------
@numba.njit(cache=CACHE, error_model="numpy")
def _rmsprop_kernel(p, g, sq, c_a, c_1a, lr, eps, wd, use_wd):
    for i in range(p.shape[0]):
        gi = g[i]
        if use_wd:
            gi = gi + wd * p[i]
        s = sq[i] * c_a
        s = s + c_1a * gi * gi
        sq[i] = s
        p[i] = p[i] - lr * gi / (np.sqrt(s) + eps)


def rmsprop_dense(p, g, square_avg, lr, alpha, eps, weight_decay):
    """RMSProp's step in place on ``p`` and ``square_avg`` (the float ops of
    :func:`rmsprop_dense_reference`, bit-identical, in one pass); returns ``p``."""
    if not (_fusable(p, g, square_avg) and _writeable(p, square_avg)):
        return rmsprop_dense_reference(p, g, square_avg, lr, alpha, eps, weight_decay)
    d = p.dtype.type
    _rmsprop_kernel(p.reshape(-1), g.reshape(-1), square_avg.reshape(-1), d(alpha),
                    d(1 - alpha), d(lr), d(eps), d(weight_decay), bool(weight_decay))
    return p


def rmsprop_dense_reference(p, g, square_avg, lr, alpha, eps, weight_decay):
    """The numpy formula of :func:`rmsprop_dense` (``optim.RMSProp``'s update before)."""
    if weight_decay:
        g = g + weight_decay * p
    square_avg *= alpha
    square_avg += (1 - alpha) * g * g
    p -= (lr * g / (np.sqrt(square_avg) + eps)).astype(p.dtype, copy=False)
    return p


# --- Adagrad -------------------------------------------------------------------------------------
@numba.njit(cache=CACHE, error_model="numpy")
def _adagrad_kernel(p, g, acc, lr, eps, wd, use_wd):
    for i in range(p.shape[0]):
        gi = g[i]
        if use_wd:
            gi = gi + wd * p[i]
        s = acc[i] + gi * gi
        acc[i] = s
        p[i] = p[i] - lr * gi / (np.sqrt(s) + eps)


def adagrad_dense(p, g, acc, lr, eps, weight_decay):
    """Adagrad's step in place on ``p`` and its sum of squares ``acc`` with the step's
    (already decayed) learning rate ``lr`` (the float ops of :func:`adagrad_dense_reference`,
    bit-identical, in one pass); returns ``p``."""
    if not (_fusable(p, g, acc) and _writeable(p, acc)):
        return adagrad_dense_reference(p, g, acc, lr, eps, weight_decay)
    d = p.dtype.type
    _adagrad_kernel(p.reshape(-1), g.reshape(-1), acc.reshape(-1), d(lr), d(eps),
                    d(weight_decay), bool(weight_decay))
    return p


def adagrad_dense_reference(p, g, acc, lr, eps, weight_decay):
    """The numpy formula of :func:`adagrad_dense` (``optim.Adagrad``'s update before)."""
    if weight_decay:
        g = g + weight_decay * p
    acc += g * g
    p -= (lr * g / (np.sqrt(acc) + eps)).astype(p.dtype, copy=False)
    return p


__all__ = ["sgd_dense", "adam_dense", "rmsprop_dense", "adagrad_dense", "adam_step_size",
           "adam_dense_reference", "rmsprop_dense_reference", "adagrad_dense_reference"]
