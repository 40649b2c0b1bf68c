"""Registry-wide facts, checked for every registered op at once (DESIGN.md §2).

On top of the op-by-op conformance harness (``tests/conformance.py``, whose completeness test
already demands a gradient check or a stated reason for every op), these hold for the whole
registry:

* every elementwise op with a floating result is fusable (has a ``fusion`` template) or says
  why not (``unfusable_reason``) — a new op cannot silently fall out of fusion;
* every op's shape rule agrees with its kernel: for each conformance case, each input is
  perturbed (an extra trailing axis, a dropped leading axis, the last dimension changed) and
  ``infer`` must either reject the input with a library error (``MLSysError``) or predict
  exactly the shape and dtype the numpy kernel produces. A rule that accepts what the kernel
  cannot run (a bare numpy traceback later) or predicts the wrong shape fails here;
* no module outside the registry keeps a dict or set keyed by op names: per-op facts live on
  the ``Op`` record (``OUT_KERNELS``, ``TEMPLATES``, ``VIEW_OPS`` and ``ELEMENTWISE_OPS`` were
  such tables, and ``ELEMENTWISE_OPS`` had drifted from the registry).
"""

import ast
import pathlib
import warnings

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine.registry import REGISTRY, AVal, get
from mlsys_lab.errors import MLSysError

from .. import conformance as C

OPS = C.registered_ops()
PKG = pathlib.Path(ml.__file__).resolve().parent


# --- fusion -----------------------------------------------------------------------------------
def _float_result(op_name):
    spec = C.SPECS.get(op_name)
    for case in spec.cases if spec else ():
        out = case.fn(*[ml.tensor(a) for a in case.inputs])
        return np.dtype(out.dtype).kind == "f"
    return True  # no case to tell: hold it to the float rule


@pytest.mark.parametrize("op_name", [n for n in OPS if get(n).elementwise])
def test_elementwise_float_ops_are_fusable_or_say_why_not(op_name):
    op = get(op_name)
    if _float_result(op_name):
        assert op.fusion or op.unfusable_reason, (
            f"{op_name} is elementwise with a float result but has neither a fusion template "
            f"nor an unfusable_reason")
    assert not (op.fusion and op.unfusable_reason), f"{op_name}: fusable and not, both"


def test_fusion_templates_name_their_inputs():
    for name in OPS:
        op = get(name)
        if op.fusion:
            assert "{0}" in op.fusion, f"{name}: template {op.fusion!r} never reads its input"


# --- shape rules --------------------------------------------------------------------------------
def _node_of(case):
    """The traced node of ``case.op`` and its input avals."""
    graph = ml.trace(case.fn, *case.inputs)
    for node in graph.nodes:
        if node.op == case.op:
            return node
    return None


def _perturbed(shape):
    """Shapes near ``shape`` that many shape rules must refuse."""
    out = [shape + (7,)]
    if shape:
        out += [shape[1:], shape[:-1] + (shape[-1] + 3,)]
    return [s for s in out if s != shape]


def _array(aval):
    dt = np.dtype(aval.dtype)
    return np.zeros(aval.shape, dt) if dt.kind in "iub" else np.full(aval.shape, 0.5, dt)


def _shape_cases():
    cases = []
    for name in OPS:
        spec = C.SPECS.get(name)
        if spec is None or not spec.cases or get(name).impure:
            continue
        case = spec.cases[0]
        cases.append(pytest.param(case, id=case.id))
    return cases


@pytest.mark.parametrize("case", _shape_cases())
def test_shape_rule_agrees_with_the_kernel_on_perturbed_inputs(case):
    node = _node_of(case)
    if node is None:
        pytest.skip(f"{case.id} reaches {case.op} only inside a subgraph")
    op = get(case.op)
    avals = [AVal(tuple(v.shape), np.dtype(v.dtype)) for v in node.inputs]
    for i, aval in enumerate(avals):
        for shape in _perturbed(aval.shape):
            trial = list(avals)
            trial[i] = AVal(shape, aval.dtype)
            what = f"{case.op}: input {i} {aval.shape} -> {shape}"
            try:
                predicted = op.infer(*trial, **node.attrs)
            except MLSysError:
                continue  # refused, with the library's own error
            except Exception as error:  # noqa: BLE001 - the point is to catch foreign ones
                pytest.fail(f"{what}: infer raised {type(error).__name__}: {error} "
                            f"(not a library error)")
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    got = np.asarray(op.compute(*[_array(a) for a in trial], **node.attrs))
                except Exception as error:  # noqa: BLE001
                    pytest.fail(f"{what}: infer accepted it ({predicted}) but the kernel "
                                f"raised {type(error).__name__}: {error}")
            assert (tuple(got.shape), got.dtype) == (tuple(predicted.shape),
                                                     np.dtype(predicted.dtype)), \
                f"{what}: infer predicts {predicted}, the kernel made {got.shape} {got.dtype}"


# --- no tables keyed by op name -----------------------------------------------------------------
#: Where a table's keys only look like op names, with the reason; anywhere else a table keyed by
#: op names is a second source of per-op facts.
ALLOWED = {
    "engine/registry.py": "the registry itself",
    "distributed/collectives/common.py": "MPI's reduction operators (sum, prod, max, min), not ops",
    "distributed/mpi.py": "the same reduction operators mapped to MPI.SUM, ...",
    "rl/agents/networks.py": "an activation's name mapped to its nn layer class (mlp's argument)",
}


def _op_name_keys(node):
    if isinstance(node, ast.Dict):
        keys = node.keys
    elif isinstance(node, ast.Set):
        keys = node.elts
    else:
        return []
    return [k.value for k in keys if isinstance(k, ast.Constant) and k.value in REGISTRY]


def test_no_table_keyed_by_op_names_outside_the_registry():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        if rel in ALLOWED:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = _op_name_keys(node)
            if len(names) >= 2:
                offenders.append(f"{rel}:{node.lineno}: {sorted(names)}")
    assert not offenders, "tables keyed by op name outside the registry:\n" + "\n".join(offenders)


def test_the_table_finder_sees_a_table():
    tree = ast.parse('KERNELS = {"add": 1, "mul": 2}\nOK = {"x": 1, "add": 2}\n')
    found = [_op_name_keys(n) for n in ast.walk(tree) if _op_name_keys(n)]
    assert found == [["add", "mul"], ["add"]]
