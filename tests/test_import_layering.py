"""Imports flow one way (DESIGN.md §2, "The backend's shape").

The package's import graph — every ``import`` and ``from ... import`` in every module, the ones
inside functions included, since a function-local import is still a dependency — must be
acyclic, and the engine (the bottom layer) must not import the layers built on it. A lazy
import that hides a cycle, ``engine/graph.py`` importing ``viz`` to draw itself, or the compiler
importing ``nn`` for the training step each fail here with the offending edge named.
"""

import ast
import pathlib

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "mlsys_lab"
UPPER = ("nn", "optim", "viz", "kernels", "grading", "data", "deploy", "distributed", "cli")


def modules_of(pkg):
    """``{dotted module name: path}`` for every ``.py`` file of the package at ``pkg``."""
    def name(path):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return {name(p): p for p in pkg.rglob("*.py")}


def _imported(modules, module, node):
    """Module names an import statement depends on (resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    is_pkg = modules[module].name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target
            for a in node.names]


def _owner(modules, name):
    """The package module a dotted import name lives in (``a.b.c`` -> ``a.b`` if ``c`` is a
    name defined in ``a.b``), or None outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(pkg=PKG):
    """``{module: {module it imports}}`` over the whole package at ``pkg``."""
    modules = modules_of(pkg)
    edges = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(modules, module, node):
                    target = _owner(modules, name)
                    if target is not None and target != module:
                        edges[module].add(target)
    return edges


def find_cycle(edges):
    """One import cycle as a list of modules (first repeated at the end), or [] (iterative DFS)."""
    state = {}
    for root in sorted(edges):
        if root in state:
            continue
        stack, path = [(root, iter(sorted(edges[root])))], [root]
        state[root] = "open"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = "done"
            elif state.get(child) == "open":
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = "open"
                stack.append((child, iter(sorted(edges[child]))))
                path.append(child)
    return []


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_the_engine_imports_no_layer_above_it():
    upward = sorted(
        f"{m} -> {t}" for m, targets in import_graph().items() if m.startswith("mlsys_lab.engine")
        for t in targets
        if t == "mlsys_lab" or t.split(".")[1] in UPPER
    )
    assert not upward, "the engine imports a layer above it:\n" + "\n".join(upward)


def test_dispatch_sits_below_everything_but_the_registry():
    """``dispatch.apply`` reads Op only: it may import the registry, dtypes and errors."""
    allowed = {"mlsys_lab.engine.registry", "mlsys_lab.engine.dtypes", "mlsys_lab.errors"}
    assert import_graph()["mlsys_lab.engine.dispatch"] <= allowed


@pytest.mark.parametrize("source, cycle", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
    ({"a": {"a2"}, "a2": {"b"}, "b": {"a2"}}, ["a2", "b", "a2"]),
])
def test_the_cycle_finder_finds_cycles(source, cycle):
    assert find_cycle(source) == cycle


def test_function_local_imports_count(tmp_path):
    """A lazy import inside a function is an edge too (the cycles it hid are the point)."""
    files = {"__init__.py": "", "engine/__init__.py": "", "viz/__init__.py": "",
             "engine/graph.py": "def draw():\n    from ..viz import view\n",
             "viz/view.py": "from ..engine.graph import draw\n"}
    for name, text in files.items():
        (tmp_path / "mlsys_lab" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mlsys_lab" / name).write_text(text)
    cycle = find_cycle(import_graph(tmp_path / "mlsys_lab"))
    assert cycle == ["mlsys_lab.engine.graph", "mlsys_lab.viz.view", "mlsys_lab.engine.graph"]
