"""What ``mlsys-lab grade`` and ``mlsys-lab exercises`` do (``cli.py`` parses, these run).

``grade_command(args)`` grades one notebook in this process (a progress line on stderr as each
cell runs and each exercise is checked; exit status 1, with the reason, when the notebook could
not be graded at all: ``ungradable``), or a class folder (``--all``) in worker processes with a
progress bar and one line per notebook as it finishes, then writes what was asked for:
``--csv`` (gradebook), ``--feedback DIR``, ``--report [PNG]`` (class statistics).
``exercises_command(args)`` builds, checks or releases the exercise notebooks.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from mlsys_lab.errors import ArgumentError

__all__ = ["checkout_folder", "exercises_command", "grade_command", "ungradable"]

CACHE_NAME = ".mlsys-lab-grades.json"


def _package_parent() -> Path:
    """The folder the ``mlsys_lab`` package sits in (a checkout, or ``site-packages``)."""
    return Path(__file__).resolve().parents[2]


def checkout_folder(name: str, given: Path | None = None) -> Path:
    """The checkout's ``name`` folder (``solutions``, ``chapters``): ``given`` if set, else
    ``./name``, else the one next to the installed package.

    Raises:
        ArgumentError: none of them exists; the message lists every place looked in.
    """
    if given is not None:
        if not given.is_dir():
            raise ArgumentError(f"no such folder: {given.resolve()}")
        return given
    candidates = [Path.cwd() / name, _package_parent() / name]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    looked = " and ".join(str(c) for c in dict.fromkeys(candidates))
    raise ArgumentError(
        f"cannot find the {name}/ folder: looked in {looked}; run it from a checkout of "
        f"mlsys-lab (the folder holding {name}/) or say where it is"
    )


# ----------------------------------------------------------------------------- grade


def _line(result) -> str:
    report, sub = result.report, result.submission
    from mlsys_lab.grading.core.exercise import fmt_points

    score = f"{fmt_points(report.total)}/{fmt_points(report.max)}"
    how = "cached" if result.cached else f"{report.elapsed:.1f} s"
    line = f"{score:>9}  {sub.student}  {sub.name}  ({how})"
    if report.notes:
        line += f"  — {report.notes[0][:100]}"
    return line


#: Notes of a report that mean the notebook was not graded at all (see ``grader.grade``).
_NOT_GRADED = ("could not read the notebook", "could not start a kernel", "grader error")


def ungradable(report) -> str:
    """Why a single notebook's report is no grade at all, or ``""`` when it is one.

    A notebook that cannot be read, one with no exercises to grade (nothing in it names a
    chapter that has checks: no answer cell, no check cell, no chapter in its metadata or its
    file name), a kernel that never started and a grader error are not grades: ``mlsys-lab
    grade NOTEBOOK`` exits 1 for them. (A class run records them in the gradebook instead.)
    """
    for note in report.notes:
        if note.startswith(_NOT_GRADED):
            return note
    if not report.rows:
        why = "; ".join(report.notes) or (
            "no answer cell (tagged answer:N.M), no check(\"N.M\", ...) cell, and no chapter "
            "in its metadata or its file name (chNN_*.ipynb)")
        return f"it has no exercises to grade ({why})"
    return ""


def _single(args) -> int:
    from mlsys_lab.grading.core.grader import grade
    from mlsys_lab.grading.course.feedback import write_feedback
    from mlsys_lab.grading.course.release import stamp_problem

    path = args.notebook
    if not path.is_file():
        print(f"mlsys-lab grade: no such notebook: {path}", file=sys.stderr)
        return 1
    try:
        metadata = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
        problem = stamp_problem(metadata, None, path.name, require=args.strict)
    except (OSError, ValueError, AttributeError):
        problem = ""
    if problem:
        print(f"mlsys-lab grade: {'refusing: ' if args.strict else 'warning: '}{problem}",
              file=sys.stderr)
        if args.strict:
            return 1
    quiet = getattr(args, "quiet", False)
    started = time.monotonic()

    def progress(text: str) -> None:  # stderr: --json's stdout stays one JSON document
        print(f"mlsys-lab grade: {path.name}, {time.monotonic() - started:.0f} s: {text}",
              file=sys.stderr, flush=True)

    if not quiet:
        print(f"mlsys-lab grade: grading {path} (each cell may take up to "
              f"{args.cell_timeout:g} s; the whole notebook up to {args.timeout:g} s)",
              file=sys.stderr, flush=True)
    report = grade(path, cell_timeout=args.cell_timeout, timeout=args.timeout,
                   progress=None if quiet else progress, prepare_aside=True)
    print(report.to_json() if args.json else report.to_table())
    if args.feedback is not None:
        from mlsys_lab.grading.course.classroom import ClassResult
        from mlsys_lab.grading.course.submissions import Submission

        sub = Submission(path, path.stem, "", "", path.name)
        for written in write_feedback([ClassResult(sub, report)], args.feedback,
                                      args.feedback_format):
            print(f"wrote {written}", file=sys.stderr)
    why = ungradable(report)
    if why:
        print(f"mlsys-lab grade: could not grade {path}: {why}", file=sys.stderr)
        return 1
    return 0


def _class(args) -> int:
    from tqdm import tqdm

    from mlsys_lab.grading.course.classroom import (
        GradeCache,
        GradingOptions,
        grade_class,
        stamp_warnings,
    )
    from mlsys_lab.grading.course.feedback import write_feedback
    from mlsys_lab.grading.course.gradebook import build_gradebook, write_csv
    from mlsys_lab.grading.course.statistics import (
        class_statistics,
        format_statistics,
        plot_statistics,
    )
    from mlsys_lab.grading.course.submissions import find_submissions

    subs, skipped = find_submissions(args.folder, args.pattern)
    for rel in skipped:
        print(f"mlsys-lab grade: skipped {rel} (does not match --pattern)", file=sys.stderr)
    if not subs:
        print(f"mlsys-lab grade: no notebooks to grade in {args.folder}", file=sys.stderr)
        return 1
    warnings = stamp_warnings(subs, require=args.strict)
    for problem in warnings.values():
        print(f"mlsys-lab grade: {'refusing: ' if args.strict else 'warning: '}{problem}",
              file=sys.stderr)
    if args.strict and warnings:
        print(f"mlsys-lab grade: --strict: {len(warnings)} submission(s) do not match the "
              "installed checks; nothing was graded", file=sys.stderr)
        return 1
    cache = None if args.no_cache else GradeCache(args.cache or args.folder / CACHE_NAME)
    options = GradingOptions(args.cell_timeout, args.timeout)
    bar = tqdm(total=len(subs), file=sys.stderr, unit="nb", desc="grading", leave=False,
               disable=args.quiet)

    def on_result(result):
        if not args.quiet:
            bar.write(_line(result), file=sys.stderr)
        bar.update(1)

    try:
        results = grade_class(subs, jobs=args.jobs, options=options, cache=cache,
                              on_result=on_result)
    except KeyboardInterrupt:
        bar.close()
        kept = f" (kept in {cache.path}; run again to go on)" if cache is not None else ""
        print(f"mlsys-lab grade: interrupted after {bar.n} of {len(subs)} notebook(s){kept}",
              file=sys.stderr)
        return 130
    bar.close()
    if cache is not None and cache.prune(s.label for s in subs):
        cache.save()  # notebooks no longer in the folder
    if args.json:
        data = []
        for r in results:
            item = r.report.to_dict()
            item.update(student=r.submission.student, student_id=r.submission.student_id,
                        assignment=r.submission.assignment, cached=r.cached)
            if r.warning:
                item["notes"] = item["notes"] + [r.warning]
            data.append(item)
        print(json.dumps(data, ensure_ascii=False, indent=2))
    else:
        print("Summary")
        for r in results:
            print(f"  {r.report.total:g}/{r.report.max:g}  {r.submission.student}  "
                  f"{r.submission.name}")
    if args.csv is not None:
        print(f"wrote {write_csv(build_gradebook(results), args.csv)}", file=sys.stderr)
    if args.feedback is not None:
        written = write_feedback(results, args.feedback, args.feedback_format)
        print(f"wrote {len(written)} feedback file(s) to {args.feedback}", file=sys.stderr)
    if args.report is not None:
        stats = class_statistics(results)
        print(format_statistics(stats), file=sys.stderr if args.json else sys.stdout)
        print(f"wrote {plot_statistics(stats, args.report)}", file=sys.stderr)
    return 0


def grade_command(args) -> int:
    """``mlsys-lab grade``: one notebook, or a class folder with ``--all``."""
    if args.jobs is not None and args.jobs < 1:
        print(f"mlsys-lab grade: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    if args.folder is None:
        only_all = [name for name, value in (
            ("--jobs", args.jobs), ("--pattern", args.pattern), ("--csv", args.csv),
            ("--report", args.report), ("--cache", args.cache)) if value is not None]
        if only_all:
            print(f"mlsys-lab grade: {', '.join(only_all)} only go with --all FOLDER",
                  file=sys.stderr)
            return 2
        return _single(args)
    if not args.folder.is_dir():
        print(f"mlsys-lab grade: no such folder: {args.folder}", file=sys.stderr)
        return 1
    try:
        return _class(args)
    except ArgumentError as error:
        print(f"mlsys-lab {error}", file=sys.stderr)
        return 1


# ----------------------------------------------------------------------------- exercises


def exercises_command(args) -> int:
    """``mlsys-lab exercises build [--check]`` and ``mlsys-lab exercises release --out DIR``."""
    from mlsys_lab.grading.course.builder import build_all, check_up_to_date
    from mlsys_lab.grading.course.release import release

    action = "build --check" if args.action == "build" and args.check else args.action
    try:
        src = checkout_folder("solutions", args.src)
        if args.action == "release":
            try:
                chapters = checkout_folder("chapters", args.chapters)
            except ArgumentError:
                chapters = None
            written = release(src, chapters, args.out)
            exercises = sum(1 for p in written if p.parent.name == "exercises")
            print(f"released {exercises} exercise notebook(s) and {len(written) - exercises} "
                  f"chapter(s) to {args.out} (no solutions)")
            if chapters is None:
                print("  (no chapters/ folder found: the pack holds the exercises only)")
            return 0
        dst = args.dst or src.parent / "exercises"
        if args.check:
            stale = check_up_to_date(src, dst)
            if stale:
                print("exercises are out of date; run `mlsys-lab exercises build`:")
                for path in stale:
                    print(f"  {path}")
                return 1
            print(f"exercises are up to date ({dst})")
            return 0
        written = build_all(src, dst)
    except ArgumentError as error:
        message = str(error)
        for prefix in ("exercises build --check: ", "exercises build: ", "exercises release: "):
            message = message.removeprefix(prefix)
        print(f"mlsys-lab exercises {action}: {message}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} notebook(s) updated in {dst}")
    return 0
