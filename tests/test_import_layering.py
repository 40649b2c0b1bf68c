"""Imports flow one way (DESIGN.md §2, "The backend's shape"; issue 28, item 6).

The package's import graph — every ``import`` and ``from ... import`` in every module, the ones
inside functions included, since a function-local import is still a dependency — must be
acyclic, and every import must point down the declared package order :data:`TIERS` (the engine
at the bottom, the ``mlsys-lab`` command at the top). A lazy import that hides a cycle,
``engine/graph.py`` importing ``viz`` to draw itself, or the compiler importing ``nn`` for the
training step each fail here with the offending edge (module -> module, and the line) named.

A package's ``_``-names are its own: no module imports a ``_``-name (or a ``_``-module) of another
package, or reaches one as an attribute of a name it imported (``sampler._draw``,
``Tensor._wrap``, ``getattr(sampler, "_draw")``). Sibling modules inside one package (``data/``,
its subpackages included) may still share them; tests are not checked.
"""

import ast
import functools
import pathlib
import shutil

import pytest

PKG = pathlib.Path(__file__).resolve().parents[1] / "mlsys_lab"

#: The declared package order, bottom first. A package may import any package of an earlier tier;
#: never one of a later tier, nor another package of its own tier (those are independent).
#: Why this order (each step is what today's imports need):
#: - ``errors`` and ``timing`` are foundations: everything raises the library's errors, and the
#:   kernels, deploy passes and viz time things with ``timing`` (which needs only ``errors``).
#:   ``span`` (the one timeline record, ``Span``) sits beside it: the engine, data, distributed
#:   and viz all emit or draw spans, and it imports nothing of the package.
#: - ``engine`` (with ``ops``, see PART_OF) is the bottom layer of the framework proper;
#:   ``kernels`` register Numba impls on its ops; ``nn`` and ``optim`` use both (the
#:   embedding-bag and fused optimiser kernels).
#: - ``data`` needs only the engine; it sits above ``nn``/``optim`` as the issue ordered it (a
#:   loader feeds layers, never the reverse), which leaves it free to use them later.
#: - ``distributed`` uses ``data`` (the fault-tolerant sampler) and ``nn``.
#: - the chapter packages ``deploy`` and ``recsys`` build on all of that (``recsys`` places tables
#:   with ``distributed``'s cost model and simulator).
#: - ``llm`` quantises its GPT with ``deploy.quant``, so it sits one tier above deploy; the
#:   other later chapter packages (``federated``, ``rl``, ``explain``, ``robotics``) sit beside
#:   it, free to use everything below (the simulator, deploy's models) and independent of each
#:   other.
#: - ``viz`` draws what the layers below record (it imports ``distributed`` to draw collectives
#:   and pipeline schedules), so it sits above the chapter packages, not beside the engine;
#:   the engine draws through a renderer ``viz`` registers.
#: - ``mlsys_lab`` (the root ``__init__``, ``import mlsys_lab as ml``) re-exports engine, nn and
#:   viz names, so nothing below it may ``import mlsys_lab``; only grading and the CLI do.
#: - ``reader`` (start page, doctor, export) asks ``viz`` and ``distributed.mpi`` what works;
#:   ``grading`` runs exercises against everything; ``cli`` is the ``mlsys-lab`` command over
#:   reader and grading.
TIERS = [
    ("errors",),
    ("timing", "span"),
    ("engine",),
    ("kernels",),
    ("nn", "optim"),
    ("data",),
    ("distributed",),
    ("deploy", "recsys"),
    ("llm", "federated", "rl", "explain", "robotics"),
    ("viz",),
    ("mlsys_lab",),
    ("reader",),
    ("grading",),
    ("cli",),
]

#: Top-level modules that are part of a package's layer (imports between them are internal).
PART_OF = {
    # ``ml.ops``: the engine's ops as functions, a namespace over engine/ops_*.py; the engine's
    # tensor methods and random-graph generator call ops through it.
    "ops": "engine",
    # the notebook normal form: the reader's start page writes it, and its CLI finds the
    # project through ``reader.catalogue``.
    "notebook_format": "reader",
}

#: Known upward or same-tier edges, ``(importing module, imported module): reason``: the to-do
#: (empty: today's imports already follow TIERS). A stale entry fails too, so the list shrinks.
LAYER_ALLOWLIST = {
}

#: Known uses of another package's ``_``-names, ``(importing module, dotted name): reason``: the
#: to-do. A stale entry fails too.
PRIVATE_ALLOWLIST = {
    # EmbeddingBag.forward wraps ids / per_sample_weights without the dtype check Tensor(...)
    # does, so string ids still get its own "ids must be integers"; the embedding rework
    # (issue 28 item 3) should give it a public path (or the engine a public no-copy wrap).
    ("mlsys_lab.nn.embedding", "mlsys_lab.engine.tensor.Tensor._wrap"):
        "needs a public no-copy wrap that keeps the embedding's own dtype error",
}


def modules_of(pkg):
    """``{dotted module name: path}`` for every ``.py`` file of the package at ``pkg``."""
    def name(path):
        parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return {name(p): p for p in pkg.rglob("*.py")}


@functools.lru_cache(maxsize=None)
def _parse(text):
    return ast.parse(text)   # keyed by the text: a copy of the package parses no file twice


def _parsed(pkg):
    """``({module: path}, {module: ast})`` for the package at ``pkg``."""
    modules = modules_of(pkg)
    return modules, {m: _parse(p.read_text(encoding="utf-8")) for m, p in modules.items()}


def _from_target(modules, module, node):
    """The module name a ``from ... import`` statement in ``module`` reads from, resolved."""
    if not node.level:
        return node.module or ""
    is_pkg = modules[module].name == "__init__.py"
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(modules, module, node):
    """Module names an import statement depends on (resolved against ``module``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    target = _from_target(modules, module, node)
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target
            for a in node.names]


def _owner(modules, name):
    """The package module a dotted import name lives in (``a.b.c`` -> ``a.b`` if ``c`` is a
    name defined in ``a.b``), or None outside the package."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(pkg=PKG):
    """Every import inside the package at ``pkg``: sorted ``(module, imported module, line)``."""
    modules, trees = _parsed(pkg)
    edges = set()
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(modules, module, node):
                    target = _owner(modules, name)
                    if target is not None and target != module:
                        edges.add((module, target, node.lineno))
    return sorted(edges)


def import_graph(pkg=PKG):
    """``{module: {module it imports}}`` over the whole package at ``pkg``."""
    edges = {m: set() for m in modules_of(pkg)}
    for module, target, _ in import_edges(pkg):
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


def unit(module):
    """The package a module is layered as: ``mlsys_lab.data.sampler`` -> ``data``, a top-level
    module its own name (or the package it is :data:`PART_OF`), the root ``mlsys_lab``."""
    parts = module.split(".")
    return "mlsys_lab" if len(parts) == 1 else PART_OF.get(parts[1], parts[1])


TIER = {name: i for i, tier in enumerate(TIERS) for name in tier}


def undeclared_units(pkg=PKG):
    """Packages and top-level modules of ``pkg`` that :data:`TIERS` does not place."""
    return sorted({unit(m) for m in modules_of(pkg)} - TIER.keys())


def layer_violations(pkg=PKG):
    """``(module, imported module, line)`` for every import of a later tier's package, or of
    another package in the same tier."""
    return [(m, t, line) for m, t, line in import_edges(pkg)   # undeclared: the test above
            if unit(m) != unit(t) and unit(m) in TIER and unit(t) in TIER
            and TIER[unit(t)] >= TIER[unit(m)]]


def _is_private(name):
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_part(modules, dotted):
    """``(owning module, private dotted prefix)`` if a component of ``dotted`` after the root is a
    ``_``-name (``mlsys_lab.data._shm.x`` -> ``("mlsys_lab.data", "mlsys_lab.data._shm")``)."""
    parts = dotted.split(".")
    for i in range(1, len(parts)):
        if _is_private(parts[i]):
            return _owner(modules, ".".join(parts[:i])), ".".join(parts[: i + 1])
    return None


def _attribute_path(node, bound):
    """``a.b.c`` for an attribute chain whose base name ``a`` an import bound to a package name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return ".".join([bound[node.id]] + attrs[::-1])
    return None


def private_uses(pkg=PKG):
    """``(module, private dotted name, line)`` for every ``_``-name of another package a module
    reaches: imported (``from ..data._shm import x``, ``from ..data.sampler import _draw``,
    ``import mlsys_lab.data._shm``), or read as an attribute of a name an import bound
    (``sampler._draw``, ``ml.data.sampler._draw``, ``Tensor._wrap``, ``getattr(sampler, "_draw")``).
    Not followed (no types here): names bound otherwise (``t = ml.tensor(x); t._ctx``, a module
    passed as an argument), ``getattr`` with a computed name, and an imported name shadowed by a
    local variable of the same name (that one would be reported falsely)."""
    modules, trees = _parsed(pkg)
    root = pkg.name
    found = set()
    for module, tree in trees.items():
        bound, reached = {}, []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == root:
                        reached.append((a.name, node.lineno))
                        bound[a.asname or root] = a.name if a.asname else root
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(modules, module, node)
                if target.split(".")[0] != root:
                    continue
                for a in node.names:
                    reached.append((f"{target}.{a.name}", node.lineno))
                    bound[a.asname or a.name] = f"{target}.{a.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                base = _attribute_path(node.value, bound)
                if base is not None:
                    reached.append((f"{base}.{node.attr}", node.lineno))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2
                  and isinstance(node.args[1], ast.Constant)
                  and isinstance(node.args[1].value, str) and _is_private(node.args[1].value)):
                base = _attribute_path(node.args[0], bound)
                if base is not None:
                    reached.append((f"{base}.{node.args[1].value}", node.lineno))
        for dotted, line in reached:
            private = _private_part(modules, dotted)
            if private and private[0] and unit(private[0]) != unit(module):
                found.add((module, private[1], line))
    return sorted(found)


def _report(violations, allowlist):
    """The violations not allowlisted, one per line, and the allowlist entries no longer hit."""
    new = [f"{m} -> {t} (line {line})" for m, t, line in violations if (m, t) not in allowlist]
    stale = sorted(f"{m} -> {t}" for m, t in allowlist.keys() - {(m, t) for m, t, _ in violations})
    return new, stale


def test_the_package_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert not cycle, "import cycle: " + " -> ".join(cycle)


def test_every_package_has_a_place_in_the_order():
    missing = undeclared_units()
    assert not missing, f"place these in TIERS (or PART_OF) in {__file__}: {missing}"


def test_imports_point_down_the_declared_order():
    """Covers the engine rule of DESIGN.md §2: the engine is the lowest package but errors/timing,
    so it imports nothing of nn, optim, kernels, viz, data, grading, ... nor the root."""
    new, stale = _report(layer_violations(), LAYER_ALLOWLIST)
    assert not new, "imports of a later tier (or of a peer in the same tier):\n" + "\n".join(new)
    assert not stale, "LAYER_ALLOWLIST entries that no longer occur (delete them):\n" + "\n".join(
        stale)


def test_no_module_uses_another_packages_private_names():
    new, stale = _report(private_uses(), PRIVATE_ALLOWLIST)
    assert not new, "uses of another package's _-names:\n" + "\n".join(new)
    assert not stale, "PRIVATE_ALLOWLIST entries that no longer occur (delete them):\n" + "\n".join(
        stale)


# Packages whose modules share no ``_``-names even among themselves: what one module uses from
# another is public inside the package (the other packages may still share them, for now).
PRIVATE_FREE = ("data", "deploy", "distributed")


def imports_of_private_names(package_dir):
    """``file:line`` of every import in ``package_dir`` of a ``_``-name, or (relative imports)
    from one of the package's ``_``-modules."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(_parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                parts = (node.module or "").split(".") if node.level else []
                if any(map(_is_private, parts)) or any(_is_private(a.name) for a in node.names):
                    found.append(f"{path.relative_to(package_dir.parent)}:{node.lineno}")
    return found


@pytest.mark.parametrize("package", PRIVATE_FREE)
def test_no_module_imports_a_private_name_even_within_its_package(package):
    found = imports_of_private_names(PKG / package)
    assert not found, f"_-names imported inside {package}/:\n" + "\n".join(found)


def test_a_private_import_within_a_package_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("from .sub._hidden import x\nfrom .b import public, __all__\n")
    (pkg / "sub" / "c.py").write_text("from ..a import _helper\nfrom numpy import ndarray\n")
    assert imports_of_private_names(pkg) == ["pkg/a.py:1", "pkg/sub/c.py:1"]


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


def _tree(tmp_path, files):
    """A package ``mlsys_lab`` under ``tmp_path`` holding ``files`` (``{path: text}``)."""
    for name, text in files.items():
        (tmp_path / "mlsys_lab" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "mlsys_lab" / name).write_text(text)
    return tmp_path / "mlsys_lab"


#: A small stand-in for the package: a module or two per layer.
STUBS = {name: "" for name in (
    "__init__.py", "ops.py", "engine/__init__.py", "nn/__init__.py", "nn/layers.py",
    "optim/__init__.py", "data/__init__.py", "data/sampler.py", "distributed/__init__.py",
    "distributed/cost.py", "viz/__init__.py")}


def test_function_local_imports_count(tmp_path):
    """A lazy import inside a function is an edge too (the cycles it hid are the point)."""
    pkg = _tree(tmp_path, {"__init__.py": "", "engine/__init__.py": "", "viz/__init__.py": "",
                           "engine/graph.py": "def draw():\n    from ..viz import view\n",
                           "viz/view.py": "from ..engine.graph import draw\n"})
    cycle = find_cycle(import_graph(pkg))
    assert cycle == ["mlsys_lab.engine.graph", "mlsys_lab.viz.view", "mlsys_lab.engine.graph"]


@pytest.mark.parametrize("name, text, edge", [
    ("engine/planted.py", "def f():\n    from ..nn import layers\n",
     ("mlsys_lab.engine.planted", "mlsys_lab.nn.layers", 2)),          # upward, function-local
    ("data/planted.py", "import mlsys_lab.distributed.cost\n",
     ("mlsys_lab.data.planted", "mlsys_lab.distributed.cost", 1)),     # upward, absolute
    ("nn/planted.py", "from ..optim import SGD\n",
     ("mlsys_lab.nn.planted", "mlsys_lab.optim", 1)),                  # a peer in the same tier
    ("viz/planted.py", "from .. import ops\nimport mlsys_lab as ml\n",
     ("mlsys_lab.viz.planted", "mlsys_lab", 2)),                       # the root is above viz
])
def test_an_upward_import_fails_with_its_edge_named(tmp_path, name, text, edge):
    pkg = _tree(tmp_path, {**STUBS, name: text})
    assert layer_violations(pkg) == [edge]
    assert _report(layer_violations(pkg), {}) == ([f"{edge[0]} -> {edge[1]} (line {edge[2]})"], [])


def test_downward_imports_pass(tmp_path):
    pkg = _tree(tmp_path, {**STUBS, "viz/ok.py": "from ..distributed import cost\n",
                           "distributed/ok.py": "import mlsys_lab.data.sampler\n",
                           "engine/ok.py": "from .. import ops\n"})   # ops is part of the engine
    assert layer_violations(pkg) == []


def test_a_new_package_must_be_placed(tmp_path):
    pkg = _tree(tmp_path, {"__init__.py": "", "engine/__init__.py": "", "newpkg/__init__.py": ""})
    assert undeclared_units(pkg) == ["newpkg"]


@pytest.mark.parametrize("text, name", [
    ("from ..data._shm import x\n", "mlsys_lab.data._shm"),                # a _-module
    ("from ..data import _shm\n", "mlsys_lab.data._shm"),
    ("import mlsys_lab.data._shm\n", "mlsys_lab.data._shm"),
    ("from ..data.sampler import _draw\n", "mlsys_lab.data.sampler._draw"),  # a _-name
    ("from ..data import sampler\ndef f():\n    return sampler._draw\n",
     "mlsys_lab.data.sampler._draw"),                                        # attribute access
    ("import mlsys_lab.data.sampler as s\ns.Sampler._draw\n",
     "mlsys_lab.data.sampler.Sampler._draw"),                                # through a class
    ("from ..data.sampler import Sampler\nSampler._draw\n",
     "mlsys_lab.data.sampler.Sampler._draw"),                                # an imported class
    ("import mlsys_lab as ml\nml.data._draw\n", "mlsys_lab.data._draw"),
    ("from ..data import sampler\ngetattr(sampler, '_draw')\n", "mlsys_lab.data.sampler._draw"),
])
def test_another_packages_private_name_fails(tmp_path, text, name):
    pkg = _tree(tmp_path, {**STUBS, "data/_shm.py": "", "distributed/planted.py": text})
    assert [(m, n) for m, n, _ in private_uses(pkg)] == [("mlsys_lab.distributed.planted", name)]


def test_siblings_and_dunders_may_share_names(tmp_path):
    pkg = _tree(tmp_path, {**STUBS, "data/_shm.py": "",
                           "data/a.py": "from ._shm import x\nfrom . import sampler\nsampler._y\n",
                           "data/b.py": "from .. import __version__\n",
                           "distributed/c.py": "from ..data import a\na.__name__\n"})
    assert private_uses(pkg) == []


def test_a_violation_planted_in_a_copy_of_the_real_tree_is_the_only_one(tmp_path):
    """Both checks on the real package plus one planted module each: exactly the planted
    violation is reported (the allowlists cover the rest of today's tree)."""
    pkg = tmp_path / "mlsys_lab"
    shutil.copytree(PKG, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "engine" / "planted.py").write_text("def f():\n    from .. import cli\n")
    (pkg / "distributed" / "planted.py").write_text("from ..engine import tensor\ntensor._x\n")
    assert _report(layer_violations(pkg), LAYER_ALLOWLIST) == (
        ["mlsys_lab.engine.planted -> mlsys_lab.cli (line 2)"], [])
    assert _report(private_uses(pkg), PRIVATE_ALLOWLIST) == (
        ["mlsys_lab.distributed.planted -> mlsys_lab.engine.tensor._x (line 2)"], [])
