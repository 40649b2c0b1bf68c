"""The student pack and its release stamp.

``release(solutions, chapters, out)`` writes what students get: ``out/exercises/chNN_*.ipynb``
(built from the solution notebooks, solution regions replaced by stubs) and
``out/chapters/*.ipynb``, and no solutions. Each exercise notebook's metadata carries a stamp::

    "mlsys_lab": {"chapter": 4, "release": {"version": "0.1.0", "checks": "sha256:1f0c…"}}

``checks`` is ``checks_stamp(chapter)``: a hash of the source of the chapter's check module and of
every grading module its probes and judges run on. ``stamp_problem`` compares a submission's
stamp with the installed checks, so a teacher learns when a class worked against other checks
than the ones grading it.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import nbformat

from mlsys_lab.errors import ArgumentError
from mlsys_lab.grading.core.grader import module_file, modules_of
from mlsys_lab.grading.course.builder import (
    _build_text,
    _required_sources,
    chapter_from_filename,
    render,
)
from mlsys_lab.grading.exercises import package_of

__all__ = ["checks_stamp", "grading_stamp", "release", "release_stamp", "stamp_problem"]

_GRADING_DIR = Path(__file__).resolve().parents[1]
# The trusted half (judges) runs these too, besides what the kernel's modules import.
_JUDGE_SIDE = ("mlsys_lab.grading.core.judge",)


def _version() -> str:
    from mlsys_lab import __version__

    return __version__


def checks_stamp(chapter: int) -> str:
    """``"sha256:<16 hex>"`` of the installed checks of a chapter (its exercises and the grading
    modules they run on).

    Raises:
        ArgumentError: the chapter has no exercises.
    """
    if package_of(chapter) is None:
        raise ArgumentError(f"checks_stamp: chapter {chapter} has no exercises "
                            f"(not in mlsys_lab.grading.exercises.CHAPTERS)")
    digest = hashlib.sha256()
    for name in modules_of(chapter, _JUDGE_SIDE):
        digest.update(name.encode() + b"\0" + module_file(name).read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


def grading_stamp() -> str:
    """A hash of every installed grading module (all chapters) and the package version: the part
    of the re-grade cache key that changes whenever any check changes."""
    digest = hashlib.sha256(_version().encode())
    for path in sorted(_GRADING_DIR.rglob("*.py")):
        name = path.relative_to(_GRADING_DIR).as_posix()
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return "sha256:" + digest.hexdigest()[:16]


def release_stamp(chapter: int) -> dict[str, str]:
    """The stamp a released notebook of this chapter carries."""
    return {"version": _version(), "checks": checks_stamp(chapter)}


def stamp_problem(nb_metadata: dict[str, Any], chapter: int | None, name: str,
                  require: bool = False) -> str:
    """Why a submission's release stamp does not match the installed checks, or ``""``.

    ``""`` also when a stamped notebook's chapter has no checks, and when the notebook carries
    no stamp (it was not made by ``release``) unless ``require`` (``grade --strict``): then
    that is the problem.
    """
    meta = nb_metadata.get("mlsys_lab", {}) if isinstance(nb_metadata, dict) else {}
    stamp = meta.get("release") if isinstance(meta, dict) else None
    if not isinstance(stamp, dict):
        return (f"{name} carries no release stamp (it was not handed out by `mlsys-lab "
                "exercises release`), so which checks it was made for cannot be told"
                if require else "")
    if chapter is None:
        chapter = meta.get("chapter") if isinstance(meta.get("chapter"), int) else None
    if chapter is None:
        return ""
    try:
        installed = release_stamp(chapter)
    except ArgumentError:
        return ""
    if stamp.get("checks") == installed["checks"]:
        return ""
    return (f"{name} was released with mlsys-lab {stamp.get('version', '?')} "
            f"(checks {stamp.get('checks', '?')}) but the installed checks are mlsys-lab "
            f"{installed['version']} (checks {installed['checks']}): its grade may differ "
            "from what check() showed the student")


def release(solutions: str | Path, chapters: str | Path | None, out: str | Path) -> list[Path]:
    """Write the student pack to ``out``; return the files written.

    Args:
        solutions: the folder of ``chNN_*.ipynb`` solution notebooks (never copied).
        chapters: the folder of chapter notebooks to hand out as they are, or None.
        out: the pack's folder; gets ``exercises/`` and ``chapters/``.

    Raises:
        ArgumentError: ``solutions`` holds no solution notebook, or ``out`` is inside it.
    """
    solutions, out = Path(solutions), Path(out)
    sources = _required_sources(solutions, "exercises release")
    if out.resolve() == solutions.resolve() or solutions.resolve() in out.resolve().parents:
        raise ArgumentError(f"release: the pack folder {out} is inside the solutions folder")
    written: list[Path] = []
    (out / "exercises").mkdir(parents=True, exist_ok=True)
    for src in sources:
        nb = nbformat.reads(_build_text(src), as_version=4)
        chapter = chapter_from_filename(src)
        meta = dict(nb.metadata.get("mlsys_lab", {}))
        meta.pop("generated_from", None)  # names the solutions file: not the student's business
        if chapter is not None and package_of(chapter) is not None:
            meta["release"] = release_stamp(chapter)
        nb.metadata["mlsys_lab"] = meta
        target = out / "exercises" / src.name
        target.write_text(render(nb), encoding="utf-8", newline="\n")
        written.append(target)
    if chapters is not None and Path(chapters).is_dir():
        (out / "chapters").mkdir(parents=True, exist_ok=True)
        for src in sorted(Path(chapters).glob("*.ipynb")):
            target = out / "chapters" / src.name
            shutil.copyfile(src, target)
            written.append(target)
    return written
