"""The ONNX mapping of each op, stored on its registry record (``Op.onnx``).

One :func:`register_onnx` call per op says how a node of it is written to ONNX (``export``)
and which ONNX op types read back into it (``imports``); nothing here is a table keyed by op
names, and the ONNX-type lookup is derived by scanning the registry
(:func:`~.onnx_import.importers`). This module needs no onnx package: exporters and importers
work through the contexts of :mod:`.onnx_export` and :mod:`.onnx_import`.

Exporter: ``export(ctx, node)`` writes ONNX nodes ending in ``ctx.name(node.output)``.
Importer: ``OnnxImport(op_type, convert, attrs)`` with ``convert(ctx, onnx_node, attrs) ->
[values]``; ``attrs`` lists the ONNX attributes it understands (any other is an error), and
it emits registry ops with ``ctx.emit``. A few importers fold their input's producer into one
node (``Not(Equal)`` is ``ne``), so that export then import gives the graph back.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..engine import dtypes
from ..engine.ops_nn import conv_attrs
from ..engine.ops_shape import canonical_index
from ..engine.registry import REGISTRY, get

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class OnnxImport:
    """How one ONNX op type becomes registry ops.

    Attributes:
        op_type: the ONNX op type (``"Conv"``).
        convert: ``convert(ctx, onnx_node, attrs) -> [value per ONNX output]``.
        attrs: the ONNX attribute names ``convert`` handles; any other is refused.
    """

    op_type: str
    convert: Callable
    attrs: tuple = ()


@dataclass(frozen=True)
class OnnxMapping:
    """An op's ONNX mapping (the ``Op.onnx`` field).

    Attributes:
        export: ``export(ctx, node)``, or None when the op has no ONNX form.
        writes: the ONNX op types ``export`` writes (for the docs' table).
        imports: the :class:`OnnxImport` records of the ONNX op types that read into this op.
        no_export_reason: why the op has no export, for the error message.
    """

    export: Callable | None = None
    writes: tuple = ()
    imports: tuple = ()
    no_export_reason: str | None = None


def register_onnx(op_name, *, export=None, writes=(), imports=(), no_export_reason=None):
    """Attach an ONNX mapping to the registered op ``op_name`` (replacing any earlier one).

    Returns:
        The :class:`OnnxMapping` now on ``get(op_name).onnx``.
    """
    mapping = OnnxMapping(export, tuple(writes), tuple(imports), no_export_reason)
    get(op_name).onnx = mapping
    return mapping


def exportable_ops():
    """Names of the registered ops that export to ONNX, sorted."""
    return sorted(n for n, op in REGISTRY.items() if op.onnx is not None and op.onnx.export)


def support_table():
    """``(op name, ONNX types written, ONNX types imported)`` for every op with a mapping."""
    rows = []
    for name in sorted(REGISTRY):
        m = REGISTRY[name].onnx
        if m is not None:
            rows.append((name, m.writes if m.export else (), tuple(i.op_type for i in m.imports)))
    return rows


# --- shared export helpers ---------------------------------------------------------------------
def _ins(ctx, node, dtype=None):
    """ONNX names of the node's inputs, cast to ``dtype`` where one differs."""
    names = [ctx.name(v) for v in node.inputs]
    if dtype is None:
        return names
    return [ctx.cast(n, v.dtype, dtype) for n, v in zip(names, node.inputs)]


def _common(node):
    out = node.inputs[0].dtype
    for v in node.inputs[1:]:
        out = dtypes.promote(out, v.dtype)
    return out


def _ex_binary(onnx_type, bool_type=None, compare=False):
    """Exporter of an elementwise binary op: inputs cast to one dtype, as ONNX requires."""
    def export(ctx, node):
        dt = _common(node) if compare else node.output.dtype
        kind = onnx_type
        if dt == dtypes.bool_:
            if bool_type is None:
                ctx.fail(f"ONNX {onnx_type} takes no bool tensors")
            kind = bool_type
        ctx.emit(kind, _ins(ctx, node, dt), ctx.name(node.output))
    return export


def _ex_unary(onnx_type, signed=False):
    def export(ctx, node):
        if signed and node.inputs[0].dtype.kind in "ub":
            ctx.fail(f"ONNX {onnx_type} takes no {node.inputs[0].dtype} tensors")
        ctx.emit(onnx_type, _ins(ctx, node), ctx.name(node.output))
    return export


# --- shared import helpers ---------------------------------------------------------------------
def _im_op(op_name):
    """Importer of an ONNX op that is exactly registry op ``op_name`` on the same inputs."""
    def convert(ctx, node, a):
        return [ctx.emit(op_name, *ctx.inputs(node))]
    return convert


def _scalar(value, like):
    """A 0-d array of ``value`` in the dtype of value ``like``."""
    return np.asarray(value, like.dtype)


def _fold(ctx, op_name, values):
    out = values[0]
    for v in values[1:]:
        out = ctx.emit(op_name, out, v)
    return out


def _variadic(op_name):
    def convert(ctx, node, a):
        return [_fold(ctx, op_name, ctx.inputs(node))]
    return convert


def _require_bool(ctx, node, values):
    for v in values:
        if v.dtype != dtypes.bool_:
            ctx.fail(node, f"expects bool inputs, got {v.dtype}")


def _axis(ctx, node, axis, rank):
    if not -max(rank, 1) <= axis < max(rank, 1):
        ctx.fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def _unsqueeze_shape(shape, axes):
    out = list(shape)
    for ax in sorted(axes):
        out.insert(ax, 1)
    return tuple(out)


# --- arithmetic ----------------------------------------------------------------------------------
def _im_div(ctx, node, a):
    x, y = ctx.inputs(node)
    if x.dtype.kind in "iub":  # ONNX divides integers truncating toward zero, as C does
        q = ctx.emit("div", ctx.emit("cast", x, dtype=dtypes.float64),
                     ctx.emit("cast", y, dtype=dtypes.float64))
        return [ctx.emit("cast", q, dtype=x.dtype)]
    return [ctx.emit("div", x, y)]


def _im_reciprocal(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("div", _scalar(1, x), x)]


def _ex_pow(ctx, node):
    base, exponent = node.inputs
    names = _ins(ctx, node)
    b = ctx.cast(names[0], base.dtype, node.output.dtype)
    e = names[1] if exponent.dtype.kind in "iuf" else ctx.cast(names[1], exponent.dtype,
                                                                 node.output.dtype)
    ctx.emit("Pow", [b, e], ctx.name(node.output))


def _im_pow(ctx, node, a):
    x, y = ctx.inputs(node)
    out = ctx.emit("pow", x, y)
    return [out if out.dtype == x.dtype else ctx.emit("cast", out, dtype=x.dtype)]


def _im_mean_of(ctx, node, a):
    xs = ctx.inputs(node)
    total = _fold(ctx, "add", xs)
    return [ctx.emit("div", total, _scalar(len(xs), total)) if len(xs) > 1 else total]


def _im_batch_norm(ctx, node, a):
    if not a.get("spatial", 1):
        ctx.fail(node, "spatial=0 (per-activation statistics) is not supported")
    x, scale, bias, mean, var = ctx.inputs(node)
    shape = (1, x.shape[1]) + (1,) * (len(x.shape) - 2)
    training = a.get("training_mode", 0) or a.get("is_test", 1) == 0
    stats = []
    if training:  # normalise with the batch's statistics, and update the running ones
        axes = (0,) + tuple(range(2, len(x.shape)))
        batch_mean = ctx.emit("mean", x, axis=axes, keepdims=False)
        dev = ctx.emit("sub", x, ctx.emit("reshape", batch_mean, shape=shape))
        batch_var = ctx.emit("mean", ctx.emit("mul", dev, dev), axis=axes, keepdims=False)
        m = _scalar(a.get("momentum", 0.9), x)
        keep = _scalar(1 - a.get("momentum", 0.9), x)
        stats = [ctx.emit("add", ctx.emit("mul", old, m), ctx.emit("mul", new, keep))
                 for old, new in ((mean, batch_mean), (var, batch_var))]
        mean, var = batch_mean, batch_var
    eps = _scalar(a.get("epsilon", 1e-5), x)
    p = ctx.prepare
    inv = p("div", p("reshape", scale, shape=shape),
            p("sqrt", p("add", p("reshape", var, shape=shape), eps)))
    centred = ctx.emit("sub", x, p("reshape", mean, shape=shape))
    return [ctx.emit("add", ctx.emit("mul", centred, inv),
                     p("reshape", bias, shape=shape))] + stats


def _im_and(ctx, node, a):
    xs = ctx.inputs(node)
    _require_bool(ctx, node, xs)
    return [ctx.emit("mul", *xs)]


def _im_or(ctx, node, a):
    xs = ctx.inputs(node)
    _require_bool(ctx, node, xs)
    return [ctx.emit("maximum", *xs)]


def _im_xor(ctx, node, a):
    xs = ctx.inputs(node)
    _require_bool(ctx, node, xs)
    return [ctx.emit("ne", *xs)]


def _im_clip(ctx, node, a):
    x = ctx.input(node, 0)
    if ctx.opset < 11:
        lo = _scalar(a.get("min", -np.inf), x) if "min" in a else None
        hi = _scalar(a.get("max", np.inf), x) if "max" in a else None
    else:
        lo, hi = ctx.input(node, 1), ctx.input(node, 2)
    y = x if lo is None else ctx.emit("maximum", x, lo)
    y = y if hi is None else ctx.emit("minimum", y, hi)
    return [y if y is not x else ctx.emit("identity", x)]


register_onnx("add", export=_ex_binary("Add", bool_type="Or"), writes=("Add",),
              imports=(OnnxImport("Add", _im_op("add")), OnnxImport("Sum", _variadic("add")),
                       OnnxImport("Mean", _im_mean_of)))
register_onnx("sub", export=_ex_binary("Sub"), writes=("Sub",),
              imports=(OnnxImport("Sub", _im_op("sub")),))
register_onnx("mul", export=_ex_binary("Mul", bool_type="And"), writes=("Mul",),
              imports=(OnnxImport("Mul", _im_op("mul")), OnnxImport("And", _im_and),
                       OnnxImport("BatchNormalization", _im_batch_norm,
                                  ("epsilon", "momentum", "spatial", "training_mode",
                                   "is_test"))))
register_onnx("div", export=_ex_binary("Div"), writes=("Div",),
              imports=(OnnxImport("Div", _im_div), OnnxImport("Reciprocal", _im_reciprocal)))
register_onnx("pow", export=_ex_pow, writes=("Pow",), imports=(OnnxImport("Pow", _im_pow),))
register_onnx("maximum", export=_ex_binary("Max", bool_type="Or"), writes=("Max",),
              imports=(OnnxImport("Max", _variadic("maximum")), OnnxImport("Or", _im_or)))
register_onnx("minimum", export=_ex_binary("Min", bool_type="And"), writes=("Min",),
              imports=(OnnxImport("Min", _variadic("minimum")),
                       OnnxImport("Clip", _im_clip, ("min", "max"))))


# --- comparisons -------------------------------------------------------------------------------
def _ex_ne(ctx, node):
    eq = ctx.emit("Equal", _ins(ctx, node, _common(node)))
    ctx.emit("Not", [eq], ctx.name(node.output))


def _im_not(ctx, node, a):
    x = ctx.input(node, 0)
    _require_bool(ctx, node, [x])
    src = ctx.producer(x)
    if src is not None and src.op == "eq" and ctx.single_use(x):
        ctx.absorb(src)
        return [ctx.emit("ne", *src.inputs)]  # Not(Equal(a, b)), as ne exports
    return [ctx.emit("ne", x, np.asarray(True))]


def _im_isnan(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("ne", x, x)]


def _im_isinf(ctx, node, a):
    x = ctx.input(node, 0)
    pos, neg = a.get("detect_positive", 1), a.get("detect_negative", 1)
    if pos and neg:
        return [ctx.emit("eq", ctx.emit("abs", x), _scalar(np.inf, x))]
    if pos or neg:
        return [ctx.emit("eq", x, _scalar(np.inf if pos else -np.inf, x))]
    return [ctx.constant(np.zeros(x.shape, bool))]


register_onnx("eq", export=_ex_binary("Equal", bool_type="Equal", compare=True),
              writes=("Equal",),
              imports=(OnnxImport("Equal", _im_op("eq")),
                       OnnxImport("IsInf", _im_isinf, ("detect_positive", "detect_negative"))))
register_onnx("ne", export=_ex_ne, writes=("Equal", "Not"),
              imports=(OnnxImport("Not", _im_not), OnnxImport("Xor", _im_xor),
                       OnnxImport("IsNaN", _im_isnan)))
for _name, _type in (("lt", "Less"), ("le", "LessOrEqual"), ("gt", "Greater"),
                     ("ge", "GreaterOrEqual")):
    register_onnx(_name, export=_ex_binary(_type, compare=True), writes=(_type,),
                  imports=(OnnxImport(_type, _im_op(_name)),))


# --- unary math and activations ------------------------------------------------------------------
def _im_elu(ctx, node, a):
    x = ctx.input(node, 0)
    neg = ctx.emit("mul", ctx.emit("sub", ctx.emit("exp", x), _scalar(1, x)),
                   _scalar(a.get("alpha", 1.0), x))
    return [ctx.emit("where", ctx.emit("lt", x, _scalar(0, x)), neg, x)]


def _im_selu(ctx, node, a):
    x = ctx.input(node, 0)
    alpha = _scalar(a.get("alpha", 1.67326319217681884765625), x)
    gamma = _scalar(a.get("gamma", 1.05070102214813232421875), x)
    neg = ctx.emit("sub", ctx.emit("mul", ctx.emit("exp", x), alpha), alpha)
    y = ctx.emit("where", ctx.emit("gt", x, _scalar(0, x)), x, neg)
    return [ctx.emit("mul", y, gamma)]


def _im_celu(ctx, node, a):
    x = ctx.input(node, 0)
    alpha = _scalar(a.get("alpha", 1.0), x)
    neg = ctx.emit("mul", ctx.emit("sub", ctx.emit("exp", ctx.emit("div", x, alpha)),
                                   _scalar(1, x)), alpha)
    return [ctx.emit("add", ctx.emit("relu", x), ctx.emit("minimum", neg, _scalar(0, x)))]


def _softplus(ctx, x):
    return ctx.emit("log", ctx.emit("add", ctx.emit("exp", x), _scalar(1, x)))


def _im_softplus(ctx, node, a):
    return [_softplus(ctx, ctx.input(node, 0))]


def _im_mish(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("mul", x, ctx.emit("tanh", _softplus(ctx, x)))]


def _hard_sigmoid(ctx, x, alpha, beta):
    y = ctx.emit("add", ctx.emit("mul", x, _scalar(alpha, x)), _scalar(beta, x))
    return ctx.emit("maximum", ctx.emit("minimum", y, _scalar(1, x)), _scalar(0, x))


def _im_hard_sigmoid(ctx, node, a):
    return [_hard_sigmoid(ctx, ctx.input(node, 0), a.get("alpha", 0.2), a.get("beta", 0.5))]


def _im_hard_swish(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("mul", x, _hard_sigmoid(ctx, x, 1 / 6, 0.5))]


def _im_swish(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("mul", x, ctx.emit("sigmoid",
                                        ctx.emit("mul", x, _scalar(a.get("alpha", 1.0), x))))]


def _im_softsign(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("div", x, ctx.emit("add", ctx.emit("abs", x), _scalar(1, x)))]


def _im_thresholded_relu(ctx, node, a):
    x = ctx.input(node, 0)
    keep = ctx.emit("gt", x, _scalar(a.get("alpha", 1.0), x))
    return [ctx.emit("where", keep, x, _scalar(0, x))]


def _im_leaky_relu(ctx, node, a):
    x = ctx.input(node, 0)
    neg = ctx.emit("mul", x, _scalar(a.get("alpha", 0.01), x))
    return [ctx.emit("where", ctx.emit("lt", x, _scalar(0, x)), neg, x)]


def _im_prelu(ctx, node, a):
    x, slope = ctx.inputs(node)
    return [ctx.emit("where", ctx.emit("lt", x, _scalar(0, x)), ctx.emit("mul", x, slope), x)]


register_onnx("neg", export=_ex_unary("Neg", signed=True), writes=("Neg",),
              imports=(OnnxImport("Neg", _im_op("neg")),))
register_onnx("exp", export=_ex_unary("Exp"), writes=("Exp",),
              imports=(OnnxImport("Exp", _im_op("exp")), OnnxImport("Elu", _im_elu, ("alpha",)),
                       OnnxImport("Selu", _im_selu, ("alpha", "gamma")),
                       OnnxImport("Celu", _im_celu, ("alpha",))))
register_onnx("log", export=_ex_unary("Log"), writes=("Log",),
              imports=(OnnxImport("Log", _im_op("log")), OnnxImport("Softplus", _im_softplus)))
register_onnx("sqrt", export=_ex_unary("Sqrt"), writes=("Sqrt",),
              imports=(OnnxImport("Sqrt", _im_op("sqrt")),))
register_onnx("tanh", export=_ex_unary("Tanh"), writes=("Tanh",),
              imports=(OnnxImport("Tanh", _im_op("tanh")), OnnxImport("Mish", _im_mish)))
register_onnx("sigmoid", export=_ex_unary("Sigmoid"), writes=("Sigmoid",),
              imports=(OnnxImport("Sigmoid", _im_op("sigmoid")),
                       OnnxImport("HardSigmoid", _im_hard_sigmoid, ("alpha", "beta")),
                       OnnxImport("HardSwish", _im_hard_swish),
                       OnnxImport("Swish", _im_swish, ("alpha",))))
register_onnx("sin", export=_ex_unary("Sin"), writes=("Sin",),
              imports=(OnnxImport("Sin", _im_op("sin")),))
register_onnx("cos", export=_ex_unary("Cos"), writes=("Cos",),
              imports=(OnnxImport("Cos", _im_op("cos")),))
register_onnx("relu", export=_ex_unary("Relu", signed=True), writes=("Relu",),
              imports=(OnnxImport("Relu", _im_op("relu")),
                       OnnxImport("ThresholdedRelu", _im_thresholded_relu, ("alpha",))))
register_onnx("abs", export=_ex_unary("Abs"), writes=("Abs",),
              imports=(OnnxImport("Abs", _im_op("abs")), OnnxImport("Softsign", _im_softsign)))
register_onnx("sign", export=_ex_unary("Sign"), writes=("Sign",),
              imports=(OnnxImport("Sign", _im_op("sign")),))


# --- where, cast, identity -----------------------------------------------------------------------
def _ex_where(ctx, node):
    c, x, y = _ins(ctx, node)
    dt = node.output.dtype
    ctx.emit("Where", [c, ctx.cast(x, node.inputs[1].dtype, dt),
                       ctx.cast(y, node.inputs[2].dtype, dt)], ctx.name(node.output))


def _ex_cast(ctx, node):
    ctx.emit("Cast", _ins(ctx, node), ctx.name(node.output),
             to=ctx.onnx_dtype(node.attrs["dtype"]))


def _im_cast(ctx, node, a):
    if "to" not in a:
        ctx.fail(node, "attribute 'to' is required")
    dt = ctx.numpy_dtype(a["to"], f"import_onnx: {node.label()}: 'to'")
    return [ctx.emit("cast", ctx.input(node, 0), dtype=dt)]


def _im_cast_like(ctx, node, a):
    x, like = ctx.inputs(node)
    return [ctx.emit("cast", x, dtype=like.dtype)]


def _im_dropout(ctx, node, a):
    x = ctx.input(node, 0)
    training = ctx.array(node, 2, "training_mode") if ctx.opset >= 12 else None
    random = (training is not None and bool(np.asarray(training))) or a.get("is_test", 1) == 0
    ratio = ctx.array(node, 1, "ratio") if random and ctx.opset >= 12 else None
    ratio = float(np.asarray(ratio if ratio is not None else a.get("ratio", 0.5)))
    if random and ratio > 0:
        ctx.fail(node, f"training-mode Dropout with ratio {ratio} draws a random mask, which "
                       f"mlsys_lab cannot reproduce; only inference (or ratio 0) imports")
    return [ctx.emit("identity", x), ctx.constant(np.ones(x.shape, bool))]


def _ex_identity(ctx, node):
    ctx.emit("Identity", _ins(ctx, node), ctx.name(node.output))


register_onnx("where", export=_ex_where, writes=("Where",),
              imports=(OnnxImport("Where", _im_op("where")),
                       OnnxImport("LeakyRelu", _im_leaky_relu, ("alpha",)),
                       OnnxImport("PRelu", _im_prelu)))
register_onnx("cast", export=_ex_cast, writes=("Cast",),
              imports=(OnnxImport("Cast", _im_cast, ("to", "saturate", "round_mode")),
                       OnnxImport("CastLike", _im_cast_like, ("saturate", "round_mode"))))


def _im_identity(ctx, node, a):
    x = ctx.input(node, 0)
    if ctx.is_graph_output(node.outputs[0]) and ctx.is_graph_output(node.inputs[0]):
        return [x]  # a graph output listed twice (as export writes it)
    return [ctx.emit("identity", x)]


register_onnx("identity", export=_ex_identity, writes=("Identity",),
              imports=(OnnxImport("Identity", _im_identity),
                       OnnxImport("Dropout", _im_dropout, ("ratio", "seed", "is_test"))))
register_onnx("copy", export=_ex_identity, writes=("Identity",))
_RANDOM = ("it draws a random mask or seed that ONNX cannot reproduce; export the model in "
           "eval mode (model.eval()), where dropout is the identity")
register_onnx("dropout", no_export_reason=_RANDOM)
register_onnx("rng_seed", no_export_reason=_RANDOM)


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
        sorted(_axis(ctx, node, ax, r) for ax in axes)
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
    norm = sorted(_axis(ctx, node, ax, r) for ax in axes)
    return [ctx.emit("reshape", x, shape=_unsqueeze_shape(x.shape, norm))]


def _ex_transpose(ctx, node):
    ctx.emit("Transpose", _ins(ctx, node), ctx.name(node.output), perm=list(node.attrs["axes"]))


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
    return tuple(sorted({_axis(ctx, node, ax, len(x.shape)) for ax in axes})), keep


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
    return ctx.constant(np.full(shape, fill, x.dtype))


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
        axis = _axis(ctx, node, a.get("axis", 0), len(x.shape))
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
            y = ctx.emit("reshape", y, shape=_unsqueeze_shape(y.shape, [axis]))
        return [y]
    return convert


_ARG_ATTRS = ("axis", "keepdims", "select_last_index")
register_onnx("argmax", export=_ex_argmax, writes=("ArgMax",),
              imports=(OnnxImport("ArgMax", _im_arg(False), _ARG_ATTRS),
                       OnnxImport("ArgMin", _im_arg(True), _ARG_ATTRS)))


# --- joining, indexing, padding ------------------------------------------------------------------
def _ex_concat(ctx, node):
    ctx.emit("Concat", _ins(ctx, node), ctx.name(node.output), axis=int(node.attrs["axis"]))


def _ex_stack(ctx, node):
    axis = int(node.attrs["axis"])
    parts = [ctx.emit("Unsqueeze", [n, ctx.ints([axis], "axes")]) for n in _ins(ctx, node)]
    ctx.emit("Concat", parts, ctx.name(node.output), axis=axis)


def _stacked(ctx, xs, axis):
    """The tensors that ``xs`` unsqueeze at ``axis`` (as stack exports), or None."""
    origs = []
    for x in xs:
        src = ctx.producer(x)
        if src is None or src.op != "reshape" or not ctx.single_use(x):
            return None
        orig = src.inputs[0]
        if tuple(x.shape) != _unsqueeze_shape(orig.shape, [axis]) or \
                orig.shape != xs[0].shape[:axis] + xs[0].shape[axis + 1:]:
            return None
        origs.append(orig)
    return origs


def _im_concat(ctx, node, a):
    xs = ctx.inputs(node)
    if "axis" not in a:
        ctx.fail(node, "attribute 'axis' is required")
    axis = int(a["axis"])
    origs = _stacked(ctx, xs, _axis(ctx, node, axis, len(xs[0].shape)))
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
        [_axis(ctx, node, int(v), r) for v in np.asarray(axes).reshape(-1)]
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
    axis = _axis(ctx, node, a.get("axis", 0), len(x.shape))
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
    x, idx = _ins(ctx, node)
    ctx.emit("Gather", [x, idx], ctx.name(node.output), axis=int(node.attrs["axis"]))


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
    axes = list(range(r)) if axes is None else [_axis(ctx, node, int(v), r) for v in axes]
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
register_onnx("take", export=_ex_take, writes=("Gather",),
              imports=(OnnxImport("Gather", _im_gather, ("axis",)),))
register_onnx("pad", export=_ex_pad, writes=("Pad",),
              imports=(OnnxImport("Pad", _im_pad, ("mode", "pads", "value")),))


# --- matmul and softmax --------------------------------------------------------------------------
def _ex_matmul(ctx, node):
    ctx.emit("MatMul", _ins(ctx, node), ctx.name(node.output))


def _im_matmul(ctx, node, a):
    x, y = ctx.inputs(node)
    if len(x.shape) >= 2 and len(y.shape) >= 2:
        return [ctx.emit("matmul", x, y)]
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
        y = ctx.emit("mul", y, _scalar(alpha, y))
    if c is not None and beta != 0.0:
        y = ctx.emit("add", y, c if beta == 1.0 else ctx.prepare("mul", c, _scalar(beta, c)))
    return [y]


def _ex_softmax(onnx_type):
    def export(ctx, node):
        ctx.emit(onnx_type, _ins(ctx, node), ctx.name(node.output),
                 axis=int(node.attrs["axis"]))
    return export


def _im_softmax(op_name):
    def convert(ctx, node, a):
        x = ctx.input(node, 0)
        if ctx.opset >= 13:
            return [ctx.emit(op_name, x, axis=int(a.get("axis", -1)))]
        axis = _axis(ctx, node, a.get("axis", 1), len(x.shape))  # opset < 13: 2-D coercion
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
    ctx.emit("Conv", _ins(ctx, node), ctx.name(node.output), kernel_shape=list(w.shape[2:]),
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
    ctx.emit("ConvTranspose", _ins(ctx, node), ctx.name(node.output),
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
    if tuple(kernel) != tuple(w.shape[2:]) or len(x.shape) not in (3, 4):
        ctx.fail(node, f"only 1-D and 2-D transposed convolutions with kernel_shape equal to "
                       f"the weight's {w.shape[2:]} import")
    strides, dilations, begins, outs = _transpose_geometry(ctx, node, a, x, kernel)
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
        ctx.emit(onnx_type, _ins(ctx, node), ctx.name(node.output),
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


def _im_maxpool(ctx, node, a):
    x = ctx.input(node, 0)
    if len(node.outputs) > 1 and node.outputs[1] and ctx.uses_name(node.outputs[1]):
        ctx.fail(node, "the Indices output is not supported")
    kernel, strides, dilations, begins, ends, direct = _pool_plan(ctx, node, a, x)
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
    mask = np.zeros((1, 1) + tuple(xp.shape[2:]), x.dtype)
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
                                      _scalar(a.get("alpha", 1e-4), x)),
                      _scalar(a.get("bias", 1.0), x))
    return [ctx.emit("div", x, ctx.emit("pow", scaled, _scalar(a.get("beta", 0.75), x)))]


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
        idx = p("where", p("lt", idx, _scalar(0, idx)), p("add", idx, _scalar(depth, idx)), idx)
    y = ctx.emit("one_hot", idx, num_classes=depth, dtype=np.dtype(values.dtype))
    if (off, on) != (0, 1):
        y = ctx.emit("add", ctx.emit("mul", y, _scalar(on - off, y)), _scalar(off, y))
    axis = _axis(ctx, node, a.get("axis", -1), len(y.shape))
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
    d = ctx.emit("Sub", _ins(ctx, node))
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
        keep = ctx.emit("ne", labels, _scalar(ignore, labels))
        labels = ctx.emit("where", keep, labels, _scalar(0, labels))
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
        return ctx.emit("div", total, _scalar(int(np.prod(loss.shape)), total))
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
