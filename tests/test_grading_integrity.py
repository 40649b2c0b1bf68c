"""Integrity of grading: the guard refuses every shortcut, and the kernel cannot fake a verdict.

The guard tests run in this process through ``check()``, with test-only exercises (ids 97.x)
whose forbidden functions are real library functions. The grader tests run real kernels on the
demo notebook (and chapter 8) with one hostile cell each, and assert the points.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
import inspect
import json
import sys
import textwrap
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import schedule
from mlsys_lab.engine.graph import Graph
from mlsys_lab.grading import checks, guard, wire
from mlsys_lab.grading.checks import Case, Exercise, legacy_cases, register, run_cases
from mlsys_lab.grading.grader import grade
from mlsys_lab.grading.judge import judge_exercise

ROOT = Path(__file__).resolve().parents[1]
DEMO_SOLUTION = ROOT / "solutions" / "ch00_demo.ipynb"
DEMO_EXERCISE = ROOT / "exercises" / "ch00_demo.ipynb"
CH08_EXERCISE = ROOT / "exercises" / "ch08_hardware_accelerators.ipynb"


# ----------------------------------------------------------------------------- test exercises


def _dag(seed):
    rng = np.random.default_rng(seed)
    n = 9
    hidden = [int(x) for x in rng.permutation(n)]
    edges = [(hidden[i], hidden[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < .4]
    return [int(x) for x in rng.permutation(n)], edges


def _order_judge(raw, seed):
    nodes, edges = _dag(seed)
    assert isinstance(raw, list) and sorted(raw) == sorted(nodes), f"not a permutation: {raw}"
    pos = {v: i for i, v in enumerate(raw)}
    assert all(pos[a] < pos[b] for a, b in edges), "an edge points backwards"


def _small_graph():
    def f(x, y):
        t = ml.ops.tanh(x)
        return ml.ops.sin(t * y) + ml.ops.neg(y)

    x = np.zeros(3, np.float32)
    return ml.trace(f, x, x)


def _classify_probe(classify):
    g = _small_graph()
    return [classify(g, a, b) for a in g.nodes for b in g.nodes if a is not b]


def _classify_judge(raw):
    g = _small_graph()
    assert raw == [g.dependency(a, b) for a in g.nodes for b in g.nodes if a is not b]


def _operands(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((5, 4)), rng.standard_normal((4, 3))


def _matmul_judge(raw, seed):
    a, b = _operands(seed)
    assert isinstance(raw, np.ndarray) and np.allclose(raw, a @ b), "c != a @ b"


TOPO = Exercise(
    id="97.1", title="Topological sort", target="topological_sort",
    forbidden=("mlsys_lab.engine.schedule:kahn",), task="Kahn's algorithm",
    cases=(Case("valid order", 1, probe=lambda f, seed: f(*_dag(seed)), judge=_order_judge),),
)
CLASSIFY = Exercise(
    id="97.2", title="Classify dependencies", target="classify",
    forbidden=("mlsys_lab.engine.graph:Graph.dependency", "mlsys_lab.engine.graph:Graph.ancestors"),
    cases=(Case("every pair", 1, probe=_classify_probe, judge=_classify_judge),),
)
MATMUL = Exercise(
    id="97.3", title="A matmul kernel", target="matmul",
    forbidden=("mlsys_lab.kernels.cpu:_naive_kernel",),
    cases=(Case("c = a @ b", 1, probe=lambda f, seed: f(*_operands(seed)), judge=_matmul_judge),),
)


@pytest.fixture(autouse=True)
def test_exercises():
    register(TOPO, CLASSIFY, MATMUL)
    yield
    for exercise in (TOPO, CLASSIFY, MATMUL):
        checks.EXERCISES.pop(exercise.id, None)


def _feedback(result) -> str:
    return " | ".join(row.feedback for row in result.rows)


# ----------------------------------------------------------------------------- forbidden functions


def honest_kahn(nodes, edges):
    indeg = {n: 0 for n in nodes}
    out = {n: [] for n in nodes}
    for a, b in edges:
        indeg[b] += 1
        out[a].append(b)
    queue = [n for n in nodes if indeg[n] == 0]
    order = []
    while queue:
        n = queue.pop(0)
        order.append(n)
        for m in out[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                queue.append(m)
    return order


def _pasted_kahn():
    """kahn's source pasted into a 'cell': renamed, shifted down, docstring rewritten."""
    source = textwrap.dedent(inspect.getsource(schedule.kahn))
    doc = schedule.kahn.__doc__
    source = source.replace(doc, "My own topological sort, honest.")
    source = source.replace("def kahn(", "def mine(")
    scope = dict(vars(schedule))
    exec(compile("\n\n\n" + source, "<pasted cell>", "exec"), scope)
    return scope["mine"]


saved_kahn = schedule.kahn  # "f = kahn" at import time, before any check runs


def _swallow_then_call(nodes, edges):
    try:
        schedule.kahn(nodes, edges)
    except Exception:
        pass
    return schedule.kahn(nodes, edges)


def _profile_off(nodes, edges):
    sys.setprofile(None)
    return schedule.kahn(nodes, edges)


def _profile_off_by_map(nodes, edges):
    list(map(sys.setprofile, [None]))  # a C call the profile hook cannot see
    return schedule.kahn(nodes, edges)


def _steal_the_hook(nodes, edges):
    sys.getprofile().__self__._lifted = 1
    return schedule.kahn(nodes, edges)


def _grader_escape(nodes, edges):
    with guard.unguarded():
        return schedule.kahn(nodes, edges)


def _in_a_thread(nodes, edges):
    out = []

    def work():
        try:
            out.append(schedule.kahn(nodes, edges))
        except Exception:  # the refusal, raised in the thread
            pass

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return out[0] if out else None


def _in_a_pool(nodes, edges):
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(schedule.kahn, nodes, edges).result()


SHORTCUTS = {
    "calling it": lambda nodes, edges: schedule.kahn(nodes, edges),
    "the function itself as the answer": schedule.kahn,
    "a reference saved at import time": lambda nodes, edges: saved_kahn(nodes, edges),
    "functools.partial": functools.partial(schedule.kahn),
    "a copy of its code object": types.FunctionType(
        schedule.kahn.__code__, vars(schedule), "copy", schedule.kahn.__defaults__
    ),
    "its source pasted, renamed and edited": _pasted_kahn(),
    "catching the refusal and calling again": _swallow_then_call,
    "sys.setprofile(None)": _profile_off,
    "sys.setprofile(None) through map()": _profile_off_by_map,
    "sys.getprofile() to lift the guard": _steal_the_hook,
    "the grader's own unguarded()": _grader_escape,
    "in a thread started by the answer": _in_a_thread,
    "in a thread pool started by the answer": _in_a_pool,
}


def test_an_honest_answer_passes_under_the_guard():
    result = run_cases("97.1", honest_kahn)
    assert result.score == 1, _feedback(result)


@pytest.mark.parametrize("how", list(SHORTCUTS), ids=list(SHORTCUTS))
def test_forbidden_function_refuses_every_route(how):
    result = run_cases("97.1", SHORTCUTS[how])
    assert result.score == 0, f"{how} got through"
    text = _feedback(result)
    assert "off limits" in text or "switch" in text or "cannot trust" in text, text
    assert sys.getprofile() is None and guard._ACTIVE is None  # the guard cleaned up after itself
    assert schedule.kahn([1, 2], [(2, 1)]) == [2, 1]  # and kahn works again outside the check


def test_refusal_names_the_task_and_the_function():
    result = run_cases("97.1", SHORTCUTS["a reference saved at import time"])
    assert result.rows[0].feedback == (
        "this exercise asks you to write Kahn's algorithm yourself; "
        "`mlsys_lab.engine.schedule.kahn` is off limits here"
    )


def test_saved_bound_method_is_refused():
    def honest(graph, a, b):
        def reaches(src, dst):
            todo, seen = [dst], set()
            while todo:
                node = todo.pop()
                for value in node.inputs:
                    if value.producer is src:
                        return True
                    if value.producer is not None and id(value.producer) not in seen:
                        seen.add(id(value.producer))
                        todo.append(value.producer)
            return False

        for x, y in ((a, b), (b, a)):
            if any(v.producer is x for v in y.inputs):
                return "direct"
        return "indirect" if reaches(a, b) or reaches(b, a) else "independent"

    assert run_cases("97.2", honest).score == 1
    saved = Graph.dependency  # captured before the check; the old guard swapped the attribute

    def cheat(graph, a, b):
        return saved(graph, a, b)

    assert run_cases("97.2", cheat).score == 0
    assert run_cases("97.2", lambda graph, a, b: graph.dependency(a, b)).score == 0


def test_reference_answers_in_the_grading_modules_are_refused():
    from mlsys_lab.grading.ch00 import _fib  # the grader's own reference for 0.2

    result = run_cases("0.2", _fib)
    assert result.score == 0
    assert "`mlsys_lab.grading.ch00._fib` (the grader's own reference)" in _feedback(result)
    result = run_cases("0.2", lambda n: _fib(n))
    assert result.score == 0


def test_library_shortcuts_of_the_demo_are_refused():
    import statistics

    def honest(xs):
        if not xs:
            raise ValueError("empty")
        return sum(xs) / len(xs)

    assert run_cases("0.3", honest).score == 4
    for cheat in (statistics.mean, lambda xs: np.mean(xs), lambda xs: np.array(xs).mean(),
                  lambda xs: np.average(xs) if xs else statistics.fmean(xs)):
        result = run_cases("0.3", cheat)
        assert result.score == 0, _feedback(result)
        assert "off limits here" in result.rows[0].feedback


def test_plan_lists_references_but_not_the_probes_helpers():
    plan = guard.plan_for(checks.get_exercise("0.2"))
    labels = " ".join(entry["label"] for entry in plan["code"])
    assert "ch00._fib`" in labels and "ch00._fib_large_judge`" in labels
    assert "ch00._big_n`" not in labels  # 0.2's probe uses it
    assert "ch00._floats`" in labels  # only 0.1's probes use it
    plan = guard.plan_for(checks.get_exercise("0.1"))
    assert "ch00._floats`" not in " ".join(entry["label"] for entry in plan["code"])


def test_an_unguardable_spec_is_rejected_with_advice():
    bad = Exercise("97.9", "x", (Case("c", 1, probe=abs, judge=abs),), "f",
                   forbidden=("numpy:matmul",))
    with pytest.raises(ValueError, match="cannot guard numpy.matmul"):
        guard.plan_for(bad)


# ----------------------------------------------------------------------------- copies and wrappers


def _guarded(specs, fn, *args):
    """Call ``fn(*args)`` under a guard forbidding ``specs``: the refusal message, else None."""
    exercise = Exercise("97.8", "x", (Case("c", 1, probe=abs, judge=abs),), "f", forbidden=specs)
    try:
        with guard.Guard(guard.plan_for(exercise)).watching():
            fn(*args)
    except guard.OffLimitsError as refusal:
        return str(refusal)
    return None


def _imports_of(module) -> str:
    """The module's own import statements, made absolute, as a cell would write them."""
    out = []
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.ImportFrom) and node.module != "__future__":
            if node.level:
                node.module = importlib.util.resolve_name(
                    "." * node.level + (node.module or ""), module.__package__)
                node.level = 0
            out.append(ast.unparse(node))
        elif isinstance(node, ast.Import):
            out.append(ast.unparse(node))
    return "\n".join(out) + "\n"


def _renamed(fn, name: str) -> str:
    """``fn``'s source with the function, its arguments and every local renamed, the docstring
    rewritten and decorators dropped."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    node = tree.body[0]
    node.name, node.decorator_list = name, []
    if ast.get_docstring(node):
        node.body[0].value.value = "My own version, honest."
    bound = {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
              and isinstance(n.ctx, (ast.Store, ast.Del))}
    new = {old: f"v{i}" for i, old in enumerate(sorted(bound, reverse=True))}  # reorders cells
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in new:
            n.id = new[n.id]
        elif isinstance(n, ast.arg) and n.arg in new:
            n.arg = new[n.arg]
    return ast.unparse(tree) + "\n"


def _paste(fn, layout: str, name: str = "mine"):
    """``fn`` pasted into a cell, renamed throughout: in the module's namespace without its
    imports, with the module's imports in the cell, or inside a function that does the imports
    (so the module's names are a closure's free variables)."""
    module = sys.modules[fn.__module__]
    source = _renamed(fn, name)
    if layout == "own imports":
        source = _imports_of(module) + "\n" + source
    elif layout == "inside a function":
        body = _imports_of(module) + source + f"return {name}\n"
        source = "def cell():\n" + textwrap.indent(body, "    ") + f"\n{name} = cell()\n"
    scope = dict(vars(module))
    exec(compile("\n\n" + source, "<pasted cell>", "exec"), scope)
    return scope[name]


LAYOUTS = ["no imports", "own imports", "inside a function"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_pasted_kahn_is_refused_in_any_layout(layout):
    result = run_cases("97.1", _paste(schedule.kahn, layout))
    assert result.score == 0, f"kahn pasted ({layout}) got through"
    assert _feedback(result) == (
        "this exercise asks you to write Kahn's algorithm yourself; "
        "`mlsys_lab.engine.schedule.kahn` is off limits here (your `mine` is a copy of its code)"
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("helper", ["_merge_equal_consts", "attr_key"])
def test_pasted_frontend_helpers_are_refused_in_any_layout(helper, layout):
    from mlsys_lab.engine.passes import frontend

    spec = f"mlsys_lab.engine.passes.frontend:{helper}"
    pasted = _paste(getattr(frontend, helper), layout)
    args = (None, types.SimpleNamespace(consts={}), 0) if helper == "_merge_equal_consts" else (1,)
    assert "is a copy of its code" in (_guarded((spec,), pasted, *args) or "got through")


def honest_merge(rw, graph, max_bytes):
    """Merge equal small constants: written from the idea, not from the library's code."""
    first = {}
    for name in list(graph.consts):
        array = graph.consts[name]
        if array.nbytes > max_bytes:
            continue
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in first:
            first[key] = rw[name]
            continue
        duplicate = rw[name]
        rw.bind(name, first[key])
        del rw.consts[duplicate]


def test_honest_implementations_of_the_same_idea_are_not_copies():
    spec = "mlsys_lab.engine.passes.frontend:_merge_equal_consts"
    for honest in (honest_merge, honest_kahn):  # both big enough to be fingerprinted
        assert guard._identity(honest.__code__)[1] >= guard.DISTINCTIVE
    assert _guarded((spec,), honest_merge, None, types.SimpleNamespace(consts={}), 0) is None
    assert run_cases("97.1", _paste(honest_kahn, "inside a function")).score == 1


def _one_line_formula(d, g):  # stands for a short library function
    return np.correlate(np.asarray(d, np.float64), np.asarray(g, np.float64), "valid").tolist()


INDEPENDENT_FORMULA = """
import numpy as np


def correlate_by_hand(x, w):
    return np.correlate(np.asarray(x, np.float64), np.asarray(w, np.float64), "full").tolist()
"""


def test_a_short_formula_is_matched_by_origin_only():
    """A one-liner written independently reads the same as the library's (the same calls, other
    names and mode): that is no evidence of a copy. It is 198 bytes of Python 3.11 bytecode
    (inline caches) but 19 instructions."""
    scope: dict = {}
    exec(compile(INDEPENDENT_FORMULA, "<cell>", "exec"), scope)
    mine = scope["correlate_by_hand"]
    spec = f"{__name__}:_one_line_formula"
    assert len(mine.__code__.co_code) >= 100  # the old size rule called it distinctive
    assert _guarded((spec,), mine, [1.0, 2.0], [1.0]) is None
    assert "off limits here" in _guarded((spec,), _one_line_formula, [1.0, 2.0], [1.0])


@pytest.mark.parametrize("spec", ["mlsys_lab.engine.passes:cancel_transposes",
                                  "mlsys_lab.engine.passes.backend:cancel_transposes"])
def test_a_graph_pass_can_be_forbidden(spec):
    from mlsys_lab.engine import passes

    def f(x):
        return ml.ops.transpose(ml.ops.transpose(x, (1, 0)), (1, 0))

    graph = ml.trace(f, np.zeros((2, 3), np.float32))
    refusal = _guarded((spec,), passes.cancel_transposes, graph)
    assert refusal is not None and f"`{spec.replace(':', '.')}` is off limits here" in refusal
    assert _guarded((spec,), passes.cancel_transposes(), graph) is not None  # a configured pass


class _Holder:
    """A wrapper that keeps the wrapped function in ``.fn``, as a ``Pass`` does."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)


def test_wrappers_stand_for_the_function_they_wrap():
    from mlsys_lab.engine.passes.rewrite import Pass

    kahn = schedule.kahn
    wrappers = {
        "a_partial": functools.partial(kahn, steps=None),
        "a_wraps_decorated_function": functools.wraps(kahn)(lambda *a, **k: kahn(*a, **k)),
        "a_pass": Pass(kahn),
        "an_object_with_fn": _Holder(kahn),
        "a_staticmethod": staticmethod(kahn),
        "a_partial_of_a_pass": functools.partial(Pass(kahn)),
    }
    module = types.ModuleType("_guard_test_wrappers")
    vars(module).update(wrappers)
    sys.modules[module.__name__] = module
    try:
        for name, wrapper in wrappers.items():
            assert guard._unwrap(wrapper) is kahn, name
            plan = guard.plan_for(Exercise("97.8", "x", (Case("c", 1, probe=abs, judge=abs),),
                                           "f", forbidden=(f"{module.__name__}:{name}",)))
            wheres = {(e["file"], e["line"], e["qualname"]) for e in plan["code"]}
            assert guard._where(kahn.__code__) in wheres, name
    finally:
        del sys.modules[module.__name__]


class _SubArray(np.ndarray):
    pass


class _SubDict(dict):
    pass


def test_c_methods_are_refused_on_every_class_that_inherits_them():
    specs = ("numpy:generic.view", "numpy:ndarray.mean", "builtins:dict.fromkeys")
    sub = np.arange(3.0).view(_SubArray)
    refused = {
        "a numpy scalar's view": lambda: np.uint16(15360).view(np.float16),
        "an ndarray subclass's mean": lambda: sub.mean(),
        "ndarray.mean called on a subclass": lambda: np.ndarray.mean(sub),
        "ndarray.mean": lambda: np.arange(3.0).mean(),
        "a C classmethod through a subclass": lambda: _SubDict.fromkeys("ab"),
    }
    for how, call in refused.items():
        refusal = _guarded(specs, call)
        assert refusal is not None and "off limits here" in refusal, how
    assert "`numpy.generic.view`" in _guarded(specs, refused["a numpy scalar's view"])
    allowed = {  # the same names on classes that do not inherit the forbidden method
        "ndarray.view": lambda: np.arange(3.0).view(np.int64),
        "a numpy scalar's mean (generic.mean)": lambda: np.float64(2.0).mean(),
        "another method of the class": lambda: _SubDict(a=1).get("a"),
    }
    for how, call in allowed.items():
        assert _guarded(specs, call) is None, how


def test_a_forbidden_dataclass_does_not_refuse_every_dataclass():
    """Every dataclass's generated ``__init__`` is compiled at ("<string>", 2, ...): the origin
    alone cannot tell them apart."""
    from mlsys_lab.engine.memory import Lifetime

    @dataclasses.dataclass
    class Mine:
        name: str
        bytes: int = 0

    spec = ("mlsys_lab.engine.memory:Lifetime",)
    assert guard._where(Mine.__init__.__code__) == guard._where(Lifetime.__init__.__code__)
    assert _guarded(spec, Mine, "a", 3) is None
    assert "Lifetime.__init__` is off limits here" in _guarded(spec, Lifetime, "a", 3, 0, 1)


# ----------------------------------------------------------------------------- Numba


def _naive_source_kernel():
    """``_naive_kernel``'s source pasted into a cell and compiled with @njit."""
    from numba import njit

    from mlsys_lab.kernels import cpu

    source = textwrap.dedent(inspect.getsource(cpu._naive_kernel.py_func))
    source = "\n".join(ln for ln in source.splitlines() if not ln.startswith("@"))
    scope: dict = {}
    exec(compile(source.replace("_naive_kernel", "my_kernel"), "<pasted>", "exec"), scope)
    return njit(scope["my_kernel"])


@pytest.fixture(scope="module")
def numba_answers():
    """Each answer is compiled before the check runs, as a notebook cell would have done."""
    from numba import njit

    from mlsys_lab.kernels import cpu

    kernel = cpu._naive_kernel
    a, b = _operands(0)

    def wrap(k):
        def matmul(a, b):
            c = np.zeros((a.shape[0], b.shape[1]))
            k(np.ascontiguousarray(a), np.ascontiguousarray(b), c)
            return c

        matmul(a, b)  # compile now, outside any check
        return matmul

    @njit
    def honest_kernel(a, b, c):
        for i in range(a.shape[0]):
            for p in range(a.shape[1]):
                for j in range(b.shape[1]):
                    c[i, j] += a[i, p] * b[p, j]

    @njit
    def calls_inside(a, b):
        c = np.zeros((a.shape[0], b.shape[1]))
        kernel(a, b, c)
        return c

    calls_inside(a, b)
    wrap(kernel)
    sig = next(iter(kernel.overloads))
    entry = kernel.overloads[sig].entry_point
    answers = {
        "honest": wrap(honest_kernel),
        "calling the library kernel": wrap(kernel),
        "a kernel that calls it in compiled code": calls_inside,
        "njit(kernel.py_func)": wrap(njit(kernel.py_func)),
        "its source pasted under @njit": wrap(_naive_source_kernel()),
        "its compiled entry point": wrap(lambda a, b, c: entry(a, b, c)),
    }
    return answers


NUMBA_CHEATS = ["calling the library kernel", "a kernel that calls it in compiled code",
                "njit(kernel.py_func)", "its source pasted under @njit", "its compiled entry point"]


def test_numba_honest_kernel_passes(numba_answers):
    result = run_cases("97.3", numba_answers["honest"])
    assert result.score == 1, _feedback(result)


@pytest.mark.parametrize("how", NUMBA_CHEATS)
def test_numba_kernel_refuses_every_route(how, numba_answers):
    from mlsys_lab.kernels import cpu

    result = run_cases("97.3", numba_answers[how])
    assert result.score == 0, f"{how} got through"
    assert "_naive_kernel" in _feedback(result) and "off limits" in _feedback(result)
    a, b = _operands(1)
    np.testing.assert_allclose(cpu.matmul_naive(a, b), a @ b)  # switched back on afterwards


def test_numba_swapped_py_func_does_not_hide_the_kernel(numba_answers, monkeypatch):
    from mlsys_lab.kernels import cpu

    monkeypatch.setattr(cpu._naive_kernel, "py_func", lambda a, b, c: None)
    result = run_cases("97.3", numba_answers["calling the library kernel"])
    assert result.score == 0 and "off limits" in _feedback(result)


# ----------------------------------------------------------------------------- judges and the wire


def test_the_wire_round_trips_plain_data_and_never_pickles():
    value = {"a": (1, 2.5, float("nan"), None), 3: [np.arange(4.0), np.float32(2)],
             "big": 7 ** 6000, "s": {1, 2}, "c": 1 + 2j, "b": b"\x00"}
    back = wire.decode(json.loads(json.dumps(wire.encode(value))))
    assert back["a"][:2] == (1, 2.5) and np.isnan(back["a"][2]) and back["big"] == 7 ** 6000
    assert back[3][0].tolist() == [0, 1, 2, 3] and back[3][1].dtype == np.float32
    assert back["s"] == {1, 2} and back["c"] == 1 + 2j and back["b"] == b"\x00"
    for zero_d in (np.array(2.5), np.float64(2.5), np.ones((3, 2))[:, 0]):  # shapes survive
        assert wire.decode(wire.encode(zero_d)).shape == np.shape(zero_d)

    class Liar(int):
        def __eq__(self, other):
            return True

    assert type(wire.decode(wire.encode(Liar(3)))) is int
    assert isinstance(wire.decode(wire.encode(object())), wire.Opaque)
    import base64
    import io

    buffer = io.BytesIO()
    np.save(buffer, np.array([object()]), allow_pickle=True)
    forged = {"$": "ndarray", "npy": base64.b64encode(buffer.getvalue()).decode()}
    with pytest.raises(wire.WireError):
        wire.decode(forged)


def test_judges_trust_only_raw_results():
    exercise = checks.get_exercise("0.1")

    def payload(*records):
        return {"cases": list(records)}

    good = {"name": "square(3) == 9", "kind": "probe", "status": "ok", "value": 9}
    forged_verdict = {"name": "square(3) == 9", "kind": "legacy", "passed": True}
    assert judge_exercise(exercise, payload(good), 0).rows[0].passed
    assert not judge_exercise(exercise, payload(forged_verdict), 0).rows[0].passed
    twice = judge_exercise(exercise, payload(good, good), 0).rows[0]
    assert not twice.passed and "tampering" in twice.feedback
    assert judge_exercise(exercise, None, 0).score == 0


def test_cases_declare_both_halves():
    with pytest.raises(ValueError, match="both a probe and a judge"):
        Case("x", 1, probe=abs)
    with pytest.raises(ValueError, match="either fn"):
        Case("x", 1, abs, probe=abs, judge=abs)
    assert [c for c in legacy_cases() if c[0].startswith("0.")] == []  # the template is converted


def test_check_with_a_seed_repeats_its_inputs(capsys):
    seen = []

    def square(x):
        seen.append(x)
        return x * x + (1 if len(seen) == 3 else 0)

    first = checks.check("0.1", square, seed=11)
    assert not first.passed and "seed=11" in capsys.readouterr().out
    again, seen[:] = list(seen), []
    checks.check("0.1", square, seed=11)
    assert seen == again


# ----------------------------------------------------------------------------- the grader


def _notebook(source_by_id: dict[str, str], path: Path, base: Path = DEMO_EXERCISE,
              extra: str | None = None) -> Path:
    nb = nbformat.read(base, as_version=4)
    for cell in nb.cells:
        for ex_id, source in source_by_id.items():
            if f"answer:{ex_id}" in cell.metadata.get("tags", []):
                cell.source = source
    if extra is not None:  # a hostile cell right after the first answer cell
        first = next(i for i, c in enumerate(nb.cells) if "answer:" in str(c.metadata))
        nb.cells.insert(first + 1, nbformat.v4.new_code_cell(extra))
    nbformat.write(nb, path)
    return path


def _points(report) -> dict[str, float]:
    return {row.exercise: row.points for row in report.rows}


RUN_CASE_ATTACK = """
import mlsys_lab.grading.checks as c
c._run_case = lambda case, answers: c.CaseResult(case.name, case.points, case.points, True)
c.run_cases = lambda exercise_id, *a, **k: None
"""

JUDGE_ATTACK = """
import mlsys_lab.grading.checks as c, mlsys_lab.grading.judge as j, mlsys_lab.grading.ch00 as ch
for name in dir(ch):
    if name.endswith("_judge"):
        setattr(ch, name, lambda *a, **k: None)
for exercise in c.EXERCISES.values():
    for case in exercise.cases:
        object.__setattr__(case, "judge", lambda *a, **k: None)
        object.__setattr__(case, "probe", lambda *a, **k: 0)
j.judge_exercise = lambda exercise, payload, seed: c.CheckResult(
    exercise.id, exercise.title, exercise.max_points, exercise.max_points)
"""

# A fake probe module that sends perfect raw results for 0.1 (whatever the seed): it would score
# if the hidden cell imported the grading code from the kernel's sys.modules.
SYS_MODULES_ATTACK = """
import sys, types, json
from IPython.display import publish_display_data
from mlsys_lab.grading.ch00 import _floats
fake = types.ModuleType("mlsys_lab.grading.probe")
fake.MIME = "application/vnd.mlsys-lab.probe+json"
def emit(exercise_id, namespace, seed, marker, plan):
    cases = [{"name": "square(3) == 9", "kind": "probe", "status": "ok", "value": 9},
             {"name": "square(-1.5) and random floats", "kind": "probe", "status": "ok",
              "value": [x * x for x in _floats(seed)]}]
    payload = {"exercise": exercise_id, "cases": cases, "marker": marker}
    publish_display_data({fake.MIME: json.dumps(payload)})
fake.emit = emit
fake.run_exercise = lambda *a, **k: None
for name in [*sys.modules, "mlsys_lab.grading.probe", "mlsys_lab.grading.checks"]:
    if name.startswith("mlsys_lab.grading."):
        sys.modules[name] = fake
"""

# The answer finds the grader's marker and seed in the hidden cell's frame and sends a perfect
# payload of its own, computed with the real answers.
FAKE_RESULT_ANSWER = """
import json, sys
from IPython.display import publish_display_data

def square(x):
    frame = sys._getframe(1)
    while frame and "marker" not in frame.f_locals:
        frame = frame.f_back
    marker, seed = frame.f_locals["marker"], frame.f_locals["seed"]
    import numpy as np
    rng = np.random.default_rng(seed)
    xs = [-1.5] + [round(float(v), 3) for v in rng.uniform(-50, 50, 5)]
    cases = [{"name": "square(3) == 9", "kind": "probe", "status": "ok", "value": 9},
             {"name": "square(-1.5) and random floats", "kind": "probe", "status": "ok",
              "value": [v * v for v in xs]}]
    payload = {"exercise": "0.1", "cases": cases, "marker": marker}
    publish_display_data({"application/vnd.mlsys-lab.probe+json": json.dumps(payload)})
    print("\\n__MLSYS_GRADE__" + json.dumps(payload))
    raise NotImplementedError("stub")
"""


@pytest.mark.parametrize(
    "attack", [RUN_CASE_ATTACK, JUDGE_ATTACK, SYS_MODULES_ATTACK],
    ids=["patch _run_case", "patch the judges", "replace sys.modules entries"],
)
def test_the_kernel_cannot_change_the_verdict(attack, tmp_path):
    report = grade(_notebook({}, tmp_path / "ch00_attack.ipynb", extra=attack),
                   cell_timeout=30, timeout=120)
    assert (report.total, report.max) == (0, 12), report.to_table()


def test_a_fake_result_from_the_answer_scores_zero(tmp_path):
    path = _notebook({"0.1": FAKE_RESULT_ANSWER}, tmp_path / "ch00_fake.ipynb")
    report = grade(path, cell_timeout=30, timeout=120)
    assert _points(report)["0.1"] == 0, report.to_table()
    assert "arrived more than once" in report.rows[0].feedback


def test_run_case_attack_on_chapter_8(tmp_path):
    """The issue's attack: two lines in an answer cell once scored 16/16 on chapter 8."""
    path = _notebook({}, tmp_path / "ch08_attack.ipynb", base=CH08_EXERCISE,
                     extra=RUN_CASE_ATTACK)
    report = grade(path, cell_timeout=120, timeout=600)
    assert report.total == 0 and report.max > 0, report.to_table()


def test_shortcuts_score_zero_under_the_grader(tmp_path):
    answers = {
        "0.2": "from mlsys_lab.grading.ch00 import _fib as fib\n",
        "0.3": "import statistics\n\ndef mean(xs):\n    return statistics.mean(xs)\n",
    }
    report = grade(_notebook(answers, tmp_path / "ch00_cheat.ipynb"), cell_timeout=30,
                   timeout=120)
    assert _points(report) == {"0.1": 0, "0.2": 0, "0.3": 0}, report.to_table()
    assert "ch00._fib` (the grader's own reference) is off limits" in report.rows[1].feedback
    assert "`statistics.mean` is off limits" in report.rows[2].feedback


FIB = "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a"


def test_the_answer_counts_wherever_it_is_written(tmp_path):
    """0.1: the stub stays, the answer is in a new cell below it. 0.2: the stub cell is deleted
    and the answer sits in an untagged cell. Both are graded at their check cell."""
    nb = nbformat.read(DEMO_EXERCISE, as_version=4)
    cells = []
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "answer:0.2" in tags:
            cells.append(nbformat.v4.new_code_cell(FIB))
            continue
        cells.append(cell)
        if "answer:0.1" in tags:
            cells.append(nbformat.v4.new_code_cell("def square(x):\n    return x * x\n"))
    nb.cells = cells
    # A later cell redefines square wrongly: the check cell above it is what counts.
    nb.cells.append(nbformat.v4.new_code_cell("def square(x):\n    return 0\n"))
    nbformat.write(nb, tmp_path / "ch00_layout.ipynb")
    report = grade(tmp_path / "ch00_layout.ipynb", cell_timeout=30, timeout=120)
    assert _points(report) == {"0.1": 3, "0.2": 5, "0.3": 0}, report.to_table()
    assert report.notes == [], report.to_table()
