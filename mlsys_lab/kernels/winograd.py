"""Winograd F(2×2, 3×3) convolution as 16 BLAS matrix products: a ``cpu`` kernel of ``conv2d``,
``fused_conv`` and ``conv2d_grad_input`` for 3×3 kernels at stride 1 (registered by
:mod:`.registration`, chosen where it beats img2col; see :func:`winograd_wins`).

Each 2×2 output tile needs a 4×4 input tile. With the transforms of :mod:`.conv` (``BT``, ``G``,
``AT``; Lavin & Gray, 2016):

* input: ``V[ξ, c, t] = (Bᵀ d B)[ξ]`` for every tile t = (n, ty, tx) and channel c, ξ one of the
  16 positions of the 4×4 tile — additions only;
* filter: ``U[ξ, o, c] = (G g Gᵀ)[ξ]``, once per call (the weights are small);
* 16 GEMMs ``M[ξ] = U[ξ] (O, C) @ V[ξ] (C, T)``: 16 multiplies per tile and channel pair where
  direct convolution needs 36;
* output: ``Y = Aᵀ M A``, a 2×2 tile from each 4×4 one, cropped at the border, with the bias and
  ReLU of ``fused_conv`` folded in.

The input gradient of a stride-1 convolution is itself one: the cotangent convolved with the
weight turned around (``w[o, c, 2 - i, 2 - j]`` as an (C, O, 3, 3) weight) and padding 2 - p.
"""

import numpy as np
from numba import njit

from ..engine.numba_cache import CACHE
from .conv import G

_JIT = dict(cache=CACHE, error_model="numpy")


@njit(**_JIT)
def _padded_halves(plane, even, odd, ph, pw):
    """even[r, k], odd[r, k] = the zero-padded plane at row r, columns 2k and 2k + 1 (the
    padded plane cut or zero-extended to the tiles' extent). Indexed in 2-D: a row view per
    row costs more than the row's copy here."""
    h, w = plane.shape
    rows, half = even.shape
    for r in range(rows):
        for k in range(half):
            even[r, k] = 0
            odd[r, k] = 0
        if r < ph or r >= h + ph:
            continue
        for k in range(max(0, (pw + 1) // 2), min(half, (w - 1 + pw) // 2 + 1)):
            even[r, k] = plane[r - ph, 2 * k - pw]
        for k in range(max(0, pw // 2), min(half, (w + pw) // 2)):
            odd[r, k] = plane[r - ph, 2 * k + 1 - pw]


@njit(cache=CACHE, inline="always")
def _bt(d0, d1, d2, d3):
    """Bᵀ applied to 4 values: d0 - d2, d1 + d2, d2 - d1, d1 - d3."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@njit(cache=CACHE, inline="always")
def _at(m0, m1, m2, m3):
    """Aᵀ applied to 4 values: m0 + m1 + m2, m1 - m2 - m3."""
    return m0 + m1 + m2, m1 - m2 - m3


@njit(cache=CACHE, inline="always")
def _epilogue(value, relu):
    """max(value, 0) when relu (NaN stays NaN), else value."""
    return (0 if value <= 0 else value) if relu else value


@njit(cache=CACHE, inline="always")
def _store_column(dst, s, t, c0, c1, c2, c3):
    """Column s of Bᵀ (d B) (the values of column s of d B in rows 0..3) into dst[4r + s, t]."""
    v0, v1, v2, v3 = _bt(c0, c1, c2, c3)
    dst[s, t], dst[4 + s, t], dst[8 + s, t], dst[12 + s, t] = v0, v1, v2, v3


@njit(**_JIT)
def _winograd_input(x, v, ph, pw, tiles_h, tiles_w):
    """v[4r + s, c, (n·th + ty)·tw + tx] = (Bᵀ d B)[r, s], d the 4×4 tile of the zero-padded
    input at (2·ty, 2·tx): additions only.

    Per image plane, the padded input is split into even and odd columns once (tile tx reads
    columns 2tx .. 2tx + 3: even[tx], odd[tx], even[tx + 1], odd[tx + 1]); each tile then reads
    16 values, combines them in registers and writes one value into each of the 16 planes of
    ``v``."""
    n_img, ch = x.shape[:2]
    size = tiles_h * tiles_w
    even = np.zeros((2 * tiles_h + 2, tiles_w + 1), x.dtype)
    odd = np.zeros((2 * tiles_h + 2, tiles_w + 1), x.dtype)
    local = np.zeros((16, size), x.dtype)  # one plane's tiles, in cache
    for n in range(n_img):
        for c in range(ch):
            _padded_halves(x[n, c], even, odd, ph, pw)
            for ty in range(tiles_h):
                r = 2 * ty
                for tx in range(tiles_w):
                    a = _bt(even[r, tx], odd[r, tx], even[r, tx + 1], odd[r, tx + 1])  # d B
                    b = _bt(even[r + 1, tx], odd[r + 1, tx], even[r + 1, tx + 1],
                            odd[r + 1, tx + 1])
                    c_ = _bt(even[r + 2, tx], odd[r + 2, tx], even[r + 2, tx + 1],
                             odd[r + 2, tx + 1])
                    d = _bt(even[r + 3, tx], odd[r + 3, tx], even[r + 3, tx + 1],
                            odd[r + 3, tx + 1])
                    t = ty * tiles_w + tx
                    _store_column(local, 0, t, a[0], b[0], c_[0], d[0])  # Bᵀ (d B)
                    _store_column(local, 1, t, a[1], b[1], c_[1], d[1])
                    _store_column(local, 2, t, a[2], b[2], c_[2], d[2])
                    _store_column(local, 3, t, a[3], b[3], c_[3], d[3])
            base = n * size  # then 16 sequential runs out: 16 interleaved write streams
            for xi in range(16):  # straight to memory would exceed the write buffers
                for t in range(size):
                    v[xi, c, base + t] = local[xi, t]


@njit(**_JIT)
def _winograd_output(m, out, bias, relu, tiles_h, tiles_w):
    """out[n, o, 2ty + a, 2tx + b] = (Aᵀ M A)[a, b] + bias[o] (max(·, 0) when relu), M the
    4×4 tile ``m[:, o, t]``; rows and columns past the output are dropped."""
    n_img, o_ch, oh, ow = out.shape
    size = tiles_h * tiles_w
    tiles = np.zeros((16, size), m.dtype)  # one plane's tiles, read in 16 sequential runs
    for n in range(n_img):
        for o in range(o_ch):
            bo = bias[o]
            for xi in range(16):
                for t in range(size):
                    tiles[xi, t] = m[xi, o, n * size + t]
            plane = out[n, o]
            for ty in range(tiles_h):
                for tx in range(tiles_w):
                    t = ty * tiles_w + tx
                    u0, u1 = _at(tiles[0, t], tiles[4, t], tiles[8, t], tiles[12, t])  # Aᵀ M
                    v0, v1 = _at(tiles[1, t], tiles[5, t], tiles[9, t], tiles[13, t])
                    w0, w1 = _at(tiles[2, t], tiles[6, t], tiles[10, t], tiles[14, t])
                    z0, z1 = _at(tiles[3, t], tiles[7, t], tiles[11, t], tiles[15, t])
                    y00, y01 = _at(u0, v0, w0, z0)  # (Aᵀ M) A
                    y10, y11 = _at(u1, v1, w1, z1)
                    p, q = 2 * ty, 2 * tx
                    plane[p, q] = _epilogue(y00 + bo, relu)
                    if q + 1 < ow:
                        plane[p, q + 1] = _epilogue(y01 + bo, relu)
                    if p + 1 < oh:
                        plane[p + 1, q] = _epilogue(y10 + bo, relu)
                        if q + 1 < ow:
                            plane[p + 1, q + 1] = _epilogue(y11 + bo, relu)


def filter_transform(w):
    """U (16, O, C) = G g Gᵀ for every 3×3 filter g of the OIHW weight ``w``."""
    o, c = w.shape[:2]
    u = np.kron(G, G) @ w.reshape(o * c, 9).T.astype(np.float64)  # (16, O·C): one product
    return np.ascontiguousarray(u.reshape(16, o, c), w.dtype)


def winograd_conv_out(out, x, w, padding, bias=None, relu=False):
    """A stride-1 3×3 convolution of NCHW ``x`` with OIHW ``w`` into ``out`` (N, O, OH, OW):
    input transform, 16 GEMMs, output transform (with ``bias`` per channel and ReLU)."""
    n, o, oh, ow = out.shape
    tiles_h, tiles_w = -(-oh // 2), -(-ow // 2)
    v = np.empty((16, x.shape[1], n * tiles_h * tiles_w), out.dtype)
    _winograd_input(np.ascontiguousarray(x), v, padding[0], padding[1], tiles_h, tiles_w)
    m = np.matmul(filter_transform(w), v)  # (16, O, T)
    b = np.zeros(o, out.dtype) if bias is None else np.ascontiguousarray(bias, out.dtype)
    target = out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)
    _winograd_output(m, target, b.reshape(o), relu, tiles_h, tiles_w)
    if target is not out:
        np.copyto(out, target)


def conv2d_winograd_out(out, x, w, stride, padding, dilation=(1, 1), groups=1):
    """The ``conv2d`` kernel (where :func:`applies`)."""
    winograd_conv_out(out, x, w, padding)


def fused_conv_winograd_out(out, x, w, b, activation=None, **conv):
    """The ``fused_conv`` kernel: the bias and ReLU in the output transform."""
    winograd_conv_out(out, x, w, conv["padding"], bias=b, relu=activation == "relu")


def conv2d_grad_input_winograd_out(out, g, w, x_shape, stride, padding, dilation=(1, 1),
                                   groups=1):
    """The ``conv2d_grad_input`` kernel: ``g`` convolved with the turned-around weight."""
    turned = np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    winograd_conv_out(out, g, turned, (2 - padding[0], 2 - padding[1]))


# --- where it applies and where it wins -----------------------------------------------------
MIN_CHANNELS = 32
"""Winograd wins once both channel counts reach this. Its 16 GEMMs have K = C (img2col's one
has K = 9·C), which BLAS runs at about half speed at small C, and its transforms pass over 4x
the input and output where img2col writes 9x the input. Measured on a 2-core AVX-512 EPYC,
float32, best of 25, img2col vs Winograd forward: 3->16 channels 0.4 vs 1.1 ms, 16->32
0.8-1.1 vs 1.3 ms, 32->32 1.6-2.2 vs 1.9 ms, 64->64 2.2-4.9 vs 2.5-4.0 ms,
128->128 (16x16) 3.5 vs 2.4 ms."""


def winograd_wins(in_channels, out_channels, out_hw):
    """None when F(2×2, 3×3) beats img2col for these sizes, else why not."""
    if min(in_channels, out_channels) < MIN_CHANNELS:
        return (f"{in_channels} -> {out_channels} channels: img2col wins below "
                f"{MIN_CHANNELS}")
    if min(out_hw) < 2:
        return f"output {tuple(out_hw)} smaller than one 2x2 tile"
    return None


def applies(w_shape, attrs):
    """None when F(2×2, 3×3) computes this convolution (a 3×3 kernel, stride 1, no dilation,
    one group), else why not."""
    if tuple(w_shape[2:]) != (3, 3):
        return f"kernel {tuple(w_shape[2:])}, not 3x3"
    if tuple(attrs["stride"]) != (1, 1) or tuple(attrs.get("dilation", (1, 1))) != (1, 1):
        return "stride or dilation not 1"
    if attrs.get("groups", 1) != 1:
        return f"groups={attrs['groups']}"
    return None


def winograd_accepts(avals, out, attrs):
    """``conv2d`` / ``fused_conv``: a convolution F(2×2, 3×3) computes, where it wins."""
    x, w = avals[0], avals[1]
    return applies(w.shape, attrs) or winograd_wins(x.shape[1], w.shape[0], out.shape[2:])


def applies_to_grad_input(w_shape, attrs):
    """None when the input gradient is a convolution F(2×2, 3×3) computes (as
    :func:`applies`, and padding at most 2: the turned-around convolution pads by 2 - p)."""
    if max(attrs["padding"]) > 2:
        return f"padding {attrs['padding']} > 2"
    return applies(w_shape, attrs)


def winograd_grad_input_accepts(avals, out, attrs):
    """``conv2d_grad_input`` of such a convolution, where it wins."""
    w = avals[1]
    return (applies_to_grad_input(w.shape, attrs)
            or winograd_wins(w.shape[0], w.shape[1], out.shape[2:]))
