"""An int8 model exported as ONNX QDQ (QuantizeLinear / DequantizeLinear around the weights and
activations) runs in onnxruntime and agrees with mlsys_lab's QDQ graph and its int8 kernels
within one quantisation step of the output."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.deploy import export_onnx
from mlsys_lab.deploy import int8_kernels as K
from mlsys_lab.deploy import passes as P
from mlsys_lab.deploy import quantize as Q

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import numpy_helper  # noqa: E402


def _cnn():
    return nn.Sequential(nn.Conv2d(1, 6, 3, padding=1, rng=0), nn.BatchNorm2d(6), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(6 * 16, 10, rng=1))


def _mlp():
    return nn.Sequential(nn.Linear(64, 24, rng=0), nn.ReLU(), nn.Linear(24, 10, rng=1))


def _session(model, optimise):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimise
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


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
    for optimise in (False, True):      # ORT's own QDQ -> QLinear fusion when optimising
        theirs = _session(model, optimise).run(None, {model.graph.input[0].name: x})[0]
        assert theirs.shape == ours.shape
        assert np.abs(theirs - ours).max() <= step * 1.001
        assert np.abs(theirs - int8).max() <= step * 1.001
        # the quantised model is not the float one: the outputs sit on the int8 grid
        assert np.allclose(np.rint(theirs / step) * step, theirs, atol=step * 1e-3)


def test_qat_model_exports_as_qdq_and_matches_onnxruntime():
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, (8, 64)).astype(np.float32)
    qat = Q.prepare_qat(_mlp(), weight_bits=8, act_bits=8)
    for _ in range(2):                  # training steps set the activation ranges
        qat.train()
        qat(ml.tensor(rng.uniform(0, 1, (8, 64)).astype(np.float32)))
    qdq = Q.qat_to_qdq(qat, x)
    model = export_onnx(qdq, (x,))
    theirs = _session(model, True).run(None, {model.graph.input[0].name: x})[0]
    ours = P.run_numpy(qdq, x)[0]
    assert np.abs(theirs - ours).max() <= _output_step(qdq) * 1.001
