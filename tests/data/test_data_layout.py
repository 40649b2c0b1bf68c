"""The layout of ``mlsys_lab.data``: folders that are concepts (``loader/``, ``pipeline/``), the
names notebooks use still at the package root, and chapter 9's ``forbidden`` strings naming live,
public objects at the new paths."""

import importlib
import pathlib

import mlsys_lab.data as data
from mlsys_lab.grading.core.exercise import exercises_for_chapter

DATA = pathlib.Path(data.__file__).parent


def _modules():
    return sorted(p for p in DATA.rglob("*.py"))


def test_folders_are_concepts_no_prefixes_no_private_modules():
    names = {p.relative_to(DATA).as_posix() for p in _modules()}
    assert {"loader/dataloader.py", "loader/worker.py", "loader/shm.py", "pipeline/pipeline.py",
            "pipeline/ops.py", "pipeline/pools.py", "pipeline/sim.py",
            "pipeline/autotune.py"} <= names
    assert not [n for n in names if pathlib.Path(n).name.startswith(("pipeline_", "_"))
                and pathlib.Path(n).name != "__init__.py"]
    assert (DATA / "README.md").is_file()
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    for name in names - {"__init__.py", "loader/__init__.py", "pipeline/__init__.py"}:
        assert f"`{name}`" in readme, f"data/README.md does not map {name}"


def test_names_the_notebooks_use_stay_at_the_package_root():
    from mlsys_lab.data import pipeline_sim
    from mlsys_lab.data.pipeline import sim, with_degrees
    from mlsys_lab.data.pipeline.pipeline import autotune

    assert pipeline_sim is sim and data.autotune is autotune
    assert with_degrees is data.pipeline.pipeline.with_degrees
    for name in data.__all__:
        assert getattr(data, name) is not None, name


def test_chapter_9_forbidden_strings_name_live_public_objects():
    specs = [s for ex in exercises_for_chapter(9) for s in ex.forbidden
             if s.startswith("mlsys_lab.data")]
    assert len(specs) >= 10
    for spec in specs:
        module_name, _, path = spec.partition(":")
        obj = importlib.import_module(module_name)
        assert obj.__name__ == module_name, spec
        for part in path.split(".") if path else ():
            assert not part.startswith("_"), f"{spec} names a private object"
            obj = getattr(obj, part)
        if path:
            assert obj.__module__ == module_name, f"{spec}: defined in {obj.__module__}"
