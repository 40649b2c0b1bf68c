"""ml.compile gives what eager mode gives: impure ops, static arguments, CSE keys, generated
elementwise kernels measured in ulps, exact algebraic rewrites, and library errors."""

import re

import numpy as np
import pytest
from numpy.lib.introspect import opt_func_info

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.compiler import Compiled
from mlsys_lab.engine.dtypes import ulp_distance
from mlsys_lab.engine.graph import Graph, Node, Value
from mlsys_lab.engine.passes import (
    algebraic_simplification,
    common_subexpression_elimination,
    constant_folding,
    dead_code_elimination,
    run_pipeline,
)
from mlsys_lab.engine.passes.fusion import compile_kernel, fused_elementwise_into
from mlsys_lab.engine.registry import REGISTRY, AVal, Op, get, register
from mlsys_lab.engine.tensor import apply
from mlsys_lab.errors import GraphError, OpError, OutOfMemoryError, TraceError

F32, F64 = np.float32, np.float64


# --- a tiny impure op: a fresh normal draw per run -----------------------------------------------
_NOISE_RNG = np.random.default_rng(0)
NOISE = Op("test_noise", lambda: np.asarray(_NOISE_RNG.standard_normal(), F64),
           lambda: AVal((), np.dtype(F64)), impure=True)
NOISE_LIKE = Op("test_noise_like", lambda x: x + _NOISE_RNG.standard_normal(x.shape),
                lambda x: AVal(x.shape, x.dtype), impure=True)


def _fail(x, kind):
    raise {"zero": ZeroDivisionError("division by zero"), "value": ValueError("bad")}[kind]


FAILING = Op("test_failing", _fail, lambda x, kind: AVal(x.shape, x.dtype))


@pytest.fixture(autouse=True, scope="module")
def registered_test_ops():
    """The test-only ops are registered while this module runs, and only then (registry-wide
    tests elsewhere must not meet them)."""
    for op in (NOISE, NOISE_LIKE, FAILING):
        register(op, replace=True)
    yield
    for op in (NOISE, NOISE_LIKE, FAILING):
        REGISTRY.pop(op.name, None)


def noise():
    return apply(NOISE)


def ops_of(graph):
    return [n.op for n in graph.nodes]


def test_impure_nodes_are_never_folded_merged_or_dropped():
    c = np.ones(3)

    def f(x):
        unused = noise()  # noqa: F841  (kept: it consumes randomness)
        return x + (noise() - noise()) + apply(NOISE_LIKE, ml.tensor(c))

    g = ml.trace(f, np.ones(3))
    assert ops_of(g).count("test_noise") == 3
    for p in (constant_folding, common_subexpression_elimination, dead_code_elimination,
              algebraic_simplification):
        h = p(g)
        assert ops_of(h).count("test_noise") == 3, p.name
        assert ops_of(h).count("test_noise_like") == 1, p.name
    compiled = Compiled(f, np.ones(3))
    assert ops_of(compiled.graph).count("test_noise") == 3


@pytest.mark.parametrize("profile", [True, False])
def test_compiled_impure_op_runs_on_every_call(profile):
    x = np.zeros(4)
    c = Compiled(lambda v: v + noise(), x)
    a, b = c(x, profile=profile), c(x, profile=profile)
    assert not np.array_equal(a, b)
    assert np.all(a == a[0])  # one draw, broadcast


def test_compiled_dropout_draws_a_fresh_mask_per_call():
    x = np.ones(1000, F32)
    c = ml.compile(lambda v: ops.dropout(v, 0.5), x)
    assert not np.array_equal(c(x), c(x))
    assert not np.array_equal(c(x, profile=False), c(x, profile=False))


# --- static arguments ----------------------------------------------------------------------------
def test_static_argnums_retraces_per_value():
    c = ml.compile(lambda v, n: v * n, np.ones(3), 2.0, static_argnums=1)
    first = c.current
    np.testing.assert_array_equal(c(np.ones(3), 5.0), [5.0, 5.0, 5.0])
    assert c.current is not first and "5.0" in str(c.source_graph)
    np.testing.assert_array_equal(c(np.ones(3), 2.0), [2.0, 2.0, 2.0])
    assert c.current is first and len(c.specialisations) == 2  # cached, not retraced
    assert c.explain() == first.explain()
    assert c.graph is first.graph and c.plan is first.plan and c.code == first.code


def test_static_argnums_int_and_float_are_traced_apart_and_unhashable_is_refused():
    c = ml.compile(lambda v, n: v * n, np.ones(2, F32), 2, static_argnums=(1,))
    c(np.ones(2, F32), 2.0)
    assert len(c.specialisations) == 2
    with pytest.raises(TraceError, match="static argument 1 must be hashable"):
        c(np.ones(2, F32), [1, 2])
    with pytest.raises(TraceError, match="out of range"):
        ml.compile(lambda v: v, np.ones(2), static_argnums=3)


def test_static_argnums_negative_position():
    c = ml.compile(lambda v, n: v + n, np.ones(2), 1.0, static_argnums=-1)
    np.testing.assert_array_equal(c(np.ones(2), 3.0), [4.0, 4.0])
    assert len(c.graph.inputs) == 1  # the number is baked in, not traced


# --- CSE keys ------------------------------------------------------------------------------------
def test_cse_compares_index_arrays_by_value_not_by_truncated_repr():
    rng = np.random.default_rng(1)
    i1, i2 = rng.integers(0, 3000, 2000), rng.integers(0, 3000, 2000)
    i2[:3], i2[-3:] = i1[:3], i1[-3:]  # same head and tail: numpy's repr shows only those
    x = rng.standard_normal(3000)

    def f(v):
        return ops.getitem(v, i1) + ops.getitem(v, i2)

    want = f(ml.tensor(x)).numpy()
    np.testing.assert_allclose(ml.compile(f, x)(x), want)
    # the same, built directly with index arrays in the attrs
    a = Value("a", (3000,), F64)
    outs = [Value(n, (2000,), F64) for n in "bcd"]
    g = Graph([a], [Node("getitem", [a], {"index": (i1,)}, [outs[0]]),
                    Node("getitem", [a], {"index": (i2,)}, [outs[1]]),
                    Node("add", outs[:2], {}, [outs[2]])], [outs[2]])
    h = common_subexpression_elimination(g)
    assert ops_of(h).count("getitem") == 2
    np.testing.assert_allclose(h(x).numpy(), x[i1] + x[i2])


def test_cse_still_merges_equal_attrs():
    idx = [3, 1, 2]
    g = ml.trace(lambda v: ops.getitem(v, idx) * ops.getitem(v, list(idx)), np.ones(4))
    assert ops_of(common_subexpression_elimination(g)).count("getitem") == 1
    g = ml.trace(lambda v: ops.getitem(v, True) + ops.getitem(v, 1), np.ones((2, 2)))
    assert ops_of(common_subexpression_elimination(g)).count("getitem") == 2  # True is not 1


# --- generated elementwise kernels vs eager, in ulps ---------------------------------------------
def _specials(dt):
    fi = np.finfo(dt)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0, 1e-3,
            fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny, -fi.tiny,
            fi.tiny - fi.smallest_subnormal, fi.max, -fi.max, fi.eps, 1 - fi.epsneg, 1 + fi.eps,
            np.pi, -np.pi, np.e, 9.0, 9.01, 9.5, -9.5, 20.0, -20.0, 40.0, -40.0, 87.0, -87.0,
            88.8, -88.8, 103.0, -103.0, 104.0, -104.0, 110.0, -745.0, 709.0, 1e10, -1e10,
            1e30, -1e30, 1e-30, -1e-30]
    with np.errstate(over="ignore"):
        return np.array(vals, dt)


def _grid(dt, n=20000, seed=0):
    """Special values plus random ones of every magnitude (random bit patterns: NaNs,
    infinities and subnormals included) and of ordinary size."""
    rng = np.random.default_rng(seed)
    ints = np.dtype(f"u{np.dtype(dt).itemsize}")
    bits = rng.integers(0, np.iinfo(ints).max, n, dtype=ints, endpoint=True).view(dt)
    normal = rng.standard_normal(n).astype(dt) * np.array([1, 10, 100], dt).repeat(n // 3 + 1)[:n]
    return np.concatenate([_specials(dt), bits, normal])


def _operands(op, dt):
    x = _grid(dt)
    if op == "where":
        rng = np.random.default_rng(2)
        return [rng.random(x.size) < 0.5, x, rng.permutation(x)]
    if len(get(op).fusion.split("{1}")) == 1:
        return [x]
    s = _specials(dt)  # every pair of specials, then random pairs
    a, b = np.meshgrid(s, s)
    rng = np.random.default_rng(3)
    return [np.concatenate([a.ravel(), x]), np.concatenate([b.ravel(), rng.permutation(x)])]


#: Ops whose generated kernel must equal eager bit for bit (IEEE-exact operations).
EXACT = {"add", "sub", "mul", "div", "neg", "abs", "maximum", "minimum", "relu", "sign",
         "where", "relu_grad", "sqrt"}
MAX_ULP = 4
FUSED_OPS = sorted(op for op in REGISTRY if get(op).fusion and get(op).elementwise)


def _assert_matches_eager(got, want, exact, what, max_ulp=MAX_ULP):
    assert got.dtype == want.dtype, what
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN positions")
    ok = ~np.isnan(want)
    if exact:
        bad = np.flatnonzero(got[ok].view(f"u{got.itemsize}") != want[ok].view(f"u{got.itemsize}"))
        assert bad.size == 0, f"{what}: {bad.size} results differ in their bits, e.g. " \
            f"{got[ok][bad[:3]]} vs eager {want[ok][bad[:3]]}"
        return
    zero = ok & (want == 0)
    np.testing.assert_array_equal(np.signbit(got[zero]), np.signbit(want[zero]),
                                  err_msg=f"{what}: sign of zero")
    ulps = ulp_distance(got, want)
    worst = int(np.argmax(ulps))
    assert ulps.max() <= max_ulp, f"{what}: {ulps.max()} ulp at element {worst} " \
        f"(got {got[worst]!r}, eager {want[worst]!r})"


def eager(op, arrays):
    with np.errstate(all="ignore"):
        return np.asarray(get(op).compute(*arrays), arrays[-1].dtype)


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", FUSED_OPS)
def test_generated_kernel_matches_eager_op_in_ulps(op, dt):
    arrays = _operands(op, dt)
    want = eager(op, arrays)
    got = np.empty(want.shape, dt)
    n_args = len(arrays)
    fused_elementwise_into(got, *arrays, program=((op, tuple(range(n_args))),))
    _assert_matches_eager(got, want, op in EXACT, f"fused {op} {np.dtype(dt).name}")


#: (op, kernel name) of every compiled CPU kernel of a fusable elementwise op.
CPU_ELEMENTWISE_KERNELS = sorted((name, k.name) for name, o in REGISTRY.items() if o.fusion
                                 for k in o.impls.get("cpu", ()))


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op, kernel", CPU_ELEMENTWISE_KERNELS)
def test_out_kernels_equal_the_eager_op_bit_for_bit(op, kernel, dt):
    arrays = _operands(op, dt)
    want = eager(op, arrays)
    got = np.empty(want.shape, dt)
    (k,) = [k for k in get(op).impls["cpu"] if k.name == kernel]
    assert k.accepts([AVal(a.shape, a.dtype) for a in arrays], AVal(want.shape, want.dtype),
                     {}) is None
    with np.errstate(all="ignore"):
        k.out_fn(got, *arrays)
    _assert_matches_eager(got, want, True, f"{kernel} {np.dtype(dt).name}")


def test_compiled_tanh_and_sigmoid_saturate_as_eager():
    x = np.array([20.0, -20.0, -40.0, 9.6, 0.0], F32)

    def f(v):
        return ops.tanh(v) * 3.0, ops.sigmoid(v) * 1e9, ops.sqrt(ops.log(ops.sigmoid(-v)) * -1.0)

    want = [t.numpy() for t in f(ml.tensor(x))]
    for device in ("cpu", "cpu-numba"):
        c = ml.compile(f, x, device=device)
        assert any(n.op == "fused_elementwise" for n in c.graph.nodes)
        for got, w in zip(c(x), want):
            np.testing.assert_array_max_ulp(got, w, maxulp=MAX_ULP)
    assert c(x)[0][0] == 3.0 and c(x)[1][1] == pytest.approx(2.0611537, rel=1e-6)


#: Where the generated tanh / sigmoid switch formula or clamp, where eager saturates (numpy's
#: float32 tanh from 10, its float64 tanh from 18.99; correctly rounded from 9.0109 / 19.0615)
#: and where eager's sigmoid turns subnormal or 0.
BRANCH_POINTS = {
    F32: [2.0**-14, 2.0**-12, 1.0, 9.010914, 9.5, 10.0, 87.33655, 88.72284, 103.97208, 104.0],
    F64: [2.0**-28, 2.0**-26, 1.0, 18.990341103219276, 19.061547465398498, 20.0, 708.39642,
          709.78271, 745.13322, 746.0],
}


def _whole_range(dt):
    """float32: every 1021st bit pattern (4.2 million values: every exponent, both signs, NaNs,
    infinities, subnormals); float64: 2 million random bit patterns and 2 million values in
    [-30, 30]; both: the specials and every float within 16 ulp of each branch point."""
    ints = np.dtype(f"i{np.dtype(dt).itemsize}")
    if dt == F32:
        grid = np.arange(-2**31, 2**31, 1021, dtype=np.int64).astype(ints).view(dt)
    else:
        rng = np.random.default_rng(7)
        grid = np.concatenate([rng.integers(np.iinfo(ints).min, np.iinfo(ints).max, 2 * 10**6,
                                            dtype=ints).view(dt), rng.uniform(-30, 30, 2 * 10**6)])
    bits = np.array(BRANCH_POINTS[dt], dt).view(ints)
    near = (bits[:, None] + np.arange(-16, 17, dtype=ints)).ravel().view(dt)
    return np.concatenate([_specials(dt), grid, near, -near])


#: numpy runs its own float32 exp kernel, which the generated sigmoid replays operation for
#: operation, where its exp loop is dispatched to AVX2 or AVX-512 (x86-64); elsewhere it calls
#: libm's expf, up to 2.5 ulp away from that kernel.
NUMPY_SIMD_EXP = any(isa in opt_func_info(func_name="^exp$", signature="float32")["exp"]["ff"][
    "current"] for isa in ("X86_V3", "X86_V4", "AVX2", "AVX512"))


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", ["tanh", "sigmoid"])
def test_generated_tanh_and_sigmoid_within_2_ulp_of_eager_over_the_whole_range(op, dt):
    x = _whole_range(dt)
    want = eager(op, [x])
    got = np.empty_like(want)
    fused_elementwise_into(got, x, program=((op, (0,)),))
    max_ulp = MAX_ULP if (op, dt) == ("sigmoid", F32) and not NUMPY_SIMD_EXP else 2
    _assert_matches_eager(got, want, False, f"fused {op} {np.dtype(dt).name}", max_ulp)
    saturated = np.isin(want, [-1.0, 0.0, 1.0])  # exactly where eager is
    np.testing.assert_array_equal(got[saturated], want[saturated])
    if op == "tanh":  # and ±0 -> ±0, tiny x -> x, within 1 ulp of the correctly rounded value
        tiny = np.abs(x) < np.finfo(dt).eps
        bits = f"u{got.itemsize}"
        np.testing.assert_array_equal(got[tiny].view(bits), x[tiny].view(bits))
        if dt == F32:
            with np.errstate(invalid="ignore"):
                exact = np.tanh(x.astype(F64)).astype(F32)
            assert np.nanmax(ulp_distance(got, exact)) <= 1


@pytest.mark.parametrize("dt", [F32, F64], ids=["float32", "float64"])
@pytest.mark.parametrize("op", ["tanh", "sigmoid"])
def test_generated_tanh_and_sigmoid_vectorise(op, dt):
    """The loop must vectorise (no libm call per element), and float32 must compute in float32
    (8 or 16 lanes per AVX register rather than 4 or 8 of float64)."""
    program = (("mul", (0, 1)), (op, (2,)))
    x = np.linspace(-3, 3, 64, dtype=dt)
    fused_elementwise_into(np.empty_like(x), x, np.array(2, dt), program=program)
    ir = "\n".join(compile_kernel(program, ("a", "s"), dt).inspect_llvm().values())
    kind = "float" if dt == F32 else "double"
    assert re.search(rf"fdiv (\w+ )*<\d+ x {kind}>", ir), "no vector division: not vectorised"
    assert not re.search(r"fdiv (\w+ )*<\d+ x double>", ir) or dt == F64
    libm = sorted(set(re.findall(r"call [^@\n]*@(tanhf?|expf?|exp2f?)\b", ir)))
    assert not libm, f"calls libm {libm} per element"


# --- algebraic rewrites are exact ----------------------------------------------------------------
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -2.5, 5e-324], F64)

REWRITES = [  # (function, ops left after simplification)
    (lambda x: x * 1.0, []), (lambda x: 1.0 * x, []), (lambda x: x / 1.0, []),
    (lambda x: x ** 1.0, []), (lambda x: x + -0.0, []), (lambda x: -0.0 + x, []),
    (lambda x: x - 0.0, []), (lambda x: -0.0 - x, ["neg"]), (lambda x: ops.neg(ops.neg(x)), []),
    (lambda x: x ** 0.0, []), (lambda x: x ** -0.0, []),
    (lambda x: x + 0.0, ["add"]), (lambda x: 0.0 + x, ["add"]), (lambda x: x - -0.0, ["sub"]),
    (lambda x: 0.0 - x, ["sub"]), (lambda x: x * 0.0, ["mul"]), (lambda x: x - x, ["sub"]),
]


@pytest.mark.parametrize("k", range(len(REWRITES)))
def test_algebraic_rewrites_are_exact_on_special_values(k):
    f, left = REWRITES[k]
    g = ml.trace(f, SPECIALS)
    h = algebraic_simplification(g)
    assert ops_of(h) == left
    with np.errstate(all="ignore"):
        want, got = g(SPECIALS).numpy(), h(SPECIALS).numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got.view(np.uint64)[~np.isnan(want)],
                          want.view(np.uint64)[~np.isnan(want)])


def test_compiled_one_over_zero_minus_x_keeps_the_sign_of_zero():
    v = np.zeros(1)
    assert ml.compile(lambda x: 1 / (0.0 - x), v)(v)[0] == np.inf
    assert ml.compile(lambda x: 1 / (x + 0.0), -v)(-v)[0] == np.inf


def test_integer_rewrites_still_apply():
    i = np.arange(-3, 3)
    for f, left in ((lambda x: x + 0, []), (lambda x: 0 - x, ["neg"]), (lambda x: x * 0, [])):
        g = ml.trace(f, i)
        assert ops_of(algebraic_simplification(g)) == left
        np.testing.assert_array_equal(algebraic_simplification(g)(i).numpy(), g(i).numpy())


def test_gemm_fusion_leaves_a_zero_scale_alone():
    a = np.array([[np.inf, 1.0]])
    b = np.ones((2, 2))
    c0 = np.zeros((1, 2))
    f = lambda c, x, w: c - 0.0 * (x @ w)  # noqa: E731
    with np.errstate(all="ignore"):
        got = ml.compile(f, c0, a, b)(c0, a, b)
        want = f(*map(ml.tensor, (c0, a, b))).numpy()
    assert np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


# --- library errors ------------------------------------------------------------------------------
def test_compile_a_function_without_inputs():
    c = ml.compile(lambda: ml.tensor([1.0, 2.0]) * 2.0)
    np.testing.assert_array_equal(c(), [2.0, 4.0])
    np.testing.assert_array_equal(c(profile=False), [2.0, 4.0])
    c = ml.compile(lambda: noise() * 2.0, passes=None)
    assert c() != c()


@pytest.mark.parametrize("profile", [True, False])
@pytest.mark.parametrize("kind", ["zero", "value"])
def test_kernel_errors_in_compiled_runs_are_op_errors_naming_node_and_line(kind, profile):
    x = np.ones((2, 3), F32)
    c = ml.compile(lambda v: apply(FAILING, v * 2.0, kind=kind) + 1.0, x)
    with pytest.raises(OpError) as e:
        c(x, profile=profile)
    msg = str(e.value)
    assert "test_failing: kernel failed on inputs (float32[2, 3])" in msg
    assert "while running node #" in msg and "test_compile_correctness.py" in msg
    assert isinstance(e.value.__cause__, (ZeroDivisionError, ValueError))


def test_arena_too_large_is_an_out_of_memory_error():
    with pytest.raises(OutOfMemoryError, match="arena of") as e:
        ml.compile(lambda v: ops.broadcast_to(v, (10**7, 10**7)) + 1.0, np.ones(1))
    assert isinstance(e.value, MemoryError) and "add" in str(e.value)


def test_donate_pairs_are_checked():
    v = np.ones(3)
    with pytest.raises(GraphError, match=r"donate pair \(3, 0\).*2 inputs and 1 outputs"):
        ml.compile(lambda a, b: a + b, v, v, donate=[(3, 0)])
    with pytest.raises(GraphError, match="donate pair"):
        ml.compile(lambda a, b: a + b, v, v, donate=[0])


def test_a_read_only_donated_input_is_copied_not_written():
    v = np.arange(3.0)
    c = ml.compile(lambda a, b: a * 2.0 + b, v, v, donate=[(0, 0)])
    assert c.donated
    a = np.arange(3.0)
    a.flags.writeable = False
    for profile in (True, False):
        np.testing.assert_array_equal(c(a, v, profile=profile), [0.0, 3.0, 6.0])
        np.testing.assert_array_equal(a, [0.0, 1.0, 2.0])
    w = np.arange(3.0)
    c(w, v)
    np.testing.assert_array_equal(w, [0.0, 3.0, 6.0])  # a writeable one is updated in place


def test_read_only_out_is_refused_before_running():
    v = np.arange(3.0)
    c = ml.compile(lambda a: a * 2.0, v, donate=[(0, 0)])
    dst = np.zeros(3)
    dst.flags.writeable = False
    w = v.copy()
    with pytest.raises(GraphError, match=r"out\[0\] must be a writeable"):
        c(w, out=[dst])
    np.testing.assert_array_equal(w, v)  # nothing ran


def test_pipeline_with_impure_node_runs_every_pass():
    g = ml.trace(lambda x: x * noise() + noise(), np.ones(2))
    from mlsys_lab.engine.passes import default_pipeline

    out = run_pipeline(g, default_pipeline()).graph
    assert ops_of(out).count("test_noise") == 2
