"""Exercise checks as data: cases, exercises, a registry, and the ``check`` a notebook calls.

An *exercise* (``Exercise``) is a list of *cases* (``Case``). Each case has two halves:

* a **probe**, ``probe(*answers)`` (or ``probe(*answers, seed=...)``), which runs in the student's
  kernel: it calls the student's function(s) on the case's inputs and returns what came back as
  plain data (numbers, strings, lists, tuples, dicts, numpy arrays; see ``wire``);
* a **judge**, ``judge(raw)`` (or ``judge(raw, seed=...)``), which runs wherever the verdict is
  trusted — in the grader's own process under ``mlsys-lab grade`` — and compares ``raw`` with a
  reference it computes itself. It returns ``None`` to pass or raises ``AssertionError`` whose
  message says what was expected.

While a probe runs, the exercise's ``forbidden`` functions (and the grader's own reference
answers) refuse to run (``guard``). An exception from the student's code is reported as its type,
message and line, never as a long traceback. A ``seed`` draws fresh inputs each run (``check``
shows it when a case fails, so ``check(..., seed=N)`` repeats the run).

Chapter modules ``mlsys_lab/grading/chNN.py`` define their exercises and ``register`` them; they
are imported lazily, the first time an exercise id of that chapter is asked for ('4.1' imports
``mlsys_lab.grading.ch04``). ``ch00.py`` is the template.

Two entry points use the cases:

* ``check("4.1", topological_sort)`` — the public check cell under each exercise: probe and
  judge both run in the notebook's kernel; prints a per-case report, returns a ``CheckResult``.
* ``mlsys-lab grade`` — runs only the probes in the student's kernel (from source the grader
  sends, so nothing the notebook patched is used) and the judges in its own process.

Old-style cases, ``Case(name, points, fn)`` where ``fn(*answers)`` computes the verdict itself,
still work but are *legacy*: their verdict comes from the kernel, so the grader cannot trust it
(``Case.legacy``; ``legacy_cases()`` lists them). Convert them to probe/judge pairs.
"""


from __future__ import annotations

import json
import os
import sys
from typing import Any

from mlsys_lab.grading.exercise import (  # noqa: F401 - the exercise records are public here too
    CLOSED_BASE,
    DEFAULT_ALLOWED,
    EXERCISES,
    MARKER,
    Case,
    CaseResult,
    CheckResult,
    Exercise,
    UnknownExerciseError,
    _lookup,
    attempt,
    chapter_of,
    describe,
    describe_error,
    exercises_for_chapter,
    expect_close,
    expect_equal,
    fmt_points,
    get_exercise,
    legacy_cases,
    plain,
    register,
)
from mlsys_lab.grading.judge import judge_exercise
from mlsys_lab.grading.probe import run_exercise
from mlsys_lab.grading.wire import Opaque, Raised, raised  # noqa: F401 - public here too

__all__ = [
    "CLOSED_BASE",
    "Case",
    "DEFAULT_ALLOWED",
    "attempt",
    "CaseResult",
    "CheckResult",
    "EXERCISES",
    "Exercise",
    "MARKER",
    "Opaque",
    "Raised",
    "UnknownExerciseError",
    "chapter_of",
    "check",
    "describe",
    "plain",
    "describe_error",
    "exercises_for_chapter",
    "expect_close",
    "expect_equal",
    "get_exercise",
    "legacy_cases",
    "register",
    "run_cases",
    "run_cases_json",
]


def run_cases(exercise_id: str, *answers: Any, seed: int | None = None) -> CheckResult:
    """Probe and judge every case of an exercise here, on the given answer object(s).

    Prints nothing. The probes' results make the same round trip through the wire as under
    the grader, so the judges see exactly what they would see there.
    """
    exercise = get_exercise(exercise_id)
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") % 1_000_000
    if len(answers) != len(exercise.targets):
        wanted = ", ".join(exercise.targets)
        message = f"check({exercise.id!r}, ...) expects {len(exercise.targets)} answer(s): {wanted}"
        payload = run_exercise(exercise, message, seed)
    else:
        payload = run_exercise(exercise, answers, seed)
    payload = json.loads(json.dumps(payload))
    return judge_exercise(exercise, payload, seed)


def check(exercise_id: str, *answer: Any, seed: int | None = None) -> CheckResult:
    """Check an answer in the notebook: print a per-case report and return the result.

    Args:
        exercise_id: the exercise, ``"4.1"``.
        *answer: the object(s) the exercise grades, in the order of its ``target``.
        seed: repeat a run's random inputs (a failing report shows its seed); default: fresh.

    Example:
        >>> check("0.1", square)          # doctest: +SKIP
        Exercise 0.1 — Square a number
          ✓ square(3) == 9            1/1
          ...
    """
    result = run_cases(exercise_id, *answer, seed=seed)
    print(result.report())
    result._printed = True
    return result



def run_cases_json(exercise_id: str, namespace: dict[str, Any], marker: str = MARKER) -> dict:
    """Check the answer found in ``namespace`` here and print the result as one JSON line.

    The verdict is computed in this process (probe and judge both), so it is only as
    trustworthy as the process; ``mlsys-lab grade`` does not use it. It never raises for a bad
    answer: a missing name, a wrong answer or an exception all become failed cases.
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
