"""``check``: the public check cell under each exercise in a notebook.

``check("4.1", topological_sort)`` runs the exercise's probes on the answer in the notebook's own
kernel and judges their results here, prints a per-case report and returns a ``CheckResult``.
The probes' results make the same round trip through ``wire`` as under ``mlsys-lab grade``,
which runs only the probes in the student's kernel (from source it sends) and the judges in its
own process. A ``seed`` draws fresh inputs each run; a failing report shows it, so
``check(..., seed=N)`` repeats the run. Exercises live in ``mlsys_lab/grading/exercises/``.
"""


from __future__ import annotations

import json
import os
from typing import Any

from mlsys_lab.grading.core.exercise import CheckResult, get_exercise
from mlsys_lab.grading.core.judge import judge_exercise
from mlsys_lab.grading.core.probe import run_exercise

__all__ = ["check", "run_cases"]


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
