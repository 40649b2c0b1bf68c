"""Pooling and its gradients as Numba loops: the ``cpu`` kernels of ``max_pool2d``,
``max_pool2d_scatter`` (its VJP), ``max_pool2d_select`` (its JVP), ``avg_pool2d`` and
``avg_pool2d_grad`` (registered by :mod:`.registration`).

Each is one pass over the input plane by plane, where the numpy references build padded
copies, window views and index arrays. They keep the references' conventions exactly: padding
counts as -inf for max and 0 for the mean (PyTorch's ``count_include_pad=True``); a window's
maximum is its first one in row-major order, or its first NaN (``np.argmax``'s choice), and it
alone receives the window's gradient; a window position in the padding gets none.
"""

import numpy as np
from numba import njit

from ..engine.numba_cache import CACHE

_JIT = dict(cache=CACHE, error_model="numpy")


# Each loop body is inlined into its kernel twice, for 2×2 windows and for any size: with the
# window size a constant, LLVM unrolls the window loops (each variant costs compile time, so
# only the commonest window has its own). Comparisons pick values with selects, not branches
# (a max of random data mispredicts every other branch).
@njit(cache=CACHE, inline="always")
def _inside(plane, i0, j0, kh, kw):
    return i0 >= 0 and j0 >= 0 and i0 + kh <= plane.shape[0] and j0 + kw <= plane.shape[1]


@njit(cache=CACHE, inline="always")
def _at(plane, i, j, neg):
    """plane[i, j], or ``neg`` (-inf of the plane's dtype) in the padding."""
    return plane[i, j] if 0 <= i < plane.shape[0] and 0 <= j < plane.shape[1] else neg


@njit(cache=CACHE, inline="always")
def _interior(count, size, k, step, pad):
    """[lo, hi): the window positions q in [0, count) that lie wholly inside (no padding)."""
    lo = min(count, (pad + step - 1) // step)
    hi = min(count, (size - k + pad) // step + 1) if size - k + pad >= 0 else 0
    return lo, max(lo, hi)


@njit(cache=CACHE)
def _edge_max(plane, i0, j0, kh, kw, neg):
    """The maximum of a window that reaches into the padding (-inf there; NaN wins)."""
    best = neg
    for i in range(kh):
        for j in range(kw):
            v = _at(plane, i0 + i, j0 + j, neg)
            best = v if (v > best) | (v != v) else best
    return best


@njit(cache=CACHE, inline="always")
def _inner_max(plane, i0, j0, kh, kw):
    """The maximum of a window wholly inside the plane (NaN wins)."""
    best = plane[i0, j0]
    for i in range(kh):
        for j in range(kw):
            v = plane[i0 + i, j0 + j]
            best = v if (v > best) | (v != v) else best
    return best


@njit(cache=CACHE)
def _edge_argmax(plane, i0, j0, kh, kw, neg):
    """The tap (i·kw + j) of the first maximum, or first NaN, of a window that reaches into
    the padding (-inf there, so a window of padding and -inf answers tap 0)."""
    best, tap = _at(plane, i0, j0, neg), 0
    for i in range(kh):
        for j in range(kw):
            v = _at(plane, i0 + i, j0 + j, neg)
            take = (v > best) | ((v != v) & (best == best))
            best = v if take else best
            tap = i * kw + j if take else tap
    return tap


@njit(cache=CACHE, inline="always")
def _inner_argmax(plane, i0, j0, kh, kw):
    """The tap of the first maximum, or first NaN, of a window wholly inside the plane."""
    best, tap = plane[i0, j0], 0
    for i in range(kh):
        for j in range(kw):
            v = plane[i0 + i, j0 + j]
            take = (v > best) | ((v != v) & (best == best))
            best = v if take else best
            tap = i * kw + j if take else tap
    return tap


@njit(cache=CACHE, inline="always")
def _row_taps(plane, taps, p, kh, kw, sh, sw, ph, pw, neg):
    """taps[q] = the argmax tap of every window of output row p (interior windows in a loop
    of their own, which LLVM vectorises; a call in the loop would stop it)."""
    ow = taps.shape[0]
    i0 = p * sh - ph
    lo, hi = _interior(ow, plane.shape[1], kw, sw, pw)
    if i0 < 0 or i0 + kh > plane.shape[0]:
        lo = hi = ow
    for q in range(lo, hi):
        taps[q] = _inner_argmax(plane, i0, q * sw - pw, kh, kw)
    for q in range(lo):
        taps[q] = _edge_argmax(plane, i0, q * sw - pw, kh, kw, neg)
    for q in range(hi, ow):
        taps[q] = _edge_argmax(plane, i0, q * sw - pw, kh, kw, neg)


@njit(cache=CACHE, inline="always")
def _max_pool_body(x, out, kh, kw, sh, sw, ph, pw, neg):
    n_img, ch, oh, ow = out.shape
    for n in range(n_img):
        for c in range(ch):
            plane, dst = x[n, c], out[n, c]
            lo, hi = _interior(ow, plane.shape[1], kw, sw, pw)
            for p in range(oh):
                i0 = p * sh - ph
                a, b = (lo, hi) if 0 <= i0 and i0 + kh <= plane.shape[0] else (ow, ow)
                for q in range(a, b):
                    dst[p, q] = _inner_max(plane, i0, q * sw - pw, kh, kw)
                for q in range(a):
                    dst[p, q] = _edge_max(plane, i0, q * sw - pw, kh, kw, neg)
                for q in range(b, ow):
                    dst[p, q] = _edge_max(plane, i0, q * sw - pw, kh, kw, neg)


@njit(cache=CACHE, inline="always")
def _max_pool_scatter_body(g, x, out, kh, kw, sh, sw, ph, pw, neg):
    n_img, ch, h, w = out.shape
    oh, ow = g.shape[2:]
    taps = np.zeros(ow, np.int64)
    for n in range(n_img):
        for c in range(ch):
            plane, grad = x[n, c], out[n, c]
            for i in range(h):
                for j in range(w):
                    grad[i, j] = 0
            for p in range(oh):  # the row's taps first, in a loop that vectorises; then adds
                _row_taps(plane, taps, p, kh, kw, sh, sw, ph, pw, neg)
                for q in range(ow):
                    i, j = p * sh - ph + taps[q] // kw, q * sw - pw + taps[q] % kw
                    if 0 <= i < h and 0 <= j < w:
                        grad[i, j] += g[n, c, p, q]


@njit(cache=CACHE, inline="always")
def _max_pool_select_body(u, x, out, kh, kw, sh, sw, ph, pw, neg):
    n_img, ch, oh, ow = out.shape
    h, w = x.shape[2:]
    taps = np.zeros(ow, np.int64)
    for n in range(n_img):
        for c in range(ch):
            plane = x[n, c]
            for p in range(oh):
                _row_taps(plane, taps, p, kh, kw, sh, sw, ph, pw, neg)
                for q in range(ow):
                    i, j = p * sh - ph + taps[q] // kw, q * sw - pw + taps[q] % kw
                    out[n, c, p, q] = u[n, c, i, j] if 0 <= i < h and 0 <= j < w else 0


@njit(cache=CACHE, inline="always")
def _window_sum(plane, i0, j0, kh, kw):
    """The sum (in float64) of the window's pixels inside the plane (padding adds zeros)."""
    total = 0.0
    if _inside(plane, i0, j0, kh, kw):
        for i in range(kh):
            for j in range(kw):
                total += plane[i0 + i, j0 + j]
        return total
    for i in range(max(i0, 0), min(i0 + kh, plane.shape[0])):
        for j in range(max(j0, 0), min(j0 + kw, plane.shape[1])):
            total += plane[i, j]
    return total


@njit(cache=CACHE, inline="always")
def _avg_pool_body(x, out, kh, kw, sh, sw, ph, pw):
    n_img, ch, oh, ow = out.shape
    scale = 1.0 / (kh * kw)
    for n in range(n_img):
        for c in range(ch):
            plane = x[n, c]
            for p in range(oh):
                for q in range(ow):
                    out[n, c, p, q] = _window_sum(plane, p * sh - ph, q * sw - pw, kh, kw) * scale


@njit(cache=CACHE)
def _spread_edge(grad, share, i0, j0, kh, kw):
    """Add ``share`` to the pixels of a window that reaches into the padding."""
    for i in range(max(i0, 0), min(i0 + kh, grad.shape[0])):
        for j in range(max(j0, 0), min(j0 + kw, grad.shape[1])):
            grad[i, j] += share


@njit(cache=CACHE, inline="always")
def _avg_pool_grad_body(g, out, kh, kw, sh, sw, ph, pw):
    n_img, ch, h, w = out.shape
    oh, ow = g.shape[2:]
    scale = 1.0 / (kh * kw)
    lo, hi = _interior(ow, w, kw, sw, pw)
    for n in range(n_img):
        for c in range(ch):
            grad = out[n, c]
            for i in range(h):
                for j in range(w):
                    grad[i, j] = 0
            for p in range(oh):
                i0 = p * sh - ph
                a, b = (lo, hi) if 0 <= i0 and i0 + kh <= h else (ow, ow)
                for q in range(a, b):
                    share, j0 = g[n, c, p, q] * scale, q * sw - pw
                    for i in range(kh):
                        for j in range(kw):
                            grad[i0 + i, j0 + j] += share
                for q in range(a):
                    _spread_edge(grad, g[n, c, p, q] * scale, i0, q * sw - pw, kh, kw)
                for q in range(b, ow):
                    _spread_edge(grad, g[n, c, p, q] * scale, i0, q * sw - pw, kh, kw)


@njit(**_JIT)
def _max_pool_planes(x, out, kh, kw, sh, sw, ph, pw, neg):
    if kh == 2 and kw == 2:
        _max_pool_body(x, out, 2, 2, sh, sw, ph, pw, neg)
    else:
        _max_pool_body(x, out, kh, kw, sh, sw, ph, pw, neg)


@njit(**_JIT)
def _max_pool_scatter_planes(g, x, out, kh, kw, sh, sw, ph, pw, neg):
    if kh == 2 and kw == 2:
        _max_pool_scatter_body(g, x, out, 2, 2, sh, sw, ph, pw, neg)
    else:
        _max_pool_scatter_body(g, x, out, kh, kw, sh, sw, ph, pw, neg)


@njit(**_JIT)
def _max_pool_select_planes(u, x, out, kh, kw, sh, sw, ph, pw, neg):
    if kh == 2 and kw == 2:
        _max_pool_select_body(u, x, out, 2, 2, sh, sw, ph, pw, neg)
    else:
        _max_pool_select_body(u, x, out, kh, kw, sh, sw, ph, pw, neg)


@njit(**_JIT)
def _avg_pool_planes(x, out, kh, kw, sh, sw, ph, pw):
    if kh == 2 and kw == 2:
        _avg_pool_body(x, out, 2, 2, sh, sw, ph, pw)
    else:
        _avg_pool_body(x, out, kh, kw, sh, sw, ph, pw)


@njit(**_JIT)
def _avg_pool_grad_planes(g, out, kh, kw, sh, sw, ph, pw):
    if kh == 2 and kw == 2:
        _avg_pool_grad_body(g, out, 2, 2, sh, sw, ph, pw)
    else:
        _avg_pool_grad_body(g, out, kh, kw, sh, sw, ph, pw)


def _window(kernel, stride, padding):
    return (*kernel, *stride, *padding)


def _neg_inf(x):
    """-inf as a scalar of ``x``'s dtype (the value of max pooling's padding)."""
    return np.array(-np.inf, x.dtype)[()]


def _c_order(out):
    """``out`` if it is C-contiguous, else a temporary to copy into it afterwards (see
    :func:`_done`). Inputs are made C-contiguous too: one compiled variant of each loop per
    dtype, not one per layout."""
    return out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)


def _done(out, target):
    if target is not out:
        np.copyto(out, target)


def max_pool2d_out(out, x, kernel, stride, padding):
    """``max_pool2d`` into ``out``: the maximum (NaN if any) of each window."""
    target = _c_order(out)
    _max_pool_planes(np.ascontiguousarray(x), target, *_window(kernel, stride, padding),
                     _neg_inf(x))
    _done(out, target)


def max_pool2d_scatter_out(out, g, x, kernel, stride, padding):
    """``max_pool2d_scatter`` into ``out``: each window's ``g`` added at its first maximum."""
    target = _c_order(out)
    _max_pool_scatter_planes(np.ascontiguousarray(g), np.ascontiguousarray(x), target,
                             *_window(kernel, stride, padding), _neg_inf(x))
    _done(out, target)


def max_pool2d_select_out(out, u, x, kernel, stride, padding):
    """``max_pool2d_select`` into ``out``: ``u`` read at each window's first maximum."""
    target = _c_order(out)
    _max_pool_select_planes(np.ascontiguousarray(u), np.ascontiguousarray(x), target,
                            *_window(kernel, stride, padding), _neg_inf(x))
    _done(out, target)


def avg_pool2d_out(out, x, kernel, stride, padding):
    """``avg_pool2d`` into ``out``: each window's sum (accumulated in float64) / its size."""
    target = _c_order(out)
    _avg_pool_planes(np.ascontiguousarray(x), target, *_window(kernel, stride, padding))
    _done(out, target)


def avg_pool2d_grad_out(out, g, x_shape, kernel, stride, padding):
    """``avg_pool2d_grad`` into ``out``: each window's ``g / size`` spread over its pixels."""
    target = _c_order(out)
    _avg_pool_grad_planes(np.ascontiguousarray(g), target, *_window(kernel, stride, padding))
    _done(out, target)
