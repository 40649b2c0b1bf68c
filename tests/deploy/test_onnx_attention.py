"""ONNX export and import of ``scaled_dot_product_attention`` (chapter 18).

Export at opset 23 writes one ``Attention`` node, checked against onnxruntime and against ONNX's
reference evaluator; below opset 23 the MatMul/Softmax pattern with the fully-masked-row guard.
Import reads ``Attention`` (3-D and 4-D, masks, causal, past/present, GQA; softcap and the
``qk_matmul_output`` output as a composition) and folds the MatMul/Softmax pattern of older
exporters back into one attention node. ONNX's own Attention node tests all pass.
"""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import mlsys_lab as ml  # noqa: E402
from mlsys_lab.deploy import export_onnx, import_onnx  # noqa: E402
from mlsys_lab.engine.ops_attention import attention_reference  # noqa: E402

SDPA = "scaled_dot_product_attention"
F32 = np.float32


def run_ort(model, args):
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {i.name: a for i, a in zip(s.get_inputs(), args)})


def run_reference(model, args):
    feeds = {i.name: a for i, a in zip(model.graph.input, args)}
    return ReferenceEvaluator(model).run(None, feeds)


def _case(name):
    """(function, arrays, dead rows) for the export cases."""
    r = np.random.default_rng(abs(hash(name)) % 2**32)
    shapes, mask, kw = CASES[name]
    q, k, v = (r.standard_normal(s).astype(F32) for s in shapes)
    args, dead = [q, k, v], None
    L, S = shapes[0][-2], shapes[1][-2]
    if mask == "bool":
        m = r.random((L, S)) > 0.4
        m[:, 0] = True
        m[1] = False
        args.append(m)
        dead = 1
    elif mask == "float":
        m = np.where(r.random((L, S)) > 0.3, r.standard_normal((L, S)), -np.inf).astype(F32)
        m[:, 1] = 0.5
        m[0] = -np.inf
        args.append(m)
        dead = 0
    elif mask == "bool_batch":
        m = r.random((2, 1, L, S)) > 0.4
        m[..., 0] = True
        args.append(m)
    return (lambda *a: ml.ops.scaled_dot_product_attention(*a, **kw)), args, dead


CASES = {
    "heads": (((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 4)), None, {}),
    "causal_3d": (((2, 4, 5), (2, 4, 5), (2, 4, 3)), None, dict(is_causal=True)),
    "causal_short_queries": (((1, 2, 3, 4), (1, 2, 6, 4), (1, 2, 6, 4)), None,
                             dict(is_causal=True)),
    "bool_mask_dead_row": (((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2)), "bool", {}),
    "float_mask_dead_row": (((2, 4, 3), (2, 5, 3), (2, 5, 2)), "float", {}),
    "gqa": (((1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 3)), None, dict(enable_gqa=True)),
    "broadcast_batch": (((2, 3, 3, 2), (1, 3, 4, 2), (2, 1, 4, 2)), None, {}),
    "matrices_scale": (((3, 4), (5, 4), (5, 2)), None, dict(scale=0.3)),
    "rank5_mask": (((2, 2, 2, 3, 4), (2, 2, 2, 5, 4), (2, 2, 2, 5, 2)), "bool_batch", {}),
}


def _check_rows(got, want, dead, what):
    """Equal to the op's answer; a fully masked row zero (ONNX's errata: a runtime older than
    it may answer NaN there, which is accepted only for the opset-23 node)."""
    got = np.asarray(got)
    if dead is not None and np.isnan(got[..., dead, :]).any():
        assert what.startswith("opset 23"), f"{what}: NaN in a fully masked row"
        got, want = np.delete(got, dead, -2), np.delete(want, dead, -2)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=what)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("opset", [18, 23])
def test_export_matches_onnxruntime_and_the_reference_evaluator(name, opset):
    fn, args, dead = _case(name)
    want = fn(*args).numpy()
    model = export_onnx(fn, args, opset=opset)
    types = {n.op_type for n in model.graph.node}
    if opset >= 23:
        assert "Attention" in types and not types & {"Softmax", "MatMul"}, types
        assert model.ir_version >= 11
    else:
        assert "Attention" not in types and {"MatMul", "Softmax"} <= types, types
    _check_rows(run_ort(model, args)[0], want, dead, f"opset {opset} {name} onnxruntime")
    _check_rows(run_reference(model, args)[0], want, dead, f"opset {opset} {name} reference")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("opset", [18, 23])
def test_export_then_import_gives_one_attention_node(name, opset):
    fn, args, _ = _case(name)
    graph = import_onnx(export_onnx(fn, args, opset=opset)).lint()
    ours = [n for n in graph.nodes if n.op == SDPA]
    assert len(ours) == 1, [n.op for n in graph.nodes]
    if opset < 23:
        assert not {"softmax", "matmul"} & {n.op for n in graph.nodes}
    np.testing.assert_allclose(np.asarray(graph(*args)), fn(*args).numpy(), rtol=1e-6,
                               atol=1e-7)


def test_the_row_guard_is_left_out_where_no_row_can_be_empty():
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((2, n, 4)).astype(F32) for n in (3, 4, 4))
    m = np.ones((3, 4), bool)
    m[1, 2] = False
    model = export_onnx(lambda a, b, c: ml.ops.scaled_dot_product_attention(a, b, c, m),
                        (q, k, v), opset=18)
    assert "ReduceMax" not in {n.op_type for n in model.graph.node}  # a constant, full rows
    model = export_onnx(lambda a, b, c, d: ml.ops.scaled_dot_product_attention(a, b, c, d),
                        (q, k, v, m), opset=18)
    assert "ReduceMax" in {n.op_type for n in model.graph.node}  # an input: rows may be empty


def test_multihead_attention_module_exports_at_both_opsets():
    m = ml.nn.MultiheadAttention(8, 2, rng=0)
    m.eval()
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(F32)
    want = m(x, is_causal=True)[0].numpy()
    for opset in (18, 23):
        model = export_onnx(lambda a: m(a, is_causal=True)[0], (x,), opset=opset)
        np.testing.assert_allclose(run_ort(model, [x])[0], want, rtol=1e-5, atol=1e-6)
        graph = import_onnx(model)
        assert sum(n.op == SDPA for n in graph.nodes) == 1


# --- importing ONNX Attention --------------------------------------------------------------------
def _model(nodes, inputs, outputs, opset=23, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=11)


def _info(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, list(shape))


def _compare_with_the_reference(model, args, n_out=1):
    graph = import_onnx(model)
    got = graph(*args)
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = run_reference(model, args)
    for g, w in zip(got[:n_out], want[:n_out]):
        np.testing.assert_allclose(np.asarray(g), w, rtol=2e-5, atol=2e-6)
    return graph


def test_import_3d_attention_with_heads_past_and_causal():
    b, L, P, hq, hk, d = 2, 3, 4, 4, 2, 5
    r = np.random.default_rng(2)
    args = [r.standard_normal(s).astype(F32) for s in
            ((b, L, hq * d), (b, L, hk * d), (b, L, hk * d), (b, hk, P, d), (b, hk, P, d))]
    node = helper.make_node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "pres_k",
                            "pres_v"], is_causal=1, q_num_heads=hq, kv_num_heads=hk)
    model = _model([node], [_info("q", args[0].shape), _info("k", args[1].shape),
                            _info("v", args[2].shape), _info("pk", args[3].shape),
                            _info("pv", args[4].shape)],
                   [_info("y", (b, L, hq * d)), _info("pres_k", (b, hk, P + L, d)),
                    _info("pres_v", (b, hk, P + L, d))])
    graph = _compare_with_the_reference(model, args, n_out=3)
    (node,) = [n for n in graph.nodes if n.op == SDPA]
    assert node.attrs["enable_gqa"] and len(node.inputs) == 4  # bottom-right: a mask
    # bottom-right causal: the last query sees every key, the first P + 1 of them
    assert not node.attrs["is_causal"]


def test_import_attention_with_a_float_mask_shorter_than_the_keys():
    r = np.random.default_rng(3)
    q, k, v = (r.standard_normal(s).astype(F32) for s in ((1, 2, 3, 4), (1, 2, 5, 4),
                                                          (1, 2, 5, 3)))
    m = r.standard_normal((3, 4)).astype(F32)  # ONNX pads the last key with -inf
    node = helper.make_node("Attention", ["q", "k", "v", "m"], ["y"], scale=0.7)
    model = _model([node], [_info(n, a.shape) for n, a in zip("qkvm", (q, k, v, m))],
                   [_info("y", (1, 2, 3, 3))])
    _compare_with_the_reference(model, [q, k, v, m])
    padded = np.concatenate([m, np.full((3, 1), -np.inf, F32)], axis=1)
    np.testing.assert_allclose(np.asarray(import_onnx(model)(q, k, v, m)),
                               attention_reference(q, k, v, padded, scale=0.7), rtol=1e-6)


def test_import_softcap_and_qk_output_as_a_composition():
    r = np.random.default_rng(4)
    q, k, v = (r.standard_normal(s).astype(F32) * 3 for s in ((1, 2, 3, 4), (1, 2, 5, 4),
                                                              (1, 2, 5, 4)))
    node = helper.make_node("Attention", ["q", "k", "v"], ["y", "", "", "qk"], softcap=2.0,
                            qk_matmul_output_mode=3, is_causal=1)
    model = _model([node], [_info(n, a.shape) for n, a in zip("qkv", (q, k, v))],
                   [_info("y", (1, 2, 3, 4)), _info("qk", (1, 2, 3, 5))])
    graph = import_onnx(model)
    assert not any(n.op == SDPA for n in graph.nodes)  # softcap: no place on the op
    y, qk = graph(q, k, v)
    want = run_reference(model, [q, k, v])
    np.testing.assert_allclose(np.asarray(y), want[0], rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(np.asarray(qk), want[1], rtol=2e-5, atol=2e-6)


def test_onnx_attention_node_tests_all_pass():
    from tests.deploy import test_onnx_conformance as T

    cases = [c for c in T.load_cases()
             if any(n.op_type == "Attention" for n in c.model.graph.node)]
    assert len(cases) >= 50
    results = T.conformance(cases)
    bad = [(r.name, r.status, r.reason) for r in results if r.status != "passed"]
    assert not bad, bad


# --- importing the MatMul/Softmax pattern --------------------------------------------------------
def _pattern_model(style, L=3, S=5, E=4, Ev=2, mask=None):
    """Attention as older exporters write it: ``style`` "torch" scales Q and Kᵀ by √scale
    each (torch.onnx's sdpa), "bert" divides Q Kᵀ by √E, "plain" has no scale."""
    nodes, inits = [], []
    c = helper.make_tensor
    nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]))
    if style == "torch":
        root = float(np.sqrt(1 / np.sqrt(E)))
        inits += [c("c", TensorProto.FLOAT, [], [root])]
        nodes += [helper.make_node("Mul", ["q", "c"], ["qs"]),
                  helper.make_node("Mul", ["kt", "c"], ["kts"]),
                  helper.make_node("MatMul", ["qs", "kts"], ["s"])]
    elif style == "bert":
        inits += [c("d", TensorProto.FLOAT, [], [float(np.sqrt(E))])]
        nodes += [helper.make_node("MatMul", ["q", "kt"], ["s0"]),
                  helper.make_node("Div", ["s0", "d"], ["s"])]
    else:
        nodes.append(helper.make_node("MatMul", ["q", "kt"], ["s"]))
    inputs = [_info("q", (2, L, E)), _info("k", (2, S, E)), _info("v", (2, S, Ev))]
    scores = "s"
    if mask == "float":
        nodes.append(helper.make_node("Add", ["s", "m"], ["sm"]))
        inputs.append(_info("m", (L, S)))
        scores = "sm"
    elif mask == "causal":
        inits += [helper.make_tensor("tril", TensorProto.BOOL, [L, S],
                                     np.tril(np.ones((L, S), bool)).ravel().tolist()),
                  c("ninf", TensorProto.FLOAT, [], [-np.inf])]
        nodes.append(helper.make_node("Where", ["tril", "s", "ninf"], ["sm"]))
        scores = "sm"
    nodes += [helper.make_node("Softmax", [scores], ["p"], axis=-1),
              helper.make_node("MatMul", ["p", "v"], ["y"])]
    return _model(nodes, inputs, [_info("y", (2, L, Ev))], opset=17, inits=inits)


@pytest.mark.parametrize("style, mask", [("torch", None), ("torch", "float"), ("bert", None),
                                         ("plain", "causal"), ("bert", "float")])
def test_matmul_softmax_pattern_imports_as_one_attention_node(style, mask):
    r = np.random.default_rng(5)
    args = [r.standard_normal(s).astype(F32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 2))]
    if mask == "float":
        args.append(r.standard_normal((3, 5)).astype(F32))
    model = _pattern_model(style, mask=mask)
    graph = _compare_with_the_reference(model, args)
    assert [n.op for n in graph.nodes] == [SDPA], [n.op for n in graph.nodes]
    node = graph.nodes[0]
    assert node.attrs["is_causal"] == (mask == "causal")
    want_scale = 1.0 if style == "plain" else 0.5
    assert node.attrs["scale"] == pytest.approx(want_scale, rel=1e-6)


def test_pattern_with_scores_read_elsewhere_is_not_folded():
    model = _pattern_model("bert")
    model.graph.output.append(_info("s", (2, 3, 5)))  # the scores are an output as well
    r = np.random.default_rng(6)
    args = [r.standard_normal(s).astype(F32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 2))]
    graph = import_onnx(model)
    assert SDPA not in {n.op for n in graph.nodes}
    y, s = graph(*args)
    want = run_reference(model, args)
    np.testing.assert_allclose(np.asarray(y), want[0], rtol=2e-5, atol=2e-6)


def test_softmax_over_another_axis_is_not_attention():
    model = _pattern_model("plain")
    for n in model.graph.node:
        if n.op_type == "Softmax":
            n.attribute[0].i = 1
    r = np.random.default_rng(7)
    args = [r.standard_normal(s).astype(F32) for s in ((2, 3, 4), (2, 5, 4), (2, 5, 2))]
    graph = _compare_with_the_reference(model, args)
    assert SDPA not in {n.op for n in graph.nodes}
