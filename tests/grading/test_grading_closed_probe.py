"""The closed probe: while a probe runs, the student's code may call only its own code, the
standard library's plain data modules, numpy, mlsys_lab and what the exercise allows.

The answers here are compiled from source under a notebook cell's file name after the seal
(the way a kernel runs a student's cells), so the guard counts them as the student's code. The
third-party packages are fakes written to a temporary folder on ``sys.path`` (torch, sklearn
and friends need not be installed); scipy is used too when it is installed.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from mlsys_lab.grading.core import exercise as registry
from mlsys_lab.grading.core import guard
from mlsys_lab.grading.core.check import run_cases
from mlsys_lab.grading.core.exercise import (
    CLOSED_BASE,
    DEFAULT_ALLOWED,
    Case,
    Exercise,
    get_exercise,
    register,
)

DEMO_SOLUTION = Path(__file__).resolve().parents[2] / "solutions" / "ch00_demo.ipynb"


def _mean_judge(raw, seed):
    xs = _numbers(seed)
    assert isinstance(raw, float) and abs(raw - sum(xs) / len(xs)) < 1e-9, f"got {raw}"


def _numbers(seed):
    return [float(v) for v in np.random.default_rng(seed).integers(1, 50, 12)]


def _case():
    return (Case("mean", 1, probe=lambda f, seed: f(_numbers(seed)), judge=_mean_judge),)


CLOSED = Exercise(id="96.1", title="A mean", target="mean", cases=_case(), task="the mean")
WIDER = Exercise(id="96.2", title="A mean", target="mean", cases=_case(), task="the mean",
                 allowed=DEFAULT_ALLOWED + ("fakesolver",))
OPEN = Exercise(id="96.3", title="A mean", target="mean", cases=_case(), task="the mean",
                allowed=None)
NO_THREADS = Exercise(id="96.4", title="A mean", target="mean", cases=_case(), task="the mean",
                      allowed=tuple(a for a in DEFAULT_ALLOWED if a not in ("threading",)))
ALL = (CLOSED, WIDER, OPEN, NO_THREADS)

FAKES = {
    "fakesolver/__init__.py": '''
        def solve(xs):
            """What a solver package would do for the student."""
            return _total(xs) / len(xs)


        def _total(xs):
            return sum(xs)


        def key(x):
            return x
    ''',
    # a permitted package that uses a package the exercise does not allow, inside itself
    "fakewrapper/__init__.py": '''
        import fakesolver


        def average(xs):
            return fakesolver.solve(xs)
    ''',
}


@pytest.fixture(autouse=True)
def fake_packages(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.getbasetemp() / "closed_probe_packages"
    for name, source in FAKES.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(guard, "_library_roots", lambda real=guard._library_roots: (
        *real(), str(root) + "/"))  # stands for site-packages
    register(*ALL)
    yield
    for exercise in ALL:
        registry.EXERCISES.pop(exercise.id, None)
    for name in ("fakesolver", "fakewrapper"):
        sys.modules.pop(name, None)


def _cell(source: str, name: str = "mean"):
    """``name`` defined by a notebook cell run after the seal: the student's code."""
    guard._local_seal()
    scope = {"__name__": "__main__"}
    source = textwrap.dedent(source)
    filename = f"/tmp/ipykernel_4242/{abs(hash(source))}.py"  # as a kernel names a cell
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), scope)
    return scope[name]


def _feedback(result) -> str:
    return " | ".join(row.feedback for row in result.rows)


def _refused(result, *words):
    text = _feedback(result)
    assert result.score == 0, result.report()
    assert "off limits" in text and "the mean yourself" in text, text
    for word in words:
        assert word in text, text


HONEST = """
import bisect, collections, functools, heapq, itertools, math, operator, random, re, statistics
import threading, queue, time
import numpy as np
import mlsys_lab as ml

def mean(xs):
    counts = collections.Counter(xs)
    heap = list(xs)
    heapq.heapify(heap)
    total = functools.reduce(operator.add, itertools.chain(heap), 0.0)
    assert math.isclose(total, float(np.sum(np.asarray(xs))))
    assert re.match(r"\\d", str(len(counts))) and bisect.bisect(sorted(xs), 0) == 0
    random.Random(0).shuffle(heap)
    box = queue.Queue()
    worker = threading.Thread(target=lambda: box.put(sum(xs)))
    worker.start()
    worker.join()
    start = time.perf_counter()
    assert time.perf_counter() >= start and ml.ops is not None
    print("mean of", len(xs), "numbers")
    return box.get() / len(xs)
"""


def test_an_answer_using_the_base_numpy_threads_and_print_keeps_full_marks(hook_kind):
    result = run_cases("96.1", _cell(HONEST), seed=1)
    assert result.score == result.max, result.report()


def test_a_package_outside_the_allowlist_refuses_with_the_task_and_the_function():
    mean = _cell("""
        import fakesolver

        def mean(xs):
            return fakesolver.solve(xs)
    """)
    result = run_cases("96.1", mean, seed=1)
    _refused(result, "`fakesolver.solve`", "the package `fakesolver` is not among them")
    # the same answer where the exercise allows the package
    assert run_cases("96.2", mean, seed=1).score == 1
    assert run_cases("96.3", mean, seed=1).score == 1  # an open probe


def test_importing_is_not_running():
    mean = _cell("""
        def mean(xs):
            import fakesolver  # imported inside the probe, never called
            return sum(xs) / len(xs)
    """)
    assert run_cases("96.1", mean, seed=1).score == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("route", ["saved", "partial", "map", "heapq", "thread", "c_function"])
def test_every_route_from_the_students_code_is_refused(route, hook_kind):
    source = {
        "saved": "solve = fakesolver.solve\ndef mean(xs):\n    return solve(xs)\n",
        "partial": ("import functools\ndef mean(xs):\n"
                    "    return functools.partial(fakesolver.solve, xs)()\n"),
        "map": "def mean(xs):\n    return list(map(fakesolver.solve, [xs]))[0]\n",
        # a callback run by a standard-library function written in Python
        "heapq": ("import heapq\ndef mean(xs):\n"
                  "    return sum(heapq.merge(xs, [], key=fakesolver.key)) / len(xs)\n"),
        # a thread the student's code starts, whose target is the package's function
        "thread": ("import threading\ndef mean(xs):\n"
                   "    t = threading.Thread(target=fakesolver.solve, args=(xs,))\n"
                   "    t.start()\n    t.join()\n    return sum(xs) / len(xs)\n"),
        # a C function of a standard-library module that is not in the base
        "c_function": "import os\ndef mean(xs):\n    os.getpid()\n    return sum(xs) / len(xs)\n",
    }[route]
    mean = _cell("import fakesolver\n" + source)
    result = run_cases("96.1", mean, seed=1)
    _refused(result, "posix" if route == "c_function" else "fakesolver")


def test_a_second_check_refuses_what_the_first_refused(hook_kind):
    """The second check of the same answer keeps the first's verdicts (``guard._memo``): the
    student's code is not classified again, so the native hook must still list it as the
    student's (its C calls go to the allowlist). A memo that kept the verdicts without the
    native tables let ``os.getpid`` through the second time."""
    mean = _cell("import os\ndef mean(xs):\n    os.getpid()\n    return sum(xs) / len(xs)\n")
    for _ in range(3):
        _refused(run_cases("96.1", mean, seed=1), "posix")


def test_a_method_of_the_same_name_on_another_class_gets_its_own_verdict(hook_kind):
    """The guard keeps its verdict on a C method per (owner's class, name): a permitted
    ``BytesIO.close`` called first must not let ``epoll.close`` (select: not in the base)
    through under the same name."""
    mean = _cell("""
import io, select
def mean(xs):
    for _ in range(3):
        io.BytesIO().close()
    select.epoll().close()
    return sum(xs) / len(xs)
""")
    _refused(run_cases("96.1", mean, seed=1), "select")


def test_verdicts_kept_per_kernel_forget_the_collectors_exemption_and_a_trusted_probe():
    """Where a code object comes from and what the allowlist says of it are kept per kernel
    for every guard with that allowlist, but not what changes: a function of a package outside
    it that was a ``gc.callbacks`` entry when first seen is refused once it is not; the
    student's code that a later guard trusts (a probe) is not the student's for that guard."""
    import gc

    import fakesolver

    state = guard.seal()
    plan = guard.plan_for(CLOSED)
    code = fakesolver.solve.__code__
    gc.callbacks.append(fakesolver.solve)
    try:
        assert guard.Guard(plan, state)._classify(code)[3] is None  # the collector called it
    finally:
        gc.callbacks.remove(fakesolver.solve)
    foreign = guard.Guard(plan, state)._classify(code)[3]
    assert foreign is not None and "fakesolver.solve" in foreign[0]
    helper = _cell("def helper(x):\n    return x\n", "helper")
    assert guard.Guard(plan, state)._classify(helper.__code__)[4] is True
    assert guard.Guard(plan, state, trusted=[helper])._classify(helper.__code__)[4] is False


def test_a_collector_callback_of_another_package_is_not_the_students_call():
    """The collector runs ``gc.callbacks`` from whatever frame allocated when a collection
    began; with the student's code allocating, that frame is the student's, but the student
    called nothing. hypothesis registers such a callback (its gc timer) in the suite's workers:
    a later check in the same process refused it (6.3, 6.4 and 8.1 lost points)."""
    import gc

    from hypothesis.internal.conjecture.junkdrawer import gc_cumulative_time

    gc_cumulative_time()  # registers hypothesis's callback, once per process
    # Garbage other tests of this worker left (hypothesis's suspended generators, e.g.
    # datatree.all_children) is finalised first: a generator closed by the collection the
    # student's allocations start resumes its frame there, which is a different route (a
    # foreign generator resumed from the student's frame, refused as such) from the callback
    # this test is about.
    gc.collect()
    mean = _cell("""
        def mean(xs):
            rows = [{"x": x, "pair": (x, [x])} for x in xs for _ in range(2_000)]
            return sum(r["x"] for r in rows) / len(rows)
    """)
    result = run_cases("96.1", mean, seed=1)
    assert result.score == result.max, result.report()


def test_a_permitted_package_may_use_other_packages_inside_itself():
    exercise = Exercise(id="96.5", title="A mean", target="mean", cases=_case(),
                        task="the mean", allowed=DEFAULT_ALLOWED + ("fakewrapper",))
    register(exercise)
    try:
        mean = _cell("import fakewrapper\ndef mean(xs):\n    return fakewrapper.average(xs)\n")
        assert run_cases("96.5", mean, seed=1).score == 1
        direct = _cell("import fakesolver\ndef mean(xs):\n    return fakesolver.solve(xs)\n")
        _refused(run_cases("96.5", direct, seed=1), "fakesolver")
    finally:
        registry.EXERCISES.pop("96.5", None)


def test_threads_are_refused_where_the_exercise_leaves_them_out():
    mean = _cell("""
        import threading

        def mean(xs):
            out = []
            worker = threading.Thread(target=lambda: out.append(sum(xs)))
            worker.start()
            worker.join()
            return out[0] / len(xs)
    """)
    assert run_cases("96.1", mean, seed=1).score == 1
    _refused(run_cases("96.4", mean, seed=1), "`threading.Thread.__init__`",
             "the standard library's `threading`")


POOL = """
from concurrent.futures import ThreadPoolExecutor

def mean(xs):
    with ThreadPoolExecutor(2) as pool:
        return sum(pool.map(float, xs)) / len(xs)
"""


def test_concurrent_futures_is_not_in_the_base():
    assert not any(entry.startswith("concurrent") for entry in CLOSED_BASE)
    _refused(run_cases("96.1", _cell(POOL), seed=1), "`concurrent.futures`")


def test_chapter_exercises_declare_an_allowlist_that_refuses_their_shortcuts():
    """9.1 is the concurrency: ``concurrent.futures`` refuses there, threads and queues run;
    13.3 teaches the greedy rule: solver packages refuse there."""
    for ex_id, module, allowed in (("9.1", "concurrent.futures.thread", False),
                                   ("9.1", "threading", True), ("9.1", "queue", True),
                                   ("13.3", "scipy.optimize._milp", False),
                                   ("13.3", "sklearn.cluster", False),
                                   ("13.3", "torch.nn", False), ("13.3", "heapq", True),
                                   ("4.1", "networkx.algorithms.dag", False),
                                   ("4.1", "collections", True)):
        plan = guard.plan_for(get_exercise(ex_id))
        assert plan["allowed"] is not None, ex_id
        table = guard._allowlist(plan["allowed"])
        assert guard._permits(table, module) is allowed, (ex_id, module)


def test_numba_is_allowed_where_the_student_writes_kernels():
    for ex_id in ("8.1", "8.2"):
        table = guard._allowlist(guard.plan_for(get_exercise(ex_id))["allowed"])
        assert guard._permits(table, "numba.core.dispatcher"), ex_id
    table = guard._allowlist(guard.plan_for(get_exercise("8.3"))["allowed"])
    assert not guard._permits(table, "numba.core.dispatcher")


CHECKPOINT = """
import os
import mlsys_lab as ml


def save_checkpoint(path, model, optimizer):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = path + ".partial"  # written whole, then moved into place
    ml.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, partial)
    os.replace(partial, path)


def load_checkpoint(path, model, optimizer):
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    ckpt = ml.load(path)
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
"""


def test_a_checkpoint_may_use_files_and_folders():
    """2.3 allows ``os`` (making the folder, an atomic move): an honest answer keeps full
    marks; where the default allowlist applies, ``os`` refuses."""
    save = _cell(CHECKPOINT, "save_checkpoint")
    load = _cell(CHECKPOINT, "load_checkpoint")
    result = run_cases("2.3", save, load, seed=1)
    assert result.score == result.max, result.report()
    table = guard._allowlist(DEFAULT_ALLOWED)
    assert not guard._permits(table, "os") and not guard._permits(table, "posixpath")


def test_allowlist_entries_match_whole_module_names_and_exclusions_win():
    table = guard._allowlist(DEFAULT_ALLOWED)
    assert guard._permits(table, "numpy.linalg")
    assert not guard._permits(table, "numpy.f2py.crackfortran")
    assert not guard._permits(table, "numpy_financial")  # not a submodule of numpy
    assert guard._permits(table, "mlsys_lab.engine.graph")
    assert not guard._permits(table, "os")


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="scipy is not installed")
def test_scipy_solvers_are_refused():
    mean = _cell("""
        import numpy as np
        from scipy.optimize import linprog

        def mean(xs):
            # the mean as the solution of a tiny linear program: minimise t with t >= mean
            res = linprog([1.0], A_ub=[[-1.0]], b_ub=[-float(np.mean(xs))], bounds=[(None, None)])
            return float(res.x[0])
    """)
    _refused(run_cases("96.1", mean, seed=1), "scipy")
    assert run_cases("96.3", mean, seed=1).score == 1  # it works: the closed probe refused it


def test_a_copy_of_a_library_file_the_notebook_wrote_is_not_the_library(tmp_path, monkeypatch):
    """A module the notebook writes to its own folder under a standard-library name shadows it:
    its code is the student's, not the library's, so its calls are checked."""
    (tmp_path / "statistics.py").write_text("import fakesolver\n\n\ndef fmean(xs):\n"
                                            "    return fakesolver.solve(xs)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = sys.modules.pop("statistics", None)  # not imported yet in some workers
    try:
        import statistics as shadow
        assert shadow.__file__.startswith(str(tmp_path))
        mean = _cell("import statistics\ndef mean(xs):\n    return statistics.fmean(xs)\n")
        _refused(run_cases("96.1", mean, seed=1), "fakesolver")
    finally:
        sys.modules.pop("statistics", None)
        if real is not None:
            sys.modules["statistics"] = real


# The same through the real grader, in a kernel (the demo notebook: quick).

POOL_MEAN = """
from concurrent.futures import ThreadPoolExecutor
import threading


def mean(xs):
    if len(xs) == 0:
        raise ValueError("mean() of an empty list")
    worker = threading.Thread(target=len, args=(xs,))  # threads themselves are allowed
    worker.start()
    worker.join()
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(sum, xs).result() / len(xs)
"""


@pytest.mark.slow  # starts a kernel
def test_a_package_outside_the_allowlist_scores_zero_under_the_grader(tmp_path):
    import nbformat

    from mlsys_lab.grading.core.grader import grade

    nb = nbformat.read(DEMO_SOLUTION, as_version=4)
    [cell] = [c for c in nb.cells if "answer:0.3" in c.metadata.get("tags", [])]
    cell.source = POOL_MEAN
    path = tmp_path / "ch00_pool.ipynb"
    nbformat.write(nb, path)
    report = grade(path, cell_timeout=30, timeout=120)
    points = {row.exercise: row.points for row in report.rows}
    assert points == {"0.1": 3, "0.2": 5, "0.3": 1}, report.to_table()  # only mean([]) passes
    row = next(r for r in report.rows if r.exercise == "0.3")
    assert "`concurrent.futures`" in row.feedback and "off limits" in row.feedback, row.feedback


def test_library_code_is_recognised_whatever_the_hash_seed():
    """A module's ``__pycache__`` is written by another process than the kernel: the comparison
    with its file must not depend on the string hash seed (a frozenset constant, ``x in {...}``,
    iterates in a seed-dependent order)."""
    import subprocess

    probe = ("import sys; sys.path.insert(0, %r)\n"
             "from mlsys_lab.grading.core import guard\n"
             "c = compile('def f(x):\\n    return x in {\"alpha\", \"beta\", \"gamma\", \"delta\", "
             "\"eps\"}\\n', 'm.py', 'exec')\n"
             "print(repr(guard._exact(c)))\n") % str(Path(__file__).resolve().parents[2])
    seen = {subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout
            for seed in ("1", "2")}
    assert len(seen) == 1, seen
