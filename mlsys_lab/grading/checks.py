"""Exercise checks as data: cases, exercises, a registry, and the ``check`` a notebook calls.

An *exercise* (``Exercise``) is a list of *cases* (``Case``). A case is a small function that
receives the student's answer object(s) and either returns ``None`` (passed) or raises
``AssertionError`` whose message says what was expected (failed). Any other exception comes from
the student's code and is reported as its type and message, never as a long traceback.

Chapter modules ``mlsys_lab/grading/chNN.py`` define their exercises and ``register`` them; they
are imported lazily, the first time an exercise id of that chapter is asked for ('4.1' imports
``mlsys_lab.grading.ch04``). Every case holds its own reference (a reference function or
expected data inside the mlsys_lab package), so nothing a student writes into the notebook
namespace can change what counts as right.

Two entry points use the cases:

* ``check("4.1", topological_sort)`` — the public check cell under each exercise; prints a
  readable per-case report and returns a ``CheckResult``.
* ``run_cases_json("4.1", globals(), marker)`` — what the grader's hidden cell calls inside the
  student's kernel; prints one JSON line, prefixed by a marker, for the grader to parse.
"""

from __future__ import annotations

import importlib
import json
import math
import numbers
import os
import re
import reprlib
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = [
    "Case",
    "CaseResult",
    "CheckResult",
    "EXERCISES",
    "Exercise",
    "MARKER",
    "UnknownExerciseError",
    "chapter_of",
    "check",
    "exercises_for_chapter",
    "expect_close",
    "expect_equal",
    "get_exercise",
    "register",
    "run_cases",
    "run_cases_json",
]

#: Default prefix of the line ``run_cases_json`` prints (the grader passes its own random one).
MARKER = "__MLSYS_LAB_GRADE__"

_GRADING_DIR = os.path.dirname(os.path.abspath(__file__))
_short_repr = reprlib.Repr()
_short_repr.maxstring = 80
_short_repr.maxother = 80
_short_repr.maxlist = _short_repr.maxtuple = _short_repr.maxdict = 8


@dataclass(frozen=True)
class Case:
    """One test of an answer.

    Attributes:
        name: what the case tests, shown in the report (``"fib(10) == 55"``).
        points: points awarded when the case passes.
        fn: ``fn(*answers)``; returns ``None`` to pass, raises ``AssertionError`` to fail.
        feedback: what was expected, shown when ``fn`` fails without a message of its own.
    """

    name: str
    points: float
    fn: Callable[..., None]
    feedback: str = ""


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: an id like ``"4.1"``, a title, its cases and the name(s) it grades.

    ``target`` names the student's object(s) in the notebook namespace — one name
    (``"topological_sort"``) or a tuple of names; a name may be dotted (``"Planner.plan"``).
    The cases receive the objects in that order.
    """

    id: str
    title: str
    cases: tuple[Case, ...]
    target: str | tuple[str, ...]

    @property
    def targets(self) -> tuple[str, ...]:
        """The target names as a tuple."""
        return (self.target,) if isinstance(self.target, str) else tuple(self.target)

    @property
    def max_points(self) -> float:
        """Total points of all cases."""
        return sum(case.points for case in self.cases)


@dataclass
class CaseResult:
    """The outcome of one case: passed or not, points earned, and feedback when it failed."""

    name: str
    points: float
    max: float
    passed: bool
    feedback: str = ""


@dataclass
class CheckResult:
    """The outcome of checking one exercise: ``score`` out of ``max``, one row per case."""

    exercise: str
    title: str
    score: float
    max: float
    rows: list[CaseResult] = field(default_factory=list)
    _printed: bool = field(default=False, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """True when every case passed."""
        return all(row.passed for row in self.rows) and bool(self.rows)

    def report(self) -> str:
        """The per-case report as text (what ``check`` prints)."""
        lines = [f"Exercise {self.exercise} — {self.title}"]
        width = max([len(row.name) for row in self.rows] + [10])
        for row in self.rows:
            mark = "✓" if row.passed else "✗"
            pts = f"{fmt_points(row.points)}/{fmt_points(row.max)}"
            line = f"  {mark} {row.name:<{width}}  {pts:>7}"
            if not row.passed and row.feedback:
                line += f"  {row.feedback}"
            lines.append(line)
        verdict = "all cases passed" if self.passed else "keep going"
        lines.append(f"  Score: {fmt_points(self.score)}/{fmt_points(self.max)} ({verdict})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, ready for ``json.dumps``."""
        return {
            "exercise": self.exercise,
            "title": self.title,
            "score": self.score,
            "max": self.max,
            "rows": [vars(row).copy() for row in self.rows],
        }

    def _ipython_display_(self) -> None:
        # ``check`` has already printed the report; showing the returned object as the cell's
        # Out[] would repeat it. Displayed later on its own (``result``), it shows the report.
        if not self._printed:
            print(self.report())
        self._printed = False


class UnknownExerciseError(KeyError):
    """No exercise has this id (or its chapter module does not exist)."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0]) if self.args else ""


#: Every registered exercise by id; filled by the chapter modules as they are imported.
EXERCISES: dict[str, Exercise] = {}


def register(*exercises: Exercise) -> None:
    """Add exercises to the registry (chapter modules call this at import time)."""
    for exercise in exercises:
        if not re.fullmatch(r"\d+\.\d+[a-z]?", exercise.id):
            raise ValueError(f"exercise id {exercise.id!r} is not of the form '4.1'")
        if not exercise.cases:
            raise ValueError(f"exercise {exercise.id} has no cases")
        EXERCISES[exercise.id] = exercise


def chapter_of(exercise_id: str) -> int:
    """The chapter number of an exercise id: ``chapter_of("4.1") == 4``."""
    match = re.match(r"(\d+)\.", str(exercise_id))
    if not match:
        raise UnknownExerciseError(f"exercise id {exercise_id!r} is not of the form '4.1'")
    return int(match.group(1))


def _load_chapter(chapter: int) -> None:
    module = f"mlsys_lab.grading.ch{chapter:02d}"
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name != module:  # the chapter module exists but one of its imports is missing
            raise
        raise UnknownExerciseError(
            f"chapter {chapter} has no exercise checks (no module {module})"
        ) from None


def get_exercise(exercise_id: str) -> Exercise:
    """The registered exercise with this id, importing its chapter module if needed.

    Raises:
        UnknownExerciseError: (a ``KeyError``) when the chapter or the exercise does not exist.
    """
    exercise_id = str(exercise_id)
    if exercise_id not in EXERCISES:
        chapter = chapter_of(exercise_id)
        _load_chapter(chapter)
        if exercise_id not in EXERCISES:
            known = ", ".join(e.id for e in exercises_for_chapter(chapter)) or "none"
            raise UnknownExerciseError(
                f"no exercise {exercise_id!r} in chapter {chapter} (known: {known})"
            )
    return EXERCISES[exercise_id]


def _id_key(exercise_id: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", exercise_id) if p)


def exercises_for_chapter(chapter: int) -> list[Exercise]:
    """All exercises of a chapter, in id order (``4.2`` before ``4.10``)."""
    try:
        _load_chapter(chapter)
    except UnknownExerciseError:
        return []
    found = [e for e in EXERCISES.values() if chapter_of(e.id) == chapter]
    return sorted(found, key=lambda e: _id_key(e.id))


# ----------------------------------------------------------------------------- running cases


def fmt_points(points: float) -> str:
    """``3.0 -> '3'``, ``2.5 -> '2.5'``."""
    return str(int(points)) if float(points).is_integer() else f"{points:g}"


def _where_in_student_code(tb) -> str:
    """' (line 3, in fib)' for the innermost frame outside the grading package, or ''."""
    for frame in reversed(traceback.extract_tb(tb)):
        if not os.path.abspath(frame.filename).startswith(_GRADING_DIR):
            return f" (line {frame.lineno}, in {frame.name})"
    return ""


def _run_case(case: Case, answers: Sequence[Any]) -> CaseResult:
    try:
        case.fn(*answers)
    except AssertionError as error:
        message = str(error) or case.feedback or "check failed"
        return CaseResult(case.name, 0, case.points, False, message)
    except (KeyboardInterrupt, SystemExit) as error:
        # Ctrl-C (or the grader's interrupt) must stop the check; sys.exit() in an answer is a
        # failure of that case only.
        if isinstance(error, KeyboardInterrupt):
            raise
        message = f"your code called sys.exit({_short_repr.repr(error.code)})"
        return CaseResult(case.name, 0, case.points, False, message)
    except Exception as error:  # the student's code raised: report type and message only
        where = _where_in_student_code(error.__traceback__)
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        message = f"raised {type(error).__name__}{': ' + text if text else ''}{where}"
        return CaseResult(case.name, 0, case.points, False, message)
    return CaseResult(case.name, case.points, case.points, True, "")


def run_cases(exercise_id: str, *answers: Any) -> CheckResult:
    """Run every case of an exercise on the given answer object(s); print nothing."""
    exercise = get_exercise(exercise_id)
    if len(answers) != len(exercise.targets):
        wanted = ", ".join(exercise.targets)
        message = f"check({exercise.id!r}, ...) expects {len(exercise.targets)} answer(s): {wanted}"
        rows = [CaseResult(c.name, 0, c.points, False, message) for c in exercise.cases]
    else:
        rows = [_run_case(case, answers) for case in exercise.cases]
    score = sum(row.points for row in rows)
    return CheckResult(exercise.id, exercise.title, score, exercise.max_points, rows)


def check(exercise_id: str, *answer: Any) -> CheckResult:
    """Check an answer in the notebook: print a per-case report and return the result.

    Example:
        >>> check("0.1", square)          # doctest: +SKIP
        Exercise 0.1 — Square a number
          ✓ square(3) == 9            1/1
          ...
    """
    result = run_cases(exercise_id, *answer)
    print(result.report())
    result._printed = True
    return result


def _lookup(namespace: dict[str, Any], target: str) -> Any:
    head, *rest = target.split(".")
    if head not in namespace:
        raise NameError(f"`{head}` is not defined — did you run the cell with your answer?")
    obj = namespace[head]
    for attr in rest:
        obj = getattr(obj, attr)
    return obj


def run_cases_json(exercise_id: str, namespace: dict[str, Any], marker: str = MARKER) -> dict:
    """Grade the answer found in ``namespace`` and print it as one JSON line after ``marker``.

    The grader calls this from a hidden cell in the student's kernel, with the notebook's
    ``globals()``. It never raises for a bad answer: a missing name, a wrong answer or an
    exception in the student's code all become failed cases with feedback.
    """
    try:
        exercise = get_exercise(exercise_id)
        try:
            answers = [_lookup(namespace, name) for name in exercise.targets]
        except Exception as error:  # missing name, or a dotted attribute that isn't there
            message = str(error)
            rows = [CaseResult(c.name, 0, c.points, False, message) for c in exercise.cases]
            result = CheckResult(exercise.id, exercise.title, 0, exercise.max_points, rows)
        else:
            result = run_cases(exercise_id, *answers)
        payload = result.to_dict()
    except UnknownExerciseError as error:
        payload = {"exercise": str(exercise_id), "error": str(error)}
    line = json.dumps(payload, ensure_ascii=True, allow_nan=False, default=str)
    # Start on a fresh line even if the student's code printed without a newline.
    sys.stdout.write(f"\n{marker}{line}\n")
    sys.stdout.flush()
    return payload


# ----------------------------------------------------------------------------- helpers for cases


def expect_equal(actual: Any, expected: Any, what: str) -> None:
    """Assert ``actual == expected`` with a readable message.

    Numbers are compared as numbers (a ``bool`` or an object whose ``__eq__`` always returns
    True does not pass for an ``int``), sequences element by element.
    """
    if isinstance(expected, numbers.Number) and not isinstance(expected, bool):
        if isinstance(actual, bool) or not isinstance(actual, numbers.Number):
            raise AssertionError(
                f"{what} should be a number, got {type(actual).__name__} {_short_repr.repr(actual)}"
            )
        ok = bool(actual == expected)
    elif isinstance(expected, (list, tuple)):
        ok = isinstance(actual, (list, tuple)) and len(actual) == len(expected)
        pairs = zip(actual, expected, strict=False)
        ok = ok and all(type(a) is type(b) and bool(a == b) for a, b in pairs)
    else:
        ok = type(actual) is type(expected) and bool(actual == expected)
    if not ok:
        raise AssertionError(
            f"{what} returned {_short_repr.repr(actual)}, expected {_short_repr.repr(expected)}"
        )


def expect_close(actual: Any, expected: float, what: str, rel: float = 1e-9, abs_: float = 1e-12):
    """Assert a number is within tolerance of ``expected`` with a readable message."""
    if isinstance(actual, bool) or not isinstance(actual, numbers.Real):
        raise AssertionError(
            f"{what} should be a number, got {type(actual).__name__} {_short_repr.repr(actual)}"
        )
    if not math.isclose(float(actual), expected, rel_tol=rel, abs_tol=abs_):
        raise AssertionError(f"{what} returned {actual!r}, expected {expected!r}")
