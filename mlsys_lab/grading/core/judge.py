"""The trusted side of a check: turn a probe payload into verdicts with the exercise's judges.

``judge_exercise(exercise, payload, seed)`` runs in the grader's own process under
``mlsys-lab grade`` (never in the student's kernel) and in the notebook under ``check()``. It
trusts nothing in the payload but raw results: the cases, their points and the judges come from
the registry of the process that runs it, and a case with no result or with two results fails.
"""

from __future__ import annotations

from typing import Any

from mlsys_lab.grading.core.exercise import CaseResult, CheckResult, Exercise, _takes_seed
from mlsys_lab.grading.core.wire import WireError, decode

__all__ = ["judge_exercise"]


def _fail(case, message: str) -> CaseResult:
    return CaseResult(case.name, 0, case.points, False, message)


def _judge_case(case, record: dict, seed: int) -> CaseResult:
    if record.get("kind") != "probe":
        return _fail(case, "the check sent a result of the wrong kind")
    if record.get("status") != "ok":
        return _fail(case, str(record.get("feedback") or "the check could not run"))
    try:
        raw = decode(record.get("value"))
    except WireError as error:
        return _fail(case, str(error))
    try:
        if _takes_seed(case.judge):
            case.judge(raw, seed=seed)
        else:
            case.judge(raw)
    except AssertionError as error:
        return _fail(case, str(error) or case.feedback or "check failed")
    except Exception as error:  # the judge could not make sense of the student's result
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return _fail(case, f"could not judge the result ({type(error).__name__}: {text}); "
                           f"{case.feedback or 'check the type of what you return'}")
    return CaseResult(case.name, case.points, case.points, True, "")


def judge_exercise(exercise: Exercise, payload: dict[str, Any] | None, seed: int) -> CheckResult:
    """Verdicts for every case of ``exercise`` from a probe payload (``probe.run_exercise``).

    Args:
        exercise: the exercise from *this* process's registry.
        payload: the decoded JSON payload, or None when the kernel sent none.
        seed: the seed the probes were given (the caller's own copy, not the payload's).
    """
    records = payload.get("cases") if isinstance(payload, dict) else None
    records = records if isinstance(records, list) else []
    rows = []
    for case in exercise.cases:
        found = [r for r in records if isinstance(r, dict) and r.get("name") == case.name]
        if not found:
            rows.append(_fail(case, "the check sent no result for this case"))
        elif len(found) > 1:
            rows.append(_fail(case, "the check sent two results for this case (tampering)"))
        else:
            rows.append(_judge_case(case, found[0], seed))
    score = sum(row.points for row in rows)
    seeded = any(case.seeded for case in exercise.cases)
    return CheckResult(exercise.id, exercise.title, score, exercise.max_points, rows,
                       seed=seed if seeded else None)
