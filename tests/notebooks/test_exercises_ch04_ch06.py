"""Exercises 4.1-4.4 and 6.1-6.4 (issue 10): the reference solutions score full marks on every
seed, and each shortcut and wrong idea scores 0 on the cases that test the idea.

Shortcuts (the library doing the exercise) must be refused by the guard ("off limits"); wrong
ideas (plausible output without the concept) must fail the concept's cases. The answers run in
this process through ``run_cases``, the check cells' own path; two tests grade whole notebooks
in a kernel, where the answer cells are student code the grader has never seen.
"""

from __future__ import annotations

import graphlib
import importlib.util
import inspect
import textwrap
from pathlib import Path

import nbformat
import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import schedule
from mlsys_lab.engine.graph import Graph, Node, Value
from mlsys_lab.engine.passes import frontend
from mlsys_lab.engine.registry import get
from mlsys_lab.engine.tensor import run_kernel
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.core.exercise import get_exercise
from mlsys_lab.grading.core.grader import grade

ROOT = Path(__file__).resolve().parents[2]
CH04 = "ch04_computational_graph.ipynb"
CH06 = "ch06_compiler_frontend.ipynb"
HAS_NETWORKX = importlib.util.find_spec("networkx") is not None


def _namespace(name: str) -> dict:
    """The solution notebook's imports, helpers and reference answers, run here."""
    nb = nbformat.read(ROOT / "solutions" / name, as_version=4)
    scope: dict = {}
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "code" and "check(" not in cell.source and \
                "raises-exception" not in tags:
            exec(compile(cell.source, f"<{name}>", "exec"), scope)
    return scope


@pytest.fixture(scope="module")
def ch04():
    return _namespace(CH04)


@pytest.fixture(scope="module")
def ch06():
    return _namespace(CH06)


def _run(exercise_id, *answers, seed=12345):
    return run_cases(exercise_id, *answers, seed=seed)


def _rows(result) -> dict:
    return {row.name: row for row in result.rows}


def _refused(result):
    """Every case scores 0 and says which library function was off limits."""
    assert result.score == 0, [(r.name, r.points) for r in result.rows]
    for row in result.rows:
        assert "off limits here" in row.feedback, (row.name, row.feedback)


def _fails(result, *names):
    """The named cases (the ones that test the idea) score 0."""
    rows = _rows(result)
    assert set(names) <= set(rows), sorted(rows)
    for name in names:
        assert rows[name].points == 0 and not rows[name].passed, (name, rows[name].feedback)


# ----------------------------------------------------------------------------- solutions


@pytest.mark.parametrize("exercise_id", ["4.1", "4.2", "4.3", "4.4", "6.1", "6.2", "6.3", "6.4"])
def test_reference_solutions_score_full_marks_on_every_seed(exercise_id, ch04, ch06):
    scope = ch04 if exercise_id.startswith("4") else ch06
    exercise = get_exercise(exercise_id)
    answers = [scope[name] for name in exercise.targets]
    for seed in (0, 1, 987654):
        result = _run(exercise_id, *answers, seed=seed)
        assert result.score == result.max > 0, [(r.name, r.feedback) for r in result.rows]


    for exercise_id in ("4.1", "4.2", "4.3", "4.4", "6.1", "6.2", "6.3", "6.4"):
        get_exercise(exercise_id)


# ----------------------------------------------------------------------------- 4.1 Kahn


def _pasted(fn, rename: str):
    """``fn``'s source pasted into a cell: decorators dropped, renamed, docstring rewritten."""
    source = textwrap.dedent(inspect.getsource(fn))
    source = "\n".join(line for line in source.splitlines() if not line.startswith("@"))
    if fn.__doc__:
        source = source.replace(fn.__doc__, "My own version.")
    source = source.replace(f"def {fn.__name__}(", f"def {rename}(")
    scope = dict(fn.__globals__)
    exec(compile("\n\n" + source, "<pasted cell>", "exec"), scope)
    return scope[rename]


saved_kahn = schedule.kahn


def _graphlib_sort(nodes, edges):
    sorter = graphlib.TopologicalSorter({n: [] for n in nodes})
    for a, b in edges:
        sorter.add(b, a)
    return list(sorter.static_order())


def _networkx_sort(nodes, edges):
    import networkx as nx

    graph = nx.DiGraph()
    graph.add_nodes_from(nodes)
    graph.add_edges_from(edges)
    return list(nx.topological_sort(graph))


KAHN_SHORTCUTS = {
    "calling engine.schedule.kahn": lambda nodes, edges: schedule.kahn(nodes, edges),
    "kahn itself as the answer": schedule.kahn,
    "a reference to kahn saved at import": lambda nodes, edges: saved_kahn(nodes, edges),
    "kahn's source pasted and renamed": _pasted(schedule.kahn, "my_sort"),
    "graphlib.TopologicalSorter": _graphlib_sort,
}
if HAS_NETWORKX:
    KAHN_SHORTCUTS["networkx.topological_sort"] = _networkx_sort


@pytest.mark.parametrize("how", list(KAHN_SHORTCUTS))
def test_4_1_library_topological_sorts_are_refused(how):
    _refused(_run("4.1", KAHN_SHORTCUTS[how]))


def _dfs_sort(nodes, edges):
    succ = {n: [b for a, b in edges if a == n] for n in nodes}
    done, order = set(), []
    for root in nodes:
        stack = [(root, iter(succ[root]))] if root not in done else []
        done.add(root)
        while stack:
            node, it = stack[-1]
            nxt = next((m for m in it if m not in done), None)
            if nxt is None:
                stack.pop()
                order.append(node)
            else:
                done.add(nxt)
                stack.append((nxt, iter(succ[nxt])))
    return order[::-1]  # reverse postorder


def _kahn_with(pop_index, nodes, edges):
    indeg = {n: 0 for n in nodes}
    for _, b in edges:
        indeg[b] += 1
    ready = [n for n in nodes if indeg[n] == 0]
    order = []
    while ready:
        n = ready.pop(pop_index(ready, nodes))
        order.append(n)
        for a, b in edges:
            if a == n:
                indeg[b] -= 1
                if indeg[b] == 0:
                    ready.append(b)
    if len(order) < len(nodes):
        raise ml.CycleError("cycle")
    return order


def _lifo_sort(nodes, edges):
    return _kahn_with(lambda ready, nodes: len(ready) - 1, nodes, edges)


def _first_in_nodes_sort(nodes, edges):
    return _kahn_with(lambda ready, nodes: min(range(len(ready)),
                                                key=lambda i: nodes.index(ready[i])), nodes, edges)


def test_4_1_a_valid_order_that_is_not_kahns_fails_the_queue_order():
    for answer in (_dfs_sort, _lifo_sort, _first_in_nodes_sort):
        for seed in (3, 4, 5):
            result = _run("4.1", answer, seed=seed)
            _fails(result, "the order a FIFO queue gives")
            assert _rows(result)["valid order on 12 random DAGs"].passed  # only the idea fails
    _fails(_run("4.1", _dfs_sort), "book example: a b c d e (b a c d e listed e..a)")
    _fails(_run("4.1", _lifo_sort), "book example: a b c d e (b a c d e listed e..a)")


def test_4_1_a_sort_that_misses_cycles_fails_the_cycle_case(ch04):
    honest = ch04["topological_sort"]

    def partial(nodes, edges):
        try:
            return honest(nodes, edges)
        except ml.CycleError:
            return []

    def two_cycles_only(nodes, edges):
        if any((b, a) in edges for a, b in edges):
            raise ml.CycleError("a 2-cycle")
        try:
            return honest(nodes, edges)
        except ml.CycleError:
            return nodes

    for answer in (partial, two_cycles_only):
        _fails(_run("4.1", answer), "cycles raise ml.CycleError")


# ----------------------------------------------------------------------------- 4.2 classify

saved_dependency = Graph.dependency  # "f = Graph.dependency" before any check runs
saved_ancestors = Graph.ancestors


def _bound_elsewhere():
    def f(x):
        return ml.ops.neg(x)

    return ml.trace(f, np.zeros(2, np.float32)).dependency  # a bound method of another graph


def _ancestors_answer(graph, a, b):
    if any(v.producer is a for v in b.inputs) or any(v.producer is b for v in a.inputs):
        return "direct"
    linked = a in saved_ancestors(graph, b) or b in saved_ancestors(graph, a)
    return "indirect" if linked else "independent"


def _networkx_classify(graph, a, b):
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(id(n) for n in graph.nodes)
    g.add_edges_from((id(v.producer), id(n)) for n in graph.nodes for v in n.inputs
                     if v.producer is not None)
    if g.has_edge(id(a), id(b)) or g.has_edge(id(b), id(a)):
        return "direct"
    linked = nx.has_path(g, id(a), id(b)) or nx.has_path(g, id(b), id(a))
    return "indirect" if linked else "independent"


bound = _bound_elsewhere()
CLASSIFY_SHORTCUTS = {
    "graph.dependency": lambda graph, a, b: graph.dependency(a, b),
    "Graph.dependency saved before the check": lambda graph, a, b: saved_dependency(graph, a, b),
    "a bound method's __func__": lambda graph, a, b: bound.__func__(graph, a, b),
    "Graph.ancestors saved before the check": _ancestors_answer,
}
if HAS_NETWORKX:
    CLASSIFY_SHORTCUTS["networkx.has_path"] = _networkx_classify


@pytest.mark.parametrize("how", list(CLASSIFY_SHORTCUTS))
def test_4_2_graph_dependency_is_refused_by_every_route(how):
    _refused(_run("4.2", CLASSIFY_SHORTCUTS[how]))
    x = _bound_elsewhere().__self__  # and it works again after the check
    assert x.dependency(x.nodes[0], x.nodes[0]) == "independent"


def _reaches(src, dst, hops=None):
    todo, seen, depth = [(dst, 0)], set(), 0
    while todo:
        node, depth = todo.pop()
        for v in node.inputs:
            p = v.producer
            if p is src and (hops is None or depth + 1 <= hops):
                return True
            if p is not None and id(p) not in seen and (hops is None or depth + 1 < hops):
                seen.add(id(p))
                todo.append((p, depth + 1))
    return False


def _direct(a, b):
    return any(v.producer is a for v in b.inputs) or any(v.producer is b for v in a.inputs)


def _one_direction(graph, a, b):
    if any(v.producer is a for v in b.inputs):
        return "direct"
    return "indirect" if _reaches(a, b) else "independent"


def _siblings_indirect(graph, a, b):
    if _direct(a, b):
        return "direct"
    shared = {id(v) for v in a.inputs} & {id(v) for v in b.inputs}
    return "indirect" if shared or _reaches(a, b) or _reaches(b, a) else "independent"


def _two_hops(graph, a, b):
    if _direct(a, b):
        return "direct"
    return "indirect" if _reaches(a, b, 2) or _reaches(b, a, 2) else "independent"


def test_4_2_wrong_ideas_of_dependency_fail():
    _fails(_run("4.2", _one_direction), "hand-made graph: both directions, siblings",
           "every pair in 6 random traced graphs")
    _fails(_run("4.2", _siblings_indirect), "hand-made graph: both directions, siblings",
           "every pair in 6 random traced graphs")
    _fails(_run("4.2", _two_hops), "a 30-node chain: paths of any length")


# ----------------------------------------------------------------------------- 4.3 unroll


def _trace_unroll(body, n):
    def loop(x):
        for _ in range(n):
            x = body(x)
        return x

    x = body.inputs[0]
    return ml.trace(loop, np.zeros(x.shape, x.dtype))


def _copy_unroll(body, n):
    copies = [body.copy() for _ in range(n)]
    carry, nodes, consts = copies[0].inputs[0], [], {}
    for c in copies:
        swap = {id(c.inputs[0]): carry}
        for node in c.nodes:
            node.inputs = [swap.get(id(v), v) for v in node.inputs]
            nodes.append(node)
        consts.update(c.consts)
        carry = c.outputs[0]
    return Graph([copies[0].inputs[0]], nodes, [carry], consts)


UNROLL_SHORTCUTS = {
    "ml.trace unrolls the loop": _trace_unroll,
    "Graph.copy per iteration": _copy_unroll,
}


@pytest.mark.parametrize("how", list(UNROLL_SHORTCUTS))
def test_4_3_letting_the_library_unroll_is_refused(how):
    _refused(_run("4.3", UNROLL_SHORTCUTS[how]))


def _fresh_values(body, i):
    return {id(v): Value(f"{v.name}_{i}", v.shape, v.dtype) for v in body.values()
            if v.producer is not None}


def _same_nodes(body, n):
    return Graph(body.inputs, list(body.nodes) * n, body.outputs, body.consts)


def _body_values(body, n):
    """Fresh Nodes, but the body's own Values (inputs, constants) wired through."""
    carry, nodes = body.inputs[0], []
    for i in range(n):
        env = {id(body.inputs[0]): carry, **_fresh_values(body, i)}
        for node in body.nodes:
            nodes.append(Node(node.op, [env.get(id(v), v) for v in node.inputs], node.attrs,
                              [env[id(o)] for o in node.outputs], node.source))
        carry = env[id(body.outputs[0])]
    return Graph([body.inputs[0]], nodes, [carry], body.consts)


def _no_carry(body, n):
    """Every iteration reads the original input."""
    x = Value("x0", body.inputs[0].shape, body.inputs[0].dtype)
    consts = {Value(f"k{j}", v.shape, v.dtype): a for j, (v, a) in enumerate(body.consts.items())}
    const_of = {id(v): c for v, c in zip(body.consts, consts, strict=True)}
    nodes, out = [], x
    for i in range(n):
        env = {id(body.inputs[0]): x, **const_of, **_fresh_values(body, i)}
        for node in body.nodes:
            nodes.append(Node(node.op, [env[id(v)] for v in node.inputs], node.attrs,
                              [env[id(o)] for o in node.outputs], node.source))
        out = env[id(body.outputs[0])]
    return Graph([x], nodes, [out], consts)


def _baked(body, n):
    """The answer for one input (ones), baked in as a constant."""
    x = np.ones(body.inputs[0].shape, body.inputs[0].dtype)
    for _ in range(n):
        x = np.asarray(body(x))
    answer = Value("answer", x.shape, x.dtype)
    return Graph([Value("x0", x.shape, x.dtype)], [], [answer], {answer: x})


def test_4_3_wrong_ideas_of_unrolling_fail():
    _fails(_run("4.3", _same_nodes), "n copies, fresh nodes and names, lints")
    result = _run("4.3", _body_values)
    _fails(result, "n copies, fresh nodes and names, lints", "the body graph is not changed")
    _fails(_run("4.3", _no_carry), "outputs equal n runs of the body")
    _fails(_run("4.3", _baked), "outputs equal n runs of the body",
           "n copies, fresh nodes and names, lints")


# ----------------------------------------------------------------------------- 4.4 chain rule


def _mlp_loss(X, label):
    def loss(W, W1):
        d = ml.ops.tanh(ml.tensor(X) @ W) @ W1 - ml.tensor(label)
        return (d * d).sum() * 0.5

    return loss


def _by_grad(X, W, W1, label):
    gW, gW1 = ml.grad(_mlp_loss(X, label), argnums=(0, 1))(W, W1)
    return gW.numpy(), gW1.numpy()


def _by_value_and_grad(X, W, W1, label):
    _, (gW, gW1) = ml.value_and_grad(_mlp_loss(X, label), argnums=(0, 1))(W, W1)
    return gW.numpy(), gW1.numpy()


def _by_vjp(X, W, W1, label):
    _, back = ml.vjp(_mlp_loss(X, label), W, W1)
    gW, gW1 = back(np.ones(()))
    return gW.numpy(), gW1.numpy()


def _by_jvp(X, W, W1, label):
    out = []
    for k, P in enumerate((W, W1)):
        grad = np.zeros_like(P)
        for idx in np.ndindex(P.shape):
            tangents = [np.zeros_like(W), np.zeros_like(W1)]
            tangents[k][idx] = 1.0
            grad[idx] = ml.jvp(_mlp_loss(X, label), (W, W1), tangents)[1].numpy()
        out.append(grad)
    return tuple(out)


def _by_grad_graph(X, W, W1, label):
    def loss(X, W, W1, label):
        d = ml.ops.tanh(X @ W) @ W1 - label
        return (d * d).sum() * 0.5

    g = ml.grad_graph(ml.trace(loss, X, W, W1, label), wrt=[1, 2])
    _, gW, gW1 = g(X, W, W1, label)
    return gW.numpy(), gW1.numpy()


def _by_tape(X, W, W1, label):
    Wt, W1t = ml.tensor(W, requires_grad=True), ml.tensor(W1, requires_grad=True)
    d = ml.ops.tanh(ml.tensor(X) @ Wt) @ W1t - ml.tensor(label)
    ((d * d).sum() * 0.5).backward()
    return Wt.grad.numpy(), W1t.grad.numpy()


def _by_the_ops_rules(X, W, W1, label):
    """The registry's VJP rules called by hand (no autodiff entry point)."""
    t = ml.tensor
    X1 = t(X) @ t(W)
    H = ml.ops.tanh(X1)
    Y = H @ t(W1)
    dY = Y - t(label)
    dH, dW1 = get("matmul").vjp(dY, [H, t(W1)], Y, (True, True))
    (dX1,) = get("tanh").vjp(dH, [X1], H, (True,))
    _, dW = get("matmul").vjp(dX1, [t(X), t(W)], X1, (False, True))
    return dW.numpy(), dW1.numpy()


AUTODIFF_SHORTCUTS = {
    "ml.grad": _by_grad,
    "ml.value_and_grad": _by_value_and_grad,
    "ml.vjp": _by_vjp,
    "ml.jvp, one column at a time": _by_jvp,
    "ml.grad_graph": _by_grad_graph,
    "the tape's backward()": _by_tape,
    "the ops' own VJP rules": _by_the_ops_rules,
}


@pytest.mark.parametrize("how", list(AUTODIFF_SHORTCUTS))
def test_4_4_library_autodiff_is_refused(how):
    answer = AUTODIFF_SHORTCUTS[how]
    X, W, W1, label = (np.random.default_rng(0).standard_normal(s) for s in
                       ((4, 3), (3, 5), (5, 2), (4, 2)))
    expected = _by_grad(X, W, W1, label)
    np.testing.assert_allclose(answer(X, W, W1, label)[0], expected[0])  # it is a real answer
    _refused(_run("4.4", answer))


def _chapter_formulas(X, W, W1, label):
    """Chapter 4's linear example pasted: no tanh."""
    X1 = X @ W
    Y = X1 @ W1
    return X.T @ (Y - label) @ W1.T, X1.T @ (Y - label)


def _forgets_tanh_derivative(X, W, W1, label):
    H = np.tanh(X @ W)
    dY = H @ W1 - label
    return X.T @ (dY @ W1.T), H.T @ dY


def _derivative_of_h(X, W, W1, label):
    H = np.tanh(X @ W)
    dY = H @ W1 - label
    return X.T @ ((dY @ W1.T) * (1 - np.tanh(H) ** 2)), H.T @ dY


def _finite_differences(X, W, W1, label, eps=1e-6):
    def loss(W, W1):
        return 0.5 * np.sum((np.tanh(X @ W) @ W1 - label) ** 2)

    out = []
    for k, P in enumerate((W.copy(), W1.copy())):
        grad = np.zeros_like(P)
        for idx in np.ndindex(P.shape):
            hi, lo = P.copy(), P.copy()
            hi[idx] += eps
            lo[idx] -= eps
            args = [(hi, W1), (W, hi)][k], [(lo, W1), (W, lo)][k]
            grad[idx] = (loss(*args[0]) - loss(*args[1])) / (2 * eps)
        out.append(grad)
    return tuple(out)


def test_4_4_wrong_ideas_of_the_chain_rule_fail():
    _fails(_run("4.4", _chapter_formulas), "dL/dW1 on 4 problems",
           "dL/dW through tanh on 4 problems")
    _fails(_run("4.4", _forgets_tanh_derivative), "dL/dW through tanh on 4 problems")
    _fails(_run("4.4", _derivative_of_h), "dL/dW through tanh on 4 problems")
    _fails(_run("4.4", _finite_differences), "dL/dW1 on 4 problems",
           "dL/dW through tanh on 4 problems")


def test_4_4_asks_for_a_variant_the_chapter_does_not_solve():
    chapter = nbformat.read(ROOT / "chapters" / "04_computational_graph.ipynb", as_version=4)
    code = "\n".join(c.source for c in chapter.cells if c.cell_type == "code")
    assert "X1_ = X_ @ W_" in code and "np.tanh(X1" not in code  # the chapter's example is linear
    assert _run("4.4", _chapter_formulas).score == 0


# ----------------------------------------------------------------------------- 6.1 VJP rules


def _tensor_rules():
    def vjp_mul(g, a, b):
        _, back = ml.vjp(lambda x, y: x * y, a, b)
        return tuple(t.numpy() for t in back(g))

    def vjp_tanh(g, x):
        return ml.grad(lambda x: (ml.ops.tanh(x) * ml.tensor(g)).sum())(x).numpy()

    def vjp_matmul(g, a, b):
        ga, gb = get("matmul").vjp(ml.tensor(g), [ml.tensor(a), ml.tensor(b)], None,
                                   (True, True))
        return ga.numpy(), gb.numpy()

    return vjp_mul, vjp_tanh, vjp_matmul


def test_6_1_library_rules_are_refused(ch06):
    _refused(_run("6.1", *_tensor_rules()))

    def vjp_mul(g, a, b):  # the library's broadcasting rule, on tensors
        from mlsys_lab.engine.ops_math import unbroadcast

        return (unbroadcast(ml.tensor(g * b), np.shape(a)).numpy(),
                unbroadcast(ml.tensor(g * a), np.shape(b)).numpy())

    result = _run("6.1", vjp_mul, ch06["vjp_tanh"], ch06["vjp_matmul"])
    _fails(result, "vjp_mul, equal shapes", "vjp_mul with broadcasting")
    assert "unbroadcast` is off limits" in _rows(result)["vjp_mul with broadcasting"].feedback


def test_6_1_wrong_ideas_of_vjps_fail(ch06):
    mul, tanh, matmul = ch06["vjp_mul"], ch06["vjp_tanh"], ch06["vjp_matmul"]
    _fails(_run("6.1", lambda g, a, b: (g * b, g * a), tanh, matmul),
           "vjp_mul with broadcasting")
    _fails(_run("6.1", lambda g, a, b: (np.sum(g * b), np.sum(g * a)), tanh, matmul),
           "vjp_mul, equal shapes", "vjp_mul with broadcasting")
    _fails(_run("6.1", mul, lambda g, x: g * (1 - x ** 2), matmul), "vjp_tanh")

    def numeric_tanh(g, x, h=1e-5):
        return g * (np.tanh(x + h) - np.tanh(x - h)) / (2 * h)

    _fails(_run("6.1", mul, numeric_tanh, matmul), "vjp_tanh")
    _fails(_run("6.1", mul, tanh, lambda g, a, b: (b.T @ g, g @ a.T)), "vjp_matmul")


# ----------------------------------------------------------------------------- 6.2 dual numbers


def _product(a, b):
    return a.tangent * b.value + a.value * b.tangent


def make_dual(product=_product, sin=lambda d: d.tangent * np.cos(d.value),
              log=lambda d: d.tangent / d.value):
    """A complete dual-number class whose product, sin and log tangent rules can be swapped."""

    class Dual:
        def __init__(self, value, tangent):
            self.value, self.tangent = value, tangent

        @staticmethod
        def lift(x):
            return x if isinstance(x, Dual) else Dual(x, 0.0)

        def __add__(self, other):
            other = Dual.lift(other)
            return Dual(self.value + other.value, self.tangent + other.tangent)

        __radd__ = __add__

        def __sub__(self, other):
            other = Dual.lift(other)
            return Dual(self.value - other.value, self.tangent - other.tangent)

        def __rsub__(self, other):
            return Dual.lift(other) - self

        def __mul__(self, other):
            other = Dual.lift(other)
            return Dual(self.value * other.value, product(self, other))

        __rmul__ = __mul__

        def sin(self):
            return Dual(np.sin(self.value), sin(self))

        def log(self):
            return Dual(np.log(self.value), log(self))

    return Dual


JVP_DUAL = """
class Dual:
    def __init__(self, value, tangent):
        self.value, self.tangent = value, tangent

    def _op(self, f, *others):
        args = [self] + [o if isinstance(o, Dual) else Dual(o, 0.0) for o in others]
        v, t = ml.jvp(f, tuple(a.value for a in args), tuple(a.tangent for a in args))
        return Dual(v.numpy(), t.numpy())

    def __add__(self, other):
        return self._op(lambda a, b: a + b, other)

    __radd__ = __add__

    def __sub__(self, other):
        return self._op(lambda a, b: a - b, other)

    def __rsub__(self, other):
        return self._op(lambda a, b: b - a, other)

    def __mul__(self, other):
        return self._op(lambda a, b: a * b, other)

    __rmul__ = __mul__

    def sin(self):
        return self._op(ml.ops.sin)

    def log(self):
        return self._op(ml.ops.log)
"""


def test_6_2_forward_mode_of_the_library_is_refused():
    scope = {"ml": ml}
    exec(compile(JVP_DUAL, "<cell>", "exec"), scope)
    _refused(_run("6.2", scope["Dual"]))


def test_6_2_wrong_ideas_of_dual_numbers_fail():
    assert _run("6.2", make_dual()).score == 5  # the factory's honest class passes
    _fails(_run("6.2", make_dual(product=lambda a, b: a.tangent * b.tangent)),
           "+, -, * with numbers on either side", "random points and tangents")
    _fails(_run("6.2", make_dual(sin=lambda d: np.cos(d.value))), "random points and tangents")
    _fails(_run("6.2", make_dual(log=lambda d: 1 / d.value)), "random points and tangents")

    def numeric(f, h=1e-6):
        return lambda d: d.tangent * (f(d.value + h) - f(d.value)) / h

    _fails(_run("6.2", make_dual(sin=numeric(np.sin), log=numeric(np.log))),
           "book: dy = 5.5 at (2, 5)", "random points and tangents")


# ----------------------------------------------------------------------------- 6.3 CSE


def _source(fn) -> str:
    source = textwrap.dedent(inspect.getsource(fn))
    return "\n".join(line for line in source.splitlines() if not line.startswith("@")) + "\n\n"


# The library's CSE and both its helpers pasted into the answer cell under their own names:
# defined in the cell, so only their bytecode can give them away.
PASTED_CSE = ("import numpy as np\nfrom mlsys_lab.engine.graph import Graph\n"
              "from mlsys_lab.engine.passes.rewrite import Rewriter\n"
              "from mlsys_lab.engine.registry import get\nMAX_CONST_BYTES = 1 << 20\n\n"
              + _source(frontend.attr_key) + _source(frontend._merge_equal_consts)
              + _source(frontend.common_subexpression_elimination.fn)
              + "cse = common_subexpression_elimination\n")



def _pipeline_cse(graph):
    from mlsys_lab.engine.passes import run_pipeline

    return run_pipeline(graph, ["cse"]).graph


CSE_SHORTCUTS = {
    "passes.common_subexpression_elimination": frontend.common_subexpression_elimination,
    "passes.cse": lambda graph: frontend.cse(graph),
    "the pass's function": lambda graph: frontend.common_subexpression_elimination.fn(graph),
    "run_pipeline(graph, ['cse'])": _pipeline_cse,
    "the library's CSE source pasted": _pasted(frontend.common_subexpression_elimination.fn,
                                               "my_cse"),
}


@pytest.mark.parametrize("how", list(CSE_SHORTCUTS))
def test_6_3_the_librarys_cse_is_refused(how):
    _refused(_run("6.3", CSE_SHORTCUTS[how]))


@pytest.mark.parametrize("own_import", [True, False], ids=["cell imports numpy", "no import"])
def test_6_3_the_librarys_cse_pasted_with_its_helpers_is_refused(own_import):
    """Pasted under the pass's own helper names, defined in the cell: only bytecode matches."""
    source = PASTED_CSE if own_import else PASTED_CSE.replace("import numpy as np\n", "")
    scope = {"np": np}
    exec(compile(source, "<pasted cell>", "exec"), scope)
    result = _run("6.3", scope["cse"])
    _refused(result)
    assert "frontend.common_subexpression_elimination` is off limits" in result.rows[0].feedback


def _cse_variant(ch06, operand_key=None, attrs=True, impure_too=False, in_place=False):
    """The reference CSE with one idea changed."""
    copy_graph = ch06["copy_graph"]

    def cse(graph):
        replace, first, kept = {}, {}, []

        def key_of(v):
            if operand_key is not None:
                return operand_key(graph, v, replace)
            v = replace.get(id(v), v)
            arr = graph.consts.get(v)
            if arr is not None and np.ndim(arr) == 0:
                return ("literal", np.asarray(arr).dtype.str, np.asarray(arr).item())
            return id(v)

        for n in graph.nodes:
            ins = [replace.get(id(v), v) for v in n.inputs]
            if get(n.op).impure and not impure_too:
                kept.append(Node(n.op, ins, n.attrs, n.outputs, n.source))
                continue
            operands = tuple(key_of(v) for v in n.inputs)
            if n.op in ("sub",) and not attrs:  # "sub is commutative" goes with sloppy keys
                operands = tuple(sorted(operands, key=repr))
            key = (n.op, operands, repr(n.attrs) if attrs else "")
            if key in first:
                replace[id(n.outputs[0])] = first[key].outputs[0]
                continue
            if in_place:
                n.inputs = ins
                twin = n
            else:
                twin = Node(n.op, ins, n.attrs, n.outputs, n.source)
            first[key] = twin
            kept.append(twin)
        outputs = [replace.get(id(v), v) for v in graph.outputs]
        if in_place:
            graph.nodes, graph.outputs = kept, outputs
            return graph.relink()
        return copy_graph(graph, kept, outputs, graph.consts)

    return cse


def test_6_3_wrong_ideas_of_cse_fail(ch06):
    def by_identity(graph, v, replace):
        return id(replace.get(id(v), v))

    def before_redirecting(graph, v, replace):
        arr = graph.consts.get(v)
        if arr is not None and np.ndim(arr) == 0:
            return ("literal", arr.dtype.str, arr.item())
        return id(v)

    _fails(_run("6.3", _cse_variant(ch06, by_identity)), "book: a*5 + a*5*b shares a*5")
    for seed in (1, 2, 3):
        _fails(_run("6.3", _cse_variant(ch06, before_redirecting), seed=seed),
               "duplicate chains, 6 random graphs: outputs, node count")
    _fails(_run("6.3", _cse_variant(ch06, attrs=False)), "different attrs/literals stay apart")
    _fails(_run("6.3", _cse_variant(ch06, impure_too=True)), "two dropouts stay two")
    _fails(_run("6.3", _cse_variant(ch06, in_place=True)), "pure: the input graph is untouched")


def test_6_3_literals_that_print_alike_but_differ_stay_apart(ch06):
    def by_text(graph, v, replace):
        v = replace.get(id(v), v)
        arr = graph.consts.get(v)
        return ("literal", f"{float(arr):.4g}") if arr is not None and np.ndim(arr) == 0 \
            else id(v)

    _fails(_run("6.3", _cse_variant(ch06, by_text)), "different attrs/literals stay apart")


# ----------------------------------------------------------------------------- 6.4 folding


def _retrace(graph):
    args = [np.zeros(v.shape, v.dtype) for v in graph.inputs]
    return ml.trace(lambda *xs: graph(*xs), *args)


FOLD_SHORTCUTS = {
    "passes.constant_folding": frontend.constant_folding,
    "the pass's function": lambda graph: frontend.constant_folding.fn(graph),
    "ml.compile's pipeline": lambda graph: ml.compile(lambda *xs: graph(*xs), *[
        np.zeros(v.shape, v.dtype) for v in graph.inputs]).graph,
    "re-tracing the graph (the tracer folds constants)": _retrace,
    "the library's folding source pasted": _pasted(frontend.constant_folding.fn, "my_fold"),
}


@pytest.mark.parametrize("how", list(FOLD_SHORTCUTS))
def test_6_4_the_librarys_folding_is_refused(how):
    _refused(_run("6.4", FOLD_SHORTCUTS[how]))


def _fold_variant(ch06, propagate=True, no_inputs_too=False, as_float64=False, in_place=False):
    """The reference folding with one idea changed."""
    copy_graph = ch06["copy_graph"]

    def fold_constants(graph):
        consts = dict(graph.consts)
        arrays = {id(v): arr for v, arr in consts.items()}
        original = set(arrays)
        replace, kept = {}, []
        for n in graph.nodes:
            ins = [replace.get(id(v), v) for v in n.inputs]
            known = arrays if propagate else {k: a for k, a in arrays.items() if k in original}
            pure = (ins or no_inputs_too) and (not get(n.op).impure or no_inputs_too)
            if pure and all(id(v) in known for v in ins):
                arr = run_kernel(get(n.op), [arrays[id(v)] for v in ins], n.attrs)
                if as_float64:
                    arr = np.asarray(arr, np.float64)
                out = n.outputs[0]
                folded = Value(out.name, out.shape, out.dtype)
                consts[folded] = arr
                arrays[id(folded)] = arr
                replace[id(out)] = folded
            else:
                node = Node(n.op, ins, n.attrs, n.outputs, n.source)
                if in_place:
                    n.inputs = ins
                    node = n
                kept.append(node)
        outputs = [replace.get(id(v), v) for v in graph.outputs]
        if in_place:
            graph.nodes, graph.outputs, graph.consts = kept, outputs, consts
            return graph.relink()
        return copy_graph(graph, kept, outputs, consts)

    return fold_constants


def _bake_outputs(graph):
    """Evaluate the graph on zeros and return constants: right only for that one input."""
    values = [np.asarray(o) for o in outputs_of_graph(graph)]
    outs = [Value(f"out{i}", v.shape, v.dtype) for i, v in enumerate(values)]
    inputs = [Value(v.name, v.shape, v.dtype) for v in graph.inputs]
    return Graph(inputs, [], outs, dict(zip(outs, values, strict=True)))


def outputs_of_graph(graph):
    out = graph(*[np.zeros(v.shape, v.dtype) for v in graph.inputs])
    return out if isinstance(out, tuple) else (out,)


def test_6_4_wrong_ideas_of_folding_fail(ch06):
    result = _run("6.4", _fold_variant(ch06, propagate=False))
    _fails(result, "x * (w*2 + 1) folds to one node", "5 random frozen graphs")
    _fails(_run("6.4", _fold_variant(ch06, no_inputs_too=True)),
           "rng_seed and dropout are never folded")
    _fails(_run("6.4", _fold_variant(ch06, as_float64=True)), "folded constants are typed arrays")
    _fails(_run("6.4", _fold_variant(ch06, in_place=True)), "pure: the input graph is untouched")
    _fails(_run("6.4", _bake_outputs), "x * (w*2 + 1) folds to one node", "5 random frozen graphs")


# ----------------------------------------------------------------------------- in a kernel

CH04_CHEATS = {
    "4.1": "from mlsys_lab.engine.schedule import kahn as topological_sort\n",
    "4.2": "def classify(graph, a, b):\n    return saved(graph, a, b)\n",
    "4.3": textwrap.dedent(inspect.getsource(_trace_unroll)).replace("_trace_unroll", "unroll"),
    "4.4": "def chain_rule(X, W, W1, label):\n"
           "    def loss(W, W1):\n"
           "        d = ml.ops.tanh(ml.tensor(X) @ W) @ W1 - ml.tensor(label)\n"
           "        return (d * d).sum() * 0.5\n"
           "    gW, gW1 = ml.grad(loss, argnums=(0, 1))(W, W1)\n"
           "    return gW.numpy(), gW1.numpy()\n",
}
CH06_CHEATS = {
    "6.1": textwrap.dedent(inspect.getsource(_tensor_rules)) +
           "vjp_mul, vjp_tanh, vjp_matmul = _tensor_rules()\n",
    "6.2": JVP_DUAL,
    "6.3": PASTED_CSE,
    "6.4": "from mlsys_lab.engine.passes import constant_folding as fold_constants\n",
}


def _cheating_notebook(name, answers, path, extra_after_imports=""):
    nb = nbformat.read(ROOT / "exercises" / name, as_version=4)
    for cell in nb.cells:
        for ex_id, source in answers.items():
            if f"answer:{ex_id}" in cell.metadata.get("tags", []):
                cell.source = source
    if extra_after_imports:
        nb.cells.insert(2, nbformat.v4.new_code_cell(extra_after_imports))
    nbformat.write(nb, path)
    return path


@pytest.mark.parametrize("name, answers", [(CH04, CH04_CHEATS), (CH06, CH06_CHEATS)],
                         ids=["chapter 4", "chapter 6"])
def test_shortcuts_score_zero_under_the_grader(name, answers, tmp_path):
    extra = "from mlsys_lab.engine.graph import Graph\nsaved = Graph.dependency\n"
    path = _cheating_notebook(name, answers, tmp_path / name, extra)
    report = grade(path, cell_timeout=120, timeout=600)
    assert report.max > 0 and report.total == 0, report.to_table()
    for row in report.rows:
        assert "off limits here" in row.feedback, report.to_table()


# ----------------------------------------------------------------------------- degenerate answers


def _always_cycle(nodes, edges):
    raise ml.CycleError("there is always a cycle")


DO_NOTHING = {
    "4.1 returns nodes as given": ("4.1", lambda nodes, edges: list(nodes)),
    "4.1 always raises CycleError": ("4.1", _always_cycle),
    "4.2 always 'independent'": ("4.2", lambda graph, a, b: "independent"),
    "4.3 returns the body": ("4.3", lambda body, n: body),
    "4.4 zeros of the right shapes": ("4.4", lambda X, W, W1, label: (0 * W, 0 * W1)),
    "6.1 zeros of the right shapes": ("6.1", lambda g, a, b: (0 * a, 0 * b),
                                      lambda g, x: 0 * x, lambda g, a, b: (0 * a, 0 * b)),
    "6.2 tangents always 0": ("6.2", make_dual(lambda a, b: 0.0 * a.value, lambda d: 0.0 * d.value,
                                               lambda d: 0.0 * d.value)),
    "6.3 returns a copy": ("6.3", lambda graph: graph.copy()),
    "6.4 returns a copy": ("6.4", lambda graph: graph.copy()),
}


@pytest.mark.parametrize("how", list(DO_NOTHING))
def test_answers_that_skip_the_work_score_zero(how):
    exercise_id, *answers = DO_NOTHING[how]
    result = _run(exercise_id, *answers)
    assert result.score == 0, [(r.name, r.points) for r in result.rows]
