"""Convolution algorithms of the book's chapter 10 (inference): direct, img2col, Winograd.

All three compute the same thing — the cross-correlation that deep-learning frameworks call
convolution — in two layouts:

* ``layout="NCHW"``: input (N, C, H, W), weight **OIHW** (out, in, kh, kw), output (N, O, OH, OW);
* ``layout="NHWC"``: input (N, H, W, C), weight **HWIO** (kh, kw, in, out) as in TensorFlow,
  output (N, OH, OW, O). With HWIO, img2col's patch matrix multiplies the weight reshaped to
  (KH·KW·C, O) with no transpose at all.

``stride`` and ``padding`` take an int or an (h, w) pair; padding is zeros on both sides.
"""

from __future__ import annotations

import numpy as np

from ..engine.im2col import im2col
from ..errors import ShapeError

LAYOUTS = ("NCHW", "NHWC")

# Winograd F(2,3) transforms (Lavin & Gray, 2016), in the book's notation.
BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)
BOOK_AT = np.array([[1, 1, -1, 0], [0, 1, -1, -1]], dtype=np.float64)
"""Aᵀ as the book prints it: the first row's −1 should be +1 (see ``book_at_error``)."""


# --------------------------------------------------------------------------------------------
# Shared plumbing
# --------------------------------------------------------------------------------------------


def _pair(value, name):
    pair = (value, value) if np.isscalar(value) else tuple(value)
    if len(pair) != 2 or any(int(v) != v or v < 0 for v in pair):
        raise ValueError(f"conv2d: {name} must be a non-negative int or a pair, got {value!r}")
    return int(pair[0]), int(pair[1])


def _to_nchw(x, w, layout):
    """Return (x, w) as NCHW input and OIHW weight, checking shapes."""
    if layout not in LAYOUTS:
        raise ValueError(f"conv2d: layout must be one of {LAYOUTS}, got {layout!r}")
    x, w = np.asarray(x), np.asarray(w)
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"conv2d: need a 4-D input and weight, got {x.shape} and {w.shape}")
    if layout == "NHWC":
        x, w = x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1)
    if x.shape[1] != w.shape[1]:
        raise ShapeError(f"conv2d ({layout}): input has {x.shape[1]} channels but the weight "
                         f"expects {w.shape[1]}; shapes {x.shape} and {w.shape} (as NCHW/OIHW)")
    return x, w


def _output_size(h, w, kh, kw, stride, padding):
    oh = (h + 2 * padding[0] - kh) // stride[0] + 1
    ow = (w + 2 * padding[1] - kw) // stride[1] + 1
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"conv2d: a {kh}×{kw} kernel does not fit a {h}×{w} input "
                         f"with padding {padding}")
    return oh, ow


def _pad(x, padding, spatial_axes):
    widths = [(0, 0)] * x.ndim
    widths[spatial_axes[0]] = (padding[0], padding[0])
    widths[spatial_axes[1]] = (padding[1], padding[1])
    return np.pad(x, widths)


# --------------------------------------------------------------------------------------------
# Direct convolution
# --------------------------------------------------------------------------------------------


def conv2d_direct(x, w, stride=1, padding=0, layout="NCHW"):
    """Direct convolution: slide the kernel, one kernel tap at a time.

    For every tap (i, j) of the KH×KW kernel, the strided window of the padded input that the
    tap touches is multiplied by that tap's C×O weights and added to the output — the
    definition ``y[n,o,p,q] = Σ_c Σ_i Σ_j x[n,c,p·s+i,q·s+j] · w[o,c,i,j]``, with the two
    spatial loops written out and the channel sum left to ``einsum``.

    Args:
        x: input, (N, C, H, W) for NCHW or (N, H, W, C) for NHWC.
        w: weight, OIHW for NCHW or HWIO for NHWC.
        stride: int or (sh, sw).
        padding: int or (ph, pw) zeros on each side.
        layout: "NCHW" or "NHWC".

    Returns:
        The output in the input's layout.
    """
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    _to_nchw(x, w, layout)  # layout and shape checks
    x, w = np.asarray(x), np.asarray(w)
    if layout == "NCHW":
        (n, _, h, wd), (o, _, kh, kw) = x.shape, w.shape
        oh, ow = _output_size(h, wd, kh, kw, stride, padding)
        xp = _pad(x, padding, (2, 3))
        y = np.zeros((n, o, oh, ow), np.result_type(x, w))
        for i in range(kh):
            for j in range(kw):
                window = xp[:, :, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1]]
                y += np.einsum("nchw,oc->nohw", window, w[:, :, i, j])
        return y
    (n, h, wd, _), (kh, kw, _, o) = x.shape, w.shape
    oh, ow = _output_size(h, wd, kh, kw, stride, padding)
    xp = _pad(x, padding, (1, 2))
    y = np.zeros((n, oh, ow, o), np.result_type(x, w))
    for i in range(kh):
        for j in range(kw):
            window = xp[:, i:i + stride[0] * oh:stride[0], j:j + stride[1] * ow:stride[1], :]
            y += np.einsum("nhwc,co->nhwo", window, w[i, j])
    return y


# --------------------------------------------------------------------------------------------
# img2col + GEMM
# --------------------------------------------------------------------------------------------


def img2col(x, kh, kw, stride=1, padding=0, layout="NCHW"):
    """Unfold every receptive field of ``x`` into one column (NCHW) or row (NHWC): the
    library's one :func:`~mlsys_lab.engine.im2col.im2col` (which also takes a dilation and
    other axis orders), with this module's argument checks.

    Args:
        x: input, (N, C, H, W) or (N, H, W, C).
        kh, kw: kernel height and width.
        stride, padding: ints or pairs.
        layout: "NCHW" or "NHWC".

    Returns:
        NCHW: (N, C·KH·KW, OH·OW), rows ordered (c, i, j) to match ``w.reshape(O, -1)``.
        NHWC: (N, OH·OW, KH·KW·C), columns ordered (i, j, c) to match ``w.reshape(-1, O)``
        for an HWIO weight.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"img2col: layout must be one of {LAYOUTS}, got {layout!r}")
    x = np.asarray(x)
    if x.ndim != 4:
        raise ShapeError(f"img2col: need a 4-D input, got shape {x.shape}")
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    hw = x.shape[2:] if layout == "NCHW" else x.shape[1:3]
    _output_size(*hw, kh, kw, stride, padding)  # a kernel that does not fit: ShapeError
    return im2col(x, (kh, kw), stride, padding, layout=layout)[0]


def conv2d_img2col(x, w, stride=1, padding=0, layout="NCHW"):
    """Convolution as one matrix multiply: img2col, then GEMM with the flattened weight.

    The unfolded input repeats each pixel up to KH·KW times (more memory), in exchange for a
    single large, fast matrix multiply.

    Args and returns as ``conv2d_direct``.
    """
    stride, padding = _pair(stride, "stride"), _pair(padding, "padding")
    xc, wc = _to_nchw(x, w, layout)  # shape checks
    o, _, kh, kw = wc.shape
    n = xc.shape[0]
    oh, ow = _output_size(xc.shape[2], xc.shape[3], kh, kw, stride, padding)
    cols = img2col(x, kh, kw, stride, padding, layout)
    if layout == "NCHW":
        y = np.asarray(w).reshape(o, -1) @ cols  # (O, CKK) @ (N, CKK, P) -> (N, O, P)
        return y.reshape(n, o, oh, ow)
    y = cols @ np.asarray(w).reshape(-1, o)  # (N, P, KKC) @ (KKC, O) -> (N, P, O)
    return y.reshape(n, oh, ow, o)


# --------------------------------------------------------------------------------------------
# Winograd
# --------------------------------------------------------------------------------------------


def winograd_f23(d, g, at=AT):
    """Winograd F(2,3): two outputs of a 3-tap correlation from 4 inputs with 4 multiplies.

    ``y = Aᵀ [(G g) ⊙ (Bᵀ d)]``. The filter transform ``G g`` is done once per filter, the data
    transform ``Bᵀ d`` and the output transform ``Aᵀ m`` need only additions, so the only
    multiplies are the 4 of the element-wise product (direct: 2 outputs × 3 taps = 6).

    Args:
        d: 4 inputs.
        g: 3 filter taps.
        at: the output transform, (2, 4); pass ``BOOK_AT`` to reproduce the book's misprint.

    Returns:
        [d0·g0 + d1·g1 + d2·g2, d1·g0 + d2·g1 + d3·g2] (with the correct Aᵀ).
    """
    d, g = np.asarray(d, dtype=np.float64), np.asarray(g, dtype=np.float64)
    if d.shape != (4,) or g.shape != (3,):
        raise ShapeError(f"winograd_f23: need 4 inputs and 3 taps, got {d.shape} and {g.shape}")
    m = (G @ g) * (BT @ d)  # the 4 multiplies
    return at @ m


def book_at_error(trials=1000, seed=0):
    """Show numerically that the book's printed Aᵀ is wrong and ours is right.

    Runs F(2,3) on random inputs with both output transforms and compares with the direct
    3-tap correlation.

    Returns:
        {"book": max error with the book's Aᵀ (order 1), "ours": max error with ours (~1e-15)}
    """
    rng = np.random.default_rng(seed)
    errors = {"book": 0.0, "ours": 0.0}
    for _ in range(trials):
        d, g = rng.standard_normal(4), rng.standard_normal(3)
        direct = np.array([d[0:3] @ g, d[1:4] @ g])
        errors["book"] = max(errors["book"], np.abs(winograd_f23(d, g, BOOK_AT) - direct).max())
        errors["ours"] = max(errors["ours"], np.abs(winograd_f23(d, g, AT) - direct).max())
    return {key: float(value) for key, value in errors.items()}


def multiply_counts():
    """Multiplies per output tile: direct vs Winograd, 1-D F(2,3) and 2-D F(2×2,3×3).

    Direct: outputs × taps (2·3 = 6; 2·2·3·3 = 36). Winograd F(m, r): m + r − 1 per dimension
    (4; 4·4 = 16), transforms of the filter amortised and of data/output additions only.
    """
    return {
        "direct F(2x2,3x3)": 2 * 2 * 3 * 3,
        "winograd F(2x2,3x3)": (2 + 3 - 1) ** 2,
        "direct F(2,3)": 2 * 3,
        "winograd F(2,3)": 2 + 3 - 1,
    }


def conv2d_winograd(x, w, padding=0, layout="NCHW"):
    """Stride-1 3×3 convolution with Winograd F(2×2, 3×3).

    The output is cut into 2×2 tiles; each needs a 4×4 input tile (neighbours overlap by 2).
    Per tile and channel pair: ``V = Bᵀ d B`` (additions), ``U = G g Gᵀ`` (once per filter),
    ``M = Σ_c U ⊙ V`` — 16 multiplies where direct needs 36 — and ``Y = Aᵀ M A``. Odd output
    sizes are handled by zero-padding the input up to whole tiles and cropping the result.
    NHWC/HWIO inputs are transposed to NCHW/OIHW, computed, and transposed back.

    Args:
        x: input, (N, C, H, W) or (N, H, W, C).
        w: 3×3 weight, OIHW or HWIO.
        padding: int or (ph, pw).
        layout: "NCHW" or "NHWC".

    Returns:
        The output in the input's layout.
    """
    padding = _pair(padding, "padding")
    xc, wc = _to_nchw(x, w, layout)
    if wc.shape[2:] != (3, 3):
        raise ShapeError(f"conv2d_winograd: F(2x2,3x3) needs a 3x3 kernel, got weight "
                         f"{np.asarray(w).shape} ({layout})")
    n, c, h, wd = xc.shape
    o = wc.shape[0]
    oh, ow = _output_size(h, wd, 3, 3, (1, 1), padding)
    tiles_h, tiles_w = -(-oh // 2), -(-ow // 2)
    # Pad to whole tiles: tile (t, s) reads input rows 2t .. 2t+3 and columns 2s .. 2s+3.
    xp = np.pad(xc, [(0, 0), (0, 0),
                     (padding[0], 2 * tiles_h + 2 - h - padding[0]),
                     (padding[1], 2 * tiles_w + 2 - wd - padding[1])])
    d = np.empty((n, c, tiles_h, tiles_w, 4, 4), np.result_type(xp, np.float32))
    for i in range(4):
        for j in range(4):
            d[..., i, j] = xp[:, :, i:i + 2 * tiles_h:2, j:j + 2 * tiles_w:2]
    u = np.einsum("ik,ockl,jl->ocij", G, wc, G)  # U = G g Gᵀ  (O, C, 4, 4)
    v = np.einsum("ik,ncthkl,jl->ncthij", BT, d, BT)  # V = Bᵀ d B
    m = np.einsum("ocij,ncthij->nothij", u, v)  # 16 multiplies per tile and channel pair
    y = np.einsum("ik,nothkl,jl->nothij", AT, m, AT)  # Y = Aᵀ M A  (.., 2, 2)
    y = y.transpose(0, 1, 2, 4, 3, 5).reshape(n, o, 2 * tiles_h, 2 * tiles_w)[:, :, :oh, :ow]
    y = y.astype(np.result_type(xc, wc, np.float32), copy=False)
    return y.transpose(0, 2, 3, 1) if layout == "NHWC" else y
