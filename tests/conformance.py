"""Op conformance harness: one spec per registered op, its inputs, references and gradient paths.

Every op in ``mlsys_lab.engine.registry.REGISTRY`` has an entry in :data:`SPECS` — a list of
:class:`Case` objects, or a reason why the op is checked another way. A case holds the function
that reaches the op through the public API, its inputs (fixed by a seed derived from the case's
name), a float64 numpy reference and, for ops PyTorch has, a PyTorch function whose answers
``tests/data/make_torch_reference.py`` stores in ``tests/data/torch_reference.npz``. This module
never imports torch: CI reads the committed answers.

The runners evaluate a case every way the library can: eager forward, compiled forward, the
generated elementwise kernel, the eager tape, ``ml.grad``, ``ml.vjp``, ``ml.grad_graph``,
``ml.jvp`` and ``ml.compile`` of the gradient, and compare them with float64 central differences
of the reference. ``tests/engine/test_conformance.py`` drives it; other tests may import it (e.g. a
registry-wide completeness test).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
import pkgutil
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.deploy import quant as _quant  # registers the quantisation ops specified below
from mlsys_lab.engine.registry import REGISTRY, get
from mlsys_lab.engine.tensor import apply

NAN, INF = np.nan, np.inf
F16, F32, F64 = np.dtype("float16"), np.dtype("float32"), np.dtype("float64")
DATA = os.path.join(os.path.dirname(__file__), "data")
TORCH_NPZ = os.path.join(DATA, "torch_reference.npz")

#: Packages whose modules may register ops (kernels and passes register theirs on import).
REGISTERING_PACKAGES = ("mlsys_lab.engine", "mlsys_lab.kernels", "mlsys_lab.nn", "mlsys_lab.deploy",
                        "mlsys_lab.data", "mlsys_lab.distributed")


def registered_ops():
    """Names of every registered op, after importing every module that may register one (a
    module that needs an optional dependency which is missing registers nothing here)."""
    for name in REGISTERING_PACKAGES:
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:
                pass
    from mlsys_lab.engine.selection import device

    device("cpu-numba")  # loads the kernel registrations as operator selection would
    return sorted(REGISTRY)


# --- special values --------------------------------------------------------------------------
_COMMON = [NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 20.0, -20.0, 40.0, -40.0,
           88.5, -88.5, 100.0, -100.0, 1e30, -1e30, 1e-40, -1e-40]
#: Special values per dtype: NaN, +-inf, +-0, denormals, huge and saturating magnitudes.
SPECIAL = {F16: np.array([NAN, INF, -INF, 0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 20.0, -20.0,
                          100.0, -100.0, 6e4, -6e4, 6e-8, -6e-8, 1e-5], F16),
           F32: np.array(_COMMON, F32),
           F64: np.array(_COMMON + [1e300, -1e300, 5e-324, -1e-310, 710.0, -745.5], F64)}


def special(dtype, binary=False):
    """The special values of ``dtype`` as inputs: one vector, or an (n, 1) x (1, n) grid."""
    s = SPECIAL[np.dtype(dtype)]
    return [s[:, None], s[None, :]] if binary else [s]


# --- cases -----------------------------------------------------------------------------------
@dataclass
class Case:
    """One way of running an op, with everything needed to check it.

    Attributes:
        op: the registered op the case exercises (must appear in the traced graph of ``fn``).
        name: short name, unique within the op; ``id`` is ``"op:name"``.
        fn: ``fn(*tensors) -> Tensor`` through the public API (``ml.ops``, operators).
        inputs: numpy arrays (float64 for gradient cases).
        ref: numpy reference ``ref(*arrays) -> array`` computed in float64 (None: the op has
            only a property check, see ``check``).
        diff: input positions to differentiate (empty: forward only).
        numeric: compare gradients with central differences (False at kinks/ties, where only
            PyTorch's convention decides).
        second: also check the second derivative (grad of grad).
        torch: ``torch(T, *tensors) -> tensor`` (T is the torch module), run only by
            ``tests/data/make_torch_reference.py``.
        divergence: why PyTorch's answer is intentionally not ours (then it is not compared).
        out_dtype: expected output dtype (default: the first floating input's, else ref's).
        ulps: tolerance in units in the last place (elementwise ops), or None for ``rtol``.
        rtol: relative tolerance for ops that sum (scaled by the dtype's precision).
        eps: step of the central differences.
        fused: also run ``fn(*x) * one`` compiled, so the generated elementwise kernel runs it.
    """

    op: str
    name: str
    fn: Callable
    inputs: tuple
    ref: Callable | None = None
    diff: tuple = ()
    numeric: bool = True
    second: bool = False
    torch: Callable | None = None
    divergence: str = ""
    out_dtype: object = None
    ulps: float | None = None
    rtol: float | None = None
    eps: float = 1e-6
    fused: bool = False

    @property
    def id(self):
        return f"{self.op}:{self.name}"

    def __repr__(self):
        return f"Case({self.id})"

    def seed(self, salt=0):
        return zlib.crc32(self.id.encode()) + salt


@dataclass
class OpSpec:
    """The conformance entry of one registered op: its cases, or why it has none."""

    op: str
    cases: list = field(default_factory=list)
    untestable: str = ""  # why the op cannot be run standalone (then it has no cases)
    no_grad: str = ""  # why the op has no gradient rule (vjp None) by design


def _mk(op, name, fn, make, **kw):
    rng = np.random.default_rng(zlib.crc32(f"{op}:{name}".encode()))
    inputs = make(rng) if callable(make) else make
    return Case(op, name, fn, tuple(np.asarray(a) for a in inputs), **kw)


# --- input makers (rng first, then the shape) --------------------------------------------------
def rn(r, *shape):
    return r.standard_normal(shape)


def pos(r, *shape):
    return r.uniform(0.5, 2.0, shape)


def away(r, *shape):
    """Values at least 0.2 away from 0 (the kink of relu/abs)."""
    return r.uniform(0.2, 1.5, shape) * r.choice([-1.0, 1.0], shape)


def distinct(r, *shape):
    """Values that are all different and well apart (no ties for max/maximum/pooling)."""
    n = int(np.prod(shape))
    return (r.permutation(n) * 0.37 - 0.1 * n).reshape(shape)


def ints(r, high, *shape):
    return r.integers(0, high, shape).astype(np.int64)


# --- references ------------------------------------------------------------------------------
def _quiet(f):
    @functools.wraps(f)
    def g(*a, **k):
        with np.errstate(all="ignore"):
            return f(*a, **k)
    return g


def f64(a):
    a = np.asarray(a)
    return a.astype(np.float64) if a.dtype.kind == "f" else a


def sigmoid_ref(x):
    """1 / (1 + e^-x) without overflow on either tail."""
    x = f64(x)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def log_sigmoid_ref(x):
    x = f64(x)
    return np.minimum(x, 0.0) - np.log1p(np.exp(-np.abs(x)))


def relu_ref(x):
    x = f64(x)
    return np.where(np.isnan(x) | (x > 0), x, 0)


def softmax_ref(x, axis):
    x = f64(x)
    if x.size == 0:
        return x.copy()
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax_ref(x, axis):
    x = f64(x)
    if x.size == 0:
        return x.copy()
    z = x - np.max(x, axis=axis, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=axis, keepdims=True))


def cross_entropy_ref(x, t):
    x = f64(x)
    if x.shape[0] == 0:
        return np.array(np.nan)
    return np.mean(-log_softmax_ref(x, 1)[np.arange(x.shape[0]), t])


def conv2d_ref(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Cross-correlation of NCHW ``x`` with OIHW ``w`` (``w`` holding C / groups input
    channels per output channel), by explicit window loops."""
    x, w = f64(x), f64(w)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    o, cg, kh, kw = w.shape
    oh = (xp.shape[2] - dh * (kh - 1) - 1) // sh + 1
    ow = (xp.shape[3] - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((x.shape[0], o, oh, ow))
    for g in range(groups):
        xg, wg = xp[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og]
        for i in range(oh):
            for j in range(ow):
                win = xg[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                         j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[:, g * og:(g + 1) * og, i, j] = np.tensordot(win, wg,
                                                                 axes=((1, 2, 3), (1, 2, 3)))
    return out


def _pool_windows(x, kernel, stride, padding, fill):
    x = f64(x)
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh, ow = (xp.shape[2] - kh) // sh + 1, (xp.shape[3] - kw) // sw + 1
    for i in range(oh):
        for j in range(ow):
            yield i, j, xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw], (oh, ow)


def max_pool_ref(x, kernel, stride, padding):
    out = None
    for i, j, win, (oh, ow) in _pool_windows(x, kernel, stride, padding, -np.inf):
        if out is None:
            out = np.zeros(x.shape[:2] + (oh, ow))
        out[:, :, i, j] = win.reshape(win.shape[:2] + (kernel[0] * kernel[1],)).max(axis=-1)
    return out


def avg_pool_ref(x, kernel, stride, padding):
    out = None
    for i, j, win, (oh, ow) in _pool_windows(x, kernel, stride, padding, 0.0):
        if out is None:
            out = np.zeros(x.shape[:2] + (oh, ow))
        out[:, :, i, j] = win.reshape(win.shape[:2] + (kernel[0] * kernel[1],)).mean(axis=-1)
    return out


def max_pool_select_ref(u, x, kernel, stride, padding):
    """``u`` (shaped like x) read at each window's first maximum: the JVP of max pooling."""
    (ph, pw) = padding
    up = np.pad(f64(u), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = None
    for i, j, win, (oh, ow) in _pool_windows(x, kernel, stride, padding, -np.inf):
        if out is None:
            out = np.zeros(x.shape[:2] + (oh, ow))
        flat = win.reshape(win.shape[:2] + (kernel[0] * kernel[1],))
        k = np.argmax(flat, axis=-1)
        r, c = np.divmod(k, kernel[1])
        for n in range(x.shape[0]):
            for ch in range(x.shape[1]):
                out[n, ch, i, j] = up[n, ch, i * stride[0] + r[n, ch], j * stride[1] + c[n, ch]]
    return out


def _scatter_windows(g, x_shape, kernel, stride, padding, contribution):
    """Sum ``contribution(i, j)`` (one (N, C, kh, kw) block per output position) into the
    padded input, then crop: the transpose of a windowed op, by its definition."""
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, padding
    n, c, h, w = x_shape
    out = np.zeros((n, c, h + 2 * ph, w + 2 * pw))
    for i in range(g.shape[2]):
        for j in range(g.shape[3]):
            out[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw] += contribution(i, j)
    return out[:, :, ph:ph + h, pw:pw + w]


def conv2d_grad_input_ref(g, w, x_shape, stride, padding, dilation=(1, 1), groups=1):
    """The transpose of :func:`conv2d_ref` in its input, as the sum over output positions of
    each window's share (dilated windows: every dh-th row, dw-th column)."""
    g, w = f64(g), f64(w)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c, h, wd = x_shape
    o, cg, kh, kw = w.shape
    og = o // groups
    out = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    for grp in range(groups):
        gg, wg = g[:, grp * og:(grp + 1) * og], w[grp * og:(grp + 1) * og]
        for i in range(g.shape[2]):
            for j in range(g.shape[3]):
                out[:, grp * cg:(grp + 1) * cg, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                    j * sw:j * sw + dw * (kw - 1) + 1:dw] += np.einsum("no,ochw->nchw",
                                                                       gg[:, :, i, j], wg)
    return out[:, :, ph:ph + h, pw:pw + wd]


def conv2d_grad_weight_ref(x, g, w_shape, stride, padding, dilation=(1, 1), groups=1):
    x, g = f64(x), f64(g)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    o, cg, kh, kw = w_shape
    og = o // groups
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    out = np.zeros(w_shape)
    for grp in range(groups):
        xg, gg = xp[:, grp * cg:(grp + 1) * cg], g[:, grp * og:(grp + 1) * og]
        for i in range(g.shape[2]):
            for j in range(g.shape[3]):
                win = xg[:, :, i * sh:i * sh + dh * (kh - 1) + 1:dh,
                         j * sw:j * sw + dw * (kw - 1) + 1:dw]
                out[grp * og:(grp + 1) * og] += np.einsum("nchw,no->ochw", win, gg[:, :, i, j])
    return out


def avg_pool_grad_ref(g, x_shape, kernel, stride, padding):
    g = f64(g)
    share = 1.0 / (kernel[0] * kernel[1])
    return _scatter_windows(g, x_shape, kernel, stride, padding,
                            lambda i, j: np.broadcast_to(g[:, :, i, j, None, None] * share,
                                                         g.shape[:2] + tuple(kernel)))


def max_pool_scatter_ref(g, x, kernel, stride, padding):
    """Each window's gradient goes to its first maximum (PyTorch's choice among ties)."""
    g, x = f64(g), f64(x)
    (ph, pw) = padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)

    def contribution(i, j):
        win = xp[:, :, i * stride[0]:i * stride[0] + kernel[0],
                 j * stride[1]:j * stride[1] + kernel[1]]
        flat = win.reshape(win.shape[:2] + (kernel[0] * kernel[1],))
        hot = np.arange(flat.shape[-1]) == np.argmax(flat, axis=-1)[..., None]
        return (hot * g[:, :, i, j, None]).reshape(win.shape)
    return _scatter_windows(g, x.shape, kernel, stride, padding, contribution)


def nhwc(f):
    """A reference on NCHW arrays turned into one on NHWC input (and HWIO weight)."""
    def g(x, *rest, **attrs):
        x = np.transpose(f64(x), (0, 3, 1, 2))
        rest = [np.transpose(f64(w), (3, 2, 0, 1)) for w in rest]
        return np.transpose(f(x, *rest, **attrs), (0, 2, 3, 1))
    return g


# --- the specs -------------------------------------------------------------------------------
SPECS: dict[str, OpSpec] = {}


def spec(op, *cases, untestable="", no_grad=""):
    SPECS[op] = OpSpec(op, list(cases), untestable, no_grad)


def _T(name):
    """``torch.<name>`` applied to the tensors (for the reference script)."""
    return lambda T, *xs: getattr(T, name)(*xs)


# Unary elementwise ops: reference, domain of the gradient case, smooth, torch function.
UNARY = {
    "neg": (np.negative, rn, True, lambda T, x: -x),
    "exp": (np.exp, rn, True, _T("exp")),
    "log": (np.log, pos, True, _T("log")),
    "sqrt": (np.sqrt, pos, True, _T("sqrt")),
    "tanh": (np.tanh, rn, True, _T("tanh")),
    "sigmoid": (sigmoid_ref, rn, True, _T("sigmoid")),
    "sin": (np.sin, rn, True, _T("sin")),
    "cos": (np.cos, rn, True, _T("cos")),
    "relu": (relu_ref, away, False, _T("relu")),
    "abs": (np.abs, away, False, _T("abs")),
    "sign": (np.sign, away, False, _T("sign")),  # its gradient is zero (as PyTorch's)
}
NOT_DIFFERENTIABLE = {}  # unary op -> why it has no gradient rule
DIVERGENCE = {("sign", f"special_{dt}"): "sign(NaN) is NaN as in numpy (PyTorch returns 0)"
              for dt in ("f16", "f32", "f64")}


def _unary_specs():
    for name, entry in UNARY.items():
        _unary_spec(name, *entry)


def _unary_spec(name, ref, dom, smooth, tfn):
    fn = getattr(ops, name)
    ref_q = _quiet(ref)
    grad = name not in NOT_DIFFERENTIABLE
    diff = (0,) if grad else ()
    cases = [_mk(name, shape_name, fn, lambda r, s=shape: [dom(r, *s)], ref=ref_q,
                 diff=diff, second=smooth and shape_name == "basic", torch=tfn, ulps=4)
             for shape_name, shape in (("basic", (3, 4)), ("empty", (0, 3)),
                                       ("ones", (1, 1)), ("scalar", ()),
                                       ("rank3", (2, 1, 3)))]
    if grad:
        cases.append(_mk(name, "float32", fn, lambda r: [dom(r, 3, 4).astype(F32)],
                         ref=ref_q, diff=diff, torch=tfn, ulps=4))
    if name in ("tanh", "sigmoid"):  # exactly +-1 (or 0) where the exact value rounds there
        sat = np.array([20.0, -20.0, 40.0, -40.0, 88.5, 1e30, -1e30, INF, -INF])
        for dt in (F32, F64):
            vals = sat if name == "tanh" else sat[sat > 0]
            vals = np.concatenate([vals, [-INF]]) if name == "sigmoid" else vals
            cases.append(_mk(name, "saturates_" + dt.name.replace("float", "f"), fn,
                             [vals.astype(dt)], ref=ref_q, torch=tfn, ulps=0, fused=True))
    if name in ("neg", "abs", "relu"):
        cases.append(_mk(name, "int", fn, [np.array([-3, 0, 5], np.int64)], ref=ref_q,
                         torch=tfn))
    for dt in (F16, F32, F64):
        key = "special_" + dt.name.replace("float", "f")
        cases.append(_mk(name, key, fn, special(dt), ref=ref_q, torch=tfn, ulps=4,
                         fused=dt != F16, divergence=DIVERGENCE.get((name, key), "")))
    if name == "sigmoid":  # both tails: log(sigmoid(x)) stays finite (PyTorch: -40 at -40)
        cases.append(_mk(name, "log_of_tails", lambda x: ops.log(ops.sigmoid(x)),
                         [np.array([-40.0, -20.0, -5.0, 5.0, 20.0, 40.0])],
                         ref=log_sigmoid_ref, diff=(0,), rtol=1000,
                         torch=lambda T, x: T.log(T.sigmoid(x))))
        cases.append(_mk(name, "log_of_tails_f32", lambda x: ops.log(ops.sigmoid(x)),
                         [np.array([-40.0, -20.0, -5.0, 5.0, 20.0], F32)],
                         ref=log_sigmoid_ref, rtol=200,
                         torch=lambda T, x: T.log(T.sigmoid(x))))
    if name in ("relu", "abs"):  # the kink: PyTorch's convention, 0 at 0
        cases.append(_mk(name, "at_zero", fn, [np.array([-1.0, 0.0, -0.0, 2.0])],
                         ref=ref_q, diff=(0,), numeric=False, torch=tfn))
    if name == "sign":
        cases.append(_mk(name, "int", fn, [np.array([-3, 0, 5], np.int64)], ref=ref_q,
                         torch=tfn))
    spec(name, *cases, no_grad=NOT_DIFFERENTIABLE.get(name, ""))


_unary_specs()


def _pow_ref(a, b):
    return np.power(f64(a), f64(b))


BINARY = {
    "add": (np.add, rn, rn, True, lambda T, a, b: a + b),
    "sub": (np.subtract, rn, rn, True, lambda T, a, b: a - b),
    "mul": (np.multiply, rn, rn, True, lambda T, a, b: a * b),
    "div": (np.true_divide, rn, pos, True, lambda T, a, b: a / b),
    "pow": (_pow_ref, pos, rn, True, lambda T, a, b: a ** b),
    "maximum": (np.maximum, distinct, lambda r, *s: distinct(r, *s) + 0.185, False,
                _T("maximum")),
    "minimum": (np.minimum, distinct, lambda r, *s: distinct(r, *s) + 0.185, False,
                _T("minimum")),
}


def _binary_specs():
    for name, entry in BINARY.items():
        _binary_spec(name, *entry)


def _binary_spec(name, ref, da, db, smooth, tfn):
    fn = getattr(ops, name)
    ref_q = _quiet(ref)
    cases = [
        _mk(name, "broadcast", fn, lambda r: [da(r, 3, 4), db(r, 4)], ref=ref_q,
            diff=(0, 1), second=smooth, torch=tfn, ulps=4),
        _mk(name, "outer", fn, lambda r: [da(r, 3, 1), db(r, 1, 4)], ref=ref_q,
            diff=(0, 1), torch=tfn, ulps=4),
        _mk(name, "rank3", fn, lambda r: [da(r, 2, 3, 4), db(r, 3, 1)], ref=ref_q,
            diff=(0, 1), torch=tfn, ulps=4),
        _mk(name, "empty", fn, lambda r: [da(r, 0, 4), db(r, 4)], ref=ref_q,
            diff=(0, 1), torch=tfn, ulps=4),
        _mk(name, "scalar_shapes", fn, lambda r: [da(r), db(r, 1)], ref=ref_q,
            diff=(0, 1), torch=tfn, ulps=4),
        _mk(name, "float32", fn, lambda r: [da(r, 3, 4).astype(F32), db(r, 4).astype(F32)],
            ref=ref_q, diff=(0, 1), torch=tfn, ulps=4),
        _mk(name, "python_scalar", lambda a: fn(a, 1.5), lambda r: [da(r, 2, 3)],
            ref=lambda a: ref_q(a, 1.5), diff=(0,), ulps=4,
            torch=lambda T, a: tfn(T, a, T.tensor(1.5, dtype=a.dtype))),
    ]
    for dt in (F16, F32, F64):
        cases.append(_mk(name, f"special_{dt.name.replace('float', 'f')}", fn,
                         special(dt, binary=True), ref=ref_q, torch=tfn, ulps=4,
                         fused=dt != F16))
    spec(name, *cases)


_binary_specs()

SPECS["add"].cases += [
    _mk("add", "int_plus_float", ops.add,
        [np.array([1, -2, 3], np.int64), np.array([0.5, 0.25, -1.0], F32)],
        ref=np.add, out_dtype=F32, torch=lambda T, a, b: a + b),
    _mk("add", "uint8", ops.add, [np.array([1, 200, 255], np.uint8), np.array([3, 100, 1],
                                                                                np.uint8)],
        ref=np.add, out_dtype=np.uint8, torch=lambda T, a, b: a + b),
]
SPECS["sub"].cases += [  # 0 - x must keep the sign of zero (compiled: no rewrite to neg(x))
    _mk("sub", "zero_minus_f32", lambda x: ops.sub(0.0, x), special(F32), ulps=0,
        ref=_quiet(lambda x: 0.0 - f64(x)), fused=True, torch=lambda T, x: 0.0 - x),
    _mk("sub", "reciprocal_of_zero_minus", lambda x: ops.div(1.0, ops.sub(0.0, x)),
        [np.array([0.0, -0.0, 2.0])], ref=_quiet(lambda x: 1.0 / (0.0 - x)), ulps=0,
        fused=True, torch=lambda T, x: 1.0 / (0.0 - x)),
]
SPECS["div"].cases += [
    _mk("div", "ints", ops.div, [np.array([1, 7, -3], np.int64), np.array([2, 2, 4], np.int64)],
        ref=lambda a, b: a / b, out_dtype=F32, torch=lambda T, a, b: a / b),
]
SPECS["pow"].cases += [
    _mk("pow", "zero_base", ops.pow, [np.array([0.0, 0.0, 0.0, 2.0]),
                                      np.array([0.5, 2.0, 3.0, 1.5])],
        ref=_pow_ref, diff=(1,), torch=lambda T, a, b: a ** b),
    _mk("pow", "negative_base_int_exponent", ops.pow,
        [np.array([-2.0, -0.5, -3.0]), np.array([3.0, 2.0, 1.0])], ref=_pow_ref, diff=(0,),
        torch=lambda T, a, b: a ** b),
    _mk("pow", "integer_exponent", lambda a: a ** 3, lambda r: [rn(r, 5)],
        ref=lambda a: a ** 3, diff=(0,), second=True, torch=lambda T, a: a ** 3),
]


def _tie_cases(name, ref):
    """Ties split the gradient 0.5 / 0.5 (PyTorch, JAX): maximum(x, x) passes x's gradient."""
    fn = getattr(ops, name)
    SPECS[name].cases += [
        _mk(name, "ties", fn, [np.array([1.0, 2.0, -3.0, 0.5]), np.array([1.0, 1.0, -3.0, 4.0])],
            ref=ref, diff=(0, 1), torch=_T(name)),
        _mk(name, "same_input", lambda a: fn(a, a), lambda r: [rn(r, 2, 3)], ref=lambda a: a,
            diff=(0,), torch=lambda T, a: getattr(T, name)(a, a)),
    ]


_tie_cases("maximum", np.maximum)
_tie_cases("minimum", np.minimum)

_CMP = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
        "gt": np.greater, "ge": np.greater_equal}
for _name, _ref in _CMP.items():
    _fn = getattr(ops, _name)
    _t = _T(_name)
    spec(_name,
         _mk(_name, "broadcast", _fn, lambda r: [ints(r, 3, 3, 4).astype(float),
                                                 ints(r, 3, 4).astype(float)],
             ref=_ref, out_dtype=np.bool_, torch=_t),
         _mk(_name, "empty", _fn, lambda r: [rn(r, 0, 2), rn(r, 2)], ref=_ref,
             out_dtype=np.bool_, torch=_t),
         _mk(_name, "special_f32", _fn, special(F32, binary=True), ref=_ref,
             out_dtype=np.bool_, torch=_t),
         _mk(_name, "ints", _fn, [np.array([1, 2, 3]), np.array([2, 2, 2])], ref=_ref,
             out_dtype=np.bool_, torch=_t),
         no_grad="comparison: bool output, no gradient")


def _where_cond(r, *shape):
    return r.random(shape) < 0.5


spec("where",
     _mk("where", "broadcast", ops.where,
         lambda r: [_where_cond(r, 3, 4), rn(r, 3, 4), rn(r, 4)], ref=np.where, diff=(1, 2),
         second=True, torch=_T("where")),
     _mk("where", "scalar_branch", lambda c, a: ops.where(c, a, 0.0),
         lambda r: [_where_cond(r, 2, 3), rn(r, 2, 3)], ref=lambda c, a: np.where(c, a, 0.0),
         diff=(1,), torch=lambda T, c, a: T.where(c, a, T.tensor(0.0, dtype=a.dtype))),
     _mk("where", "empty", ops.where, lambda r: [_where_cond(r, 0, 3), rn(r, 0, 3), rn(r, 3)],
         ref=np.where, diff=(1, 2), torch=_T("where")),
     _mk("where", "special_f32", ops.where,
         lambda r: [r.random(SPECIAL[F32].shape) < 0.5, SPECIAL[F32], SPECIAL[F32][::-1]],
         ref=np.where, torch=_T("where"), ulps=0, fused=True))

_TORCH_DTYPES = {"float16": "float16", "float32": "float32", "float64": "float64",
                 "int64": "int64", "int32": "int32", "uint8": "uint8", "bool": "bool"}


def _cast_torch(dtype):
    return lambda T, x: x.to(getattr(T, _TORCH_DTYPES[dtype]))


spec("cast",
     _mk("cast", "f64_to_f32", lambda x: ops.cast(x, "float32"), lambda r: [rn(r, 3, 4)],
         ref=lambda x: x.astype(F32), diff=(0,), eps=0.1, out_dtype=F32, ulps=0,
         torch=_cast_torch("float32")),
     _mk("cast", "f32_to_f64", lambda x: ops.cast(x, "float64"),
         lambda r: [rn(r, 3).astype(F32)], ref=lambda x: x.astype(F64), out_dtype=F64,
         torch=_cast_torch("float64")),
     _mk("cast", "f32_to_int64", lambda x: ops.cast(x, "int64"),
         [np.array([-2.7, -0.5, 0.0, 0.9, 3.5, 1e6], F32)], ref=lambda x: x.astype(np.int64),
         out_dtype=np.int64, torch=_cast_torch("int64")),
     _mk("cast", "uint8_to_f32", lambda x: ops.cast(x, "float32"),
         [np.array([0, 1, 128, 255], np.uint8)], ref=lambda x: x.astype(F32),
         torch=_cast_torch("float32")),
     _mk("cast", "bool_to_f32", lambda x: ops.cast(x, "float32"), [np.array([True, False])],
         ref=lambda x: x.astype(F32), torch=_cast_torch("float32")),
     _mk("cast", "special_f32_to_f16", lambda x: ops.cast(x, "float16"), special(F32),
         ref=_quiet(lambda x: x.astype(np.float16)), out_dtype=np.float16, ulps=0,
         torch=_cast_torch("float16")),
     _mk("cast", "special_f64_to_f32", lambda x: ops.cast(x, "float32"), special(F64),
         ref=_quiet(lambda x: x.astype(F32)), out_dtype=F32, ulps=0,
         torch=_cast_torch("float32")),
     _mk("cast", "empty", lambda x: ops.cast(x, "float32"), lambda r: [rn(r, 0, 2)],
         ref=lambda x: x.astype(F32), diff=(0,), out_dtype=F32, torch=_cast_torch("float32")))

spec("identity",
     _mk("identity", "basic", ops.identity, lambda r: [rn(r, 2, 3)], ref=lambda x: x,
         diff=(0,), second=True, torch=lambda T, x: x.clone()),
     _mk("identity", "empty", ops.identity, lambda r: [rn(r, 0)], ref=lambda x: x, diff=(0,),
         torch=lambda T, x: x.clone()))


def _shape_case(op, name, fn, make, ref, tfn, **kw):
    return _mk(op, name, fn, make, ref=ref, diff=(0,), torch=tfn, **kw)


spec("reshape",
     _shape_case("reshape", "infer_dim", lambda x: ops.reshape(x, (4, -1)),
                 lambda r: [rn(r, 2, 6)], lambda x: x.reshape(4, -1),
                 lambda T, x: x.reshape(4, -1), second=True),
     _shape_case("reshape", "to_scalar", lambda x: ops.reshape(x, ()),
                 lambda r: [rn(r, 1, 1)], lambda x: x.reshape(()), lambda T, x: x.reshape(())),
     _shape_case("reshape", "empty", lambda x: ops.reshape(x, (3, 0)),
                 lambda r: [rn(r, 0, 3)], lambda x: x.reshape(3, 0),
                 lambda T, x: x.reshape(3, 0)),
     _shape_case("reshape", "add_unit_dims", lambda x: ops.reshape(x, (1, 3, 1, 2)),
                 lambda r: [rn(r, 2, 3)], lambda x: x.reshape(1, 3, 1, 2),
                 lambda T, x: x.reshape(1, 3, 1, 2)))

spec("transpose",
     _shape_case("transpose", "perm3", lambda x: ops.transpose(x, (2, 0, 1)),
                 lambda r: [rn(r, 2, 3, 4)], lambda x: x.transpose(2, 0, 1),
                 lambda T, x: x.permute(2, 0, 1), second=True),
     _shape_case("transpose", "default_reverses", ops.transpose, lambda r: [rn(r, 2, 3, 4)],
                 lambda x: x.transpose(), lambda T, x: x.permute(2, 1, 0)),
     _shape_case("transpose", "negative_axes", lambda x: ops.transpose(x, (-1, 0, 1)),
                 lambda r: [rn(r, 2, 3, 4)], lambda x: x.transpose(2, 0, 1),
                 lambda T, x: x.permute(2, 0, 1)),
     _shape_case("transpose", "method_T", lambda x: x.T, lambda r: [rn(r, 3, 2)],
                 lambda x: x.T, lambda T, x: x.T),
     _shape_case("transpose", "empty", lambda x: ops.transpose(x, (1, 0, 2)),
                 lambda r: [rn(r, 0, 2, 1)], lambda x: x.transpose(1, 0, 2),
                 lambda T, x: x.permute(1, 0, 2)))

spec("broadcast_to",
     _shape_case("broadcast_to", "basic", lambda x: ops.broadcast_to(x, (2, 3, 4)),
                 lambda r: [rn(r, 3, 1)], lambda x: np.broadcast_to(x, (2, 3, 4)),
                 lambda T, x: x.expand(2, 3, 4), second=True),
     _shape_case("broadcast_to", "scalar", lambda x: ops.broadcast_to(x, (2, 2)),
                 lambda r: [rn(r)], lambda x: np.broadcast_to(x, (2, 2)),
                 lambda T, x: x.expand(2, 2)),
     _shape_case("broadcast_to", "to_empty", lambda x: ops.broadcast_to(x, (0, 3)),
                 lambda r: [rn(r, 1, 3)], lambda x: np.broadcast_to(x, (0, 3)),
                 lambda T, x: x.expand(0, 3)),
     _shape_case("broadcast_to", "same_shape", lambda x: ops.broadcast_to(x, (2, 3)),
                 lambda r: [rn(r, 2, 3)], lambda x: x, lambda T, x: x.expand(2, 3)))


def _red(op, name, fn, make, ref, tfn, diff=(0,), **kw):
    kw.setdefault("rtol", 10)
    return _mk(op, name, fn, make, ref=_quiet(ref), diff=diff, torch=tfn, **kw)


def _tsum(axis=None, keepdims=False):
    def f(T, x):
        return T.sum(x) if axis is None else T.sum(x, dim=axis, keepdim=keepdims)
    return f


def _tmean(axis=None, keepdims=False):
    def f(T, x):
        return T.mean(x) if axis is None else T.mean(x, dim=axis, keepdim=keepdims)
    return f


def _tamax(axis=None, keepdims=False):
    def f(T, x):
        return T.amax(x) if axis is None else T.amax(x, dim=axis, keepdim=keepdims)
    return f


_RED_SPECIAL = np.array([[1.0, INF, 2.0], [-INF, INF, 0.0], [NAN, 1.0, 2.0], [1e30, 1e30, -1e30],
                         [-0.0, -0.0, -0.0], [-INF, -INF, -INF]])
spec("sum",
     _red("sum", "all", ops.sum, lambda r: [rn(r, 3, 4)], np.sum, _tsum(), second=True),
     _red("sum", "axis1", lambda x: ops.sum(x, axis=1), lambda r: [rn(r, 3, 4, 2)],
          lambda x: x.sum(1), _tsum(1)),
     _red("sum", "axes_keepdims", lambda x: ops.sum(x, axis=(0, 2), keepdims=True),
          lambda r: [rn(r, 3, 4, 2)], lambda x: x.sum((0, 2), keepdims=True),
          _tsum((0, 2), True)),
     _red("sum", "negative_axis", lambda x: ops.sum(x, axis=-1), lambda r: [rn(r, 2, 3)],
          lambda x: x.sum(-1), _tsum(-1)),
     _red("sum", "empty_axis", lambda x: ops.sum(x, axis=0), lambda r: [rn(r, 0, 3)],
          lambda x: x.sum(0), _tsum(0)),
     _red("sum", "empty_all", ops.sum, lambda r: [rn(r, 2, 0)], np.sum, _tsum()),
     _red("sum", "scalar", ops.sum, lambda r: [rn(r)], np.sum, _tsum()),
     _red("sum", "float32", lambda x: ops.sum(x, axis=0), lambda r: [rn(r, 3, 4).astype(F32)],
          lambda x: x.sum(0), _tsum(0)),
     _red("sum", "ints", lambda x: ops.sum(x, axis=0), lambda r: [ints(r, 9, 3, 2)],
          lambda x: x.sum(0), _tsum(0), diff=()),
     _red("sum", "bool", ops.sum, [np.array([True, False, True])], lambda x: np.sum(x),
          _tsum(), diff=(), out_dtype=np.int64),
     _red("sum", "special_f32", lambda x: ops.sum(x, axis=1), [_RED_SPECIAL.astype(F32)],
          lambda x: x.sum(1), _tsum(1), diff=()))
spec("mean",
     _red("mean", "all", ops.mean, lambda r: [rn(r, 3, 4)], np.mean, _tmean(), second=True),
     _red("mean", "axis0", lambda x: ops.mean(x, axis=0), lambda r: [rn(r, 3, 4)],
          lambda x: x.mean(0), _tmean(0)),
     _red("mean", "keepdims", lambda x: ops.mean(x, axis=(1, 2), keepdims=True),
          lambda r: [rn(r, 2, 3, 2)], lambda x: x.mean((1, 2), keepdims=True),
          _tmean((1, 2), True)),
     _red("mean", "empty_outer", lambda x: ops.mean(x, axis=1), lambda r: [rn(r, 0, 3)],
          lambda x: x.mean(1), _tmean(1)),
     _red("mean", "over_empty_axis_is_nan", lambda x: ops.mean(x, axis=0),
          lambda r: [rn(r, 0, 3)], lambda x: x.mean(0), _tmean(0), diff=()),
     _red("mean", "special_f32", lambda x: ops.mean(x, axis=1), [_RED_SPECIAL.astype(F32)],
          lambda x: x.mean(1), _tmean(1), diff=()))
spec("max",
     _red("max", "axis1", lambda x: ops.max(x, axis=1), lambda r: [distinct(r, 3, 5)],
          lambda x: x.max(1), _tamax(1)),
     _red("max", "all", ops.max, lambda r: [distinct(r, 2, 3)], np.max, _tamax()),
     _red("max", "keepdims", lambda x: ops.max(x, axis=0, keepdims=True),
          lambda r: [distinct(r, 3, 2)], lambda x: x.max(0, keepdims=True), _tamax(0, True)),
     _red("max", "ties_split", lambda x: ops.max(x, axis=1),
          [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0], [0.0, -1.0, 5.0]])],
          lambda x: x.max(1), _tamax(1), numeric=False),
     _red("max", "empty_outer", lambda x: ops.max(x, axis=1), lambda r: [rn(r, 0, 3)],
          lambda x: x.max(1), _tamax(1)),
     _red("max", "ints", lambda x: ops.max(x, axis=0), lambda r: [ints(r, 9, 3, 2)],
          lambda x: x.max(0), _tamax(0), diff=()),
     _red("max", "special_f32", lambda x: ops.max(x, axis=1), [_RED_SPECIAL.astype(F32)],
          lambda x: x.max(1), _tamax(1), diff=()))
spec("argmax",
     _mk("argmax", "axis1", lambda x: ops.argmax(x, axis=1), lambda r: [rn(r, 3, 4)],
         ref=lambda x: np.argmax(x, 1), out_dtype=np.int64,
         torch=lambda T, x: T.argmax(x, dim=1)),
     _mk("argmax", "flat", ops.argmax, lambda r: [rn(r, 3, 4)], ref=np.argmax,
         out_dtype=np.int64, torch=lambda T, x: T.argmax(x)),
     _mk("argmax", "ties_first", lambda x: ops.argmax(x, axis=-1),
         [np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]])], ref=lambda x: np.argmax(x, -1),
         out_dtype=np.int64, torch=lambda T, x: T.argmax(x, dim=-1)),
     _mk("argmax", "nan_is_max", lambda x: ops.argmax(x, axis=1),
         [np.array([[1.0, NAN, 3.0], [INF, 2.0, -INF]], F32)], ref=lambda x: np.argmax(x, 1),
         out_dtype=np.int64, torch=lambda T, x: T.argmax(x, dim=1)),
     _mk("argmax", "empty_outer", lambda x: ops.argmax(x, axis=1), lambda r: [rn(r, 0, 3)],
         ref=lambda x: np.argmax(x, 1), out_dtype=np.int64,
         torch=lambda T, x: T.argmax(x, dim=1)),
     no_grad="integer output")

spec("concatenate",
     _mk("concatenate", "axis1", lambda a, b: ops.concatenate([a, b], axis=1),
         lambda r: [rn(r, 2, 3), rn(r, 2, 2)], ref=lambda a, b: np.concatenate([a, b], 1),
         diff=(0, 1), second=True, torch=lambda T, a, b: T.cat([a, b], 1)),
     _mk("concatenate", "negative_axis", lambda a, b, c: ops.concatenate([a, b, c], axis=-2),
         lambda r: [rn(r, 1, 2), rn(r, 3, 2), rn(r, 1, 2)],
         ref=lambda a, b, c: np.concatenate([a, b, c], -2), diff=(0, 1, 2),
         torch=lambda T, a, b, c: T.cat([a, b, c], -2)),
     _mk("concatenate", "empty_piece", lambda a, b: ops.concatenate([a, b], axis=1),
         lambda r: [rn(r, 2, 0), rn(r, 2, 3)], ref=lambda a, b: np.concatenate([a, b], 1),
         diff=(0, 1), torch=lambda T, a, b: T.cat([a, b], 1)),
     _mk("concatenate", "single", lambda a: ops.concatenate([a], axis=0),
         lambda r: [rn(r, 3)], ref=lambda a: a, diff=(0,), torch=lambda T, a: T.cat([a], 0)))
spec("stack",
     _mk("stack", "axis1", lambda a, b: ops.stack([a, b], axis=1),
         lambda r: [rn(r, 2, 3), rn(r, 2, 3)], ref=lambda a, b: np.stack([a, b], 1),
         diff=(0, 1), second=True, torch=lambda T, a, b: T.stack([a, b], 1)),
     _mk("stack", "negative_axis", lambda a, b: ops.stack([a, b], axis=-1),
         lambda r: [rn(r, 3), rn(r, 3)], ref=lambda a, b: np.stack([a, b], -1), diff=(0, 1),
         torch=lambda T, a, b: T.stack([a, b], -1)),
     _mk("stack", "empty", lambda a, b: ops.stack([a, b]), lambda r: [rn(r, 0, 2), rn(r, 0, 2)],
         ref=lambda a, b: np.stack([a, b]), diff=(0, 1), torch=lambda T, a, b: T.stack([a, b])),
     _mk("stack", "scalars", lambda a, b: ops.stack([a, b]), lambda r: [rn(r), rn(r)],
         ref=lambda a, b: np.stack([a, b]), diff=(0, 1), torch=lambda T, a, b: T.stack([a, b])))


def _gi(name, fn, make, ref, tfn, **kw):
    return _mk("getitem", name, fn, make, ref=ref, diff=(0,), torch=tfn, **kw)


spec("getitem",
     _gi("slices", lambda x: x[1:, ::2, None], lambda r: [rn(r, 3, 5)],
         lambda x: x[1:, ::2, None], lambda T, x: x[1:, ::2, None], second=True),
     _gi("int", lambda x: x[1], lambda r: [rn(r, 3, 2)], lambda x: x[1], lambda T, x: x[1]),
     _gi("negative_step", lambda x: ops.getitem(x, (slice(None, None, -1), -1)),
         lambda r: [rn(r, 3, 2)], lambda x: x[::-1, -1], lambda T, x: T.flip(x, (0,))[:, -1]),
     _gi("ellipsis", lambda x: x[..., 0], lambda r: [rn(r, 2, 3, 2)], lambda x: x[..., 0],
         lambda T, x: x[..., 0]),
     _gi("empty_slice", lambda x: x[2:2], lambda r: [rn(r, 4, 2)], lambda x: x[2:2],
         lambda T, x: x[2:2]),
     _gi("list_index_repeats", lambda x: ops.getitem(x, [0, 0, 2]), lambda r: [rn(r, 3)],
         lambda x: x[[0, 0, 2]], lambda T, x: x[[0, 0, 2]]),
     _gi("list_index_2d", lambda x: ops.getitem(x, ([1, 1], slice(None))),
         lambda r: [rn(r, 2, 3)], lambda x: x[[1, 1], :], lambda T, x: x[[1, 1], :]))
spec("getitem_grad",
     _mk("getitem_grad", "slice",
         lambda g: apply(get("getitem_grad"), g, shape=(4, 2), index=(slice(1, 3),)),
         lambda r: [rn(r, 2, 2)], ref=lambda g: np.pad(g, ((1, 1), (0, 0))), diff=(0,),
         second=True),
     _mk("getitem_grad", "repeated_list_index",
         lambda g: apply(get("getitem_grad"), g, shape=(3,), index=([0, 0, 2],)),
         lambda r: [rn(r, 3)], ref=lambda g: np.bincount([0, 0, 2], g, 3), diff=(0,)))
spec("take",
     _mk("take", "repeats", lambda x, i: ops.take(x, i, axis=0),
         lambda r: [rn(r, 3, 4), np.array([0, 2, 2, 1])], ref=lambda x, i: np.take(x, i, 0),
         diff=(0,), second=True, torch=lambda T, x, i: x[i]),
     _mk("take", "axis1", lambda x, i: ops.take(x, i, axis=1),
         lambda r: [rn(r, 2, 3), np.array([2, 0, 2])], ref=lambda x, i: np.take(x, i, 1),
         diff=(0,), torch=lambda T, x, i: x[:, i]),
     _mk("take", "index_matrix", lambda x, i: ops.take(x, i, axis=0),
         lambda r: [rn(r, 4, 2), np.array([[0, 3], [3, 3]])], ref=lambda x, i: np.take(x, i, 0),
         diff=(0,), torch=lambda T, x, i: x[i]),
     _mk("take", "negative_index", lambda x, i: ops.take(x, i, axis=0),
         lambda r: [rn(r, 3), np.array([-1, 0, -3])], ref=lambda x, i: np.take(x, i, 0),
         diff=(0,), torch=lambda T, x, i: x[i]),
     _mk("take", "no_indices", lambda x, i: ops.take(x, i, axis=0),
         lambda r: [rn(r, 3, 2), np.zeros(0, np.int64)], ref=lambda x, i: np.take(x, i, 0),
         diff=(0,), torch=lambda T, x, i: x[i]),
     # ops.embedding is its own op (spec below); this case keeps its PyTorch answer
     _mk("take", "embedding_alias", lambda x, i: ops.take(x, i, axis=0),
         lambda r: [rn(r, 5, 2), np.array([4, 0, 4])], ref=lambda x, i: x[i], diff=(0,),
         torch=lambda T, x, i: T.nn.functional.embedding(i, x)))


def _take_grad_ref(g, idx, shape, axis):
    out = np.zeros(shape)
    np.add.at(np.moveaxis(out, axis, 0), idx, np.moveaxis(g, axis, 0))
    return out


spec("take_grad",
     _mk("take_grad", "repeats",
         lambda g, i: apply(get("take_grad"), g, i, shape=(3, 2), axis=0),
         lambda r: [rn(r, 4, 2), np.array([0, 2, 2, 0])],
         ref=lambda g, i: _take_grad_ref(g, i, (3, 2), 0), diff=(0,), second=True),
     _mk("take_grad", "axis1",
         lambda g, i: apply(get("take_grad"), g, i, shape=(2, 3), axis=1),
         lambda r: [rn(r, 2, 2), np.array([1, 1])],
         ref=lambda g, i: _take_grad_ref(g, i, (2, 3), 1), diff=(0,)))


def _tpad(pw, value=0.0):
    flat = [p for pair in reversed(pw) for p in pair]
    return lambda T, x: T.nn.functional.pad(x, flat, value=value)


spec("pad",
     _mk("pad", "basic", lambda x: ops.pad(x, ((1, 0), (2, 1))), lambda r: [rn(r, 2, 3)],
         ref=lambda x: np.pad(x, ((1, 0), (2, 1))), diff=(0,), second=True,
         torch=_tpad(((1, 0), (2, 1)))),
     _mk("pad", "value", lambda x: ops.pad(x, ((0, 2),), value=-1.5), lambda r: [rn(r, 3)],
         ref=lambda x: np.pad(x, ((0, 2),), constant_values=-1.5), diff=(0,),
         torch=_tpad(((0, 2),), -1.5)),
     _mk("pad", "int_width", lambda x: ops.pad(x, 1), lambda r: [rn(r, 1, 2)],
         ref=lambda x: np.pad(x, 1), diff=(0,), torch=_tpad(((1, 1), (1, 1)))),
     _mk("pad", "empty", lambda x: ops.pad(x, ((1, 1), (0, 0))), lambda r: [rn(r, 0, 2)],
         ref=lambda x: np.pad(x, ((1, 1), (0, 0))), diff=(0,), torch=_tpad(((1, 1), (0, 0)))))


def _mm(name, make, **kw):
    kw.setdefault("rtol", 10)
    return _mk("matmul", name, ops.matmul, make, ref=_quiet(np.matmul), torch=_T("matmul"),
               **kw)


_MM_SPECIAL = [np.array([[1.0, INF, 0.0], [NAN, 1.0, 2.0], [1e30, 1e30, 0.0]], F32),
               np.array([[1.0, 0.0], [0.0, 1.0], [2.0, -INF]], F32)]
spec("matmul",
     _mm("2d", lambda r: [rn(r, 3, 4), rn(r, 4, 5)], diff=(0, 1), second=True),
     _mm("batched", lambda r: [rn(r, 2, 3, 4), rn(r, 4, 2)], diff=(0, 1)),
     _mm("broadcast_batch", lambda r: [rn(r, 2, 1, 3, 4), rn(r, 3, 4, 2)], diff=(0, 1)),
     _mm("vector_matrix", lambda r: [rn(r, 3), rn(r, 3, 2)], diff=(0, 1)),
     _mm("matrix_vector", lambda r: [rn(r, 2, 3), rn(r, 3)], diff=(0, 1)),
     _mm("inner_zero", lambda r: [rn(r, 3, 0), rn(r, 0, 2)], diff=(0, 1)),
     _mm("empty_rows", lambda r: [rn(r, 0, 3), rn(r, 3, 2)], diff=(0, 1)),
     _mm("ones", lambda r: [rn(r, 1, 1), rn(r, 1, 1)], diff=(0, 1)),
     _mm("special_f32", _MM_SPECIAL),
     _mm("float32", lambda r: [rn(r, 5, 7).astype(F32), rn(r, 7, 3).astype(F32)], diff=(0, 1)),
     _mm("int64", [np.array([[1, -2], [3, 4]]), np.array([[5], [-6]])]))


def _smx(op, ref, tfn):
    R = _quiet(ref)
    sp = np.array([[1.0, INF, 2.0], [-INF, 0.0, 1.0], [-INF, -INF, -INF], [NAN, 1.0, 0.0],
                   [1e30, -1e30, 0.0], [88.0, 89.0, 90.0]], F32)
    f = getattr(ops, op)
    return [
        _mk(op, "axis1", lambda x: f(x, axis=1), lambda r: [rn(r, 3, 4)], ref=lambda x: R(x, 1),
            diff=(0,), second=True, torch=lambda T, x: tfn(T, x, 1), rtol=10),
        _mk(op, "axis0", lambda x: f(x, axis=0), lambda r: [rn(r, 3, 4)], ref=lambda x: R(x, 0),
            diff=(0,), torch=lambda T, x: tfn(T, x, 0), rtol=10),
        _mk(op, "default_axis", f, lambda r: [rn(r, 2, 2, 3)], ref=lambda x: R(x, -1),
            diff=(0,), torch=lambda T, x: tfn(T, x, -1), rtol=10),
        _mk(op, "one_wide", lambda x: f(x, axis=1), lambda r: [rn(r, 3, 1)],
            ref=lambda x: R(x, 1), diff=(0,), torch=lambda T, x: tfn(T, x, 1), rtol=10),
        _mk(op, "empty_outer", lambda x: f(x, axis=1), lambda r: [rn(r, 0, 3)],
            ref=lambda x: R(x, 1), diff=(0,), torch=lambda T, x: tfn(T, x, 1), rtol=10),
        _mk(op, "empty_axis", lambda x: f(x, axis=1), lambda r: [rn(r, 3, 0)],
            ref=lambda x: R(x, 1), diff=(0,), torch=lambda T, x: tfn(T, x, 1), rtol=10),
        _mk(op, "float32", lambda x: f(x, axis=1), lambda r: [rn(r, 3, 4).astype(F32)],
            ref=lambda x: R(x, 1), diff=(0,), torch=lambda T, x: tfn(T, x, 1), rtol=10),
        _mk(op, "special_f32", lambda x: f(x, axis=1), [sp], ref=lambda x: R(x, 1),
            torch=lambda T, x: tfn(T, x, 1), rtol=10),
    ]


spec("softmax", *_smx("softmax", softmax_ref, lambda T, x, a: T.softmax(x, a)))
spec("log_softmax", *_smx("log_softmax", log_softmax_ref, lambda T, x, a: T.log_softmax(x, a)))


def _t_one_hot(c):
    return lambda T, t: T.nn.functional.one_hot(t, c).float()


spec("one_hot",
     _mk("one_hot", "basic", lambda t: ops.one_hot(t, 4), [np.array([0, 3, 1, 3])],
         ref=lambda t: np.eye(4, dtype=F32)[t], torch=_t_one_hot(4)),
     _mk("one_hot", "matrix", lambda t: ops.one_hot(t, 3), [np.array([[0, 2], [1, 1]])],
         ref=lambda t: np.eye(3, dtype=F32)[t], torch=_t_one_hot(3)),
     _mk("one_hot", "empty", lambda t: ops.one_hot(t, 3), [np.zeros(0, np.int64)],
         ref=lambda t: np.eye(3, dtype=F32)[t], torch=_t_one_hot(3)),
     no_grad="integer labels in, constant one-hot out")


def _tce(T, x, t):
    return T.nn.functional.cross_entropy(x, t)


spec("cross_entropy",
     _mk("cross_entropy", "basic", ops.cross_entropy,
         lambda r: [rn(r, 3, 4), np.array([1, 0, 3])], ref=cross_entropy_ref, diff=(0,),
         second=True, torch=_tce, rtol=10),
     _mk("cross_entropy", "one_class", ops.cross_entropy,
         lambda r: [rn(r, 2, 1), np.array([0, 0])], ref=cross_entropy_ref, diff=(0,),
         torch=_tce, rtol=10),
     _mk("cross_entropy", "one_row", ops.cross_entropy,
         lambda r: [rn(r, 1, 3), np.array([2])], ref=cross_entropy_ref, diff=(0,),
         torch=_tce, rtol=10),
     _mk("cross_entropy", "float32", ops.cross_entropy,
         lambda r: [rn(r, 4, 3).astype(F32), np.array([2, 0, 1, 1])], ref=cross_entropy_ref,
         diff=(0,), torch=_tce, rtol=10),
     _mk("cross_entropy", "large_logits_f32", ops.cross_entropy,
         [np.array([[1e30, 0.0, -1e30], [50.0, 100.0, 0.0]], F32), np.array([0, 2])],
         ref=cross_entropy_ref, torch=_tce, rtol=10),
     _mk("cross_entropy", "minus_inf_logit", ops.cross_entropy,
         [np.array([[-INF, 0.0, 1.0], [2.0, -INF, 0.0]]), np.array([1, 0])],
         ref=cross_entropy_ref, torch=_tce, rtol=10),
     _mk("cross_entropy", "empty_batch", ops.cross_entropy,
         [np.zeros((0, 3)), np.zeros(0, np.int64)], ref=cross_entropy_ref, torch=_tce))
spec("cross_entropy_grad",
     _mk("cross_entropy_grad", "basic",
         lambda x, t: apply(get("cross_entropy_grad"), x, t),
         lambda r: [rn(r, 3, 4), np.array([1, 0, 3])],
         ref=lambda x, t: (softmax_ref(x, 1) - np.eye(x.shape[1])[t]) / x.shape[0], diff=(0,),
         second=True, rtol=10))

spec("mse_loss",
     _mk("mse_loss", "basic", ops.mse_loss, lambda r: [rn(r, 3, 4), rn(r, 3, 4)],
         ref=lambda p, t: np.mean((p - t) ** 2), diff=(0, 1), second=True,
         torch=lambda T, p, t: T.nn.functional.mse_loss(p, t), rtol=10),
     _mk("mse_loss", "scalars", ops.mse_loss, lambda r: [rn(r), rn(r)],
         ref=lambda p, t: (p - t) ** 2, diff=(0, 1),
         torch=lambda T, p, t: T.nn.functional.mse_loss(p, t), rtol=10),
     _mk("mse_loss", "empty_is_nan", ops.mse_loss, lambda r: [rn(r, 0), rn(r, 0)],
         ref=_quiet(lambda p, t: np.mean((p - t) ** 2)),
         torch=lambda T, p, t: T.nn.functional.mse_loss(p, t)),
     _mk("mse_loss", "special_f32", ops.mse_loss,
         [np.array([INF, 1.0, NAN, 1e30], F32), np.array([INF, -INF, 0.0, -1e30], F32)],
         ref=_quiet(lambda p, t: np.mean((p - t) ** 2)), rtol=10,
         torch=lambda T, p, t: T.nn.functional.mse_loss(p, t)))


def _pair(v):
    return (v, v) if np.isscalar(v) else tuple(v)


def _conv(name, xs, ws, stride=1, padding=0, dilation=1, groups=1, **kw):
    s, p, d = _pair(stride), _pair(padding), _pair(dilation)
    kw.setdefault("diff", (0, 1))
    return _mk("conv2d", name,
               lambda x, w: ops.conv2d(x, w, stride=stride, padding=padding, dilation=dilation,
                                       groups=groups),
               lambda r: [rn(r, *xs), rn(r, *ws)],
               ref=lambda x, w: conv2d_ref(x, w, s, p, d, groups),
               torch=lambda T, x, w: T.nn.functional.conv2d(x, w, stride=s, padding=p,
                                                            dilation=d, groups=groups),
               rtol=10, **kw)


spec("conv2d",
     _conv("stride2_pad1", (2, 2, 5, 5), (3, 2, 3, 3), 2, 1, second=True),
     _conv("kernel1x1", (1, 3, 2, 2), (2, 3, 1, 1)),
     _conv("rect", (1, 1, 4, 5), (2, 1, 2, 3), (2, 1), (0, 1)),
     _conv("padding_beyond_kernel", (1, 1, 2, 2), (1, 1, 2, 2), 1, 3),
     _conv("empty_batch", (0, 2, 3, 3), (1, 2, 2, 2)),
     _conv("kernel_is_input", (1, 1, 3, 3), (1, 1, 3, 3)),
     _conv("dilation2", (2, 2, 7, 6), (3, 2, 3, 3), 1, 2, dilation=2, second=True),
     _conv("dilation_rect_stride", (1, 2, 9, 8), (2, 2, 2, 3), (2, 1), (1, 0), dilation=(3, 2)),
     _conv("groups2", (2, 4, 5, 5), (6, 2, 3, 3), 1, 1, groups=2, second=True),
     _conv("depthwise", (2, 3, 6, 5), (3, 1, 3, 3), 2, 1, groups=3),
     _conv("depthwise_multiplier_dilated", (1, 2, 7, 7), (4, 1, 3, 3), 1, 2, dilation=2,
           groups=2),
     _mk("conv2d", "float32", lambda x, w: ops.conv2d(x, w, stride=1, padding=1),
         lambda r: [rn(r, 1, 2, 4, 4).astype(F32), rn(r, 2, 2, 3, 3).astype(F32)],
         ref=lambda x, w: conv2d_ref(x, w, (1, 1), (1, 1)), diff=(0, 1), rtol=10,
         torch=lambda T, x, w: T.nn.functional.conv2d(x, w, padding=1)),
     _mk("conv2d", "bias", lambda x, w, b: ops.conv2d(x, w, b, stride=1, padding=1),
         lambda r: [rn(r, 1, 2, 3, 3), rn(r, 2, 2, 2, 2), rn(r, 2)],
         ref=lambda x, w, b: conv2d_ref(x, w, (1, 1), (1, 1)) + b[:, None, None],
         diff=(0, 1, 2), rtol=10,
         torch=lambda T, x, w, b: T.nn.functional.conv2d(x, w, b, padding=1)),
     _mk("conv2d", "special_f32", lambda x, w: ops.conv2d(x, w, padding=1),
         [np.array([[[[1.0, NAN, 0.0, 1.0], [0.0, 1.0, INF, 0.0], [1e30, 1e30, 0.0, 0.0]]]],
                   F32), np.ones((1, 1, 2, 2), F32)],
         ref=_quiet(lambda x, w: conv2d_ref(x, w, (1, 1), (1, 1))), rtol=10,
         torch=lambda T, x, w: T.nn.functional.conv2d(x, w, padding=1)))


def _conv_extra(dilation, groups):
    """The dilation and groups attributes a conv2d node carries (only where not default)."""
    return {**({"dilation": dilation} if dilation != (1, 1) else {}),
            **({"groups": groups} if groups != 1 else {})}


for _name, _xs, _ws, _s, _p, _d, _g in (
        ("stride2_pad1", (1, 2, 5, 5), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1), 1),
        ("kernel1x1", (2, 1, 2, 3), (2, 1, 1, 1), (1, 1), (0, 0), (1, 1), 1),
        ("dilated_groups", (2, 4, 7, 6), (4, 2, 3, 2), (1, 2), (2, 1), (2, 1), 2)):
    _oh = (_xs[2] + 2 * _p[0] - _d[0] * (_ws[2] - 1) - 1) // _s[0] + 1
    _ow = (_xs[3] + 2 * _p[1] - _d[1] * (_ws[3] - 1) - 1) // _s[1] + 1
    _gs = (_xs[0], _ws[0], _oh, _ow)
    _ex = _conv_extra(_d, _g)
    SPECS.setdefault("conv2d_grad_input", OpSpec("conv2d_grad_input")).cases.append(_mk(
        "conv2d_grad_input", _name,
        lambda g, w, xs=_xs, s=_s, p=_p, ex=_ex: apply(get("conv2d_grad_input"), g, w,
                                                       x_shape=xs, stride=s, padding=p, **ex),
        lambda r, gs=_gs, ws=_ws: [rn(r, *gs), rn(r, *ws)],
        ref=lambda g, w, xs=_xs, s=_s, p=_p, d=_d, gr=_g: conv2d_grad_input_ref(g, w, xs, s, p,
                                                                              d, gr),
        diff=(0, 1), second=_name != "stride2_pad1", rtol=10))
    SPECS.setdefault("conv2d_grad_weight", OpSpec("conv2d_grad_weight")).cases.append(_mk(
        "conv2d_grad_weight", _name,
        lambda x, g, ws=_ws, s=_s, p=_p, ex=_ex: apply(get("conv2d_grad_weight"), x, g,
                                                       w_shape=ws, stride=s, padding=p, **ex),
        lambda r, gs=_gs, xs=_xs: [rn(r, *xs), rn(r, *gs)],
        ref=lambda x, g, ws=_ws, s=_s, p=_p, d=_d, gr=_g: conv2d_grad_weight_ref(x, g, ws, s, p,
                                                                               d, gr),
        diff=(0, 1), second=_name != "stride2_pad1", rtol=10))


def _pool(op, name, make, k, s=None, p=0, **kw):
    kk, ss, pp = _pair(k), _pair(k if s is None else s), _pair(p)
    ref = max_pool_ref if op == "max_pool2d" else avg_pool_ref
    tname = op
    return _mk(op, name, lambda x: getattr(ops, op)(x, k, s, p), make,
               ref=_quiet(lambda x: ref(x, kk, ss, pp)), rtol=10,
               torch=lambda T, x: getattr(T.nn.functional, tname)(x, kk, ss, pp), **kw)


_POOL_SPECIAL = [np.array([[[[1.0, NAN, 0.0, 2.0], [-INF, -INF, 3.0, INF],
                             [1e30, -1e30, 0.0, -0.0], [5.0, 1.0, -INF, -INF]]]], F32)]
spec("max_pool2d",
     _pool("max_pool2d", "k2s1p1", lambda r: [distinct(r, 1, 2, 4, 4)], 2, 1, 1, diff=(0,)),
     _pool("max_pool2d", "k3s2_odd", lambda r: [distinct(r, 2, 1, 5, 7)], 3, 2, diff=(0,)),
     _pool("max_pool2d", "default_stride", lambda r: [distinct(r, 1, 1, 4, 6)], 2, diff=(0,)),
     _pool("max_pool2d", "rect", lambda r: [distinct(r, 1, 1, 4, 5)], (2, 3), (1, 2), (1, 1),
           diff=(0,)),
     _pool("max_pool2d", "ties_first_wins", lambda r: [np.ones((1, 1, 3, 3))], 2, 1,
           diff=(0,), numeric=False),
     _pool("max_pool2d", "float32", lambda r: [distinct(r, 1, 2, 4, 4).astype(F32)], 2,
           diff=(0,)),
     _pool("max_pool2d", "empty_batch", lambda r: [rn(r, 0, 1, 4, 4)], 2, diff=(0,)),
     _pool("max_pool2d", "special_f32", _POOL_SPECIAL, 2, 1, 1))
spec("avg_pool2d",
     _pool("avg_pool2d", "k2p1", lambda r: [rn(r, 1, 2, 4, 5)], 2, None, 1, diff=(0,),
           second=True),
     _pool("avg_pool2d", "k3s2_odd", lambda r: [rn(r, 2, 1, 5, 7)], 3, 2, diff=(0,)),
     _pool("avg_pool2d", "rect", lambda r: [rn(r, 1, 1, 4, 5)], (2, 3), (1, 2), (1, 1),
           diff=(0,)),
     _pool("avg_pool2d", "empty_batch", lambda r: [rn(r, 0, 1, 4, 4)], 2, diff=(0,)),
     _pool("avg_pool2d", "special_f32", _POOL_SPECIAL, 2, 1, 1))

for _name, _xs, _k, _s, _p in (("k2s1p1", (1, 2, 4, 4), (2, 2), (1, 1), (1, 1)),
                                ("k3s2", (1, 1, 5, 5), (3, 3), (2, 2), (0, 0))):
    _oh = (_xs[2] + 2 * _p[0] - _k[0]) // _s[0] + 1
    _ow = (_xs[3] + 2 * _p[1] - _k[1]) // _s[1] + 1
    _ys = _xs[:2] + (_oh, _ow)
    _attrs = dict(kernel=_k, stride=_s, padding=_p)
    SPECS.setdefault("max_pool2d_select", OpSpec("max_pool2d_select")).cases.append(_mk(
        "max_pool2d_select", _name,
        lambda u, x, a=_attrs: apply(get("max_pool2d_select"), u, x, **a),
        lambda r, xs=_xs: [rn(r, *xs), distinct(r, *xs)],
        ref=lambda u, x, a=_attrs: max_pool_select_ref(u, x, a["kernel"], a["stride"],
                                                       a["padding"]),
        diff=(0,), second=True))
    SPECS.setdefault("max_pool2d_scatter", OpSpec("max_pool2d_scatter")).cases.append(_mk(
        "max_pool2d_scatter", _name,
        lambda g, x, a=_attrs: apply(get("max_pool2d_scatter"), g, x, **a),
        lambda r, xs=_xs, ys=_ys: [rn(r, *ys), distinct(r, *xs)],
        ref=lambda g, x, a=_attrs: max_pool_scatter_ref(g, x, a["kernel"], a["stride"],
                                                        a["padding"]),
        diff=(0,), second=True))
    SPECS.setdefault("avg_pool2d_grad", OpSpec("avg_pool2d_grad")).cases.append(_mk(
        "avg_pool2d_grad", _name,
        lambda g, xs=_xs, a=_attrs: apply(get("avg_pool2d_grad"), g, x_shape=xs, **a),
        lambda r, ys=_ys: [rn(r, *ys)],
        ref=lambda g, xs=_xs, a=_attrs: avg_pool_grad_ref(g, xs, a["kernel"], a["stride"],
                                                          a["padding"]),
        diff=(0,), second=True, rtol=10))

spec("relu_grad",
     _mk("relu_grad", "basic", lambda g, x: apply(get("relu_grad"), g, x),
         lambda r: [rn(r, 3, 4), away(r, 3, 4)], ref=lambda g, x: np.where(x > 0, g, 0.0),
         diff=(0,), second=True),
     _mk("relu_grad", "special_f32", lambda g, x: apply(get("relu_grad"), g, x),
         special(F32, binary=True), ref=lambda g, x: np.where(x > 0, g, 0.0), ulps=0))


def _copy_fn(x):
    return apply(get("copy"), x, src="cpu", dst="cpu")


spec("copy",
     _mk("copy", "basic", _copy_fn, lambda r: [rn(r, 2, 3)], ref=lambda x: x, diff=(0,),
         second=True),
     _mk("copy", "special_f32", _copy_fn, special(F32), ref=lambda x: x, ulps=0))


def _cond_fn(p, x):
    return ops.cond(p, lambda a: a * a + 1.0, lambda a: ops.sin(a) * 2.0, x)


spec("cond",
     _mk("cond", "true", _cond_fn, lambda r: [np.array(True), rn(r, 3)],
         ref=lambda p, x: x * x + 1.0, diff=(1,), second=True),
     _mk("cond", "false", _cond_fn, lambda r: [np.array(False), rn(r, 2, 2)],
         ref=lambda p, x: np.sin(x) * 2.0, diff=(1,), second=True))

_BACKEND = "inference-only op made by a backend pass; vjp=None by design"
spec("conv2d_nhwc",
     _mk("conv2d_nhwc", "stride2_pad1",
         lambda x, w: apply(get("conv2d_nhwc"), x, w, stride=(2, 2), padding=(1, 1)),
         lambda r: [rn(r, 1, 5, 5, 2), rn(r, 3, 3, 2, 3)],
         ref=nhwc(lambda x, w: conv2d_ref(x, w, (2, 2), (1, 1))), rtol=10),
     no_grad=_BACKEND)
spec("max_pool2d_nhwc",
     _mk("max_pool2d_nhwc", "k2s1p1",
         lambda x: apply(get("max_pool2d_nhwc"), x, kernel=(2, 2), stride=(1, 1),
                         padding=(1, 1)),
         lambda r: [rn(r, 1, 4, 4, 2)],
         ref=nhwc(lambda x: max_pool_ref(x, (2, 2), (1, 1), (1, 1)))),
     no_grad=_BACKEND)
spec("avg_pool2d_nhwc",
     _mk("avg_pool2d_nhwc", "k2s2",
         lambda x: apply(get("avg_pool2d_nhwc"), x, kernel=(2, 2), stride=(2, 2),
                         padding=(0, 0)),
         lambda r: [rn(r, 1, 4, 4, 2)],
         ref=nhwc(lambda x: avg_pool_ref(x, (2, 2), (2, 2), (0, 0))), rtol=10),
     no_grad=_BACKEND)
spec("fused_linear",
     _mk("fused_linear", "relu",
         lambda a, w, b: apply(get("fused_linear"), a, w, b, activation="relu"),
         lambda r: [rn(r, 3, 4), rn(r, 4, 2), rn(r, 2)],
         ref=lambda a, w, b: np.maximum(a @ w + b, 0.0), rtol=10),
     _mk("fused_linear", "no_activation",
         lambda a, w, b: apply(get("fused_linear"), a, w, b, activation=None),
         lambda r: [rn(r, 2, 3), rn(r, 3, 2), rn(r, 2)], ref=lambda a, w, b: a @ w + b,
         rtol=10),
     no_grad=_BACKEND)
spec("fused_conv",
     _mk("fused_conv", "relu",
         lambda x, w, b: apply(get("fused_conv"), x, w, b, activation="relu", stride=(1, 1),
                               padding=(1, 1)),
         lambda r: [rn(r, 1, 2, 3, 3), rn(r, 2, 2, 2, 2), rn(r, 1, 2, 1, 1)],
         ref=lambda x, w, b: np.maximum(conv2d_ref(x, w, (1, 1), (1, 1)) + b, 0.0), rtol=10),
     no_grad=_BACKEND)
spec("gemm",
     _mk("gemm", "alpha_beta",
         lambda c, a, b: apply(get("gemm"), c, a, b, alpha=-0.5, beta=2.0),
         lambda r: [rn(r, 3, 2), rn(r, 3, 4), rn(r, 4, 2)],
         ref=lambda c, a, b: 2.0 * c - 0.5 * (a @ b), rtol=10),
     no_grad=_BACKEND)
spec("sum_accumulate",
     _mk("sum_accumulate", "alpha_beta",
         lambda c, x: apply(get("sum_accumulate"), c, x, alpha=0.1, beta=1.0),
         lambda r: [rn(r, 3), rn(r, 4, 3)], ref=lambda c, x: c + 0.1 * x.sum(0), rtol=10),
     no_grad=_BACKEND)

_PROGRAMS = {  # fused programs: relu(x * a + b); tanh(x) * 3; sigmoid(x) * k; log(sigmoid(x))
    "mul_add_relu": (("mul", (0, 1)), ("add", (3, 2)), ("relu", (4,))),
    "tanh_times": (("tanh", (0,)), ("mul", (2, 1))),
    "sigmoid_times": (("sigmoid", (0,)), ("mul", (2, 1))),
    "log_sigmoid": (("sigmoid", (0,)), ("log", (1,))),
}


def _run_program_ref(program, dt, *xs):
    """Each step exact in float64, then rounded to ``dt``, as the unfused ops round."""
    env = [f64(x) for x in xs]
    table = {"mul": np.multiply, "add": np.add, "relu": relu_ref, "tanh": np.tanh,
             "sigmoid": sigmoid_ref, "log": np.log}
    for op, args in program:
        env.append(table[op](*[env[i] for i in args]).astype(dt).astype(np.float64))
    return env[-1]


def _fused(program_name, inputs, name=None):
    program = _PROGRAMS[program_name]
    case = _mk("fused_elementwise", name or program_name,
               lambda *xs: apply(get("fused_elementwise"), *xs, program=program), inputs, ulps=4)
    dt = np.result_type(*case.inputs)
    case.ref = _quiet(lambda *xs: _run_program_ref(program, dt, *xs))
    return case


spec("fused_elementwise",
     _fused("mul_add_relu", lambda r: [rn(r, 3, 4), rn(r, 4), rn(r, 3, 1)]),
     _fused("tanh_times", [SPECIAL[F32], np.array(3.0, F32)]),
     _fused("sigmoid_times", [SPECIAL[F32], np.array(1e9, F32)]),
     _fused("log_sigmoid", [SPECIAL[F32]]),
     _fused("tanh_times", [SPECIAL[F64], np.array(-3.0)], name="tanh_times_f64"),
     no_grad=_BACKEND)

#: Dropout is random: its cases are property checks (see :func:`check_dropout`).
spec("dropout", untestable="random: checked by check_dropout (mask properties on every path) "
                           "and by the compiled-vs-eager differential test")
spec("rng_seed", untestable="random, no inputs: checked for fresh and reproducible draws by "
                            "test_conformance.py and the compiled-vs-eager differential test",
     no_grad="integer seed output")



# --- attention (mlsys_lab/engine/ops_attention.py) ---------------------------------------------
def sdpa_ref(q, k, v, mask=None, is_causal=False, scale=None, gqa=False):
    """Attention row by row in float64, written apart from the library: the keys that take part
    (a bool mask's True, a finite additive bias, j <= i when causal), a softmax over them, the
    weighted values; a row where none takes part is zero (PyTorch's answer since 2.5)."""
    q, k, v = f64(q), f64(k), f64(v)
    if gqa:
        rep = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, rep, axis=-3), np.repeat(v, rep, axis=-3)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    q = np.broadcast_to(q, batch + q.shape[-2:])
    k = np.broadcast_to(k, batch + k.shape[-2:])
    v = np.broadcast_to(v, batch + v.shape[-2:])
    if mask is None:
        bias = np.zeros((L, S))
    elif mask.dtype == bool:
        bias = np.where(mask, 0.0, -INF)
    else:
        bias = f64(mask)
    bias = np.broadcast_to(bias, batch + (L, S))
    out = np.zeros(batch + (L, v.shape[-1]))
    for b in np.ndindex(*batch):
        for i in range(L):
            take = [j for j in range(S) if bias[b + (i, j)] != -INF and (not is_causal or j <= i)]
            if not take:
                continue
            s = np.array([scale * np.dot(q[b + (i,)], k[b + (j,)]) + bias[b + (i, j)]
                          for j in take])
            w = np.exp(s - s.max())
            out[b + (i,)] = (w / w.sum()) @ v[b][take]
    return out


def _sdpa(name, shapes, mask=None, diff=(0, 1, 2), dtype=F64, **kw):
    """A case of ml.ops.scaled_dot_product_attention: ``shapes`` of q, k, v; ``mask`` makes
    the mask from the rng (or None); the op's keywords (is_causal, scale, enable_gqa) in kw."""
    attrs = {a: kw.pop(a) for a in ("is_causal", "scale", "enable_gqa") if a in kw}

    def make(r):
        arrays = [rn(r, *s).astype(dtype) for s in shapes]
        return arrays + ([mask(r)] if mask is not None else [])

    def fn(q, k, v, *m):
        return ops.scaled_dot_product_attention(q, k, v, *m, **attrs)

    def ref(q, k, v, *m):
        return sdpa_ref(q, k, v, m[0] if m else None, attrs.get("is_causal", False),
                        attrs.get("scale"), attrs.get("enable_gqa", False))

    def tfn(T, q, k, v, *m):
        return T.nn.functional.scaled_dot_product_attention(q, k, v, *m, **attrs)

    return _mk(OP_SDPA, name, fn, make, ref=ref, diff=diff, torch=tfn, rtol=kw.pop("rtol", 20),
               **kw)


OP_SDPA = "scaled_dot_product_attention"


def _bool_mask(shape, dead_row=1):
    """A random bool mask of ``shape`` (L, S) whose row ``dead_row`` is fully masked."""
    def make(r):
        m = r.random(shape) > 0.4
        m[..., :, 0] |= True  # every other row keeps a key
        if dead_row is not None:
            m[..., dead_row, :] = False
        return m
    return make


def _additive_mask(shape, dtype=F64):
    """A float mask: random biases, some -inf, row 0 all -inf (fully masked)."""
    def make(r):
        m = r.standard_normal(shape)
        m[r.random(shape) < 0.3] = -INF
        m[..., :, 1] = 0.5
        m[..., 0, :] = -INF
        return m.astype(dtype)
    return make


spec(OP_SDPA,
     _sdpa("basic", [(2, 3, 4), (2, 5, 4), (2, 5, 3)], second=True),
     _sdpa("heads_float32", [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)], dtype=F32),
     _sdpa("bool_mask_dead_row", [(1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2)],
           mask=_bool_mask((4, 5)), second=True),
     _sdpa("bool_mask_per_head_f32", [(2, 4, 3), (2, 5, 3), (2, 5, 2)],
           mask=_bool_mask((2, 4, 5), dead_row=3), dtype=F32),
     _sdpa("additive_mask", [(2, 4, 3), (2, 5, 3), (2, 5, 2)], mask=_additive_mask((4, 5)),
           diff=(0, 1, 2, 3), second=True),
     _sdpa("additive_mask_f32", [(1, 3, 4, 3), (1, 3, 5, 3), (1, 3, 5, 2)],
           mask=_additive_mask((3, 1, 5), F32), diff=(0, 1, 2, 3), dtype=F32),
     _sdpa("causal_short_queries", [(2, 3, 4), (2, 5, 4), (2, 5, 3)], is_causal=True,
           second=True),
     _sdpa("causal_long_queries", [(1, 5, 3), (1, 3, 3), (1, 3, 4)], is_causal=True),
     _sdpa("causal_f32", [(2, 2, 6, 4), (2, 2, 6, 4), (2, 2, 6, 4)], is_causal=True,
           dtype=F32),
     _sdpa("scale", [(2, 3, 4), (2, 5, 4), (2, 5, 3)], scale=0.9),
     _sdpa("broadcast_batch", [(2, 3, 3, 2), (1, 3, 4, 2), (2, 1, 4, 2)]),
     _sdpa("gqa", [(1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3)], enable_gqa=True, second=True),
     _sdpa("gqa_causal_f32", [(2, 6, 4, 3), (2, 2, 4, 3), (2, 2, 4, 3)], enable_gqa=True,
           is_causal=True, dtype=F32),
     _sdpa("single_key", [(2, 3, 4), (2, 1, 4), (2, 1, 3)]),
     _sdpa("no_keys", [(2, 3, 4), (2, 0, 4), (2, 0, 3)]),
     _sdpa("no_queries", [(2, 0, 4), (2, 5, 4), (2, 5, 3)]),
     _sdpa("matrices", [(3, 4), (5, 4), (5, 2)]))



def _sdpa_weights_ref(q, k, mask, is_causal, scale, gqa):
    """The attention weights row by row in float64 (zero rows where no key takes part), with
    q, k broadcast to the output's batch and k's heads repeated."""
    q, k = f64(q), f64(k)
    if gqa:
        k = np.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
    L, S = q.shape[-2], k.shape[-2]
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    if mask is not None:
        batch = np.broadcast_shapes(batch, mask.shape[:-2])
    bias = np.zeros((L, S)) if mask is None else (
        np.where(mask, 0.0, -INF) if mask.dtype == bool else f64(mask))
    if is_causal:
        bias = bias + np.where(np.tril(np.ones((L, S))) > 0, 0.0, -INF)
    s = scale * (np.broadcast_to(q, batch + q.shape[-2:]) @
                 np.swapaxes(np.broadcast_to(k, batch + k.shape[-2:]), -1, -2)) + bias
    p = np.zeros(s.shape)
    for idx in np.ndindex(*s.shape[:-1]):
        row = s[idx]
        take = row != -INF
        if take.any():
            w = np.exp(row[take] - row[take].max())
            p[idx][take] = w / w.sum()
    return p


def _sum_back(d, shape, gqa):
    if gqa:
        h = shape[-3]
        d = d.reshape(d.shape[:-3] + (h, d.shape[-3] // h) + d.shape[-2:]).sum(-3)
    d = d.sum(axis=tuple(range(d.ndim - len(shape)))) if d.ndim > len(shape) else d
    return d.sum(axis=tuple(i for i, n in enumerate(shape) if n == 1), keepdims=True)


def sdpa_grad_ref(g, q, k, v, mask=None, is_causal=False, scale=None, gqa=False):
    """d<g, attention>/d(q, k, v) packed into one vector (float64, by the textbook formulas
    on the weights of :func:`_sdpa_weights_ref`)."""
    g, q, k, v = f64(g), f64(q), f64(k), f64(v)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    p = _sdpa_weights_ref(q, k, mask, is_causal, scale, gqa)
    rep = q.shape[-3] // k.shape[-3] if gqa else 1
    kk = np.repeat(k, rep, axis=-3) if gqa else k
    vv = np.repeat(v, rep, axis=-3) if gqa else v
    dp = g @ np.swapaxes(vv, -1, -2)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    dq, dk = scale * ds @ kk, scale * np.swapaxes(ds, -1, -2) @ q
    dv = np.swapaxes(p, -1, -2) @ g
    parts = [_sum_back(dq, q.shape, False), _sum_back(dk, k.shape, gqa),
             _sum_back(dv, v.shape, gqa)]
    return np.concatenate([a.reshape(-1) for a in parts])


def _sdpa_grad(name, shapes, mask=None, diff=None, dtype=F64, **kw):
    """A case of the packed gradient op: ``shapes`` of g, q, k, v."""
    attrs = {a: kw.pop(a) for a in ("is_causal", "scale", "enable_gqa") if a in kw}
    e = shapes[1][-1]
    full = dict(is_causal=False, scale=1.0 / np.sqrt(e), enable_gqa=False) | attrs

    def make(r):
        return [rn(r, *s).astype(dtype) for s in shapes] + ([mask(r)] if mask else [])

    def fn(*xs):
        return apply(get(OP_SDPA + "_grad"), *xs, **full)

    def ref(g, q, k, v, *m):
        return sdpa_grad_ref(g, q, k, v, m[0] if m else None, full["is_causal"],
                             full["scale"], full["enable_gqa"])

    n = 4 + (mask is not None)
    return _mk(OP_SDPA + "_grad", name, fn, make, ref=ref,
               diff=tuple(range(n)) if diff is None else diff, rtol=kw.pop("rtol", 50), **kw)


spec(OP_SDPA + "_grad",
     _sdpa_grad("basic", [(2, 3, 2), (2, 3, 4), (2, 4, 4), (2, 4, 2)], second=True),
     _sdpa_grad("bool_mask_dead_row", [(1, 2, 4, 2), (1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2)],
                mask=_bool_mask((4, 5)), diff=(0, 1, 2, 3)),
     _sdpa_grad("additive_mask", [(2, 4, 2), (2, 4, 3), (2, 5, 3), (2, 5, 2)],
                mask=_additive_mask((4, 5)), second=True),
     _sdpa_grad("causal_gqa_f32", [(1, 4, 3, 2), (1, 4, 3, 2), (1, 2, 3, 2), (1, 2, 3, 2)],
                is_causal=True, enable_gqa=True, dtype=F32),
     _sdpa_grad("broadcast_batch", [(2, 2, 3, 2), (2, 2, 3, 2), (1, 2, 4, 2), (2, 1, 4, 2)],
                scale=0.8),
     _sdpa_grad("no_keys", [(2, 3, 2), (2, 3, 4), (2, 0, 4), (2, 0, 2)]))


# --- deployment: quantisation ops (mlsys_lab.deploy.quant and quant.int8_kernels) ----------------

U8, I32 = np.dtype(np.uint8), np.dtype(np.int32)
_INT8_OPS = "integer (quantised) result: QAT differentiates fake_quant (straight-through) instead"


def _q_ref(x, s, z, axis=1):
    """ONNX QuantizeLinear in the inputs' float32 arithmetic: saturate(rint(x / s) + z)."""
    shape = [1] * x.ndim
    if np.ndim(s):
        shape[axis] = -1
    q = np.rint(x.astype(F32) / s.astype(F32).reshape(shape)) + z.reshape(shape)
    return np.clip(q, 0, 255).astype(U8)


def _dq_ref(q, s, z, axis=1):
    shape = [1] * q.ndim
    if np.ndim(s):
        shape[axis] = -1
    return (q.astype(np.float64) - z.reshape(shape)) * s.reshape(shape)


def _u8(r, *shape):
    return r.integers(0, 256, shape).astype(U8)


spec("quantize_linear",
     _mk("quantize_linear", "per_tensor", _quant.quantize_linear,
         lambda r: [rn(r, 3, 4).astype(F32), np.array(0.02, F32), np.array(128, U8)],
         ref=_q_ref, out_dtype=U8),
     _mk("quantize_linear", "per_axis",
         lambda x, s, z: _quant.quantize_linear(x, s, z, axis=1),
         lambda r: [rn(r, 2, 3, 4).astype(F32), r.uniform(0.005, 0.02, 3).astype(F32),
                    _u8(r, 3)],
         ref=lambda x, s, z: _q_ref(x, s, z, 1), out_dtype=U8),
     no_grad=_INT8_OPS)
spec("dequantize_linear",
     _mk("dequantize_linear", "per_tensor", _quant.dequantize_linear,
         lambda r: [_u8(r, 3, 4), np.array(0.02, F32), np.array(128, U8)],
         ref=_dq_ref, ulps=1),
     _mk("dequantize_linear", "int32_bias_per_axis",
         lambda q, s, z: _quant.dequantize_linear(q, s, z, axis=0),
         lambda r: [r.integers(-5000, 5000, 5).astype(I32), r.uniform(1e-4, 1e-3, 5).astype(F32),
                    np.zeros(5, I32)],
         ref=lambda q, s, z: _dq_ref(q, s, z, 0), ulps=1),
     no_grad=_INT8_OPS)


def _fq(**attrs):
    return lambda x: apply(get("fake_quant"), x, **attrs)


def _fq_ref(x, scale, zero_point, qmin, qmax, axis=None):
    s, z = np.asarray(scale, np.float64), np.asarray(zero_point, np.float64)
    if s.ndim:
        shape = [1] * x.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (np.clip(np.rint(x / s) + z, qmin, qmax) - z) * s


# Power-of-two scales: PyTorch keeps a fake-quant scale in float32, so only then are its
# forward answers for float64 inputs ours exactly.
_FQ_T = dict(scale=0.125, zero_point=3, qmin=-8, qmax=7)
_FQ_C = dict(scale=(0.0625, 0.125, 0.25), zero_point=(0, -2, 1), qmin=-8, qmax=7, axis=1)
spec("fake_quant",  # the straight-through gradient is not the staircase's: PyTorch's rule
     _mk("fake_quant", "per_tensor", _fq(**_FQ_T), lambda r: [rn(r, 4, 5)],
         ref=lambda x: _fq_ref(x, **_FQ_T), diff=(0,), numeric=False, ulps=1,
         torch=lambda T, x: T.fake_quantize_per_tensor_affine(x, 0.125, 3, -8, 7)),
     _mk("fake_quant", "per_channel", _fq(**_FQ_C), lambda r: [rn(r, 2, 3, 4)],
         ref=lambda x: _fq_ref(x, **_FQ_C), diff=(0,), numeric=False, ulps=1,
         torch=lambda T, x: T.fake_quantize_per_channel_affine(
             x, T.tensor(_FQ_C["scale"], dtype=T.float32), T.tensor(_FQ_C["zero_point"],
                                                                 dtype=T.int32), 1, -8, 7)),
     _mk("fake_quant", "float32", _fq(**_FQ_T), lambda r: [rn(r, 3, 4).astype(F32)],
         ref=lambda x: _fq_ref(x.astype(F32), **_FQ_T), ulps=1))


def _qlinear_ref(x, xs, xz, w, ws, wz, ys, yz, b, conv=None, relu=False):
    """Integer arithmetic in float64 (exact at these sizes), then requantisation with the
    multiplier s_x s_w / s_y computed once, as the kernels do."""
    xi, wi = x.astype(np.float64) - xz, w.astype(np.float64)
    if conv is None:
        acc = xi @ (wi - wz) + b
        mult = np.float64(xs) * ws.astype(np.float64) / np.float64(ys)
    else:
        acc = conv2d_ref(xi, wi - wz.reshape(-1, 1, 1, 1), *conv) + b.reshape(1, -1, 1, 1)
        mult = (np.float64(xs) * ws.astype(np.float64) / np.float64(ys)).reshape(1, -1, 1, 1)
    v = np.rint(acc * mult) + yz
    return np.clip(v, int(yz) if relu else 0, 255).astype(U8)


def _qmm_inputs(r):
    return [_u8(r, 3, 4), np.array(0.02, F32), np.array(10, U8), _u8(r, 4, 2),
            r.uniform(0.005, 0.01, 2).astype(F32), np.array([128, 120], U8), np.array(0.3, F32),
            np.array(100, U8), r.integers(-300, 300, 2).astype(I32)]


def _qconv_inputs(r):
    return [_u8(r, 1, 2, 5, 5), np.array(0.02, F32), np.array(10, U8), _u8(r, 3, 2, 3, 3),
            r.uniform(0.005, 0.01, 3).astype(F32), np.array([128, 120, 130], U8),
            np.array(0.4, F32), np.array(90, U8), r.integers(-300, 300, 3).astype(I32)]


_QCONV = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 1), groups=1)
spec("qlinear_matmul",
     _mk("qlinear_matmul", "relu",
         lambda *xs: apply(get("qlinear_matmul"), *xs, activation="relu"), _qmm_inputs,
         ref=lambda *xs: _qlinear_ref(*xs, relu=True), out_dtype=U8),
     _mk("qlinear_matmul", "no_activation",
         lambda *xs: apply(get("qlinear_matmul"), *xs, activation=None), _qmm_inputs,
         ref=lambda *xs: _qlinear_ref(*xs), out_dtype=U8),
     no_grad=_BACKEND)
spec("qlinear_conv",
     _mk("qlinear_conv", "stride_pad_relu",
         lambda *xs: apply(get("qlinear_conv"), *xs, activation="relu", **_QCONV), _qconv_inputs,
         ref=lambda *xs: _qlinear_ref(*xs, conv=((2, 1), (1, 1)), relu=True), out_dtype=U8),
     no_grad=_BACKEND)


# --- composites (public functions made of several ops; not registry entries) --------------------
def _ln_ref(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _bn_ref(x, m, v, w, b):
    c = (slice(None), None, None)
    return (x - m[c]) / np.sqrt(v[c] + 1e-5) * w[c] + b[c]


COMPOSITES = [
    _mk("layer_norm", "basic", ops.layer_norm, lambda r: [rn(r, 3, 5), rn(r, 5), rn(r, 5)],
        ref=_ln_ref, diff=(0, 1, 2), second=True, rtol=100,
        torch=lambda T, x, w, b: T.nn.functional.layer_norm(x, (5,), w, b, 1e-5)),
    _mk("batch_norm", "basic", ops.batch_norm,
        lambda r: [rn(r, 2, 3, 2, 2), rn(r, 3), pos(r, 3), rn(r, 3), rn(r, 3)],
        ref=_bn_ref, diff=(0, 3, 4), rtol=100,
        torch=lambda T, x, m, v, w, b: T.nn.functional.batch_norm(x, m, v, w, b, False, 0.0,
                                                                    1e-5)),
    _mk("batch_norm", "statistics_gradient", ops.batch_norm,
        lambda r: [rn(r, 2, 3, 2, 2), rn(r, 3), pos(r, 3), rn(r, 3), rn(r, 3)],
        ref=_bn_ref, diff=(1, 2), rtol=100),
]


def all_cases():
    """Every case of every spec, then the composites."""
    return [c for s in SPECS.values() for c in s.cases] + COMPOSITES


# --- evaluation ----------------------------------------------------------------------------------
def tensors(arrays, requires_grad=()):
    return [ml.tensor(a, requires_grad=i in requires_grad) for i, a in enumerate(arrays)]


def to_numpy(t):
    """A Tensor (or number/array) as a numpy array — the documented exit from the tape."""
    return np.asarray(t.numpy() if isinstance(t, ml.Tensor) else t)


def eager(case, arrays=None):
    """The case's output, computed eagerly on ``arrays`` (default: its inputs)."""
    return to_numpy(case.fn(*tensors(case.inputs if arrays is None else arrays)))


def reference(case, arrays=None):
    """The float64 reference output (None when the case has no formula)."""
    if case.ref is None:
        return None
    with np.errstate(all="ignore"):
        return np.asarray(case.ref(*[f64(a) for a in (case.inputs if arrays is None
                                                      else arrays)]))


def expected_dtype(case):
    if case.out_dtype is not None:
        return np.dtype(case.out_dtype)
    for a in case.inputs:
        if a.dtype.kind == "f":
            return a.dtype
    return reference(case).dtype


def cotangent(case, shape):
    """A fixed random cotangent of ``shape`` for the case (float64)."""
    return np.random.default_rng(case.seed(1)).standard_normal(shape)


def tangents(case):
    """Fixed random tangents, one per differentiable input."""
    rng = np.random.default_rng(case.seed(2))
    return [rng.standard_normal(case.inputs[i].shape) for i in case.diff]


def out_shape(case):
    ref = reference(case)
    return ref.shape if ref is not None else eager(case).shape


def _with(case, d):
    """The full argument list with the differentiable positions replaced by ``d``."""
    full = list(case.inputs)
    for i, a in zip(case.diff, d):
        full[i] = a
    return full


def _as_tensors(args):
    return [a if isinstance(a, ml.Tensor) else ml.tensor(a) for a in args]


def scalar_fn(case, u):
    """``f(*xs) = sum(fn(*xs) * u)``: the scalar whose gradient is the VJP with ``u``."""
    ut = ml.tensor(u)

    def f(*xs):
        return ops.sum(ops.mul(case.fn(*xs), ut))
    return f


def compiled_forward(case, arrays=None, compiled=None):
    """Output of ``ml.compile(case.fn)`` (compiled once on the case's inputs)."""
    c = compiled or ml.compile(case.fn, *case.inputs)
    return np.asarray(c(*(case.inputs if arrays is None else arrays))), c


def fused_forward(case):
    """``fn(*x) * one`` compiled: elementwise fusion makes one generated kernel run ``fn``."""
    one = np.ones((), case.inputs[0].dtype)
    c = ml.compile(lambda *xs: ops.mul(case.fn(*xs[:-1]), xs[-1]), *case.inputs, one)
    return np.asarray(c(*case.inputs, one)), c


# Each gradient path returns the list of gradients of sum(fn(*x) * u) for the inputs in diff.
def grad_tape(case, u, arrays=None):
    ts = tensors(case.inputs if arrays is None else arrays, case.diff)
    y = case.fn(*ts)
    ops.sum(ops.mul(y, ml.tensor(u))).backward()
    return [to_numpy(ts[i].grad) if ts[i].grad is not None else np.zeros(ts[i].shape, ts[i].dtype)
            for i in case.diff]


def grad_functional(case, u):
    gs = ml.grad(scalar_fn(case, u), argnums=tuple(case.diff))(*case.inputs)
    return [to_numpy(g) for g in gs]


def grad_vjp(case, u):
    _, vjp_fn = ml.vjp(lambda *d: case.fn(*_as_tensors(_with(case, d))),
                       *[case.inputs[i] for i in case.diff])
    return [to_numpy(g) for g in vjp_fn(u)]


def grad_graph(case, u):
    g = ml.trace(scalar_fn(case, u), *case.inputs)
    gg = ml.grad_graph(g, wrt=list(case.diff)).lint()
    _, *grads = gg(*case.inputs)
    return [to_numpy(x) for x in grads]


def grad_compiled(case, u, device="cpu"):
    c = ml.compile(ml.grad(scalar_fn(case, u), argnums=tuple(case.diff)), *case.inputs,
                   device=device)
    out = c(*case.inputs)
    return [np.asarray(x) for x in (out if isinstance(out, (tuple, list)) else (out,))]


GRAD_PATHS = {"tape": grad_tape, "grad": grad_functional, "vjp": grad_vjp,
              "grad_graph": grad_graph, "compiled": grad_compiled}


def jvp_forward(case, vs):
    """``J @ vs`` by forward mode (``ml.jvp``)."""
    _, tan = ml.jvp(lambda *d: case.fn(*_as_tensors(_with(case, d))),
                    [case.inputs[i] for i in case.diff], vs)
    return to_numpy(tan)


def _numeric_fn(case):
    if case.ref is not None:
        return lambda args: np.asarray(case.ref(*[f64(a) for a in args]), np.float64)
    return lambda args: eager(case, args).astype(np.float64)


def numeric_vjp(case, u):
    """Central-difference gradients of sum(F(x) * u), F the reference (else the eager op)."""
    f, out = _numeric_fn(case), []
    for i in case.diff:
        g = np.zeros(case.inputs[i].shape)
        for idx in np.ndindex(*g.shape):
            plus, minus = list(case.inputs), list(case.inputs)
            plus[i], minus[i] = f64(plus[i]).copy(), f64(minus[i]).copy()
            plus[i][idx] += case.eps
            minus[i][idx] -= case.eps
            g[idx] = (np.sum(f(plus) * u) - np.sum(f(minus) * u)) / (2 * case.eps)
        out.append(g)
    return out


def numeric_jvp(case, vs):
    f = _numeric_fn(case)
    plus = _with(case, [f64(case.inputs[i]) + case.eps * v for i, v in zip(case.diff, vs)])
    minus = _with(case, [f64(case.inputs[i]) - case.eps * v for i, v in zip(case.diff, vs)])
    return (f(plus) - f(minus)) / (2 * case.eps)


def second_order(case, u, w, how="grad"):
    """The gradient of ``h(x) = sum_i <grad_i f(x), w_i>`` (a Hessian-vector product), by
    ``ml.grad`` of ``ml.grad`` (``how="grad"``), by the tape with ``create_graph=True``
    (``"tape"``), or forward over reverse: ``ml.hvp``, a jvp of the gradient (``"hvp"``)."""
    f = scalar_fn(case, u)
    nums = tuple(range(len(case.diff)))
    if how == "hvp":
        hv = ml.hvp(lambda *d: f(*_as_tensors(_with(case, d))),
                    [case.inputs[i] for i in case.diff], w)
        return [to_numpy(x) for x in hv]

    def grads(*d):
        gs = ml.grad(lambda *dd: f(*_as_tensors(_with(case, dd))), argnums=nums)(*d)
        return gs

    if how == "grad":
        def h(*d):
            return sum(ops.sum(ops.mul(g, ml.tensor(wi))) for g, wi in zip(grads(*d), w))
        return [to_numpy(x) for x in ml.grad(h, argnums=nums)(*[case.inputs[i]
                                                                for i in case.diff])]
    ts = tensors(case.inputs, case.diff)
    ops.sum(ops.mul(case.fn(*ts), ml.tensor(u))).backward(create_graph=True)
    first = [ts[i].grad for i in case.diff]
    for i in case.diff:
        ts[i].grad = None
    h = sum(ops.sum(ops.mul(g, ml.tensor(wi))) for g, wi in zip(first, w))
    if not h.requires_grad:  # the gradient does not depend on x (PyTorch raises here too)
        return [np.zeros(case.inputs[i].shape) for i in case.diff]
    h.backward()
    return [to_numpy(ts[i].grad) if ts[i].grad is not None else np.zeros(ts[i].shape)
            for i in case.diff]


def numeric_second_order(case, u, w, eps=1e-5):
    """Central differences of the first-order gradient (``ml.grad``) along each input."""
    f = scalar_fn(case, u)
    nums = tuple(range(len(case.diff)))
    g = ml.grad(lambda *dd: f(*_as_tensors(_with(case, dd))), argnums=nums)
    base = [case.inputs[i] for i in case.diff]

    def h(d):
        return sum(float(np.sum(to_numpy(gi) * wi)) for gi, wi in zip(g(*d), w))

    out = []
    for k, x in enumerate(base):
        hv = np.zeros(x.shape)
        for idx in np.ndindex(*x.shape):
            plus, minus = list(base), list(base)
            plus[k], minus[k] = x.copy(), x.copy()
            plus[k][idx] += eps
            minus[k][idx] -= eps
            hv[idx] = (h(plus) - h(minus)) / (2 * eps)
        out.append(hv)
    return out


# --- layouts -----------------------------------------------------------------------------------
def strided(a):
    """The same values in a non-contiguous view (every other element of a bigger array)."""
    if a.ndim == 0:
        return a
    big = np.zeros(a.shape[:-1] + (a.shape[-1] * 2,), a.dtype)
    big[..., ::2] = a
    return big[..., ::2]


def reversed_strides(a):
    """The same values in a view with negative strides (``x[::-1]`` of a reversed copy)."""
    if a.ndim == 0:
        return a
    return np.flip(np.ascontiguousarray(np.flip(a)))


def transposed(a):
    """The same values in Fortran order (a transposed view of a C-ordered array)."""
    return np.asfortranarray(a) if a.ndim >= 2 else strided(a)


LAYOUTS = {"strided": strided, "reversed": reversed_strides, "transposed": transposed}


# --- comparison ----------------------------------------------------------------------------------
def _eps(dt):
    return np.finfo(dt).eps if np.dtype(dt).kind == "f" else 0.0


def assert_matches(got, want, dtype, what, ulps=None, rtol=None, atol=0.0):
    """``got`` (of ``dtype``) equals the float64 ``want`` up to the dtype's precision.

    NaN positions must agree, infinities must agree exactly, finite values within ``ulps``
    units in the last place of ``dtype`` (elementwise ops) or ``rtol`` times the dtype's
    epsilon relative to the largest finite magnitude involved (ops that sum), plus ``atol``.
    """
    got, want = np.asarray(got), np.asarray(want)
    dtype = np.dtype(dtype)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}"
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}, expected {dtype}"
    if dtype.kind not in "fc":
        bad = got != want
        assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} values differ, first at "
                               f"{np.argwhere(bad)[0].tolist()}: {got[bad][0]} != {want[bad][0]}")
        return
    with np.errstate(all="ignore"):
        g, w = got.astype(np.float64), want.astype(dtype).astype(np.float64)
        nan_g, nan_w = np.isnan(g), np.isnan(w)
        problems = []
        if (nan_g != nan_w).any():
            i = np.argwhere(nan_g != nan_w)[0]
            problems.append(f"NaN positions differ ({(nan_g != nan_w).sum()} places), first "
                            f"at {i.tolist()}: got {g[tuple(i)]}, expected {w[tuple(i)]}")
        inf = (np.isinf(g) | np.isinf(w)) & ~nan_g & ~nan_w
        if (g[inf] != w[inf]).any():
            i = np.argwhere(inf & (g != w))[0]
            problems.append(f"infinities differ at {i.tolist()}: got {g[tuple(i)]}, "
                            f"expected {w[tuple(i)]}")
        fin = np.isfinite(g) & np.isfinite(w)
        if ulps is not None:
            spacing = np.spacing(np.abs(w[fin]).astype(dtype)).astype(np.float64)
            tol = ulps * spacing + atol
        else:
            r = (rtol or 4) * _eps(dtype)
            mag = np.max(np.abs(w[fin]), initial=0.0)
            tol = r * (np.abs(w[fin]) + mag + (1.0 if mag == 0 else 0.0)) + atol
        err = np.abs(g[fin] - w[fin])
        if (err > tol).any():
            k = int(np.argmax(err - tol))
            i = np.argwhere(fin)[k]
            problems.append(f"{(err > tol).sum()} of {fin.sum()} finite values off, worst at "
                            f"{i.tolist()}: got {g[tuple(i)]!r}, expected {w[tuple(i)]!r} "
                            f"(tolerance {tol[k]:.3g})")
    assert not problems, f"{what}: " + "; ".join(problems)


def grad_tolerance(case):
    """(rtol, atol) for the case's gradients: central-difference accuracy, or float32's."""
    low = any(case.inputs[i].dtype != F64 for i in case.diff)
    return (3e-4, 3e-5) if low else (1e-5, 1e-6)


def assert_grads(got, want, what, rtol=1e-5, atol=1e-6, dtypes=None):
    """Gradients agree (float64, central-difference accuracy) and have the inputs' dtypes."""
    assert len(got) == len(want), f"{what}: {len(got)} gradients, expected {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.shape == np.shape(w), f"{what}: gradient {k} has shape {g.shape}, expected " \
                                       f"{np.shape(w)}"
        if dtypes is not None:
            assert g.dtype == dtypes[k], f"{what}: gradient {k} is {g.dtype}, expected " \
                                         f"{dtypes[k]} (the input's dtype)"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol,
                                   err_msg=f"{what}: gradient of input {k} is wrong")


# --- PyTorch's answers -----------------------------------------------------------------------
def digest(case):
    """A fingerprint of the case's inputs and cotangent: a stale reference file shows up."""
    h = hashlib.sha1()
    arrays = list(case.inputs)
    if case.diff:
        arrays.append(cotangent(case, out_shape(case)))
    for a in arrays:
        h.update(str((a.shape, a.dtype.str)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def torch_reference():
    """``{key: array}`` from the committed ``tests/data/torch_reference.npz`` (no pickle)."""
    with np.load(TORCH_NPZ, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


TORCH_MISC_NPZ = os.path.join(DATA, "torch_misc_reference.npz")


@functools.lru_cache(maxsize=None)
def torch_misc_reference(prefix):
    """``{key: array}`` of the committed ``tests/data/torch_misc_reference.npz`` (PyTorch's
    answers for single features: promotion, sparse optimizers, ``embedding_bag``, the
    distributed sampler; written by ``make_torch_misc_reference.py``) whose keys start with
    ``prefix + "::"``, the prefix taken off."""
    with np.load(TORCH_MISC_NPZ, allow_pickle=False) as z:
        found = {k[len(prefix) + 2:]: z[k] for k in z.files if k.startswith(prefix + "::")}
    assert found, f"no {prefix!r} arrays in {TORCH_MISC_NPZ}: run make_torch_misc_reference.py"
    return found


def torch_cases():
    return [c for c in all_cases() if c.torch is not None and not c.divergence]


# --- dropout -----------------------------------------------------------------------------------
def check_dropout(path, p=0.4, n=(40, 50), seed=5):
    """Dropout's gradient on one path is its own mask: for y = dropout(x), every path must
    give d<y, u>/dx = u * m / (1 - p) with m in {0, 1}, and the value <y, u> = <x, grad>."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.5, n) * rng.choice([-1.0, 1.0], n)
    u = rng.uniform(0.5, 1.5, n)
    ut = ml.tensor(u)

    def f(a):
        return ops.sum(ops.mul(ops.dropout(a, p), ut))

    if path == "tape":
        t = ml.tensor(x, requires_grad=True)
        value = f(t)
        value.backward()
        value, g = float(value), to_numpy(t.grad)
    elif path == "grad":
        value, g = ml.value_and_grad(f)(x)
        value, g = float(value), to_numpy(g)
    elif path == "vjp":
        y, vjp_fn = ml.vjp(lambda a: ops.dropout(a, p), x)
        value, g = float(np.sum(to_numpy(y) * u)), to_numpy(vjp_fn(u)[0])
    elif path == "jvp":
        y, t = ml.jvp(lambda a: ops.dropout(a, p), [x], [u])
        # forward mode: tangent = u * m / (1 - p); report it as the "gradient" of <y, 1>
        value, g = float(np.sum(to_numpy(y) * u)), to_numpy(t)
    elif path == "grad_graph":
        gg = ml.grad_graph(ml.trace(f, x))
        value, g = gg(x)
        value, g = float(to_numpy(value)), to_numpy(g)
    elif path == "compiled":
        c = ml.compile(ml.value_and_grad(f), x)
        value, g = c(x)
        value, g = float(np.asarray(value)), np.asarray(g)
    else:
        raise ValueError(path)
    scale = g / u
    kept = np.isclose(scale, 1.0 / (1.0 - p), rtol=1e-12)
    dropped = scale == 0.0
    assert (kept | dropped).all(), f"dropout {path}: gradient/u is not in {{0, 1/(1-p)}}"
    frac = dropped.mean()
    assert abs(frac - p) < 5 * np.sqrt(p * (1 - p) / x.size), \
        f"dropout {path}: dropped {frac:.3f} of the gradient, expected about {p}"
    assert np.isclose(value, np.sum(x * g), rtol=1e-10), \
        f"dropout {path}: the forward mask and the gradient's mask differ"
    return value, g


# --- embedding bags (mlsys_lab/engine/ops_embedding.py) ----------------------------------------
def _bag_ref(w, ids, offsets, mode, psw=None):
    ends = list(offsets[1:]) + [len(ids)]
    out = np.zeros((len(offsets), w.shape[1]))
    psw = np.ones(len(ids)) if psw is None else psw
    for b, (s, e) in enumerate(zip(offsets, ends)):
        if e > s:
            out[b] = (w[ids[s:e]] * psw[s:e, None]).sum(0) / (1 if mode == "sum" else e - s)
    return out


def _bag_grad_ref(g, ids, offsets, num_rows, mode, psw=None):
    ends = list(offsets[1:]) + [len(ids)]
    out = np.zeros((num_rows, g.shape[1]))
    psw = np.ones(len(ids)) if psw is None else psw
    for b, (s, e) in enumerate(zip(offsets, ends)):
        for k in range(s, e):
            out[ids[k]] += g[b] * psw[k] / (1 if mode == "sum" else e - s)
    return out


_BAG_IDS = np.array([3, 0, 3, 3, 1, 4])
_BAG_OFFSETS = np.array([0, 2, 2, 5])  # bag 1 is empty; id 3 repeats across and within bags
spec("embedding_bag",
     *[_mk("embedding_bag", mode, lambda w, i, o, m=mode: ops.embedding_bag(w, i, o, mode=m),
           lambda r: [rn(r, 5, 3), _BAG_IDS, _BAG_OFFSETS],
           ref=lambda w, i, o, m=mode: _bag_ref(w, i, o, m), diff=(0,), second=True)
       for mode in ("sum", "mean")],
     _mk("embedding_bag", "no_ids", lambda w, i, o: ops.embedding_bag(w, i, o, mode="mean"),
         lambda r: [rn(r, 4, 2), np.zeros(0, np.int64), np.zeros(2, np.int64)],
         ref=lambda w, i, o: _bag_ref(w, i, o, "mean"), diff=(0,)),
     # per-sample weights (sum only, as PyTorch): the product w[id] * p is bilinear, so the
     # second-order check sees the cross term d2/dw dp
     _mk("embedding_bag", "per_sample_weights",
         lambda w, i, o, p: ops.embedding_bag(w, i, o, mode="sum", per_sample_weights=p),
         lambda r: [rn(r, 5, 3), _BAG_IDS, _BAG_OFFSETS, rn(r, len(_BAG_IDS))],
         ref=lambda w, i, o, p: _bag_ref(w, i, o, "sum", p), diff=(0, 3), second=True))
# embedding: take along axis 0 that refuses an id outside [0, rows) (negatives included)
spec("embedding",
     _mk("embedding", "repeats", lambda w, i: ops.embedding(w, i),
         lambda r: [rn(r, 5, 2), np.array([[4, 0], [4, 2]])], ref=lambda w, i: w[i], diff=(0,),
         second=True),
     _mk("embedding", "int32_ids", lambda w, i: ops.embedding(w, i),
         lambda r: [rn(r, 5, 3), np.array([1, 1, 3], np.int32)], ref=lambda w, i: w[i],
         diff=(0,)),
     _mk("embedding", "no_ids", lambda w, i: ops.embedding(w, i),
         lambda r: [rn(r, 4, 2), np.zeros(0, np.int64)], ref=lambda w, i: w[i], diff=(0,)))
spec("embedding_bag_segments",
     _mk("embedding_bag_segments", "repeats_and_empty",
         lambda i, o: apply(get("embedding_bag_segments"), i, o), [_BAG_IDS, _BAG_OFFSETS],
         ref=lambda i, o: np.array([0, 0, 2, 2, 2, 3])),
     _mk("embedding_bag_segments", "no_ids",
         lambda i, o: apply(get("embedding_bag_segments"), i, o),
         [np.zeros(0, np.int64), np.zeros(2, np.int64)], ref=lambda i, o: np.zeros(0, np.int64)),
     no_grad="integer bag numbers: nothing to differentiate")
spec("embedding_bag_grad",
     *[_mk("embedding_bag_grad", mode,
           lambda g, i, o, m=mode: apply(get("embedding_bag_grad"), g, i, o, num_rows=5, mode=m),
           lambda r: [rn(r, 4, 3), _BAG_IDS, _BAG_OFFSETS],
           ref=lambda g, i, o, m=mode: _bag_grad_ref(g, i, o, 5, m), diff=(0,), second=True)
       for mode in ("sum", "mean")],
     _mk("embedding_bag_grad", "per_sample_weights",
         lambda g, i, o, p: apply(get("embedding_bag_grad"), g, i, o, p, num_rows=5, mode="sum"),
         lambda r: [rn(r, 4, 3), _BAG_IDS, _BAG_OFFSETS, rn(r, len(_BAG_IDS))],
         ref=lambda g, i, o, p: _bag_grad_ref(g, i, o, 5, "sum", p), diff=(0, 3), second=True))
