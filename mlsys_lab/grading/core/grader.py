"""Grade a student notebook by running it in its own kernel process.

``grade(path)`` starts a fresh Python kernel (cwd = the notebook's folder) and runs the notebook's
code cells top to bottom with nbclient. Each exercise is graded where its public check cell
(``check("4.1", ...)``) stands — with the notebook's namespace as it is there, so the last
definition above the check counts, whichever cell holds it — or at the end of the notebook when
it has no check cell. Grading an exercise has two halves:

* **in the kernel, the probes**: a hidden cell runs the exercise's probes on the student's
  objects and sends their raw results back (one display-data message carrying a secret marker
  chosen for that step). The hidden cell does not import the grading code from the kernel's
  ``sys.modules``: the grader sends the source of ``checks``, ``guard``, ``wire``, ``probe`` and
  the chapter module, read before the kernel started, and the cell runs it as a private copy.
  The forbidden-functions plan and the seed of the inputs come from the grader too.
* **here, the judges**: the grader decodes the raw results (plain data; nothing is executed or
  unpickled) and runs each case's judge in this process, against references it computes itself.
  Points come from this process's registry. A step that sends no result, or more than one (a
  fake result printed by the notebook), scores 0.

What can go wrong, and what the grader does:

* an answer raises — the error is noted; the exercise is still checked (its cases fail). Any
  other cell that raises is noted too (so a notebook that grades with no notes ran cleanly).
* a cell runs longer than ``cell_timeout`` — nbclient interrupts the kernel (KeyboardInterrupt)
  and the run carries on; if the cell ignores the interrupt, the kernel is killed a few seconds
  later and handled as below. A check that times out scores 0 for that exercise, and so does an
  exercise whose tagged answer cell timed out.
* the kernel dies (``os._exit``, a crash, ``exit()``) — the kernel process group is killed, a
  fresh kernel is started, the cells that ran before are replayed without grading (skipping the
  one that killed it and any that timed out), and grading carries on. After ``max_restarts``
  the remaining exercises score 0 with "kernel died".
* the whole run passes ``timeout`` seconds — the kernel and every process in its group are
  killed; exercises graded so far keep their points, the rest score 0.
* huge output — at most ``max_output`` characters of each cell's output are kept.

The maximum score comes from the registered checks of every chapter the notebook refers to (its
answer tags and check cells, its ``metadata.mlsys_lab.chapter`` and its file name), so an
exercise whose cells were deleted, or whose check never ran, still counts: 0 of its maximum.
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from mlsys_lab.grading.core.cells import answer_id, chapter_from_filename, check_ids
from mlsys_lab.grading.core.exercise import (
    Exercise,
    UnknownExerciseError,
    chapter_of,
    exercises_for_chapter,
    failure_groups,
    fmt_points,
    get_exercise,
)
from mlsys_lab.grading.core.guard import plan_text, reference_plan
from mlsys_lab.grading.core.judge import judge_exercise
from mlsys_lab.grading.core.probe import MIME, references_cell, seal_cell
from mlsys_lab.grading.core.wire import MAX_BYTES
from mlsys_lab.grading.exercises import package_of

__all__ = ["ExerciseGrade", "GradeReport", "grade", "stop_all_kernels"]

# The hidden cell. It loads the grading modules from the source in ``bundle`` into private
# module objects (never registered in sys.modules) whose imports of each other resolve to the
# private copies, then runs the probes and publishes the payload. The bundle and the guard plan
# (~0.7 MB) travel as one string literal evaluated in the kernel: IPython tokenises a cell
# before running it, which took ~0.25 s on the same data written out as dict literals and takes
# ~0.02 s on one string. The plan inside it is JSON text, which ``probe.emit`` decodes with the
# seal's decoder (evaluating its ~1,400 entries as literals took 38 ms a check, decoding takes
# 2 ms). A module's code is compiled once per kernel and kept in the seal with its source
# (``compiled``): every check still runs it into fresh private modules, and a check whose source
# differs compiles its own (compiling the ~0.2 MB of a chapter's modules took 34 ms a check). A
# replaced ``builtins.eval`` or JSON decoder is tampering (both are sealed), so the probes fail
# every case.
_BOOTSTRAP = """\
def __mlsys_lab_probe(payload, exercise, seed, marker):
    import builtins as B  # every builtin through B: the notebook may shadow the names
    bundle, plan = B.eval(payload, {{"__builtins__": {{}}}})  # literals only; plan: JSON text
    real_import = B.__import__
    private = {{}}
    seal = B.vars(B).get("__mlsys_lab_seal_" + {key!r} + "__")
    compiled = seal.setdefault("compiled", {{}}) if B.type(seal) is B.dict else {{}}

    def load(name):
        if name not in private:
            filename, source = bundle[name]
            module = private[name] = B.type(B)(name)
            module.__file__ = filename
            package = filename.endswith("__init__.py")
            module.__package__ = name if package else name.rpartition(".")[0]
            module.__builtins__ = B.dict(B.vars(B), __import__=private_import)
            known = compiled.get(name)
            if known is None or known[0] != source:
                known = compiled[name] = (source, B.compile(source, filename, "exec"))
            B.exec(known[1], module.__dict__)
        return private[name]

    def private_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            package = (globals or {{}}).get("__package__") or ""
            base = package.rsplit(".", level - 1)[0] if level > 1 else package
            name = base + "." + name if name else base
        if fromlist and name in bundle:
            module = load(name)
            for item in fromlist:
                if name + "." + item in bundle:
                    B.setattr(module, item, load(name + "." + item))
            return module
        wanted = [item for item in fromlist or () if name + "." + item in bundle]
        if wanted:
            package = B.type(B)(name)
            for item in wanted:
                B.setattr(package, item, load(name + "." + item))
            return package
        return real_import(name, globals, locals, fromlist, 0)

    load("mlsys_lab.grading.core.probe").emit(exercise, B.globals(), seed, marker, plan, {key!r})


try:
    __mlsys_lab_probe({payload!r}, {exercise!r}, {seed!r}, {marker!r})
finally:
    del __mlsys_lab_probe
"""
#: What every hidden cell loads, besides the exercise's chapter and what they all import.
KERNEL_MODULES = ("mlsys_lab.grading.core.probe", "mlsys_lab.grading.exercises")
_PACKAGE_PARENT = Path(__file__).resolve().parents[3]
_quiet = logging.getLogger("mlsys_lab.grading.kernel")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False

# Process groups of the kernels this process has running now, and whether a stop was asked for
# (``stop_all_kernels``): a grading worker that is told to stop kills them before it exits.
_LIVE_GROUPS: set[int] = set()
_STOPPING = threading.Event()
_on_kernel_start = None  # called with each new kernel's process group (set by class workers)


# ----------------------------------------------------------------------------- the report


@dataclass
class ExerciseGrade:
    """One row of a grade report."""

    exercise: str
    title: str
    points: float
    max: float
    feedback: str
    cases: list[dict[str, Any]] = field(default_factory=list)
    seed: int | None = None  # the probes' random inputs: check(..., seed=N) repeats them


@dataclass
class GradeReport:
    """The result of grading one notebook: one row per exercise, plus notes on the run."""

    notebook: str
    rows: list[ExerciseGrade] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def total(self) -> float:
        """Points earned."""
        return sum(row.points for row in self.rows)

    @property
    def max(self) -> float:
        """Points available."""
        return sum(row.max for row in self.rows)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, ready for ``json.dumps``."""
        return {
            "notebook": self.notebook,
            "total": self.total,
            "max": self.max,
            "elapsed": round(self.elapsed, 2),
            "rows": [asdict(row) for row in self.rows],
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GradeReport:
        """The report back from ``to_dict`` (e.g. read from a JSON cache)."""
        rows = [ExerciseGrade(**row) for row in data.get("rows", [])]
        return cls(str(data["notebook"]), rows, list(data.get("notes", [])),
                   float(data.get("elapsed", 0.0)))

    def to_json(self) -> str:
        """The report as one JSON document."""
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=2)

    def to_table(self) -> str:
        """The report as a text table, for people."""
        head = ("Exercise", "Title", "Points", "Feedback")
        body = [
            (r.exercise, r.title, f"{fmt_points(r.points)}/{fmt_points(r.max)}", r.feedback)
            for r in self.rows
        ]
        body.append(("Total", "", f"{fmt_points(self.total)}/{fmt_points(self.max)}", ""))
        widths = [max(len(row[i]) for row in [head, *body]) for i in range(3)]

        def line(row):
            cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1]), row[2].rjust(widths[2])]
            return "  ".join(cells + [row[3]]).rstrip()

        rule = "-" * (sum(widths) + 4 + 10)
        lines = [f"Grade report: {self.notebook}", line(head), rule]
        lines += [line(row) for row in body[:-1]] + [rule, line(body[-1])]
        if self.notes:
            lines += ["", "Notes:"] + [f"  - {note}" for note in self.notes]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- the kernel


class _Client(NotebookClient):
    """An nbclient that caps each cell's output, collects probe payloads, records timeouts."""

    def __init__(self, nb, max_output: int, **kwargs):
        super().__init__(nb, **kwargs)
        self.max_output = max_output
        self.limit: float = 60.0
        self.begin_step()

    def begin_step(self) -> None:
        self.kept = 0
        self.dropped = 0
        self.payloads: list[Any] = []
        self.timed_out = False

    def _get_timeout(self, cell):  # nbclient asks this for each cell's time limit
        return self.limit

    async def _async_handle_timeout(self, timeout, cell=None):
        self.timed_out = True
        return await super()._async_handle_timeout(timeout, cell)

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        data = content.get("data")
        if isinstance(data, dict) and MIME in data:  # a probe payload: keep it, never show it
            self.payloads.append(data[MIME])
            return None
        if msg["msg_type"] == "stream":
            text = content.get("text", "")
            room = self.max_output - self.kept
            if len(text) > room:
                self.dropped += len(text) - max(room, 0)
                if room <= 0:
                    return None
                msg = {**msg, "content": {**content, "text": text[:room]}}
            self.kept += min(len(text), max(room, 0))
        elif msg["msg_type"] != "error" and self.kept >= self.max_output:
            self.dropped += 1
            return None
        return super().output(outs, msg, display_id, cell_index)


@dataclass
class _Step:
    kind: str  # "student" or "grade"
    cell_index: int
    source: str
    exercise: str | None = None  # the answer's id for an answer cell / the id to grade
    status: str = "pending"  # ok, error, timeout, died, skipped
    error: str = ""
    marker: str = ""  # grade steps: the secret the payload must carry
    seed: int = 0  # grade steps: the seed of the probes' inputs
    payloads: list[Any] = field(default_factory=list)


def _cell(step: _Step) -> str:
    """How notes name a cell: counted from 1, markdown cells included."""
    return f"cell {step.cell_index + 1}"


def _kill_group(pgid: int | None) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, OSError):
        pass


class _Run:
    """One grading run: the steps, the current kernel, the clock."""

    def __init__(self, nb, folder: Path, cell_timeout, timeout, max_output, max_restarts, kernel,
                 preparation: _Preparation, env: dict[str, str] | None = None):
        self.nb = nb
        self.preparation = preparation  # the hidden cells' bundles and plans, made meanwhile
        self.folder = folder
        self.cell_timeout = float(cell_timeout)
        self.deadline = time.monotonic() + float(timeout)
        self.timeout = float(timeout)
        self.max_output = max_output
        self.restarts_left = max_restarts
        self.kernel_name = kernel
        self.env = dict(env or {})
        self.client: _Client | None = None
        self.pgid: int | None = None
        self.notes: list[str] = []
        self.wall_clock_hit = False

    # -- kernel lifecycle ---------------------------------------------------------------

    @property
    def prepared(self) -> dict[str, tuple[dict, str]]:
        """Exercise id -> (bundle, plan as JSON) of every exercise that could be prepared."""
        return self.preparation.result()

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def start_kernel(self) -> None:
        if _STOPPING.is_set():
            raise RuntimeError("grading was stopped")
        client = _Client(
            self.nb,
            max_output=self.max_output,
            kernel_name=self.kernel_name,
            allow_errors=True,
            interrupt_on_timeout=True,
            startup_timeout=max(1, int(min(60, self.remaining()))),
            shutdown_kernel="immediate",
            record_timing=False,
            log=_quiet,
        )
        env = {**os.environ, **self.env}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in [str(_PACKAGE_PARENT), env.get("PYTHONPATH", "")] if p
        )
        client.km = client.create_kernel_manager()
        self.client = client
        # The kernel's own stdout/stderr (start-up warnings, C-level prints) are not the
        # notebook's output; keep them off the grader's terminal.
        client.start_new_kernel(
            cwd=str(self.folder), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        provisioner = getattr(client.km, "provisioner", None)
        self.pgid = getattr(provisioner, "pgid", None) or getattr(provisioner, "pid", None)
        if self.pgid is not None:
            _LIVE_GROUPS.add(self.pgid)
            if _on_kernel_start is not None:  # a class worker tells its parent at once
                _on_kernel_start(self.pgid)
        client.start_new_kernel_client()
        # Before any student cell: record what the checks rely on (guard.seal, issue 27).
        self.seal_key = secrets.token_hex(16)
        first = _Step("seal", 0, seal_cell(self.seal_key, self.preparation.ids))
        self.execute(first, capture=False)
        if first.status != "ok":
            self.notes.append(f"the grader's first cell failed ({first.status}: {first.error})")
        elif self.prepared:  # made while the kernel started and sealed
            second = _Step("seal", 0, references_cell(self.seal_key, self.preparation.references))
            self.execute(second, capture=False)
            if second.status != "ok":
                self.notes.append(f"the grader's second cell failed ({second.status}: "
                                  f"{second.error})")

    def stop_kernel(self) -> None:
        client, pgid = self.client, self.pgid
        self.client, self.pgid = None, None
        km = client.km if client is not None else None
        process = getattr(getattr(km, "provisioner", None), "process", None)
        if client is not None:
            try:
                client._cleanup_kernel()
            except Exception:  # a dead or stuck kernel: the group kill below settles it
                pass
        _kill_group(pgid)  # processes the student's code started in the kernel's group
        _LIVE_GROUPS.discard(pgid)
        if process is not None:
            try:
                process.wait(timeout=5)  # reap it: no zombie left behind
            except Exception:
                pass

    # -- running one cell ---------------------------------------------------------------

    def execute(self, step: _Step, capture: bool = True) -> None:
        """Run one step in the current kernel and set its status."""
        client = self.client
        assert client is not None
        remaining = self.remaining()
        client.limit = max(0.5, min(self.cell_timeout, remaining))
        client.begin_step()
        source = step.source
        if step.kind == "grade":
            bundle, plan = self.prepared[step.exercise]
            step.marker = secrets.token_hex(16)  # fresh for each step: unknown until it runs
            step.seed = secrets.randbelow(1_000_000)
            source = _BOOTSTRAP.format(payload=repr((bundle, plan)), exercise=step.exercise,
                                       seed=step.seed, marker=step.marker, key=self.seal_key)
        cell = nbformat.v4.new_code_cell(source)
        # If the interrupt does not stop the cell (the code swallows KeyboardInterrupt, or sits
        # in C code), kill the kernel a little later; at the wall-clock deadline, kill it anyway.
        hard = min(client.limit + min(self.cell_timeout, 10.0) + 2.0, remaining + 0.5)
        pgid = self.pgid
        fired = threading.Event()

        def kill():
            fired.set()
            _kill_group(pgid)

        watchdog = threading.Timer(max(hard, 0.1), kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            client.execute_cell(cell, step.cell_index, store_history=step.kind == "student")
        except DeadKernelError:
            step.status = "died"
        except Exception as error:  # nbclient itself failed: treat the kernel as lost
            step.status = "died"
            step.error = f"{type(error).__name__}: {error}"
        finally:
            watchdog.cancel()
        if step.status != "died":
            errors = [o for o in cell.outputs if o.get("output_type") == "error"]
            if client.timed_out:
                step.status = "timeout"
                if remaining < self.cell_timeout:  # it was the notebook's time that ran out
                    self.wall_clock_hit = True
            elif errors:
                step.status = "error"
                step.error = f"{errors[-1].get('ename')}: {errors[-1].get('evalue', '')}"[:300]
            else:
                step.status = "ok"
        if fired.is_set():
            if self.remaining() <= 0.5:
                self.wall_clock_hit = True
            else:
                step.error = "it ignored the interrupt after the time limit and was killed"
                self.notes.append(
                    f"{_cell(step)} ignored the interrupt after its timeout; the kernel was killed"
                )
        if capture and client.dropped:
            where = f"checking {step.exercise}" if step.kind == "grade" else _cell(step)
            self.notes.append(
                f"{where}: output too long, kept the first {self.max_output:,} "
                f"characters (dropped {client.dropped:,})"
            )
        if step.kind == "grade":
            step.payloads = list(client.payloads)

    def replay(self, steps: list[_Step]) -> bool:
        """Re-run the student cells that ran before (not the fatal or timed-out ones)."""
        for step in steps:
            if step.kind != "student" or step.status not in ("ok", "error"):
                continue
            copy = _Step("student", step.cell_index, step.source)
            self.execute(copy, capture=False)
            if copy.status == "died" or self.remaining() <= 0:
                return False
        return True


# ----------------------------------------------------------------------------- planning


def _is_public_check_cell(source: str) -> bool:
    """True for a cell that only calls ``check(...)`` (the grader runs its own checks there)."""
    lines = [ln.strip() for ln in source.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    return bool(lines) and all(ln.startswith("check(") for ln in lines)


def _mentioned(nb) -> list[str]:
    """Exercise ids the notebook names: answer tags and check cells, in order."""
    found: list[str] = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for ex_id in [answer_id(cell), *check_ids(cell.source)]:
            if ex_id and ex_id not in found:
                found.append(ex_id)
    return found


def _expected_exercises(nb, path: Path, mentioned: list[str], notes: list[str],
                        only: list[int] | None = None) -> list[Exercise]:
    if only is not None:
        return _assignment_exercises(nb, path, only, notes)
    chapters = set()
    meta_chapter = nb.metadata.get("mlsys_lab", {}).get("chapter")
    if isinstance(meta_chapter, int):
        chapters.add(meta_chapter)
    if chapter_from_filename(path) is not None:
        chapters.add(chapter_from_filename(path))
    for ex_id in mentioned:
        try:
            chapters.add(chapter_of(ex_id))
        except UnknownExerciseError:
            pass
    found: dict[str, Exercise] = {}
    for chapter in sorted(chapters):
        try:
            for exercise in exercises_for_chapter(chapter):
                found[exercise.id] = exercise
        except Exception as error:  # a chapter module that fails to import: say so, carry on
            notes.append(f"could not load the checks of chapter {chapter}: {error!r}")
    for ex_id in mentioned:
        if ex_id in found:
            continue
        try:
            found[ex_id] = get_exercise(ex_id)
        except Exception as error:
            notes.append(f"{ex_id} is not a known exercise ({error}); not graded")
    return list(found.values())


def _assignment_exercises(nb, path: Path, only: list[int], notes: list[str]) -> list[Exercise]:
    """The exercises of the given chapters; a note when the notebook is another chapter's."""
    meta_chapter = nb.metadata.get("mlsys_lab", {}).get("chapter")
    own = {meta_chapter} if isinstance(meta_chapter, int) else set()
    for ex_id in _mentioned(nb):
        try:
            own.add(chapter_of(ex_id))
        except UnknownExerciseError:
            pass
    if own and not own & set(only):
        names = ", ".join(str(c) for c in sorted(own))
        wanted = ", ".join(str(c) for c in sorted(only))
        notes.append(f"wrong chapter: {path.name} holds chapter {names}'s exercises, but the "
                     f"assignment is chapter {wanted}")
    found: list[Exercise] = []
    for chapter in sorted(set(only)):
        try:
            found.extend(exercises_for_chapter(chapter))
        except Exception as error:
            notes.append(f"could not load the checks of chapter {chapter}: {error!r}")
    if not found:
        notes.append(f"chapter {', '.join(map(str, sorted(set(only))))} has no graded exercises")
    return found


def _plan(nb, graded: list[str]) -> list[_Step]:
    """The steps: every code cell in order, each exercise graded at its last check cell (the
    public check cell itself is not run), or at the end of the notebook if it has none."""
    at: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for ex_id in check_ids(cell.source):
                if ex_id in graded:
                    at[ex_id] = index
    steps: list[_Step] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        here = [ex_id for ex_id in dict.fromkeys(check_ids(cell.source)) if at.get(ex_id) == index]
        if not _is_public_check_cell(cell.source):
            steps.append(_Step("student", index, cell.source, answer_id(cell)))
        steps.extend(_Step("grade", index, "", ex_id) for ex_id in here)
    end = len(nb.cells)
    steps.extend(_Step("grade", end, "", ex_id) for ex_id in graded if ex_id not in at)
    return steps


_SOURCES: dict[Path, tuple[tuple[int, int], str]] = {}


def module_file(module: str) -> Path:
    """The file of a grading module or package: ``mlsys_lab.grading.core.guard`` ->
    ``.../grading/core/guard.py``, a package -> its ``__init__.py``."""
    base = _PACKAGE_PARENT.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _source_of(module: str) -> tuple[str, str]:
    """A grading module's file name and source (read again only when the file changes: a class
    run grades many notebooks against the same checks)."""
    path = module_file(module)
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _SOURCES.get(path)
    if cached is None or cached[0] != stamp:
        cached = _SOURCES[path] = (stamp, path.read_text(encoding="utf-8"))
    return str(path), cached[1]


@functools.lru_cache(maxsize=256)
def grading_imports(source: str) -> frozenset[str]:
    """The ``mlsys_lab.grading.*`` modules a module's source imports (``from package import
    module`` names the module too)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("mlsys_lab.grading."):
                if module_file(node.module).is_file():  # not a namespace package (core)
                    found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names
                             if module_file(f"{node.module}.{a.name}").is_file())
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mlsys_lab.grading."))
    return frozenset(found)


def modules_of(chapter: int, also: tuple[str, ...] = ()) -> list[str]:
    """Every grading module a chapter's checks run on in the kernel: the kernel's entry points,
    the chapter's exercise package and everything they import (with ``also``: those modules
    and their imports too)."""
    package = package_of(chapter)
    todo = [*KERNEL_MODULES, *([package] if package else []), *also]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(grading_imports(_source_of(name)[1]))
    return sorted(seen)


def _prepare(exercise: Exercise, plan: str | None = None) -> tuple[dict, str]:
    """What the hidden cell needs: the grading modules' source, and the guard plan (JSON; made
    here unless given)."""
    bundle = {name: _source_of(name) for name in modules_of(chapter_of(exercise.id))}
    return bundle, plan if isinstance(plan, str) else plan_text(exercise)


class _Preparation:
    """What the hidden cells and the seal need: ``_prepare`` of each exercise, and the JSON of
    ``reference_plan``. Made here at once, or (``aside``) by another process while the kernel
    starts and is sealed: a fresh process spends 1-2 s importing the forbidden functions'
    modules and fingerprinting the grader's ~1,300 references, about as long as a kernel takes
    to start. (A thread of this process would hold up the kernel's start as long: the client
    waiting for it needs the GIL at every step.)"""

    def __init__(self, exercises: list[Exercise], aside: bool = False):
        self._exercises = list(exercises)
        self.ids = [exercise.id for exercise in self._exercises]
        self._prepared: dict[str, tuple[dict, str]] | None = None
        self.failed: dict[str, tuple[str, str]] = {}  # exercise id -> (why, the error)
        self.references: str | None = None  # what the seal gets: None when nothing is graded
        self._child: subprocess.Popen | None = None
        if aside and self.ids:
            try:
                self._child = subprocess.Popen(
                    [sys.executable, "-c", _PLANS_ASIDE, *self.ids], stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                    env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [
                        str(_PACKAGE_PARENT), os.environ.get("PYTHONPATH", "")] if p)})
            except OSError:  # no process to spare: made here when asked for
                self._child = None
        else:
            self.result()

    def result(self) -> dict[str, tuple[dict, str]]:
        """Exercise id -> (bundle, plan as JSON), for every exercise that could be prepared
        (waits for the other process; made here if it failed)."""
        if self._prepared is None:
            made = self._from_child() if self._child is not None else None
            self._prepared = {}
            for exercise in self._exercises:
                try:
                    plan = made["plans"].get(exercise.id) if made else None
                    self._prepared[exercise.id] = _prepare(exercise, plan)
                except Exception as error:  # a broken check module or forbidden spec: the
                    self.failed[exercise.id] = (  # teacher's bug, reported in the notes
                        f"the checks of {exercise.id} could not be prepared: "
                        f"{type(error).__name__}", str(error))
            if self._prepared:
                references = made and made.get("references")
                self.references = references or reference_plan()["text"]
        return self._prepared

    def _from_child(self) -> dict | None:
        """What the other process made: {"plans": {id: JSON}, "references": JSON}, or None."""
        child, self._child = self._child, None
        try:
            out, _ = child.communicate(timeout=120)
            made = json.loads(out)
            return made if child.returncode == 0 and isinstance(made, dict) else None
        except (subprocess.TimeoutExpired, ValueError):
            child.kill()
            child.wait()
            return None


#: The other process's work (``_Preparation``): the plans it can make, and the references.
_PLANS_ASIDE = """\
import json, sys
from mlsys_lab.grading.core.exercise import get_exercise
from mlsys_lab.grading.core.guard import plan_text, reference_plan
plans = {}
for ex_id in sys.argv[1:]:
    try:
        plans[ex_id] = plan_text(get_exercise(ex_id))
    except Exception:  # made again in the grader, which reports why it fails
        pass
print(json.dumps({"plans": plans, "references": reference_plan()["text"]}))
"""


# ----------------------------------------------------------------------------- grading


def grade(
    path: str | Path,
    cell_timeout: float = 60,
    timeout: float = 600,
    *,
    max_output: int = 100_000,
    max_restarts: int = 2,
    kernel_name: str = "python3",
    chapters: list[int] | None = None,
    env: dict[str, str] | None = None,
    progress: Any = None,
    prepare_aside: bool = False,
) -> GradeReport:
    """Run a notebook in a fresh kernel and grade every exercise of its chapter(s).

    Args:
        path: the student's ``.ipynb``.
        cell_timeout: seconds one cell (or one exercise's probes) may run before it is
            interrupted.
        timeout: seconds for the whole notebook; then the kernel is killed and what was graded
            so far is kept.
        max_output: characters of output kept per cell.
        max_restarts: how many times a dead kernel is restarted.
        kernel_name: the Jupyter kernel to run the notebook in.
        chapters: grade exactly these chapters' exercises (the assignment), whatever the
            notebook names; default: every chapter the notebook refers to.
        env: variables added to the kernel's environment (e.g. ``OMP_NUM_THREADS``).
        progress: called with one short line of text as grading goes (the kernel starts, a
            cell runs, an exercise is checked, the answers are judged), e.g. to show that a
            long run is working; an exception it raises is ignored.
        prepare_aside: make the guard plans in another process while the kernel starts (about
            1 s sooner for a one-shot ``mlsys-lab grade``, on two cores or more); by default
            they are made here, where a process grading many notebooks keeps them.

    Returns:
        A ``GradeReport``. Grading never raises for anything the notebook does.
    """
    started = time.monotonic()
    path = Path(path)
    report = GradeReport(notebook=str(path))
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as error:
        report.notes.append(f"could not read the notebook: {type(error).__name__}: {error}")
        empty = nbformat.v4.new_notebook()
        _add_rows(report, _expected_exercises(empty, path, [], [], chapters), {})
        report.elapsed = time.monotonic() - started
        return report

    expected = _expected_exercises(nb, path, _mentioned(nb), report.notes, chapters)
    if not expected:  # nothing to grade: the notebook's code is not run at all
        report.elapsed = time.monotonic() - started
        return report
    outcome: dict[str, str] = {}  # exercise id -> why it has no result (when it has none)
    preparation = _Preparation(expected, aside=prepare_aside)
    steps = _plan(nb, [e.id for e in expected])

    run = _Run(
        nb, path.resolve().parent, cell_timeout, timeout, max_output, max_restarts, kernel_name,
        preparation, env,
    )
    run.progress = progress
    try:
        _execute_all(run, steps, outcome)
    except Exception as error:  # never crash: whatever happened, report what was graded
        run.notes.append(f"grader error: {type(error).__name__}: {error}")
    finally:
        run.stop_kernel()
    preparation.result()
    for ex_id, (why, error) in preparation.failed.items():
        report.notes.append(f"{why}: {error}")
        outcome[ex_id] = why
    report.notes.extend(run.notes)
    _tell(run, "judging the answers")

    results: dict[str, tuple[Any, str]] = {}
    by_id = {e.id: e for e in expected}
    for step in steps:
        if step.kind == "grade" and step.status != "pending":
            if step.exercise in outcome:
                results[step.exercise] = (None, outcome[step.exercise])
                continue
            payload, why = _payload(step)
            if payload is None:
                results[step.exercise] = (None, why or _why(step, run))
            elif "error" in payload:
                results[step.exercise] = (None, str(payload["error"]))
            else:
                results[step.exercise] = (judge_exercise(by_id[step.exercise], payload,
                                                         step.seed), "")
    for ex_id, why in outcome.items():
        results.setdefault(ex_id, (None, why))
    _add_rows(report, expected, results)
    report.elapsed = time.monotonic() - started
    return report


def _payload(step: _Step) -> tuple[dict | None, str]:
    """The one payload a grade step sent, or None and why (none, several, forged)."""
    if not step.payloads:
        return None, ""
    if len(step.payloads) > 1:
        return None, ("the check's result arrived more than once (the notebook sent a fake "
                      "one?); the check cannot trust either")
    text = step.payloads[0]
    if not isinstance(text, str) or len(text) > 2 * MAX_BYTES:
        return None, "the check's result was malformed"
    try:
        payload = json.loads(text)
    except ValueError:
        return None, "the check's result was malformed"
    if not isinstance(payload, dict) or payload.get("marker") != step.marker:
        return None, "the check's result did not come from the grader (wrong marker)"
    return payload, ""


def _why(step: _Step, run: _Run) -> str:
    if step.status == "timeout":
        return f"timed out after {fmt_points(run.cell_timeout)} s while checking your answer"
    if step.status == "died" and step.error.startswith("it ignored"):
        limit = fmt_points(run.cell_timeout)
        return f"timed out after {limit} s while checking your answer; {step.error}"
    if step.status == "died":
        return "the kernel died while checking your answer"
    if step.status == "skipped":
        return "not checked"
    if step.error:
        return f"the check could not run ({step.error})"
    return "the check sent no result"


def _execute_all(run: _Run, steps: list[_Step], outcome: dict[str, str]) -> None:
    """Run the steps in order, restarting a dead kernel; record why exercises got no result."""
    limit = f"{fmt_points(run.cell_timeout)} s"
    i = 0
    while i < len(steps) and not run.wall_clock_hit:
        step = steps[i]
        if run.remaining() <= 0:
            run.wall_clock_hit = True
            run.notes.append(
                f"wall-clock timeout ({fmt_points(run.timeout)} s) before "
                f"{_cell(step)}: the exercises from here on were not graded"
            )
            break
        if step.kind == "grade" and (step.exercise in outcome  # its answer cell failed
                                     or step.exercise not in run.prepared):  # or its checks
            step.status = "skipped"
            i += 1
            continue
        if run.client is None and not _restart(run, steps[:i]):
            _skip_rest(steps[i:], outcome, "not run: the kernel died earlier")
            return
        if step.kind == "grade":
            _tell(run, f"checking {step.exercise}")
        else:
            answer_of = f" (the answer cell of {step.exercise})" if step.exercise else ""
            _tell(run, f"running {_cell(step)}{answer_of}")
        run.execute(step)
        answer = step.exercise if step.kind == "student" else None
        if run.wall_clock_hit:
            if step.exercise:
                outcome[step.exercise] = "not finished: the notebook hit the wall-clock timeout"
            run.notes.append(
                f"wall-clock timeout ({fmt_points(run.timeout)} s) in {_cell(step)}:"
                " the kernel was killed; the exercises after it were not graded"
            )
        elif step.status == "timeout" and step.kind == "student":
            run.notes.append(f"{_cell(step)} timed out after {limit} and was interrupted")
            if answer:  # an answer cell that never finishes scores 0
                outcome.setdefault(answer, f"your answer cell timed out after {limit}")
        elif step.status == "error" and answer:
            run.notes.append(f"answer {answer} ({_cell(step)}) raised {step.error}")
        elif step.status == "error" and step.kind == "student":  # not an answer: still say so
            run.notes.append(f"{_cell(step)} raised {step.error}")
        elif step.status == "died":
            run.notes.append(f"the kernel died in {_cell(step)}")
            run.stop_kernel()
            if answer:  # an answer cell that kills the kernel scores 0
                why = "the kernel died while running your answer cell"
                if step.error.startswith("it ignored"):
                    why = f"your answer cell timed out after {limit}; {step.error}"
                outcome.setdefault(answer, why)
        i += 1
    if run.wall_clock_hit:
        _skip_rest(steps[i:], outcome, "not run: the notebook hit the wall-clock timeout")


def _tell(run: _Run, text: str) -> None:
    """Pass a progress line to the caller's ``progress`` callback, if any."""
    callback = getattr(run, "progress", None)
    if callback is not None:
        try:
            callback(text)
        except Exception:  # a broken progress display must not stop the grading
            pass


def _restart(run: _Run, done: list[_Step]) -> bool:
    first = not any(s.status != "pending" for s in done)
    _tell(run, "starting a kernel" if first else "restarting the kernel")
    if not first:
        if run.restarts_left <= 0:
            run.notes.append("the kernel died too often; the remaining exercises were not graded")
            return False
        run.restarts_left -= 1
    try:
        run.start_kernel()
    except Exception as error:
        run.notes.append(f"could not start a kernel: {type(error).__name__}: {error}")
        run.stop_kernel()
        return False
    if first:
        return True
    run.notes.append("restarted the kernel and replayed the cells before it (not graded again)")
    if not run.replay(done):
        run.notes.append("the kernel died (or time ran out) while replaying")
        run.stop_kernel()
        return False
    return True


def _skip_rest(steps: list[_Step], outcome: dict[str, str], why: str) -> None:
    for step in steps:
        if step.kind == "grade":
            step.status = "skipped"
            outcome.setdefault(step.exercise, why)


def _add_rows(report: GradeReport, expected: list[Exercise], results: dict) -> None:
    for exercise in expected:
        result, why = results.get(exercise.id, (None, None))
        if result is None:
            why = why or f"no check of {exercise.id} ran"
            report.rows.append(
                ExerciseGrade(exercise.id, exercise.title, 0, exercise.max_points, why)
            )
            continue
        rows = [vars(row).copy() for row in result.rows]
        report.rows.append(
            ExerciseGrade(exercise.id, exercise.title, result.score, exercise.max_points,
                          _summary(rows), rows, result.seed)
        )


def _summary(rows: list[dict]) -> str:
    """One line of feedback for an exercise: which cases failed and why."""
    groups = failure_groups(rows)  # each message once, numbers compact
    if not groups:
        return f"all {len(rows)} cases passed"
    parts = [f"{len(names)} of {len(rows)} cases failed: {message}" if len(names) > 1
             else f"{names[0]}: {message}" for message, names in groups]
    return "; ".join(parts)


def stop_all_kernels() -> None:
    """Kill every kernel this process is running and start no new one (a worker's shutdown).

    Safe to call from a signal handler: it only sends signals and sets a flag.
    """
    _STOPPING.set()
    for pgid in list(_LIVE_GROUPS):
        _kill_group(pgid)
