"""Convolution as BLAS matrix products: the ``cpu`` kernels of ``conv2d``, its two gradients and
``fused_conv`` that operator selection chooses (registered by :mod:`.registration`).

One img2col matrix serves all three passes. For an NCHW input and a kernel of K = C/groups·kh·kw
taps per output channel, ``cols`` is (C·kh·kw, N·OH·OW): row (c, i, j), column (n, p, q) holds
``xpad[n, c, p·sh + i·dh, q·sw + j·dw]`` — the library's one
:func:`~mlsys_lab.engine.im2col.im2col` in its "KNP" order (at stride 1 the columns run over the
padded width instead, see "the padded grid" below). The rows of group g are one contiguous block,
so each pass is one GEMM per group on plain row-major operands (numpy's BLAS, no copies):

* forward: ``Y (O, N·P) = W (O, K) @ cols``, then one pass turns Y into NCHW (adding the bias
  and applying the ReLU on the way for ``fused_conv``);
* weight gradient: ``gW (O, K) = G (O, N·P) @ colsᵀ``, where G is the cotangent in (O, N·P)
  order (one pass);
* input gradient: ``gcols (K, N·P) = Wᵀ @ G``, then col2img adds each column back onto the
  pixels its window read (the transpose of img2col).

Putting the batch into the columns makes each GEMM one large call: a batched product (one GEMM
per image) ran at half the speed on the CNN of ``benchmarks/train_step.py``. :mod:`.winograd`
has the Winograd F(2×2, 3×3) kernels.
"""

import numpy as np
from numba import njit

from ..engine.im2col import im2col
from ..engine.numba_cache import CACHE

_JIT = dict(cache=CACHE, error_model="numpy")
FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
# The loops are serial on purpose: numpy's BLAS runs the GEMMs on every core right after them,
# and an OpenMP team of Numba threads that spins after its parallel loop (the default) starves
# BLAS's threads, which made col2img + GEMM ten times slower than the two apart. Inner loops
# index 1-D views from 0 (LLVM then vectorises them; a computed flat index does not). Operands
# reach the loops C-contiguous (copied if need be), so each loop compiles once per dtype.


@njit(cache=CACHE, inline="always")
def _valid(count, size, step, offset):
    """[lo, hi): the q in [0, count) with 0 <= q·step + offset < size."""
    lo = 0 if offset >= 0 else (-offset + step - 1) // step
    hi = (size - 1 - offset) // step + 1 if size - 1 - offset >= 0 else 0
    hi = min(count, hi)
    return min(lo, hi), hi


def _col2img_loop(unit_stride):
    """The col2img loop, compiled separately for unit and other column strides (the strided
    add in the same function kept LLVM from vectorising the unit-stride one)."""
    def col2img_planes(cols, gx, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow):
        """The transpose of im2col's "KNP" matrix: gx[n, c] = the sum of every cols entry read
        from its pixels, taps in row-major order."""
        n_img, ch, h, w = gx.shape
        for n in range(n_img):
            for c in range(ch):
                plane = gx[n, c]
                plane[:, :] = 0
                for i in range(kh):
                    for j in range(kw):
                        row = cols[(c * kh + i) * kw + j]
                        off = j * dw - pw
                        lo, hi = _valid(ow, w, sw, off)
                        for p in range(oh):
                            ih = p * sh + i * dh - ph
                            if ih < 0 or ih >= h:
                                continue
                            src = row[(n * oh + p) * ow + lo:(n * oh + p) * ow + hi]
                            line = plane[ih]
                            dst = line[lo * sw + off:]
                            for q in range(src.shape[0]):
                                if unit_stride:
                                    dst[q] += src[q]
                                else:
                                    dst[q * sw] += src[q]
    return njit(**_JIT)(col2img_planes)


_col2img_unit, _col2img_strided = _col2img_loop(True), _col2img_loop(False)


# --- stride 1: img2col over the padded grid ---------------------------------------------------
# At stride 1 the columns can run over the padded input's full width Wp instead of OW: column
# (n, p, q) of row (c, i, j) is then xpad[n, c].flat[(p + i·dh)·Wp + q + j·dw], so each
# (row, image) pair is ONE contiguous copy of OH·Wp values rather than OH copies of OW. The
# GEMMs do (Wp / OW - 1) more work on the extra columns q >= OW, which the passes to and from
# NCHW drop (forward) or fill with zeros (the cotangent's rows).
@njit(**_JIT)
def _img2col_grid(xp, cols, kh, kw, dh, dw, oh):
    """cols[(c·kh + i)·kw + j, n·OH·Wp + t] = xp[n, c].flat[(i·dh)·Wp + j·dw + t] (``xp`` the
    padded input with one extra zero row, so the last copy stays inside its plane)."""
    n_img, _, _, wp = xp.shape
    size = oh * wp
    for r in range(cols.shape[0]):
        c, i, j = r // (kh * kw), (r // kw) % kh, r % kw
        shift = i * dh * wp + j * dw
        row = cols[r]
        for n in range(n_img):
            src, dst = xp[n, c].reshape(-1)[shift:shift + size], row[n * size:(n + 1) * size]
            for t in range(size):
                dst[t] = src[t]


@njit(**_JIT)
def _col2img_grid(cols, gxp, kh, kw, dh, dw, oh):
    """The transpose of :func:`_img2col_grid`: gxp[n, c].flat[shift + t] += cols[r, n·OH·Wp + t]
    (``gxp`` zeroed first; its padding and extra row are cropped afterwards)."""
    n_img, ch, _, wp = gxp.shape
    size = oh * wp
    for n in range(n_img):
        for c in range(ch):
            plane = gxp[n, c].reshape(-1)
            for t in range(plane.shape[0]):
                plane[t] = 0
            for i in range(kh):
                for j in range(kw):
                    shift = i * dh * wp + j * dw
                    src = cols[(c * kh + i) * kw + j, n * size:(n + 1) * size]
                    dst = plane[shift:shift + size]
                    for t in range(size):
                        dst[t] += src[t]


@njit(**_JIT)
def _to_nchw_grid(rows, out, bias, relu, wp):
    """out[n, o, p, q] = rows[o, (n·OH + p)·Wp + q] + bias[o] (max(·, 0) when relu); the
    strided path's rows have Wp = OW."""
    n_img, o_ch, oh, ow = out.shape
    for n in range(n_img):
        for o in range(o_ch):
            b = bias[o]
            src, dst = rows[o, n * oh * wp:(n + 1) * oh * wp], out[n, o]
            for p in range(oh):
                s, d = src[p * wp:p * wp + ow], dst[p]
                if relu:
                    for q in range(ow):
                        v = s[q] + b
                        d[q] = 0 if v <= 0 else v  # NaN stays NaN
                else:
                    for q in range(ow):
                        d[q] = s[q] + b


@njit(**_JIT)
def _to_rows_grid(g, rows, wp):
    """rows[o, (n·OH + p)·Wp + q] = g[n, o, p, q] for q < OW, 0 in the extra columns: a
    cotangent in the GEMMs' order (the strided path's rows have Wp = OW, no extra columns)."""
    n_img, o_ch, oh, ow = g.shape
    for o in range(o_ch):
        for n in range(n_img):
            dst = rows[o, n * oh * wp:(n + 1) * oh * wp]
            for p in range(oh):
                s, d = g[n, o, p], dst[p * wp:(p + 1) * wp]
                for q in range(ow):
                    d[q] = s[q]
                for q in range(ow, wp):
                    d[q] = 0


@njit(**_JIT)
def _zero_grid_extra(cols, oh, ow, wp):
    """Zero the extra columns (q >= OW) of every row: where the other operand holds non-finite
    values, their products with the cotangent's zeros would be NaN instead of 0."""
    for r in range(cols.shape[0]):
        row = cols[r]
        for start in range(0, row.shape[0], wp):
            for q in range(start + ow, start + wp):
                row[q] = 0


def padded_grid(x, padding, dilation, kernel):
    """``x`` zero-padded, plus one zero row (so every grid copy stays inside its plane), and the
    grid's output height."""
    (ph, pw), kh = padding, kernel[0]
    xp = np.zeros((*x.shape[:2], x.shape[2] + 2 * ph + 1, x.shape[3] + 2 * pw), x.dtype)
    xp[:, :, ph:ph + x.shape[2], pw:pw + x.shape[3]] = x
    return xp, x.shape[2] + 2 * ph - dilation[0] * (kh - 1)


def grid_cols(x, kernel, padding, dilation):
    """(cols over the padded grid, padded width Wp, OH) for a stride-1 convolution."""
    xp, oh = padded_grid(x, padding, dilation, kernel)
    cols = np.empty((x.shape[1] * kernel[0] * kernel[1], x.shape[0] * oh * xp.shape[3]),
                    x.dtype)
    _img2col_grid(xp, cols, kernel[0], kernel[1], dilation[0], dilation[1], oh)
    return cols, xp.shape[3], oh


def _geometry(kernel, stride, padding, dilation):
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    return kh, kw, sh, sw, ph, pw, dh, dw


def img2col_rows(x, kernel, stride, padding, dilation):
    """The (C·kh·kw, N·OH·OW) img2col matrix of NCHW ``x``: im2col in its "KNP" order (one
    numpy copy of the windows' view, which ran 1.0-1.5x as fast as the Numba loop it
    replaced)."""
    cols, _ = im2col(x, kernel, stride, padding, dilation, order="KNP")
    return cols.reshape(cols.shape[0], -1)


def _grouped(a, groups):
    """A 2-D operand as (groups, rows/groups, cols), or itself for one group."""
    return a if groups == 1 else a.reshape(groups, a.shape[0] // groups, a.shape[1])


def _c_order(out):
    """``out`` if it is C-contiguous, else a temporary to copy into it afterwards."""
    return out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)


def _weight_rows(w):
    return np.ascontiguousarray(w).reshape(w.shape[0], -1)


def conv2d_gemm_out(out, x, w, stride, padding, dilation=(1, 1), groups=1, bias=None,
                    relu=False):
    """``conv2d`` (and ``fused_conv``'s bias and ReLU) into ``out``: img2col, one GEMM per
    group into (O, N·OH·OW) rows (over the padded grid at stride 1), one pass to NCHW."""
    o = out.shape[1]
    w_rows = _grouped(_weight_rows(w), groups)
    b = channel_bias(bias, o, out.dtype)
    target = _c_order(out)
    if tuple(stride) == (1, 1):
        cols, wp, _ = grid_cols(x, w.shape[2:], padding, dilation)
        rows = np.empty((o, cols.shape[1]), out.dtype)
        np.matmul(w_rows, _grouped(cols, groups), out=_grouped(rows, groups))
        _to_nchw_grid(rows, target, b, relu, wp)
    else:
        cols = img2col_rows(x, w.shape[2:], stride, padding, dilation)
        rows = np.empty((o, cols.shape[1]), out.dtype)
        np.matmul(w_rows, _grouped(cols, groups), out=_grouped(rows, groups))
        _to_nchw_grid(rows, target, b, relu, target.shape[3])
    if target is not out:
        np.copyto(out, target)


def channel_bias(bias, channels, dtype):
    """A per-channel bias (None: zeros) as a contiguous vector of ``channels`` values."""
    if bias is None:
        return np.zeros(channels, dtype)
    return np.ascontiguousarray(bias, dtype).reshape(channels)


def cotangent_rows(g):
    """The cotangent (N, O, OH, OW) as (O, N·OH·OW) rows."""
    n, o, oh, ow = g.shape
    rows = np.empty((o, n * oh * ow), g.dtype)
    _to_rows_grid(np.ascontiguousarray(g), rows, g.shape[3])
    return rows


def conv2d_grad_weight_gemm_out(out, x, g, w_shape, stride, padding, dilation=(1, 1),
                                groups=1):
    """``conv2d_grad_weight`` into ``out``: img2col of ``x`` (over the padded grid at stride 1),
    the cotangent as rows, and ``gW = G @ colsᵀ`` per group."""
    if tuple(stride) == (1, 1):
        cols, wp, oh = grid_cols(x, w_shape[2:], padding, dilation)
        if not np.isfinite(x).all():
            _zero_grid_extra(cols, oh, g.shape[3], wp)
        rows = np.empty((g.shape[1], cols.shape[1]), g.dtype)
        _to_rows_grid(np.ascontiguousarray(g), rows, wp)
    else:
        cols = img2col_rows(x, w_shape[2:], stride, padding, dilation)
        rows = cotangent_rows(g)
    target = _c_order(out)
    np.matmul(_grouped(rows, groups), _grouped(cols, groups).swapaxes(-1, -2),
              out=_grouped(target.reshape(w_shape[0], -1), groups))
    if target is not out:
        np.copyto(out, target)


def conv2d_grad_input_gemm_out(out, g, w, x_shape, stride, padding, dilation=(1, 1),
                               groups=1):
    """``conv2d_grad_input`` into ``out``: ``gcols = Wᵀ @ G`` per group, then col2img (over
    the padded grid at stride 1)."""
    wt = _grouped(_weight_rows(w), groups).swapaxes(-1, -2)  # (groups, K, O/groups)
    k = x_shape[1] * w.shape[2] * w.shape[3]
    target = _c_order(out)
    if tuple(stride) == (1, 1):
        (ph, pw), (n, c, h, wd) = padding, x_shape
        wp = wd + 2 * pw
        rows = np.empty((g.shape[1], n * g.shape[2] * wp), g.dtype)
        _to_rows_grid(np.ascontiguousarray(g), rows, wp)
        gcols = np.empty((k, rows.shape[1]), out.dtype)
        np.matmul(wt, _grouped(rows, groups), out=_grouped(gcols, groups))
        if not np.isfinite(w).all():
            _zero_grid_extra(gcols, g.shape[2], g.shape[3], wp)
        gxp = np.empty((n, c, h + 2 * ph + 1, wp), out.dtype)
        _col2img_grid(gcols, gxp, w.shape[2], w.shape[3], dilation[0], dilation[1], g.shape[2])
        np.copyto(target, gxp[:, :, ph:ph + h, pw:pw + wd])
    else:
        rows = cotangent_rows(g)
        gcols = np.empty((k, rows.shape[1]), out.dtype)
        np.matmul(wt, _grouped(rows, groups), out=_grouped(gcols, groups))
        loop = _col2img_unit if stride[1] == 1 else _col2img_strided
        loop(gcols, target, *_geometry(w.shape[2:], stride, padding, dilation), *g.shape[2:])
    if target is not out:
        np.copyto(out, target)


def fused_conv_gemm_out(out, x, w, b, activation=None, **conv):
    """``fused_conv``: :func:`conv2d_gemm_out` with the bias and activation in its last pass."""
    conv2d_gemm_out(out, x, w, conv["stride"], conv["padding"], conv.get("dilation", (1, 1)),
                    conv.get("groups", 1), bias=b, relu=activation == "relu")


# --- acceptance rules ---------------------------------------------------------------------------
def float_operands(avals, out, attrs):
    """None when every operand and the result share one dtype that numpy's BLAS multiplies
    (float32 or float64), else why not."""
    dts = {np.dtype(a.dtype) for a in avals} | {np.dtype(out.dtype)}
    if len(dts) != 1 or dts.pop() not in FLOATS:
        return "dtypes " + "/".join(sorted({np.dtype(a.dtype).name for a in avals}))
    return None


def per_channel_bias(avals, out, attrs):
    """``fused_conv`` whose bias is one value per output channel and whose activation the last
    pass knows (None or ReLU)."""
    why = float_operands(avals, out, attrs)
    if why:
        return why
    bias, o = tuple(avals[2].shape), out.shape[1]
    if bias not in ((1, o, 1, 1), (o, 1, 1)):
        return f"bias {bias} is not one value per output channel"
    if attrs.get("activation") not in (None, "relu"):
        return f"activation {attrs.get('activation')}"
    return None
