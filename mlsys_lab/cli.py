"""The ``mlsys-lab`` command.

::

    mlsys-lab open                               # jupyter lab on the chapter notebooks
    mlsys-lab grade NOTEBOOK [--json]            # grade one notebook in a fresh kernel
    mlsys-lab grade --all FOLDER [--json]        # grade every notebook in a folder
    mlsys-lab exercises build [--check]          # regenerate exercises/ from solutions/

``grade`` takes ``--cell-timeout S`` (per cell, default 60) and ``--timeout S`` (per notebook,
default 600). Exit codes: 0 when the command did its job (whatever the score), 1 when it could
not (a missing notebook, stale exercises under ``--check``), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
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

    sub.add_parser("open", help="open the chapter notebooks in JupyterLab")

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
    return parser


def _cmd_grade(args) -> int:
    from mlsys_lab.grading.grader import grade

    if args.folder is not None:
        if not args.folder.is_dir():
            print(f"mlsys-lab grade: no such folder: {args.folder}", file=sys.stderr)
            return 1
        notebooks = sorted(
            p for p in args.folder.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
        )
    else:
        if not args.notebook.is_file():
            print(f"mlsys-lab grade: no such notebook: {args.notebook}", file=sys.stderr)
            return 1
        notebooks = [args.notebook]

    reports = [grade(nb, cell_timeout=args.cell_timeout, timeout=args.timeout) for nb in notebooks]
    if args.json:
        data = [r.to_dict() for r in reports]
        print(
            json.dumps(data if args.folder is not None else data[0], ensure_ascii=False, indent=2)
        )
    else:
        print("\n\n".join(r.to_table() for r in reports))
        if len(reports) > 1:
            print("\nSummary")
            for r in reports:
                print(f"  {r.total:g}/{r.max:g}  {r.notebook}")
    return 0


def _cmd_exercises(args) -> int:
    from mlsys_lab.grading.builder import build_all, check_up_to_date

    root = _project_root()
    src = args.src or root / "solutions"
    dst = args.dst or root / "exercises"
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
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} notebook(s) updated in {dst}")
    return 0


def _cmd_open(args) -> int:
    chapters = _project_root() / "chapters"
    try:
        return subprocess.call(["jupyter", "lab", str(chapters)])
    except FileNotFoundError:
        print(
            "mlsys-lab open: `jupyter` not found; install with `pip install jupyterlab`",
            file=sys.stderr,
        )
        return 1


def main(argv: list[str] | None = None) -> int:
    """Run the ``mlsys-lab`` command line; returns the exit code."""
    args = _parser().parse_args(argv)
    handlers = {"grade": _cmd_grade, "exercises": _cmd_exercises, "open": _cmd_open}
    try:
        return handlers[args.command](args)
    except ValueError as error:  # e.g. a malformed solution region
        print(f"mlsys-lab {args.command}: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
