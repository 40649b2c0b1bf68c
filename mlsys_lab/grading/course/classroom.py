"""Grade a whole class: submissions in parallel worker processes, with a re-grade cache.

``grade_class(submissions, jobs=N)`` hands the submissions to ``N`` worker processes (started
with ``spawn``). Each worker grades one notebook at a time with ``grader.grade`` — a fresh kernel
per notebook, the usual per-cell and per-notebook timeouts — and kernels run one BLAS, OpenMP and
Numba thread (``THREAD_ENV``), so ``N`` kernels share ``N`` cores without oversubscribing them.

Isolation: a submission that kills its kernel, hangs or floods its output is handled by the
grader inside its worker; a worker that dies anyway (or passes the notebook's timeout by a wide
margin) is replaced, and only its submission is reported as failed. On Ctrl-C (a
``KeyboardInterrupt`` in the caller) every worker is told to stop (SIGTERM): it kills its kernel's
process group, reaps it and exits; a worker that does not exit in time is killed together with
its kernels. No kernel outlives ``grade_class``.

The cache (``GradeCache``, a JSON file) keys each submission on the notebook's bytes (its release
stamp included), the grading options and a hash of the installed checks, so re-grading a folder
only runs the notebooks that changed since the last run.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import nbformat

from mlsys_lab.errors import ArgumentError
from mlsys_lab.grading.core.grader import GradeReport, _add_rows, _expected_exercises
from mlsys_lab.grading.course.release import grading_stamp, stamp_problem
from mlsys_lab.grading.course.submissions import Submission

__all__ = ["THREAD_ENV", "ClassResult", "GradeCache", "GradingOptions", "grade_class",
           "stamp_warnings"]

#: The environment of every worker's kernels: one thread for each threading runtime.
THREAD_ENV = {
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}
_GRACE = 10.0  # seconds a stopped worker gets to clean up before it is killed
_MARGIN = 60.0  # beyond the notebook's own timeout, before its worker is deemed stuck


@dataclass(frozen=True)
class GradingOptions:
    """What a grade depends on besides the notebook (part of the cache key)."""

    cell_timeout: float = 60.0
    timeout: float = 600.0

    def as_dict(self) -> dict[str, float]:
        """Plain data."""
        return {"cell_timeout": float(self.cell_timeout), "timeout": float(self.timeout)}


@dataclass
class ClassResult:
    """One submission's outcome: its report, whether it came from the cache, any stamp warning."""

    submission: Submission
    report: GradeReport
    cached: bool = False
    warning: str = ""


# ----------------------------------------------------------------------------- the cache


class GradeCache:
    """Reports of earlier runs, in a JSON file: submission name -> (key, report).

    A missing or unreadable file is an empty cache (an unreadable one is replaced on save).
    """

    FORMAT = 1

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries: dict[str, dict[str, Any]] = {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if isinstance(data, dict) and data.get("format") == self.FORMAT:
                self.entries = dict(data.get("entries", {}))
        except (OSError, ValueError):
            pass

    def get(self, name: str, key: str) -> GradeReport | None:
        """The cached report of ``name`` if it was graded with this key, else None."""
        entry = self.entries.get(name)
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        try:
            return GradeReport.from_dict(entry["report"])
        except (KeyError, TypeError, ValueError):
            return None

    def put(self, name: str, key: str, report: GradeReport) -> None:
        """Remember a report (call ``save`` to write the file)."""
        self.entries[name] = {"key": key, "report": report.to_dict()}

    def prune(self, keep) -> int:
        """Forget every submission whose name is not in ``keep`` (a notebook no longer in
        the folder); return how many were forgotten (call ``save`` to write the file)."""
        keep = set(keep)
        gone = [name for name in self.entries if name not in keep]
        for name in gone:
            del self.entries[name]
        return len(gone)

    def save(self) -> None:
        """Write the file (atomically: a run stopped half way leaves the old or the new one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        data = {"format": self.FORMAT, "entries": self.entries}
        tmp.write_text(json.dumps(data, ensure_ascii=False, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)


def cache_key(content: bytes, submission: Submission, options: GradingOptions,
              checks: str) -> str:
    """The key of one grade: the notebook's bytes, the assignment, the options, the checks."""
    digest = hashlib.sha256(content)
    extra = {"assignment": submission.assignment, "options": options.as_dict(), "checks": checks}
    digest.update(json.dumps(extra, sort_keys=True).encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- stamps


def stamp_warnings(submissions: list[Submission], require: bool = False) -> dict[str, str]:
    """Submission name -> why its release stamp differs from the installed checks (only those
    that differ; with ``require``, also those that carry no stamp; an unreadable notebook has
    nothing to compare)."""
    found = {}
    for sub in submissions:
        try:
            metadata = json.loads(sub.path.read_text(encoding="utf-8")).get("metadata", {})
        except (OSError, ValueError, AttributeError):
            continue
        problem = stamp_problem(metadata, sub.chapter, sub.name or sub.path.name, require)
        if problem:
            found[sub.name] = problem
    return found


# ----------------------------------------------------------------------------- workers


def _children_of(pid: int) -> list[int]:
    """Direct children of a process (Linux: from /proc; elsewhere: none known)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry))
    return found


def _kill_tree_of(pid: int) -> None:
    """Kill the process groups of a worker's children (its kernels), then the worker."""
    for child in _children_of(pid):
        for kill, target in ((os.killpg, child), (os.kill, child)):
            try:
                kill(target, signal.SIGKILL)
            except OSError:
                pass
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def _worker_main(conn, env: dict[str, str]) -> None:
    """A grading worker: receive a task, grade it, send the report back; until told to stop."""
    from mlsys_lab.grading.core import grader

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle

    def on_term(signum, frame):
        grader.stop_all_kernels()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    os.environ.update(env)
    # The parent learns each kernel's process group as it starts, so that it can kill the
    # kernel even if this worker dies without cleaning up.
    grader._on_kernel_start = lambda pgid: conn.send({"kernel": pgid})
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)  # the judges' own numpy, in this process
    except Exception:
        pass
    try:
        while not grader._STOPPING.is_set():
            try:
                task = conn.recv()
            except (EOFError, OSError):
                break
            if task is None:
                break
            report = grader.grade(task["path"], cell_timeout=task["cell_timeout"],
                                  timeout=task["timeout"], chapters=task["chapters"], env=env)
            if grader._STOPPING.is_set():
                break
            try:
                conn.send({"report": report.to_dict()})
            except (EOFError, OSError):  # the parent is gone: nobody to report to
                break
    except SystemExit:
        pass
    finally:
        grader.stop_all_kernels()


@contextmanager
def _main_hidden():
    """Hide the caller's main script from ``spawn`` while a worker starts.

    ``spawn`` starts a child by running the parent's main script again (as ``__mp_main__``),
    so that functions defined there can be unpickled. The worker needs nothing from it, and
    running it again goes wrong twice over: a script fed on stdin has no file to run
    (``__file__`` is ``'<stdin>'``: the worker died and every submission scored 0), and a
    script that grades at top level, without ``if __name__ == "__main__"``, would grade again
    in every worker."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    saved = {name: main.__dict__[name] for name in ("__file__", "__spec__")
             if name in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


class _Worker:
    def __init__(self, context, env: dict[str, str]):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, env), daemon=True)
        with _main_hidden():
            self.process.start()
        child.close()
        self.task: int | None = None
        self.started = 0.0
        self.kernels: set[int] = set()  # process groups of its current task's kernels

    def give(self, index: int, task: dict) -> None:
        self.task, self.started = index, time.monotonic()
        self.kernels = set()
        self.conn.send(task)

    def receive(self) -> dict | None:
        """The report of the current task if it has come (kernel notices are recorded)."""
        try:
            while self.conn.poll():
                message = self.conn.recv()
                if "kernel" in message:
                    self.kernels.add(int(message["kernel"]))
                elif "report" in message:
                    return message["report"]
        except (EOFError, OSError):
            pass
        return None

    def stop(self) -> None:
        """Ask the worker to stop (it cleans up its kernel and exits)."""
        if not self.process.is_alive():
            return
        try:
            if self.task is None:
                self.conn.send(None)
            else:
                os.kill(self.process.pid, signal.SIGTERM)
        except OSError:
            pass

    def finish(self, deadline: float) -> None:
        """Wait for the worker to exit until ``deadline``; then kill it and its kernels."""
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            _kill_tree_of(self.process.pid)
            self.process.join(5)
        for pgid in self.kernels:  # a worker that died uncleanly may have left its kernel
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        self.kernels = set()
        self.conn.close()


def _failed(sub: Submission, why: str) -> GradeReport:
    """A report for a submission that could not be graded: every exercise 0, and why."""
    report = GradeReport(notebook=str(sub.path), notes=[why])
    chapters = [sub.chapter] if sub.chapter is not None else None
    empty = nbformat.v4.new_notebook()
    _add_rows(report, _expected_exercises(empty, sub.path, [], [], chapters), {})
    return report


def _task(sub: Submission, options: GradingOptions) -> dict:
    return {"path": str(sub.path), "cell_timeout": options.cell_timeout,
            "timeout": options.timeout,
            "chapters": [sub.chapter] if sub.chapter is not None else None}


def grade_class(
    submissions: list[Submission],
    *,
    jobs: int | None = None,
    options: GradingOptions | None = None,
    cache: GradeCache | None = None,
    on_result: Callable[[ClassResult], None] | None = None,
) -> list[ClassResult]:
    """Grade every submission; return their results in the order given.

    Args:
        submissions: from ``submissions.find_submissions``.
        jobs: worker processes (default: the number of cores); each runs one kernel at a time.
        options: the timeouts.
        cache: earlier results; a submission whose key it holds is not graded again, and every
            new result is added to it (and saved as it arrives).
        on_result: called with each result as it is ready (cached ones first).

    Raises:
        ArgumentError: ``jobs`` is below 1.
        KeyboardInterrupt: passed on after the workers and their kernels are stopped; the
            cache keeps what was graded.
    """
    options = options or GradingOptions()
    jobs = (os.cpu_count() or 1) if jobs is None else int(jobs)
    if jobs < 1:
        raise ArgumentError(f"grade_class: jobs must be at least 1, got {jobs}")
    checks = grading_stamp()
    warnings = stamp_warnings(submissions)
    results: dict[int, ClassResult] = {}
    keys: dict[int, str] = {}

    def done(index: int, report: GradeReport, cached: bool = False) -> None:
        sub = submissions[index]
        report.notebook = str(sub.path)
        result = ClassResult(sub, report, cached, warnings.get(sub.name, ""))
        results[index] = result
        if cache is not None and not cached and index in keys:
            cache.put(sub.label, keys[index], report)
            cache.save()
        if on_result is not None:
            on_result(result)

    todo: deque[int] = deque()
    for index, sub in enumerate(submissions):
        try:
            content = sub.path.read_bytes()
        except OSError as error:
            done(index, _failed(sub, f"could not read the file: {error}"))
            continue
        keys[index] = cache_key(content, sub, options, checks)
        hit = cache.get(sub.label, keys[index]) if cache is not None else None
        if hit is not None:
            done(index, hit, cached=True)
        else:
            todo.append(index)
    if todo:
        _run_workers(submissions, todo, min(jobs, len(todo)), options, done)
    return [results[i] for i in range(len(submissions))]


def _run_workers(submissions, todo: deque, jobs: int, options: GradingOptions, done) -> None:
    context = multiprocessing.get_context("spawn")
    env = dict(THREAD_ENV)
    workers: list[_Worker] = []
    stuck_after = options.timeout + _MARGIN

    def assign(worker: _Worker) -> None:
        if todo:
            index = todo.popleft()
            worker.give(index, _task(submissions[index], options))

    try:
        for _ in range(jobs):
            workers.append(_Worker(context, env))
            assign(workers[-1])
        while any(w.task is not None for w in workers):
            busy = [w for w in workers if w.task is not None]
            waitables = [w.conn for w in busy] + [w.process.sentinel for w in busy]
            multiprocessing.connection.wait(waitables, timeout=1.0)
            for worker in busy:
                index = worker.task
                message = worker.receive()
                if message is not None:
                    worker.task, worker.kernels = None, set()
                    done(index, GradeReport.from_dict(message))
                    assign(worker)
                    continue
                crashed = not worker.process.is_alive()
                if not crashed and time.monotonic() - worker.started < stuck_after:
                    continue
                why = (f"the grading worker died (exit code {worker.process.exitcode})" if crashed
                       else f"grading took over {stuck_after:g} s; the worker was stopped")
                worker.task = None
                worker.finish(time.monotonic())  # kill it (and its kernel) if it still runs
                done(index, _failed(submissions[index], why))
                workers[workers.index(worker)] = replacement = _Worker(context, env)
                assign(replacement)
    finally:
        try:  # a second Ctrl-C must not leave the shutdown half done
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread: nothing to mask
            previous = None
        try:
            for worker in workers:
                worker.stop()
            deadline = time.monotonic() + _GRACE
            for worker in workers:
                worker.finish(deadline)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
