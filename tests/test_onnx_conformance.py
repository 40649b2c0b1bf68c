"""ONNX's own backend node tests, fed through ``import_onnx`` and the graph interpreter.

The onnx wheel ships ~1,900 in-memory node tests (``onnx.backend.test.loader``): a one-node
(or function-expanded) model, its inputs and the expected outputs. A case is *attempted* when
every op type in it imports to a registry op (the set comes from scanning the registry's
``Op.onnx`` records, plus the constant makers ``Constant``/``Shape``/...), and every tensor it
feeds, stores or returns has a dtype mlsys_lab has (bool, uint8, int32, int64, float16/32/64):
a case in int8 or bfloat16 is counted and listed apart, since no op of the library takes it.
An attempted case passes when the imported graph's outputs match the expected ones: floats
within rtol 1e-4, atol 1e-5 (float16: 2 ulps relative, the tests' own data being float16),
everything else exactly. A graph input whose value decides shapes (a Reshape's target fed as
an input) is bound as a constant through ``static_inputs``, as the error message suggests.

Run ``python tests/test_onnx_conformance.py [--markdown FILE]`` for the full table.
"""

import collections
import sys
import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from mlsys_lab.deploy import StaticInputError, import_onnx, supported_onnx_ops  # noqa: E402
from mlsys_lab.deploy.onnx_import import CONSTANT_MAKERS  # noqa: E402
from mlsys_lab.engine import dtypes  # noqa: E402
from mlsys_lab.engine.interpreter import Interpreter  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
#: The pass-rate target over the attempted cases.
TARGET = 0.95

Result = collections.namedtuple("Result", "name op_types status reason")


def load_cases():
    """Every node test case in the installed onnx wheel."""
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators overflow casts on purpose
        return load_node_model_tests()


def _array(x):
    return numpy_helper.to_array(x) if isinstance(x, onnx.TensorProto) else x


def _foreign_dtype(case):
    """The first dtype of the case's tensors that mlsys_lab lacks (or a non-tensor kind)."""
    graph = case.model.graph
    for info in list(graph.input) + list(graph.output):
        kind = info.type.WhichOneof("value")
        if kind != "tensor_type":
            return kind
        dt = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
        if np.dtype(dt) not in dtypes.SUPPORTED:
            return np.dtype(dt).name
    for t in graph.initializer:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
        if dt not in dtypes.SUPPORTED:
            return dt.name
    return None


def classify(case, importable, makers):
    """'no counterpart', 'dtype <name>' or 'attempted' for one node test case."""
    types = {n.op_type for n in case.model.graph.node}
    if not types & importable or not types <= importable | makers:
        return "no counterpart"
    foreign = _foreign_dtype(case)
    return f"dtype {foreign}" if foreign else "attempted"


def _tolerance(dtype):
    if dtype == np.float16:
        return 2 * float(np.finfo(np.float16).eps), 2 * float(np.finfo(np.float16).eps)
    return RTOL, ATOL


def compare(outputs, expected):
    """None when ``outputs`` match ``expected`` (types exactly, values within tolerance),
    else why not."""
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(outputs, expected)):
        got, want = np.asarray(got), np.asarray(_array(want))
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"output {i} is {got.dtype}{list(got.shape)}, expected " \
                   f"{want.dtype}{list(want.shape)}"
        if got.dtype.kind in "fc":
            rtol, atol = _tolerance(got.dtype)
            if not np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True):
                err = np.nanmax(np.abs(got.astype(np.float64) - want)) if got.size else 0
                return f"output {i} differs by up to {err:.3g}"
        elif not np.array_equal(got, want):
            return f"output {i} differs in {int(np.sum(got != want))} elements"
    return None


def run_case(case):
    """Import and run one case; returns None (passed) or the reason it failed."""
    inputs, expected = case.data_sets[0]
    inits = {t.name for t in case.model.graph.initializer}
    names = [i.name for i in case.model.graph.input if i.name not in inits]
    feed = dict(zip(names, (_array(x) for x in inputs)))
    static = {}
    try:
        while True:
            try:
                graph = import_onnx(case.model, static_inputs=static)
                break
            except StaticInputError as e:
                if e.input_name in static or e.input_name not in feed:
                    raise
                static[e.input_name] = feed[e.input_name]
        with np.errstate(all="ignore"):
            outputs = Interpreter(graph).run(*[feed[v.name] for v in graph.inputs])
    except Exception as e:  # noqa: BLE001 - every failure is a row of the table
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first}"
    return compare(outputs, expected)


def onnxruntime_note(case):
    """For a case whose values differ: how far onnxruntime is from mlsys_lab on it."""
    try:
        import onnxruntime as ort

        inputs, _ = case.data_sets[0]
        session = ort.InferenceSession(case.model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        theirs = session.run(None, dict(zip(names, (_array(x) for x in inputs))))
        graph = import_onnx(case.model)
        ours = Interpreter(graph).run(*[_array(x) for x in inputs])
        err = max(float(np.max(np.abs(np.asarray(a, np.float64) - b))) for a, b in
                  zip(ours, theirs))
        return f"; onnxruntime and mlsys_lab differ by {err:.3g}"
    except Exception:  # noqa: BLE001 - a note only
        return ""


def conformance(cases=None):
    """Classify and run every case; returns the list of :class:`Result`."""
    cases = load_cases() if cases is None else cases
    importable = set(supported_onnx_ops())
    makers = {m.op_type for m in CONSTANT_MAKERS}
    results = []
    for case in cases:
        types = tuple(sorted({n.op_type for n in case.model.graph.node}))
        status = classify(case, importable, makers)
        reason = None
        if status == "attempted":
            reason = run_case(case)
            if reason is not None and "differs by" in reason:
                reason += onnxruntime_note(case)
            status = "passed" if reason is None else "failed"
        results.append(Result(case.name, types, status, reason))
    return results


def summary(results):
    """The printed line: totals, attempted, passed and the pass rate."""
    counts = collections.Counter(r.status for r in results)
    attempted = counts["passed"] + counts["failed"]
    foreign = sum(n for s, n in counts.items() if s.startswith("dtype"))
    rate = counts["passed"] / attempted if attempted else 0.0
    return (f"ONNX node tests: {len(results)} total; {len(results) - counts['no counterpart']} "
            f"use only op types with a registry counterpart; {foreign} of those need a dtype "
            f"mlsys_lab lacks; attempted {attempted}, passed {counts['passed']} ({rate:.1%}), "
            f"failed {counts['failed']}")


def markdown(results):
    """The generated tables: the failures with reasons, and the dtype exclusions by dtype."""
    lines = [summary(results), "", "| failing node test | ONNX ops | reason |", "|---|---|---|"]
    for r in results:
        if r.status == "failed":
            lines.append(f"| {r.name} | {', '.join(r.op_types)} | "
                         f"{r.reason.replace('|', '/')} |")
    by_dtype = collections.Counter(r.status[6:] for r in results if r.status.startswith("dtype"))
    lines += ["", "| dtype mlsys_lab lacks | node tests |", "|---|---|"]
    lines += [f"| {dt} | {n} |" for dt, n in by_dtype.most_common()]
    return "\n".join(lines)


# --- the tests -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cases():
    return load_cases()


@pytest.fixture(scope="module")
def results(cases):
    return conformance(cases)


def test_node_test_pass_rate(results, capsys):
    with capsys.disabled():
        print("\n" + markdown(results))
    attempted = [r for r in results if r.status in ("passed", "failed")]
    passed = [r for r in attempted if r.status == "passed"]
    assert len(attempted) >= 600, "the attempted set shrank: an importer stopped registering?"
    assert len(passed) / len(attempted) >= TARGET, markdown(results)


def test_the_attempted_set_is_derived_from_the_registry(cases):
    importable = set(supported_onnx_ops())
    assert {"Conv", "Relu", "Gemm", "MaxPool", "Softmax", "LRN"} <= importable
    makers = {m.op_type for m in CONSTANT_MAKERS}
    relu = next(c for c in cases if c.name == "test_relu")
    assert classify(relu, importable, makers) == "attempted"
    assert classify(relu, importable - {"Relu"}, makers) == "no counterpart"
    assert not importable & makers


def test_a_wrong_importer_fails_its_node_tests(cases, monkeypatch):
    """The harness can fail: an importer of Relu that emits abs is caught by test_relu."""
    from mlsys_lab.deploy.onnx_mapping import OnnxImport, OnnxMapping, _im_op
    from mlsys_lab.engine.registry import get

    relu = get("relu")
    wrong = OnnxMapping(relu.onnx.export, relu.onnx.writes, (OnnxImport("Relu", _im_op("abs")),))
    monkeypatch.setattr(relu, "onnx", wrong)
    case = next(c for c in cases if c.name == "test_relu")
    assert "differs" in run_case(case)


def test_a_failure_reason_names_the_node(cases):
    case = next(c for c in cases if c.name == "test_maxpool_with_argmax_2d_precomputed_pads")
    reason = run_case(case)
    assert "MaxPool" in reason and "Indices" in reason


if __name__ == "__main__":
    table = markdown(conformance())
    if "--markdown" in sys.argv:
        with open(sys.argv[sys.argv.index("--markdown") + 1], "w", encoding="utf-8") as f:
            f.write(table + "\n")
    print(table)
