"""The ONNX mappings of the shape ops: reshape, transpose and friends, reductions, joining,
indexing and padding (one :func:`~.mapping.register_onnx` call per op; loaded by
:mod:`mlsys_lab.deploy.onnx`)."""

import numpy as np

from ...engine import dtypes
from ...engine.ops_shape import canonical_index
from .mapping import (
    INT64_MAX,
    INT64_MIN,
    OnnxImport,
    check_axis,
    input_names,
    register_onnx,
    unsqueeze_shape,
)


# --- shapes --------------------------------------------------------------------------------------
def _ex_reshape(ctx, node):
    shape = node.attrs["shape"]
    ctx.emit("Reshape", [ctx.name(node.inputs[0]), ctx.ints(shape, "shape")],
             ctx.name(node.output), allowzero=1 if 0 in shape else None)


def _im_reshape(ctx, node, a):
    x = ctx.input(node, 0)
    target = [int(d) for d in ctx.array(node, 1, "shape")]
    if not a.get("allowzero", 0):
        target = [x.shape[i] if d == 0 else d for i, d in enumerate(target)]
    if target.count(-1) == 1:
        known = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = int(np.prod(x.shape)) // known if known else 0
    return [ctx.emit("reshape", x, shape=tuple(target))]


def _im_flatten(ctx, node, a):
    x = ctx.input(node, 0)
    r = len(x.shape)
    axis = a.get("axis", 1)
    if not -r <= axis <= r:
        ctx.fail(node, f"axis {axis} is out of range for rank {r}")
    axis += r if axis < 0 else 0
    shape = (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:])))
    return [ctx.emit("reshape", x, shape=shape)]


def _axes_of(ctx, node, a, position, since):
    """The ``axes`` of a node: an input from opset ``since`` on, an attribute before."""
    if ctx.opset >= since:
        axes = ctx.array(node, position, "axes")
        return None if axes is None else [int(v) for v in np.asarray(axes).reshape(-1)]
    return None if a.get("axes") is None else list(a["axes"])


def _as_int_index(part):
    """``slice(s, s+1)`` (or ``slice(-1, None)``) as the int ``s`` that getitem exports so."""
    if not isinstance(part, slice) or part.step is not None or part.start is None:
        return None
    s, e = part.start, part.stop
    return s if (s == -1 and e is None) or (s != -1 and e == s + 1) else None


def _im_squeeze(ctx, node, a):
    x = ctx.input(node, 0)
    axes = _axes_of(ctx, node, a, 1, 13)
    r = len(x.shape)
    axes = [i for i, d in enumerate(x.shape) if d == 1] if axes is None else \
        sorted(check_axis(ctx, node, ax, r) for ax in axes)
    for ax in axes:
        if x.shape[ax] != 1:
            ctx.fail(node, f"cannot squeeze axis {ax} of length {x.shape[ax]}")
    src = ctx.producer(x)
    if src is not None and src.op == "getitem" and ctx.single_use(x):
        index = list(src.attrs["index"])
        picks = [_as_int_index(index[ax]) if ax < len(index) else None for ax in axes]
        if all(isinstance(p, slice) for p in index) and None not in picks:
            for ax, p in zip(axes, picks):
                index[ax] = p  # getitem's int indices, as it exports them
            ctx.absorb(src)
            return [ctx.emit("getitem", src.inputs[0], index=canonical_index(tuple(index)))]
    shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [ctx.emit("reshape", x, shape=shape)]


def _im_unsqueeze(ctx, node, a):
    x = ctx.input(node, 0)
    axes = _axes_of(ctx, node, a, 1, 13)
    if not axes:
        ctx.fail(node, "axes are required")
    r = len(x.shape) + len(axes)
    norm = sorted(check_axis(ctx, node, ax, r) for ax in axes)
    return [ctx.emit("reshape", x, shape=unsqueeze_shape(x.shape, norm))]


def _ex_transpose(ctx, node):
    ctx.emit("Transpose", input_names(ctx, node), ctx.name(node.output),
             perm=list(node.attrs["axes"]))


def _im_transpose(ctx, node, a):
    x = ctx.input(node, 0)
    perm = a.get("perm")
    perm = tuple(reversed(range(len(x.shape)))) if perm is None else tuple(int(p) for p in perm)
    return [ctx.emit("transpose", x, axes=perm)]


def _ex_broadcast_to(ctx, node):
    ctx.emit("Expand", [ctx.name(node.inputs[0]), ctx.ints(node.attrs["shape"], "shape")],
             ctx.name(node.output))


def _broadcast(shape_a, shape_b):
    r = max(len(shape_a), len(shape_b))
    a = (1,) * (r - len(shape_a)) + tuple(shape_a)
    b = (1,) * (r - len(shape_b)) + tuple(shape_b)
    return tuple(max(p, q) if 1 in (p, q) else p for p, q in zip(a, b))


def _im_expand(ctx, node, a):
    x = ctx.input(node, 0)
    shape = [int(d) for d in ctx.array(node, 1, "shape")]
    return [ctx.emit("broadcast_to", x, shape=_broadcast(x.shape, shape))]


def _im_tile(ctx, node, a):
    x = ctx.input(node, 0)
    reps = [int(r) for r in ctx.array(node, 1, "repeats")]
    if len(reps) != len(x.shape):
        ctx.fail(node, f"{len(reps)} repeats for a rank-{len(x.shape)} input")
    spread = ctx.emit("reshape", x, shape=tuple(v for d in x.shape for v in (1, d)))
    wide = ctx.emit("broadcast_to", spread, shape=tuple(v for r, d in zip(reps, x.shape)
                                                      for v in (r, d)))
    return [ctx.emit("reshape", wide, shape=tuple(r * d for r, d in zip(reps, x.shape)))]


register_onnx("reshape", export=_ex_reshape, writes=("Reshape",),
              imports=(OnnxImport("Reshape", _im_reshape, ("allowzero",)),
                       OnnxImport("Flatten", _im_flatten, ("axis",)),
                       OnnxImport("Squeeze", _im_squeeze, ("axes",)),
                       OnnxImport("Unsqueeze", _im_unsqueeze, ("axes",))))
register_onnx("transpose", export=_ex_transpose, writes=("Transpose",),
              imports=(OnnxImport("Transpose", _im_transpose, ("perm",)),))
register_onnx("broadcast_to", export=_ex_broadcast_to, writes=("Expand",),
              imports=(OnnxImport("Expand", _im_expand), OnnxImport("Tile", _im_tile)))


# --- reductions ----------------------------------------------------------------------------------
def _ex_reduce(onnx_type, axes_input_since):
    def export(ctx, node):
        x = node.inputs[0]
        axis, keep = node.attrs["axis"], int(node.attrs["keepdims"])
        name = ctx.name(x)
        if onnx_type == "ReduceSum" and x.dtype.kind in "biu":
            name = ctx.cast(name, x.dtype, node.output.dtype)  # mlsys_lab sums ints in int64
        full = len(x.shape) > 0 and tuple(axis) == tuple(range(len(x.shape)))
        if not full and (len(x.shape) == 0 or not axis):  # a reduction over no axis
            ctx.emit("Identity", [name], ctx.name(node.output))
            return
        inputs, attrs = [name], {"keepdims": keep}
        if not full:
            if ctx.opset >= axes_input_since:
                inputs.append(ctx.ints(axis, "axes"))
            else:
                attrs["axes"] = list(axis)
        ctx.emit(onnx_type, inputs, ctx.name(node.output), **attrs)
    return export


def _reduce_axes(ctx, node, a, since):
    """(axes as a sorted tuple, keepdims) of an ONNX reduction; None axes: no reduction."""
    x = ctx.input(node, 0)
    axes = _axes_of(ctx, node, a, 1, since)
    keep = bool(a.get("keepdims", 1))
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            return (), keep
        return tuple(range(len(x.shape))), keep
    return tuple(sorted({check_axis(ctx, node, ax, len(x.shape)) for ax in axes})), keep


def _as_dtype_of(ctx, y, x):
    return y if y.dtype == x.dtype else ctx.emit("cast", y, dtype=x.dtype)


def _empty(ctx, x, axes, keep, fill):
    """The result of reducing over an axis of length 0: ``fill`` everywhere (ONNX's identity
    element of the reduction, -inf for a max), or None when no reduced axis is empty."""
    if not any(x.shape[ax] == 0 for ax in axes):
        return None
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else \
        tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if x.dtype.kind == "b":
        fill = fill > 0
    elif x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        fill = info.min if fill < 0 else info.max
    return ctx.constant(ctx.full(shape, fill, x.dtype))


def _reducer(op_name, since, before=None, after=None):
    """Importer of ``after(op(before(x)))`` over an ONNX reduction's axes."""
    def convert(ctx, node, a):
        x = ctx.input(node, 0)
        axes, keep = _reduce_axes(ctx, node, a, since)
        if op_name == "max":
            empty = _empty(ctx, x, axes, keep, -np.inf)
            if empty is not None:
                return [empty]
        src = x if before is None else before(ctx, x)
        if op_name == "mean" and axes == tuple(range(len(x.shape))) and not keep:
            peep = _mse_peephole(ctx, x)
            if peep is not None:
                return [peep]
        y = ctx.emit(op_name, src, axis=axes, keepdims=keep)
        if after is not None:
            y = after(ctx, y)
        return [_as_dtype_of(ctx, y, x)]
    return convert


def _mse_peephole(ctx, x):
    """``ReduceMean(Mul(d, d))`` with ``d = Sub(p, t)`` over every axis, as mse_loss exports."""
    sq = ctx.producer(x)
    if sq is None or sq.op != "mul" or sq.inputs[0] is not sq.inputs[1] or not ctx.single_use(x):
        return None
    d = sq.inputs[0]
    diff = ctx.producer(d)
    if diff is None or diff.op != "sub" or ctx.uses(d) != 2:
        return None
    p, t = diff.inputs
    if p.shape != t.shape or p.dtype != t.dtype or not dtypes.is_float(p.dtype):
        return None
    ctx.absorb(sq, diff)
    return ctx.emit("mse_loss", p, t)


def _square(ctx, x):
    return ctx.emit("mul", x, x)


def _to_float(ctx, x):
    return x if dtypes.is_float(x.dtype) else ctx.emit("cast", x, dtype=dtypes.float64)


def _im_reduce_l2(ctx, node, a):
    x = ctx.input(node, 0)
    axes, keep = _reduce_axes(ctx, node, a, 18)
    y = ctx.emit("sqrt", _to_float(ctx, ctx.emit("sum", _square(ctx, x), axis=axes,
                                                  keepdims=keep)))
    return [_as_dtype_of(ctx, y, x)]


def _im_reduce_log_sum(ctx, node, a):
    x = ctx.input(node, 0)
    axes, keep = _reduce_axes(ctx, node, a, 18)
    y = ctx.emit("log", _to_float(ctx, ctx.emit("sum", x, axis=axes, keepdims=keep)))
    return [_as_dtype_of(ctx, y, x)]


def _im_reduce_log_sum_exp(ctx, node, a):
    x = ctx.input(node, 0)
    axes, keep = _reduce_axes(ctx, node, a, 18)
    empty = _empty(ctx, x, axes, keep, -np.inf)
    if empty is not None:
        return [empty]
    xf = _to_float(ctx, x)
    top = ctx.emit("max", xf, axis=axes, keepdims=True)
    total = ctx.emit("sum", ctx.emit("exp", ctx.emit("sub", xf, top)), axis=axes,
                     keepdims=keep)
    shift = top if keep else ctx.emit("reshape", top, shape=tuple(
        d for i, d in enumerate(x.shape) if i not in axes))
    return [_as_dtype_of(ctx, ctx.emit("add", ctx.emit("log", total), shift), x)]


def _im_reduce_min(ctx, node, a):
    x = ctx.input(node, 0)
    axes, keep = _reduce_axes(ctx, node, a, 18)
    empty = _empty(ctx, x, axes, keep, np.inf)
    if empty is not None:
        return [empty]
    xs = x if x.dtype.kind in "fi" and x.dtype != dtypes.bool_ else \
        ctx.emit("cast", x, dtype=dtypes.int64)
    y = ctx.emit("neg", ctx.emit("max", ctx.emit("neg", xs), axis=axes, keepdims=keep))
    return [_as_dtype_of(ctx, y, x)]


def _global_pool(op_name):
    def convert(ctx, node, a):
        x = ctx.input(node, 0)
        return [ctx.emit(op_name, x, axis=tuple(range(2, len(x.shape))), keepdims=True)]
    return convert


_REDUCE_ATTRS = ("axes", "keepdims", "noop_with_empty_axes")
register_onnx("sum", export=_ex_reduce("ReduceSum", 13), writes=("ReduceSum",),
              imports=(OnnxImport("ReduceSum", _reducer("sum", 13), _REDUCE_ATTRS),
                       OnnxImport("ReduceSumSquare", _reducer("sum", 18, before=_square),
                                  _REDUCE_ATTRS),
                       OnnxImport("ReduceL1", _reducer("sum", 18, before=lambda c, x: c.emit(
                           "abs", x)), _REDUCE_ATTRS),
                       OnnxImport("ReduceL2", _im_reduce_l2, _REDUCE_ATTRS),
                       OnnxImport("ReduceLogSum", _im_reduce_log_sum, _REDUCE_ATTRS),
                       OnnxImport("ReduceLogSumExp", _im_reduce_log_sum_exp, _REDUCE_ATTRS)))
register_onnx("mean", export=_ex_reduce("ReduceMean", 18), writes=("ReduceMean",),
              imports=(OnnxImport("ReduceMean", _reducer("mean", 18), _REDUCE_ATTRS),
                       OnnxImport("GlobalAveragePool", _global_pool("mean"))))
register_onnx("max", export=_ex_reduce("ReduceMax", 18), writes=("ReduceMax",),
              imports=(OnnxImport("ReduceMax", _reducer("max", 18), _REDUCE_ATTRS),
                       OnnxImport("ReduceMin", _im_reduce_min, _REDUCE_ATTRS),
                       OnnxImport("GlobalMaxPool", _global_pool("max"))))


def _ex_argmax(ctx, node):
    x, axis = node.inputs[0], node.attrs["axis"]
    name = ctx.name(x)
    if axis is None:
        name, axis = ctx.emit("Reshape", [name, ctx.ints([-1], "flat")]), 0
    ctx.emit("ArgMax", [name], ctx.name(node.output), axis=int(axis), keepdims=0)


def _im_arg(negate):
    def convert(ctx, node, a):
        x = ctx.input(node, 0)
        axis = check_axis(ctx, node, a.get("axis", 0), len(x.shape))
        keep, last = a.get("keepdims", 1), a.get("select_last_index", 0)
        src = ctx.producer(x)
        if not negate and not keep and not last and axis == 0 and src is not None and \
                src.op == "reshape" and len(x.shape) == 1 and ctx.single_use(x):
            ctx.absorb(src)
            return [ctx.emit("argmax", src.inputs[0], axis=None)]  # as argmax(axis=None) exports
        if negate:
            xs = x if x.dtype.kind == "f" else ctx.emit("cast", x, dtype=dtypes.int64)
            x = ctx.emit("neg", xs)
        if last:
            flip = (slice(None),) * axis + (slice(None, None, -1),)
            x = ctx.emit("getitem", x, index=canonical_index(flip))
        y = ctx.emit("argmax", x, axis=axis)
        if last:
            y = ctx.emit("sub", np.asarray(x.shape[axis] - 1, np.int64), y)
        if keep:
            y = ctx.emit("reshape", y, shape=unsqueeze_shape(y.shape, [axis]))
        return [y]
    return convert


_ARG_ATTRS = ("axis", "keepdims", "select_last_index")
register_onnx("argmax", export=_ex_argmax, writes=("ArgMax",),
              imports=(OnnxImport("ArgMax", _im_arg(False), _ARG_ATTRS),
                       OnnxImport("ArgMin", _im_arg(True), _ARG_ATTRS)))


# --- joining, indexing, padding ------------------------------------------------------------------
def _ex_concat(ctx, node):
    ctx.emit("Concat", input_names(ctx, node), ctx.name(node.output), axis=int(node.attrs["axis"]))


def _ex_stack(ctx, node):
    axis = int(node.attrs["axis"])
    parts = [ctx.emit("Unsqueeze", [n, ctx.ints([axis], "axes")]) for n in input_names(ctx, node)]
    ctx.emit("Concat", parts, ctx.name(node.output), axis=axis)


def _stacked(ctx, xs, axis):
    """The tensors that ``xs`` unsqueeze at ``axis`` (as stack exports), or None."""
    origs = []
    for x in xs:
        src = ctx.producer(x)
        if src is None or src.op != "reshape" or not ctx.single_use(x):
            return None
        orig = src.inputs[0]
        if tuple(x.shape) != unsqueeze_shape(orig.shape, [axis]) or \
                orig.shape != xs[0].shape[:axis] + xs[0].shape[axis + 1:]:
            return None
        origs.append(orig)
    return origs


def _im_concat(ctx, node, a):
    xs = ctx.inputs(node)
    if "axis" not in a:
        ctx.fail(node, "attribute 'axis' is required")
    axis = int(a["axis"])
    origs = _stacked(ctx, xs, check_axis(ctx, node, axis, len(xs[0].shape)))
    if origs is not None:
        ctx.absorb(*[ctx.producer(x) for x in xs])
        return [ctx.emit("stack", *origs, axis=axis)]
    return [ctx.emit("concatenate", *xs, axis=axis)]


def _slice_bound(v, step, is_start):
    """An ONNX Slice bound as Python's: the int64 sentinels that mean 'from the start' or
    'to the end' in the direction of ``step`` become None."""
    v = int(v)
    if step > 0:
        open_end = v <= -2**62 if is_start else v >= 2**62
    else:
        open_end = v >= 2**62 if is_start else v <= -2**62
    return None if open_end else v


def _onnx_bound(v, step, is_start):
    """A Python slice bound as ONNX Slice's (None as the int64 sentinel of its direction)."""
    if v is not None:
        return int(v)
    return (INT64_MIN if step > 0 else INT64_MAX) if is_start else \
        (INT64_MAX if step > 0 else INT64_MIN)


def _ex_getitem(ctx, node):
    x, index = node.inputs[0], node.attrs["index"]
    parts = list(index)
    taking = [p for p in parts if p is not None and p is not Ellipsis]
    if Ellipsis in parts:
        at = parts.index(Ellipsis)
        parts[at:at + 1] = [slice(None)] * (len(x.shape) - len(taking))
    arrays = [i for i, p in enumerate(parts) if isinstance(p, tuple)]
    if arrays:
        return _ex_gather_index(ctx, node, parts, arrays)
    if any(isinstance(p, bool) for p in parts):
        ctx.fail(f"a bool index {index} has no ONNX form")
    axes, starts, ends, steps, squeeze, news = [], [], [], [], [], []
    axis = out_pos = 0
    for p in parts:
        if p is None:
            news.append(out_pos)
            out_pos += 1
            continue
        if isinstance(p, int):
            start, end, step = p, (p + 1 if p != -1 else None), 1
            squeeze.append(axis)
        else:
            step = 1 if p.step is None else p.step
            start, end = p.start, p.stop
            out_pos += 1
        axes.append(axis)
        starts.append(_onnx_bound(start, step, True))
        ends.append(_onnx_bound(end, step, False))
        steps.append(step)
        axis += 1
    name, final = ctx.name(x), ctx.name(node.output)
    stages = [s for s in ("slice" if axes else None, "squeeze" if squeeze else None,
                          "unsqueeze" if news else None) if s]
    if not stages:
        ctx.emit("Identity", [name], final)
        return
    for stage in stages:
        out = final if stage == stages[-1] else None
        if stage == "slice":
            name = ctx.emit("Slice", [name, ctx.ints(starts, "starts"), ctx.ints(ends, "ends"),
                                      ctx.ints(axes, "axes"), ctx.ints(steps, "steps")], out)
        else:
            name = ctx.emit(stage.capitalize(), [name, ctx.ints(
                squeeze if stage == "squeeze" else news, "axes")], out)


def _ex_gather_index(ctx, node, parts, arrays):
    """``x[..., idx, ...]`` with one integer index array and full slices elsewhere: Gather."""
    full = slice(None)
    k = arrays[0]
    if len(arrays) != 1 or any(p != full for i, p in enumerate(parts) if i != k) or \
            np.asarray(parts[k]).dtype.kind == "b":
        ctx.fail(f"index {node.attrs['index']}: only one integer index array (with full "
                 f"slices elsewhere) has an ONNX form")
    idx = ctx.const(np.asarray(parts[k], np.int64), "index")
    ctx.emit("Gather", [ctx.name(node.inputs[0]), idx], ctx.name(node.output), axis=k)


def _im_slice(ctx, node, a):
    x = ctx.input(node, 0)
    if ctx.opset < 10:
        starts, ends, axes, steps = a.get("starts"), a.get("ends"), a.get("axes"), None
    else:
        starts, ends = ctx.array(node, 1, "starts"), ctx.array(node, 2, "ends")
        axes, steps = ctx.array(node, 3, "axes"), ctx.array(node, 4, "steps")
    starts = [int(v) for v in np.asarray(starts).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends).reshape(-1)]
    r = len(x.shape)
    axes = list(range(len(starts))) if axes is None else \
        [check_axis(ctx, node, int(v), r) for v in np.asarray(axes).reshape(-1)]
    steps = [1] * len(starts) if steps is None else [int(v) for v in np.asarray(steps)
                                                     .reshape(-1)]
    if 0 in steps:
        ctx.fail(node, "a step of 0")
    index = [slice(None)] * (max(axes) + 1 if axes else 0)
    for ax, s, e, st in zip(axes, starts, ends, steps):
        index[ax] = slice(_slice_bound(s, st, True), _slice_bound(e, st, False),
                          None if st == 1 else st)
    return [ctx.emit("getitem", x, index=canonical_index(tuple(index)))]


def _im_split(ctx, node, a):
    x = ctx.input(node, 0)
    axis = check_axis(ctx, node, a.get("axis", 0), len(x.shape))
    n, count = x.shape[axis], len(node.outputs)
    sizes = ctx.array(node, 1, "split") if ctx.opset >= 13 else a.get("split")
    if sizes is None:
        parts = a.get("num_outputs", count)
        each = -(-n // parts)
        sizes = [min(each, n - i * each) for i in range(parts)]
    sizes = [int(s) for s in np.asarray(sizes).reshape(-1)]
    if sum(sizes) != n or len(sizes) != count:
        ctx.fail(node, f"split sizes {sizes} do not cover axis {axis} of length {n} in "
                       f"{count} outputs")
    outs, start = [], 0
    for size in sizes:
        index = (slice(None),) * axis + (slice(start, start + size),)
        outs.append(ctx.emit("getitem", x, index=canonical_index(index)))
        start += size
    return outs


def _ex_take(ctx, node):
    x, idx = input_names(ctx, node)
    ctx.emit("Gather", [x, idx], ctx.name(node.output), axis=int(node.attrs["axis"]))


def _ex_embedding(ctx, node):
    """``embedding`` (the dense lookup that refuses ids outside the table) is a Gather on axis
    0; ONNX's Gather counts a negative index from the end, the one id it does not refuse."""
    w, idx = input_names(ctx, node)
    ctx.emit("Gather", [w, idx], ctx.name(node.output), axis=0)


def _im_gather(ctx, node, a):
    x, idx = ctx.inputs(node)
    return [ctx.emit("take", x, idx, axis=int(a.get("axis", 0)))]


def _ex_pad(ctx, node):
    x = node.inputs[0]
    widths = node.attrs["pad_width"]
    pads = [b for b, _ in widths] + [e for _, e in widths]
    value = ctx.const(np.asarray(node.attrs["value"], x.dtype), "pad_value")
    ctx.emit("Pad", [ctx.name(x), ctx.ints(pads, "pads"), value], ctx.name(node.output),
             mode="constant")


def _im_pad(ctx, node, a):
    x = ctx.input(node, 0)
    mode = a.get("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        ctx.fail(node, f"mode {mode!r}")
    r = len(x.shape)
    if ctx.opset < 11:
        pads, value = list(a.get("pads", [])), a.get("value", 0.0)
        axes = None
    else:
        pads = [int(v) for v in ctx.array(node, 1, "pads").reshape(-1)]
        const = ctx.array(node, 2, "constant_value")
        value = 0.0 if const is None or np.asarray(const).size == 0 else \
            np.asarray(const).reshape(-1)[0].item()
        axes = ctx.array(node, 3, "axes")
    axes = list(range(r)) if axes is None else [check_axis(ctx, node, int(v), r) for v in axes]
    if len(pads) != 2 * len(axes):
        ctx.fail(node, f"{len(pads)} pads for {len(axes)} axes")
    widths = [[0, 0] for _ in range(r)]
    for k, ax in enumerate(axes):
        widths[ax] = [int(pads[k]), int(pads[k + len(axes)])]
    y = x
    if any(b < 0 or e < 0 for b, e in widths):  # negative pads crop
        crop = tuple(slice(-min(b, 0), d + min(e, 0)) for (b, e), d in zip(widths, x.shape))
        y = ctx.emit("getitem", y, index=canonical_index(crop))
    grow = tuple((max(b, 0), max(e, 0)) for b, e in widths)
    if mode != "constant":
        for ax, (b, e) in enumerate(grow):
            if b or e:
                y = _pad_from_input(ctx, node, y, ax, b, e, mode)
    elif any(map(any, grow)) or y is x:
        y = ctx.emit("pad", y, pad_width=grow, value=float(value))
    return [y if y is not x else ctx.emit("identity", x)]


def _pad_from_input(ctx, node, x, axis, before, after, mode):
    """``x`` padded along ``axis`` with its own values: the edge repeated, a mirror image
    without the edge (reflect) or the other end (wrap), joined with concatenate."""
    n = x.shape[axis]

    def part(start, stop, step=None):
        index = (slice(None),) * axis + (slice(start, stop, step),)
        return ctx.emit("getitem", x, index=canonical_index(index))

    def edge(at, count):
        shape = x.shape[:axis] + (count,) + x.shape[axis + 1:]
        return ctx.emit("broadcast_to", part(at, at + 1 if at >= 0 else None), shape=shape)

    if mode == "edge":
        pieces = [edge(0, before) if before else None, x, edge(-1, after) if after else None]
    elif mode == "reflect":
        if before >= n or after >= n:
            ctx.fail(node, f"reflect padding of {max(before, after)} needs more than {n} values")
        stop = n - 2 - after
        pieces = [part(before, 0, -1) if before else None, x,
                  part(n - 2, stop if stop >= 0 else None, -1) if after else None]
    else:
        if before > n or after > n:
            ctx.fail(node, f"wrap padding of {max(before, after)} needs more than {n} values")
        pieces = [part(n - before, n) if before else None, x, part(0, after) if after else None]
    return ctx.emit("concatenate", *[p for p in pieces if p is not None], axis=axis)


register_onnx("concatenate", export=_ex_concat, writes=("Concat",),
              imports=(OnnxImport("Concat", _im_concat, ("axis",)),))
register_onnx("stack", export=_ex_stack, writes=("Unsqueeze", "Concat"))
register_onnx("getitem", export=_ex_getitem, writes=("Slice", "Squeeze", "Unsqueeze", "Gather"),
              imports=(OnnxImport("Slice", _im_slice, ("starts", "ends", "axes")),
                       OnnxImport("Split", _im_split, ("axis", "split", "num_outputs"))))
register_onnx("embedding", export=_ex_embedding, writes=("Gather",))
register_onnx("take", export=_ex_take, writes=("Gather",),
              imports=(OnnxImport("Gather", _im_gather, ("axis",)),))
register_onnx("pad", export=_ex_pad, writes=("Pad",),
              imports=(OnnxImport("Pad", _im_pad, ("mode", "pads", "value")),))
