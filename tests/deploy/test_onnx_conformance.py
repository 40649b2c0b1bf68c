"""ONNX's own backend node tests, fed through ``import_onnx`` and the graph interpreter.

The onnx wheel ships ~1,900 in-memory node tests (``onnx.backend.test.loader``): a one-node
(or function-expanded) model, its inputs and the expected outputs. A case is *mapped* when
every op type in it imports to a registry op (the set comes from scanning the registry's
``Op.onnx`` records, plus the constant makers ``Constant``/``Shape``/...). A mapped case is
*attempted* unless a tensor it feeds, stores or returns has a dtype mlsys_lab lacks (strings,
sequences, optionals): every ONNX tensor dtype but those is one of ``dtypes.SUPPORTED``,
compute dtypes and the storage formats (bfloat16, float8, float4, int4/uint4/int2/uint2).
An attempted case passes when the imported graph's outputs match the expected ones: floats
within rtol 1e-4, atol 1e-5 (float16 and bfloat16: 2 ulps relative, the tests' own data being
in those formats), float8/float4 outputs (casts and quantisation) exactly, NaN for NaN, and
everything else exactly. A graph input whose value decides shapes (a Reshape's target fed as
an input) is bound as a constant through ``static_inputs``, as the error message suggests.
The target (``TARGET``) is over every mapped case: a dtype exclusion counts as not passing.

Run ``python tests/deploy/test_onnx_conformance.py [--markdown FILE]`` for the full table.
"""

import collections
import sys
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from mlsys_lab.deploy import (  # noqa: E402
    StaticInputError,
    import_onnx,
    support_table,
    supported_onnx_ops,
)
from mlsys_lab.deploy.onnx.importer import CONSTANT_MAKERS  # noqa: E402
from mlsys_lab.engine import dtypes  # noqa: E402
from mlsys_lab.engine.interpreter import Interpreter  # noqa: E402
from mlsys_lab.engine.registry import REGISTRY  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
#: The pass-rate target over every mapped case (dtype exclusions count as not passing).
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
    """(rtol, atol) for a floating output of ``dtype``: 2 ulps relative for the formats whose
    node tests compute in them (float16, bfloat16), rtol 1e-4 / atol 1e-5 otherwise."""
    if dtype in (np.float16, dtypes.bfloat16):
        eps = 2 * float(ml_dtypes.finfo(dtype).eps)
        return eps, eps
    return RTOL, ATOL


def compare(outputs, expected):
    """None when ``outputs`` match ``expected`` (types exactly, values within tolerance),
    else why not. Outputs of the float8 / float4 formats (casts, quantisation) must match
    exactly, NaN for NaN."""
    if len(outputs) != len(expected):
        return f"{len(outputs)} outputs, expected {len(expected)}"
    for i, (got, want) in enumerate(zip(outputs, expected)):
        got, want = np.asarray(got), np.asarray(_array(want))
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"output {i} is {got.dtype}{list(got.shape)}, expected " \
                   f"{want.dtype}{list(want.shape)}"
        if got.dtype.kind in "fc" or dtypes.is_storage_float(got.dtype):
            g64, w64 = got.astype(np.float64), want.astype(np.float64)
            if dtypes.is_storage_float(got.dtype) and got.dtype != dtypes.bfloat16:
                rtol = atol = 0.0
            else:
                rtol, atol = _tolerance(got.dtype)
            if not np.allclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True):
                bad = ~np.isclose(g64, w64, rtol=rtol, atol=atol, equal_nan=True)
                err = np.nanmax(np.abs(g64 - w64)) if got.size else 0
                return f"output {i} differs in {int(bad.sum())} elements, by up to {err:.3g}"
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
            if reason is not None and "by up to" in reason:
                reason += onnxruntime_note(case)
            status = "passed" if reason is None else "failed"
        results.append(Result(case.name, types, status, reason))
    return results


def mapped_rate(results):
    """(passed, mapped, rate): the passes over every case whose op types all have a registry
    counterpart (the dtype exclusions count as not passing)."""
    counts = collections.Counter(r.status for r in results)
    mapped = len(results) - counts["no counterpart"]
    return counts["passed"], mapped, counts["passed"] / mapped if mapped else 0.0


def summary(results):
    """The printed line: totals, attempted, passed and the pass rates (over the attempted and
    over every mapped case)."""
    counts = collections.Counter(r.status for r in results)
    attempted = counts["passed"] + counts["failed"]
    foreign = sum(n for s, n in counts.items() if s.startswith("dtype"))
    rate = counts["passed"] / attempted if attempted else 0.0
    passed, mapped, mapped_share = mapped_rate(results)
    return (f"ONNX node tests: {len(results)} total; {mapped} use only op types with a "
            f"registry counterpart; {foreign} of those need a dtype mlsys_lab lacks; attempted "
            f"{attempted}, passed {counts['passed']} ({rate:.1%}), failed {counts['failed']}; "
            f"passed {passed} of {mapped} mapped cases ({mapped_share:.1%})")


def markdown(results):
    """The generated table: every mapped case that does not pass (failed, or a dtype or
    value kind mlsys_lab lacks) with its reason, and the dtype exclusions by dtype."""
    lines = [summary(results), "", "| mapped node test not passing | ONNX ops | reason |",
             "|---|---|---|"]
    for r in results:
        if r.status == "failed":
            lines.append(f"| {r.name} | {', '.join(r.op_types)} | "
                         f"{r.reason.replace('|', '/')} |")
        elif r.status.startswith("dtype"):
            lines.append(f"| {r.name} | {', '.join(r.op_types)} | needs {r.status[6:]}, which "
                         f"mlsys_lab has no dtype for |")
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
    passed, mapped, rate = mapped_rate(results)
    assert len(attempted) >= 1000, "the attempted set shrank: an importer stopped registering?"
    assert mapped >= 1000 and passed == sum(r.status == "passed" for r in results)
    assert rate >= TARGET, markdown(results)


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
    from mlsys_lab.deploy.onnx.mapping import OnnxImport, OnnxMapping, import_as
    from mlsys_lab.engine.registry import get

    relu = get("relu")
    wrong = OnnxMapping(relu.onnx.export, relu.onnx.writes, (OnnxImport("Relu", import_as("abs")),))
    monkeypatch.setattr(relu, "onnx", wrong)
    case = next(c for c in cases if c.name == "test_relu")
    assert "differs" in run_case(case)


def test_a_failure_reason_names_the_node(cases):
    case = next(c for c in cases if c.name == "test_training_dropout")
    reason = run_case(case)
    assert "node #0 Dropout" in reason and "random mask" in reason


def _reference(model, feed):
    """onnx.reference's outputs; the model's output shapes are then filled in from them (the
    checker that import_onnx runs wants them)."""
    from onnx.reference import ReferenceEvaluator

    outs = ReferenceEvaluator(model).run(None, feed)
    for info, out in zip(model.graph.output, outs):
        shape = info.type.tensor_type.shape
        del shape.dim[:]
        for d in out.shape:
            shape.dim.add().dim_value = d
    return outs


def _one_node(node, inputs, outputs, opset=21):
    return onnx.helper.make_model(onnx.helper.make_graph([node], "g", inputs, outputs),
                                  opset_imports=[onnx.helper.make_opsetid("", opset)])


def _info(name, shape, elem=onnx.TensorProto.FLOAT):
    return onnx.helper.make_tensor_value_info(name, elem, shape)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("kernel, strides, pads, dilations", [
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1)), ((2, 3), (1, 2), (0, 1, 1, 0), (1, 1)),
    ((2, 2), (1, 1), (0, 0, 0, 0), (2, 1)), ((3,), (2,), (1, 0), (1,))])
def test_maxpool_indices_match_the_reference(kernel, strides, pads, dilations, storage_order):
    spatial = (7, 6)[:len(kernel)]
    x = np.random.default_rng(len(kernel) + storage_order).standard_normal(
        (2, 3) + spatial).astype(np.float32)
    node = onnx.helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=list(kernel),
                                 strides=list(strides), pads=list(pads),
                                 dilations=list(dilations), storage_order=storage_order)
    model = _one_node(node, [_info("x", list(x.shape))],
                      [_info("y", None), _info("i", None, onnx.TensorProto.INT64)])
    want = _reference(model, {"x": x})
    got = Interpreter(import_onnx(model)).run(x)
    assert compare(got, want) is None
    if not storage_order:  # the indices point at the maxima
        np.testing.assert_array_equal(x.reshape(-1)[got[1]], got[0])


@pytest.mark.parametrize("strides, pads, dilations, group, output_padding", [
    ((1, 1, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1, None),
    ((2, 1, 2), (1, 0, 0, 1, 0, 1), (1, 2, 1), 1, (1, 0, 0)),
    ((2, 2, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 2, None)])
def test_conv_transpose_3d_matches_the_reference(strides, pads, dilations, group,
                                                 output_padding):
    r = np.random.default_rng(sum(strides) + group)
    x = r.standard_normal((2, 4, 3, 4, 3)).astype(np.float32)
    w = r.standard_normal((4, 3, 2, 3, 2)).astype(np.float32)
    b = r.standard_normal(3 * group).astype(np.float32)
    attrs = dict(strides=list(strides), pads=list(pads), dilations=list(dilations), group=group)
    if output_padding:
        attrs["output_padding"] = list(output_padding)
    node = onnx.helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    model = _one_node(node, [_info("x", list(x.shape))], [_info("y", None)])
    del model.graph.output[0].type.tensor_type.shape.dim[:]
    model.graph.initializer.extend([numpy_helper.from_array(w, "w"),
                                    numpy_helper.from_array(b, "b")])
    extra = output_padding or (0, 0, 0)
    dims = [2, 3 * group] + [s * (n - 1) + (k - 1) * d + 1 - p0 - p1 + e for s, n, k, d, p0, p1, e
                             in zip(strides, x.shape[2:], w.shape[2:], dilations, pads[:3],
                                    pads[3:], extra)]
    for d in dims:
        model.graph.output[0].type.tensor_type.shape.dim.add().dim_value = d
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": x})
    got = Interpreter(import_onnx(model)).run(x)
    assert compare(got, want) is None


def test_one_hot_out_of_range_indices_give_off_rows():
    idx = np.array([[0, -1, 3], [4, -5, -4]], np.int64)
    node = onnx.helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=1)
    model = _one_node(node, [_info("i", [2, 3], onnx.TensorProto.INT64)], [_info("y", None)])
    model.graph.initializer.extend([numpy_helper.from_array(np.array(4, np.int64), "d"),
                                    numpy_helper.from_array(np.array([2.0, 7.0], np.float32),
                                                            "v")])
    (want,) = _reference(model, {"i": idx})
    (got,) = Interpreter(import_onnx(model)).run(idx)
    np.testing.assert_array_equal(got, want)
    assert np.all(got[1, :, 0] == 2.0) and np.all(got[1, :, 1] == 2.0)  # 4 and -5: all off


# --- the README's support table -------------------------------------------------------------
README = Path(__file__).resolve().parents[2] / "README.md"
README_BEGIN = ("<!-- onnx-support: generated by"
                " `python tests/deploy/test_onnx_conformance.py --readme`; do not edit by hand -->")
README_END = "<!-- /onnx-support -->"


def readme_block(results):
    """The README's ONNX section body: the pass rate (with the onnx version it was measured
    with), every op mapping from the registry, and each mapped case that does not pass."""
    lines = [README_BEGIN, f"Measured with onnx {onnx.__version__}:", "", "```",
             summary(results), "```", "", "| mlsys_lab op | exports as | imported from |",
             "|---|---|---|"]
    refused = []
    for name, writes, reads in support_table():
        if writes or reads:
            lines.append(f"| `{name}` | {', '.join(writes) or '—'} | "
                         f"{', '.join(reads) or '—'} |")
        else:
            refused.append(f"`{name}` ({REGISTRY[name].onnx.no_export_reason})")
    lines += ["", "Refused on export, with the reason in the error: " + "; ".join(refused) + "."]
    lines += ["", "Mapped node tests that do not pass:", "", "| node test | reason |",
              "|---|---|"]
    for r in results:
        if r.status == "failed" or r.status.startswith("dtype"):
            reason = r.reason if r.status == "failed" else f"needs {r.status}"
            lines.append(f"| {r.name} | {reason.replace('|', '/')} |")
    return "\n".join(lines + [README_END])


def _readme_section(text):
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    return start, end


def test_the_readme_shows_the_support_table_and_pass_rate(results):
    text = README.read_text(encoding="utf-8")
    start, end = _readme_section(text)
    committed, fresh = text[start:end], readme_block(results)
    table = [ln for ln in fresh.splitlines() if ln.startswith("| `")]
    rerun = "run python tests/deploy/test_onnx_conformance.py --readme"
    assert [ln for ln in committed.splitlines() if ln.startswith("| `")] == table, \
        f"README's ONNX op table is stale: {rerun}"
    if f"Measured with onnx {onnx.__version__}:" in committed:  # same node tests: same text
        assert committed == fresh, f"README's ONNX pass rate is stale: {rerun}"


if __name__ == "__main__":
    results = conformance()
    if "--readme" in sys.argv:
        text = README.read_text(encoding="utf-8")
        start, end = _readme_section(text)
        README.write_text(text[:start] + readme_block(results) + text[end:], encoding="utf-8")
    table = markdown(results)
    if "--markdown" in sys.argv:
        with open(sys.argv[sys.argv.index("--markdown") + 1], "w", encoding="utf-8") as f:
            f.write(table + "\n")
    print(table)
