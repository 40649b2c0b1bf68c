"""The ONNX mappings of the neural-network ops: matmul and softmax, convolution and pooling,
one-hot and the losses (one :func:`~.mapping.register_onnx` call per op; loaded by
:mod:`mlsys_lab.deploy.onnx`)."""

import numpy as np

from ...engine import dtypes
from ...engine.ops_nn import conv_attrs
from ...engine.ops_shape import canonical_index
from .mapping import (
    OnnxImport,
    check_axis,
    input_names,
    register_onnx,
    scalar_like,
)
from .ops_attention import fold_attention


# --- matmul and softmax --------------------------------------------------------------------------
def _ex_matmul(ctx, node):
    ctx.emit("MatMul", input_names(ctx, node), ctx.name(node.output))


def _im_matmul(ctx, node, a):
    x, y = ctx.inputs(node)
    if len(x.shape) >= 2 and len(y.shape) >= 2:
        attention = fold_attention(ctx, x, y)  # softmax(scaled Q Kᵀ [+ mask]) @ V: one node
        return [attention if attention is not None else ctx.emit("matmul", x, y)]
    if not x.shape or not y.shape:
        ctx.fail(node, "MatMul of a 0-d tensor")
    x2 = ctx.emit("reshape", x, shape=(1,) + x.shape) if len(x.shape) == 1 else x
    y2 = ctx.emit("reshape", y, shape=y.shape + (1,)) if len(y.shape) == 1 else y
    out = ctx.emit("matmul", x2, y2)
    shape = out.shape
    if len(x.shape) == 1:
        shape = shape[:-2] + shape[-1:]
    if len(y.shape) == 1:
        shape = shape[:-1]
    return [ctx.emit("reshape", out, shape=shape)]


def _transposed(ctx, x, flag):
    return ctx.prepare("transpose", x, axes=(1, 0)) if flag else x


def _im_gemm(ctx, node, a):
    x, w, c = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    y = ctx.emit("matmul", _transposed(ctx, x, a.get("transA", 0)),
                 _transposed(ctx, w, a.get("transB", 0)))
    alpha, beta = a.get("alpha", 1.0), a.get("beta", 1.0)
    if alpha != 1.0:
        y = ctx.emit("mul", y, scalar_like(alpha, y))
    if c is not None and beta != 0.0:
        y = ctx.emit("add", y, c if beta == 1.0 else ctx.prepare("mul", c, scalar_like(beta, c)))
    return [y]


def _ex_softmax(onnx_type):
    def export(ctx, node):
        ctx.emit(onnx_type, input_names(ctx, node), ctx.name(node.output),
                 axis=int(node.attrs["axis"]))
    return export


def _im_softmax(op_name):
    def convert(ctx, node, a):
        x = ctx.input(node, 0)
        if ctx.opset >= 13:
            return [ctx.emit(op_name, x, axis=int(a.get("axis", -1)))]
        axis = check_axis(ctx, node, a.get("axis", 1), len(x.shape))  # opset < 13: 2-D coercion
        flat = (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))
        y = ctx.emit(op_name, ctx.emit("reshape", x, shape=flat), axis=1)
        return [ctx.emit("reshape", y, shape=x.shape)]
    return convert


register_onnx("matmul", export=_ex_matmul, writes=("MatMul",),
              imports=(OnnxImport("MatMul", _im_matmul),
                       OnnxImport("Gemm", _im_gemm, ("alpha", "beta", "transA", "transB"))))
register_onnx("softmax", export=_ex_softmax("Softmax"), writes=("Softmax",),
              imports=(OnnxImport("Softmax", _im_softmax("softmax"), ("axis",)),))
register_onnx("log_softmax", export=_ex_softmax("LogSoftmax"), writes=("LogSoftmax",),
              imports=(OnnxImport("LogSoftmax", _im_softmax("log_softmax"), ("axis",)),))


# --- convolution and pooling ---------------------------------------------------------------------
def _same_pads(size, kernel, stride, dilation, upper):
    total = max((-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def _window_pads(ctx, node, a, sizes, kernel, strides, dilations):
    """(begins, ends) of an ONNX window op's padding from ``pads`` or ``auto_pad``."""
    n = len(sizes)
    auto = a.get("auto_pad", "NOTSET")
    if auto == "NOTSET":
        pads = list(a.get("pads", [0] * 2 * n))
        if len(pads) != 2 * n:
            ctx.fail(node, f"pads {pads} do not fit {n} spatial axes")
        return pads[:n], pads[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        ctx.fail(node, f"auto_pad {auto!r}")
    both = [_same_pads(s, k, st, d, auto == "SAME_UPPER")
            for s, k, st, d in zip(sizes, kernel, strides, dilations)]
    return [b for b, _ in both], [e for _, e in both]


def _lift_1d(ctx, x, make=None):
    """An (N, C, W) tensor as (N, C, 1, W), for the 2-D ops."""
    return (make or ctx.emit)("reshape", x, shape=x.shape[:2] + (1,) + x.shape[2:])


def _spatial(ctx, node, a, x, kernel, lift=True):
    """Kernel, strides, dilations, begins and ends as lists; with ``lift``, 1-D windows get a
    unit H axis (the registry's window ops are 2-D) and only 1-D and 2-D ones are accepted."""
    nd = len(x.shape) - 2
    if nd < 1 or (lift and nd > 2):
        ctx.fail(node, f"{nd}-D windows: only 1-D and 2-D ones import")
    kernel = list(kernel)
    strides = list(a.get("strides", [1] * nd))
    dilations = list(a.get("dilations", [1] * nd))
    begins, ends = _window_pads(ctx, node, a, x.shape[2:], kernel, strides, dilations)
    if nd == 1 and lift:
        kernel, strides, dilations = [1] + kernel, [1] + strides, [1] + dilations
        begins, ends = [0] + list(begins), [0] + list(ends)
    return kernel, strides, dilations, list(begins), list(ends)


def _explicit_pad(ctx, x, begins, ends, value):
    widths = ((0, 0), (0, 0)) + tuple((int(b), int(e)) for b, e in zip(begins, ends))
    return ctx.emit("pad", x, pad_width=widths, value=float(value)) if any(
        b or e for b, e in zip(begins, ends)) else x


def _ex_conv(ctx, node):
    at = node.attrs
    (ph, pw), w = at["padding"], node.inputs[1]
    ctx.emit("Conv", input_names(ctx, node), ctx.name(node.output), kernel_shape=list(w.shape[2:]),
             strides=list(at["stride"]), pads=[ph, pw, ph, pw],
             dilations=list(at.get("dilation", (1, 1))), group=int(at.get("groups", 1)))


def _im_conv(ctx, node, a):
    x, w, b = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    kernel = list(a.get("kernel_shape", w.shape[2:]))
    if tuple(kernel) != tuple(w.shape[2:]):
        ctx.fail(node, f"kernel_shape {kernel} differs from the weight's {w.shape[2:]}")
    kernel, strides, dilations, begins, ends = _spatial(ctx, node, a, x, kernel)
    one_d = len(x.shape) == 3
    if one_d:
        x, w = _lift_1d(ctx, x), _lift_1d(ctx, w, ctx.prepare)
    if begins == ends:
        padding = begins
    else:  # asymmetric padding: pad first
        x, padding = _explicit_pad(ctx, x, begins, ends, 0.0), [0, 0]
    y = ctx.emit("conv2d", x, w, **conv_attrs("conv2d", strides, padding, dilations,
                                              a.get("group", 1)))
    if b is not None:
        y = ctx.emit("add", y, ctx.prepare("reshape", b, shape=(1, b.shape[0], 1, 1)))
    if one_d:
        y = ctx.emit("reshape", y, shape=y.shape[:2] + y.shape[3:])
    return [y]


def _ex_conv_transpose(ctx, node):
    g, w = node.inputs
    at = node.attrs
    (ph, pw), (sh, sw) = at["padding"], at["stride"]
    (dh, dw) = at.get("dilation", (1, 1))
    spans = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], (dh, dw))]
    natural = [s * (n - 1) + span - 2 * p for s, n, span, p in
               zip((sh, sw), g.shape[2:], spans, (ph, pw))]
    extra = [x - n for x, n in zip(at["x_shape"][2:], natural)]
    ctx.emit("ConvTranspose", input_names(ctx, node), ctx.name(node.output),
             kernel_shape=list(w.shape[2:]), strides=[sh, sw], pads=[ph, pw, ph, pw],
             dilations=[dh, dw], group=int(at.get("groups", 1)),
             output_padding=extra if any(extra) else None)


def _transpose_geometry(ctx, node, a, x, kernel):
    """Begin pads and output sizes of an ONNX ConvTranspose (from pads, output_shape or
    auto_pad), as lists over the spatial axes."""
    nd = len(x.shape) - 2
    strides = list(a.get("strides", [1] * nd))
    dilations = list(a.get("dilations", [1] * nd))
    extra = list(a.get("output_padding", [0] * nd))[:nd]
    full = [s * (n - 1) + op + (k - 1) * d + 1 for s, n, op, k, d in
            zip(strides, x.shape[2:], extra, kernel, dilations)]
    shape = a.get("output_shape")
    shape = list(shape)[-nd:] if shape is not None else None
    auto = a.get("auto_pad", "NOTSET")
    if "pads" in a and auto in ("NOTSET", "VALID"):
        pads = list(a["pads"])
        begins, ends = pads[:nd], pads[nd:]
        return strides, dilations, begins, shape or [f - b - e for f, b, e in
                                                      zip(full, begins, ends)]
    if auto == "VALID" or (auto == "NOTSET" and shape is None):
        return strides, dilations, [0] * nd, full
    if auto not in ("NOTSET", "SAME_UPPER", "SAME_LOWER"):
        ctx.fail(node, f"auto_pad {auto!r}")
    shape = shape or [n * s for n, s in zip(x.shape[2:], strides)]
    totals = [f - o for f, o in zip(full, shape)]
    begins = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in totals]
    return strides, dilations, begins, shape


def _im_conv_transpose(ctx, node, a):
    x, w, b = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    kernel = list(a.get("kernel_shape", w.shape[2:]))
    if tuple(kernel) != tuple(w.shape[2:]) or len(x.shape) not in (3, 4, 5):
        ctx.fail(node, f"only 1-D, 2-D and 3-D transposed convolutions with kernel_shape equal "
                       f"to the weight's {w.shape[2:]} import")
    strides, dilations, begins, outs = _transpose_geometry(ctx, node, a, x, kernel)
    if len(x.shape) == 5:
        return [_conv_transpose_3d(ctx, x, w, b, strides, dilations, begins, outs,
                                   a.get("group", 1))]
    one_d = len(x.shape) == 3
    if one_d:
        x, w = _lift_1d(ctx, x), _lift_1d(ctx, w, ctx.prepare)
        strides, dilations, begins, outs = ([1] + strides, [1] + dilations, [0] + begins,
                                            [1] + outs)
    group = a.get("group", 1)
    c_out = w.shape[1] * group
    natural = [s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in
               zip(strides, x.shape[2:], w.shape[2:], dilations)]
    symmetric = all(0 <= o + 2 * p - f < s for o, p, f, s in zip(outs, begins, natural, strides))
    if symmetric:  # the registry's transposed convolution: conv2d's input gradient
        y = ctx.emit("conv2d_grad_input", x, w, x_shape=(x.shape[0], c_out) + tuple(outs),
                     **conv_attrs("conv2d_grad_input", strides, begins, dilations, group))
    else:  # the whole result, then the window [begin, begin + out) of it
        need = [max(f, p + o) for f, p, o in zip(natural, begins, outs)]
        made = [min(n, f + s - 1) for n, f, s in zip(need, natural, strides)]
        y = ctx.emit("conv2d_grad_input", x, w, x_shape=(x.shape[0], c_out) + tuple(made),
                     **conv_attrs("conv2d_grad_input", strides, (0, 0), dilations, group))
        y = _explicit_pad(ctx, y, [0, 0], [n - m for n, m in zip(need, made)], 0.0)
        crop = (slice(None), slice(None)) + tuple(slice(p, p + o) for p, o in zip(begins, outs))
        y = ctx.emit("getitem", y, index=canonical_index(crop))
    if b is not None:
        y = ctx.emit("add", y, ctx.prepare("reshape", b, shape=(1, c_out, 1, 1)))
    if one_d:
        y = ctx.emit("reshape", y, shape=y.shape[:2] + y.shape[3:])
    return [y]


def _conv_transpose_3d(ctx, x, w, b, strides, dilations, begins, outs, group):
    """A 3-D transposed convolution as 2-D ones: input depth slice ``i`` through kernel depth
    slice ``k`` lands on output depth ``i * stride + k * dilation``; the slabs are summed per
    depth, stacked, and the window ``[begin, begin + out)`` of each axis is cut (zeros where
    it runs past the natural size, as output_padding asks)."""
    n, c_out = x.shape[0], w.shape[1] * group
    natural = [s * (m - 1) + (k - 1) * d + 1 for s, m, k, d in
               zip(strides, x.shape[2:], w.shape[2:], dilations)]
    attrs = conv_attrs("conv2d_grad_input", strides[1:], (0, 0), dilations[1:], group)
    slabs = [None] * natural[0]
    for i in range(x.shape[2]):
        xi = ctx.emit("getitem", x, index=canonical_index((slice(None), slice(None), i)))
        for k in range(w.shape[2]):
            wk = ctx.prepare("getitem", w, index=canonical_index((slice(None), slice(None), k)))
            part = ctx.emit("conv2d_grad_input", xi, wk,
                            x_shape=(n, c_out) + tuple(natural[1:]), **attrs)
            z = i * strides[0] + k * dilations[0]
            slabs[z] = part if slabs[z] is None else ctx.emit("add", slabs[z], part)
    zeros = ctx.full((n, c_out) + tuple(natural[1:]), 0, x.dtype)
    y = ctx.emit("stack", *[ctx.constant(zeros) if v is None else v for v in slabs], axis=2)
    need = [max(f, p + o) for f, p, o in zip(natural, begins, outs)]
    y = _explicit_pad(ctx, y, [0, 0, 0], [m - f for m, f in zip(need, natural)], 0.0)
    y = ctx.emit("getitem", y, index=canonical_index(
        (slice(None), slice(None)) + tuple(slice(p, p + o) for p, o in zip(begins, outs))))
    if b is not None:
        y = ctx.emit("add", y, ctx.prepare("reshape", b, shape=(1, c_out, 1, 1, 1)))
    return y


def _ceil_extra(size, kernel, stride, begin, end):
    """Extra end padding that ceil_mode adds: windows may run past the end, but each must
    start inside the input or its begin padding."""
    span = size + begin + end - kernel
    out = -(-span // stride) + 1
    if (out - 1) * stride >= size + begin:
        out -= 1
    return max((out - 1) * stride + kernel - (size + begin + end), 0)


def _pool_plan(ctx, node, a, x):
    """The window of an ONNX pooling node: kernel, strides, dilations, begins, ends (the
    ceil_mode extra included) and whether the registry's 2-D pooling op can run it as is."""
    kernel = a.get("kernel_shape")
    if kernel is None:
        ctx.fail(node, "attribute 'kernel_shape' is required")
    kernel, strides, dilations, begins, ends = _spatial(ctx, node, a, x, kernel, lift=False)
    spans = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if a.get("ceil_mode", 0):
        ends = [e + _ceil_extra(n, k, st, b, e) for n, k, st, b, e in
                zip(x.shape[2:], spans, strides, begins, ends)]
    direct = len(kernel) <= 2 and all(d == 1 for d in dilations) and begins == ends and all(
        2 * p <= k for p, k in zip(begins, kernel))
    return kernel, strides, dilations, begins, ends, direct


def _pool_attrs(kernel, strides, padding):
    return dict(kernel=tuple(map(int, kernel)), stride=tuple(map(int, strides)),
                padding=tuple(map(int, padding)))


def _ex_pool(onnx_type, **extra):
    def export(ctx, node):
        at = node.attrs
        (ph, pw) = at["padding"]
        ctx.emit(onnx_type, input_names(ctx, node), ctx.name(node.output),
                 kernel_shape=list(at["kernel"]), strides=list(at["stride"]),
                 pads=[ph, pw, ph, pw], **extra)
    return export


def _pool2d(ctx, op_name, x, kernel, strides, padding, make=None):
    """The registry's 2-D pooling op on ``x``, a 1-D pooling input lifted to 2-D and back."""
    make = make or ctx.emit
    if len(x.shape) == 4:
        return make(op_name, x, **_pool_attrs(kernel, strides, padding))
    kernel, strides, padding = [1] + list(kernel), [1] + list(strides), [0] + list(padding)
    y = make(op_name, _lift_1d(ctx, x, make), **_pool_attrs(kernel, strides, padding))
    return make("reshape", y, shape=y.shape[:2] + y.shape[3:])


def _taps(ctx, x, kernel, strides, dilations, combine, make=None):
    """A pooling window over any number of axes as ``combine`` over its taps: each tap is a
    strided slice of the (already padded) input, so dilated and 3-D windows need no op of
    their own."""
    outs = [(n - ((k - 1) * d + 1)) // s + 1 for n, k, s, d in
            zip(x.shape[2:], kernel, strides, dilations)]
    make, y = make or ctx.emit, None
    for tap in np.ndindex(*kernel):
        index = (slice(None), slice(None)) + tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s if s != 1 else None)
            for t, d, s, o in zip(tap, dilations, strides, outs))
        part = make("getitem", x, index=canonical_index(index))
        y = part if y is None else make(combine, y, part)
    return y


def _tap_indices(x_shape, tap, begins, strides, dilations, outs, column_major):
    """For one tap of a pooling window: the flat index into ``x`` (ONNX MaxPool's Indices:
    batch and channel included, padding not counted; ``storage_order=1`` orders the spatial
    axes column-major, the batch and channel offset staying row-major, as ONNX's reference
    and onnxruntime do) of the element it reads, per output position, as an int64 array of
    the output's shape."""
    coords = [t * d - b + s * np.arange(o) for t, d, b, s, o in
              zip(tap, dilations, begins, strides, outs)]
    n, c = x_shape[:2]
    grids = np.meshgrid(np.arange(n), np.arange(c), *coords, indexing="ij")
    spatial = list(x_shape[2:])
    order = range(len(spatial)) if column_major else range(len(spatial) - 1, -1, -1)
    flat, step = np.zeros(grids[0].shape, np.int64), 1
    for axis in order:
        flat += grids[2 + axis].astype(np.int64) * step
        step *= spatial[axis]
    return flat + (grids[0].astype(np.int64) * c + grids[1]) * step


def _maxpool_with_indices(ctx, node, a, x, kernel, strides, dilations, begins, ends):
    """MaxPool's two outputs over the window's taps: the running maximum and, where a tap's
    value is strictly greater (the first maximum wins, as in ONNX's reference), its index."""
    low = -np.inf if dtypes.is_float(x.dtype) else np.iinfo(x.dtype).min
    xp = _explicit_pad(ctx, x, begins, ends, low)
    outs = [(n - ((k - 1) * d + 1)) // s + 1 for n, k, s, d in
            zip(xp.shape[2:], kernel, strides, dilations)]
    column_major = bool(a.get("storage_order", 0))
    best = idx = None
    for tap in np.ndindex(*kernel):
        index = (slice(None), slice(None)) + tuple(
            slice(t * d, t * d + s * (o - 1) + 1, s if s != 1 else None)
            for t, d, s, o in zip(tap, dilations, strides, outs))
        part = ctx.emit("getitem", xp, index=canonical_index(index))
        where = _tap_indices(x.shape, tap, begins, strides, dilations, outs, column_major)
        if best is None:
            best, idx = part, ctx.constant(where)
            continue
        greater = ctx.emit("gt", part, best)
        best = ctx.emit("where", greater, part, best)
        idx = ctx.emit("where", greater, ctx.constant(where), idx)
    return [best, idx]


def _im_maxpool(ctx, node, a):
    x = ctx.input(node, 0)
    kernel, strides, dilations, begins, ends, direct = _pool_plan(ctx, node, a, x)
    if len(node.outputs) > 1 and node.outputs[1] and ctx.uses_name(node.outputs[1]):
        return _maxpool_with_indices(ctx, node, a, x, kernel, strides, dilations, begins, ends)
    if direct and dtypes.is_float(x.dtype):
        return [_pool2d(ctx, "max_pool2d", x, kernel, strides, begins)]
    low = -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min
    xp = _explicit_pad(ctx, x, begins, ends, low)
    if len(kernel) <= 2 and all(d == 1 for d in dilations) and dtypes.is_float(x.dtype):
        return [_pool2d(ctx, "max_pool2d", xp, kernel, strides, [0] * len(kernel))]
    return [_taps(ctx, xp, kernel, strides, dilations, "maximum")]


def _im_avgpool(ctx, node, a):
    x = ctx.input(node, 0)
    kernel, strides, dilations, begins, ends, direct = _pool_plan(ctx, node, a, x)
    include = a.get("count_include_pad", 0)
    if direct and (include or not any(begins)):
        return [_pool2d(ctx, "avg_pool2d", x, kernel, strides, begins)]
    # the window's sum over the zero-padded input, divided by how many of its cells count
    xp = _explicit_pad(ctx, x, begins, ends, 0.0)
    mask = ctx.full((1, 1) + tuple(xp.shape[2:]), 0, x.dtype)
    _, pad_ends = _window_pads(ctx, node, a, x.shape[2:], kernel, strides, dilations)
    counted = tuple(slice(0, b + n + e) if include else slice(b, b + n)
                    for b, n, e in zip(begins, x.shape[2:], pad_ends))  # not ceil's extra
    mask[(slice(None), slice(None)) + counted] = 1
    if len(kernel) <= 2 and all(d == 1 for d in dilations):
        zero = [0] * len(kernel)
        total = _pool2d(ctx, "avg_pool2d", xp, kernel, strides, zero)
        share = _pool2d(ctx, "avg_pool2d", mask, kernel, strides, zero, make=ctx.prepare)
    else:
        total = _taps(ctx, xp, kernel, strides, dilations, "add")
        share = _taps(ctx, ctx.constant(mask), kernel, strides, dilations, "add",
                      make=ctx.prepare)
    return [ctx.emit("div", total, share)]


def _im_lrn(ctx, node, a):
    x = ctx.input(node, 0)
    if "size" not in a:
        ctx.fail(node, "attribute 'size' is required")
    size = int(a["size"])
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    n, c = x.shape[:2]
    sq = ctx.emit("reshape", ctx.emit("mul", x, x), shape=(n, 1, c, int(np.prod(x.shape[2:]))))
    if lo != hi:
        sq = ctx.emit("pad", sq, pad_width=((0, 0), (0, 0), (lo, hi), (0, 0)), value=0.0)
    window = ctx.emit("avg_pool2d", sq, kernel=(size, 1), stride=(1, 1),
                      padding=(lo if lo == hi else 0, 0))  # the mean of the size squares
    scaled = ctx.emit("add", ctx.emit("mul", ctx.emit("reshape", window, shape=x.shape),
                                      scalar_like(a.get("alpha", 1e-4), x)),
                      scalar_like(a.get("bias", 1.0), x))
    return [ctx.emit("div", x, ctx.emit("pow", scaled, scalar_like(a.get("beta", 0.75), x)))]


_WINDOW = ("auto_pad", "kernel_shape", "pads", "strides", "dilations")
register_onnx("conv2d", export=_ex_conv, writes=("Conv",),
              imports=(OnnxImport("Conv", _im_conv, _WINDOW + ("group",)),))
register_onnx("conv2d_grad_input", export=_ex_conv_transpose, writes=("ConvTranspose",),
              imports=(OnnxImport("ConvTranspose", _im_conv_transpose,
                                  _WINDOW + ("group", "output_padding", "output_shape")),))
register_onnx("max_pool2d", export=_ex_pool("MaxPool"), writes=("MaxPool",),
              imports=(OnnxImport("MaxPool", _im_maxpool,
                                  _WINDOW + ("ceil_mode", "storage_order")),))
register_onnx("avg_pool2d", export=_ex_pool("AveragePool", count_include_pad=1),
              writes=("AveragePool",),
              imports=(OnnxImport("AveragePool", _im_avgpool,
                                  _WINDOW + ("ceil_mode", "count_include_pad")),
                       OnnxImport("LRN", _im_lrn, ("size", "alpha", "beta", "bias"))))


# --- one-hot and losses --------------------------------------------------------------------------
def _ex_one_hot(ctx, node):
    t = node.inputs[0]
    dt = node.attrs["dtype"]
    ctx.emit("OneHot", [ctx.name(t), ctx.ints([node.attrs["num_classes"]], "depth"),
                        ctx.const(np.asarray([0, 1], dt), "on_off")],
             ctx.name(node.output), axis=-1)


def _im_one_hot(ctx, node, a):
    idx, values = ctx.input(node, 0), ctx.array(node, 2, "values")
    depth = int(np.asarray(ctx.array(node, 1, "depth")).reshape(-1)[0])
    off, on = np.asarray(values).reshape(-1)[:2]
    p = ctx.prepare
    if idx.dtype.kind == "f":
        idx = p("cast", idx, dtype=dtypes.int64)
    if idx.dtype.kind == "i":  # ONNX counts negative indices from the end
        idx = p("where", p("lt", idx, scalar_like(0, idx)),
                p("add", idx, scalar_like(depth, idx)), idx)
    # an index outside [-depth, depth) gives a row of off values (one_hot itself refuses it)
    inside = p("lt", idx, scalar_like(depth, idx))
    if idx.dtype.kind == "i":
        inside = p("where", p("ge", idx, scalar_like(0, idx)), inside, np.asarray(False))
    idx = p("where", inside, idx, scalar_like(0, idx))
    y = ctx.emit("one_hot", idx, num_classes=depth, dtype=np.dtype(values.dtype))
    y = ctx.emit("where", p("reshape", inside, shape=tuple(inside.shape) + (1,)), y,
                 scalar_like(0, y))
    if (off, on) != (0, 1):
        y = ctx.emit("add", ctx.emit("mul", y, scalar_like(on - off, y)), scalar_like(off, y))
    axis = check_axis(ctx, node, a.get("axis", -1), len(y.shape))
    if axis != len(y.shape) - 1:
        perm = list(range(len(y.shape) - 1))
        perm.insert(axis, len(y.shape) - 1)
        y = ctx.emit("transpose", y, axes=tuple(perm))
    return [y]


def _ex_cross_entropy(ctx, node):
    x, t = node.inputs
    labels = ctx.cast(ctx.name(t), t.dtype, dtypes.int64 if t.dtype.kind != "i" else t.dtype)
    ctx.emit("SoftmaxCrossEntropyLoss", [ctx.name(x), labels], ctx.name(node.output),
             reduction="mean")


def _ex_mse(ctx, node):
    d = ctx.emit("Sub", input_names(ctx, node))
    sq = ctx.emit("Mul", [d, d])
    ctx.emit("ReduceMean", [sq], ctx.name(node.output), keepdims=0)


def _nll(ctx, node, a, logp, labels, weight):
    """ONNX's negative log-likelihood loss of log-probabilities ``logp`` (N, C, d...)."""
    reduction = a.get("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        ctx.fail(node, f"reduction {reduction!r}")
    n_cls, r = logp.shape[1], len(logp.shape)
    ignore = a.get("ignore_index")
    keep = None
    if ignore is not None:
        keep = ctx.emit("ne", labels, scalar_like(ignore, labels))
        labels = ctx.emit("where", keep, labels, scalar_like(0, labels))
    hot = ctx.emit("one_hot", labels, num_classes=n_cls, dtype=logp.dtype)  # (N, d..., C)
    hot = ctx.emit("transpose", hot, axes=(0, r - 1) + tuple(range(1, r - 1)))
    loss = ctx.emit("neg", ctx.emit("sum", ctx.emit("mul", logp, hot), axis=(1,),
                                    keepdims=False))
    w = None if weight is None else ctx.emit("take", weight, labels, axis=0)
    if keep is not None:
        mask = ctx.emit("cast", keep, dtype=logp.dtype)
        w = mask if w is None else ctx.emit("mul", w, mask)
    if w is not None:
        loss = ctx.emit("mul", loss, w)
    if reduction == "none":
        return loss
    total = ctx.emit("sum", loss, axis=tuple(range(len(loss.shape))), keepdims=False)
    if reduction == "sum":
        return total
    if w is None:
        return ctx.emit("div", total, scalar_like(int(np.prod(loss.shape)), total))
    return ctx.emit("div", total, ctx.emit("sum", w, axis=tuple(range(len(w.shape))),
                                           keepdims=False))


def _im_softmax_ce(ctx, node, a):
    x, labels, weight = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    wants_logp = len(node.outputs) > 1 and bool(node.outputs[1])
    if len(x.shape) == 2 and weight is None and a.get("ignore_index") is None and \
            a.get("reduction", "mean") == "mean" and not wants_logp:
        return [ctx.emit("cross_entropy", x, labels)]
    logp = ctx.emit("log_softmax", x, axis=1)
    return [_nll(ctx, node, a, logp, labels, weight), logp]


def _im_nll(ctx, node, a):
    return [_nll(ctx, node, a, ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2))]


_LOSS = ("reduction", "ignore_index")
register_onnx("one_hot", export=_ex_one_hot, writes=("OneHot",),
              imports=(OnnxImport("OneHot", _im_one_hot, ("axis",)),))
register_onnx("cross_entropy", export=_ex_cross_entropy, writes=("SoftmaxCrossEntropyLoss",),
              imports=(OnnxImport("SoftmaxCrossEntropyLoss", _im_softmax_ce, _LOSS),
                       OnnxImport("NegativeLogLikelihoodLoss", _im_nll, _LOSS)))
register_onnx("mse_loss", export=_ex_mse, writes=("Sub", "Mul", "ReduceMean"))
