"""The ONNX mappings of the elementwise ops: arithmetic, comparisons, unary math and
activations, where / cast / identity (one :func:`~.mapping.register_onnx` call per op;
loaded by
:mod:`mlsys_lab.deploy.onnx`)."""

import numpy as np

from ...engine import dtypes
from .mapping import (
    OnnxImport,
    common_dtype,
    export_binary,
    export_unary,
    fold_binary,
    import_as,
    import_variadic,
    input_names,
    register_onnx,
    require_bool,
    scalar_like,
)


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
    return [ctx.emit("div", scalar_like(1, x), x)]


def _ex_pow(ctx, node):
    base, exponent = node.inputs
    names = input_names(ctx, node)
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
    total = fold_binary(ctx, "add", xs)
    return [ctx.emit("div", total, scalar_like(len(xs), total)) if len(xs) > 1 else total]


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
        m = scalar_like(a.get("momentum", 0.9), x)
        keep = scalar_like(1 - a.get("momentum", 0.9), x)
        stats = [ctx.emit("add", ctx.emit("mul", old, m), ctx.emit("mul", new, keep))
                 for old, new in ((mean, batch_mean), (var, batch_var))]
        mean, var = batch_mean, batch_var
    eps = scalar_like(a.get("epsilon", 1e-5), x)
    p = ctx.prepare
    inv = p("div", p("reshape", scale, shape=shape),
            p("sqrt", p("add", p("reshape", var, shape=shape), eps)))
    centred = ctx.emit("sub", x, p("reshape", mean, shape=shape))
    return [ctx.emit("add", ctx.emit("mul", centred, inv),
                     p("reshape", bias, shape=shape))] + stats


def _im_and(ctx, node, a):
    xs = ctx.inputs(node)
    require_bool(ctx, node, xs)
    return [ctx.emit("mul", *xs)]


def _im_or(ctx, node, a):
    xs = ctx.inputs(node)
    require_bool(ctx, node, xs)
    return [ctx.emit("maximum", *xs)]


def _im_xor(ctx, node, a):
    xs = ctx.inputs(node)
    require_bool(ctx, node, xs)
    return [ctx.emit("ne", *xs)]


def _im_clip(ctx, node, a):
    x = ctx.input(node, 0)
    if ctx.opset < 11:
        lo = scalar_like(a.get("min", -np.inf), x) if "min" in a else None
        hi = scalar_like(a.get("max", np.inf), x) if "max" in a else None
    else:
        lo, hi = ctx.input(node, 1), ctx.input(node, 2)
    y = x if lo is None else ctx.emit("maximum", x, lo)
    y = y if hi is None else ctx.emit("minimum", y, hi)
    return [y if y is not x else ctx.emit("identity", x)]


register_onnx("add", export=export_binary("Add", bool_type="Or"), writes=("Add",),
              imports=(OnnxImport("Add", import_as("add")),
                       OnnxImport("Sum", import_variadic("add")),
                       OnnxImport("Mean", _im_mean_of)))
register_onnx("sub", export=export_binary("Sub"), writes=("Sub",),
              imports=(OnnxImport("Sub", import_as("sub")),))
register_onnx("mul", export=export_binary("Mul", bool_type="And"), writes=("Mul",),
              imports=(OnnxImport("Mul", import_as("mul")), OnnxImport("And", _im_and),
                       OnnxImport("BatchNormalization", _im_batch_norm,
                                  ("epsilon", "momentum", "spatial", "training_mode",
                                   "is_test"))))
register_onnx("div", export=export_binary("Div"), writes=("Div",),
              imports=(OnnxImport("Div", _im_div), OnnxImport("Reciprocal", _im_reciprocal)))
register_onnx("pow", export=_ex_pow, writes=("Pow",), imports=(OnnxImport("Pow", _im_pow),))
register_onnx("maximum", export=export_binary("Max", bool_type="Or"), writes=("Max",),
              imports=(OnnxImport("Max", import_variadic("maximum")), OnnxImport("Or", _im_or)))
register_onnx("minimum", export=export_binary("Min", bool_type="And"), writes=("Min",),
              imports=(OnnxImport("Min", import_variadic("minimum")),
                       OnnxImport("Clip", _im_clip, ("min", "max"))))


# --- comparisons -------------------------------------------------------------------------------
def _ex_ne(ctx, node):
    eq = ctx.emit("Equal", input_names(ctx, node, common_dtype(node)))
    ctx.emit("Not", [eq], ctx.name(node.output))


def _im_not(ctx, node, a):
    x = ctx.input(node, 0)
    require_bool(ctx, node, [x])
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
        return [ctx.emit("eq", ctx.emit("abs", x), scalar_like(np.inf, x))]
    if pos or neg:
        return [ctx.emit("eq", x, scalar_like(np.inf if pos else -np.inf, x))]
    return [ctx.constant(ctx.full(x.shape, False, bool))]


register_onnx("eq", export=export_binary("Equal", bool_type="Equal", compare=True),
              writes=("Equal",),
              imports=(OnnxImport("Equal", import_as("eq")),
                       OnnxImport("IsInf", _im_isinf, ("detect_positive", "detect_negative"))))
register_onnx("ne", export=_ex_ne, writes=("Equal", "Not"),
              imports=(OnnxImport("Not", _im_not), OnnxImport("Xor", _im_xor),
                       OnnxImport("IsNaN", _im_isnan)))
for _name, _type in (("lt", "Less"), ("le", "LessOrEqual"), ("gt", "Greater"),
                     ("ge", "GreaterOrEqual")):
    register_onnx(_name, export=export_binary(_type, compare=True), writes=(_type,),
                  imports=(OnnxImport(_type, import_as(_name)),))


# --- unary math and activations ------------------------------------------------------------------
def _im_elu(ctx, node, a):
    x = ctx.input(node, 0)
    neg = ctx.emit("mul", ctx.emit("sub", ctx.emit("exp", x), scalar_like(1, x)),
                   scalar_like(a.get("alpha", 1.0), x))
    return [ctx.emit("where", ctx.emit("lt", x, scalar_like(0, x)), neg, x)]


def _im_selu(ctx, node, a):
    x = ctx.input(node, 0)
    alpha = scalar_like(a.get("alpha", 1.67326319217681884765625), x)
    gamma = scalar_like(a.get("gamma", 1.05070102214813232421875), x)
    neg = ctx.emit("sub", ctx.emit("mul", ctx.emit("exp", x), alpha), alpha)
    y = ctx.emit("where", ctx.emit("gt", x, scalar_like(0, x)), x, neg)
    return [ctx.emit("mul", y, gamma)]


def _im_celu(ctx, node, a):
    x = ctx.input(node, 0)
    alpha = scalar_like(a.get("alpha", 1.0), x)
    neg = ctx.emit("mul", ctx.emit("sub", ctx.emit("exp", ctx.emit("div", x, alpha)),
                                   scalar_like(1, x)), alpha)
    return [ctx.emit("add", ctx.emit("relu", x), ctx.emit("minimum", neg, scalar_like(0, x)))]


def _softplus(ctx, x):
    return ctx.emit("log", ctx.emit("add", ctx.emit("exp", x), scalar_like(1, x)))


def _im_softplus(ctx, node, a):
    return [_softplus(ctx, ctx.input(node, 0))]


def _im_mish(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("mul", x, ctx.emit("tanh", _softplus(ctx, x)))]


def _hard_sigmoid(ctx, x, alpha, beta):
    y = ctx.emit("add", ctx.emit("mul", x, scalar_like(alpha, x)), scalar_like(beta, x))
    return ctx.emit("maximum", ctx.emit("minimum", y, scalar_like(1, x)), scalar_like(0, x))


def _im_hard_sigmoid(ctx, node, a):
    return [_hard_sigmoid(ctx, ctx.input(node, 0), a.get("alpha", 0.2), a.get("beta", 0.5))]


def _im_hard_swish(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("mul", x, _hard_sigmoid(ctx, x, 1 / 6, 0.5))]


def _im_swish(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("mul", x, ctx.emit("sigmoid",
                                        ctx.emit("mul", x, scalar_like(a.get("alpha", 1.0), x))))]


def _im_softsign(ctx, node, a):
    x = ctx.input(node, 0)
    return [ctx.emit("div", x, ctx.emit("add", ctx.emit("abs", x), scalar_like(1, x)))]


def _im_thresholded_relu(ctx, node, a):
    x = ctx.input(node, 0)
    keep = ctx.emit("gt", x, scalar_like(a.get("alpha", 1.0), x))
    return [ctx.emit("where", keep, x, scalar_like(0, x))]


def _im_leaky_relu(ctx, node, a):
    x = ctx.input(node, 0)
    neg = ctx.emit("mul", x, scalar_like(a.get("alpha", 0.01), x))
    return [ctx.emit("where", ctx.emit("lt", x, scalar_like(0, x)), neg, x)]


def _im_prelu(ctx, node, a):
    x, slope = ctx.inputs(node)
    return [ctx.emit("where", ctx.emit("lt", x, scalar_like(0, x)), ctx.emit("mul", x, slope), x)]


register_onnx("neg", export=export_unary("Neg", signed=True), writes=("Neg",),
              imports=(OnnxImport("Neg", import_as("neg")),))
register_onnx("exp", export=export_unary("Exp"), writes=("Exp",),
              imports=(OnnxImport("Exp", import_as("exp")), OnnxImport("Elu", _im_elu, ("alpha",)),
                       OnnxImport("Selu", _im_selu, ("alpha", "gamma")),
                       OnnxImport("Celu", _im_celu, ("alpha",))))
register_onnx("log", export=export_unary("Log"), writes=("Log",),
              imports=(OnnxImport("Log", import_as("log")), OnnxImport("Softplus", _im_softplus)))
register_onnx("sqrt", export=export_unary("Sqrt"), writes=("Sqrt",),
              imports=(OnnxImport("Sqrt", import_as("sqrt")),))
register_onnx("tanh", export=export_unary("Tanh"), writes=("Tanh",),
              imports=(OnnxImport("Tanh", import_as("tanh")), OnnxImport("Mish", _im_mish)))
register_onnx("sigmoid", export=export_unary("Sigmoid"), writes=("Sigmoid",),
              imports=(OnnxImport("Sigmoid", import_as("sigmoid")),
                       OnnxImport("HardSigmoid", _im_hard_sigmoid, ("alpha", "beta")),
                       OnnxImport("HardSwish", _im_hard_swish),
                       OnnxImport("Swish", _im_swish, ("alpha",))))
register_onnx("sin", export=export_unary("Sin"), writes=("Sin",),
              imports=(OnnxImport("Sin", import_as("sin")),))
register_onnx("cos", export=export_unary("Cos"), writes=("Cos",),
              imports=(OnnxImport("Cos", import_as("cos")),))
register_onnx("relu", export=export_unary("Relu", signed=True), writes=("Relu",),
              imports=(OnnxImport("Relu", import_as("relu")),
                       OnnxImport("ThresholdedRelu", _im_thresholded_relu, ("alpha",))))
register_onnx("abs", export=export_unary("Abs"), writes=("Abs",),
              imports=(OnnxImport("Abs", import_as("abs")), OnnxImport("Softsign", _im_softsign)))
register_onnx("sign", export=export_unary("Sign"), writes=("Sign",),
              imports=(OnnxImport("Sign", import_as("sign")),))


# --- where, cast, identity -----------------------------------------------------------------------
def _ex_where(ctx, node):
    c, x, y = input_names(ctx, node)
    dt = node.output.dtype
    ctx.emit("Where", [c, ctx.cast(x, node.inputs[1].dtype, dt),
                       ctx.cast(y, node.inputs[2].dtype, dt)], ctx.name(node.output))


def _ex_cast(ctx, node):
    ctx.emit("Cast", input_names(ctx, node), ctx.name(node.output),
             to=ctx.onnx_dtype(node.attrs["dtype"]))


#: float8 formats whose ONNX Cast saturates by default (``saturate=1``): out-of-range values
#: and infinities become the largest finite value of the sign.
_SATURATING = (dtypes.float8_e4m3fn, dtypes.float8_e4m3fnuz, dtypes.float8_e5m2,
               dtypes.float8_e5m2fnuz)


def onnx_cast(ctx, node, x, dt, a):
    """``x`` cast to ``dt`` with ONNX Cast semantics: numpy / ml_dtypes ``astype`` (round to
    nearest even; NaN stays NaN; sub-byte integers wrap), except that a float8 target with
    ``saturate=1`` (the default) first clamps to the format's finite range, as
    ``onnx.reference``'s ``saturate_cast`` does. A cast to float8_e8m0fnu (a power of two)
    follows ``round_mode`` ('up' or 'down'; see :func:`_e8m0_power`)."""
    saturate = int(a.get("saturate", 1))
    if dt == dtypes.float8_e8m0fnu and x.dtype != dt:
        return ctx.emit("cast", _e8m0_power(ctx, node, x, a, saturate), dtype=dt)
    if dt in _SATURATING and saturate and x.dtype != dt:
        if not (dtypes.is_float(x.dtype) or x.dtype == dtypes.bfloat16):
            x = ctx.emit("cast", x, dtype=dtypes.float32)
        import ml_dtypes

        m = float(ml_dtypes.finfo(dt).max)
        x = ctx.emit("maximum", ctx.emit("minimum", x, np.asarray(m, x.dtype)),
                     np.asarray(-m, x.dtype))
    return ctx.emit("cast", x, dtype=dt)


def _e8m0_power(ctx, node, x, a, saturate):
    """The power of two ONNX's Cast to float8_e8m0fnu gives for ``x``, as float64 (exact),
    NaN where the result is NaN; ONNX's reference reads the exponent bits of ``x`` as
    float32: the sign is dropped, 'up' rounds a value that is no power of two to the next one
    and 'down' keeps its exponent, a float32 subnormal has exponent field 0 (2**-127, or
    2**-126 rounded up), NaN and inf become NaN, and above 2**127 ``saturate`` keeps 2**127
    (else NaN). ``floor(log2 |x|)`` comes from ``log`` within one and is then made exact by
    comparing with powers of two (which float64 holds exactly)."""
    mode = a.get("round_mode", "up")
    if mode not in ("up", "down"):
        ctx.fail(node, f"round_mode {mode!r} to float8_e8m0fnu is not supported ('up', "
                       f"'down')")
    e, f64 = ctx.emit, dtypes.float64

    def c(v):
        return np.asarray(v, f64)

    f32 = x if x.dtype == dtypes.float32 else e("cast", x, dtype=dtypes.float32)
    mag = e("abs", e("cast", f32, dtype=f64))
    finite = e("lt", mag, c(np.inf))
    normal = e("where", finite, e("maximum", mag, c(2.0 ** -126)), c(1.0))
    log2 = e("div", e("log", normal), c(np.log(2.0)))
    k = e("sub", e("cast", e("cast", e("add", log2, c(200.0)), dtype=dtypes.int64), dtype=f64),
          c(200.0))  # floor of a positive number: the cast truncates
    k = e("where", e("gt", e("pow", c(2.0), k), normal), e("sub", k, c(1.0)), k)
    k = e("where", e("le", e("pow", c(2.0), e("add", k, c(1.0))), normal), e("add", k, c(1.0)),
          k)  # now 2**k <= |x| < 2**(k + 1)
    if mode == "up":
        k = e("where", e("gt", normal, e("pow", c(2.0), k)), e("add", k, c(1.0)), k)
    low = e("where", e("gt", mag, c(0.0)), c(-126.0), c(-127.0)) if mode == "up" else c(-127.0)
    k = e("where", e("lt", mag, c(2.0 ** -126)), low, k)
    k = e("minimum", k, c(127.0)) if saturate else k
    power = e("where", e("gt", k, c(127.0)), c(np.nan), e("pow", c(2.0), k))
    return e("where", finite, power, c(np.nan))


def _im_cast(ctx, node, a):
    if "to" not in a:
        ctx.fail(node, "attribute 'to' is required")
    dt = ctx.numpy_dtype(a["to"], f"import_onnx: {node.label()}: 'to'")
    return [onnx_cast(ctx, node, ctx.input(node, 0), dt, a)]


def _im_cast_like(ctx, node, a):
    x, like = ctx.inputs(node)
    return [onnx_cast(ctx, node, x, like.dtype, a)]


def _im_dropout(ctx, node, a):
    x = ctx.input(node, 0)
    training = ctx.array(node, 2, "training_mode") if ctx.opset >= 12 else None
    random = (training is not None and bool(np.asarray(training))) or a.get("is_test", 1) == 0
    ratio = ctx.array(node, 1, "ratio") if random and ctx.opset >= 12 else None
    ratio = float(np.asarray(ratio if ratio is not None else a.get("ratio", 0.5)))
    if random and ratio > 0:
        ctx.fail(node, f"training-mode Dropout with ratio {ratio} draws a random mask, which "
                       f"mlsys_lab cannot reproduce; only inference (or ratio 0) imports")
    return [ctx.emit("identity", x), ctx.constant(ctx.full(x.shape, True, bool))]


def _ex_identity(ctx, node):
    ctx.emit("Identity", input_names(ctx, node), ctx.name(node.output))


register_onnx("where", export=_ex_where, writes=("Where",),
              imports=(OnnxImport("Where", import_as("where")),
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
