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
import queue
import sys
import textwrap
import threading
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.engine import schedule
from mlsys_lab.engine.graph import Graph
from mlsys_lab.grading.core import check as checks
from mlsys_lab.grading.core import exercise as registry
from mlsys_lab.grading.core import grader, guard, wire
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.core.exercise import Case, Exercise, register
from mlsys_lab.grading.core.grader import grade
from mlsys_lab.grading.core.judge import judge_exercise
from tests.grading.cheats import CHEATS, LATER_CHAPTERS, keep_last_on_offer

ROOT = Path(__file__).resolve().parents[2]
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
        registry.EXERCISES.pop(exercise.id, None)


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


def test_an_honest_answer_passes_under_the_guard(hook_kind):
    result = run_cases("97.1", honest_kahn)
    assert result.score == 1, _feedback(result)


@pytest.mark.parametrize("how", list(SHORTCUTS), ids=list(SHORTCUTS))
def test_forbidden_function_refuses_every_route(how, hook_kind):
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
    from mlsys_lab.grading.exercises.ch00_demo.ex0_2_fib import (
        _fib,  # the grader's own reference for 0.2
    )

    result = run_cases("0.2", _fib)
    assert result.score == 0
    assert "ex0_2_fib._fib` (the grader's own reference)" in _feedback(result)
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
    plan = guard.plan_for(registry.get_exercise("0.2"))
    labels = " ".join(entry["label"] for entry in guard.plan_entries(plan))
    assert "ex0_2_fib._fib`" in labels and "ex0_2_fib._large_judge`" in labels
    assert "ex0_2_fib._big_n`" not in labels  # 0.2's probe uses it
    assert "ex0_1_square._floats`" in labels  # only 0.1's probes use it
    plan = guard.plan_for(registry.get_exercise("0.1"))
    assert "ex0_1_square._floats`" not in " ".join(entry["label"]
                                                   for entry in guard.plan_entries(plan))


def test_the_shared_references_are_indexed_as_the_whole_plan_would_be():
    """Every plan carries its own entries and names the grader's references (~1,300 entries,
    the same for every exercise) by digest; the guard copies their tables, indexed once per
    kernel, under its own. For every exercise the guard then looks up what it would with all
    the entries in one list (``plan_entries``): the same labels by where and by fingerprint,
    the same clones in the same order, the same copy candidates. A split that forgot the
    excused references (the probes' own helpers, refused) or the plain fingerprints (a helper
    like them, refused as a copy) breaks it."""
    state = guard.seal()
    tables = None
    for ex_id in sorted({"0.1", "0.2", *CHEATS, *LATER_CHAPTERS}, key=float):
        plan = guard.plan_for(get_exercise(ex_id))
        assert not any("the grader's own" in e["label"] for e in plan["code"]), ex_id
        split = guard.Guard(plan, state)
        whole = guard.Guard({**plan, "code": guard.plan_entries(plan), "references": None}, state)
        assert whole._shared is None and split._shared is not None
        tables = tables or split._shared
        assert split._shared is tables, ex_id  # indexed once per seal
        for name in ("by_where", "by_synthetic", "by_fp", "gram_counts", "sketches", "by_clone"):
            assert getattr(split, "_" + name) == getattr(whole, "_" + name), (ex_id, name)
        for fp in whole._gram_counts:  # where a copy candidate's code is found: same function
            assert guard._where(guard._forbidden_code(state, split._where_of_fp[fp], fp)) \
                == guard._where(guard._forbidden_code(state, whole._where_of_fp[fp], fp))
        probe_code = get_exercise(ex_id).cases[0].probe.__code__
        assert split._similar_candidates(probe_code) == whole._similar_candidates(probe_code)
        assert split._memo["counts_sorted"] == whole._memo["counts_sorted"], ex_id
    excused = guard.plan_for(get_exercise("0.2"))["references"]["excused"]
    assert any(qualname == "_big_n" for _, _, qualname in excused)


def test_the_seal_keeps_the_references_the_grader_sends(sealed, monkeypatch):
    """The grader's second cell gives the seal the references' JSON (``seal_references``): the
    guards of every check index them from there, once, and never make them in the kernel."""
    plan = guard.plan_for(get_exercise("4.1"))
    text = guard.reference_plan()["text"]
    forbidden = guard._tables(guard.plan_entries(plan))["by_where"]
    state = sealed("4.1")
    state["references"] = None
    guard.seal_references(SEAL_KEY, text)
    monkeypatch.setattr(guard, "reference_plan", lambda: pytest.fail("made in the kernel"))
    first, second = guard.Guard(plan, state), guard.Guard(plan, state)
    assert first._shared is second._shared is state["references"]["tables"]
    assert first._by_where == forbidden


def test_a_later_guard_of_the_plan_keeps_the_verdicts_and_still_refuses(hook_kind, monkeypatch):
    """Guards of one plan in one kernel keep what the earlier ones found (``guard._memo``): the
    second check of an answer classifies no code again, yet a forbidden function is still
    refused from the kept verdict (rejects a memo that kept "nothing forbidden here" for the
    code it saw), and the verdicts are forgotten when what the guard calls a Numba
    dispatcher's method changes. (The native tables under kept verdicts:
    ``test_a_second_check_refuses_what_the_first_refused``.)"""
    from mlsys_lab.grading.core import probe

    state = guard.seal()
    exercise = registry.get_exercise("97.1")
    plan = guard.plan_for(exercise)
    if hook_kind == "python":
        state["native"] = None

    def score(answer):
        return judge_exercise(exercise, probe.run_exercise(exercise, [answer], 1, plan, state),
                              1).score

    assert score(honest_kahn) == 1
    calling = SHORTCUTS["calling it"]
    assert score(calling) == 0
    classified = []
    real = guard.Guard._classify
    monkeypatch.setattr(guard.Guard, "_classify",
                        lambda self, code: classified.append(code) or real(self, code))
    assert score(honest_kahn) == 1
    assert score(calling) == 0  # refused from the kept verdict on kahn
    assert classified == [], [c.co_qualname for c in classified]
    memo = state["memos"][id(plan)]
    assert id(honest_kahn.__code__) in memo["seen"]
    memo["dispatch"] = object()  # as if Numba's dispatcher classes had changed since
    assert score(honest_kahn) == 1
    assert honest_kahn.__code__ in classified  # classified again
    assert score(calling) == 0


def test_9_1s_probe_leaves_no_suspended_input_for_the_collector():
    """An answer that stops reading 9.1's input early and keeps it in a cycle must not leave
    the probe's generator suspended: the collector would close it inside a later exercise's
    check, where its code is a forbidden reference (9.2's reference answer once lost 2 points
    so in the suite)."""
    import gc

    def keeps_it(fn, items, m):
        box = {"items": items}
        box["self"] = box  # only the collector frees it
        for x in items:
            yield fn(x)
            return

    probe = next(c.probe for c in get_exercise("9.1").cases
                 if c.probe.__name__ == "_pm_streaming_probe")
    gc.disable()
    try:
        probe(keeps_it, 1)
        left = [o for o in gc.get_objects() if isinstance(o, types.GeneratorType)
                and o.gi_code.co_name == "source" and o.gi_frame is not None]
    finally:
        gc.enable()
    assert left == []


def test_a_grader_objects_finaliser_is_not_refused_in_another_exercises_probe():
    """19.1's probe counts activations with a ``__del__``. One left in a cycle was freed by the
    collector inside 19.2's probe, where 19.1's code is a forbidden reference: the full suite
    refused 19.2's reference answer so. A finaliser is run by the interpreter wherever its
    object dies and is never an answer: finalisers are not among the grader's references."""
    from mlsys_lab.grading.exercises.ch19_training_large_models.ex19_1_recompute import (
        _Activation,
    )

    g = guard.Guard(guard.plan_for(get_exercise("19.2")))
    tally = {"alive": 0, "peak": 0}
    activation = _Activation(None, tally)
    with g.watching():
        del activation  # its finaliser runs here, in 19.2's probe
    assert tally["alive"] == 0 and g.violations == [], g.violations
    assert not any(e["qualname"].endswith("__del__") for e in guard.reference_plan()["entries"])


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

    # The plan first, as the grader computes it in its own process (plans are cached per
    # exercise: one made with py_func swapped would forbid the lambda, for later tests too).
    guard.plan_for(registry.get_exercise("97.3"))
    monkeypatch.setattr(cpu._naive_kernel, "py_func", lambda a, b, c: None)
    result = run_cases("97.3", numba_answers["calling the library kernel"])
    assert result.score == 0 and "off limits" in _feedback(result)


def test_the_seal_names_a_library_kernel_whose_py_func_was_swapped(monkeypatch):
    """What a dispatcher runs is read from its ``py_func`` and its overloads' annotations; an
    overload loaded from Numba's disk cache has its annotation as text, without the code, so
    with ``py_func`` swapped only the seal's record of the dispatcher names the kernel (on
    Python 3.12 the swapped kernel above ran unrefused until the seal kept it)."""
    from mlsys_lab.kernels import cpu

    kernel = cpu._naive_kernel
    state = guard.seal()
    g = guard.Guard(guard.plan_for(registry.get_exercise("97.3")), state)
    monkeypatch.setattr(kernel, "py_func", lambda a, b, c: None)
    monkeypatch.setattr(kernel, "overloads", {})  # as if every annotation were text
    label = g._dispatcher_label_of(kernel)
    assert label is not None and "_naive_kernel" in label[0]
    del state["kernels"][id(kernel)]  # without the seal's record, only Numba's own copy of
    monkeypatch.setattr(kernel, "func_code", kernel.py_func.__code__)  # the code names it
    assert g._dispatcher_label_of(kernel) is None


def test_a_kernel_imported_after_the_seal_is_named_by_what_its_overloads_were_compiled_from(
        numba_answers, monkeypatch):
    """A kernel whose module the notebook imports after the seal has no record there. With its
    ``py_func``, ``func_code`` and ``__code__`` all swapped, and its overloads' annotations text
    (as loaded from Numba's disk cache, where they carry no code), each overload's function
    descriptor still names the module and function it was compiled from."""
    from mlsys_lab.kernels import cpu

    kernel = cpu._naive_kernel
    state = guard.seal()
    state["kernels"].pop(id(kernel), None)  # as if imported after the seal
    g = guard.Guard(guard.plan_for(registry.get_exercise("97.3")), state)
    fake = (lambda a, b, c: None)
    monkeypatch.setattr(kernel, "py_func", fake)
    monkeypatch.setattr(kernel, "func_code", fake.__code__)
    monkeypatch.setattr(kernel, "__code__", fake.__code__)
    monkeypatch.setattr(kernel, "overloads", {sig: cres._replace(type_annotation="as text")
                                              for sig, cres in kernel.overloads.items()})
    assert kernel.overloads  # numba_answers compiled it
    label = g._dispatcher_label_of(kernel)
    assert label is not None and "_naive_kernel" in label[0]
    monkeypatch.setattr(kernel, "overloads", {})
    assert g._dispatcher_label_of(kernel) is None  # nothing else names it


def test_numba_overload_compiled_between_two_probes_is_switched_off():
    """A guard works out once which dispatchers to switch off (again only when one compiles a
    new overload); the entry points it refuses are read at every probe's start: an overload
    of a forbidden kernel compiled between two probes (a new argument type) is refused in the
    next when its entry point is called directly (caching the entry points would miss it)."""
    from mlsys_lab.kernels import cpu

    kernel = cpu._naive_kernel
    g = guard.Guard(guard.plan_for(registry.get_exercise("97.3")))
    with g.watching():  # the first probe: what to switch off is worked out
        pass
    rng = np.random.default_rng(0)
    a, b = rng.integers(-9, 9, (5, 4), np.int16), rng.integers(-9, 9, (4, 3), np.int16)
    c = np.zeros((5, 3), np.int16)
    before = len(kernel.overloads)
    kernel(a, b, c)  # compiles a new overload, between two probes
    assert len(kernel.overloads) == before + 1
    entry = kernel.overloads[next(s for s in kernel.overloads if "int16" in str(s))].entry_point
    with g.watching():
        with pytest.raises(guard.OffLimitsError):
            entry(a, b, c)
    assert g.violations and "_naive_kernel" in g.violations[0]
    out = np.zeros_like(c)
    kernel(a, b, out)  # switched back on afterwards
    np.testing.assert_array_equal(out, a @ b)


def test_a_dispatcher_that_compiles_a_call_to_a_forbidden_one_between_probes_is_switched_off():
    """What a guard found among the dispatchers is kept while the words that say it holds are
    the same (``_dispatcher_watch``): a dispatcher alive at the first probe, compiled between
    two probes with a call to the forbidden kernel, changes its overloads' version, so the
    next probe switches it off and the call is refused. (Compiling also registers finalizers;
    the overloads' version alone is checked too: a watch that did not read it would keep a
    dispatcher on whose compiled code calls the kernel unseen.)"""
    from numba import njit

    from mlsys_lab.kernels import cpu

    outer = _cell_njit(njit, cpu)
    g = guard.Guard(guard.plan_for(registry.get_exercise("97.3")))
    with g.watching():  # the first probe: what to switch off is worked out, and watched
        pass
    watch = g._memo["watch"]
    assert watch is not None and outer in watch["found"] and guard._still_holds(watch)
    outer.overloads["x"] = None  # its overloads change, the finalizers' registry does not
    del outer.overloads["x"]
    assert not guard._still_holds(watch)
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    b, c = np.ones((3, 2), np.int16), np.zeros((2, 2), np.int16)
    outer(a, b, c)  # compiled between the two probes: its code calls ``_naive_kernel``
    with g.watching():
        with pytest.raises(guard.OffLimitsError):
            outer(a, b, np.zeros_like(c))
    assert g.violations and "_naive_kernel" in g.violations[0], g.violations
    with g.watching():  # the watch, remade: the same refusal
        with pytest.raises(guard.OffLimitsError):
            outer(a, b, np.zeros_like(c))
    out = np.zeros_like(c)
    outer(a, b, out)
    np.testing.assert_array_equal(out, a @ b)


def _cell_njit(njit, cpu):
    """A student's jitted function (compiled lazily) that calls the library's kernel."""
    scope = {"njit": njit, "cpu": cpu}
    exec(compile("@njit\ndef outer(a, b, c):\n    cpu._naive_kernel(a, b, c)\n",
                 "/tmp/ipykernel_4242/outer.py", "exec"), scope)
    return scope["outer"]


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
    exercise = registry.get_exercise("0.1")

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
    with pytest.raises(ValueError, match="both a probe and a judge"):
        Case("x", 1, judge=abs)


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
import mlsys_lab.grading.core.check as c
c._run_case = lambda case, answers: c.CaseResult(case.name, case.points, case.points, True)
c.run_cases = lambda exercise_id, *a, **k: None
"""

JUDGE_ATTACK = """
import mlsys_lab.grading.core.exercise as c, mlsys_lab.grading.core.judge as j
import mlsys_lab.grading.exercises.ch00_demo.ex0_1_square as ch
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
from mlsys_lab.grading.exercises.ch00_demo.ex0_1_square import _floats
fake = types.ModuleType("mlsys_lab.grading.core.probe")
fake.MIME = "application/vnd.mlsys-lab.probe+json"
def emit(exercise_id, namespace, seed, marker, plan):
    cases = [{"name": "square(3) == 9", "kind": "probe", "status": "ok", "value": 9},
             {"name": "square(-1.5) and random floats", "kind": "probe", "status": "ok",
              "value": [x * x for x in _floats(seed)]}]
    payload = {"exercise": exercise_id, "cases": cases, "marker": marker}
    publish_display_data({fake.MIME: json.dumps(payload)})
fake.emit = emit
fake.run_exercise = lambda *a, **k: None
for name in [*sys.modules, "mlsys_lab.grading.core.probe", "mlsys_lab.grading.core.check"]:
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


# The kernel's own guard module is not sealed (the hidden cell runs private copies of it), but
# the seal's record was built by it: a comparison that lived on that record's class answered
# "nothing changed" for whatever the notebook had replaced.
SEAL_COMPARISON_ATTACK = """
import math
import mlsys_lab.grading.core.guard as g
for owner in (getattr(g, "_Frozen", None), g):
    for name in ("same", "_frozen_same", "frozen_same"):
        if owner is not None and hasattr(owner, name):
            setattr(owner, name, lambda *a, **k: True)
g.tampered = lambda state: []
math.fsum = lambda xs: 0.0
"""


def test_the_kernels_guard_module_cannot_vouch_for_the_seal(tmp_path):
    answers = {"0.1": "def square(x):\n    return x * x\n"}
    path = _notebook(answers, tmp_path / "ch00_seal.ipynb", extra=SEAL_COMPARISON_ATTACK)
    report = grade(path, cell_timeout=30, timeout=120)
    assert _points(report)["0.1"] == 0, report.to_table()
    assert "your notebook changed `math.fsum`" in report.rows[0].feedback, report.to_table()


def test_every_checks_copy_of_the_guard_shares_the_kernels_caches():
    """The hidden cell runs a fresh copy of the guard module for every check: its caches (files
    compiled as on disk, fingerprints, n-grams) are the seal's, not empty ones (13.1-13.3 took
    twice as long with each check recompiling what the one before had)."""
    state = guard.seal()
    plan = guard.plan_for(registry.get_exercise("97.1"))
    copies = []
    for _ in range(2):
        spec = importlib.util.spec_from_file_location("guard_copy", guard.__file__)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.Guard(plan, state)
        copies.append(module)
    for name, key in (("_ON_DISK", "on_disk"), ("_IDENTITY", "identity"), ("_GRAMS", "grams"),
                      ("_REALPATH", "realpath")):
        assert getattr(copies[0], name) is getattr(copies[1], name) is state["caches"][key]


@pytest.mark.parametrize("words", ["native", "python"])
def test_tampered_does_not_rely_on_builtins_the_notebook_replaced(words, monkeypatch):
    """The comparison uses the builtins as they were at the seal: ``all`` always True and an
    empty ``range`` would otherwise have hidden every change, themselves included."""
    import builtins
    import math

    state = guard.seal()
    if words == "python":
        state["frozen"]["gather"] = None
    monkeypatch.setattr(builtins, "all", lambda iterable: True)
    monkeypatch.setattr(builtins, "range", lambda *args: iter(()))
    monkeypatch.setattr(math, "fsum", lambda xs: 0.0)
    found = guard.tampered(state)
    monkeypatch.undo()
    assert {"`math.fsum`", "`builtins.all`", "`builtins.range`"} <= set(found), found


def test_code_nested_in_the_sealed_code_is_the_librarys_by_identity():
    """The grader's seal records every function's own code; a closure or comprehension inside
    it is recognised when it runs, by identity among the constants of the recorded code of its
    file. A copy of that nested code, changed or not, is not it."""
    import builtins

    state = guard.seal("nested-test")
    try:
        parent = next(c for c in state["codes"].values() if not c.co_filename.startswith("<")
                      and any(isinstance(k, types.CodeType) for k in c.co_consts))
        inner = next(k for k in parent.co_consts if isinstance(k, types.CodeType))
        assert id(inner) not in state["codes"]  # not recorded itself
        assert guard._nested_in_sealed(state, inner) and guard._trusted(state, inner)
        assert not guard._nested_in_sealed(state, inner.replace(co_name=inner.co_name))
        edited = inner.replace(co_consts=inner.co_consts + ("an edit",))
        assert not guard._trusted(state, edited)
    finally:
        del vars(builtins)[guard._SEAL_NAME.format("nested-test")]


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
        "0.2": "from mlsys_lab.grading.exercises.ch00_demo.ex0_2_fib import _fib as fib\n",
        "0.3": "import statistics\n\ndef mean(xs):\n    return statistics.mean(xs)\n",
    }
    report = grade(_notebook(answers, tmp_path / "ch00_cheat.ipynb"), cell_timeout=30,
                   timeout=120)
    assert _points(report) == {"0.1": 0, "0.2": 0, "0.3": 0}, report.to_table()
    assert "ex0_2_fib._fib` (the grader's own reference) is off limits" in report.rows[1].feedback
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


# ----------------------------------------------------------------------------- issue 27: holes
#
# One cheat per hole the independent tester found, on real chapter exercises (2-13). Each cheat
# is first shown to be a correct answer when no guard watches (so the zero below is the guard's
# doing), then scores zero on the cases that test the idea.

import _thread  # noqa: E402
import ast as _ast  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402

from mlsys_lab.grading.core import probe  # noqa: E402
from mlsys_lab.grading.core.exercise import get_exercise  # noqa: E402

STDLIB_FILE = os.path.realpath(json.__file__)  # a file under the installed Python


class _NoGuard:
    """Stands in for the guard: the probes run unwatched (what a cheat would get without it)."""

    def __init__(self, *args, **kwargs):
        self.violations = []

    @contextlib.contextmanager
    def watching(self):
        yield self


def _recode(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_recode(c, filename) if isinstance(c, types.CodeType) else c
                   for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _clone(fn, filename: str = STDLIB_FILE, name: str | None = None):
    """H1: ``fn`` with its code (and nested code) claiming to come from the installed Python."""
    fn = guard._unwrap(fn)
    code = _recode(fn.__code__, filename)
    if name is not None:
        code = code.replace(co_name=name, co_qualname=name)
    clone = types.FunctionType(code, fn.__globals__, name or fn.__name__, fn.__defaults__,
                               fn.__closure__)
    clone.__kwdefaults__ = fn.__kwdefaults__  # keyword-only defaults (18.2's attention)
    return clone


def _paste_padded(fn, padding: str = "_unused = None"):
    """H2: ``fn``'s source pasted into a cell, renamed, with a no-op line added to its body."""
    fn = guard._unwrap(fn)
    source = textwrap.dedent(inspect.getsource(fn))
    tree = _ast.parse(source)
    node = tree.body[0]
    lines = source.splitlines()
    first = node.body[0]
    skip_doc = isinstance(first, _ast.Expr) and isinstance(getattr(first, "value", None),
                                                           _ast.Constant)
    at = (first.end_lineno if skip_doc else first.lineno - 1)
    indent = " " * node.body[-1].col_offset
    lines.insert(at, indent + padding)
    lines = lines[node.lineno - 1:]  # no decorators
    text = "\n".join(lines).replace(f"def {fn.__name__}(", "def pasted(", 1)
    scope = dict(fn.__globals__)
    exec(compile("\n\n" + text, "<cell>", "exec"), scope)
    return scope["pasted"]


#: exercise -> the cases that test the idea (the cheat must score zero on them).
IDEA_CASES = {
    "2.1": None, "2.2": None,
    # 3.1: the cases that run forward (Linear's own __init__ cannot serve another class)
    "3.1": ("forward equals (x @ U) @ V + bias", "gradients reach U, V and bias",
            "never forms the full in x out matrix"),
    # 3.2: the rule cases (the forward and its overflow never call a rule)
    "3.2": ("one registered op; rules follow the registry", "your VJP rule, ml.grad and ml.vjp",
            "your JVP rule, ml.jvp, agreement with the VJP",
            "second derivative (rules in ml ops)"),
    "3.3": ("sgd_step is pure and correct",), "4.1": None, "4.2": None, "4.3": None,
    "4.4": None,
    # 6.1: not vjp_tanh, whose library rule (g * (1 - y * y), 9 instructions) is under
    # guard.CLONE: a clone or paste of it is the formula a student writes
    "6.1": ("vjp_mul, equal shapes", "vjp_mul with broadcasting", "vjp_matmul"),
    "6.2": None, "6.3": None, "6.4": None, "7.1": None, "7.2": None, "7.3": None, "7.4": None,
    # 8.1, 8.2: the correctness cases (the library's tiles are not the exercise's: its kernel
    # fails the structure and counting cases even unguarded)
    "8.1": ("float32, odd sizes, inputs untouched", "float64 and non-contiguous views"),
    "8.2": ("(5×7) @ (7×3): one block", "several blocks and K-tiles, clipped edges"),
    # 8.3: gemm_bytes (tile_intensity and attainable are one-line formulas under guard.CLONE)
    "8.3": ("gemm_bytes: A and B read, C written once",),
    # 8.4: the values (the library converts to float64: the counting case fails unguarded)
    "8.4": ("equals the direct 3-tap correlation",), "9.1": None,
    # 9.2: not the argument check, which the cheat's wrapper writes itself
    "9.2": ("every rank gets ceil(n / R) indices; together all of 0..n-1",
            "padding repeats the first indices; rank r takes order[r::R]",
            "all ranks split one permutation: shards overlap only in the padding",
            "set_epoch reshuffles the whole dataset; the same epoch repeats",
            "drop_last cuts the tail: floor(n / R) each"),
    "9.3": None, "10.1": None, "10.2": None, "10.3": None, "11.1": None, "11.2": None,
    "11.3": None, "11.4": None, "13.1": None, "13.2": None, "13.3": None,
    **{ex_id: None for ex_id in LATER_CHAPTERS},
}


def _idea_rows(result, ex_id):
    names = IDEA_CASES.get(ex_id)
    return [row for row in result.rows if names is None or row.name in names]


def _passes_unguarded(ex_id, answers, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(probe, "Guard", _NoGuard)
        result = run_cases(ex_id, *answers, seed=3)
    rows = _idea_rows(result, ex_id)
    assert rows and all(row.passed for row in rows), result.report()


@pytest.mark.parametrize("ex_id", sorted(IDEA_CASES, key=lambda i: float(i)))
def test_h1_a_clone_claiming_a_library_file_is_refused(ex_id, monkeypatch):
    """H1: ``code.replace(co_filename=<stdlib path>)``, recursively, renamed or not."""
    _passes_unguarded(ex_id, CHEATS[ex_id](lambda f: f), monkeypatch)
    for transform in (_clone, functools.partial(_clone, name="my_own")):
        result = run_cases(ex_id, *CHEATS[ex_id](transform), seed=3)
        rows = _idea_rows(result, ex_id)
        assert all(row.points == 0 for row in rows), result.report()
        assert "off limits" in _feedback(result), result.report()


def test_h1_a_clone_of_a_small_library_function_is_refused_under_its_own_name(monkeypatch):
    """18.3's library helpers are small (``residual`` is 32 normalised instructions, under
    ``guard.DISTINCTIVE``): a clone keeping its name is refused; a renamed one is, by design,
    not told apart from the student writing those three lines (which is the idea itself)."""
    _passes_unguarded("18.3", CHEATS["18.3"](lambda f: f), monkeypatch)
    result = run_cases("18.3", *CHEATS["18.3"](_clone), seed=3)
    assert result.score == 0 and "is a copy of its code" in _feedback(result), result.report()


def test_h1_a_library_module_compiled_under_a_stdlib_name_is_refused():
    with open(schedule.__file__, encoding="utf-8") as f:
        source = f.read()
    scope = {"__name__": "mlsys_lab.engine.not_the_library", "__package__": "mlsys_lab.engine"}
    exec(compile(source, STDLIB_FILE, "exec"), scope)
    result = run_cases("97.1", scope["kahn"], seed=1)
    assert result.score == 0 and "off limits" in _feedback(result), result.report()


#: H2 exceptions. 14.1's grading reference is the three-line weighted mean itself, 14.3's
#: library helpers (``psi.blind``, ``psi.unblind``) are one line each, 6.2's product rule is 29
#: normalised instructions, 8.3's ``matmul_intensity`` 22 and 11.4's reference server's
#: methods 5-26, all under
#: ``guard.DISTINCTIVE``: a padded paste of them is, by design, not told apart from a student
#: writing those lines (the idea; their clones, H1, are refused). 17.1's reference calls the
#: library's ``dare`` and 4.4's calls ``ml.grad``, so their pastes are refused as calls of a
#: forbidden function ("off limits") before any copy test.
H2_SHORT = {"6.2", "8.3", "11.4", "14.1", "14.3"}
H2_REASON = {"4.4": "off limits", "17.1": "off limits"}


@pytest.mark.parametrize("ex_id", sorted(set(IDEA_CASES) - H2_SHORT, key=lambda i: float(i)))
def test_h2_a_paste_with_an_added_line_is_refused(ex_id, monkeypatch):
    """H2: the reference (or library function) pasted with a no-op line: not one exact hash."""
    _passes_unguarded(ex_id, CHEATS[ex_id](_paste_padded), monkeypatch)
    for padding in ("_unused = None", "_a = 1; _b = 2; _c = None"):
        result = run_cases(ex_id, *CHEATS[ex_id](
            functools.partial(_paste_padded, padding=padding)), seed=3)
        rows = _idea_rows(result, ex_id)
        assert all(row.points == 0 for row in rows), result.report()
        assert H2_REASON.get(ex_id, "is a copy of its code") in _feedback(result), \
            result.report()




@pytest.mark.parametrize("how", ["H1", "H2"])
def test_a_copy_of_the_runtimes_offer_alone_is_refused(how, monkeypatch):
    """17.3: the runtime's ``Subscription.offer`` cloned (H1) or pasted with a no-op line (H2)
    under a hand-written ``__init__``: every case that pushes scores zero; the depth check,
    which is the answer's own code, keeps its half point."""
    from mlsys_lab.robotics import runtime
    transform = _clone if how == "H1" else _paste_padded
    answer = keep_last_on_offer(transform(runtime.Subscription.offer))
    with monkeypatch.context() as m:
        m.setattr(probe, "Guard", _NoGuard)
        unguarded = run_cases("17.3", answer, seed=3)
    assert unguarded.score == unguarded.max, unguarded.report()
    result = run_cases("17.3", answer, seed=3)
    pushing = [row for row in result.rows if row.name != "depth < 1 raises ValueError"]
    assert len(pushing) == 5 and all(row.points == 0 for row in pushing), result.report()
    assert all("`mlsys_lab.robotics.runtime.Subscription.offer` is off limits" in row.feedback
               and "is a copy of its code" in row.feedback for row in pushing), result.report()


def test_similarity_separates_copies_from_independent_answers():
    """Independent answers stay far below the threshold; padded or renamed pastes above it."""
    assert guard.similarity(honest_kahn.__code__, schedule.kahn.__code__) < 0.5
    assert guard.similarity(_paste_padded(schedule.kahn).__code__, schedule.kahn.__code__) == 1.0
    renamed = _paste_padded(schedule.kahn, "count_me = 0\n    count_me = count_me + 1")
    assert guard.similarity(renamed.__code__, schedule.kahn.__code__) >= guard.SIMILAR


def _jaccard_and_sketches(a, b):
    grams = [{tuple(t[i:i + n]) for n in guard._NGRAMS for i in range(len(t) - n + 1)}
             for t in (a, b)]
    union = len(grams[0] | grams[1])
    return (len(grams[0] & grams[1]) / union if union else 1.0,
            guard._bucket_counts(grams[0]), guard._bucket_counts(grams[1]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.sampled_from([f"OP{k}" for k in range(12)]), min_size=20,
                       max_size=200),
       edits=st.lists(st.tuples(st.booleans(), st.integers(0, 10**6),
                                st.sampled_from([f"OP{k}" for k in range(14)])), max_size=12))
def test_the_sketch_bound_never_rules_out_a_copy(tokens, edits):
    """``may_be_similar`` only prunes: a stream and its edited copy (tokens inserted or
    deleted) at or above ``SIMILAR`` always pass it, and the bound is never below the
    similarity (an inexact bound would let a paste through unexamined)."""
    copy = list(tokens)
    for insert, at, token in edits:
        at %= len(copy) + 1
        if insert:
            copy.insert(at, token)
        elif copy and at < len(copy):
            del copy[at]
    similarity, a, b = _jaccard_and_sketches(tokens, copy)
    common = sum(map(min, a, b))
    assert similarity <= common / (sum(a) + sum(b) - common) + 1e-12
    if similarity >= guard.SIMILAR:
        assert guard.may_be_similar(a, b) and guard.may_be_similar(b, a)


def test_sketches_spare_the_n_grams_of_unlike_forbidden_functions(monkeypatch):
    """An honest answer of about the size of many forbidden functions (10.1's fold, against
    the ~100 references of its size) is compared with none of them in full: their sketches
    rule every one out, so none is compiled from its file and taken apart. A paste still is."""
    answer = _solution_source("ch10_model_deployment.ipynb", "fold_bn")["fold_bn"]
    plan = guard.plan_for(get_exercise("10.1"))
    assert sum("sketch" in e for e in guard.plan_entries(plan)) >= 100
    looked_at = []
    real = guard._grams_of
    monkeypatch.setattr(guard, "_grams_of", lambda state, fp, where: looked_at.append(fp)
                        or real(state, fp, where))
    g = guard.Guard(plan, guard.seal())
    assert g._label(answer.__code__) is None and looked_at == []
    pasted = _paste_padded(schedule.kahn)
    g = guard.Guard(guard.plan_for(get_exercise("4.1")), guard.seal())
    assert g._label(pasted.__code__) is not None and looked_at


# Independent correct answers, written for these tests (not copied from the references): they
# must keep full marks under the guard.

def kahn_with_deque(nodes, edges):
    """4.1 with a Counter of in-degrees and a deque."""
    from collections import Counter, deque
    indegree = Counter(dst for _, dst in edges)
    after = {}
    for src, dst in edges:
        after.setdefault(src, []).append(dst)
    queue = deque(n for n in nodes if indegree[n] == 0)
    order = []
    while queue:
        node = queue.popleft()
        order.append(node)
        for nxt in after.get(node, ()):
            indegree[nxt] -= 1
            if not indegree[nxt]:
                queue.append(nxt)
    if len(order) != len(nodes):
        raise ml.CycleError(f"{len(nodes) - len(order)} nodes lie on a cycle")
    return order


def kahn_with_a_cursor(nodes, edges):
    """4.1 with a growing list read by a cursor, and edge counts kept in a list."""
    position = {n: i for i, n in enumerate(nodes)}
    waiting = [0] * len(nodes)
    targets = [[] for _ in nodes]
    for src, dst in edges:
        waiting[position[dst]] += 1
        targets[position[src]].append(position[dst])
    line = [i for i in range(len(nodes)) if waiting[i] == 0]
    cursor = 0
    while cursor < len(line):
        for t in targets[line[cursor]]:
            waiting[t] -= 1
            if waiting[t] == 0:
                line.append(t)
        cursor += 1
    if cursor < len(nodes):
        raise ml.CycleError("the graph has a cycle")
    return [nodes[i] for i in line]


def recall_by_sets(retrieved, relevant, k):
    """13.2, written from the definition."""
    wanted = set(relevant)
    if not wanted or k < 1:
        raise ValueError("recall needs a relevant item and k >= 1")
    hits = set()
    for item in list(retrieved)[:k]:
        if item in wanted:
            hits.add(item)
    return len(hits) / min(len(wanted), k)


def schedule_by_events(graph, workers, cost):
    """7.3 as an event simulation with a heap of finishing times (critical path first)."""
    import heapq
    ids = [n.id for n in graph.nodes]
    preds = {n.id: {v.producer.id for v in n.inputs if v.producer is not None}
             for n in graph.nodes}
    children = {i: [] for i in ids}
    for i, ps in preds.items():
        for p in ps:
            children[p].append(i)
    height = {}
    for i in reversed(ids):
        height[i] = cost[i] + max([height[c] for c in children[i]] or [0.0])
    waiting = {i: len(preds[i]) for i in ids}
    ready = [(-height[i], i) for i in ids if waiting[i] == 0]
    heapq.heapify(ready)
    idle, running, done, t = list(range(workers)), [], {}, 0.0
    while len(done) < len(ids):
        while ready and idle:
            _, i = heapq.heappop(ready)
            w = idle.pop(0)
            done[i] = (w, t, t + cost[i])
            heapq.heappush(running, (t + cost[i], i, w))
        t, i, w = heapq.heappop(running)
        idle.append(w)
        idle.sort()
        for c in children[i]:
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(ready, (-height[c], c))
        while running and running[0][0] == t:
            _, j, v = heapq.heappop(running)
            idle.append(v)
            idle.sort()
            for c in children[j]:
                waiting[c] -= 1
                if waiting[c] == 0:
                    heapq.heappush(ready, (-height[c], c))
    return done


@pytest.mark.parametrize("ex_id, answer", [
    ("4.1", lambda: kahn_with_deque), ("4.1", lambda: kahn_with_a_cursor),
    ("13.2", lambda: recall_by_sets), ("7.3", lambda: schedule_by_events),
], ids=["4.1 deque", "4.1 cursor", "13.2 sets", "7.3 events"])
def test_independent_answers_keep_full_marks(ex_id, answer):
    for seed in (1, 2, 3):
        result = run_cases(ex_id, answer(), seed=seed)
        assert result.score == result.max, result.report()


# H4 and H5: the result's way out and the probes' dependencies are sealed. ``guard.seal`` is what
# the grader's first cell runs in a fresh kernel; ``probe.emit`` is what its hidden cell runs.

SEAL_KEY = "test-seal"


@pytest.fixture
def sealed():
    import builtins

    def make(*ex_ids):  # with the grader's references, as its first cell sends them
        return guard.seal(SEAL_KEY, ex_ids, guard.reference_plan()["text"])

    yield make
    vars(builtins).pop(guard._SEAL_NAME.format(SEAL_KEY), None)


MARKER = "__MARK__"


def _emit(ex_id, namespace, capsys, seed=5):
    """Run the hidden cell's ``emit`` here, with the plan as the grader sends it (JSON text);
    return the grader's verdict on what it sent."""
    exercise = get_exercise(ex_id)
    capsys.readouterr()
    probe.emit(ex_id, namespace, seed, MARKER, grader._prepare(exercise)[1], SEAL_KEY)
    return _judged(exercise, capsys.readouterr().out, seed)


def _judged(exercise, out, seed):
    """The grader's verdict on the payload a hidden cell printed (outside a kernel)."""
    line = next(ln for ln in out.splitlines() if ln.startswith(MARKER))
    return judge_exercise(exercise, json.loads(line[len(MARKER):]), seed)


def _stub(*args, **kwargs):
    raise NotImplementedError("stub")


H4_EXERCISES = sorted(CHEATS, key=float)


@pytest.mark.parametrize("ex_id", H4_EXERCISES)
def test_h4_a_patched_json_dumps_cannot_forge_the_result(ex_id, sealed, capsys, monkeypatch):
    """H4: the answers are stubs; ``json.dumps`` re-runs the probes with the library (outside
    the guard) and swaps the cases in. The payload leaves through the sealed encoder, and the
    changed ``json.dumps`` fails every case."""
    exercise = get_exercise(ex_id)
    cheat = CHEATS[ex_id](lambda f: f)
    if ex_id != "3.3":  # the forger's answers are right (3.3's only on its idea case)
        _passes_unguarded(ex_id, cheat, monkeypatch)
    sealed(ex_id)
    real_dumps = json.dumps

    def forging_dumps(obj, *args, **kwargs):
        if isinstance(obj, dict) and "marker" in obj and "cases" in obj:
            with monkeypatch.context() as m:
                m.setattr(probe, "Guard", _NoGuard)
                honest = probe.run_exercise(exercise, cheat, obj["seed"])
            obj = {**obj, "cases": honest["cases"]}
        return real_dumps(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", forging_dumps)
    namespace = {target: _stub for target in exercise.targets}
    result = _emit(ex_id, namespace, capsys)
    assert result.score == 0, result.report()
    assert all("changed `json.dumps`" in row.feedback for row in result.rows), result.report()


def test_a_patched_json_decoder_cannot_empty_the_plan(sealed, capsys, monkeypatch):
    """The plan reaches the kernel as JSON text. A notebook that patches the decoder to drop
    every forbidden function from it (so that calling the library would pass) fails every case:
    the decoder is the seal's, and the change is tampering."""
    exercise = get_exercise("4.1")
    cheat = CHEATS["4.1"](lambda f: f)
    _passes_unguarded("4.1", cheat, monkeypatch)
    sealed("4.1")
    real_decode = json.decoder.JSONDecoder.decode

    def emptying_decode(self, text, *args, **kwargs):
        obj = real_decode(self, text, *args, **kwargs)
        if isinstance(obj, dict) and "code" in obj:
            obj = {**obj, "code": [], "builtins": []}
        return obj

    monkeypatch.setattr(json.decoder.JSONDecoder, "decode", emptying_decode)
    namespace = dict(zip(exercise.targets, cheat))
    result = _emit("4.1", namespace, capsys)
    assert result.score == 0, result.report()
    assert all("changed `json.decoder.JSONDecoder.decode`" in row.feedback
               for row in result.rows), result.report()


def test_the_hidden_cell_compiles_each_module_once_per_kernel(sealed, capsys):
    """The hidden cell runs the grading modules from the source the grader sends, into fresh
    private modules every check; their code is compiled once per kernel and kept in the seal
    with its source. The same source is not compiled again; a different source is."""
    import builtins

    exercise = get_exercise("4.1")
    sealed("4.1")
    bundle, plan = grader._prepare(exercise)
    namespace = {"__name__": "__main__", exercise.targets[0]: kahn_with_deque}

    def hidden_cell(bundle):
        capsys.readouterr()
        source = grader._BOOTSTRAP.format(payload=repr((bundle, plan)), exercise="4.1",
                                          seed=3, marker=MARKER, key=SEAL_KEY)
        exec(compile(source, "<hidden cell>", "exec"), namespace)
        result = _judged(exercise, capsys.readouterr().out, 3)
        assert result.score == result.max, result.report()
        return dict(vars(builtins)[guard._SEAL_NAME.format(SEAL_KEY)]["compiled"])

    first = hidden_cell(bundle)
    assert set(first) == set(bundle)
    again = hidden_cell(bundle)
    assert all(again[name][1] is first[name][1] for name in bundle)
    name = "mlsys_lab.grading.core.probe"
    changed = {**bundle, name: (bundle[name][0], bundle[name][1] + "\n# another version\n")}
    third = hidden_cell(changed)
    assert third[name][1] is not first[name][1] and third[name][0] == changed[name][1]
    assert all(third[n][1] is first[n][1] for n in bundle if n != name)


def test_sealed_emit_keeps_full_marks_for_honest_answers(sealed, capsys):
    sealed("4.1", "13.2")
    for ex_id, answer in (("4.1", kahn_with_deque), ("13.2", recall_by_sets)):
        namespace = {get_exercise(ex_id).targets[0]: answer}
        result = _emit(ex_id, namespace, capsys)
        assert result.score == result.max, result.report()


def test_a_missing_seal_fails_every_case(sealed, capsys):
    import builtins
    sealed("4.1")
    vars(builtins).pop(guard._SEAL_NAME.format(SEAL_KEY))
    result = _emit("4.1", {"topological_sort": kahn_with_deque}, capsys)
    assert result.score == 0 and "record of this kernel is gone" in _feedback(result)


def _solution_source(notebook: str, name: str) -> dict:
    nb = nbformat.read(ROOT / "solutions" / notebook, as_version=4)
    scope = {}
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith(("import", "from")):
            exec(cell.source, scope)
            break
    source = next(c.source for c in nb.cells
                  if c.cell_type == "code" and f"def {name}(" in c.source)
    exec(source, scope)
    return scope


def test_h5_a_replaced_simulator_fails_the_case(sealed, capsys, monkeypatch):
    """H5 (11.1): the probe's simulator, pipeline helpers and threading are the kernel's own
    modules; replacing any of them (here with pass-through wrappers that could fake anything)
    fails every case, while the honest answer keeps full marks."""
    from mlsys_lab.distributed import pipeline_parallel, sim

    answer = _solution_source("ch11_distributed_training.ipynb", "ring_allreduce")
    sealed("11.1")
    namespace = {"ring_allreduce": answer["ring_allreduce"]}
    honest = _emit("11.1", namespace, capsys)
    assert honest.score == honest.max, honest.report()
    real_run = sim.run
    replacements = [
        (sim, "run", lambda *a, **k: real_run(*a, **k), "`mlsys_lab.distributed.sim.run`"),
        (pipeline_parallel, "make_schedule", lambda *a, **k: None, "make_schedule"),
        (threading.Thread, "run", lambda self: None, "threading.Thread.run"),
        (sim.Cluster, "__init__", sim.Cluster.__init__, None),  # the same object: no change
    ]
    for owner, name, fake, where in replacements:
        with monkeypatch.context() as m:
            m.setattr(owner, name, fake)
            result = _emit("11.1", namespace, capsys)
        if where is None:
            assert result.score == result.max, result.report()
        else:
            assert result.score == 0 and where in _feedback(result), result.report()


#: H5 per exercise: a library function the exercise's probes call themselves (checked by
#: ``test_h5_each_dependency_is_one_the_probes_call``). The probes of the other exercises of
#: chapters 2-13 call only numpy and the standard library, sealed the same way.
H5_DEPENDENCY = {
    "2.1": "mlsys_lab.nn.layers:Linear.__init__",
    "2.2": "mlsys_lab.nn.layers:Sequential.__init__",
    "3.1": "mlsys_lab.nn.module:Module.named_parameters",
    "3.2": "mlsys_lab.engine.tensor:Tensor.numpy",
    "3.3": "mlsys_lab.engine.autodiff:grad",
    "4.2": "mlsys_lab.engine.ops_math:sin",
    "4.3": "mlsys_lab.engine.ops_shape:matmul",
    "6.2": "mlsys_lab.engine.ops_math:log",
    "6.3": "mlsys_lab.engine.ops_math:mul",
    "6.4": "mlsys_lab.engine.ops_math:add",
    "7.2": "mlsys_lab.engine.random_graphs:random_graph",
    "7.3": "mlsys_lab.engine.ops_math:relu",
    "9.1": "threading:Thread.start",
    "11.1": "mlsys_lab.distributed.sim.topology:ring",
}


def _dependency(spec: str):
    """(the object holding it, its name, how ``tampered`` names it) of ``module:qualname``."""
    module, _, qualname = spec.partition(":")
    owner = importlib.import_module(module)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name, f"`{module}.{qualname}`"


@pytest.mark.parametrize("ex_id", sorted(H5_DEPENDENCY, key=float))
def test_h5_each_dependency_is_one_the_probes_call(ex_id, monkeypatch):
    """The dependency runs, called by the exercise's probes (or what they call of the
    grader's), when the cheat's answers are checked with the guard off."""
    exercise = get_exercise(ex_id)
    used = guard._reachable([case.probe for case in exercise.cases])
    owner, name, _ = _dependency(H5_DEPENDENCY[ex_id])
    code = guard._unwrap(vars(owner)[name]).__code__
    calls = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code is code and frame.f_back is not None and \
                guard._where(frame.f_back.f_code) in used:
            calls.append(ex_id)

    monkeypatch.setattr(probe, "Guard", _NoGuard)
    sys.setprofile(hook)
    try:
        run_cases(ex_id, *CHEATS[ex_id](lambda f: f), seed=3)
    finally:
        sys.setprofile(None)
    assert calls


@pytest.mark.parametrize("ex_id", sorted(H5_DEPENDENCY, key=float))
def test_h5_replacing_what_the_probes_call_fails_the_exercise(ex_id, sealed, capsys,
                                                             monkeypatch):
    """H5: the dependency replaced by a pass-through written in a cell (it could fake
    anything): every case fails, naming it."""
    owner, name, label = _dependency(H5_DEPENDENCY[ex_id])
    sealed(ex_id)
    scope = {"real": getattr(owner, name)}
    exec(compile("def wrapper(*args, **kwargs):\n    return real(*args, **kwargs)\n",
                 "/tmp/ipykernel_h5/1.py", "exec"), scope)
    monkeypatch.setattr(owner, name, scope["wrapper"])
    exercise = get_exercise(ex_id)
    result = _emit(ex_id, {target: _stub for target in exercise.targets}, capsys)
    assert result.score == 0, result.report()
    assert all(f"changed {label}" in row.feedback for row in result.rows), result.report()


def test_h5_swapping_a_functions_code_is_seen(sealed, capsys, monkeypatch):
    from mlsys_lab.distributed import sim

    sealed("4.1")
    monkeypatch.setattr(sim.run, "__code__", (lambda *a, **k: None).__code__)
    result = _emit("4.1", {"topological_sort": kahn_with_deque}, capsys)
    assert result.score == 0 and "`mlsys_lab.distributed.sim.run`" in _feedback(result)


LATE = "mlsys_lab.engine.random_graphs"  # 7.2's probe imports it; the seal does not

# What a notebook's cell defines, compiled as a kernel compiles a cell: the student's code.
LATE_CELL = """
import mlsys_lab.engine.random_graphs as late

real_random_graph = late.random_graph

def random_graph(*args, **kwargs):
    return real_random_graph(*args, **kwargs)

class Caller:
    def __call__(self, *args, **kwargs):
        return real_random_graph(*args, **kwargs)

RAN = []

class Meta(type):
    def __getattribute__(cls, name):
        RAN.append(name)
        return type.__getattribute__(cls, name)

class Odd(metaclass=Meta):
    pass

class Liar:
    @property
    def __class__(self):
        RAN.append("__class__")
        return type
"""


@pytest.fixture
def imported_late(monkeypatch):
    """``LATE`` as a module first imported after the seal: out of ``sys.modules`` (and its
    package) until the test's cell imports it again; the process's own copy is put back."""
    import mlsys_lab.engine
    import mlsys_lab.engine.random_graphs  # noqa: F401 - the copy to put back

    monkeypatch.delitem(sys.modules, LATE)
    monkeypatch.delattr(mlsys_lab.engine, "random_graphs")

    def cell():
        scope: dict = {}
        exec(compile(LATE_CELL, "/tmp/ipykernel_late/1.py", "exec"), scope)
        monkeypatch.setitem(sys.modules, LATE, scope["late"])  # undone after the test
        return scope

    return cell


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("how", ["function", "method", "callable object", "class", "wrapped"])
def test_h5_a_module_first_imported_after_the_seal_is_sealed_when_first_seen(when, how,
                                                                             imported_late):
    """H5, late: a sealed module the notebook imports after the seal is recorded when
    ``tampered`` first sees it, if all it holds is the library's code. A member replaced by the
    notebook's code before that (a function, a method, an object whose class is the
    notebook's, a class) is named then; one replaced after it, from then on."""
    state = guard.seal()
    cell = imported_late()
    module = cell["late"]
    assert LATE not in state["modules"]
    if when == "after":
        assert guard.tampered(state) == []
        assert state["modules"][LATE][0] is module
    if how == "method":
        module._Program.pick = cell["random_graph"]
        where = f"`{LATE}._Program" + (".pick`" if when == "after" else "` (`_Program.pick`)")
    else:
        fake = {"function": cell["random_graph"], "callable object": cell["Caller"](),
                "class": cell["Caller"],
                "wrapped": functools.lru_cache(cell["random_graph"])}[how]
        module.random_graph = fake
        where = f"`{LATE}.random_graph`"
        if when == "before" and how in ("callable object", "class"):
            where += " (`Caller.__call__`)"
    found = guard.tampered(state)
    assert found == [where]
    assert guard.tampered(state) == found  # named again: a refusal sticks


def test_the_late_seal_never_runs_the_notebooks_code(imported_late):
    """Looking at a late module's members neither asks a lying ``__class__`` nor a
    metaclass's ``__getattribute__``: the notebook's code would run outside any probe, after
    the comparison that would have seen what it changes."""
    state = guard.seal()
    cell = imported_late()
    cell["late"].liar = cell["Liar"]()
    cell["late"].odd = cell["Odd"]
    cell["RAN"].clear()
    found = guard.tampered(state)
    assert cell["RAN"] == []
    assert found == [f"`{LATE}.liar` (`Liar.__class__`)", f"`{LATE}.odd` (`Meta.__getattribute__`)"]


def test_a_late_module_as_the_library_wrote_it_is_recorded_and_costs_one_look(imported_late):
    state = guard.seal()
    module = imported_late()["late"]
    assert guard.tampered(state) == []
    assert state["modules"][LATE][0] is module and LATE in state["late_done"]
    classes = [name for name in state["classes"] if name.startswith(LATE + ".")]
    recorded = len(state["late"])
    assert guard.tampered(state) == [] and len(state["late"]) == recorded  # nothing new
    module.random_program.__code__ = module.random_graph.__code__  # a swap within the library
    assert guard.tampered(state) == [f"`{LATE}.random_program`"]
    assert classes == [n for n in state["classes"] if n.startswith(LATE + ".")]


def test_h5_a_function_a_probe_imports_late_cannot_be_replaced(sealed, capsys, imported_late):
    """7.2's probe imports ``random_graph`` as it runs (the seal has not seen its module): a
    notebook that imported it first and wrapped it fails every case; untouched, the answer
    keeps full marks."""
    answer = _solution_source("ch07_compiler_backend_runtime.ipynb", "cancel_transpose_pairs")
    sealed("7.2")
    cell = imported_late()
    namespace = {"cancel_transpose_pairs": answer["cancel_transpose_pairs"]}
    honest = _emit("7.2", namespace, capsys)
    assert honest.score == honest.max, honest.report()
    cell["late"].random_graph = cell["random_graph"]
    result = _emit("7.2", namespace, capsys)
    assert result.score == 0 and f"`{LATE}.random_graph`" in _feedback(result), result.report()


# A module the grader's seal does not import, imported and wrapped by a notebook cell: the
# probes of the demo do not use it, but ``tampered`` cannot know what a probe will import.
LATE_ATTACK = """
import mlsys_lab.engine.random_graphs as _late
_real = _late.random_graph
_late.random_graph = lambda *args, **kwargs: _real(*args, **kwargs)
"""


def test_a_module_imported_after_the_seal_and_changed_scores_zero_under_the_grader(tmp_path):
    nb = nbformat.read(DEMO_SOLUTION, as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell("import mlsys_lab.engine.random_graphs"))
    nbformat.write(nb, tmp_path / "ch00_late_honest.ipynb")
    honest = grade(tmp_path / "ch00_late_honest.ipynb", cell_timeout=30, timeout=120)
    assert honest.total == honest.max, honest.to_table()
    nb.cells[1].source = LATE_ATTACK
    nbformat.write(nb, tmp_path / "ch00_late.ipynb")
    report = grade(tmp_path / "ch00_late.ipynb", cell_timeout=30, timeout=120)
    assert report.total == 0, report.to_table()
    assert all("`mlsys_lab.engine.random_graphs.random_graph`" in row.feedback
               for row in report.rows), report.to_table()


@pytest.mark.parametrize("words", ["native", "python"])
def test_tampered_sees_every_kind_of_change_the_fast_comparison_must_not_miss(words,
                                                                               monkeypatch):
    """``tampered`` first compares what the seal recorded in bulk (``_frozen_same``: natively,
    each namespace's dict version and each function's fields read in one call; else in C maps)
    and walks the namespaces name by name only when that differs: each change below must still
    be reported, on both comparisons, and a name a module merely gained is not a change."""
    from mlsys_lab.distributed import sim
    from mlsys_lab.distributed.sim import engine

    state = guard.seal()
    if words == "python":
        state["frozen"]["gather"] = None
    else:
        assert state["frozen"]["gather"] is not None
    assert guard.tampered(state) == []
    with monkeypatch.context() as m:  # a new name in a sealed module, and in a sealed class
        m.setattr(sim, "_a_cache_the_kernel_added", {}, raising=False)
        m.setattr(engine.Engine, "_counter", 0, raising=False)
        assert guard.tampered(state) == [] and guard.tampered(state) == []
    # a class Python lets change is recorded; one it keeps from changing (setattr raises) is not
    assert "mlsys_lab.distributed.sim.engine.Engine" in state["classes"]
    assert "numpy.ndarray" not in state["classes"]
    with pytest.raises(TypeError):
        np.ndarray.sum = None
    with monkeypatch.context() as m:  # new defaults
        m.setattr(sim.run, "__defaults__", tuple(sim.run.__defaults__ or ()) + (None,))
        assert "`mlsys_lab.distributed.sim.run`" in guard.tampered(state)
    with monkeypatch.context() as m:  # a name deleted
        m.delattr(sim, "run")
        assert "`mlsys_lab.distributed.sim.run`" in guard.tampered(state)
    with monkeypatch.context() as m:  # the code swapped, the function object kept
        m.setattr(sim.run, "__code__", (lambda *a, **k: None).__code__)
        assert "`mlsys_lab.distributed.sim.run`" in guard.tampered(state)
    # Replacements that ``==`` would let the student's code judge: the comparison is by
    # identity, and none of their methods runs inside ``tampered``.
    calls = []

    class Liar:
        def __eq__(self, other):
            calls.append("eq")
            return True

        def __hash__(self):
            calls.append("hash")
            return 0

    with monkeypatch.context() as m:  # defaults that claim to equal the old ones
        m.setattr(sim.run, "__defaults__", tuple(Liar() for _ in sim.run.__defaults__ or (0,)))
        assert "`mlsys_lab.distributed.sim.run`" in guard.tampered(state)
    code = sim.run.__code__
    forged = code.replace(co_consts=code.co_consts[:-1] + (frozenset({Liar()}),))
    calls.clear()  # making the frozenset hashed its member
    with monkeypatch.context() as m:  # the same bytecode, a constant made a frozenset of liars
        m.setattr(sim.run, "__code__", forged)
        assert "`mlsys_lab.distributed.sim.run`" in guard.tampered(state)
    assert calls == []
    with monkeypatch.context() as m:  # a module replaced in sys.modules
        m.setitem(sys.modules, "mlsys_lab.distributed.sim", types.ModuleType("forged"))
        assert "`sys.modules['mlsys_lab.distributed.sim']`" in guard.tampered(state)
    with monkeypatch.context() as m:  # a method added that shadows a base class's
        m.setattr(engine.Engine, "__repr__", lambda self: "forged", raising=False)
        assert "`mlsys_lab.distributed.sim.engine.Engine.__repr__`" in guard.tampered(state)
    assert guard.tampered(state) == []


# H10: threads started before a check cannot be watched on Python < 3.12.

def test_h10_a_thread_pool_started_before_the_check_fails_it():
    guard._local_seal()  # the kernel's threads are known before the notebook starts any
    pool = ThreadPoolExecutor(1)
    pool.submit(lambda: None).result()  # its worker is running, idle

    def topological_sort(nodes, edges):
        return pool.submit(schedule.kahn, nodes, edges).result()

    try:
        result = run_cases("97.1", topological_sort, seed=1)
    finally:
        pool.shutdown()
    if sys.version_info < (3, 12):
        assert result.score == 0 and "still running" in _feedback(result), result.report()
    else:  # the hook reaches running threads too
        assert result.score == 0 and "off limits" in _feedback(result), result.report()
    assert run_cases("97.1", honest_kahn, seed=1).score == 1  # once it is shut down


def test_h10_a_raw_thread_started_during_the_check_is_refused():
    def topological_sort(nodes, edges):
        out, done = [], threading.Event()

        def work():
            try:
                out.append(schedule.kahn(nodes, edges))
            finally:
                done.set()
        _thread.start_new_thread(work, ())
        done.wait(5)
        return out[0] if out else None

    result = run_cases("97.1", topological_sort, seed=1)
    assert result.score == 0 and "`_thread`" in _feedback(result), result.report()


# The same holes through the real grader, in a kernel (the demo notebook: quick).

CLONE_ANSWERS = {  # H1: the library's and the grader's functions, claiming a stdlib file
    "0.2": ("import json, types\nfrom mlsys_lab.grading.exercises.ch00_demo.ex0_2_fib import _fib\n"
            "def _recode(c):\n"
            "    k = tuple(_recode(x) if isinstance(x, types.CodeType) else x\n"
            "              for x in c.co_consts)\n"
            "    return c.replace(co_filename=json.__file__, co_consts=k, co_name='fib',\n"
            "                     co_qualname='fib')\n"
            "fib = types.FunctionType(_recode(_fib.__code__), _fib.__globals__, 'fib')\n"),
    # H10: the work goes to a pool whose worker was started before the check
    "0.3": ("import statistics\nfrom concurrent.futures import ThreadPoolExecutor\n"
            "pool = ThreadPoolExecutor(1)\npool.submit(int).result()\n"
            "def mean(xs):\n    return pool.submit(statistics.mean, xs).result()\n"),
}

# H4: the answers stay stubs; json.dumps re-runs every probe with the library and swaps the
# cases into the payload the hidden cell sends.
JSON_FORGER = """
import json, statistics
from mlsys_lab.grading.core import probe as _probe, exercise as _exercise
from mlsys_lab.grading.exercises.ch00_demo.ex0_2_fib import _fib
_real_dumps = json.dumps
_cheats = {"0.1": [lambda x: x * x], "0.2": [_fib], "0.3": [statistics.mean]}
def _forge(obj, *args, **kwargs):
    if isinstance(obj, dict) and "marker" in obj and obj.get("exercise") in _cheats:
        exercise = _exercise.get_exercise(obj["exercise"])
        empty = {"task": "", "code": [], "builtins": []}
        fresh = _probe.run_exercise(exercise, _cheats[obj["exercise"]], obj["seed"], empty)
        obj = {**obj, "cases": fresh["cases"]}
    return _real_dumps(obj, *args, **kwargs)
json.dumps = _forge
"""


def test_clones_and_early_threads_score_zero_under_the_grader(tmp_path):
    report = grade(_notebook(CLONE_ANSWERS, tmp_path / "ch00_clones.ipynb"), cell_timeout=30,
                   timeout=120)
    points = _points(report)
    assert points["0.2"] == 0 and points["0.3"] == 0, report.to_table()
    assert "is a copy of its code" in report.rows[1].feedback, report.to_table()
    if sys.version_info < (3, 12):  # a thread running before the check cannot be watched
        assert "still running" in report.rows[2].feedback, report.to_table()
    else:  # it is watched: the work handed to it is refused as it is sent
        assert "`concurrent.futures` is not among them" in report.rows[2].feedback, \
            report.to_table()


def test_a_forged_json_dumps_scores_zero_under_the_grader(tmp_path):
    report = grade(_notebook({}, tmp_path / "ch00_json.ipynb", extra=JSON_FORGER),
                   cell_timeout=30, timeout=120)
    assert (report.total, report.max) == (0, 12), report.to_table()
    assert all("changed `json.dumps`" in row.feedback for row in report.rows), report.to_table()


# The hidden cell reads its bundle and guard plan with ``builtins.eval`` from one string
# literal: an eval that empties the plan (no forbidden code) before the probes see it, with the
# shortcuts of ``test_shortcuts_score_zero_under_the_grader`` as the answers.
PLAN_EMPTIER = """
import builtins
_real_eval = builtins.eval
def _eval(source, *args, **kwargs):
    out = _real_eval(source, *args, **kwargs)
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict) and "code" in out[1]:
        out[1]["code"], out[1]["builtins"], out[1]["allowed"] = [], [], None
    return out
builtins.eval = _eval
"""


def test_an_eval_that_empties_the_guard_plan_scores_zero_under_the_grader(tmp_path):
    answers = {
        "0.2": "from mlsys_lab.grading.exercises.ch00_demo.ex0_2_fib import _fib as fib\n",
        "0.3": "import statistics\n\ndef mean(xs):\n    return statistics.mean(xs)\n",
    }
    report = grade(_notebook(answers, tmp_path / "ch00_eval.ipynb", extra=PLAN_EMPTIER),
                   cell_timeout=30, timeout=120)
    assert _points(report) == {"0.1": 0, "0.2": 0, "0.3": 0}, report.to_table()
    assert all("changed `builtins.eval`" in row.feedback for row in report.rows[1:]), \
        report.to_table()


class _Publisher:
    def publish(self, data):
        return data


def test_h4_a_patched_display_publisher_is_seen(monkeypatch):
    """The objects the payload passes through (the kernel's shell, display publisher, session
    and socket) are sealed too: a method shadowed on the instance, or the object swapped for
    another class, is a change."""
    publisher = _Publisher()
    monkeypatch.setattr(guard, "_channel_objects", lambda: [("its display publisher", publisher)])
    state = guard.seal()
    assert guard.tampered(state) == []
    publisher.publish = lambda data: None
    assert guard.tampered(state) == ["its display publisher's `publish`"]
    del publisher.publish
    publisher.__class__ = type("Forger", (_Publisher,), {})
    assert guard.tampered(state) == ["its display publisher"]


def test_the_notebooks_own_namespace_is_never_trusted(monkeypatch):
    """``check()`` in a notebook seals when first called, after the student's cells ran: what
    those cells defined (``__main__``) must still count as the student's code."""
    pasted = _paste_padded(schedule.kahn)
    monkeypatch.setattr(sys.modules["__main__"], "pasted_kahn", pasted, raising=False)
    monkeypatch.setattr(sys.modules[__name__], "pasted_kahn", pasted, raising=False)
    baseline = guard._baseline()
    assert id(pasted.__code__) in baseline  # this test module is a library module here
    monkeypatch.delattr(sys.modules[__name__], "pasted_kahn")
    assert id(pasted.__code__) not in guard._baseline()


CH11_EXERCISE = ROOT / "exercises" / "ch11_distributed_training.ipynb"

# H5 as the tester ran it: the simulator the 11.1 probe uses is the kernel's own module; a fake
# sim.run sums with numpy and fabricates the ring's trace (here a pass-through to the real one:
# whatever the fake does, replacing it is what fails the check).
SIM_ATTACK = """
from mlsys_lab.distributed import sim as _sim
_real_run = _sim.run
def _fake_run(*args, **kwargs):
    return _real_run(*args, **kwargs)
_sim.run = _fake_run
"""


def test_h5_a_replaced_simulator_scores_zero_under_the_grader(tmp_path):
    ring = _solution_source("ch11_distributed_training.ipynb", "ring_allreduce")
    nb = nbformat.read(ROOT / "solutions" / "ch11_distributed_training.ipynb", as_version=4)
    answer = next(c.source for c in nb.cells if "answer:11.1" in c.metadata.get("tags", []))
    assert "ring_allreduce" in ring
    path = _notebook({"11.1": answer}, tmp_path / "ch11_sim.ipynb", base=CH11_EXERCISE,
                     extra=SIM_ATTACK)
    report = grade(path, cell_timeout=120, timeout=600)
    row = next(r for r in report.rows if r.exercise == "11.1")
    assert row.points == 0, report.to_table()
    assert "`mlsys_lab.distributed.sim.run`" in row.feedback, report.to_table()


class _Worker:
    """A thread that runs the calls sent to it; the tests' answers start it inside a check."""

    def __init__(self):
        self.jobs: queue.Queue = queue.Queue()
        self.thread = None

    def start(self):
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while True:
            fn, args, box = self.jobs.get()
            if fn is None:
                return
            try:
                box.put(("ok", fn(*args)))
            except Exception as error:  # the refusal, raised in the worker
                box.put(("error", error))

    def ask(self, fn, *args):
        """``fn(*args)`` run by the worker; None if it raised."""
        box: queue.Queue = queue.Queue()
        self.jobs.put((fn, args, box))
        kind, value = box.get(timeout=10)
        return value if kind == "ok" else None

    def stop(self):
        self.jobs.put((None, (), None))
        self.thread.join(5)


def test_h10_a_thread_started_during_an_earlier_probe_stays_watched():
    """A worker started inside one check that outlives it keeps a guard's hook: in the next
    check it answers to the guard that is on then (and is not mistaken for a notebook's)."""
    worker = _Worker()

    def topological_sort(nodes, edges):
        if worker.thread is None:
            worker.start()
        return worker.ask(schedule.kahn, nodes, edges)

    try:
        first = run_cases("97.1", topological_sort, seed=1)
        second = run_cases("97.1", topological_sort, seed=2)
    finally:
        worker.stop()
    assert first.score == 0 and "off limits" in _feedback(first), first.report()
    # Python removes a profile hook that raised (the refusal): the worker is unwatched now,
    # so it counts as a running thread the check cannot trust.
    assert second.score == 0, second.report()
    assert "still running" in _feedback(second) or "off limits" in _feedback(second)


def test_h10_a_worker_started_during_a_probe_answers_to_the_next_guard():
    """A worker started inside one check that outlives it, and did nothing forbidden there,
    is watched in the next check by the guard that is on then."""
    worker = _Worker()

    def topological_sort(nodes, edges):
        if worker.thread is None:  # first check: start the worker, answer honestly
            worker.start()
            return honest_kahn(nodes, edges)
        return worker.ask(schedule.kahn, nodes, edges)

    try:
        first = run_cases("97.1", topological_sort, seed=1)
        second = run_cases("97.1", topological_sort, seed=2)
    finally:
        worker.stop()
    assert first.score == 1, first.report()
    assert second.score == 0 and "off limits" in _feedback(second), second.report()
