"""Feedback files to hand back: one HTML or Markdown file per submission.

Each exercise gets the same per-case report ``check()`` prints in the notebook (``CheckResult
.report()``: every case ✓ or ✗ with its points, what was expected when it failed, and the seed
that repeats the random inputs), built from the grade report's rows; an exercise with no case
results (its answer timed out, the kernel died) shows why. The grader's notes on the run follow.
Everything from the notebook (error messages, names) is escaped in HTML.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from mlsys_lab.grading.core.exercise import CaseResult, CheckResult, fmt_points
from mlsys_lab.grading.core.grader import ExerciseGrade, GradeReport
from mlsys_lab.grading.course.classroom import ClassResult

__all__ = ["exercise_report", "feedback_html", "feedback_markdown", "write_feedback"]


def exercise_report(row: ExerciseGrade) -> str:
    """One exercise's feedback as text: ``check()``'s report when cases ran, else why not."""
    if not row.cases:
        return (f"Exercise {row.exercise} — {row.title}\n  {row.feedback}\n"
                f"  Score: {fmt_points(row.points)}/{fmt_points(row.max)}")
    cases = [CaseResult(**{k: case[k] for k in ("name", "points", "max", "passed", "feedback")})
             for case in row.cases]
    result = CheckResult(row.exercise, row.title, row.points, row.max, cases, seed=row.seed)
    return result.report()


def _title(report: GradeReport, student: str) -> str:
    return (f"Feedback for {student}: {Path(report.notebook).name} — "
            f"{fmt_points(report.total)}/{fmt_points(report.max)}")


def feedback_markdown(report: GradeReport, student: str) -> str:
    """The feedback file in Markdown."""
    lines = [f"# {_title(report, student)}", "", "| Exercise | Title | Points |", "|---|---|---|"]
    for row in report.rows:
        title = row.title.replace("|", "\\|")
        lines.append(f"| {row.exercise} | {title} | {fmt_points(row.points)}/"
                     f"{fmt_points(row.max)} |")
    for row in report.rows:
        lines += ["", f"## {row.exercise} — {row.title}", "", "```text", exercise_report(row),
                  "```"]
    if report.notes:
        lines += ["", "## Notes from the grader", ""] + [f"- {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def feedback_html(report: GradeReport, student: str) -> str:
    """The feedback file as a self-contained HTML page."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(r.exercise)}</td><td>{e(r.title)}</td>"
        f"<td>{fmt_points(r.points)}/{fmt_points(r.max)}</td></tr>" for r in report.rows)
    parts = [
        "<!DOCTYPE html>", '<html><head><meta charset="utf-8">',
        f"<title>{e(_title(report, student))}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "pre{background:#f6f6f6;padding:.8em;white-space:pre-wrap}"
        "td,th{padding:.2em .8em;text-align:left}</style></head><body>",
        f"<h1>{e(_title(report, student))}</h1>",
        f"<table><tr><th>Exercise</th><th>Title</th><th>Points</th></tr>{rows}</table>",
    ]
    for row in report.rows:
        parts.append(f"<h2>{e(row.exercise)} — {e(row.title)}</h2>")
        parts.append(f"<pre>{e(exercise_report(row))}</pre>")
    if report.notes:
        parts.append("<h2>Notes from the grader</h2><ul>")
        parts += [f"<li>{e(note)}</li>" for note in report.notes]
        parts.append("</ul>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "student"


def write_feedback(results: list[ClassResult], folder: str | Path, fmt: str = "html"
                   ) -> list[Path]:
    """Write one feedback file per submission into ``folder``; return the paths.

    Files are named ``<student>_<assignment>.html`` (or ``.md``), with the notebook's name
    instead of the assignment when it is unknown or taken.

    Raises:
        ValueError: ``fmt`` is neither ``"html"`` nor ``"md"``.
    """
    if fmt not in ("html", "md"):
        raise ValueError(f"write_feedback: format must be 'html' or 'md', got {fmt!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    render = feedback_html if fmt == "html" else feedback_markdown
    written: list[Path] = []
    taken: set[str] = set()
    for result in results:
        sub = result.submission
        stem = _safe(f"{sub.student}_{sub.assignment}") if sub.assignment else ""
        if not stem or stem in taken:
            stem = _safe(f"{sub.student}_{Path(sub.name or sub.path.name).stem}")
        base, n = stem, 2
        while stem in taken:
            stem, n = f"{base}_{n}", n + 1
        taken.add(stem)
        path = folder / f"{stem}.{fmt}"
        path.write_text(render(result.report, sub.student), encoding="utf-8")
        written.append(path)
    return written
