"""The gradebook of a class: one row per student, one column per exercise, plus the total.

``build_gradebook(results)`` merges a student's submissions (one per assignment; of two for the
same assignment the newer file counts, and the row says so). ``write_csv`` / ``read_csv`` round
trip it: points are written as numbers, a missing exercise as an empty cell, and a text cell
that a spreadsheet would run as a formula (``=…``, ``+…``, ``-…``, ``@…``) is written with a
leading ``'`` that ``read_csv`` removes.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlsys_lab.grading.core.exercise import fmt_points
from mlsys_lab.grading.course.classroom import ClassResult

__all__ = ["Gradebook", "build_gradebook", "counted", "read_csv", "write_csv"]

_FIXED = ("student", "student_id", "submissions")
_TAIL = ("total", "max", "notes")
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def _id_key(exercise_id: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", exercise_id) if p)


def counted(results: list[ClassResult]) -> tuple[list[ClassResult], list[tuple[str, str]]]:
    """The results that count (the newest file per student and assignment), and
    ``(student, note)`` for each one left out."""
    best: dict[tuple[str, str], ClassResult] = {}
    notes = []
    for result in results:
        sub = result.submission
        key = (sub.student, sub.assignment or sub.name)
        other = best.get(key)
        if other is None:
            best[key] = result
            continue
        newer, older = sorted([other, result], key=_mtime, reverse=True)
        best[key] = newer
        notes.append((sub.student, f"{sub.student} handed in {older.submission.name} and "
                     f"{newer.submission.name} for {sub.assignment or 'the same assignment'}; "
                     f"the newer {newer.submission.name} counts"))
    kept = set(map(id, best.values()))
    return [r for r in results if id(r) in kept], notes


def _mtime(result: ClassResult) -> float:
    try:
        return result.submission.path.stat().st_mtime
    except OSError:
        return 0.0


@dataclass
class Gradebook:
    """Exercise ids (the columns, in id order) and one row per student (plain dicts)."""

    exercises: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        """The CSV header."""
        return [*_FIXED, *self.exercises, *_TAIL]

    def row(self, student: str) -> dict[str, Any]:
        """The row of one student.

        Raises:
            KeyError: no such student.
        """
        for row in self.rows:
            if row["student"] == student:
                return row
        raise KeyError(f"gradebook: no student {student!r}")

    def to_dict(self) -> dict[str, Any]:
        """Plain data, ready for ``json.dumps``."""
        return {"exercises": list(self.exercises), "rows": [dict(r) for r in self.rows]}


def build_gradebook(results: list[ClassResult]) -> Gradebook:
    """One row per student from a class's results (see ``counted`` for duplicates)."""
    kept, notes = counted(results)
    exercises: set[str] = set()
    rows: dict[str, dict[str, Any]] = {}
    for result in kept:
        sub, report = result.submission, result.report
        row = rows.setdefault(sub.student, {"student": sub.student, "student_id": "",
                                            "submissions": [], "total": 0.0, "max": 0.0,
                                            "notes": [], "points": {}})
        row["student_id"] = row["student_id"] or sub.student_id
        row["submissions"].append(sub.label)
        for grade in report.rows:
            exercises.add(grade.exercise)
            row["points"][grade.exercise] = float(grade.points)
        row["total"] += float(report.total)
        row["max"] += float(report.max)
        row["notes"] += [f"{sub.name}: {note}" for note in report.notes]
        if result.warning:
            row["notes"].append(result.warning)
    for student, note in notes:
        if student in rows:
            rows[student]["notes"].append(note)
    ordered = sorted(exercises, key=_id_key)
    book = Gradebook(ordered)
    for student in sorted(rows, key=str.lower):
        row = rows[student]
        flat = {"student": student, "student_id": row["student_id"],
                "submissions": " ".join(row["submissions"])}
        flat.update({ex: row["points"].get(ex) for ex in ordered})
        flat.update(total=row["total"], max=row["max"], notes="; ".join(row["notes"]))
        book.rows.append(flat)
    return book


def _text_out(value: str) -> str:
    return "'" + value if value.startswith(_FORMULA) or value.startswith("'") else value


def _text_in(value: str) -> str:
    return value[1:] if value.startswith("'") else value


def write_csv(book: Gradebook, path: str | Path) -> Path:
    """Write the gradebook as CSV (UTF-8, a header row); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(book.columns)
        for row in book.rows:
            cells = [_text_out(str(row[name])) for name in _FIXED]
            cells += ["" if row[ex] is None else fmt_points(row[ex]) for ex in book.exercises]
            cells += [fmt_points(row["total"]), fmt_points(row["max"]), _text_out(row["notes"])]
            writer.writerow(cells)
    return path


def read_csv(path: str | Path) -> Gradebook:
    """Read a gradebook written by ``write_csv``.

    Raises:
        ValueError: the file's header is not a gradebook's.
    """
    with Path(path).open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, [])
        if tuple(header[:3]) != _FIXED or tuple(header[-3:]) != _TAIL:
            raise ValueError(f"read_csv: {path} is not a gradebook (header {header[:4]}...)")
        exercises = header[3:-3]
        book = Gradebook(list(exercises))
        for cells in reader:
            row: dict[str, Any] = {name: _text_in(cells[i]) for i, name in enumerate(_FIXED)}
            for i, ex in enumerate(exercises, start=3):
                row[ex] = float(cells[i]) if cells[i] != "" else None
            row["total"], row["max"] = float(cells[-3]), float(cells[-2])
            row["notes"] = _text_in(cells[-1])
            book.rows.append(row)
    return book
