"""``defop`` / ``ml.custom_op``: one keyword-only way to define an op, read by every path.

A custom op goes round trip through eager mode, tracing, the tape, ``ml.grad`` (twice),
``ml.jvp``, ``ml.compile`` and, with a fusion template, the generated elementwise kernel; the
definition refuses positional rules. The registry-wide test asks every elementwise op of the
library that produces floats either to carry a fusion template that the fusion pass really
uses, or to say why it has none.
"""

import itertools

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.dispatch import apply
from mlsys_lab.engine.passes import fuse_elementwise
from mlsys_lab.engine.passes.fusion import kernel_source
from mlsys_lab.engine.registry import REGISTRY, AVal, Op, defop, get, register

from .. import conformance as C

LIBRARY_OPS = C.registered_ops()  # collected before any test registers one of its own
_names = (f"test_defop_{i}" for i in itertools.count())


@pytest.fixture
def fresh_name():
    """A new op name per use; every op registered under one is removed afterwards (other
    registry-wide tests must not meet it)."""
    made = []

    def make():
        made.append(next(_names))
        return made[-1]
    yield make
    for name in made:
        REGISTRY.pop(name, None)


# --- a custom op: softsign(x) = x / (1 + |x|) --------------------------------------------------
def _float_same(x):
    if x.dtype.kind != "f":
        raise ml.DTypeError(f"softsign: expects a floating tensor, got {x.dtype}")
    return AVal(x.shape, x.dtype)


def _softsign_np(x):
    return x / (1 + np.abs(x))


def _softsign_vjp(g, xs, y, needs):
    return (g * (1.0 - ops.abs(y)) ** 2,)


def _softsign_jvp(ts, xs, y):
    return ts[0] * (1.0 - ops.abs(y)) ** 2


def _softsign(name, **extra):
    return ml.custom_op(name, compute=_softsign_np, infer=_float_same, vjp=_softsign_vjp,
                        jvp=_softsign_jvp, elementwise=True, **extra)


X = np.array([-800.0, -3.0, -1.0, -0.25, 0.0, 0.5, 2.0, 1e3])


def _d_softsign(x):
    return 1.0 / (1.0 + np.abs(x)) ** 2


def _dd_softsign(x):
    return -2.0 * np.sign(x) / (1.0 + np.abs(x)) ** 3


def test_custom_op_runs_eagerly_and_returns_the_registered_op(fresh_name):
    name = fresh_name()
    softsign = _softsign(name)
    assert softsign.op is get(name) and softsign.__name__ == name
    y = softsign(ml.tensor(X, dtype="float32"))
    assert isinstance(y, ml.Tensor) and y.dtype == np.float32
    np.testing.assert_allclose(y.numpy(), _softsign_np(X.astype(np.float32)), rtol=1e-6)
    with pytest.raises(ml.DTypeError, match="softsign: expects a floating tensor"):
        softsign(ml.tensor([1, 2]))


def test_custom_op_traces_to_one_node_and_the_graph_runs_it(fresh_name):
    name = fresh_name()
    softsign = _softsign(name)
    g = ml.trace(lambda t: softsign(t) * 2.0, X)
    assert [n.op for n in g.nodes] == [name, "mul"]
    np.testing.assert_allclose(np.asarray(g(X)), 2 * _softsign_np(X), rtol=1e-12)


def test_custom_op_gradients_tape_grad_jvp_and_second_order(fresh_name):
    softsign = _softsign(fresh_name())
    x = ml.tensor(X, requires_grad=True)
    softsign(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), _d_softsign(X), rtol=1e-12)
    grad = ml.grad(lambda t: softsign(t).sum())
    np.testing.assert_allclose(grad(ml.tensor(X)).numpy(), _d_softsign(X), rtol=1e-12)
    second = ml.grad(lambda t: grad(t).sum())(ml.tensor(X))  # the rule is in framework ops
    np.testing.assert_allclose(second.numpy(), _dd_softsign(X), rtol=1e-10)
    _, tangent = ml.jvp(softsign, (ml.tensor(X),), (ml.tensor(np.ones_like(X)),))
    np.testing.assert_allclose(tangent.numpy(), _d_softsign(X), rtol=1e-12)
    gg = ml.grad_graph(ml.trace(lambda t: softsign(t).sum(), X))
    assert sum(n.op == softsign.op.name for n in gg.nodes) == 1


def test_custom_op_compiles_and_its_gradient_compiles(fresh_name):
    softsign = _softsign(fresh_name())
    c = ml.compile(lambda t: softsign(t) + 1.0, X)
    np.testing.assert_allclose(np.asarray(c(X)), _softsign_np(X) + 1.0, rtol=1e-12)
    cg = ml.compile(ml.grad(lambda t: softsign(t).sum()), X)
    np.testing.assert_allclose(np.asarray(cg(X)), _d_softsign(X), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_custom_op_with_a_template_fuses_into_the_generated_kernel(fresh_name, dtype):
    softsign = _softsign(fresh_name(), fusion="{0} / (ONE + abs({0}))")
    x, a = X.astype(dtype), np.array(3.0, dtype)
    f = lambda t, s: ops.relu(softsign(t) * s)  # noqa: E731
    c = ml.compile(f, x, a)
    (node,) = [n for n in c.graph.nodes if n.op == "fused_elementwise"]
    program = node.attrs["program"]
    assert [op for op, _ in program] == [softsign.op.name, "mul", "relu"]
    assert "/ (ONE + abs(" in kernel_source(program, ("a", "s"))
    want = np.maximum(_softsign_np(x) * a, 0)
    np.testing.assert_allclose(np.asarray(c(x, a)), want, rtol=4 * np.finfo(dtype).eps)


def test_custom_op_without_a_template_is_left_out_of_fusion(fresh_name):
    softsign = _softsign(fresh_name())
    c = ml.compile(lambda t: ops.relu(softsign(t) * 3.0), X)
    fused = [n for n in c.graph.nodes if n.op == "fused_elementwise"]
    assert all(softsign.op.name not in (op for op, _ in n.attrs["program"]) for n in fused)
    assert any(n.op == softsign.op.name for n in c.graph.nodes)
    np.testing.assert_allclose(np.asarray(c(X)), np.maximum(_softsign_np(X) * 3.0, 0),
                               rtol=1e-12)


# --- the definition itself ----------------------------------------------------------------------
def test_defop_refuses_positional_rules(fresh_name):
    name = fresh_name()
    with pytest.raises(TypeError, match="positional"):
        defop(name, _softsign_np, _float_same, _softsign_vjp, _softsign_jvp)
    with pytest.raises(TypeError, match="positional"):
        ml.custom_op(name, _softsign_np, _float_same)
    assert name not in REGISTRY


def test_defop_refuses_a_taken_name_unless_replacing(fresh_name):
    name = fresh_name()
    first = defop(name, compute=_softsign_np, infer=_float_same)
    with pytest.raises(ml.ArgumentError, match="already registered"):
        defop(name, compute=np.tanh, infer=_float_same)
    assert get(name) is first
    second = defop(name, compute=np.tanh, infer=_float_same, replace=True)
    assert get(name) is second and second.compute is np.tanh
    with pytest.raises(ml.ArgumentError, match="already registered"):
        defop("add", compute=np.add, infer=_float_same)


@pytest.mark.parametrize("bad, message", [
    (dict(compute=None, infer=_float_same), "compute and infer are required"),
    (dict(compute=_softsign_np, infer=_float_same, vjp="g * y"), "vjp must be a function"),
    (dict(compute=_softsign_np, infer=_float_same, fusion="-{0}"), "needs elementwise=True"),
])
def test_defop_refuses_a_malformed_definition(fresh_name, bad, message):
    name = fresh_name()
    with pytest.raises(ml.ArgumentError, match=message):
        defop(name, **bad)
    assert name not in REGISTRY


def test_op_and_register_still_define_an_op(fresh_name):
    """The older spelling (chapter 3's exercise uses it) stays valid."""
    name = fresh_name()
    op = register(Op(name, _softsign_np, _float_same, _softsign_vjp, _softsign_jvp,
                     elementwise=True))
    g = ml.grad(lambda t: apply(op, t).sum())(ml.tensor(X))
    np.testing.assert_allclose(g.numpy(), _d_softsign(X), rtol=1e-12)


# --- registry-wide: elementwise float ops are fusable or say why not ---------------------------
def _float_cases(name):
    """Conformance cases of ``name`` whose traced graph gives the op a float32/float64 result."""
    out = []
    for case in C.SPECS[name].cases:
        g = ml.trace(case.fn, *case.inputs)
        if any(n.op == name and n.output.dtype in (np.float32, np.float64) for n in g.nodes):
            out.append(case)
    return out


ELEMENTWISE_FLOAT = [n for n in LIBRARY_OPS if get(n).elementwise and _float_cases(n)]


def test_the_library_has_elementwise_float_ops():
    assert {"add", "exp", "relu_grad", "where", "cast"} <= set(ELEMENTWISE_FLOAT)
    assert "eq" not in ELEMENTWISE_FLOAT  # a bool result


@pytest.mark.parametrize("name", ELEMENTWISE_FLOAT)
def test_every_elementwise_float_op_is_fusable_or_says_why_not(name):
    op = get(name)
    if op.fusion is None:
        assert op.unfusable_reason, f"{name}: elementwise with a float result, but no fusion " \
                                    f"template and no unfusable_reason"
        return
    assert op.unfusable_reason is None, f"{name}: has a template and a reason not to fuse"
    case = _float_cases(name)[0]
    one = np.ones((), next(a.dtype for a in case.inputs if a.dtype.kind == "f"))
    f = lambda *xs: ops.mul(case.fn(*xs[:-1]), xs[-1])  # noqa: E731
    fused = fuse_elementwise(ml.trace(f, *case.inputs, one))
    programs = [n.attrs["program"] for n in fused.nodes if n.op == "fused_elementwise"]
    assert any(name in (step for step, _ in p) for p in programs), \
        f"{name}: has a fusion template but the fusion pass did not fuse it ({fused})"
    with np.errstate(all="ignore"):
        want = np.asarray(f(*C.tensors(case.inputs), ml.tensor(one)).numpy())
        got = np.asarray(ml.compile(f, *case.inputs, one)(*case.inputs, one))
    np.testing.assert_allclose(got, want, rtol=8 * np.finfo(want.dtype).eps, atol=0,
                               equal_nan=True, err_msg=f"{name}: fused kernel vs eager")
