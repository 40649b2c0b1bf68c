"""An int8 model exported as ONNX QDQ (QuantizeLinear / DequantizeLinear around the weights and
activations) runs in onnxruntime and agrees with mlsys_lab's QDQ graph and its int8 kernels
within one quantisation step of the output.

onnxruntime's *optimised* session fuses the QDQ pattern into its integer kernels, and on an x86
CPU without VNNI those sum u8 x s8 products in saturating int16 pairs (``vpmaddubsw``): there its
answer is not the exact one but the one :mod:`mlsys_lab.deploy.quant.int16_pairs` predicts. So the
optimised session is compared exactly where the CPU has VNNI, with 7-bit weights, or with
onnxruntime's u8 x u8 kernels (``session.x64quantprecision``), and with the prediction elsewhere;
the unoptimised session is exact everywhere.
"""

import platform

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.deploy import export_onnx
from mlsys_lab.deploy import passes as P
from mlsys_lab.deploy import quant as Q
from mlsys_lab.deploy.quant import int8_kernels as K
from mlsys_lab.deploy.quant.int16_pairs import host_has_vnni, run_int16_pairs

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1, rng=0), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 16, 10, rng=1))


def _mlp():
    return nn.Sequential(nn.Linear(64, 24, rng=0), nn.ReLU(), nn.Linear(24, 10, rng=1))


#: Whether onnxruntime's optimised u8 x s8 kernels saturate on this CPU (x86 without VNNI).
SATURATES = platform.machine().lower() in ("x86_64", "amd64") and not host_has_vnni()


def _session(model, optimise, u8u8=False):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimise
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.log_severity_level = 3
    if u8u8:   # u8 x u8 kernels (int16 operands, vpmaddwd): no saturation on any CPU
        opts.add_session_config_entry("session.x64quantprecision", "1")
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def _ort(model, x, optimise, u8u8=False):
    return _session(model, optimise, u8u8).run(None, {model.graph.input[0].name: x})[0]


def _check_optimised(model, qdq, x, ours, step, saturation_expected):
    """onnxruntime's optimised session: exact where nothing can saturate, otherwise what int16
    pair sums predict (its Conv with a separate bias Add stays float; MatMul + Add becomes
    its integer QGemm, which is what run_int16_pairs models)."""
    theirs = _ort(model, x, optimise=True)
    predicted = run_int16_pairs(K.lower_qdq(qdq), x)[0]
    # the prediction is numpy: whether these inputs saturate does not depend on the CPU
    gap = np.abs(predicted - ours).max() / step
    assert (gap > 2) if saturation_expected else (gap == 0)
    want = predicted if SATURATES else ours
    assert np.abs(theirs - want).max() <= step * 1.001


def _output_step(qdq):
    """The scale of the last quantize_linear: one step of the int8 output."""
    last = [n for n in qdq.nodes if n.op == "quantize_linear"][-1]
    return float(np.max(qdq.consts[last.inputs[1]]))


def _ptq(model, x, seed, **options):
    rng = np.random.default_rng(seed)
    for m in model.modules():      # non-trivial BN statistics, so that folding matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean[...] = rng.uniform(-0.2, 0.2, m.running_mean.shape)
            m.running_var[...] = rng.uniform(0.5, 2.0, m.running_var.shape)
    graph = P.to_inference(model, x, passes=P.inference_pipeline(fuse=False)).graph
    calib = [rng.uniform(0, 1, x.shape).astype(np.float32) for _ in range(2)]
    return Q.quantize_static(graph, Q.calibrate(graph, calib), **options)


@pytest.mark.parametrize("make, shape", [(_mlp, (16, 64)), (_cnn, (4, 1, 8, 8))])
@pytest.mark.parametrize("per_channel", [True, False])
def test_ptq_model_exports_as_qdq_and_matches_onnxruntime(make, shape, per_channel):
    x = np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)
    qdq = _ptq(make().eval(), x, seed=2, per_channel=per_channel)
    model = export_onnx(qdq, (x,))
    types = [n.op_type for n in model.graph.node]
    assert types.count("QuantizeLinear") >= 2 and types.count("DequantizeLinear") >= 4
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert sum(w.dtype == np.int8 and w.ndim >= 2 for w in weights) == 2   # the int8 weights
    assert not any(w.dtype == np.float32 and w.ndim >= 2 for w in weights)  # no float copy
    step = _output_step(qdq)
    ours = P.run_numpy(qdq, x)[0]
    int8 = P.run_numpy(K.lower_qdq(qdq), x)[0]
    assert np.abs(ours - int8).max() <= step * 1.001
    for optimise, u8u8 in ((False, False), (True, True)):   # exact on every CPU
        theirs = _ort(model, x, optimise, u8u8)
        assert theirs.shape == ours.shape
        assert np.abs(theirs - ours).max() <= step * 1.001
        assert np.abs(theirs - int8).max() <= step * 1.001
        # the quantised model is not the float one: the outputs sit on the int8 grid
        assert np.allclose(np.rint(theirs / step) * step, theirs, atol=step * 1e-3)
    _check_optimised(model, qdq, x, ours, step, saturation_expected=True)


@pytest.mark.parametrize("make, shape", [(_mlp, (16, 64)), (_cnn, (4, 1, 8, 8))])
def test_reduce_range_weights_cannot_saturate_so_every_session_is_exact(make, shape):
    """7-bit weights (onnxruntime's ``reduce_range``): two products stay below 2 * 255 * 63 =
    32130 < 32767, so the optimised session is exact on every CPU."""
    x = np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)
    qdq = _ptq(make().eval(), x, seed=2, per_channel=True, weight_bits=7)
    model = export_onnx(qdq, (x,))
    weights = [numpy_helper.to_array(t) for t in model.graph.initializer]
    assert max(np.abs(w.astype(int)).max() for w in weights if w.dtype == np.int8) <= 63
    ours = P.run_numpy(qdq, x)[0]
    step = _output_step(qdq)
    _check_optimised(model, qdq, x, ours, step, saturation_expected=False)
    assert np.abs(_ort(model, x, optimise=True) - ours).max() <= step * 1.001


def test_qat_model_exports_as_qdq_and_matches_onnxruntime():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (8, 64)).astype(np.float32)
    qat = Q.prepare_qat(_mlp(), weight_bits=8, act_bits=8)
    for _ in range(2):                  # training steps set the activation ranges
        qat.train()
        qat(ml.tensor(rng.uniform(0, 1, (8, 64)).astype(np.float32)))
    qdq = Q.qat_to_qdq(qat, x)
    model = export_onnx(qdq, (x,))
    ours = P.run_numpy(qdq, x)[0]
    step = _output_step(qdq)
    for optimise, u8u8 in ((False, False), (True, True)):
        assert np.abs(_ort(model, x, optimise, u8u8) - ours).max() <= step * 1.001
    _check_optimised(model, qdq, x, ours, step, saturation_expected=True)


@pytest.mark.parametrize("make, shape", [(_mlp, (16, 64)), (_cnn, (4, 1, 8, 8))])
def test_exported_qdq_model_imports_back_and_runs_as_onnxruntime_does(make, shape):
    from mlsys_lab.deploy import import_onnx

    x = np.random.default_rng(4).uniform(0, 1, shape).astype(np.float32)
    qdq = _ptq(make().eval(), x, seed=5, per_channel=True)
    model = export_onnx(qdq, (x,))
    back = import_onnx(model)
    ops = [n.op for n in back.nodes]
    assert ops.count("quantize_linear") >= 2 and ops.count("dequantize_linear") >= 4
    assert any(v.dtype == np.int8 for v in back.consts)   # the int8 weights, kept as int8
    step = _output_step(qdq)
    theirs = _ort(model, x, optimise=False)
    for got in (P.run_numpy(back, x)[0], np.asarray(ml.compile(back, x)(x, profile=False))):
        assert got.shape == theirs.shape
        assert np.abs(got - theirs).max() <= step * 1.001
    assert np.abs(theirs).max() > 10 * step  # not a model that outputs ~0 everywhere


def test_qdq_import_without_zero_points_and_with_an_axis():
    """ONNX lets QuantizeLinear / DequantizeLinear leave out the zero point (uint8 0 for
    QuantizeLinear); a per-channel DequantizeLinear takes ``axis``."""
    from onnx import TensorProto, helper

    from mlsys_lab.deploy import import_onnx

    rng = np.random.default_rng(6)
    w = rng.integers(-128, 128, (3, 4)).astype(np.int8)
    ws = np.array([0.5, 0.25, 0.125], np.float32)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(ws, "ws"),
             numpy_helper.from_array(np.float32(0.05), "s")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             helper.make_node("Add", ["xd", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [3, 4])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [3, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = rng.uniform(-1, 14, (3, 4)).astype(np.float32)  # some below 0: uint8 saturates them
    theirs = _session(model, False).run(None, {"x": x})[0]
    want = np.clip(np.rint(x / 0.05), 0, 255) * 0.05 + w * ws[:, None]
    np.testing.assert_allclose(theirs, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(P.run_numpy(import_onnx(model), x)[0], theirs, rtol=1e-6,
                               atol=1e-6)
