"""Op-by-op conformance: every registered op, forward and every gradient path, against float64
references, central differences and PyTorch's answers (committed in tests/data/).

The cases live in :mod:`tests.conformance`; a registered op without a spec there fails
``test_every_registered_op_has_a_spec``, so a new op cannot slip in unchecked. PyTorch's answers
come from ``tests/data/torch_reference.npz``, written by ``tests/data/make_torch_reference.py``
where torch is installed (CI never imports torch).
"""

import os

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.registry import REGISTRY, get
from mlsys_lab.engine.tensor import apply

from .. import conformance as C

OPS = C.registered_ops()
CASES = C.all_cases()
GRAD_CASES = [c for c in CASES if c.diff]
FUSED = [c for c in CASES if c.fused]
SECOND = [c for c in CASES if c.second]
TORCH = C.torch_cases()
REGENERATE = "regenerate it: python tests/data/make_torch_reference.py (needs torch)"


def ids(cases):
    return [c.id for c in cases]


def _layout_cases():
    out = []
    for c in CASES:
        arrays = [a for a in c.inputs if a.size > 1]
        for name in C.LAYOUTS:
            if name == "transposed" and not any(a.ndim >= 2 for a in arrays):
                continue
            if arrays:
                out.append(pytest.param(c, name, id=f"{name}-{c.id}"))
    return out


_memo = {}


def memo(key, make):
    """Results shared by several tests of one case (central differences, compiled objects)."""
    if key not in _memo:
        _memo[key] = make()
    return _memo[key]


def cotangent(case):
    return memo(("u", case.id), lambda: C.cotangent(case, C.out_shape(case)))


def expected_grads(case):
    """Central differences of the reference; at kinks and ties PyTorch's gradients instead."""
    if case.numeric:
        return memo(("num", case.id), lambda: C.numeric_vjp(case, cotangent(case)))
    ref = _torch(case)
    return [ref[f"{case.id}::grad{i}"] for i in case.diff]


def _torch(case):
    ref = C.torch_reference()
    key = f"{case.id}::digest"
    assert key in ref, f"{C.TORCH_NPZ} has no PyTorch answer for {case.id}; {REGENERATE}"
    assert str(ref[key]) == C.digest(case), \
        f"{case.id}: inputs changed since the PyTorch answers were made; {REGENERATE}"
    return ref


def _check(case, got, what):
    C.assert_matches(got, C.reference(case), C.expected_dtype(case), f"{case.id} {what}",
                     case.ulps, case.rtol)


# --- completeness ------------------------------------------------------------------------------
@pytest.mark.parametrize("op", OPS)
def test_every_registered_op_has_a_spec(op):
    assert op in C.SPECS, f"no conformance spec for op {op} (add one to tests/conformance.py)"
    s = C.SPECS[op]
    assert s.cases or s.untestable, f"{op}: the spec has no cases and no reason why"
    registered = get(op)
    if registered.vjp is None:
        assert s.no_grad or s.untestable, f"{op} has no VJP rule and its spec says not why"
    else:
        assert not s.no_grad, f"{op} has a VJP rule but its spec says: {s.no_grad}"
        assert registered.jvp is not None, f"{op}: differentiable but has no JVP rule"
        assert s.untestable or any(c.diff for c in s.cases), \
            f"{op}: differentiable but no case checks its gradient"


def test_no_spec_for_an_unknown_op():
    stale = sorted(set(C.SPECS) - set(REGISTRY))
    assert not stale, f"conformance specs for ops that are not registered: {stale}"


PRIMITIVE = [c for c in CASES if c.op in C.SPECS]


@pytest.mark.parametrize("case", PRIMITIVE, ids=ids(PRIMITIVE))
def test_case_reaches_its_op(case):
    graph = ml.trace(case.fn, *case.inputs)
    used = {n.op for n in graph.nodes}
    for n in graph.nodes:
        for attr in n.attrs.values():  # cond keeps its branches as subgraphs
            if isinstance(attr, ml.Graph):
                used |= {m.op for m in attr.nodes}
    assert case.op in used, f"{case.id}: the traced function never runs {case.op} ({used})"


# --- forward -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_forward_eager(case):
    _check(case, C.eager(case), "eager forward")


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_forward_compiled(case):
    got, c = C.compiled_forward(case)
    _memo[("compiled", case.id)] = c
    _check(case, got, "compiled forward (interpreted)")
    _check(case, np.asarray(c(*case.inputs, profile=False)), "compiled forward (generated code)")


@pytest.mark.parametrize("case", FUSED, ids=ids(FUSED))
def test_forward_generated_elementwise_kernel(case):
    got, c = C.fused_forward(case)
    assert any(n.op == "fused_elementwise" for n in c.graph.nodes), c.graph
    _check(case, got, "generated kernel (fn(x) * one, fused)")


@pytest.mark.parametrize("case, layout", _layout_cases())
def test_layouts(case, layout):
    """Non-contiguous, negative-stride and Fortran-order inputs give the same answers."""
    arrays = [C.LAYOUTS[layout](a) for a in case.inputs]
    _check(case, C.eager(case, arrays), f"eager forward on {layout} inputs")
    c = memo(("compiled", case.id), lambda: ml.compile(case.fn, *case.inputs))
    _check(case, np.asarray(c(*arrays)), f"compiled forward on {layout} inputs")
    if case.diff:
        got = C.grad_tape(case, cotangent(case), arrays)
        C.assert_grads(got, expected_grads(case), f"{case.id} tape gradient on {layout} inputs",
                       *C.grad_tolerance(case))


# --- gradients ---------------------------------------------------------------------------------
@pytest.mark.parametrize("path", list(C.GRAD_PATHS))
@pytest.mark.parametrize("case", GRAD_CASES, ids=ids(GRAD_CASES))
def test_gradient(case, path):
    got = C.GRAD_PATHS[path](case, cotangent(case))
    C.assert_grads(got, expected_grads(case), f"{case.id} gradient by {path}",
                   *C.grad_tolerance(case), dtypes=[case.inputs[i].dtype for i in case.diff])


@pytest.mark.parametrize("case", GRAD_CASES, ids=ids(GRAD_CASES))
def test_forward_mode(case):
    vs = C.tangents(case)
    got = C.jvp_forward(case, vs)
    if case.numeric:
        C.assert_grads([got], [C.numeric_jvp(case, vs)], f"{case.id} jvp",
                       *C.grad_tolerance(case))
    else:  # <u, J v> = <J^T u, v> with PyTorch's J^T u
        lhs = float(np.sum(got * cotangent(case)))
        rhs = sum(float(np.sum(g * v)) for g, v in zip(expected_grads(case), vs))
        assert lhs == pytest.approx(rhs, rel=1e-6, abs=1e-9), f"{case.id}: jvp"


SECOND_PATHS = {"grad_of_grad": "grad", "tape_create_graph": "tape", "jvp_of_grad": "hvp"}


@pytest.mark.parametrize("how", list(SECOND_PATHS))
@pytest.mark.parametrize("case", SECOND, ids=ids(SECOND))
def test_second_order(case, how):
    u = cotangent(case)
    w = [np.random.default_rng(case.seed(3)).standard_normal(case.inputs[i].shape)
         for i in case.diff]
    got = C.second_order(case, u, w, SECOND_PATHS[how])
    want = memo(("num2", case.id), lambda: C.numeric_second_order(case, u, w))
    C.assert_grads(got, want, f"{case.id} second order by {how}", rtol=1e-4, atol=1e-6)


# --- PyTorch -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", TORCH, ids=ids(TORCH))
def test_forward_matches_pytorch(case):
    ref = _torch(case)
    got = C.eager(case)
    want = ref[f"{case.id}::out"]
    dtype = C.expected_dtype(case)
    tiny = np.finfo(dtype).tiny if dtype.kind == "f" else 0.0  # PyTorch flushes some denormals
    C.assert_matches(got, want.astype(np.float64) if want.dtype.kind == "f" else want, dtype,
                     f"{case.id} eager forward vs PyTorch", case.ulps, case.rtol, atol=tiny)


TORCH_GRAD = [c for c in TORCH if c.diff]


@pytest.mark.parametrize("case", TORCH_GRAD, ids=ids(TORCH_GRAD))
def test_gradient_matches_pytorch(case):
    ref = _torch(case)
    got = C.grad_tape(case, cotangent(case))
    want = [ref[f"{case.id}::grad{i}"] for i in case.diff]
    low = any(case.inputs[i].dtype != np.float64 for i in case.diff)
    C.assert_grads(got, want, f"{case.id} tape gradient vs PyTorch",
                   *((2e-5, 2e-6) if low else (1e-7, 1e-9)))


DIVERGENT = [c for c in CASES if c.divergence]


@pytest.mark.parametrize("case", DIVERGENT, ids=ids(DIVERGENT))
def test_divergence_from_pytorch_is_documented(case):
    doc = getattr(ops, case.op).__doc__ or ""
    assert "PyTorch" in doc, (f"{case.id} intentionally differs from PyTorch ({case.divergence}); "
                              f"ml.ops.{case.op}'s docstring must say so")


def test_reference_file_is_small_and_pickle_free():
    assert os.path.getsize(C.TORCH_NPZ) < 2 * 2**20
    ref = C.torch_reference()  # np.load(allow_pickle=False) raises on object arrays
    stale = {k.split("::")[0] for k in ref} - {c.id for c in TORCH}
    assert not stale, f"answers for cases that no longer exist: {sorted(stale)}; {REGENERATE}"


# --- random ops ----------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["tape", "grad", "vjp", "jvp", "grad_graph", "compiled"])
def test_dropout_gradient_is_its_mask(path):
    C.check_dropout(path)


def test_dropout_forward():
    x = np.random.default_rng(0).uniform(0.5, 1.5, (50, 80)).astype(np.float32)
    y = ops.dropout(ml.tensor(x), 0.25).numpy()
    kept = y != 0
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y[kept], (x / np.float32(0.75))[kept])
    assert abs(1 - kept.mean() - 0.25) < 5 * np.sqrt(0.25 * 0.75 / x.size)
    np.testing.assert_array_equal(ops.dropout(ml.tensor(x), 0.0).numpy(), x)
    np.testing.assert_array_equal(ops.dropout(ml.tensor(x), 0.5, training=False).numpy(), x)
    assert ops.dropout(ml.tensor(np.zeros((0, 3))), 0.5).shape == (0, 3)


def test_dropout_masks_are_fresh_and_reproducible():
    x = ml.tensor(np.ones(200))
    ops.manual_seed(3)
    a, b = ops.dropout(x, 0.5).numpy(), ops.dropout(x, 0.5).numpy()
    ops.manual_seed(3)
    c, d = ops.dropout(x, 0.5).numpy(), ops.dropout(x, 0.5).numpy()
    assert not np.array_equal(a, b), "two dropout calls gave the same mask"
    np.testing.assert_array_equal(a, c)
    np.testing.assert_array_equal(b, d)


def test_rng_seed_is_fresh_per_call_and_reproducible():
    op = get("rng_seed")
    assert op.impure, "rng_seed draws fresh randomness: it must be marked impure"
    ops.manual_seed(11)
    first = [int(apply(op).numpy()) for _ in range(3)]
    ops.manual_seed(11)
    again = [int(apply(op).numpy()) for _ in range(3)]
    assert first == again and len(set(first)) == 3
    c = ml.compile(lambda x: x + ops.cast(apply(op), "float32"), np.zeros((), np.float32))
    assert len({float(c(np.zeros((), np.float32))) for _ in range(3)}) == 3
