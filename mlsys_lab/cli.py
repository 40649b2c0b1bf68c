"""The ``mlsys-lab`` command.

::

    mlsys-lab open [-- LAB-ARGS...]              # jupyter lab at the project root, start page
    mlsys-lab doctor                             # what is installed, and how to fix what is not
    mlsys-lab export [--out site/]               # every chapter as offline HTML, a start page
    mlsys-lab --version
    mlsys-lab grade NOTEBOOK [--json]            # grade one notebook in a fresh kernel
    mlsys-lab grade --all FOLDER [--jobs N]      # grade a class in parallel (see below)
    mlsys-lab exercises build [--check]          # regenerate exercises/ from solutions/
    mlsys-lab exercises release --out DIR        # the student pack: exercises + chapters, stamped

``grade`` takes ``--cell-timeout S`` (per cell, default 60) and ``--timeout S`` (per notebook,
default 600). With ``--all`` it also takes ``--pattern`` (how file names name the student),
``--csv FILE`` (gradebook), ``--feedback DIR``, ``--report [PNG]`` (class statistics),
``--strict`` (refuse submissions released with other checks) and ``--no-cache``; the work is in
``mlsys_lab.grading.course.commands``. Exit codes: 0 when the command did its job (whatever the
score), 1 when it could not (a missing notebook, stale exercises under ``--check``), 2 for a
usage error.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

__all__ = ["main"]


def _project_root() -> Path:
    """The folder holding ``chapters/``, ``solutions/`` and ``exercises/``.

    The current directory when it has them (a checkout you are working in), else the checkout
    the package was installed from (``pip install -e .``).
    """
    here = Path.cwd()
    if (here / "solutions").is_dir() or (here / "chapters").is_dir():
        return here
    return Path(__file__).resolve().parent.parent


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlsys-lab", description="Companion tools for the openMLsys chapter notebooks."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    parser.add_argument("--version", action="version", version=_version())
    lab = sub.add_parser("open", help="JupyterLab at the project root, on the start page")
    lab.add_argument("lab_args", nargs=argparse.REMAINDER,
                     help="after --, passed on to `jupyter lab` (mlsys-lab open -- --no-browser)")
    sub.add_parser("doctor", help="check Python, numpy, numba, dot, CUDA, MPI, a browser")
    export = sub.add_parser("export", help="render every chapter to offline HTML")
    export.add_argument("--out", type=Path, default=Path("site"), help="folder (default site/)")

    grade = sub.add_parser("grade", help="grade a notebook (or a folder of notebooks)")
    target = grade.add_mutually_exclusive_group(required=True)
    target.add_argument("notebook", nargs="?", type=Path, help="the notebook to grade")
    target.add_argument("--all", dest="folder", type=Path, help="grade every notebook in FOLDER")
    grade.add_argument("--json", action="store_true", help="print the report as JSON")
    grade.add_argument(
        "--cell-timeout", type=float, default=60, metavar="S", help="seconds per cell (default 60)"
    )
    grade.add_argument(
        "--timeout", type=float, default=600, metavar="S", help="seconds per notebook (default 600)"
    )
    grade.add_argument("--jobs", type=int, default=None, metavar="N",
                       help="--all: notebooks graded at once (default: the number of cores)")
    grade.add_argument("--pattern", default=None, metavar="REGEX",
                       help="--all: regex on the path in FOLDER with (?P<student>...) and "
                            "optionally (?P<assignment>...) groups")
    grade.add_argument("--csv", type=Path, default=None, metavar="FILE",
                       help="--all: write the gradebook (one row per student)")
    grade.add_argument("--feedback", type=Path, default=None, metavar="DIR",
                       help="write one feedback file per submission into DIR")
    grade.add_argument("--feedback-format", choices=("html", "md"), default="html",
                       help="feedback files as HTML (default) or Markdown")
    grade.add_argument("--report", type=Path, nargs="?", const=Path("class_report.png"),
                       default=None, metavar="PNG",
                       help="--all: print class statistics and plot them (default "
                            "class_report.png)")
    grade.add_argument("--strict", action="store_true",
                       help="refuse submissions whose release stamp differs from the checks "
                            "or that carry none")
    grade.add_argument("--cache", type=Path, default=None, metavar="FILE",
                       help="--all: the re-grade cache (default FOLDER/.mlsys-lab-grades.json)")
    grade.add_argument("--no-cache", action="store_true", help="--all: grade every notebook")
    grade.add_argument("--quiet", action="store_true",
                       help="no progress output (with --all: no bar or per-notebook lines)")

    exercises = sub.add_parser("exercises", help="manage the generated exercise notebooks")
    ex_sub = exercises.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = ex_sub.add_parser("build", help="regenerate exercises/ from solutions/")
    build.add_argument(
        "--check",
        action="store_true",
        help="change nothing; exit 1 and list the files that are out of date",
    )
    build.add_argument("--src", type=Path, default=None, help="solutions folder")
    build.add_argument("--dst", type=Path, default=None, help="exercises folder")
    release = ex_sub.add_parser("release", help="write the student pack (no solutions)")
    release.add_argument("--out", type=Path, required=True, metavar="DIR", help="the pack folder")
    release.add_argument("--src", type=Path, default=None, help="solutions folder")
    release.add_argument("--chapters", type=Path, default=None, help="chapters folder")
    return parser


def _cmd_grade(args) -> int:
    from mlsys_lab.grading.course.commands import grade_command

    return grade_command(args)


def _cmd_exercises(args) -> int:
    from mlsys_lab.grading.course.commands import exercises_command

    return exercises_command(args)


def _version() -> str:
    """``mlsys-lab X.Y.Z``, from the package's ``__version__``."""
    from mlsys_lab import __version__

    return f"mlsys-lab {__version__}"


def _cmd_open(args) -> int:
    from mlsys_lab.reader.launch import open_lab

    extra = args.lab_args[1:] if args.lab_args[:1] == ["--"] else args.lab_args
    return open_lab(extra, root=_project_root(), call=subprocess.call)


def _cmd_doctor(args) -> int:
    from mlsys_lab.reader.doctor import run_doctor

    return run_doctor()


def _cmd_export(args) -> int:
    from mlsys_lab.reader.export import export_pages

    pages = export_pages(args.out, root=_project_root(),
                         progress=lambda line: print(line, flush=True))
    print(f"wrote {len(pages)} pages ({len(pages) - 1} chapters and the start page):")
    for page in pages:
        print(f"  {page}")
    print(f"open {pages[-1]} in a browser")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``mlsys-lab`` command line; returns the exit code."""
    args = _parser().parse_args(argv)   # --version and --help exit here
    handlers = {"grade": _cmd_grade, "exercises": _cmd_exercises, "open": _cmd_open,
                "doctor": _cmd_doctor, "export": _cmd_export}
    try:
        return handlers[args.command](args)
    except ValueError as error:  # e.g. a malformed solution region
        print(f"mlsys-lab {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
