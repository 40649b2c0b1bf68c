"""Inference passes (mlsys_lab.deploy.passes): BN folding is exact in float64, dropout removal,
constant folding of weights, op replacement (BN -> scale), conv/linear + activation fusion, and
the before/after comparison."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.deploy import passes as P
from mlsys_lab.engine.passes import run_pipeline
from mlsys_lab.errors import ArgumentError
from mlsys_lab.nn.module import Parameter


def _conv_bn(rng, c_in, c_out, k, stride, padding, bias, dtype=np.float64, relu=False):
    """conv -> BN (random running statistics and affine) [-> ReLU], every array in ``dtype``."""
    conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=padding, bias=bias)
    conv.weight = Parameter(rng.standard_normal((c_out, c_in, k, k)).astype(dtype))
    if bias:
        conv.bias = Parameter(rng.standard_normal(c_out).astype(dtype))
    bn = nn.BatchNorm2d(c_out)
    bn.weight = Parameter(rng.standard_normal(c_out).astype(dtype))
    bn.bias = Parameter(rng.standard_normal(c_out).astype(dtype))
    bn.register_buffer("running_mean", rng.standard_normal(c_out).astype(dtype))
    bn.register_buffer("running_var", rng.uniform(0.2, 3.0, c_out).astype(dtype))
    layers = [conv, bn] + ([nn.ReLU()] if relu else [])
    return nn.Sequential(*layers).eval(), conv, bn


def _bn_formula(conv, bn):
    """The folded weight and bias by the textbook formula (numpy, float64)."""
    inv = bn.weight.numpy() / np.sqrt(bn.running_var.astype(np.float64) + bn.eps)
    w = conv.weight.numpy() * inv[:, None, None, None]
    b = conv.bias.numpy() if conv.bias is not None else 0.0
    return w, (b - bn.running_mean) * inv + bn.bias.numpy()


def _ops(graph):
    return [n.op for n in graph.nodes]


@settings(max_examples=30, deadline=None)
@given(c_in=st.integers(1, 3), c_out=st.integers(1, 4), k=st.integers(1, 3),
       stride=st.integers(1, 2), padding=st.integers(0, 1), bias=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_bn_folding_is_exact_in_float64(c_in, c_out, k, stride, padding, bias, seed):
    rng = np.random.default_rng(seed)
    model, conv, bn = _conv_bn(rng, c_in, c_out, k, stride, padding, bias)
    x = rng.standard_normal((2, c_in, 5, 5))
    graph = ml.trace(model, x)
    folded = P.fold_batch_norm(graph)
    assert _ops(folded) == ["conv2d", "add"], folded
    want = P.run_numpy(graph, x)[0]
    got = P.run_numpy(folded, x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    w_formula, b_formula = _bn_formula(conv, bn)
    w_folded = folded.consts[folded.nodes[0].inputs[1]]
    b_folded = folded.consts[folded.nodes[1].inputs[1]]
    np.testing.assert_allclose(w_folded, w_formula, rtol=1e-14)
    np.testing.assert_allclose(b_folded.reshape(-1), b_formula, rtol=1e-13, atol=1e-14)
    assert len(graph.nodes) >= 5, "the unfolded graph must hold the BN chain (sub/div/mul/add)"


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 6), n=st.integers(1, 5), seed=st.integers(0, 2**31 - 1))
def test_affine_chain_after_a_matmul_folds_along_its_columns(k, n, seed):
    rng = np.random.default_rng(seed)
    w, b = rng.standard_normal((k, n)), rng.standard_normal(n)
    m, s, g = rng.standard_normal(n), rng.uniform(0.5, 2, n), rng.standard_normal(n)

    def f(x):
        return ((ml.ops.matmul(x, w) + b - m) / s * g + 1.5) * 2.0

    x = rng.standard_normal((3, k))
    graph = ml.trace(f, x)
    folded = P.fold_batch_norm(graph)
    assert _ops(folded) == ["matmul", "add"]
    want = ((x @ w + b - m) / s * g + 1.5) * 2.0
    np.testing.assert_allclose(P.run_numpy(folded, x)[0], want, rtol=1e-12, atol=1e-12)


def test_bn_folding_leaves_what_it_cannot_fold():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 2, 3, 3))
    full = rng.standard_normal((1, 3, 4, 4))  # varies over H and W: not one value per channel

    def not_per_channel(x):
        return ml.ops.conv2d(x, w, padding=1) * full

    def two_readers(x):
        y = ml.ops.conv2d(x, w, padding=1)
        return y * 2.0 + y

    def intermediate_output(x):
        y = ml.ops.conv2d(x, w, padding=1)
        return y, y * 2.0

    def by_zero(x):  # folding would bake inf and NaN into the weights
        return ml.ops.conv2d(x, w, padding=1) / np.zeros((1, 3, 1, 1))

    x = rng.standard_normal((1, 2, 4, 4))
    for f in (not_per_channel, two_readers, intermediate_output, by_zero):
        g = ml.trace(f, x)
        out = P.fold_batch_norm(g)
        assert _ops(out) == _ops(g), f.__name__
        with np.errstate(all="ignore"):
            for got, want in zip(P.run_numpy(out, x), P.run_numpy(g, x)):
                np.testing.assert_array_equal(got, want)


def test_folding_keeps_a_later_chain_that_is_not_per_channel():
    """(conv * a) then a division by an x-shaped constant: only the per-channel part folds."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((2, 1, 3, 3))
    a = rng.uniform(1, 2, (1, 2, 1, 1))
    d = rng.uniform(1, 2, (1, 2, 4, 4))
    x = rng.standard_normal((1, 1, 4, 4))
    g = ml.trace(lambda v: ml.ops.conv2d(v, w, padding=1) * a / d, x)
    out = P.fold_batch_norm(g)
    assert _ops(out) == ["conv2d", "add", "div"]
    np.testing.assert_allclose(P.run_numpy(out, x)[0], P.run_numpy(g, x)[0], rtol=1e-13)


def test_remove_dropout_gives_the_eval_model_and_drops_the_seed():
    model = nn.Sequential(nn.Linear(6, 8, rng=0), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3,
                                                                                      rng=1))
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    model.train()
    g = ml.trace(model, x)
    assert {"dropout", "rng_seed"} <= set(_ops(g))
    out = P.remove_dropout(g)
    assert "dropout" not in _ops(out) and "rng_seed" not in _ops(out)
    model.eval()
    np.testing.assert_array_equal(P.run_numpy(out, x)[0], model(ml.tensor(x)).numpy())


def _with_const_input(graph, index, array):
    """``graph`` with its input ``index`` turned into a constant holding ``array`` (the form
    an imported ONNX model has: weight transforms are nodes over initialisers)."""
    inputs = list(graph.inputs)
    value = inputs.pop(index)
    return ml.Graph(inputs, graph.nodes, graph.outputs, {**graph.consts, value: array})


def test_constant_folding_computes_weights_from_weights():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 4)).astype(np.float32)
    mask = (rng.random((4, 5)) > 0.5).astype(np.float32)

    def f(x, weight):  # the weight is transposed and masked on every call
        return ml.ops.matmul(x, ml.ops.transpose(weight, (1, 0)) * mask)

    x = rng.standard_normal((2, 4)).astype(np.float32)
    g = _with_const_input(ml.trace(f, x, w), 1, w)
    assert _ops(g) == ["transpose", "mul", "matmul"]
    out = run_pipeline(g, P.inference_pipeline(fuse=False)).graph
    assert _ops(out) == ["matmul"], out
    np.testing.assert_allclose(P.run_numpy(out, x)[0], x @ (w.T * mask), rtol=1e-6)


def test_to_inference_folds_and_fuses_a_cnn():
    rng = np.random.default_rng(4)
    block, _, _ = _conv_bn(rng, 1, 4, 3, 1, 1, True, np.float32, relu=True)
    model = nn.Sequential(*list(block), nn.Flatten(), nn.Linear(4 * 6 * 6, 5, rng=0),
                          nn.ReLU())
    model.train()
    x = rng.standard_normal((3, 1, 6, 6)).astype(np.float32)
    result = P.to_inference(model, x)
    assert model.training, "to_inference must restore training mode"
    assert _ops(result.graph) == ["fused_conv", "reshape", "fused_linear"], result.graph
    ref = P.run_numpy(result.input, x)[0]
    np.testing.assert_allclose(P.run_numpy(result.graph, x)[0], ref, rtol=1e-5, atol=1e-5)


def test_collapse_affine_replaces_a_lone_batch_norm_by_scale_and_shift():
    rng = np.random.default_rng(5)
    m, v, g, b = (rng.standard_normal((1, 3, 1, 1)), rng.uniform(0.5, 2, (1, 3, 1, 1)),
                  rng.standard_normal((1, 3, 1, 1)), rng.standard_normal((1, 3, 1, 1)))
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)

    f32 = [a.astype(np.float32) for a in (m, np.sqrt(v + 1e-5), g, b)]

    def bn(t):
        return (ml.ops.relu(t) - f32[0]) / f32[1] * f32[2] + f32[3]

    graph = ml.trace(bn, x)
    out = P.collapse_affine(graph)
    assert _ops(out) == ["relu", "mul", "add"], out
    want = (np.maximum(x, 0).astype(np.float64) - m) / np.sqrt(v + 1e-5) * g + b
    got = P.run_numpy(out, x)[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    report = P.compare(graph, out, x, rounds=2)
    assert report.before_nodes == 5 and report.after_nodes == 3
    assert 0 < report.max_abs_error < 1e-5
    assert "max |error|" in str(report)


def test_collapse_affine_starting_at_an_input_and_short_chains():
    x = np.linspace(-1, 1, 6)
    g = ml.trace(lambda t: ((t + 1.0) * 3.0 - 2.0) / 4.0, x)
    out = P.collapse_affine(g)
    assert _ops(out) == ["mul", "add"]
    np.testing.assert_allclose(P.run_numpy(out, x)[0], ((x + 1) * 3 - 2) / 4, rtol=1e-15)
    short = ml.trace(lambda t: t * 3.0 + 1.0, x)
    assert _ops(P.collapse_affine(short)) == ["mul", "add"]
    assert len(P.collapse_affine(short).consts) == len(short.consts)


def test_compare_reports_zero_error_for_the_same_graph_and_checks_signatures():
    x = np.ones((2, 3), np.float32)
    g = ml.trace(lambda t: t * 2.0, x)
    h = ml.trace(lambda t, u: t * u, x, x)
    report = P.compare(g, g, x, rounds=2, compiled=False)
    assert report.max_abs_error == 0.0 and report.before_s > 0 and report.after_s > 0
    with pytest.raises(ArgumentError, match="differ"):
        P.compare(g, h, x)


def test_run_batched_pads_the_last_chunk():
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    g = ml.trace(lambda t: t * 2.0, x[:2])
    np.testing.assert_array_equal(P.run_batched(g, x, 2), x * 2)
    with pytest.raises(ArgumentError, match="batch"):
        P.run_batched(g, x, 0)
