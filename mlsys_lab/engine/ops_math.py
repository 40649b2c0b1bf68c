"""Elementwise ops: arithmetic with numpy broadcasting, unary math, comparisons, where, cast.

Each op is defined once with :func:`~.registry.defop`: kernel, shape/dtype rule, and named VJP
and JVP rules beside it. VJP rules receive ``(g, xs, y, needs, **attrs)`` — ``needs[i]`` says
whether input i wants a gradient — and are written with framework ops, so they can be
differentiated again. JVP rules receive ``(ts, xs, y, **attrs)``, a tangent of None being zero.
``fusion`` is the expression the fused-kernel generator writes for the op.
"""

import numpy as np

from ..errors import DTypeError
from . import dtypes
from .dispatch import apply, tsum
from .registry import AVal, defop
from .shapes import broadcast_shapes, unbroadcast
from .tensor import zeros_like


# --- shape/dtype rules ------------------------------------------------------------------------
def _broadcast2(name, sa, sb):
    """numpy broadcasting of two shapes: equal shapes and a shape that is a trailing part of
    the other (a bias) answered at once, anything else by :func:`broadcast_shapes`."""
    sa, sb = tuple(sa), tuple(sb)
    if sa == sb:
        return sa
    la, lb = len(sa), len(sb)
    if lb < la and sa[la - lb:] == sb:
        return sa
    if la < lb and sb[lb - la:] == sa:
        return sb
    return broadcast_shapes(name, sa, sb)


def _binary(name, out_dtype=None):
    def infer(a, b):
        shape = _broadcast2(name, a.shape, b.shape)
        dt = dtypes.promote(a.dtype, b.dtype)
        return AVal(shape, out_dtype(dt) if out_dtype else dt)
    return infer


def _unary_float(name):
    def infer(x):
        if not dtypes.is_float(x.dtype):
            raise DTypeError(f"{name}: expects a floating tensor, got {x.dtype}; "
                             f"convert with ml.ops.cast(x, 'float32')")
        return AVal(x.shape, x.dtype)
    return infer


def _unary_any(x):
    return AVal(x.shape, x.dtype)


def _to_float(dt):
    return dt if dtypes.is_float(dt) else dtypes.float32


def _to_bool(dt):
    return dtypes.bool_


# --- binary arithmetic ------------------------------------------------------------------------
def _add_vjp(g, xs, y, needs):
    return (unbroadcast(g, xs[0].shape) if needs[0] else None,
            unbroadcast(g, xs[1].shape) if needs[1] else None)


def _add_jvp(ts, xs, y):
    return tsum(*ts)


ADD = defop("add", compute=np.add, infer=_binary("add"), vjp=_add_vjp, jvp=_add_jvp,
            elementwise=True, fusion="{0} + {1}")


def _sub_vjp(g, xs, y, needs):
    return (unbroadcast(g, xs[0].shape) if needs[0] else None,
            unbroadcast(-g, xs[1].shape) if needs[1] else None)


def _sub_jvp(ts, xs, y):
    return tsum(ts[0], None if ts[1] is None else neg(ts[1]))


SUB = defop("sub", compute=np.subtract, infer=_binary("sub"), vjp=_sub_vjp, jvp=_sub_jvp,
            elementwise=True, fusion="{0} - {1}")


def _mul_vjp(g, xs, y, needs):
    return (unbroadcast(g * xs[1], xs[0].shape) if needs[0] else None,
            unbroadcast(g * xs[0], xs[1].shape) if needs[1] else None)


def _mul_jvp(ts, xs, y):
    return tsum(None if ts[0] is None else ts[0] * xs[1],
                None if ts[1] is None else xs[0] * ts[1])


MUL = defop("mul", compute=np.multiply, infer=_binary("mul"), vjp=_mul_vjp, jvp=_mul_jvp,
            elementwise=True, fusion="{0} * {1}")


def _div_vjp(g, xs, y, needs):
    return (unbroadcast(g / xs[1], xs[0].shape) if needs[0] else None,
            unbroadcast(-g * y / xs[1], xs[1].shape) if needs[1] else None)


def _div_jvp(ts, xs, y):
    return tsum(None if ts[0] is None else ts[0] / xs[1],
                None if ts[1] is None else -ts[1] * y / xs[1])


DIV = defop("div", compute=np.true_divide, infer=_binary("div", _to_float), vjp=_div_vjp,
            jvp=_div_jvp, elementwise=True, fusion="{0} / {1}")


def _pow_dbase(a, b):
    """d a**b / d a = b * a**(b-1), and 0 where b == 0 (PyTorch and JAX; the formula would
    give 0 * 0**-1 = NaN at a == 0)."""
    nonzero = ne(b, 0)
    return where(nonzero, b * a ** where(nonzero, b - 1, 1), 0.0)


def _pow_dexp(a, y):
    """d a**b / d b = a**b * log(a), with log(0) read as 0 (so 0 where a == 0 and b > 0, as
    PyTorch and JAX give, instead of 0 * -inf = NaN)."""
    if not dtypes.is_float(a.dtype):
        a = cast(a, y.dtype)
    return y * log(where(eq(a, 0), 1.0, a))


def _pow_vjp(g, xs, y, needs):
    a, b = xs
    ga = unbroadcast(g * _pow_dbase(a, b), a.shape) if needs[0] else None
    gb = unbroadcast(g * _pow_dexp(a, y), b.shape) if needs[1] else None
    return ga, gb


def _pow_jvp(ts, xs, y):
    return tsum(None if ts[0] is None else ts[0] * _pow_dbase(*xs),
                None if ts[1] is None else ts[1] * _pow_dexp(xs[0], y))


#: The exponents numpy's float32/float64 ``power`` answers without calling C's ``pow`` when the
#: exponent is one scalar (``x ** 0.5``), as PyTorch does for a number: 0 -> 1, 0.5 ->
#: ``sqrt(a)``, 1 -> ``a``, 2 -> ``a * a``, -1 -> ``1 / a``.
POW_SCALAR_EXPONENTS = (0.0, 0.5, 1.0, 2.0, -1.0)


def power(a, b, out=None):
    """``a ** b`` for the ``pow`` op: numpy's ``power`` with its special values fixed by the
    exponent's size, not by numpy's memory layout.

    * ``b`` one element (a number, a 0-d or any one-element array), float32/float64 result:
      numpy's and PyTorch's ``x ** c`` for a scalar ``c``, with the shortcuts of
      :data:`POW_SCALAR_EXPONENTS` (0.5 is ``sqrt``: ``-inf ** 0.5`` is NaN, ``-0. ** 0.5`` is
      ``-0.``; -1 is ``1 / a``; 2 is ``a * a``), then C's ``pow`` for any other ``c``.
    * ``b`` an array: C's ``pow`` elementwise, as ``np.power`` on two arrays and PyTorch on two
      tensors give (``-inf ** 0.5`` is ``+inf``, ``-0. ** 0.5`` is ``+0.``).

    numpy picks between the two by strides: its loop takes the scalar shortcuts where the
    exponent has stride 0 along the inner loop (a ``(1,)`` exponent against ``(3,)``, a
    ``broadcast_to`` view), but not for two ``(1,)`` arrays, and numpy versions differ in where
    they take them. Here an exponent array that broadcasts or repeats is laid out at the
    result's shape first, and a one-element exponent is answered by the shortcuts above, so
    the eager op, the compiled kernels and the generated loop
    (``_pow`` / ``_pow_s`` in :mod:`.passes.fusion.elementwise`) agree for every layout.
    float16 and integer results: ``np.power`` as it is. ``out``: an array of the result's
    shape and dtype to write (a ``cpu`` kernel's ``out=``).
    """
    a, b = np.asarray(a), np.asarray(b)
    shape = np.broadcast_shapes(a.shape, b.shape)
    if b.size == 1:
        dt, c = np.result_type(a, b), float(b.reshape(())[()])
        if dt in (np.float32, np.float64) and c in POW_SCALAR_EXPONENTS:
            return _scalar_power(a.astype(dt, copy=False), c, shape, out)
    elif b.shape != shape or 0 in b.strides:  # numpy would take shortcuts where it repeats
        b = np.ascontiguousarray(np.broadcast_to(b, shape))
    return np.power(a, b, out=out)


def _scalar_power(a, c, shape, out):
    """``a ** c`` of the ``shape`` of the result for ``c`` in :data:`POW_SCALAR_EXPONENTS`, into
    ``out`` when given."""
    dt = a.dtype
    with np.errstate(divide="ignore", invalid="ignore"):
        if c == 0.5:
            v = np.sqrt(a)
        elif c == 2.0:
            v = np.multiply(a, a)
        elif c == -1.0:
            v = np.divide(dt.type(1), a)
        elif c == 1.0:
            v = a
        else:
            v = np.ones_like(a)
    if out is None:
        return np.array(np.broadcast_to(v, shape), dt)
    np.copyto(out, v, casting="unsafe")
    return out


POW = defop("pow", compute=power, infer=_binary("pow"), vjp=_pow_vjp, jvp=_pow_jvp,
            elementwise=True, fusion="_pow{s1}({0}, {1})")


def _tie_vjp(wins, g, xs, needs):
    """VJP of maximum (``wins`` = gt) or minimum (lt): the strict winner takes ``g``, a tie
    splits it 0.5 / 0.5 (PyTorch, JAX), and an unordered pair (a NaN) sends nothing."""
    a, b = xs
    tie = where(eq(a, b), g * 0.5, 0.0)
    return (unbroadcast(where(wins(a, b), g, tie), a.shape) if needs[0] else None,
            unbroadcast(where(wins(b, a), g, tie), b.shape) if needs[1] else None)


def _tie_jvp(wins, ts, xs):
    """JVP matching :func:`_tie_vjp`: the winner's tangent, the mean of both on a tie."""
    a, b = xs
    ta = ts[0] if ts[0] is not None else zeros_like(a)
    tb = ts[1] if ts[1] is not None else zeros_like(b)
    tie = where(eq(a, b), (ta + tb) * 0.5, 0.0)
    return where(wins(a, b), ta, where(wins(b, a), tb, tie))


def _maximum_vjp(g, xs, y, needs):
    return _tie_vjp(gt, g, xs, needs)


def _maximum_jvp(ts, xs, y):
    return _tie_jvp(gt, ts, xs)


def _minimum_vjp(g, xs, y, needs):
    return _tie_vjp(lt, g, xs, needs)


def _minimum_jvp(ts, xs, y):
    return _tie_jvp(lt, ts, xs)


MAXIMUM = defop("maximum", compute=np.maximum, infer=_binary("maximum"), vjp=_maximum_vjp,
                jvp=_maximum_jvp, elementwise=True, fusion="_maximum({0}, {1})")
MINIMUM = defop("minimum", compute=np.minimum, infer=_binary("minimum"), vjp=_minimum_vjp,
                jvp=_minimum_jvp, elementwise=True, fusion="_minimum({0}, {1})")

# --- comparisons (no gradient; a bool result, so nothing to fuse into a float loop) ----------
EQ = defop("eq", compute=np.equal, infer=_binary("eq", _to_bool), elementwise=True)
NE = defop("ne", compute=np.not_equal, infer=_binary("ne", _to_bool), elementwise=True)
LT = defop("lt", compute=np.less, infer=_binary("lt", _to_bool), elementwise=True)
LE = defop("le", compute=np.less_equal, infer=_binary("le", _to_bool), elementwise=True)
GT = defop("gt", compute=np.greater, infer=_binary("gt", _to_bool), elementwise=True)
GE = defop("ge", compute=np.greater_equal, infer=_binary("ge", _to_bool), elementwise=True)


# --- unary ------------------------------------------------------------------------------------
def _neg_vjp(g, xs, y, needs):
    return (-g,)


def _neg_jvp(ts, xs, y):
    return -ts[0]


NEG = defop("neg", compute=np.negative, infer=_unary_any, vjp=_neg_vjp, jvp=_neg_jvp,
            elementwise=True, fusion="-{0}")


def _exp_vjp(g, xs, y, needs):
    return (g * y,)


def _exp_jvp(ts, xs, y):
    return ts[0] * y


EXP = defop("exp", compute=np.exp, infer=_unary_float("exp"), vjp=_exp_vjp, jvp=_exp_jvp,
            elementwise=True, fusion="math.exp({0})")


def _log_vjp(g, xs, y, needs):
    return (g / xs[0],)


def _log_jvp(ts, xs, y):
    return ts[0] / xs[0]


LOG = defop("log", compute=np.log, infer=_unary_float("log"), vjp=_log_vjp, jvp=_log_jvp,
            elementwise=True, fusion="math.log({0})")


def _sqrt_vjp(g, xs, y, needs):
    return (g * 0.5 / y,)


def _sqrt_jvp(ts, xs, y):
    return ts[0] * 0.5 / y


SQRT = defop("sqrt", compute=np.sqrt, infer=_unary_float("sqrt"), vjp=_sqrt_vjp, jvp=_sqrt_jvp,
             elementwise=True, fusion="math.sqrt({0})")


def _tanh_vjp(g, xs, y, needs):
    return (g * (1.0 - y * y),)


def _tanh_jvp(ts, xs, y):
    return ts[0] * (1.0 - y * y)


TANH = defop("tanh", compute=np.tanh, infer=_unary_float("tanh"), vjp=_tanh_vjp, jvp=_tanh_jvp,
             elementwise=True, fusion="_tanh({0})")


def _sigmoid_np(x):
    """1 / (1 + e^-x) from z = e^-|x| <= 1, which never overflows: 1 / (1 + z) for x >= 0 and
    z / (1 + z) for x < 0, so the negative tail keeps its relative precision (sigmoid(-40) is
    4.2e-18 in float32, not 0) and NaN stays NaN."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, z) / (1.0 + z)


def _sigmoid_vjp(g, xs, y, needs):
    return (g * y * (1.0 - y),)


def _sigmoid_jvp(ts, xs, y):
    return ts[0] * y * (1.0 - y)


SIGMOID = defop("sigmoid", compute=_sigmoid_np, infer=_unary_float("sigmoid"), vjp=_sigmoid_vjp,
                jvp=_sigmoid_jvp, elementwise=True, fusion="_sigmoid({0})")


def _sin_vjp(g, xs, y, needs):
    return (g * cos(xs[0]),)


def _sin_jvp(ts, xs, y):
    return ts[0] * cos(xs[0])


SIN = defop("sin", compute=np.sin, infer=_unary_float("sin"), vjp=_sin_vjp, jvp=_sin_jvp,
            elementwise=True, fusion="math.sin({0})")


def _cos_vjp(g, xs, y, needs):
    return (-g * sin(xs[0]),)


def _cos_jvp(ts, xs, y):
    return -ts[0] * sin(xs[0])


COS = defop("cos", compute=np.cos, infer=_unary_float("cos"), vjp=_cos_vjp, jvp=_cos_jvp,
            elementwise=True, fusion="math.cos({0})")


def _relu_grad_np(g, x):
    """``g`` where ``x > 0``, else exactly 0 (PyTorch's threshold_backward): a NaN or inf in
    ``g`` at a dead unit gives 0, not ``inf * 0 = NaN``."""
    return np.where(x > 0, g, np.zeros((), g.dtype))


def _relu_grad_infer(g, x):
    return AVal(_broadcast2("relu_grad", g.shape, x.shape), g.dtype)


def _relu_grad_vjp(u, xs, y, needs):
    return (relu_grad(u, xs[1]) if needs[0] else None, None)


def _relu_grad_jvp(ts, xs, y):
    return None if ts[0] is None else relu_grad(ts[0], xs[1])


RELU_GRAD = defop("relu_grad", compute=_relu_grad_np, infer=_relu_grad_infer,
                  vjp=_relu_grad_vjp, jvp=_relu_grad_jvp, elementwise=True,
                  fusion="({0} if {1} > ZERO else ZERO)")


def _relu_np(x):
    return np.maximum(x, 0)


# relu's rules read its output (y > 0 exactly where x > 0), as PyTorch's threshold_backward
# does: the pre-activation need not stay alive, so matmul + bias + relu can fuse in training.
def _relu_vjp(g, xs, y, needs):
    return (relu_grad(g, y),)


def _relu_jvp(ts, xs, y):
    return relu_grad(ts[0], y)


RELU = defop("relu", compute=_relu_np, infer=_unary_any, vjp=_relu_vjp, jvp=_relu_jvp,
             elementwise=True, fusion="_relu({0})")


def _abs_vjp(g, xs, y, needs):
    return (g * sign(xs[0]),)


def _abs_jvp(ts, xs, y):
    return ts[0] * sign(xs[0])


ABS = defop("abs", compute=np.abs, infer=_unary_any, vjp=_abs_vjp, jvp=_abs_jvp,
            elementwise=True, fusion="abs({0})")


# sign is flat almost everywhere: its rules say "no gradient" (zero) rather than being absent,
# so a graph transform can tell it from an op that has no rule at all.
def _sign_vjp(g, xs, y, needs):
    return (None,)


def _sign_jvp(ts, xs, y):
    return None


SIGN = defop("sign", compute=np.sign, infer=_unary_any, vjp=_sign_vjp, jvp=_sign_jvp,
             elementwise=True, fusion="_sign({0})")


# --- where and cast ---------------------------------------------------------------------------
def _where_infer(c, a, b):
    if c.dtype != dtypes.bool_:
        raise DTypeError(f"where: the condition must be bool, got {c.dtype}")
    shape = broadcast_shapes("where", c.shape, a.shape, b.shape)
    return AVal(shape, dtypes.promote(a.dtype, b.dtype))


def _where_vjp(g, xs, y, needs):
    c, a, b = xs
    return (None,
            unbroadcast(where(c, g, 0.0), a.shape) if needs[1] else None,
            unbroadcast(where(c, 0.0, g), b.shape) if needs[2] else None)


def _where_jvp(ts, xs, y):
    c, a, b = xs
    if ts[1] is None and ts[2] is None:
        return None
    ta = ts[1] if ts[1] is not None else zeros_like(a)
    tb = ts[2] if ts[2] is not None else zeros_like(b)
    return where(c, ta, tb)


WHERE = defop("where", compute=np.where, infer=_where_infer, vjp=_where_vjp, jvp=_where_jvp,
              elementwise=True, fusion="({1} if {0} else {2})", storage=True)


def _cast_np(x, dtype):
    return x.astype(dtype)


def _cast_infer(x, dtype):
    return AVal(x.shape, dtypes.as_dtype(dtype, "cast"))


def _cast_vjp(g, xs, y, needs, dtype):
    return (cast(g, xs[0].dtype) if dtypes.is_float(xs[0].dtype) else None,)


def _cast_jvp(ts, xs, y, dtype):
    return cast(ts[0], dtype) if dtypes.is_float(dtype) else None


CAST = defop("cast", compute=_cast_np, infer=_cast_infer, vjp=_cast_vjp, jvp=_cast_jvp,
             elementwise=True,
             unfusable_reason="its dtype attribute: a fused program's steps carry no attributes, "
                              "and the generated loop computes in one dtype", storage=True)


# --- the public functions ---------------------------------------------------------------------
def add(a, b):
    """Elementwise ``a + b`` with numpy broadcasting."""
    return apply(ADD, a, b)


def sub(a, b):
    """Elementwise ``a - b``."""
    return apply(SUB, a, b)


def mul(a, b):
    """Elementwise ``a * b``."""
    return apply(MUL, a, b)


def div(a, b):
    """Elementwise true division ``a / b`` (integers divide to float32)."""
    return apply(DIV, a, b)


def pow(a, b):  # noqa: A001 - numpy's name
    """Elementwise ``a ** b``.

    Special values follow numpy and PyTorch: a one-element exponent ``c`` gives what ``x ** c``
    gives for a number ``c`` (0.5 is ``sqrt``: ``-inf ** 0.5`` is NaN, ``-0. ** 0.5`` is
    ``-0.``; -1 is ``1 / a``; 2 is ``a * a``); an exponent array gives C's ``pow`` elementwise
    (``-inf ** 0.5`` is ``+inf``), whatever the layout. A negative base to a non-integer power
    is NaN. See :func:`power`.

    Gradients follow PyTorch and JAX at ``a == 0``: d/da is 0 where ``b == 0`` and d/db is 0
    where ``b >= 0`` (``log(0)`` read as 0). One divergence from PyTorch: d/db at ``a == 0``,
    ``b < 0`` is NaN (as in JAX), where PyTorch gives -inf.
    """
    return apply(POW, a, b)


def maximum(a, b):
    """Elementwise maximum (NaN propagates, as in numpy).

    The gradient goes to the larger input; on a tie it is split 0.5 / 0.5 (PyTorch and JAX),
    so ``maximum(x, x)`` has the gradient of ``x``. Where the result is NaN neither input gets
    a gradient (JAX's rule; PyTorch passes it to both).
    """
    return apply(MAXIMUM, a, b)


def minimum(a, b):
    """Elementwise minimum; gradient as for :func:`maximum` (ties split 0.5 / 0.5, none where
    the result is NaN)."""
    return apply(MINIMUM, a, b)


def eq(a, b):
    """Elementwise ``a == b`` (bool)."""
    return apply(EQ, a, b)


def ne(a, b):
    """Elementwise ``a != b`` (bool)."""
    return apply(NE, a, b)


def lt(a, b):
    """Elementwise ``a < b`` (bool)."""
    return apply(LT, a, b)


def le(a, b):
    """Elementwise ``a <= b`` (bool)."""
    return apply(LE, a, b)


def gt(a, b):
    """Elementwise ``a > b`` (bool)."""
    return apply(GT, a, b)


def ge(a, b):
    """Elementwise ``a >= b`` (bool)."""
    return apply(GE, a, b)


def neg(x):
    """Elementwise ``-x``."""
    return apply(NEG, x)


def exp(x):
    """Elementwise e**x."""
    return apply(EXP, x)


def log(x):
    """Elementwise natural logarithm."""
    return apply(LOG, x)


def sqrt(x):
    """Elementwise square root (gradient inf at 0, as in PyTorch)."""
    return apply(SQRT, x)


def tanh(x):
    """Elementwise hyperbolic tangent."""
    return apply(TANH, x)


def sigmoid(x):
    """Logistic function 1 / (1 + e^-x), computed stably on both tails.

    With ``z = exp(-|x|)``: ``1 / (1 + z)`` for ``x >= 0``, ``z / (1 + z)`` for ``x < 0``. So
    ``log(sigmoid(-40.))`` is -40 in float32 and float64, as in PyTorch. Below about -87 in
    float32 (-708 in float64) the result is subnormal: ``log`` of it loses precision and its
    gradient ``1 / y`` overflows; below about -103 (-745) it is 0. PyTorch's float32 sigmoid
    is already 0 at -100.
    """
    return apply(SIGMOID, x)


def sin(x):
    """Elementwise sine."""
    return apply(SIN, x)


def cos(x):
    """Elementwise cosine."""
    return apply(COS, x)


def relu(x):
    """max(x, 0) elementwise. The gradient at 0 is 0 (PyTorch's convention); at NaN it is 0,
    where PyTorch passes the incoming gradient through."""
    return apply(RELU, x)


def relu_grad(g, x):
    """``g`` where ``x > 0``, else 0: the gradient rule of relu as one op."""
    return apply(RELU_GRAD, g, x)


def abs(x):  # noqa: A001
    """Elementwise absolute value. The gradient is ``sign(x)``: 0 at 0, as in PyTorch, and NaN
    at NaN (PyTorch gives 0 there)."""
    return apply(ABS, x)


def sign(x):
    """Elementwise sign: -1, 0 or 1 (no gradient). ``sign(NaN)`` is NaN, as in numpy
    (PyTorch returns 0)."""
    return apply(SIGN, x)


def where(cond, a, b):
    """Elementwise ``a if cond else b``."""
    return apply(WHERE, cond, a, b)


def cast(x, dtype):
    """Convert ``x`` to ``dtype`` (e.g. a uint8 image to float32)."""
    return apply(CAST, x, dtype=dtypes.as_dtype(dtype, "cast"))
