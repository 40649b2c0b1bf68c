"""The shape of mlsys_lab/grading: three parts (core, course, exercises), one module per
exercise, and ``forbidden`` entries that name live public objects.

A ``forbidden`` string is resolved only when a probe runs, so a stale one (after a module moved)
would silently forbid nothing; these tests resolve every entry of every chapter."""

import ast
import importlib
import re
from pathlib import Path

import pytest

from mlsys_lab.grading.core import guard
from mlsys_lab.grading.core.exercise import EXERCISES, exercises_for_chapter
from mlsys_lab.grading.exercises import CHAPTERS

GRADING = Path(__file__).resolve().parents[2] / "mlsys_lab" / "grading"
SOLUTIONS = GRADING.parents[1] / "solutions"
ALL = [e for chapter in CHAPTERS for e in exercises_for_chapter(chapter)]


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {name for name in found if name.startswith("mlsys_lab.grading")}


def test_chapters_are_packages_named_like_their_solution_notebooks():
    folders = sorted(p.name for p in (GRADING / "exercises").iterdir()
                     if (p / "__init__.py").is_file())
    assert folders == sorted(CHAPTERS.values())
    for chapter, name in CHAPTERS.items():
        assert name.startswith(f"ch{chapter:02d}_")
        assert (SOLUTIONS / f"{name}.ipynb").is_file(), name


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_one_module_per_exercise(chapter):
    """Each ``exN_M_topic.py`` registers exactly exercise N.M, and the chapter has no other."""
    package = GRADING / "exercises" / CHAPTERS[chapter]
    modules = sorted(package.glob("ex*.py"))
    ids = []
    for path in modules:
        match = re.fullmatch(r"ex(\d+)_(\d+[a-z]?)_\w+\.py", path.name)
        assert match, f"{path.name}: name it exN_M_topic.py"
        ids.append(f"{match.group(1)}.{match.group(2)}")
        module = importlib.import_module(
            f"mlsys_lab.grading.exercises.{CHAPTERS[chapter]}.{path.stem}")
        registered = [e.id for e in EXERCISES.values()
                      if any(c.probe.__module__ == module.__name__ for c in e.cases)]
        assert registered == [ids[-1]], f"{path.name} registers {registered}"
    assert sorted(ids) == sorted(e.id for e in exercises_for_chapter(chapter))


def test_the_three_parts_import_in_one_direction():
    """core imports neither course nor a chapter (only the chapter index); exercises import only
    core.exercise / core.wire / core.guard (``unguarded``), their own chapter and the shared
    fixtures; course may import core."""
    for path in (GRADING / "core").glob("*.py"):
        bad = {m for m in _imports(path) if m.startswith("mlsys_lab.grading.course")
               or (m.startswith("mlsys_lab.grading.exercises") and m not in (
                   "mlsys_lab.grading.exercises", "mlsys_lab.grading.exercises.package_of"))}
        assert not bad, f"core/{path.name} imports {bad}"
    for path in (GRADING / "exercises").rglob("*.py"):
        own = f"mlsys_lab.grading.exercises.{path.parent.name}"
        allowed = ("mlsys_lab.grading.core.exercise", "mlsys_lab.grading.core.wire",
                   "mlsys_lab.grading.core.guard", "mlsys_lab.grading.exercises.fixtures", own)
        bad = {m for m in _imports(path) if not m.startswith(allowed)}
        assert not bad, f"{path.relative_to(GRADING)} imports {bad}"


@pytest.mark.parametrize("exercise", ALL, ids=[e.id for e in ALL])
def test_forbidden_entries_name_live_public_objects(exercise):
    for spec in exercise.forbidden:
        module_name, _, path = spec.partition(":")
        obj = importlib.import_module(module_name)  # a stale module path fails here
        for part in path.split(".") if path else ():
            assert not part.startswith("_"), f"{exercise.id}: {spec} names a private object"
            obj = getattr(obj, part)  # a stale name fails here
    plan = guard.plan_for(exercise)  # the guard resolves every entry the same way
    assert plan["code"] or plan.get("builtins") or not exercise.forbidden


def test_a_stale_forbidden_entry_is_an_error_not_a_silent_no_op():
    with pytest.raises(ModuleNotFoundError):
        guard._resolve("mlsys_lab.no_such_module:f")
    with pytest.raises(AttributeError):
        guard._resolve("mlsys_lab.engine.graph:no_such_function")
