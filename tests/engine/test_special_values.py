"""Special values through every fusable elementwise op: numpy, eager and ``ml.compile`` agree.

Each op runs over ±0, ±inf, NaN, ±1, ±0.5, ±2, negative non-integers, huge, tiny and subnormal
values in float32 and float64, both operands of a binary op drawn from that set, with the
second (or the first) operand an array, a scalar input (one element: the generated loop reads
it once) or broadcast along rows. Three evaluations must agree on where the NaNs and infinities
are and on the sign of every zero, exact operations bit for bit and the transcendental ones
within :data:`MAX_ULP`:

* numpy: the op's numpy function (``pow`` by numpy's scalar-exponent rule, see below);
* eager: ``ml.ops`` on tensors;
* compiled: ``ml.compile`` of ``op(x, y) - z`` (``z`` zeros, so the two ops fuse into one
  generated Numba loop; subtracting zero changes no value, not even a ``-0.``).

``pow``'s contract is numpy's and PyTorch's, made independent of memory layout: an exponent of
one element gives what ``x ** c`` gives for a number ``c`` (0.5 is ``sqrt``: ``-inf ** 0.5`` is
NaN, ``-0. ** 0.5`` is ``-0.``; -1 is ``1 / x``; 2 is ``x * x``), an exponent array C's ``pow``
elementwise (``-inf ** 0.5`` is ``+inf``), as ``np.power`` of two arrays and PyTorch's tensor
``**`` give. (``np.power`` decides by strides: a ``(3, 1)`` exponent column takes the scalar
shortcuts, a pair of ``(1,)`` arrays does not.)
"""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.dtypes import ulp_distance
from mlsys_lab.engine.registry import REGISTRY, get
from mlsys_lab.engine.tensor import apply

F32, F64 = np.float32, np.float64
MAX_ULP = 4
#: IEEE-exact operations: bit for bit everywhere (``pow`` is not: numpy's SIMD ``pow`` and
#: libm's, which the generated loop calls, may round differently).
EXACT = {"add", "sub", "mul", "div", "neg", "abs", "maximum", "minimum", "relu", "sign",
         "relu_grad", "sqrt"}
FUSED = sorted(op for op in REGISTRY if get(op).fusion and get(op).elementwise
               and op != "where" and not op.startswith("test_"))
BINARY = [op for op in FUSED if "{1}" in get(op).fusion]
UNARY = [op for op in FUSED if op not in BINARY]


def specials(dt):
    fi = np.finfo(dt)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, -3.0,
            1.5, -2.5, 0.1, 7.0, fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny,
            -fi.tiny, fi.max, -fi.max, 1e30, -1e30, 1e-30, -1e-30, 88.8, -104.0, 709.0,
            -745.0, 1e10]
    with np.errstate(over="ignore"):
        return np.array(vals, dt)


def _numpy_pow(a, b):
    """numpy's ``a ** c`` for a number ``c`` where ``b`` has one element, else ``np.power`` of
    two arrays of the result's shape (C's ``pow``: no stride-0 exponent for numpy's shortcuts)."""
    if b.size == 1:
        return np.power(a, b.dtype.type(b.reshape(())[()]))
    shape = np.broadcast_shapes(a.shape, b.shape)
    return np.power(*(np.ascontiguousarray(np.broadcast_to(v, shape)) for v in (a, b)))


NUMPY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
         "pow": _numpy_pow, "maximum": np.maximum, "minimum": np.minimum, "neg": np.negative,
         "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "sin": np.sin,
         "cos": np.cos, "abs": np.abs, "sign": np.sign, "relu": lambda x: np.maximum(x, 0),
         "relu_grad": lambda g, x: np.where(x > 0, g, np.zeros((), g.dtype)),
         "sigmoid": lambda x: _sigmoid_long(x).astype(x.dtype)}


def _sigmoid_long(x):
    """``1 / (1 + e**-x)`` in long double (``e**x / (1 + e**x)`` below 0, so no overflow)."""
    x = x.astype(np.longdouble)
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1, z) / (1 + z)


def assert_agree(got, want, exact, what, max_ulp=MAX_ULP):
    """NaN and infinity positions, signs of zeros and infinities equal; exact: every bit equal;
    otherwise finite values within ``max_ulp``."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
    got, want = got.ravel(), want.ravel()
    nan = np.isnan(want)
    special = nan | np.isinf(want) | (want == 0)
    ints = f"u{got.itemsize}"
    bits_differ = got.view(ints) != want.view(ints)
    bad = np.flatnonzero((np.isnan(got) != nan) | (bits_differ & ~nan & (special | exact)))
    assert bad.size == 0, f"{what}: {bad.size} special values differ, e.g. " + ", ".join(
        f"element {i}: {got[i]!r} vs {want[i]!r}" for i in bad[:4])
    ulps = ulp_distance(got[~nan], want[~nan])
    assert ulps.max(initial=0) <= max_ulp, f"{what}: {ulps.max()} ulp"


def _eager(op, *arrays):
    with np.errstate(all="ignore"):
        return apply(get(op), *[ml.tensor(a) for a in arrays]).numpy()


def _compiled(op, *arrays, passes="default"):
    """``op(*arrays) - 0`` compiled, with the graph checked to hold one fused loop."""
    def f(*args):
        return ops.sub(apply(get(op), *args[:-1]), args[-1])

    shape = np.broadcast_shapes(*[a.shape for a in arrays])
    zeros = np.zeros(shape, arrays[0].dtype)
    c = ml.compile(f, *arrays, zeros, passes=passes)
    if passes == "default":
        assert [n.op for n in c.graph.nodes] == ["fused_elementwise"], c.graph
    with np.errstate(all="ignore"):
        return np.asarray(c(*arrays, zeros))


def _numpy(op, *arrays):
    with np.errstate(all="ignore"):
        return np.asarray(NUMPY[op](*arrays), arrays[0].dtype)


def _pairs(dt, layout):
    """The operands of a binary op: every pair of specials, laid out as ``layout``."""
    s = specials(dt)
    a, b = (m.ravel() for m in np.meshgrid(s, s, indexing="ij"))
    if layout == "arrays":
        return [(a, b)]
    if layout == "scalar_second":
        return [(s, np.array(c, dt)) for c in s]
    if layout == "scalar_first":
        return [(np.array(c, dt), s) for c in s]
    if layout == "rows":  # row i of an (n, n) grid of every special, with special i: (n, 1)
        return [(b.reshape(s.size, s.size), s.reshape(-1, 1))]
    raise ValueError(layout)


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", UNARY)
def test_unary_op_special_values_numpy_eager_compiled(op, dt):
    x = specials(dt)
    eager = _eager(op, x)
    assert_agree(eager, _numpy(op, x), op in EXACT, f"eager {op} vs numpy",
                 max_ulp=MAX_ULP if op != "sigmoid" else 2)
    assert_agree(_compiled(op, x), eager, op in EXACT, f"compiled {op} vs eager")


@pytest.mark.parametrize("layout", ["arrays", "scalar_second", "scalar_first", "rows"])
@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", BINARY)
def test_binary_op_special_values_numpy_eager_compiled(op, dt, layout):
    pairs = _pairs(dt, layout)
    exact = op in EXACT
    eagers = [_eager(op, a, b) for a, b in pairs]
    for (a, b), eager in zip(pairs, eagers):
        assert_agree(eager, _numpy(op, a, b), exact, f"eager {op} {layout} vs numpy")
    # one compiled function per layout, run on each pair of the layout
    fs = {}
    for (a, b), eager in zip(pairs, eagers):
        key = (a.shape, b.shape)
        if key not in fs:
            fs[key] = _compiled_fn(op, a, b)
        with np.errstate(all="ignore"):
            got = np.asarray(fs[key](a, b, np.zeros(eager.shape, dt)))
        assert_agree(got, eager, exact, f"compiled {op} {layout} vs eager")


def _compiled_fn(op, a, b):
    def f(x, y, z):
        return ops.sub(apply(get(op), x, y), z)

    zeros = np.zeros(np.broadcast_shapes(a.shape, b.shape), a.dtype)
    c = ml.compile(f, a, b, zeros)
    assert [n.op for n in c.graph.nodes] == ["fused_elementwise"], c.graph
    return c


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
def test_pow_of_minus_inf_to_one_half_is_nan_compiled_and_eager(dt):
    """Issue 26: ``maximum(neg(pow(log(x), 0.5)), y)`` at ``x = 0`` is NaN in numpy and eager
    (``log(0) = -inf``, ``-inf ** 0.5 = sqrt(-inf) = NaN``); the fused loop gave ``y`` (C's
    ``pow(-inf, 0.5) = +inf``)."""
    x, y = np.zeros(4, dt), np.full(4, 3.0, dt)

    def f(x, y):
        return ops.maximum(ops.neg(ops.pow(ops.log(x), 0.5)), y)

    with np.errstate(all="ignore"):
        want = np.maximum(-(np.log(x) ** 0.5), y)
        eager = f(ml.tensor(x), ml.tensor(y)).numpy()
        c = ml.compile(f, x, y)
        got = c(x, y)
    assert any(n.op == "fused_elementwise" for n in c.graph.nodes)
    assert np.isnan(want).all() and np.isnan(eager).all()
    assert np.isnan(got).all(), f"compiled gave {got}, numpy and eager NaN"


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("shape", [(), (1,), (1, 1), (3, 1), (1, 4), (3, 4)])
def test_pow_rule_follows_the_exponents_size_not_its_layout(dt, shape):
    """numpy gives ``np.power(-inf, 0.5)`` NaN where the exponent repeats along its inner loop
    (a scalar, a ``(3, 1)`` column) and ``+inf`` elsewhere (an exponent array, a pair of
    ``(1,)`` arrays). ``ml.ops.pow`` and the compiled loop follow the exponent's size: one
    element is a number's ``x ** c`` (``sqrt``, ``1 / x``, ``x * x``), an array C's ``pow``."""
    base = np.array([[-np.inf, -0.0, 3.0, 0.1]] * 3, dt)
    one = int(np.prod(shape)) == 1
    with np.errstate(all="ignore"):
        for e, scalar_rule in ((0.5, np.sqrt), (-1.0, lambda x: dt(1) / x),
                               (2.0, lambda x: x * x)):
            b = np.full(shape, e, dt)
            want = scalar_rule(base) if one else np.power(base, np.full(base.shape, e, dt))
            eager = _eager("pow", base, b)
            assert_agree(eager, want, one, f"eager pow(base, {e} as {shape})")
            assert_agree(_compiled("pow", base, b), eager, one,
                         f"compiled pow(base, {e} as {shape}) vs eager")
            for size_one in (np.array(-np.inf, dt), np.array([-np.inf], dt)):  # one element
                assert_agree(_eager("pow", size_one, b.reshape(-1)[:1]),
                             scalar_rule(size_one.reshape(-1)), True, "pow of one element")


def test_int_and_float_fuse_only_where_numpy_computes_in_the_output_dtype():
    """``int32 + float32`` is float32 (PyTorch's promotion) but numpy adds in float64 and eager
    rounds once; the fused loop converted the int to float32 first, rounding twice
    (16777217 + 1.0 gave 16777216 + 1 = 16777216 instead of 16777218)."""
    x = np.array([16777217, 3, 2**31 - 1, -16777219], np.int32)
    y = np.array([1.0, 0.1, 0.5, -1.0], F32)

    def f(x, y):
        s = ops.add(x, y)
        return ops.add(ops.mul(ops.exp(ops.mul(s, 1e-9)), 2.0), s)

    want = f(ml.tensor(x), ml.tensor(y)).numpy()
    got = ml.compile(f, x, y)(x, y)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("passes", ["default", None])
def test_pow_of_one_element_compiled_matches_eager(passes):
    """A one-element exponent takes the scalar rule in every path, even where the output has
    one element too (``np.power`` of two ``(1,)`` arrays takes C's ``pow``: ``+inf``)."""
    a, b = np.array([-np.inf], F32), np.array([0.5], F32)
    eager = _eager("pow", a, b)
    assert np.isnan(eager).all()
    c = ml.compile(lambda x, y: ops.pow(x, y), a, b, passes=passes)
    with np.errstate(all="ignore"):
        assert np.isnan(c(a, b)).all(), c.explain()
