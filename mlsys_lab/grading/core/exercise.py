"""Exercises as data: ``Case``, ``Exercise``, their results, the registry, and the small helpers
probes and judges share. ``checks`` (the notebook's ``check``) and the grader build on it.
"""

from __future__ import annotations

import inspect
import math
import numbers
import os
import re
import reprlib
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from mlsys_lab.grading.core.wire import OffLimitsError, Opaque, Raised, raised

_GRADING_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_short_repr = reprlib.Repr()
_short_repr.maxstring = 80
_short_repr.maxother = 80
_short_repr.maxlist = _short_repr.maxtuple = _short_repr.maxdict = 8


def _takes_seed(fn: Callable | None) -> bool:
    try:
        return fn is not None and "seed" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


@dataclass(frozen=True)
class Case:
    """One test of an answer: a probe (kernel side) and a judge (trusted side).

    Attributes:
        name: what the case tests, shown in the report (``"fib(10) == 55"``); unique within
            its exercise.
        points: points awarded when the case passes.
        feedback: what was expected, shown when the judge fails without a message of its own.
        probe: ``probe(*answers[, seed])`` -> plain data; runs the student's code, in the kernel.
        judge: ``judge(raw[, seed])``; returns ``None`` to pass, raises ``AssertionError`` to fail.
    """

    name: str
    points: float
    feedback: str = ""
    probe: Callable[..., Any] | None = field(default=None, kw_only=True)
    judge: Callable[..., None] | None = field(default=None, kw_only=True)

    def __post_init__(self):
        if self.probe is None or self.judge is None:
            raise ValueError(f"case {self.name!r} needs both a probe and a judge")

    @property
    def seeded(self) -> bool:
        """True when the probe or the judge takes a ``seed`` (fresh inputs each run)."""
        return _takes_seed(self.probe) or _takes_seed(self.judge)


#: The closed probe's base: the standard library's plain data modules (and the C modules behind
#: them), which any answer may use while a probe runs. Threads (``threading``, ``queue``) are
#: among them; process pools, ``concurrent.futures``, ``os``, ``subprocess``, ``ctypes`` and
#: every package outside the standard library are not. An entry names a module and its
#: submodules; one starting with ``-`` takes a submodule back out (the longest match wins).
CLOSED_BASE = (
    "builtins", "abc", "array", "base64", "binascii", "bisect", "cmath", "collections",
    "contextlib", "copy", "dataclasses", "datetime", "decimal", "enum", "fractions", "functools",
    "hashlib", "heapq", "itertools", "json", "math", "numbers", "operator", "pprint", "queue",
    "random", "re", "reprlib", "statistics", "string", "struct", "sys", "textwrap", "threading",
    "time", "traceback", "types", "typing", "warnings", "weakref", "zlib",
    # the C modules behind them
    "_abc", "_bisect", "_blake2", "_collections", "_collections_abc", "_datetime", "_decimal",
    "_functools", "_hashlib", "_heapq", "_json", "_md5", "_operator", "_pydecimal", "_queue",
    "_random", "_sha1", "_sha256", "_sha512", "_sha3", "_sre", "_string", "_struct", "_thread",
    "_warnings", "_weakref", "_weakrefset", "sre_compile", "sre_constants", "sre_parse",
)
#: numpy's arrays, without its bridges to other code (compilers, C libraries).
NUMPY = ("numpy", "-numpy.f2py", "-numpy.distutils", "-numpy.ctypeslib")
#: What a probe may run by default (``Exercise.allowed``): the base, numpy and the library
#: (minus the exercise's ``forbidden`` functions, which refuse on their own).
DEFAULT_ALLOWED = CLOSED_BASE + NUMPY + ("mlsys_lab",)


@dataclass(frozen=True)
class Exercise:
    """A graded exercise: an id like ``"4.1"``, a title, its cases and the name(s) it grades.

    ``target`` names the student's object(s) in the notebook namespace — one name
    (``"topological_sort"``) or a tuple of names; a name may be dotted (``"Planner.plan"``).
    The probes receive the objects in that order.

    ``forbidden`` lists the library functions that would solve the exercise, as
    ``"module:qualname"`` specs (``"mlsys_lab.engine.schedule:kahn"``,
    ``"mlsys_lab.engine.graph:Graph.dependency"``, a class for all its methods, a bare module
    for all its functions); they refuse to run while a probe runs. ``task`` completes the
    refusal "this exercise asks you to write <task> yourself" (default: the target names).

    ``allowed`` closes the probe: while it runs, calls made from the student's code may only go
    to the student's own code and to these modules (``DEFAULT_ALLOWED``: the standard library's
    plain data modules, numpy and mlsys_lab); any other module or package (scipy, torch,
    ``concurrent.futures``, ...) refuses like a forbidden function. An exercise that needs more
    lists it (``allowed=DEFAULT_ALLOWED + ("numba",)``); ``None`` leaves the probe open.
    """

    id: str
    title: str
    cases: tuple[Case, ...]
    target: str | tuple[str, ...]
    forbidden: tuple[str, ...] = ()
    task: str = ""
    allowed: tuple[str, ...] | None = DEFAULT_ALLOWED

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
    seed: int | None = None  # the seed of the inputs, when a case draws random ones
    _printed: bool = field(default=False, repr=False, compare=False)

    @property
    def passed(self) -> bool:
        """True when every case passed."""
        return all(row.passed for row in self.rows) and bool(self.rows)

    def report(self) -> str:
        """The per-case report as text (what ``check`` prints).

        Numbers in the feedback are shown compactly (``compact``). A message that several
        failed cases share is printed once: after the cases when every failed case has it
        ("5 of 6 cases failed: ..."), else as a note the cases point to ("[1]").
        """
        lines = [f"Exercise {self.exercise} — {self.title}"]
        width = max([len(row.name) for row in self.rows] + [10])
        groups = failure_groups(vars(row) for row in self.rows)
        shared = [message for message, names in groups if len(names) > 1]
        failed = sum(1 for row in self.rows if not row.passed)
        alone = len(groups) == 1 and len(shared) == 1  # every failed case has the same message
        for row in self.rows:
            mark = "✓" if row.passed else "✗"
            pts = f"{fmt_points(row.points)}/{fmt_points(row.max)}"
            line = f"  {mark} {row.name:<{width}}  {pts:>7}"
            message = compact(row.feedback) if not row.passed else ""
            if message in shared and not alone:
                line += f"  [{shared.index(message) + 1}]"
            elif message and not alone:
                line += f"  {message}"
            lines.append(line)
        if alone:
            lines.append(f"  {failed} of {len(self.rows)} cases failed: {shared[0]}")
        else:
            lines += [f"  [{k}] {message}" for k, message in enumerate(shared, 1)]
        verdict = "all cases passed" if self.passed else "keep going"
        lines.append(f"  Score: {fmt_points(self.score)}/{fmt_points(self.max)} ({verdict})")
        if not self.passed and self.seed is not None:
            lines.append(f"  (random inputs drawn with seed={self.seed}; pass seed={self.seed} to "
                         f"check to repeat them)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data, ready for ``json.dumps``."""
        return {
            "exercise": self.exercise,
            "title": self.title,
            "score": self.score,
            "max": self.max,
            "seed": self.seed,
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
        names = [case.name for case in exercise.cases]
        if len(set(names)) != len(names):
            raise ValueError(f"exercise {exercise.id} has two cases with the same name")
        EXERCISES[exercise.id] = exercise


def chapter_of(exercise_id: str) -> int:
    """The chapter number of an exercise id: ``chapter_of("4.1") == 4``."""
    match = re.match(r"(\d+)\.", str(exercise_id))
    if not match:
        raise UnknownExerciseError(f"exercise id {exercise_id!r} is not of the form '4.1'")
    return int(match.group(1))


def _load_chapter(chapter: int) -> None:
    # ``__import__`` rather than importlib: under the grader this module runs as a private copy
    # whose ``__import__`` loads the chapter from the source the grader sent.
    index = __import__("mlsys_lab.grading.exercises", fromlist=["package_of"])
    module = index.package_of(chapter)
    if module is None:
        raise UnknownExerciseError(f"chapter {chapter} has no exercise checks (no entry in "
                                   f"mlsys_lab.grading.exercises.CHAPTERS)")
    __import__(module, fromlist=["__name__"])


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


_FLOAT = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_INT = re.compile(r"(?<![\w.])[-+]?\d+(?![\w.])")
_FLAT_LIST = re.compile(r"\[([^\[\]]*)\]")
_LIST_HEAD, _LIST_TAIL = 5, 2


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)")


def _float_text(value: float, digits: int) -> str:
    short = f"{value:.{digits}g}"
    return short if set(short) & set(".en") else short + ".0"  # still reads as a float


def _short_list(match: re.Match) -> str:
    items = [item for item in re.split(r"[,\s]+", match.group(1)) if item]
    if len(items) <= _LIST_HEAD + _LIST_TAIL + 1 or not all(map(_NUMBER.fullmatch, items)):
        return match.group()
    shown = ", ".join(items[:_LIST_HEAD]) + ", …, " + ", ".join(items[-_LIST_TAIL:])
    return f"[{shown}] ({len(items)} items)"


def compact(text: str) -> str:
    """Feedback text with its numbers made short: floats to 6 significant digits
    (``0.30000000000000004 -> 0.3``; more where two different values in the message would
    otherwise read the same, as in "got 1.0000001, expected 1.0") and a long flat list or array
    of numbers summarised (``[0, 1, 2, 3, 4, …, 98, 99] (100 items)``). Other text is left as
    it is."""
    if not text:
        return text
    floats = {float(m.group()) for m in _FLOAT.finditer(text)}
    others = {float(m.group()) for m in _INT.finditer(text)} - floats
    digits = 6
    while digits < 17 and len({float(_float_text(v, digits)) for v in floats} | others) < len(
            floats | others):  # "got 9.0000009, expected 9" must not read "got 9.0, expected 9"
        digits += 1

    def short(match: re.Match) -> str:
        shorter = _float_text(float(match.group()), digits)
        return shorter if len(shorter) < len(match.group()) else match.group()

    text = _FLOAT.sub(short, text)
    return _FLAT_LIST.sub(_short_list, text)


def failure_groups(rows) -> list[tuple[str, list[str]]]:
    """The failed cases' messages, each once, in order, with the names of the cases that
    failed with it: ``[(message, [case names])]``. ``rows`` are case rows as dicts (``name``,
    ``passed``, ``feedback``); messages are compared after ``compact``."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        if not row.get("passed"):
            groups.setdefault(compact(row.get("feedback", "")), []).append(str(row.get("name")))
    return list(groups.items())


def fmt_points(points: float) -> str:
    """``3.0 -> '3'``, ``2.5 -> '2.5'``."""
    return str(int(points)) if float(points).is_integer() else f"{points:g}"


def _where_in_student_code(tb) -> str:
    """' (line 3, in fib)' for the innermost frame outside the grading package, or ''."""
    for frame in reversed(traceback.extract_tb(tb)):
        if not os.path.abspath(frame.filename).startswith(_GRADING_DIR):
            return f" (line {frame.lineno}, in {frame.name})"
    return ""


def describe_error(error: BaseException) -> str:
    """How a failed case reports an exception from the student's code: type, message, line."""
    if isinstance(error, SystemExit):
        return f"your code called sys.exit({_short_repr.repr(error.code)})"
    where = _where_in_student_code(error.__traceback__)
    try:
        text = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
    except Exception:  # the student's exception cannot print itself
        text = ""
    return f"raised {type(error).__name__}{': ' + text if text else ''}{where}"


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """For probes: ``fn(*args, **kwargs)``, or a ``Raised`` record if it raised an exception.

    Use it where raising is a legitimate answer (``mean([])`` must raise ``ValueError``); the
    judge then tests ``isinstance(raw, Raised) and raw.is_a("ValueError")``. A refusal of the
    guard is never turned into a value.
    """
    try:
        return fn(*args, **kwargs)
    except OffLimitsError:
        raise
    except Exception as error:
        return raised(error)



def _lookup(namespace: dict[str, Any], target: str) -> Any:
    head, *rest = target.split(".")
    if head not in namespace:
        raise NameError(f"`{head}` is not defined — did you run the cell with your answer?")
    obj = namespace[head]
    for attr in rest:
        obj = getattr(obj, attr)
    return obj





# ----------------------------------------------------------------------------- helpers for cases


def plain(value: Any) -> Any:
    """numpy scalars in a result as Python numbers (lists, tuples and dicts walked through), so
    a judge compares numbers with numbers."""
    if isinstance(value, np.generic):
        return value.item()
    if type(value) is list:
        return [plain(v) for v in value]
    if type(value) is tuple:
        return tuple(plain(v) for v in value)
    if type(value) is dict:
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def describe(value: Any) -> str:
    """``"int 3"``, ``"Liar <Liar object>"``, ``"an exception (...)"``: for judges' messages."""
    if isinstance(value, Opaque):
        return f"{value.type_name} {value.text}"
    if isinstance(value, Raised):
        return f"an exception ({value})"
    return f"{type(value).__name__} {_short_repr.repr(value)}"


def expect_equal(actual: Any, expected: Any, what: str) -> None:
    """Assert ``actual == expected`` with a readable message.

    Numbers are compared as numbers (a ``bool`` or an object whose ``__eq__`` always returns
    True does not pass for an ``int``), sequences element by element.
    """
    if isinstance(expected, numbers.Number) and not isinstance(expected, bool):
        if isinstance(actual, bool) or not isinstance(actual, numbers.Number):
            raise AssertionError(f"{what} should be a number, got {describe(actual)}")
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
        raise AssertionError(f"{what} should be a number, got {describe(actual)}")
    if not math.isclose(float(actual), expected, rel_tol=rel, abs_tol=abs_):
        raise AssertionError(f"{what} returned {actual!r}, expected {expected!r}")


def expect_list(raw: Any, length: int, what: str) -> list:
    """For judges: ``raw`` as a list of ``length`` results, else an ``AssertionError`` naming
    ``what`` and what came back instead."""
    if not isinstance(raw, list) or len(raw) != length:
        raise AssertionError(f"{what}: expected {length} results, got {describe(raw)}")
    return raw


def expect_each_raised(fn_name: str, calls: Sequence[tuple], raw: Any, error: str = "ValueError",
                       why: str = "") -> None:
    """For judges of argument checks: ``raw`` is a probe's ``[attempt(fn, *args) for args in
    calls]``; each entry must be a ``Raised`` of ``error`` (or a subclass), else the message
    names the call, what it gave and ``why``."""
    got_all = raw if isinstance(raw, list) and len(raw) == len(calls) else [None] * len(calls)
    for args, got in zip(calls, got_all):
        if not (isinstance(got, Raised) and got.is_a(error)):
            shown = ", ".join(repr(a) for a in args)
            gave = f"raised {got}" if isinstance(got, Raised) else f"gave {describe(got)}"
            raise AssertionError(f"{fn_name}({shown}) {gave}; raise {error}"
                                 + (f" ({why})" if why else ""))


# ----------------------------------------------------------------------------- check cells in Lab

_CHECK_IN_LINE = re.compile(r"\bcheck\s*\(\s*(?:['\"](\d+\.\d+[a-z]?)['\"])?")


def check_cell_name_error(error: NameError, line: str) -> str:
    """What to tell a student whose check cell (``line``, the statement that raised) names an
    answer that is not defined yet, or ``""`` when ``line`` is no ``check(...)`` call or the
    missing name is not in it. A check cell run before its answer cell fails this way."""
    name = getattr(error, "name", None)
    match = _CHECK_IN_LINE.search(line or "")
    if not name or not match or not re.search(rf"(?<![\w.]){re.escape(name)}\b", line):
        return ""
    if name == "check":
        return ("run the notebook's first code cell first: it imports check (name 'check' is "
                "not defined)")
    exercise = f" of {match.group(1)}" if match.group(1) else ""
    return f"run the answer cell{exercise} above first (name {name!r} is not defined)"


def _name_error_handler(shell, etype, value, tb, tb_offset=None):
    """IPython's handler of a ``NameError`` in a cell: a check cell's missing answer is told
    as "run the answer cell above first"; anything else gets IPython's usual traceback."""
    frames = traceback.extract_tb(tb)
    last = frames[-1] if frames else None
    line = last.line if last is not None and last.name == "<module>" else ""
    message = check_cell_name_error(value, line or "")
    if not message:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset, running_compiled_code=True)
        return None
    shell._showtraceback(etype, NameError(message), [f"NameError: {message}"])
    return None


def install_check_cell_hint() -> bool:
    """In an IPython kernel, report a check cell run before its answer cell in plain words
    ("run the answer cell of 9.1 above first (name 'parallel_map' is not defined)") instead of a
    bare ``NameError`` traceback. Done when the notebook imports ``check``; a no-op outside
    IPython, or when the notebook has its own handler of exceptions. Returns True if installed.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    current = tuple(getattr(shell, "custom_exceptions", ()) or ())
    if current and current != (NameError,):
        return False  # someone else's handler: leave it
    shell.set_custom_exc((NameError,), _name_error_handler)
    return True


def _imported_for_real() -> bool:
    """True when this is the module in ``sys.modules``, not the grader's private copy."""
    module = sys.modules.get(__name__)
    return module is not None and module.__dict__ is globals()


if _imported_for_real():
    install_check_cell_hint()
