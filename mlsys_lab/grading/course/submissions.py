"""Find a class's submissions in a folder: who handed in what.

``find_submissions(folder)`` recognises the layouts teachers receive:

* one notebook per student: ``alice.ipynb``, ``alice_ch04.ipynb``;
* one folder per student: ``alice/ch04_computational_graph.ipynb`` (the student is the folder);
* LMS downloads: ``alice_12345_ch04.ipynb``, ``alice_late_12345_67890_ch04_graph.ipynb``
  (Canvas puts a user id and a submission id after the name; the id is kept as ``student_id``).

The assignment is the chapter named in the file name (``ch04``, ``chapter4``, ``04_…``), or
``""`` when the name gives none (the grader then takes the chapter from the notebook). A
``pattern`` — a regular expression with the named groups ``student`` and, optionally,
``assignment`` and ``id``, matched against the path relative to the folder — overrides the rules:
``r"(?P<student>[^/]+)/hw(?P<assignment>\\d+)\\.ipynb"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from mlsys_lab.errors import ArgumentError

__all__ = ["Submission", "find_submissions"]

_CHAPTER = re.compile(r"(?:^|(?<=[^a-z0-9]))ch(?:apter)?[_\- ]?(\d{1,2})(?![0-9])", re.I)
_LEADING = re.compile(r"^(\d{1,2})_")
_LMS = re.compile(r"^(?P<student>.+?)_(?:late_)?(?P<id>\d{3,})(?:_\d+)*_(?P<rest>.+)$", re.I)


@dataclass(frozen=True)
class Submission:
    """One notebook handed in: the file, whose it is and for which assignment."""

    path: Path  # as found: the folder joined with ``name``
    student: str
    assignment: str = ""  # "ch04", or "" when the file name names no chapter
    student_id: str = ""
    name: str = ""  # the path relative to the class folder, with "/"

    @property
    def chapter(self) -> int | None:
        """The assignment's chapter number, or None."""
        return int(self.assignment[2:]) if self.assignment.startswith("ch") else None

    @property
    def label(self) -> str:
        """The name it was found under in the class folder, else its path: what the re-grade
        cache files it under and the gradebook lists."""
        return self.name or str(self.path)

    @property
    def key(self) -> str:
        """``student/assignment``: what identifies a submission in a gradebook."""
        return f"{self.student}/{self.assignment or '?'}"


def _assignment(text: str) -> str:
    match = _CHAPTER.search(text) or _LEADING.match(text)
    return f"ch{int(match.group(1)):02d}" if match else ""


def _without_chapter(stem: str) -> str:
    """``alice_ch04_graph`` -> ``alice``: the name before the chapter token."""
    match = _CHAPTER.search(stem)
    if not match or match.start() == 0:
        return stem
    return stem[: match.start()].rstrip("_- ") or stem


def _by_rules(rel: Path) -> Submission | None:
    parts = rel.parts
    if len(parts) >= 2:  # one folder per student
        return Submission(rel, parts[0], _assignment(rel.name))
    stem = rel.stem
    lms = _LMS.match(stem)
    if lms and _assignment(lms.group("rest")):
        return Submission(rel, lms.group("student"), _assignment(lms.group("rest")),
                          lms.group("id"))
    return Submission(rel, _without_chapter(stem), _assignment(stem))


def _by_pattern(rel: Path, pattern: re.Pattern) -> Submission | None:
    match = pattern.fullmatch(rel.as_posix())
    if not match:
        return None
    groups = match.groupdict()
    assignment = groups.get("assignment") or ""
    if assignment:
        assignment = _assignment(assignment) or (
            f"ch{int(assignment):02d}" if assignment.isdigit() else assignment)
    else:
        assignment = _assignment(rel.name)
    return Submission(rel, groups["student"], assignment, groups.get("id") or "")


def find_submissions(folder: str | Path, pattern: str | None = None
                     ) -> tuple[list[Submission], list[Path]]:
    """The submissions under ``folder``, and the notebooks skipped (relative to ``folder``).

    Hidden folders and ``.ipynb_checkpoints`` are ignored. With ``pattern``, a notebook whose
    relative path does not match is skipped (and listed as such).

    Raises:
        ArgumentError: ``folder`` is not a folder, or ``pattern`` is not a regular expression
            with a ``student`` group.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ArgumentError(f"grade --all: no such folder: {folder}")
    compiled = None
    if pattern is not None:
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise ArgumentError(f"grade --pattern: {pattern!r} is not a regular expression "
                                f"({error})") from None
        if "student" not in compiled.groupindex:
            raise ArgumentError(f"grade --pattern: {pattern!r} has no (?P<student>...) group")
    found, skipped = [], []
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts[:-1]) or rel.name.startswith("."):
            continue
        sub = _by_pattern(rel, compiled) if compiled is not None else _by_rules(rel)
        if sub is None:
            skipped.append(rel)
        else:
            found.append(replace(sub, path=path, name=rel.as_posix()))
    return found, skipped
