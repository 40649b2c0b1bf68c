"""Checks for chapter 6, the AI compiler frontend (``solutions/ch06_compiler_frontend.ipynb``).

6.1 VJP rules over numpy, 6.2 forward mode with dual numbers (the book's
``y = ln(x1) + x1 x2 - sin(x2)`` at (2, 5)), 6.3 common-subexpression elimination and 6.4
constant folding as pure ``Graph -> Graph`` passes. The judges' references are the library's
own: ``ml.vjp`` and ``ml.jvp`` for the rules, ``passes.common_subexpression_elimination`` and
``passes.constant_folding`` for the passes, all of which are off limits to the student's code.
"""

from __future__ import annotations

import math

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register
from mlsys_lab.grading.core.guard import unguarded
from mlsys_lab.grading.exercises.ch04_computational_graph import (
    AUTODIFF,
    as_array,
    first_difference,
    from_wire,
    graph_data,
    graph_from_data,
    graph_snapshot,
    lint_and_run,
    outputs_of,
    random_inputs,
    random_program,
    results,
)

# ----------------------------------------------------------------------------- 6.1 VJP rules
# A wrong idea that still produces plausible output would fail because: returning g * b without
# summing over the broadcast axes, summing only the leading axes, or summing to a scalar gives
# the wrong shape on (3, 1) x (1, 4), (2, 1, 4) x (3, 1) and friends; tanh' taken as 1 - x^2
# (of x, not of tanh x) or cos-like mistakes give wrong values; a transpose in the wrong place
# gives the wrong shape on non-square matrices; finite differences miss the 1e-12 tolerance.
# `ml.vjp`, `ml.grad`, the tape, the ops' own VJP rules and `unbroadcast` are off limits.

_MUL_SAME = ((3, 4), (5,), ())
_MUL_BROADCAST = (((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 3), ()), ((4,), (2, 3, 4)),
                  ((2, 1, 4), (3, 1)))
_MATMUL = (((2, 3), (3, 5)), ((1, 4), (4, 1)), ((4, 4), (4, 2)))
_TANH = ((3, 4), (7,), (2, 3))


def _binary_inputs(seed: int, i: int, shapes, f):
    rng = np.random.default_rng([seed, i])
    a, b = (np.asarray(rng.standard_normal(s)) for s in shapes)
    return np.asarray(rng.standard_normal(np.shape(f(a, b)))), a, b


def _tanh_inputs(seed: int, i: int):
    rng = np.random.default_rng([seed, 50 + i])
    scale = 3.0 if i == 2 else 1.0  # saturating inputs too
    return rng.standard_normal(_TANH[i]), rng.standard_normal(_TANH[i]) * scale


def _mul_cases(shapes_list, offset):
    return [(offset + i, shapes) for i, shapes in enumerate(shapes_list)]


_SAME = _mul_cases([(s, s) for s in _MUL_SAME], 0)
_BROADCAST = _mul_cases(_MUL_BROADCAST, 10)
_MATMULS = _mul_cases(_MATMUL, 30)


def _pair_of_arrays(result):
    return [as_array(r) for r in result] if isinstance(result, (tuple, list)) else as_array(result)


def _binary_probe(name: str, f, cases):
    def probe(vjp_mul, vjp_tanh, vjp_matmul, seed):
        rule = {"vjp_mul": vjp_mul, "vjp_matmul": vjp_matmul}[name]
        return [_pair_of_arrays(rule(*_binary_inputs(seed, i, shapes, f))) for i, shapes in cases]

    return probe


_ML_BINARY = {"vjp_mul": lambda x, y: x * y, "vjp_matmul": lambda x, y: x @ y}


def _reference_vjp(f, g, *xs):
    import mlsys_lab as ml

    _, back = ml.vjp(f, *xs)
    return [t.numpy() for t in back(g)]


def _compare(got, expected, what, name):
    got = from_wire(got)
    if not isinstance(got, np.ndarray):
        raise AssertionError(f"{what}: the cotangent of {name} is {describe(got)}, not an array")
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: the cotangent of {name} has shape {got.shape}, expected "
                             f"{expected.shape} (the shape of {name})")
    err = float(np.max(np.abs(got.astype(np.float64) - expected), initial=0.0))
    if not err <= 1e-12 * max(1.0, float(np.max(np.abs(expected), initial=0.0))):
        raise AssertionError(f"{what}: the cotangent of {name} is off by up to {err:.3g}")


def _binary_judge(name: str, f, cases):
    def judge(raw, seed):
        for (i, shapes), got in zip(cases, results(raw, len(cases), name), strict=True):
            g, a, b = _binary_inputs(seed, i, shapes, f)
            what = f"{name} with a{shapes[0]}, b{shapes[1]}"
            if not isinstance(got, list) or len(got) != 2:
                raise AssertionError(f"{what} should return a pair (grad_a, grad_b), got "
                                     f"{describe(got)}")
            ea, eb = _reference_vjp(_ML_BINARY[name], g, a, b)
            _compare(got[0], ea, what, "a")
            _compare(got[1], eb, what, "b")

    return judge


def _tanh_probe(vjp_mul, vjp_tanh, vjp_matmul, seed):
    return [as_array(vjp_tanh(*_tanh_inputs(seed, i))) for i in range(len(_TANH))]


def _tanh_judge(raw, seed):
    import mlsys_lab as ml

    for i, got in enumerate(results(raw, len(_TANH), "vjp_tanh")):
        g, x = _tanh_inputs(seed, i)
        (expected,) = _reference_vjp(ml.ops.tanh, g, x)
        _compare(got, expected, f"vjp_tanh on x{_TANH[i]}", "x")


# ----------------------------------------------------------------------------- 6.2 dual numbers
# A wrong idea that still produces plausible output would fail because: a product rule of
# tangents alone (da db), sin giving cos(a) without the factor da, or log giving 1/a, pass the
# book's seed (da = 1) but not the random tangents; `1.5 - x` computed as x - 1.5 fails the
# reflected operators; updating x in place fails "changed x"; tangents from finite differences
# miss the 1e-9 tolerance. `ml.jvp`, the rest of autodiff and the ops' JVP rules are off limits.


def _dual_out(y, Dual):
    return {"is_dual": isinstance(y, Dual), "type": type(y).__name__,
            "value": as_array(getattr(y, "value", None)),
            "tangent": as_array(getattr(y, "tangent", None))}


def _book_y(x1, x2):
    return x1.log() + x1 * x2 - x2.sin()


def _dual_book_probe(Dual):
    return [_dual_out(_book_y(Dual(2.0, 1.0), Dual(5.0, 0.0)), Dual),
            _dual_out(_book_y(Dual(2.0, 0.0), Dual(5.0, 1.0)), Dual)]


def _number(x, what):
    x = from_wire(x)
    if isinstance(x, np.ndarray) and x.shape == () and x.dtype.kind in "iuf":
        return float(x)
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        return float(x)
    raise AssertionError(f"{what} is {describe(x)}, not a number")


def _dual_result(out, what):
    if not isinstance(out, dict) or not out.get("is_dual"):
        got = out.get("type") if isinstance(out, dict) else describe(out)
        raise AssertionError(f"{what} gave a {got}, expected an instance of your Dual class")
    return _number(out["value"], f"{what}: .value"), _number(out["tangent"], f"{what}: .tangent")


def _dual_x1_judge(raw):
    value, tangent = _dual_result(results(raw, 2, "the book's y")[0], "y at (2, 5)")
    expected = math.log(2.0) + 10.0 - math.sin(5.0)
    if not math.isclose(value, expected, rel_tol=1e-12):
        raise AssertionError(f"at (2, 5) y.value is {value!r}, expected {expected!r}")
    if not math.isclose(tangent, 5.5, rel_tol=1e-12):
        raise AssertionError(f"seeding x1 (tangents 1, 0) gave dy = {tangent!r}, expected "
                             f"5.5 = 1/x1 + x2")


def _dual_x2_judge(raw):
    _, tangent = _dual_result(results(raw, 2, "the book's y")[1], "y at (2, 5)")
    expected = 2.0 - math.cos(5.0)
    if not math.isclose(tangent, expected, rel_tol=1e-12):
        raise AssertionError(f"seeding x2 (tangents 0, 1) gave dy = {tangent!r}, expected "
                             f"{expected:.6f} = x1 - cos(x2)")


_NUMBER_CASES = [
    ("x + 1.5", lambda x: x + 1.5, 4.5, 2.0),
    ("1.5 + x", lambda x: 1.5 + x, 4.5, 2.0),
    ("x - 1.5", lambda x: x - 1.5, 1.5, 2.0),
    ("1.5 - x", lambda x: 1.5 - x, -1.5, -2.0),
    ("x * 4", lambda x: x * 4, 12.0, 8.0),
    ("4 * x", lambda x: 4 * x, 12.0, 8.0),
    ("x * x", lambda x: x * x, 9.0, 12.0),
    ("x - x", lambda x: x - x, 0.0, 0.0),
]


def _dual_numbers_probe(Dual):
    out = []
    for _, f, _, _ in _NUMBER_CASES:
        x = Dual(3.0, 2.0)
        y = f(x)
        out.append([_dual_out(y, Dual), _dual_out(x, Dual)])
    return out


def _dual_numbers_judge(raw):
    for (label, _, value, tangent), got in zip(_NUMBER_CASES, results(raw, len(_NUMBER_CASES),
                                                                      "+, -, *"), strict=True):
        what = f"{label} with x = Dual(3, 2)"
        y, x = results(got, 2, what)
        pair = _dual_result(y, what)
        if not (math.isclose(pair[0], value, abs_tol=1e-12)
                and math.isclose(pair[1], tangent, abs_tol=1e-12)):
            raise AssertionError(f"{what} gave (value, tangent) = {pair}, expected "
                                 f"{(value, tangent)}")
        if _dual_result(x, what) != (3.0, 2.0):
            raise AssertionError(f"{label} changed x itself; return a new Dual instead")


def _expr(x1, x2, sin, log):
    return sin(x1 * x2) * log(x1 * x1 + 1.0) - 3.0 * x2 + x1 * sin(x2) + log(x2 * x2 + 2.0)


def _random_points(seed: int):
    rng = np.random.default_rng([seed, 6])
    return [(rng.standard_normal(2), rng.standard_normal(2)) for _ in range(6)]


def _dual_random_probe(Dual, seed):
    return [_dual_out(_expr(Dual(float(p[0]), float(t[0])), Dual(float(p[1]), float(t[1])),
                            lambda d: d.sin(), lambda d: d.log()), Dual)
            for p, t in _random_points(seed)]


def _dual_random_judge(raw, seed):
    import mlsys_lab as ml

    points = _random_points(seed)
    for i, ((p, t), got) in enumerate(zip(points, results(raw, len(points), "random points"),
                                          strict=True)):
        what = f"random point #{i} x = {np.round(p, 3).tolist()}, tangent {np.round(t, 3).tolist()}"
        _, tangent = _dual_result(got, what)
        _, expected = ml.jvp(lambda a, b: _expr(a, b, ml.ops.sin, ml.ops.log), (p[0], p[1]),
                             (t[0], t[1]))
        expected = float(expected.numpy())
        if not math.isclose(tangent, expected, rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError(f"{what}: your tangent {tangent:.12g}, forward mode gives "
                                 f"{expected:.12g}")


_X1 = np.array([1.0, 2.0, 3.0])
_X2 = np.array([0.5, 5.0, -1.0])


def _dual_arrays_probe(Dual):
    return _dual_out(_book_y(Dual(_X1.copy(), np.ones(3)), Dual(_X2.copy(), np.zeros(3))), Dual)


def _dual_arrays_judge(raw):
    got = from_wire(raw.get("tangent") if isinstance(raw, dict) else raw)
    expected = 1.0 / _X1 + _X2
    if not (isinstance(got, np.ndarray) and got.shape == (3,)
            and np.allclose(got.astype(np.float64), expected, rtol=1e-12)):
        raise AssertionError(f"with numpy arrays as values, dy = {describe(got)}, expected "
                             f"{np.round(expected, 4).tolist()}; use np.sin/np.cos/np.log so "
                             f"arrays work too")


# ----------------------------------------------------------------------------- graph passes


def _pass_result(fn, graph):
    """What a probe sends about ``fn(graph)``: the result as data, and purity evidence."""
    before = graph_snapshot(graph)
    result = fn(graph)
    return {"graph": graph_data(result), "same_object": result is graph, "before": before,
            "after": graph_snapshot(graph)}


def _judge_pass(got, graph, args, what, reference=None, verb=""):
    """Rebuild the student's result; check it lints, keeps the inputs, computes what ``graph``
    computes, and (with ``reference``) has exactly as many nodes as the library's pass leaves."""
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: the check got {describe(got)}")
    result = graph_from_data(got.get("graph"), what)
    if len(result.inputs) != len(graph.inputs):
        raise AssertionError(f"{what}: the result takes {len(result.inputs)} inputs, the original "
                             f"{len(graph.inputs)}; keep every input")
    rng = np.random.default_rng(len(graph.nodes))
    fresh = [rng.standard_normal(v.shape).astype(v.dtype) for v in graph.inputs]
    for xs in (args, fresh):
        expected = outputs_of(graph, xs)
        out = lint_and_run(result, xs, what)
        if len(out) != len(expected):
            raise AssertionError(f"{what}: the result returns {len(out)} outputs, expected "
                                 f"{len(expected)}")
        for i, (o, e) in enumerate(zip(out, expected, strict=True)):
            if o.shape != e.shape or not np.allclose(o, e, rtol=1e-6, atol=1e-6):
                raise AssertionError(f"{what}: output {i} changed")
    if reference is not None:
        _expect_count(result, reference, what, verb)
    return result


def _expect_count(result, reference, what, verb):
    if len(result.nodes) > len(reference.nodes):
        raise AssertionError(f"{what}: {len(result.nodes)} nodes left, but {verb} gets it down "
                             f"to {len(reference.nodes)}")
    if len(result.nodes) < len(reference.nodes):
        raise AssertionError(f"{what}: only {len(result.nodes)} nodes left, but correct {verb} "
                             f"keeps {len(reference.nodes)}: nodes that compute different values "
                             f"(or draw fresh randomness) must stay")


def _judge_pure(got, what):
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: the check got {describe(got)}")
    if got.get("same_object"):
        raise AssertionError(f"{what}: returned the input graph itself; a pass builds a new Graph")
    changed = first_difference(got.get("before"), got.get("after"))
    if changed:
        raise AssertionError(f"{what}: the input graph was changed ({changed}); a pass must not "
                             f"mutate its input. Graph(...) relinks every Value it is given, so "
                             f"give the new graph fresh Values")
    graph_from_data(got.get("graph"), what)


def _count_ops(graph, op):
    return sum(n.op == op for n in graph.nodes)


# ----------------------------------------------------------------------------- 6.3 CSE
# A wrong idea that still produces plausible output would fail because: comparing every operand
# by identity leaves the two `a*5` apart (each 5.0 is its own constant); keying operands before
# redirecting them misses chains of duplicates, and the random graphs require the exact node
# count of correct CSE; ignoring attrs or treating sub as commutative merges sum(axis=0) with
# sum(axis=1) or x - y with y - x (outputs change, node count drops); merging the two dropouts'
# `rng_seed` nodes (same op, no inputs) fixes one mask for both; editing the input's nodes in
# place fails purity. A pass that changes nothing (returns a copy) fails every case: each also
# asks for the duplicates to go. The library's CSE (any route, or its source pasted) is off limits.


def _book_graph():
    import mlsys_lab as ml

    def h(a, b):
        return a * 5 + a * 5 * b

    a = np.arange(8, dtype=np.float32)
    b = np.linspace(-1, 1, 8, dtype=np.float32)
    return ml.trace(h, a, b), [a, b]


def _cse_graph(seed: int, i: int):
    """Graph #i of the random case: #0 a chain of duplicates, then random programs."""
    import mlsys_lab as ml

    if i == 0:
        def chain(x, y):
            b1, b2 = ml.ops.tanh(x) * y, ml.ops.tanh(x) * y
            return ml.ops.sin(b1) + ml.ops.sin(b2) * 2.0

        args = random_inputs(seed % 1000)
        return ml.trace(chain, *args), args
    program_seed = int(np.random.default_rng([seed, 63, i]).integers(2**31))
    args = random_inputs(program_seed % 1000)
    return ml.trace(random_program(program_seed, n_ops=14, repeat=0.4), *args), args


def _apart_graph():
    import mlsys_lab as ml

    def k(x, y):
        p = x * 2.0 + x * 3.0 + x * 2.0000002
        q = ml.ops.sum(x, axis=0, keepdims=True) + ml.ops.sum(x, axis=1, keepdims=True)
        r = x - y + (y - x)
        same = ml.ops.neg(y) * ml.ops.neg(y)  # the one common subexpression here
        return p, q + ml.ops.sum(y, axis=0, keepdims=True), r, same

    args = random_inputs(99)
    return ml.trace(k, *args), args


def _impure_graph():
    import mlsys_lab as ml

    def k(x):
        return ml.ops.dropout(x, 0.5) + ml.ops.dropout(x, 0.5) + ml.ops.tanh(x) * ml.ops.tanh(x)

    return ml.trace(k, np.ones((3, 4), np.float32))


def _cse_book_judge(raw):
    graph, args = _book_graph()
    what = "cse(trace(a*5 + a*5*b))"
    result = _judge_pass(raw, graph, args, what)
    muls = [n for n in result.nodes if n.op == "mul" and n.inputs[0] is result.inputs[0]]
    if len(result.nodes) != 3 or len(muls) != 1:
        raise AssertionError(
            f"{what}: expected 3 nodes with one shared `a*5`, got {len(result.nodes)} nodes "
            f"({len(muls)} of them a*5); the two 5.0 literals are different Values with the "
            f"same value, so compare scalar constants by value"
        )


def _cse_random_probe(cse, seed):
    return [_pass_result(cse, _cse_graph(seed, i)[0]) for i in range(7)]


def _cse_random_judge(raw, seed):
    from mlsys_lab.engine.passes import common_subexpression_elimination

    for i, got in enumerate(results(raw, 7, "7 graphs")):
        graph, args = _cse_graph(seed, i)
        reference = common_subexpression_elimination(graph)
        what = "tanh(x)*y twice, then sin of each" if i == 0 else f"random graph #{i}"
        _judge_pass(got, graph, args, f"{what} ({len(graph.nodes)} nodes)", reference, "CSE")


def _cse_apart_judge(raw):
    graph, args = _apart_graph()
    what = "x*2 vs x*3 vs x*2.0000002, sum(axis=0) vs sum(axis=1), x-y vs y-x, neg(y) twice"
    result = _judge_pass(raw, graph, args, what)
    if len(result.nodes) != len(graph.nodes) - 1:
        raise AssertionError(f"{what}: only the two neg(y) are the same expression, so "
                             f"{len(graph.nodes) - 1} nodes should stay, not "
                             f"{len(result.nodes)}")


def _cse_impure_judge(raw):
    what = "dropout(x) + dropout(x) + tanh(x) * tanh(x)"
    result = graph_from_data(raw.get("graph") if isinstance(raw, dict) else raw, what)
    lint_and_run(result, [np.ones((3, 4), np.float32)], what)
    if _count_ops(result, "rng_seed") != 2 or _count_ops(result, "dropout") != 2:
        raise AssertionError(f"{what}: the result has {_count_ops(result, 'rng_seed')} rng_seed "
                             f"and {_count_ops(result, 'dropout')} dropout nodes, expected 2 of "
                             f"each: every draw of randomness is a different value (skip ops "
                             f"with get(op).impure)")
    if _count_ops(result, "tanh") != 1:
        raise AssertionError(f"{what}: the two tanh(x) are one expression; keep one")


def _cse_pure_probe(cse, seed):
    return [_pass_result(cse, _cse_graph(seed, 10 + i)[0]) for i in range(2)]


def _cse_pure_judge(raw, seed):
    from mlsys_lab.engine.passes import common_subexpression_elimination

    for i, got in enumerate(results(raw, 2, "2 random graphs")):
        _judge_pure(got, f"random graph #{i}")
        graph, args = _cse_graph(seed, 10 + i)
        _judge_pass(got, graph, args, f"random graph #{i}",
                    common_subexpression_elimination(graph), "CSE")


# ----------------------------------------------------------------------------- 6.4 folding
# A wrong idea that still produces plausible output would fail because: folding only nodes whose
# inputs were constants from the start (no propagation) leaves nodes that read only constants and
# misses the exact node count; folding a node with any constant input changes the outputs;
# baking the outputs for one input into constants fails on fresh inputs; folding `rng_seed` (a
# node with no inputs at all) freezes the dropout mask; a Python float or a float64 array as a
# constant of a float32 value fails the typed-constants case; a pass that folds nothing fails
# every case, each of which also asks for the folding. The library's folding (any route, or its
# source pasted) and re-tracing the graph (the tracer folds constants) are off limits.


def _frozen(graph_fn, seed_inputs, values):
    import mlsys_lab as ml
    from mlsys_lab.engine.random_graphs import bind_inputs

    with unguarded():  # tracing is off limits to the student's code, not to the check
        graph = ml.trace(graph_fn, *seed_inputs)
    return bind_inputs(graph, values)


def _folded_graphs(seed: int):
    """(label, graph with frozen inputs, the remaining inputs): a small one, random ones."""
    import mlsys_lab as ml

    def small(x, w):
        return x * (w * 2.0 + 1.0)

    x, w = random_inputs(5)
    rng = np.random.default_rng([seed, 64])
    w = (w + rng.standard_normal(w.shape)).astype(np.float32)
    out = [("x * (w*2 + 1), w frozen", _frozen(small, [x, w], {1: w}), [x])]
    for i in range(5):
        program_seed = int(rng.integers(2**31))
        args = random_inputs(program_seed % 1000, n_inputs=3)
        fn = random_program(program_seed, n_inputs=3, n_ops=14, repeat=0.2)
        frozen = _frozen(fn, args, {1: args[1], 2: args[2]})
        out.append((f"random graph #{i}, 2 of 3 inputs frozen", frozen, [args[0]]))

    def noisy(x, w):
        return x + ml.ops.dropout(w * 2.0, 0.5)

    out.append(("x + dropout(w*2), w frozen", _frozen(noisy, [x, w], {1: w}), [x]))
    return out


def _fold_probe(fold_constants, seed):
    return [graph_data(fold_constants(graph)) for _, graph, _ in _folded_graphs(seed)]


def _fold_small_judge(raw, seed):
    label, graph, args = _folded_graphs(seed)[0]
    result = _judge_pass({"graph": results(raw, 7, "folded graphs")[0]}, graph, args, label)
    if len(result.nodes) != 1:
        raise AssertionError(f"{label}: expected 1 node left (x * c), got {len(result.nodes)}")


def _fold_random_judge(raw, seed):
    from mlsys_lab.engine.passes import constant_folding

    graphs = _folded_graphs(seed)
    for (label, graph, args), data in zip(graphs[1:6], results(raw, 7, "folded graphs")[1:6],
                                          strict=True):
        result = _judge_pass({"graph": data}, graph, args, label)
        for n in result.nodes:
            if n.inputs and all(v in result.consts for v in n.inputs):
                raise AssertionError(f"{label}: node {n!r} reads only constants; fold it")
        _expect_count(result, constant_folding(graph), label, "folding")


def _fold_impure_judge(raw, seed):
    label, graph, args = _folded_graphs(seed)[6]
    result = graph_from_data(results(raw, 7, "folded graphs")[6], label)
    lint_and_run(result, args, label)
    if _count_ops(result, "rng_seed") != 1 or _count_ops(result, "dropout") != 1:
        raise AssertionError(f"{label}: the rng_seed and dropout nodes must stay (got "
                             f"{_count_ops(result, 'rng_seed')} and "
                             f"{_count_ops(result, 'dropout')}): rng_seed has no inputs but "
                             f"draws fresh randomness on every run, so it is not a constant")
    if _count_ops(result, "mul") != 0:
        raise AssertionError(f"{label}: w*2 reads only constants; fold it")


def _fold_typed_judge(raw, seed):
    from mlsys_lab.engine.passes import constant_folding

    for (what, graph, args), data in zip(_folded_graphs(seed), results(raw, 7, "folded graphs"),
                                         strict=True):
        if not isinstance(data, dict) or not data.get("is_graph"):
            graph_from_data(data, what)  # fails with the reason
        for k, arr in data["consts"]:
            arr = from_wire(arr)
            name, shape, dtype = data["values"][k]
            if not isinstance(arr, np.ndarray):
                raise AssertionError(f"{what}: constant {name} holds {describe(arr)}; store "
                                     f"numpy arrays in graph.consts")
            if list(arr.shape) != list(shape) or arr.dtype != np.dtype(dtype):
                raise AssertionError(f"{what}: constant {name} is declared "
                                     f"{np.dtype(dtype)}{list(shape)} but holds an array "
                                     f"{arr.dtype}{list(arr.shape)}; they must agree")
        reference = constant_folding(graph)
        if _count_ops(graph, "dropout"):  # random outputs: compare the structure only
            _expect_count(graph_from_data(data, what), reference, what, "folding")
        else:
            _judge_pass({"graph": data}, graph, args, what, reference, "folding")


def _fold_pure_probe(fold_constants, seed):
    return [_pass_result(fold_constants, graph) for _, graph, _ in _folded_graphs(seed)[:3]]


def _fold_pure_judge(raw, seed):
    from mlsys_lab.engine.passes import constant_folding

    for (label, graph, args), got in zip(_folded_graphs(seed)[:3],
                                         results(raw, 3, "3 folded graphs"), strict=True):
        _judge_pure(got, label)
        _judge_pass(got, graph, args, label, constant_folding(graph), "folding")


# ----------------------------------------------------------------------------- registration

_GRAPH_PASSES = ("mlsys_lab.engine.passes.frontend",)

register(
    Exercise(
        id="6.1",
        title="VJP rules by hand",
        target=("vjp_mul", "vjp_tanh", "vjp_matmul"),
        task="the VJP rules",
        forbidden=AUTODIFF,
        cases=(
            Case("vjp_mul, equal shapes", 1, feedback="(g * b, g * a)",
                 probe=_binary_probe("vjp_mul", np.multiply, _SAME),
                 judge=_binary_judge("vjp_mul", np.multiply, _SAME)),
            Case("vjp_mul with broadcasting", 2, feedback="sum back over the broadcast axes",
                 probe=_binary_probe("vjp_mul", np.multiply, _BROADCAST),
                 judge=_binary_judge("vjp_mul", np.multiply, _BROADCAST)),
            Case("vjp_tanh", 1, feedback="g * (1 - tanh(x)^2)", probe=_tanh_probe,
                 judge=_tanh_judge),
            Case("vjp_matmul", 2, feedback="(g @ b^T, a^T @ g)",
                 probe=_binary_probe("vjp_matmul", np.matmul, _MATMULS),
                 judge=_binary_judge("vjp_matmul", np.matmul, _MATMULS)),
        ),
    ),
    Exercise(
        id="6.2",
        title="Forward mode with dual numbers",
        target="Dual",
        task="forward mode (the dual-number rules)",
        forbidden=AUTODIFF,
        cases=(
            Case("book: dy = 5.5 at (2, 5)", 1, feedback="1/x1 + x2",
                 probe=_dual_book_probe, judge=_dual_x1_judge),
            Case("book: seeding x2 gives 2 - cos 5", 1, feedback="x1 - cos(x2)",
                 probe=_dual_book_probe, judge=_dual_x2_judge),
            Case("+, -, * with numbers on either side", 1, feedback="lift numbers to Duals",
                 probe=_dual_numbers_probe, judge=_dual_numbers_judge),
            Case("random points and tangents", 1.5, feedback="the product and chain rules",
                 probe=_dual_random_probe, judge=_dual_random_judge),
            Case("numpy arrays as values", 0.5, feedback="use np.sin/np.cos/np.log",
                 probe=_dual_arrays_probe, judge=_dual_arrays_judge),
        ),
    ),
    Exercise(
        id="6.3",
        title="Common-subexpression elimination",
        target="cse",
        task="common-subexpression elimination",
        forbidden=_GRAPH_PASSES,
        cases=(
            Case("book: a*5 + a*5*b shares a*5", 1.5, feedback="compare scalar literals by value",
                 probe=lambda cse: _pass_result(cse, _book_graph()[0]), judge=_cse_book_judge),
            Case("duplicate chains, 6 random graphs: outputs, node count", 2.5,
                 feedback="key operands after redirecting them",
                 probe=_cse_random_probe, judge=_cse_random_judge),
            Case("different attrs/literals stay apart", 1, feedback="attrs and values matter",
                 probe=lambda cse: _pass_result(cse, _apart_graph()[0]),
                 judge=_cse_apart_judge),
            Case("two dropouts stay two", 0.5, feedback="never merge impure ops",
                 probe=lambda cse: _pass_result(cse, _impure_graph()), judge=_cse_impure_judge),
            Case("pure: the input graph is untouched", 1, feedback="build new Nodes",
                 probe=_cse_pure_probe, judge=_cse_pure_judge),
        ),
    ),
    Exercise(
        id="6.4",
        title="Constant folding",
        target="fold_constants",
        task="constant folding",
        forbidden=(*_GRAPH_PASSES, "mlsys_lab.engine.trace", "mlsys_lab.engine.autodiff_graph"),
        cases=(
            Case("x * (w*2 + 1) folds to one node", 1, feedback="fold along chains",
                 probe=_fold_probe, judge=_fold_small_judge),
            Case("5 random frozen graphs", 2, feedback="fold every all-constant node",
                 probe=_fold_probe, judge=_fold_random_judge),
            Case("rng_seed and dropout are never folded", 0.5, feedback="skip impure ops",
                 probe=_fold_probe, judge=_fold_impure_judge),
            Case("folded constants are typed arrays", 0.5, feedback="numpy arrays, right dtype",
                 probe=_fold_probe, judge=_fold_typed_judge),
            Case("pure: the input graph is untouched", 0.5, feedback="build new Nodes",
                 probe=_fold_pure_probe, judge=_fold_pure_judge),
        ),
    ),
)
