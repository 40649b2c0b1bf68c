"""Probe overhead: each solution notebook's checks with the guard on (probed) and off (plain).

    python benchmarks/probe_overhead.py [--notebooks ch04 ch07 ch11 ch13] [--rounds 3] [--grade]

For each chapter, a fresh interpreter runs the solutions notebook's code cells (not its check
cells; cells compiled under an ipykernel-like file name, after the seal, so the answers count as
the student's code), then times the exercises' probes, seeds fixed:

* **plain**: per exercise, ``probe.run_exercise`` with the guard replaced by a no-op (every
  probe called on the answers, its result encoded for the wire) and the judges;
* **probed**: what the grader runs: ``guard.seal`` with the grader's references (its first
  cell, before any student cell; timed on its own and counted once per notebook) and, per
  exercise, the plan decoded from its JSON with the seal's decoder, ``probe.run_exercise`` with
  it and the seal (the guard on around each probe, ``tampered`` before and after) and the
  judges. Every exercise must score full marks. The plans and references are computed in
  another process, as the grader computes them.

Rounds alternate plain and probed, each after a full collection (one landing inside a run by
chance added 0.15 s to it); the best of each is kept. Prints per notebook: plain, seal,
probed (probes only) and the ratio (probed + seal) / plain, the figure the target (<= 1.5x)
applies to; the seal is also the part every kernel pays once per notebook. ``first`` is the same
ratio with the first probed round: what one ``mlsys-lab grade`` pays, with the kernel's caches
(each forbidden function's n-grams, each code object's origin) still empty; ``first w/o`` is
that round's probes alone against plain (a grade checks each exercise once, in a fresh
kernel: its checks are this round).

Floors, each the plain run with a stand-in for the guard, as ratios to plain: ``no-op hook``,
a ``sys.setprofile`` hook that does nothing (what any guard built on a Python profile hook pays,
on every Python); ``C no-op``, a native profile function that returns at once (what even a
guard whose hook were written in C would pay); and on Python 3.12+ ``monitoring``,
``sys.monitoring`` events switched off per code location after their first (what a guard
deciding once per location would pay).

``--grade`` also times ``mlsys-lab grade`` of the solutions notebook (a fresh kernel, the
notebook run, every check; best of ``--rounds``) and prints the guard's whole cost, first
round's probed + seal - plain, as a share of it: what a student waiting for a grade pays for
the guard (the seal counted, though it is hidden where ``plans wait`` exceeds it). And
``plans wait``: in a grade run here (as the command runs it), how long the grader still waited
for the plans (made by another process while the kernel starts) once the kernel had run the
seal cell; the least of ``--rounds``. Where it exceeds ``seal s``, the seal costs the grade
nothing: without it the grade would have waited for the plans as long.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import linecache
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _child(notebook: str, rounds: int) -> dict:
    """Run in a fresh interpreter: time one notebook's checks plain and probed."""
    t0 = time.perf_counter()
    import nbformat

    from mlsys_lab.grading.core import guard, probe
    from mlsys_lab.grading.core.exercise import _lookup, get_exercise
    from mlsys_lab.grading.core.judge import judge_exercise

    [path] = sorted((ROOT / "solutions").glob(f"{notebook}_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    ids = []
    for cell in nb.cells:
        for tag in cell.metadata.get("tags", []):
            if tag.startswith("answer:") and tag[7:] not in ids:
                ids.append(tag[7:])
    ids = [i for i in ids if _exists(get_exercise, i)]
    # The grader's first cell: the seal, before any student cell.
    seal_seconds = []
    import IPython.display  # noqa: F401 - a kernel has it loaded before the seal

    # The grader computes the plans in its own process and sends them as JSON: the kernel
    # neither imports the forbidden functions' modules (which it would then seal late) nor has
    # their code, fingerprints and n-grams cached. The part every plan shares (the grader's
    # references) goes to the seal, once per kernel.
    sent = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys\n"
         "from mlsys_lab.grading.core.exercise import get_exercise\n"
         "from mlsys_lab.grading.core.guard import plan_text, reference_plan\n"
         "print(json.dumps({'plans': {i: plan_text(get_exercise(i)) for i in sys.argv[1:]},"
         " 'references': reference_plan()['text']}))", *ids],
        capture_output=True, text=True, check=True).stdout)
    gc.collect()
    start = time.perf_counter()
    state = guard.seal("probe-overhead", ids, sent["references"])  # as the grader does: keyed
    seal_seconds.append(time.perf_counter() - start)
    scope = {"__name__": "__main__"}
    os.chdir(path.parent)
    for k, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or "check(" in cell.source:
            continue
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("%", "!")))
        filename = f"/tmp/ipykernel_bench/{k}.py"  # as a kernel names cells: source in linecache
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        exec(compile(source, filename, "exec"), scope)
    exercises = [get_exercise(i) for i in ids]
    answers = {e.id: [_lookup(scope, t) for t in e.targets] for e in exercises}
    texts = sent["plans"]
    plans = {i: json.loads(text) for i, text in texts.items()}
    seed = 1234

    def plain(stand_in=_Unwatched) -> float:
        gc.collect()  # a full collection (0.1-0.2 s here) lands in no timed run by chance
        start = time.perf_counter()
        real = probe.Guard
        probe.Guard = stand_in
        try:
            for e in exercises:
                result = judge_exercise(
                    e, probe.run_exercise(e, answers[e.id], seed, plans[e.id]), seed)
                if result.score != result.max:
                    raise SystemExit(f"{notebook} {e.id} {stand_in.__name__}: "
                                     f"{result.report()}")
        finally:
            probe.Guard = real
        return time.perf_counter() - start

    def probed() -> float:
        gc.collect()
        start = time.perf_counter()
        for e in exercises:
            plan = guard.decoded_plan(state, texts[e.id])  # as ``probe.emit`` does
            result = judge_exercise(
                e, probe.run_exercise(e, answers[e.id], seed, plan, state), seed)
            if result.score != result.max:
                raise SystemExit(f"{notebook} {e.id} probed: {result.report()}")
        return time.perf_counter() - start

    floors = [("no-op hook", _NoOpHook), ("C no-op", _CNoOpHook)] + (
        [("monitoring", _Monitoring)]
        if hasattr(sys, "monitoring") else [])
    _CNoOpHook._install()  # Numba compiles the native hook here, not in the first round
    times: dict[str, list[float]] = {"plain": [], "probed": []}
    for _ in range(rounds):
        times["plain"].append(plain())
        times["probed"].append(probed())
        for name, stand_in in floors:
            times.setdefault(name, []).append(plain(stand_in))
    return {"notebook": notebook, "exercises": ids, "first_probed": times["probed"][0],
            "seal": seal_seconds[0], "setup": time.perf_counter() - t0,
            **{name: min(seconds) for name, seconds in times.items()}}


class _Unwatched:
    """Stands in for the guard in the plain run: the probes run unwatched."""

    def __init__(self, *args, **kwargs):
        self.violations = []

    def watching(self):
        return contextlib.nullcontext(self)


class _NoOpHook(_Unwatched):
    """The floor of any guard on ``sys.setprofile``: a profile hook that only looks at the
    event (as the guard's does first) and does nothing."""

    @contextlib.contextmanager
    def watching(self):
        def hook(frame, event, arg):
            if event == "call":
                return None
            if event == "c_call":
                return None
            return None

        sys.setprofile(hook)
        try:
            yield self
        finally:
            sys.setprofile(None)


class _CNoOpHook(_Unwatched):
    """The floor of any guard on a profile hook, even one written in C: a native function
    (compiled by Numba, installed with ``PyEval_SetProfile``) that returns at once. No
    trampoline, no Python frame per event; what remains is the interpreter's own slower path
    while any profile function is set (on 3.11 it stops using its specialised instructions)."""

    _address = None

    @classmethod
    def _install(cls):
        import ctypes

        from numba import cfunc, types

        if cls._address is None:
            sig = types.int32(types.voidptr, types.voidptr, types.int32, types.voidptr)
            cls._noop = cfunc(sig)(lambda obj, frame, what, arg: 0)
            cls._address = cls._noop.address
            ctypes.pythonapi.PyEval_SetProfile.argtypes = [ctypes.c_void_p, ctypes.py_object]
            ctypes.pythonapi.PyEval_SetProfile.restype = None
        return ctypes.pythonapi.PyEval_SetProfile

    @contextlib.contextmanager
    def watching(self):
        self._install()(self._address, self)
        try:
            yield self
        finally:
            sys.setprofile(None)


class _Monitoring(_Unwatched):
    """Python 3.12+: the floor of a guard on ``sys.monitoring`` that decides once per code
    location: PY_START and CALL events, each location switched off (``DISABLE``) after its
    first event, every location on again for the next probe (``restart_events``)."""

    @contextlib.contextmanager
    def watching(self):
        mon, tool = sys.monitoring, 4  # a free tool id (0-5; 0, 1, 2 and 5 are named)
        mon.use_tool_id(tool, "probe-overhead floor")
        mon.register_callback(tool, mon.events.PY_START, lambda code, offset: mon.DISABLE)
        mon.register_callback(tool, mon.events.CALL, lambda *args: mon.DISABLE)
        mon.set_events(tool, mon.events.PY_START | mon.events.CALL)
        try:
            yield self
        finally:
            mon.set_events(tool, 0)
            mon.restart_events()
            mon.free_tool_id(tool)


def _exists(get_exercise, ex_id: str) -> bool:
    try:
        get_exercise(ex_id)
    except Exception:  # an answer tag without a registered exercise
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebooks", nargs="+", default=["ch04", "ch07", "ch11", "ch13"],
                        metavar="CHNN")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grade", action="store_true",
                        help="also time `mlsys-lab grade` of each solutions notebook")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.rounds)))
        return
    print(f"cores: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}, "
          f"rounds: {args.rounds}")
    print(f"{'notebook':8} {'plain s':>8} {'seal s':>7} {'probed s':>9} {'ratio':>6} "
          f"{'first':>6} {'ratio w/o seal':>14} {'first w/o':>9} {'no-op hook':>10} {'C no-op':>8} "
          f"{'monitoring':>11}"
          + (f"{'grade s':>9} {'guard share':>11} {'plans wait':>10}" if args.grade else ""))
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    for name in args.notebooks:
        out = subprocess.run([sys.executable, __file__, "--child", name, "--rounds",
                              str(args.rounds)], capture_output=True, text=True, env=env)
        if out.returncode:
            print(f"{name}: failed\n{out.stderr[-2000:]}{out.stdout[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = (r["probed"] + r["seal"]) / r["plain"]
        first = (r["first_probed"] + r["seal"]) / r["plain"]
        line = (f"{name:8} {r['plain']:8.3f} {r['seal']:7.3f} {r['probed']:9.3f} {ratio:5.2f}x "
                f"{first:5.2f}x {r['probed'] / r['plain']:13.2f}x "
                f"{r['first_probed'] / r['plain']:8.2f}x "
                f"{r['no-op hook'] / r['plain']:9.2f}x {r['C no-op'] / r['plain']:7.2f}x")
        line += f" {r['monitoring'] / r['plain']:10.2f}x" if "monitoring" in r else f" {'-':>11}"
        if args.grade:
            seconds = _grade_seconds(name, args.rounds, env)
            cost = r["first_probed"] + r["seal"] - r["plain"]  # a grade's checks: the first
            wait = _plans_wait(name, args.rounds, env)
            line += f"{seconds:9.2f} {100 * cost / seconds:10.1f}% {wait:9.3f}s"
        print(line)


def _grade_seconds(notebook: str, rounds: int, env: dict) -> float:
    """Best-of-``rounds`` wall time of ``mlsys-lab grade`` on the solutions notebook."""
    [path] = sorted((ROOT / "solutions").glob(f"{notebook}_*.ipynb"))
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-c", "from mlsys_lab.cli import main; main()",
                              "grade", "--no-cache", str(path)], capture_output=True,
                             text=True, env=env)
        best = min(best, time.perf_counter() - start)
        if out.returncode:
            raise SystemExit(f"mlsys-lab grade {path.name} failed:\n{out.stdout[-2000:]}")
    return best


_PLANS_WAIT = """
import json, sys, time
from mlsys_lab.grading.core import grader
marks = {}
execute, from_child = grader._Run.execute, grader._Preparation._from_child
def timed_execute(self, step, capture=True):
    execute(self, step, capture)
    marks.setdefault("sealed", time.perf_counter())  # the first cell: the seal
def timed_from_child(self):
    made = from_child(self)
    marks["plans"] = time.perf_counter()
    return made
grader._Run.execute, grader._Preparation._from_child = timed_execute, timed_from_child
report = grader.grade(sys.argv[1], prepare_aside=True)  # as ``mlsys-lab grade`` calls it
assert report.total == report.max, report.total
print(json.dumps(marks["plans"] - marks["sealed"]))
"""


def _plans_wait(notebook: str, rounds: int, env: dict) -> float:
    """The least, over ``rounds`` grades, of how long the grader waited for the plans after
    the seal cell had run."""
    [path] = sorted((ROOT / "solutions").glob(f"{notebook}_*.ipynb"))
    waits = []
    for _ in range(rounds):
        out = subprocess.run([sys.executable, "-c", _PLANS_WAIT, str(path)],
                             capture_output=True, text=True, env=env)
        if out.returncode:
            raise SystemExit(f"grading {path.name} failed:\n{out.stderr[-2000:]}")
        waits.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return min(waits)


if __name__ == "__main__":
    main()
