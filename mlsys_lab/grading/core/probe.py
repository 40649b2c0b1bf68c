"""The kernel side of a check: run an exercise's probes under the guard and pack what they saw.

``run_exercise`` is used by ``check()`` in the notebook and, through ``emit``, by the grader's
hidden cell. Under the grader this module (with ``checks``, ``guard``, ``wire`` and the chapter
module) is not imported from ``sys.modules``: the grader sends its source and the hidden cell
runs it as a private copy, so nothing an answer cell patched or replaced in the kernel is used.
The payload holds raw results only; verdicts come from the judges (``judge.judge_exercise``).

One record per case::

    {"name": ..., "kind": "probe", "status": "ok", "value": <wire data>}
    {"name": ..., "kind": "probe", "status": "error", "feedback": "raised ValueError: ..."}
"""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from mlsys_lab.grading.core.exercise import _lookup, _takes_seed, describe_error, get_exercise
from mlsys_lab.grading.core.guard import (
    Guard,
    OffLimitsError,
    decoded_plan,
    find_seal,
    plan_for,
    tampered,
)
from mlsys_lab.grading.core.wire import MAX_BYTES, WireError, encode

__all__ = ["MIME", "emit", "references_cell", "run_exercise", "seal_cell"]

#: The display-data type that carries a payload from the kernel to the grader.
MIME = "application/vnd.mlsys-lab.probe+json"


def _probe_case(case, answers: Sequence[Any], seed: int, guard: Guard, dumps=json.dumps) -> dict:
    record = {"name": case.name, "kind": "probe"}
    error: BaseException | None = None
    data = None
    seeded = _takes_seed(case.probe)  # (the grader's function: asked before the guard is on)
    try:
        with guard.watching():
            value = case.probe(*answers, seed=seed) if seeded else case.probe(*answers)
            data = encode(value)  # student objects' __repr__ runs here: keep it guarded
    except KeyboardInterrupt:
        raise
    except BaseException as caught:  # the student's code raised, or called sys.exit
        error = caught
    if guard.violations:
        return {**record, "status": "error", "feedback": guard.violations[0]}
    if isinstance(error, WireError):
        return {**record, "status": "error", "feedback": f"could not send the result: {error}"}
    if isinstance(error, OffLimitsError):  # raised, but not recorded: cannot happen; be safe
        return {**record, "status": "error", "feedback": str(error)}
    if error is not None:
        return {**record, "status": "error", "feedback": describe_error(error)}
    size = len(dumps(data))
    if size > MAX_BYTES:
        feedback = (f"the result is too large to send to the grader ({size / 2**20:.0f} MiB; "
                    f"at most {MAX_BYTES / 2**20:.0f} MiB)")
        return {**record, "status": "error", "feedback": feedback}
    return {**record, "status": "ok", "value": data}


def run_exercise(exercise, answers: Sequence[Any] | str, seed: int, plan: dict | None = None,
                 state: dict | None = None):
    """Run every case's probe on the answers; return the payload dict.

    Args:
        exercise: the ``Exercise``.
        answers: the student's object(s), or a message saying why they could not be found.
        seed: passed to probes that take one.
        plan: the guard plan (the grader sends its own); default: computed here.
        state: the seal the grader recorded before the notebook ran (``guard.seal``): what the
            guard trusts, and what must not have changed before and after the probes run (a
            change fails every case). Default: ``check()``'s own, without that comparison.
    """
    records = []
    guard = None
    dumps = json.dumps
    if state is not None:
        encoder = state["encoder"](ensure_ascii=True, allow_nan=False)
        dumps = encoder.encode
        changed = tampered(state)
        if changed:
            answers = _tamper_message(changed)
    if not isinstance(answers, str):
        guard = Guard(plan if plan is not None else plan_for(exercise), state,
                      trusted=[case.probe for case in exercise.cases])
    for case in exercise.cases:
        if isinstance(answers, str):
            records.append({"name": case.name, "kind": "probe", "status": "error",
                            "passed": False, "feedback": answers})
        else:
            records.append(_probe_case(case, answers, seed, guard, dumps))
    if state is not None and not isinstance(answers, str):
        changed = tampered(state)  # the probes ran the student's code: look again
        if changed:
            message = _tamper_message(changed)
            records = [{"name": r["name"], "kind": r["kind"], "status": "error", "passed": False,
                        "feedback": message} for r in records]
    return {"exercise": exercise.id, "seed": seed, "cases": records}


def _tamper_message(changed: list[str]) -> str:
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return (f"your notebook changed {', '.join(changed[:3])}{more}, which the check relies on; "
            f"the check cannot trust this result")


def seal_cell(key: str, exercise_ids: Sequence[str]) -> str:
    """The source of the grader's first cell in a kernel: ``guard.seal(key, exercise_ids)``, run
    before any student cell (from the kernel's own, still untouched, grading modules)."""
    return _grader_cell("seal", f"guard.seal({key!r}, {list(map(str, exercise_ids))!r})")


def references_cell(key: str, references: str) -> str:
    """The source of the grader's second cell: ``guard.seal_references(key, references)`` (the
    JSON text of ``guard.reference_plan()``, which every plan the hidden cells carry names by
    digest), still before any student cell."""
    return _grader_cell("references", f"guard.seal_references({key!r}, {references!r})")


def _grader_cell(name: str, call: str) -> str:
    return (f"def __mlsys_lab_{name}():\n"
            "    import mlsys_lab.grading.core.guard as guard\n"
            f"    {call}\n\n\n"
            f"try:\n    __mlsys_lab_{name}()\nfinally:\n    del __mlsys_lab_{name}\n")


def emit(exercise_id: str, namespace: dict, seed: int, marker: str, plan: dict | str,
         key: str | None = None) -> None:
    """Probe the answer in ``namespace`` and publish the payload for the grader (its hidden cell).

    The payload goes out as one display-data message of type ``MIME`` carrying ``marker`` (the
    grader's fresh secret for this step), never as printed text. ``key`` names the seal the
    grader's first cell recorded (``seal_cell``); the plan's JSON text (what the hidden cell
    gets) is then decoded with the JSON decoder the seal holds (once per kernel,
    ``guard.decoded_plan``), and the payload written with its encoder and sent with its
    publisher, not the kernel's current ones.
    """
    state = find_seal(key) if key is not None else None
    try:
        if isinstance(plan, str):
            plan = decoded_plan(state, plan)
        exercise = get_exercise(exercise_id)
        try:
            answers: Sequence[Any] | str = [_lookup(namespace, t) for t in exercise.targets]
        except Exception as error:  # a missing name, or a dotted attribute that isn't there
            answers = str(error)
        if key is not None and state is None:
            answers = ("the grader's record of this kernel is gone (your notebook removed or "
                       "replaced it); the check cannot trust this result")
        payload = run_exercise(exercise, answers, seed, plan, state)
    except Exception as error:  # an unknown exercise; the grader reports it
        payload = {"exercise": str(exercise_id), "error": f"{type(error).__name__}: {error}"}
    payload["marker"] = marker
    if state is not None:
        text = state["encoder"](ensure_ascii=True, allow_nan=False).encode(payload)
        publish_display_data = state["publish"]
    else:
        text = json.dumps(payload, ensure_ascii=True, allow_nan=False)
        try:
            from IPython.display import publish_display_data
        except ImportError:  # not in a Jupyter kernel: print it instead
            publish_display_data = None
    if publish_display_data is None or not _in_kernel():
        sys.stdout.write(f"\n{marker}{text}\n")
    else:
        publish_display_data({MIME: text})


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    return get is not None and get() is not None and hasattr(get(), "kernel")
