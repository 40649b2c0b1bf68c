"""Elementwise ops: arithmetic with numpy broadcasting, unary math, comparisons, where, cast.

Each op is defined once (kernel, shape/dtype rule, VJP, JVP). VJP rules receive
``(g, inputs, out, needs, **attrs)`` — ``needs[i]`` says whether input i wants a gradient — and
are written with framework ops, so they can be differentiated again.
"""

import numpy as np

from ..errors import DTypeError, ShapeError
from . import dtypes
from .registry import AVal, Op, register
from .tensor import apply, zeros_like


def broadcast_shapes(op, *shapes):
    """numpy's broadcasting rule, raising a ShapeError that names ``op`` and the shapes."""
    ndim = max(len(s) for s in shapes)
    out = []
    for i in range(-ndim, 0):
        dim = 1
        for s in shapes:
            d = s[i] if -i <= len(s) else 1
            if d != 1:
                if dim != 1 and d != dim:
                    shown = " and ".join(str(tuple(s)) for s in shapes)
                    raise ShapeError(f"{op}: cannot broadcast shapes {shown}")
                dim = d
        out.append(dim)
    return tuple(out)


def unbroadcast(g, shape):
    """Sum ``g`` back to ``shape`` (the gradient rule of numpy broadcasting)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = len(g.shape) - len(shape)
    axes = tuple(range(lead)) + tuple(
        lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1)
    s = sum(g, axes) if axes else g
    return reshape(s, shape) if s.shape != shape else s


def tsum(*terms):
    """Sum of the tangent terms that are not None (None means a zero tangent)."""
    terms = [t for t in terms if t is not None]
    if not terms:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


def _defop(name, compute, infer, vjp=None, jvp=None, elementwise=False):
    return register(Op(name, compute, infer, vjp, jvp, elementwise))


# --- shape/dtype rules ------------------------------------------------------------------------
def _binary(name, out_dtype=None):
    def infer(a, b):
        shape = broadcast_shapes(name, a.shape, b.shape)
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


# --- binary arithmetic ------------------------------------------------------------------------
def _m(t, f):
    return None if t is None else f(t)


ADD = _defop("add", np.add, _binary("add"),
             lambda g, xs, y, n: (unbroadcast(g, xs[0].shape) if n[0] else None,
                                  unbroadcast(g, xs[1].shape) if n[1] else None),
             lambda ts, xs, y: tsum(*ts), elementwise=True)
SUB = _defop("sub", np.subtract, _binary("sub"),
             lambda g, xs, y, n: (unbroadcast(g, xs[0].shape) if n[0] else None,
                                  unbroadcast(-g, xs[1].shape) if n[1] else None),
             lambda ts, xs, y: tsum(ts[0], _m(ts[1], neg)), elementwise=True)
MUL = _defop("mul", np.multiply, _binary("mul"),
             lambda g, xs, y, n: (unbroadcast(g * xs[1], xs[0].shape) if n[0] else None,
                                  unbroadcast(g * xs[0], xs[1].shape) if n[1] else None),
             lambda ts, xs, y: tsum(_m(ts[0], lambda t: t * xs[1]),
                                    _m(ts[1], lambda t: xs[0] * t)), elementwise=True)
DIV = _defop("div", np.true_divide, _binary("div", _to_float),
             lambda g, xs, y, n: (unbroadcast(g / xs[1], xs[0].shape) if n[0] else None,
                                  unbroadcast(-g * y / xs[1], xs[1].shape) if n[1] else None),
             lambda ts, xs, y: tsum(_m(ts[0], lambda t: t / xs[1]),
                                    _m(ts[1], lambda t: -t * y / xs[1])), elementwise=True)


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


def _pow_vjp(g, xs, y, n):
    a, b = xs
    ga = unbroadcast(g * _pow_dbase(a, b), a.shape) if n[0] else None
    gb = unbroadcast(g * _pow_dexp(a, y), b.shape) if n[1] else None
    return ga, gb


POW = _defop("pow", np.power, _binary("pow"), _pow_vjp,
             lambda ts, xs, y: tsum(_m(ts[0], lambda t: t * _pow_dbase(*xs)),
                                    _m(ts[1], lambda t: t * _pow_dexp(xs[0], y))),
             elementwise=True)


def _tie_vjp(wins):
    """VJP of maximum (``wins`` = gt) or minimum (lt): the strict winner takes ``g``, a tie
    splits it 0.5 / 0.5 (PyTorch, JAX), and an unordered pair (a NaN) sends nothing."""
    def vjp(g, xs, y, n):
        a, b = xs
        tie = where(eq(a, b), g * 0.5, 0.0)
        return (unbroadcast(where(wins(a, b), g, tie), a.shape) if n[0] else None,
                unbroadcast(where(wins(b, a), g, tie), b.shape) if n[1] else None)
    return vjp


def _tie_jvp(wins):
    """JVP matching :func:`_tie_vjp`: the winner's tangent, the mean of both on a tie."""
    def jvp(ts, xs, y):
        a, b = xs
        ta = ts[0] if ts[0] is not None else zeros_like(a)
        tb = ts[1] if ts[1] is not None else zeros_like(b)
        tie = where(eq(a, b), (ta + tb) * 0.5, 0.0)
        return where(wins(a, b), ta, where(wins(b, a), tb, tie))
    return jvp


MAXIMUM = _defop("maximum", np.maximum, _binary("maximum"), _tie_vjp(lambda a, b: gt(a, b)),
                 _tie_jvp(lambda a, b: gt(a, b)), elementwise=True)
MINIMUM = _defop("minimum", np.minimum, _binary("minimum"), _tie_vjp(lambda a, b: lt(a, b)),
                 _tie_jvp(lambda a, b: lt(a, b)), elementwise=True)

# --- comparisons (no gradient) ----------------------------------------------------------------
_CMP = {}
for _name, _fn in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less),
                   ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal)):
    _CMP[_name] = _defop(_name, _fn, _binary(_name, lambda dt: dtypes.bool_), elementwise=True)


# --- unary ------------------------------------------------------------------------------------
def _sigmoid_np(x):
    """1 / (1 + e^-x) from z = e^-|x| <= 1, which never overflows: 1 / (1 + z) for x >= 0 and
    z / (1 + z) for x < 0, so the negative tail keeps its relative precision (sigmoid(-40) is
    4.2e-18 in float32, not 0) and NaN stays NaN."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, z) / (1.0 + z)


def _relu_np(x):
    return np.maximum(x, 0)


NEG = _defop("neg", np.negative, _unary_any, lambda g, xs, y, n: (-g,),
             lambda ts, xs, y: -ts[0], elementwise=True)
EXP = _defop("exp", np.exp, _unary_float("exp"), lambda g, xs, y, n: (g * y,),
             lambda ts, xs, y: ts[0] * y, elementwise=True)
LOG = _defop("log", np.log, _unary_float("log"), lambda g, xs, y, n: (g / xs[0],),
             lambda ts, xs, y: ts[0] / xs[0], elementwise=True)
SQRT = _defop("sqrt", np.sqrt, _unary_float("sqrt"), lambda g, xs, y, n: (g * 0.5 / y,),
              lambda ts, xs, y: ts[0] * 0.5 / y, elementwise=True)
TANH = _defop("tanh", np.tanh, _unary_float("tanh"), lambda g, xs, y, n: (g * (1.0 - y * y),),
              lambda ts, xs, y: ts[0] * (1.0 - y * y), elementwise=True)
SIGMOID = _defop("sigmoid", _sigmoid_np, _unary_float("sigmoid"),
                 lambda g, xs, y, n: (g * y * (1.0 - y),),
                 lambda ts, xs, y: ts[0] * y * (1.0 - y), elementwise=True)
SIN = _defop("sin", np.sin, _unary_float("sin"), lambda g, xs, y, n: (g * cos(xs[0]),),
             lambda ts, xs, y: ts[0] * cos(xs[0]), elementwise=True)
COS = _defop("cos", np.cos, _unary_float("cos"), lambda g, xs, y, n: (-g * sin(xs[0]),),
             lambda ts, xs, y: -ts[0] * sin(xs[0]), elementwise=True)
def _relu_grad_np(g, x):
    """``g`` where ``x > 0``, else exactly 0 (PyTorch's threshold_backward): a NaN or inf in
    ``g`` at a dead unit gives 0, not ``inf * 0 = NaN``."""
    return np.where(x > 0, g, np.zeros((), g.dtype))


RELU_GRAD = _defop("relu_grad", _relu_grad_np,
                   lambda g, x: AVal(broadcast_shapes("relu_grad", g.shape, x.shape), g.dtype),
                   lambda u, xs, y, n: (relu_grad(u, xs[1]) if n[0] else None, None),
                   lambda ts, xs, y: None if ts[0] is None else relu_grad(ts[0], xs[1]),
                   elementwise=True)
# relu's rules read its output (y > 0 exactly where x > 0), as PyTorch's threshold_backward
# does: the pre-activation need not stay alive, so matmul + bias + relu can fuse in training.
RELU = _defop("relu", _relu_np, _unary_any, lambda g, xs, y, n: (relu_grad(g, y),),
              lambda ts, xs, y: relu_grad(ts[0], y), elementwise=True)
ABS = _defop("abs", np.abs, _unary_any, lambda g, xs, y, n: (g * sign(xs[0]),),
             lambda ts, xs, y: ts[0] * sign(xs[0]), elementwise=True)
# sign is flat almost everywhere: its rules say "no gradient" (zero) rather than being absent,
# so a graph transform can tell it from an op that has no rule at all.
SIGN = _defop("sign", np.sign, _unary_any, lambda g, xs, y, n: (None,), lambda ts, xs, y: None,
              elementwise=True)


# --- where and cast ---------------------------------------------------------------------------
def _where_infer(c, a, b):
    if c.dtype != dtypes.bool_:
        raise DTypeError(f"where: the condition must be bool, got {c.dtype}")
    shape = broadcast_shapes("where", c.shape, a.shape, b.shape)
    return AVal(shape, dtypes.promote(a.dtype, b.dtype))


def _where_vjp(g, xs, y, n):
    c, a, b = xs
    return (None,
            unbroadcast(where(c, g, 0.0), a.shape) if n[1] else None,
            unbroadcast(where(c, 0.0, g), b.shape) if n[2] else None)


def _where_jvp(ts, xs, y):
    c, a, b = xs
    if ts[1] is None and ts[2] is None:
        return None
    ta = ts[1] if ts[1] is not None else zeros_like(a)
    tb = ts[2] if ts[2] is not None else zeros_like(b)
    return where(c, ta, tb)


WHERE = _defop("where", np.where, _where_infer, _where_vjp, _where_jvp, elementwise=True)


def _cast_infer(x, dtype):
    return AVal(x.shape, dtypes.as_dtype(dtype, "cast"))


def _cast_vjp(g, xs, y, n, dtype):
    return (cast(g, xs[0].dtype) if dtypes.is_float(xs[0].dtype) else None,)


def _cast_jvp(ts, xs, y, dtype):
    return cast(ts[0], dtype) if dtypes.is_float(dtype) else None


CAST = _defop("cast", lambda x, dtype: x.astype(dtype), _cast_infer, _cast_vjp, _cast_jvp,
              elementwise=True)


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
    return apply(_CMP["eq"], a, b)


def ne(a, b):
    """Elementwise ``a != b`` (bool)."""
    return apply(_CMP["ne"], a, b)


def lt(a, b):
    """Elementwise ``a < b`` (bool)."""
    return apply(_CMP["lt"], a, b)


def le(a, b):
    """Elementwise ``a <= b`` (bool)."""
    return apply(_CMP["le"], a, b)


def gt(a, b):
    """Elementwise ``a > b`` (bool)."""
    return apply(_CMP["gt"], a, b)


def ge(a, b):
    """Elementwise ``a >= b`` (bool)."""
    return apply(_CMP["ge"], a, b)


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


# Reductions and shape ops live in ops_shape; imported here for the rules above.
from .ops_shape import reshape, sum  # noqa: E402
