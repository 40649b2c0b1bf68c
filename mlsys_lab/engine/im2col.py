"""im2col: the sliding windows of an image batch, as a view, as a GEMM operand and back.

A window of ``kernel`` (kh, kw) with ``stride`` (sh, sw), ``padding`` (ph, pw) and ``dilation``
(dh, dw) reads, at output pixel (p, q) and kernel tap (i, j), the padded input pixel
``xpad[p·sh + i·dh, q·sw + j·dw]``; OH = (H + 2·ph − dh·(kh − 1) − 1) // sh + 1 (OW alike).
Every convolution and pooling written in numpy in the library takes its windows from here:

* :func:`windows` — that definition as a read-only strided view (no copy but the padding):
  (N, C, OH, OW, kh, kw) for NCHW, (N, OH, OW, C, kh, kw) for NHWC;
* :func:`im2col` — the windows copied into the matrix one GEMM multiplies (book ch. 8,
  "convolution as one GEMM"), its axes in the order the caller's GEMM wants;
* :func:`col2im` — the transpose: each entry of a window matrix added back onto the pixel it
  was read from (the input gradient of a convolution, pooling's scatter).

Callers: the reference kernels of ``conv2d``, its two gradients and the pooling ops
(:mod:`.ops_nn`), the channels-last ops (:mod:`.passes.layout_ops`), the teaching kernels of
:mod:`mlsys_lab.kernels.conv`, the strided path of the compiled convolution
(:mod:`mlsys_lab.kernels.conv_gemm`, whose stride-1 path copies whole padded rows instead, and
whose col2im is a Numba loop) and the int8 convolution
(:mod:`mlsys_lab.deploy.quant.int8_kernels`,
which pads with the input's zero point).
"""

import numpy as np

from ..errors import ArgumentError, ShapeError

LAYOUTS = ("NCHW", "NHWC")
ORDERS = ("NKP", "NPK", "KNP")


def _pair(name, value, least):
    """An int or a pair of ints >= ``least`` as a pair."""
    if type(value) is int:
        pair = (value, value)
    elif type(value) is tuple and len(value) == 2 and type(value[0]) is type(value[1]) is int:
        pair = value  # the ops' attributes: checked in a microsecond
    else:
        pair = (value, value) if np.ndim(value) == 0 else tuple(value)
        try:
            ints = len(pair) == 2 and not any(isinstance(v, (bool, str)) or int(v) != v
                                              for v in pair)
        except (TypeError, ValueError):
            ints = False
        if not ints:
            raise ArgumentError(f"im2col: {name} must be an int >= {least} or a pair of "
                                f"them, got {value!r}")
        pair = int(pair[0]), int(pair[1])
    if pair[0] < least or pair[1] < least:
        raise ArgumentError(f"im2col: {name} must be an int >= {least} or a pair of them, "
                            f"got {value!r}")
    return pair


def geometry(kernel, stride=1, padding=0, dilation=1):
    """``(kernel, stride, padding, dilation)`` each as an (h, w) pair (an int means both),
    checked: kernel, stride and dilation >= 1, padding >= 0."""
    return (_pair("kernel", kernel, 1), _pair("stride", stride, 1),
            _pair("padding", padding, 0), _pair("dilation", dilation, 1))


def windows(x, kernel, stride=1, padding=0, dilation=1, *, pad_value=0, layout="NCHW"):
    """Every window of a 4-D image batch, as a read-only strided view of the padded input.

    Args:
        x: (N, C, H, W) for ``layout="NCHW"``, (N, H, W, C) for ``"NHWC"``.
        kernel, stride, padding, dilation: ints or (h, w) pairs; padding on both sides.
        pad_value: what the padding holds (0; ``-inf`` for max pooling, the zero point for
            an integer-quantised input).
        layout: "NCHW" or "NHWC".

    Returns:
        NCHW: (N, C, OH, OW, kh, kw), entry [n, c, p, q, i, j] = xpad[n, c, p·sh + i·dh,
        q·sw + j·dw]; NHWC: (N, OH, OW, C, kh, kw) alike. ``[..., i, j]`` is tap (i, j)'s
        (strided) view of the input at every output pixel.

    Raises:
        ShapeError: ``x`` is not 4-D, or the (dilated) kernel is larger than the padded input.
        ArgumentError: a bad layout, kernel, stride, padding or dilation.
    """
    if layout not in LAYOUTS:
        raise ArgumentError(f"im2col: layout must be one of {LAYOUTS}, got {layout!r}")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry(kernel, stride, padding, dilation)
    x = x if type(x) is np.ndarray else np.asarray(x)
    if x.ndim != 4:
        raise ShapeError(f"im2col: needs a 4-D {layout} input, got shape {x.shape}")
    hw = (2, 3) if layout == "NCHW" else (1, 2)
    if ph or pw:
        widths = [(0, 0)] * 4
        widths[hw[0]], widths[hw[1]] = (ph, ph), (pw, pw)
        x = np.pad(x, widths, constant_values=pad_value)
    (h, w), (s_h, s_w) = (x.shape[a] for a in hw), (x.strides[a] for a in hw)
    oh, ow = (h - dh * (kh - 1) - 1) // sh + 1, (w - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ShapeError(f"im2col: kernel ({kh}, {kw}) with dilation ({dh}, {dw}) is larger than "
                         f"the padded input ({h}, {w}) (input {x.shape} {layout} after padding "
                         f"({ph}, {pw}))")
    taps = (kh, kw), (s_h * dh, s_w * dw)
    if layout == "NCHW":
        shape = (x.shape[0], x.shape[1], oh, ow) + taps[0]
        strides = (x.strides[0], x.strides[1], s_h * sh, s_w * sw) + taps[1]
    else:
        shape = (x.shape[0], oh, ow, x.shape[3]) + taps[0]
        strides = (x.strides[0], s_h * sh, s_w * sw, x.strides[3]) + taps[1]
    view = np.lib.stride_tricks.as_strided(x, shape, strides)
    view.flags.writeable = False  # (as_strided's writeable=False takes 3 µs longer)
    return view


def im2col(x, kernel, stride=1, padding=0, dilation=1, *, pad_value=0, layout="NCHW",
           order=None):
    """The windows of ``x`` copied into one GEMM operand, and the output size (OH, OW).

    K indexes a window's taps in the order of the layout's weight, so the weight needs no
    transpose: (c, i, j) for NCHW (an OIHW weight ``w.reshape(O, K)``), (i, j, c) for NHWC (an
    HWIO weight ``w.reshape(K, O)``). P = OH·OW indexes the output pixels.

    Args:
        x, kernel, stride, padding, dilation, pad_value, layout: as for :func:`windows`.
        order: the axes of the result, a C-contiguous array:

            * ``"NKP"`` (NCHW's default): (N, K, P), one column per window, for ``W @ cols``;
            * ``"NPK"`` (NHWC's default): (N, P, K), one row per window, for ``rows @ W``
              (``.reshape(N·P, K)`` for one GEMM over the batch);
            * ``"KNP"``: (K, N, P), the batch in the columns (``.reshape(K, N·P)``) for one
              ``W (O, K) @ cols`` over the whole batch.

    Returns:
        ``(matrix, (OH, OW))``.

    Raises:
        ShapeError, ArgumentError: as :func:`windows`; an unknown ``order``.
    """
    order = order or ("NKP" if layout == "NCHW" else "NPK")
    if order not in ORDERS:
        raise ArgumentError(f"im2col: order must be one of {ORDERS}, got {order!r}")
    win = windows(x, kernel, stride, padding, dilation, pad_value=pad_value, layout=layout)
    if layout == "NCHW":
        n, c, oh, ow, kh, kw = win.shape
        axes = {"N": (0,), "K": (1, 4, 5), "P": (2, 3)}
    else:
        n, oh, ow, c, kh, kw = win.shape
        axes = {"N": (0,), "K": (4, 5, 3), "P": (1, 2)}
    size = {"N": n, "K": c * kh * kw, "P": oh * ow}
    perm = [a for letter in order for a in axes[letter]]
    if order[-1] != "K":  # one copy of the transposed view: its last axis runs along a row
        out = np.ascontiguousarray(win.transpose(perm))
    else:  # K last: a copy per tap (i, j), each writing whole channel vectors, is 3x faster
        out = np.empty([win.shape[a] for a in perm], win.dtype)
        rest = win.transpose([a for a in perm if a < 4] + [4, 5])  # the taps last
        index = [slice(None)] * out.ndim
        for i in range(kh):
            for j in range(kw):
                index[perm.index(4)], index[perm.index(5)] = i, j
                out[tuple(index)] = rest[..., i, j]
    return out.reshape([size[letter] for letter in order]), (oh, ow)


def col2im(cols, x_shape, kernel, stride=1, padding=0, dilation=1):
    """The transpose of :func:`im2col` (NCHW): every window entry added onto the input pixel it
    was read from, taps in row-major order (i, j), padding dropped.

    Args:
        cols: (N, C·kh·kw, OH·OW) (``im2col``'s "NKP" order), any (N, C, kh, kw, OH, OW)
            array or view, or a function ``(i, j) -> `` tap (i, j)'s (N, C, OH, OW) block
            (pooling's gradients: each block made as it is added).
        x_shape: the input's shape (N, C, H, W).
        kernel, stride, padding, dilation: as for :func:`windows`.

    Returns:
        (N, C, H, W) of ``cols``' dtype (the first block's for a function): a view into the
        padded sum.

    Raises:
        ShapeError: ``cols`` does not hold one entry per tap and output pixel of ``x_shape``.
    """
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geometry(kernel, stride, padding, dilation)
    n, c, h, w = x_shape
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if callable(cols):
        tap = cols
    else:
        cols = _windows_of(cols, n, c, kh, kw, oh, ow, x_shape)
        tap = lambda i, j: cols[:, :, i, j]  # noqa: E731
    gx = None
    for i in range(kh):
        for j in range(kw):
            block = tap(i, j)
            if gx is None:
                gx = np.zeros((n, c, h + 2 * ph, w + 2 * pw), block.dtype)
            gx[:, :, i * dh:i * dh + sh * (oh - 1) + 1:sh,
               j * dw:j * dw + sw * (ow - 1) + 1:sw] += block
    return gx[:, :, ph:ph + h, pw:pw + w]


def _windows_of(cols, n, c, kh, kw, oh, ow, x_shape):
    """``cols`` as (N, C, kh, kw, OH, OW), or a ShapeError."""
    cols = np.asarray(cols)
    if cols.ndim != 6:
        if cols.shape != (n, c * kh * kw, oh * ow):
            raise ShapeError(f"col2im: input {tuple(x_shape)} with kernel ({kh}, {kw}) needs "
                             f"columns ({n}, {c * kh * kw}, {oh * ow}), got {cols.shape}")
        cols = cols.reshape(n, c, kh, kw, oh, ow)
    elif cols.shape != (n, c, kh, kw, oh, ow):
        raise ShapeError(f"col2im: input {tuple(x_shape)} with kernel ({kh}, {kw}) needs "
                         f"windows {(n, c, kh, kw, oh, ow)}, got {cols.shape}")
    return cols
