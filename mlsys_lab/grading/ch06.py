"""Checks for chapter 6, the AI compiler frontend (``solutions/ch06_compiler_frontend.ipynb``).

6.1 VJP rules over numpy checked against float64 central differences, 6.2 forward mode with dual
numbers (the book's ``y = ln(x1) + x1 x2 - sin(x2)`` at (2, 5)), 6.3 common-subexpression
elimination and 6.4 constant folding as pure ``Graph -> Graph`` passes, compared with reference
passes kept here on seeded random traced graphs.
"""

from __future__ import annotations

import math

import numpy as np

from mlsys_lab.grading.ch04 import (
    first_difference,
    graph_snapshot,
    outputs_of,
    random_inputs,
    random_program,
)
from mlsys_lab.grading.checks import Case, Exercise, register

# ----------------------------------------------------------------------------- 6.1 VJP rules


def _numeric_vjp(f, args, g, i, eps=1e-6):
    """d/d args[i] of sum(g * f(*args)) by central differences in float64."""
    args = [np.array(a, dtype=np.float64) for a in args]
    x = args[i]
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        saved = x[idx]
        x[idx] = saved + eps
        hi = np.sum(g * f(*args))
        x[idx] = saved - eps
        lo = np.sum(g * f(*args))
        x[idx] = saved
        out[idx] = (hi - lo) / (2 * eps)
    return out


def _compare(got, expected, what, name):
    got = np.asarray(got, dtype=np.float64)
    if got.shape != expected.shape:
        raise AssertionError(
            f"{what}: the cotangent of {name} has shape {got.shape}, expected "
            f"{expected.shape} (the shape of {name})"
        )
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-7):
        err = np.max(np.abs(got - expected))
        raise AssertionError(
            f"{what}: the cotangent of {name} is off by up to {err:.3g} from central differences"
        )


def _pair(result, what):
    if not isinstance(result, (tuple, list)) or len(result) != 2:
        raise AssertionError(
            f"{what} should return a pair (grad_a, grad_b), got {type(result).__name__}"
        )
    return result


def _binary_case(rule, f, shapes, seed, label):
    rng = np.random.default_rng(seed)
    a, b = (rng.standard_normal(s) for s in shapes)
    g = rng.standard_normal(np.shape(f(a, b)))
    what = f"{label} with a{shapes[0]}, b{shapes[1]}"
    ga, gb = _pair(rule(g, a, b), what)
    _compare(ga, _numeric_vjp(f, [a, b], g, 0), what, "a")
    _compare(gb, _numeric_vjp(f, [a, b], g, 1), what, "b")


def _vjp_mul_same(vjp_mul, vjp_tanh, vjp_matmul):
    for seed, shape in enumerate([(3, 4), (5,), ()]):
        _binary_case(vjp_mul, np.multiply, (shape, shape), seed, "vjp_mul")


def _vjp_mul_broadcast(vjp_mul, vjp_tanh, vjp_matmul):
    for seed, shapes in enumerate(
        [((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3), ()), ((4,), (2, 3, 4))]
    ):
        _binary_case(vjp_mul, np.multiply, shapes, 10 + seed, "vjp_mul")


def _vjp_tanh(vjp_mul, vjp_tanh, vjp_matmul):
    for seed, shape in enumerate([(3, 4), (7,)]):
        rng = np.random.default_rng(20 + seed)
        x = rng.standard_normal(shape) * 2
        g = rng.standard_normal(shape)
        _compare(vjp_tanh(g, x), _numeric_vjp(np.tanh, [x], g, 0), f"vjp_tanh on x{shape}", "x")


def _vjp_matmul(vjp_mul, vjp_tanh, vjp_matmul):
    for seed, shapes in enumerate([((2, 3), (3, 5)), ((1, 4), (4, 1)), ((4, 4), (4, 2))]):
        _binary_case(vjp_matmul, np.matmul, shapes, 30 + seed, "vjp_matmul")


# ----------------------------------------------------------------------------- 6.2 dual numbers


def _make(Dual, value, tangent):
    d = Dual(value, tangent)
    for attr in ("value", "tangent"):
        if not hasattr(d, attr):
            raise AssertionError(f"Dual(value, tangent) has no attribute .{attr}")
    return d


def _number(x, what):
    try:
        return float(x)
    except Exception:
        raise AssertionError(f"{what} is {x!r}, not a number") from None


def _book_y(x1, x2):
    return x1.log() + x1 * x2 - x2.sin()


def _dual_book(Dual):
    y = _book_y(_make(Dual, 2.0, 1.0), _make(Dual, 5.0, 0.0))
    if not isinstance(y, Dual):
        raise AssertionError(
            f"y = ln(x1) + x1*x2 - sin(x2) gave a {type(y).__name__}, expected a Dual"
        )
    value = math.log(2.0) + 10.0 - math.sin(5.0)
    got_value, got_tangent = _number(y.value, "y.value"), _number(y.tangent, "y.tangent")
    if not math.isclose(got_value, value, rel_tol=1e-12):
        raise AssertionError(f"at (2, 5) y.value is {got_value!r}, expected {value!r}")
    if not math.isclose(got_tangent, 5.5, rel_tol=1e-12):
        raise AssertionError(
            f"seeding x1 (tangents 1, 0) gave dy = {got_tangent!r}, expected 5.5 = 1/x1 + x2"
        )


def _dual_book_x2(Dual):
    y = _book_y(_make(Dual, 2.0, 0.0), _make(Dual, 5.0, 1.0))
    expected = 2.0 - math.cos(5.0)
    got = _number(y.tangent, "y.tangent")
    if not math.isclose(got, expected, rel_tol=1e-12):
        raise AssertionError(
            f"seeding x2 (tangents 0, 1) gave dy = {got!r}, expected {expected:.6f} = x1 - cos(x2)"
        )


def _dual_numbers(Dual):
    cases = [
        ("x + 1.5", lambda x: x + 1.5, 4.5, 2.0),
        ("1.5 + x", lambda x: 1.5 + x, 4.5, 2.0),
        ("x - 1.5", lambda x: x - 1.5, 1.5, 2.0),
        ("1.5 - x", lambda x: 1.5 - x, -1.5, -2.0),
        ("x * 4", lambda x: x * 4, 12.0, 8.0),
        ("4 * x", lambda x: 4 * x, 12.0, 8.0),
        ("x * x", lambda x: x * x, 9.0, 12.0),
        ("x - x", lambda x: x - x, 0.0, 0.0),
    ]
    for label, f, value, tangent in cases:
        x = _make(Dual, 3.0, 2.0)
        y = f(x)
        if not isinstance(y, Dual):
            raise AssertionError(
                f"{label} with x = Dual(3, 2) gave a {type(y).__name__}, "
                f"expected an instance of your Dual class"
            )
        got = (_number(y.value, f"({label}).value"), _number(y.tangent, f"({label}).tangent"))
        if not (
            math.isclose(got[0], value, abs_tol=1e-12)
            and math.isclose(got[1], tangent, abs_tol=1e-12)
        ):
            raise AssertionError(
                f"{label} with x = Dual(3, 2) gave (value, tangent) = {got}, "
                f"expected {(value, tangent)}"
            )
        if (_number(x.value, "x.value"), _number(x.tangent, "x.tangent")) != (3.0, 2.0):
            raise AssertionError(f"{label} changed x itself; return a new Dual instead")


def _expr(x1, x2, sin, log):
    return sin(x1 * x2) * log(x1 * x1 + 1.0) - 3.0 * x2 + x1 * sin(x2) + log(x2 * x2 + 2.0)


def _dual_vs_jvp(Dual):
    import mlsys_lab as ml

    rng = np.random.default_rng(6)
    for i in range(6):
        p = rng.standard_normal(2)
        t = rng.standard_normal(2)
        y = _expr(
            _make(Dual, float(p[0]), float(t[0])),
            _make(Dual, float(p[1]), float(t[1])),
            lambda d: d.sin(),
            lambda d: d.log(),
        )
        _, expected = ml.jvp(
            lambda a, b: _expr(a, b, ml.ops.sin, ml.ops.log), (p[0], p[1]), (t[0], t[1])
        )
        expected = float(expected.numpy())
        got = _number(y.tangent, "y.tangent")
        if not math.isclose(got, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError(
                f"random point #{i} x = {np.round(p, 3).tolist()}, tangent "
                f"{np.round(t, 3).tolist()}: your tangent {got:.9g}, ml.jvp "
                f"gives {expected:.9g}"
            )


def _dual_arrays(Dual):
    x1 = _make(Dual, np.array([1.0, 2.0, 3.0]), np.ones(3))
    x2 = _make(Dual, np.array([0.5, 5.0, -1.0]), np.zeros(3))
    y = _book_y(x1, x2)
    expected = 1.0 / x1.value + x2.value
    got = np.asarray(y.tangent, dtype=np.float64)
    if got.shape != (3,) or not np.allclose(got, expected, rtol=1e-12):
        raise AssertionError(
            f"with numpy arrays as values, dy = {np.round(got, 4).tolist()}, "
            f"expected {np.round(expected, 4).tolist()}; use np.sin/np.cos/np.log "
            f"so arrays work too"
        )


# ----------------------------------------------------------------------------- graph passes


def _rebuild(graph, nodes, outputs, consts, name):
    """A new, linted Graph over fresh copies of every Value (the input graph stays untouched)."""
    from mlsys_lab.engine.graph import Graph, Node, Value

    fresh = {}

    def cp(v):
        if id(v) not in fresh:
            fresh[id(v)] = Value(v.name, v.shape, v.dtype)
        return fresh[id(v)]

    inputs = [cp(v) for v in graph.inputs]
    new_nodes = [
        Node(n.op, [cp(v) for v in n.inputs], n.attrs, [cp(o) for o in n.outputs], n.source)
        for n in nodes
    ]
    new_outputs = [cp(v) for v in outputs]
    used = {id(v) for n in nodes for v in n.inputs} | {id(v) for v in outputs}
    new_consts = {cp(v): arr for v, arr in consts.items() if id(v) in used}
    return Graph(
        inputs, new_nodes, new_outputs, new_consts, graph.out_tree, graph.in_tree, name
    ).lint()


def _ref_cse(graph):
    from mlsys_lab.engine.graph import Node

    replace, first, kept = {}, {}, []

    def key_of(v):
        v = replace.get(id(v), v)
        arr = graph.consts.get(v)
        if arr is not None and arr.ndim == 0:
            return ("literal", arr.dtype.str, arr.item())
        return id(v)

    for n in graph.nodes:
        key = (n.op, tuple(key_of(v) for v in n.inputs), repr(sorted(n.attrs.items())))
        if key in first:
            replace[id(n.outputs[0])] = first[key].outputs[0]
            continue
        twin = Node(n.op, [replace.get(id(v), v) for v in n.inputs], n.attrs, n.outputs, n.source)
        first[key] = twin
        kept.append(twin)
    outputs = [replace.get(id(v), v) for v in graph.outputs]
    return _rebuild(graph, kept, outputs, graph.consts, f"cse({graph.name})")


def _ref_fold(graph):
    from mlsys_lab.engine.graph import Node, Value
    from mlsys_lab.engine.registry import get
    from mlsys_lab.engine.tensor import run_kernel

    consts = dict(graph.consts)
    known = {id(v): arr for v, arr in consts.items()}
    kept = []
    for n in graph.nodes:
        if n.inputs and all(id(v) in known for v in n.inputs):
            arr = run_kernel(get(n.op), [known[id(v)] for v in n.inputs], n.attrs)
            out = n.outputs[0]
            value = Value(out.name, out.shape, out.dtype)
            known[id(out)] = arr
            consts[value] = arr
            kept.append(("alias", out, value))
        else:
            kept.append(("node", n, None))
    alias = {id(out): value for kind, out, value in kept if kind == "alias"}
    nodes = [
        Node(n.op, [alias.get(id(v), v) for v in n.inputs], n.attrs, n.outputs, n.source)
        for kind, n, _ in kept
        if kind == "node"
    ]
    outputs = [alias.get(id(v), v) for v in graph.outputs]
    return _rebuild(graph, nodes, outputs, consts, f"fold({graph.name})")


def _run_pass(fn, graph, what, pure=False):
    """Run the student's pass; with ``pure`` also fail if it changed its input graph."""
    from mlsys_lab.engine.graph import Graph

    before = graph_snapshot(graph)
    result = fn(graph)
    if not isinstance(result, Graph):
        raise AssertionError(f"{what}: returned {type(result).__name__}, expected a new Graph")
    if pure and result is graph:
        raise AssertionError(f"{what}: returned the input graph itself; a pass builds a new Graph")
    changed = first_difference(before, graph_snapshot(graph))
    if pure and changed:
        raise AssertionError(
            f"{what}: the input graph was changed ({changed}); a pass must not mutate its input. "
            f"Graph(...) relinks every Value it is given, so give the new graph fresh Values"
        )
    return result


def _run_and_compare(fn, graph, args, what):
    """Run the pass and check the result lints and computes what the input computed."""
    expected = outputs_of(graph, args)  # before the pass, in case it breaks its input
    n_inputs = len(graph.inputs)
    result = _run_pass(fn, graph, what)
    try:
        result.lint()
    except Exception as error:
        raise AssertionError(
            f"{what}: result.lint() failed: {str(error).splitlines()[0]}"
        ) from None
    if len(result.inputs) != n_inputs:
        raise AssertionError(
            f"{what}: the result takes {len(result.inputs)} inputs, the "
            f"original {n_inputs}; keep every input"
        )
    got = outputs_of(result, args)
    if len(got) != len(expected):
        raise AssertionError(
            f"{what}: the result returns {len(got)} outputs, expected {len(expected)}"
        )
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        if g.shape != e.shape or not np.allclose(g, e, rtol=1e-6, atol=1e-6):
            raise AssertionError(f"{what}: output {i} changed")
    return result


def _count(result, reference, what, verb):
    if len(result.nodes) > len(reference.nodes):
        raise AssertionError(
            f"{what}: {len(result.nodes)} nodes left, but {verb} can get it "
            f"down to {len(reference.nodes)}"
        )


# ----------------------------------------------------------------------------- 6.3 CSE


def _cse_book(cse):
    import mlsys_lab as ml

    def h(a, b):
        return a * 5 + a * 5 * b

    a = np.arange(8, dtype=np.float32)
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    g = ml.trace(h, a, b)
    what = "cse(trace(a*5 + a*5*b))"
    result = _run_and_compare(cse, g, [a, b], what)
    muls = [n for n in result.nodes if n.op == "mul" and n.inputs[0] is result.inputs[0]]
    if len(result.nodes) != 3 or len(muls) != 1:
        raise AssertionError(
            f"{what}: expected 3 nodes with one shared `a*5`, got {len(result.nodes)} nodes "
            f"({len(muls)} of them a*5); the two 5.0 literals are different Values with the "
            f"same value, so compare scalar constants by value"
        )


def _cse_random(cse):
    import mlsys_lab as ml

    for seed in range(8):
        args = random_inputs(seed)
        g = ml.trace(random_program(seed, n_ops=14, repeat=0.4), *args)
        what = f"random graph #{seed} ({len(g.nodes)} nodes)"
        reference = _ref_cse(g)
        result = _run_and_compare(cse, g, args, what)
        _count(result, reference, what, "CSE")


def _cse_keeps_apart(cse):
    import mlsys_lab as ml

    def k(x, y):
        p = x * 2.0 + x * 3.0
        q = ml.ops.sum(x, axis=0, keepdims=True) + ml.ops.sum(x, axis=1, keepdims=True)
        r = x - y + (y - x)
        return p, q + ml.ops.sum(y, axis=0, keepdims=True), r

    args = random_inputs(99)
    g = ml.trace(k, *args)
    what = "x*2 vs x*3, sum(axis=0) vs sum(axis=1), x-y vs y-x"
    n_nodes = len(g.nodes)
    result = _run_and_compare(cse, g, args, what)
    if len(result.nodes) != n_nodes:
        raise AssertionError(
            f"{what}: nothing here is a common subexpression, but the result has "
            f"{len(result.nodes)} nodes instead of {n_nodes}"
        )


def _cse_pure(cse):
    import mlsys_lab as ml

    for seed in (3, 11):
        g = ml.trace(random_program(seed, n_ops=12, repeat=0.5), *random_inputs(seed))
        _run_pass(cse, g, f"random graph #{seed}", pure=True)


# ----------------------------------------------------------------------------- 6.4 folding


def _folded_graphs():
    import mlsys_lab as ml
    from mlsys_lab.engine.passes.testing import bind_inputs

    def small(x, w):
        return x * (w * 2.0 + 1.0)

    x, w = random_inputs(5)
    out = [("x * (w*2 + 1), w frozen", bind_inputs(ml.trace(small, x, w), {1: w}), [x])]
    for seed in range(6):
        args = random_inputs(50 + seed, n_inputs=3)
        g = ml.trace(random_program(50 + seed, n_inputs=3, n_ops=14, repeat=0.2), *args)
        frozen = bind_inputs(g, {1: args[1], 2: args[2]})
        out.append((f"random graph #{seed}, 2 of 3 inputs frozen", frozen, [args[0]]))
    return out


def _fold_small(fold_constants):
    label, g, args = _folded_graphs()[0]
    result = _run_and_compare(fold_constants, g, args, label)
    if len(result.nodes) != 1:
        raise AssertionError(f"{label}: expected 1 node left (x * c), got {len(result.nodes)}")


def _fold_random(fold_constants):
    for label, g, args in _folded_graphs()[1:]:
        reference = _ref_fold(g)
        result = _run_and_compare(fold_constants, g, args, label)
        const_ids = {id(v) for v in result.consts}
        for n in result.nodes:
            if n.inputs and all(id(v) in const_ids for v in n.inputs):
                raise AssertionError(f"{label}: node {n!r} reads only constants; fold it")
        _count(result, reference, label, "folding")


def _fold_pure(fold_constants):
    for label, g, _ in _folded_graphs()[:3]:
        _run_pass(fold_constants, g, label, pure=True)


def _fold_consts_typed(fold_constants):
    for label, g, _ in _folded_graphs():
        result = _run_pass(fold_constants, g, label)
        for v, arr in result.consts.items():
            if not isinstance(arr, np.ndarray):
                raise AssertionError(
                    f"{label}: constant {v.name} holds a {type(arr).__name__}; "
                    f"store numpy arrays in graph.consts"
                )
            if arr.shape != v.shape or arr.dtype != v.dtype:
                raise AssertionError(
                    f"{label}: constant {v!r} holds an array "
                    f"{arr.dtype}{list(arr.shape)}; they must agree"
                )


register(
    Exercise(
        id="6.1",
        title="VJP rules by hand",
        target=("vjp_mul", "vjp_tanh", "vjp_matmul"),
        cases=(
            Case("vjp_mul, equal shapes", 1, _vjp_mul_same),
            Case("vjp_mul with broadcasting", 2, _vjp_mul_broadcast),
            Case("vjp_tanh", 1, _vjp_tanh),
            Case("vjp_matmul", 2, _vjp_matmul),
        ),
    ),
    Exercise(
        id="6.2",
        title="Forward mode with dual numbers",
        target="Dual",
        cases=(
            Case("book: dy = 5.5 at (2, 5)", 1, _dual_book),
            Case("book: seeding x2 gives 2 - cos 5", 1, _dual_book_x2),
            Case("+, -, * with numbers on either side", 1, _dual_numbers),
            Case("agrees with ml.jvp at 6 random points", 1.5, _dual_vs_jvp),
            Case("numpy arrays as values", 0.5, _dual_arrays),
        ),
    ),
    Exercise(
        id="6.3",
        title="Common-subexpression elimination",
        target="cse",
        cases=(
            Case("book: a*5 + a*5*b shares a*5", 1.5, _cse_book),
            Case("8 random graphs: outputs, node count, lint", 2.5, _cse_random),
            Case("different attrs/literals stay apart", 1, _cse_keeps_apart),
            Case("pure: the input graph is untouched", 1, _cse_pure),
        ),
    ),
    Exercise(
        id="6.4",
        title="Constant folding",
        target="fold_constants",
        cases=(
            Case("x * (w*2 + 1) folds to one node", 1, _fold_small),
            Case("6 random frozen graphs", 2, _fold_random),
            Case("folded constants are typed arrays", 0.5, _fold_consts_typed),
            Case("pure: the input graph is untouched", 0.5, _fold_pure),
        ),
    ),
)
