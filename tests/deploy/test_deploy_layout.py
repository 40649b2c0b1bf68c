"""The shape of ``mlsys_lab.deploy`` (issue 28): folders that are concepts (``onnx/``, ``quant/``,
``compress/``), the package root's public names
unchanged, the ONNX mappings registered by importing the package, and every grading
``forbidden`` string that names a deploy module still naming a live module (after a move, a
stale string would silently forbid nothing)."""

import importlib
import pathlib
import subprocess
import sys

import pytest

import mlsys_lab.deploy as deploy
from mlsys_lab.grading.core.exercise import exercises_for_chapter

DEPLOY = pathlib.Path(deploy.__file__).parent

#: the package root's public names before the move; notebooks, exercises and the README use them
ROOT_NAMES = [
    "EXPORT_OPSET", "StaticInputError", "export_onnx", "graph_to_onnx", "import_onnx",
    "load_graph", "register_onnx", "save_graph", "support_table", "supported_onnx_ops",
    "CSRMatrix", "calibrate", "collapse_affine", "compare", "csr_matmul", "distill",
    "distillation_loss", "fold_batch_norm", "int8_kernels", "lower_qdq", "magnitude_masks",
    "obfuscate", "obfuscate_model", "passes", "prepare_qat", "prune", "prune_channels",
    "qat_to_qdq", "quantize_static", "remove_dropout", "to_inference",
]


def test_the_subpackages_are_the_concepts_and_no_prefix_stands_in_for_a_folder():
    assert {p.name for p in DEPLOY.iterdir() if (p / "__init__.py").exists()} == {
        "onnx", "quant", "compress"}
    prefixed = [p.name for p in DEPLOY.glob("*.py")
                if p.name.startswith(("onnx_", "quant_", "int8_", "int16_"))]
    assert not prefixed, prefixed
    assert not (DEPLOY / "quantize.py").exists()  # the facade of private names is gone


@pytest.mark.parametrize("name", ROOT_NAMES)
def test_the_package_roots_public_names_still_resolve(name):
    assert getattr(deploy, name) is not None


def test_the_quant_package_exports_public_names_only():
    from mlsys_lab.deploy import quant
    assert all(not n.startswith("_") for n in quant.__all__)
    assert all(hasattr(quant, n) for n in quant.__all__)


def test_importing_one_onnx_module_registers_every_mapping():
    # a fresh process: the package's __init__ registers the op families and the QDQ mapping
    code = ("import mlsys_lab.deploy.onnx.exporter as e; from mlsys_lab.engine.registry import "
            "get; print(get('relu').onnx.writes, get('quantize_linear').onnx.writes, "
            "'relu' in e.exportable_ops())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, check=True).stdout.strip()
    assert out == "('Relu',) ('QuantizeLinear',) True"


def _deploy_specs():
    specs = []
    for chapter in range(1, 21):
        for ex in exercises_for_chapter(chapter):
            specs += [(ex.id, s) for s in ex.forbidden if s.startswith("mlsys_lab.deploy")]
    return specs


def test_there_are_forbidden_strings_naming_deploy_modules():
    assert len(_deploy_specs()) >= 11  # 10.1: 2, 10.2: 7, 10.3: 2


@pytest.mark.parametrize("exercise, spec", _deploy_specs())
def test_every_forbidden_string_naming_deploy_resolves(exercise, spec):
    module_name, _, path = spec.partition(":")
    module = importlib.import_module(module_name)
    if not path:  # a whole module is forbidden by its own source: a package re-export is empty
        assert not hasattr(module, "__path__"), f"{exercise}: {spec} is a package, not a module"
        return
    obj = module
    for part in path.split("."):
        obj = getattr(obj, part)
    assert not any(p.startswith("_") for p in path.split(".")), f"{exercise}: {spec} is private"
