"""The shape of ``mlsys_lab.distributed`` (issue 28): folders that are concepts (``sim/``,
``collectives/``, ``parallel/``, ``ps/``) with ``comm.py`` and ``mpi.py`` at the top, no module
shadowed by a function of its package, the package root's names unchanged (notebooks, exercises
and the README use them), and every grading ``forbidden`` string that names a distributed module
naming a live, public object (after a move, a stale string would silently forbid nothing)."""

import importlib
import pathlib
import pkgutil

import pytest

import mlsys_lab.distributed as dist
from mlsys_lab.grading.core.exercise import exercises_for_chapter

DIST = pathlib.Path(dist.__file__).parent

#: the package root's names before the move, less ``sparse`` (a 9-line re-export of the
#: engine's ``RowSparse``, which the root and ``ps`` still export)
ROOT_NAMES = [
    "Cluster", "CommError", "CommTimeoutError", "Communicator", "DeadlockError", "DeviceFailure",
    "LinkFailure", "SymbolicArray", "allgather", "allreduce", "alltoall", "barrier",
    "block_bounds", "broadcast", "collectives", "cost", "gather", "reduce", "reduce_scatter",
    "run", "scatter", "sim", "topology", "DeviceMesh", "RowSparse", "data_parallel", "faults",
    "mesh", "param_server", "pipeline_parallel", "tensor_parallel", "zero",
]

#: module names the notebooks import from the root, and where each lives now
MOVED = {
    "cost": "mlsys_lab.distributed.collectives.cost",
    "topology": "mlsys_lab.distributed.sim.topology",
    "data_parallel": "mlsys_lab.distributed.parallel.data_parallel",
    "tensor_parallel": "mlsys_lab.distributed.parallel.tensor_parallel",
    "pipeline_parallel": "mlsys_lab.distributed.parallel.pipeline_parallel",
    "zero": "mlsys_lab.distributed.parallel.zero",
    "mesh": "mlsys_lab.distributed.parallel.mesh",
    "faults": "mlsys_lab.distributed.parallel.faults",
    "param_server": "mlsys_lab.distributed.ps.param_server",
}


def test_the_subpackages_are_the_concepts_and_no_prefix_stands_in_for_a_folder():
    assert {p.name for p in DIST.iterdir() if (p / "__init__.py").exists()} == {
        "sim", "collectives", "parallel", "ps"}
    assert {p.name for p in DIST.glob("*.py")} == {"__init__.py", "comm.py", "mpi.py"}
    prefixed = [p.name for p in DIST.rglob("*.py") if p.name.startswith(("sim_", "collective_"))]
    assert not prefixed, prefixed


@pytest.mark.parametrize("name", ROOT_NAMES)
def test_the_package_roots_names_still_resolve(name):
    assert name in dist.__all__ and getattr(dist, name) is not None


@pytest.mark.parametrize("name, module", sorted(MOVED.items()))
def test_a_module_the_notebooks_import_from_the_root_is_the_moved_module(name, module):
    assert getattr(dist, name) is importlib.import_module(module)


def test_the_collectives_package_exports_public_names_only():
    from mlsys_lab.distributed import collectives
    assert all(not n.startswith("_") for n in collectives.__all__)
    assert all(hasattr(collectives, n) for n in collectives.__all__)
    assert not [n for n in vars(collectives) if n.startswith("_") and not n.startswith("__")]


@pytest.mark.parametrize("package", ["sim", "collectives", "parallel", "ps"])
def test_no_submodule_is_shadowed_by_a_name_of_its_package(package):
    # e.g. a module collectives/allreduce.py would be hidden by the function collectives.allreduce:
    # ``import mlsys_lab.distributed.collectives.allreduce as m`` would give the function
    pkg = importlib.import_module(f"mlsys_lab.distributed.{package}")
    for info in pkgutil.iter_modules(pkg.__path__):
        module = importlib.import_module(f"{pkg.__name__}.{info.name}")
        assert getattr(pkg, info.name) is module, f"{pkg.__name__}.{info.name}"


def _distributed_specs():
    specs = []
    for chapter in range(1, 21):
        for ex in exercises_for_chapter(chapter):
            specs += [(ex.id, s) for s in ex.forbidden if s.startswith("mlsys_lab.distributed")]
    return specs


def test_there_are_forbidden_strings_naming_distributed_modules():
    assert len(_distributed_specs()) >= 20  # 11.1: 13, 11.2: 2, 11.3: 4, 11.4: 1


@pytest.mark.parametrize("exercise, spec", _distributed_specs())
def test_every_forbidden_string_naming_distributed_resolves_to_a_public_object(exercise, spec):
    module_name, _, path = spec.partition(":")
    module = importlib.import_module(module_name)
    obj = module
    for part in path.split(".") if path else ():  # a bare module forbids all its functions
        obj = getattr(obj, part)
    assert callable(obj) or not path, f"{exercise}: {spec} is not a function or class"
    assert not any(p.startswith("_") for p in module_name.split(".") + path.split(".")), \
        f"{exercise}: {spec} is private"
