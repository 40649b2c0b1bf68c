"""Quantisation (mlsys_lab.deploy.quant, quant.int8_kernels): the arithmetic, the Q/DQ and
fake_quant ops (straight-through gradient), observers and calibration, the int8 kernels against
integer and float64 references within the derived error bound, PTQ on digits, bias correction,
QAT."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.data.datasets import load_digits
from mlsys_lab.deploy import passes as P
from mlsys_lab.deploy import quant as Q
from mlsys_lab.deploy.quant import int8_kernels as K
from mlsys_lab.engine.registry import get
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError

SEEDS = st.integers(0, 2**31 - 1)


# --- the arithmetic ---------------------------------------------------------------------------
def test_qrange_and_storage():
    assert Q.qrange(8) == (-128, 127)
    assert Q.qrange(8, narrow=True) == (-127, 127)
    assert Q.qrange(8, signed=False) == (0, 255)
    assert Q.qrange(4) == (-8, 7)
    assert Q.storage_dtype(0, 255) == np.uint8 and Q.storage_dtype(-7, 7) == np.int8
    assert Q.storage_dtype(-2**31, 2**31 - 1) == np.int32
    with pytest.raises(ArgumentError, match="bits"):
        Q.qrange(1)


def test_choose_qparams_formulas():
    qp = Q.choose_qparams(-1.0, 3.0)  # asymmetric uint8
    assert qp.qmin == 0 and qp.qmax == 255 and qp.scale == pytest.approx(4.0 / 255)
    assert int(qp.zero_point) == round(1.0 / (4.0 / 255))
    sym = Q.choose_qparams(-1.0, 3.0, symmetric=True)
    assert (sym.qmin, sym.qmax) == (-127, 127) and sym.scale == pytest.approx(3.0 / 127)
    assert int(sym.zero_point) == 0
    pos = Q.choose_qparams(2.0, 5.0)  # widened to contain 0
    assert int(pos.zero_point) == 0 and pos.scale == pytest.approx(5.0 / 255)
    zero = Q.choose_qparams(0.0, 0.0)
    assert zero.scale == 1.0 and zero.quantize(np.zeros(3)).tolist() == [0, 0, 0]
    for bad in [dict(rmin=2.0, rmax=1.0), dict(rmin=np.inf, rmax=1.0),
                dict(rmin=np.zeros(3), rmax=np.ones(3))]:
        with pytest.raises(ArgumentError):
            Q.choose_qparams(**bad)
    with pytest.raises(ArgumentError, match="signed"):
        Q.choose_qparams(-1, 1, symmetric=True, signed=False)


@settings(max_examples=50, deadline=None)
@given(seed=SEEDS, bits=st.integers(2, 8), symmetric=st.booleans(), per_channel=st.booleans(),
       shift=st.floats(-3, 3))
def test_quantise_round_trip_error_is_half_a_step(seed, bits, symmetric, per_channel, shift):
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((5, 4)) * rng.uniform(0.01, 10) + shift
    axis = 1 if per_channel else None
    lo, hi = (r.min(0), r.max(0)) if per_channel else (r.min(), r.max())
    qp = Q.choose_qparams(lo, hi, bits, symmetric, axis=axis)
    q = qp.quantize(r)
    assert q.dtype == qp.dtype and q.min() >= qp.qmin and q.max() <= qp.qmax
    step = Q.along(qp.scale, axis, 2)
    err = np.abs(qp.dequantize(q) - r)
    assert np.all(err <= step / 2 * (1 + 1e-9)), (err.max(), step)
    zero = qp.dequantize(qp.quantize(np.zeros((1, 4))))
    assert np.all(zero == 0.0), "real 0 must be exactly representable"
    np.testing.assert_array_equal(qp.fake_quantize(r), qp.dequantize(q))


def test_qparams_check_the_channel_axis():
    qp = Q.choose_qparams(-np.ones(3), np.ones(3), axis=0)
    with pytest.raises(ShapeError, match="channel"):
        qp.quantize(np.zeros((4, 2)))
    assert qp.onnx()["zero_point"].dtype == np.uint8 and qp.onnx()["axis"] == 0


# --- the ops ------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, per_channel=st.booleans(), signed=st.booleans(), axis=st.integers(0, 2))
def test_quantize_and_dequantize_linear_ops_follow_the_formula(seed, per_channel, signed, axis):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 4, 2)) * 3).astype(np.float32)
    c = x.shape[axis]
    scale = rng.uniform(0.01, 0.1, c if per_channel else ()).astype(np.float32)
    zdt = np.int8 if signed else np.uint8
    info = np.iinfo(zdt)
    zp = rng.integers(info.min // 2, info.max // 2, scale.shape).astype(zdt)
    q = get("quantize_linear").compute(x, scale, zp, axis=axis)
    s = Q.along(scale, axis if per_channel else None, 3)
    z = Q.along(zp, axis if per_channel else None, 3).astype(np.float64)
    want = np.clip(np.rint(x / s) + z, info.min, info.max).astype(zdt)
    np.testing.assert_array_equal(q, want)
    assert q.dtype == zdt
    dq = get("dequantize_linear").compute(q, scale, zp, axis=axis)
    assert dq.dtype == np.float32
    np.testing.assert_allclose(dq, (q.astype(np.float64) - z) * s, rtol=1e-6)
    inside = (np.rint(x / s) + z >= info.min) & (np.rint(x / s) + z <= info.max)
    assert np.all(np.abs(dq - x)[inside] <= np.broadcast_to(s, x.shape)[inside] * 0.5001)


def test_a_tie_rounds_half_to_even_before_the_zero_point_is_added_as_in_onnx():
    """``q = clip(round(r / s) + z)``, round half to even, as ONNX's QuantizeLinear computes it
    (quantize.py's docstring said ``round(r / s + z)``, which differs on a tie: r / s = 0.5 and
    z = 1 give round(0.5) + 1 = 1 here, round(1.5) = 2 there)."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    r = np.array([0.25, 0.75, 1.25, -0.25, -0.75, -1.25], np.float32)  # r / s: exact halves
    scale, zp = np.float32(0.5), np.int8(1)
    want = np.array([1, 3, 3, 1, -1, -1], np.int8)  # rint(r / s) + 1
    assert not np.array_equal(want, np.rint(r / scale + zp))  # the two formulas do differ here
    model = helper.make_model(helper.make_graph(
        [helper.make_node("QuantizeLinear", ["r", "s", "z"], ["q"])], "q",
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [6])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [0.5]),
         helper.make_tensor("z", TensorProto.INT8, [], [1])]),
        opset_imports=[helper.make_opsetid("", 19)])
    onnx_q = ReferenceEvaluator(model).run(None, {"r": r})[0]
    np.testing.assert_array_equal(onnx_q, want)
    qp = Q.QParams(np.asarray(0.5), np.asarray(1), -128, 127)
    np.testing.assert_array_equal(qp.quantize(r), want)
    np.testing.assert_array_equal(Q.quantize(r, qp), want)
    np.testing.assert_array_equal(get("quantize_linear").compute(r, scale, zp), want)
    fq = Q.fake_quant(ml.tensor(r), qp).numpy()
    np.testing.assert_array_equal(fq, (want.astype(np.float32) - 1) * 0.5)


def test_q_dq_ops_refuse_bad_operands():
    x = np.zeros((2, 3), np.float32)
    q_op, dq_op = get("quantize_linear"), get("dequantize_linear")
    s3, z3 = np.ones(3, np.float32), np.zeros(3, np.uint8)
    with pytest.raises(ShapeError, match="channels"):
        q_op.infer(x, s3, z3, axis=0)
    with pytest.raises(DTypeError, match="zero point"):
        q_op.infer(x, np.float32(1), np.float32(0))
    with pytest.raises(DTypeError, match="floating"):
        q_op.infer(np.zeros(3, np.int32), np.float32(1), np.uint8(0))
    with pytest.raises(DTypeError, match="differ"):
        dq_op.infer(np.zeros(3, np.uint8), np.float32(1), np.int8(0))
    with pytest.raises(ShapeError, match="one shape"):
        q_op.infer(x, s3, np.zeros(2, np.uint8), axis=1)


def _ste_mask(x, s, z, qmin, qmax):
    t = x / s
    return (t >= qmin - z - 0.5) & (t <= qmax - z + 0.5)


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, bits=st.integers(2, 8), symmetric=st.booleans(), per_channel=st.booleans())
def test_fake_quant_forward_and_straight_through_gradient(seed, bits, symmetric, per_channel):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((4, 3)) * 2
    axis = 1 if per_channel else None
    # calibrated on a narrower range, so some values saturate and get no gradient
    lo, hi = (x.min(0) / 2, x.max(0) / 2) if per_channel else (x.min() / 2, x.max() / 2)
    qp = Q.choose_qparams(lo, hi, bits, symmetric, axis=axis)
    t = ml.tensor(x, requires_grad=True)
    y = Q.fake_quant(t, qp)
    np.testing.assert_array_equal(y.numpy(), qp.fake_quantize(x))
    u = rng.standard_normal(x.shape)
    (y * ml.tensor(u)).sum().backward()
    s, z = Q.along(qp.scale, axis, 2), Q.along(qp.zero_point, axis, 2)
    mask = _ste_mask(x, s, z, qp.qmin, qp.qmax)
    np.testing.assert_array_equal(t.grad.numpy(), np.where(mask, u, 0.0))
    grad = ml.grad(lambda a: (Q.fake_quant(a, qp) * ml.tensor(u)).sum())(ml.tensor(x))
    np.testing.assert_array_equal(grad.numpy(), np.where(mask, u, 0.0))
    _, tangent = ml.jvp(lambda a: Q.fake_quant(a, qp), (ml.tensor(x),), (ml.tensor(u),))
    np.testing.assert_array_equal(tangent.numpy(), np.where(mask, u, 0.0))
    assert mask.any()


def test_fake_quant_gradient_through_a_traced_graph():
    x = np.linspace(-3, 3, 13)
    qp = Q.choose_qparams(-1.0, 1.0, 4)
    g = ml.grad(lambda a: Q.fake_quant(a, qp).sum())
    compiled = ml.compile(g, x)
    want = _ste_mask(x, qp.scale, qp.zero_point, qp.qmin, qp.qmax).astype(float)
    np.testing.assert_array_equal(np.asarray(compiled(x)), want)
    assert 0 < want.sum() < len(x)


def test_fake_quant_refuses_bad_attributes():
    op = get("fake_quant")
    x = np.zeros((2, 3))
    with pytest.raises(ArgumentError, match="positive"):
        op.infer(x, scale=0.0, zero_point=0, qmin=-8, qmax=7)
    with pytest.raises(ArgumentError, match="zero points"):
        op.infer(x, scale=1.0, zero_point=9, qmin=-8, qmax=7)
    with pytest.raises(ShapeError, match="axis"):
        op.infer(x, scale=(1.0, 1.0), zero_point=(0, 0), qmin=-8, qmax=7, axis=1)
    with pytest.raises(DTypeError, match="floating"):
        op.infer(np.zeros(2, np.int64), scale=1.0, zero_point=0, qmin=-8, qmax=7)


# --- observers ------------------------------------------------------------------------------------
def test_minmax_observer_global_ema_and_per_channel():
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((8, 3)) * (i + 1) for i in range(4)]
    ob = Q.MinMaxObserver()
    ema = Q.MinMaxObserver(momentum=0.25)
    per = Q.MinMaxObserver(axis=1)
    for b in batches:
        ob.update(b), ema.update(b), per.update(b)
    allx = np.concatenate(batches)
    assert ob.range() == (allx.min(), allx.max())
    np.testing.assert_array_equal(per.range()[1], allx.max(0))
    lo = batches[0].min()
    for b in batches[1:]:
        lo = 0.75 * lo + 0.25 * b.min()
    assert ema.range()[0] == pytest.approx(lo)
    with pytest.raises(ArgumentError, match="no data"):
        Q.MinMaxObserver().range()
    with pytest.raises(ArgumentError, match="inf or NaN"):
        Q.MinMaxObserver().update(np.array([1.0, np.nan]))


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, n_batches=st.integers(1, 5))
def test_histogram_growth_merges_bins_exactly(seed, n_batches):
    rng = np.random.default_rng(seed)
    ob = Q.HistogramObserver("minmax", bins=64)
    seen = []
    for i in range(n_batches):
        b = rng.standard_normal(200) * rng.uniform(0.1, 5) * (i + 1)
        ob.update(b)
        seen.append(b)
    allx = np.concatenate(seen)
    assert ob.counts.sum() == allx.size
    assert ob.limit >= np.abs(allx).max()
    # every value lies in the bin the final edges give it (one within rounding of an edge may
    # sit on either side of it)
    pos = (allx + ob.limit) / (2 * ob.limit / ob.bins)
    idx = np.clip(np.floor(pos).astype(int), 0, ob.bins - 1)
    moved = np.abs(np.bincount(idx, minlength=ob.bins) - ob.counts).sum() // 2
    assert moved <= np.count_nonzero(np.abs(pos - np.rint(pos)) < 1e-6)


def test_percentile_and_kl_calibration_clip_outliers():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.standard_normal(20000), [60.0, -55.0]])
    mm = Q.HistogramObserver("minmax", bins=1024).update(x)
    pc = Q.HistogramObserver("percentile", bins=1024, percentile=99.9).update(x)
    kl = Q.HistogramObserver("kl", bins=1024).update(x)
    assert mm.range() == (-55.0, 60.0)
    width = 2 * mm.limit / 1024
    assert pc.range()[1] == pytest.approx(np.percentile(x, 99.9), abs=width)
    t = kl.range()[1]
    assert 2.0 < t < 20.0, t  # far inside the outliers, outside the bulk
    uniform = Q.HistogramObserver("kl", bins=1024).update(rng.uniform(-1, 1, 20000))
    assert uniform.range()[1] > 0.9  # nothing to gain from clipping a uniform distribution
    counts, w = kl.abs_histogram()
    assert counts.sum() == x.size and w == pytest.approx(kl.limit / 512)
    with pytest.raises(ArgumentError, match="method"):
        Q.HistogramObserver("mse")
    with pytest.raises(ArgumentError, match="per tensor"):
        Q.observer("kl", axis=0)


def test_kl_threshold_prefers_the_bulk_of_a_peaked_histogram():
    counts = np.zeros(512)
    counts[:100] = 1000.0
    counts[500] = 1.0
    assert Q.kl_threshold(counts, 1.0, 128) <= 200
    assert Q.kl_threshold(np.ones(64), 1.0, 128) == 64.0  # fewer bins than levels: no clip


# --- int8 kernels ---------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 40), n=st.integers(1, 9), seed=SEEDS,
       unsigned=st.booleans())
def test_int8_matmul_is_exact_int32_accumulation(m, k, n, seed, unsigned):
    rng = np.random.default_rng(seed)
    a = (rng.integers(0, 256, (m, k)).astype(np.uint8) if unsigned
         else rng.integers(-128, 128, (m, k)).astype(np.int8))
    bt = rng.integers(-128, 128, (n, k)).astype(np.int8)
    got = K.int8_matmul(a, bt)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int64) @ bt.astype(np.int64).T)
    f = K.float32_matmul(a.astype(np.float32), bt.astype(np.float32))
    np.testing.assert_allclose(f, got, rtol=1e-6)


def test_int8_kernels_refuse_bad_operands():
    with pytest.raises(ShapeError):
        K.int8_matmul(np.zeros((2, 3), np.int8), np.zeros((2, 4), np.int8))
    with pytest.raises(DTypeError):
        K.int8_matmul(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.int8))
    with pytest.raises(DTypeError):
        K.float32_matmul(np.zeros((2, 3), np.float64), np.zeros((2, 3), np.float64))


def _quantised_operands(rng, m, k, n, per_channel):
    """Real x >= 0-ish, w, b, their qparams (float64 scales), and the output qparams chosen from
    the float64 result's range (widened, so nothing clips)."""
    x = rng.uniform(-0.5, 2.0, (m, k))
    w = rng.standard_normal((k, n))
    b = rng.standard_normal(n)
    qx = Q.choose_qparams(x.min(), x.max())
    qw = Q.MinMaxObserver(1 if per_channel else None).update(w).qparams(8, symmetric=True)
    y = x @ w + b
    span = y.max() - y.min() + 1e-9
    qy = Q.choose_qparams(y.min() - 0.2 * span, y.max() + 0.2 * span)
    return x, w, b, qx, qw, qy, y


def _op_args(qx, xq, qw, wq, qy, bq):
    f = np.float64
    return (xq, f(qx.scale), np.uint8(qx.zero_point), wq, qw.scale.astype(f),
            qw.zero_point.astype(np.int8), f(qy.scale), np.uint8(qy.zero_point), bq)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 30), n=st.integers(1, 6), seed=SEEDS,
       per_channel=st.booleans(), relu=st.booleans())
def test_qlinear_matmul_within_the_quantisation_error_bound(m, k, n, seed, per_channel, relu):
    rng = np.random.default_rng(seed)
    x, w, b, qx, qw, qy, y = _quantised_operands(rng, m, k, n, per_channel)
    xq, wq = qx.quantize(x), qw.quantize(w)
    sw = np.broadcast_to(qw.scale, (n,))
    bq = np.rint(b / (qx.scale * sw)).astype(np.int32)
    args = _op_args(qx, xq, qw, wq, qy, bq)
    act = "relu" if relu else None
    ref = get("qlinear_matmul").compute(*args, activation=act)
    out = np.empty_like(ref)
    K.qlinear_matmul_out(out, *args, activation=act)
    np.testing.assert_array_equal(out, ref)  # the Numba kernel is the numpy reference, exactly
    y_hat = qy.dequantize(out)
    # |y - y_hat| <= s_x/2 |w|_1 + s_w/2 |x_hat|_1 + s_x s_w / 2 + s_y / 2 (no clipping)
    x_hat = qx.dequantize(xq)
    bound = (qx.scale / 2 * np.abs(w).sum(0)[None, :]
             + sw[None, :] / 2 * np.abs(x_hat).sum(1)[:, None]
             + qx.scale * sw[None, :] / 2 + qy.scale / 2)
    want = np.maximum(y, 0) if relu else y
    err = np.abs(y_hat - want)
    if relu:  # relu is 1-Lipschitz: the bound carries over
        assert np.all(err <= bound * (1 + 1e-9) + 1e-12)
    else:
        assert np.all(err <= bound * (1 + 1e-9) + 1e-12), (err / bound).max()


def _conv_float(x, w, **attrs):
    return ml.ops.conv2d(ml.tensor(x), ml.tensor(w), **attrs).numpy()


@settings(max_examples=15, deadline=None)
@given(seed=SEEDS, stride=st.integers(1, 2), padding=st.integers(0, 2),
       dilation=st.integers(1, 2), groups=st.sampled_from([1, 2]), relu=st.booleans())
def test_qlinear_conv_within_the_quantisation_error_bound(seed, stride, padding, dilation,
                                                          groups, relu):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.3, 1.5, (2, 4, 7, 7))
    w = rng.standard_normal((6, 4 // groups, 3, 3))
    b = rng.standard_normal(6)
    attrs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = _conv_float(x, w, **attrs) + b[None, :, None, None]
    qx = Q.choose_qparams(x.min(), x.max())
    qw = Q.MinMaxObserver(0).update(w).qparams(8, symmetric=True)
    span = y.max() - y.min()
    qy = Q.choose_qparams(y.min() - 0.2 * span, y.max() + 0.2 * span)
    xq, wq = qx.quantize(x), qw.quantize(w)
    bq = np.rint(b / (qx.scale * qw.scale)).astype(np.int32)
    args = _op_args(qx, xq, qw, wq, qy, bq)
    act = "relu" if relu else None
    pairs = dict(stride=(stride,) * 2, padding=(padding,) * 2, dilation=(dilation,) * 2,
                 groups=groups, activation=act)
    ref = get("qlinear_conv").compute(*args, **pairs)
    assert ref.shape == y.shape
    out = np.empty_like(ref)
    K.qlinear_conv_out(out, *args, **pairs)
    np.testing.assert_array_equal(out, ref)
    x_hat = qx.dequantize(xq)
    window_l1 = _conv_float(np.abs(x_hat), np.ones_like(w), **attrs)
    sw = qw.scale[None, :, None, None]
    bound = (qx.scale / 2 * np.abs(w).reshape(6, -1).sum(1)[None, :, None, None]
             + sw / 2 * window_l1 + qx.scale * sw / 2 + qy.scale / 2)
    want = np.maximum(y, 0) if relu else y
    assert np.all(np.abs(qy.dequantize(out) - want) <= bound * (1 + 1e-9) + 1e-12)


def test_qlinear_shape_rules_refuse_bad_operands():
    f, u8, i8, i32 = np.float32, np.uint8, np.int8, np.int32
    good = [np.zeros((2, 3), u8), f(1), u8(0), np.zeros((3, 4), i8), np.ones(4, f),
            np.zeros(4, i8), f(1), u8(0), np.zeros(4, i32)]
    op = get("qlinear_matmul")
    assert op.infer(*good).shape == (2, 4)
    for i, bad, err in [(0, np.zeros((2, 3), np.float32), DTypeError),
                        (3, np.zeros((5, 4), i8), ShapeError),
                        (8, np.zeros(4, np.int64), DTypeError),
                        (8, np.zeros(3, i32), ShapeError),
                        (4, np.ones(3, f), ShapeError),
                        (2, i8(0), DTypeError)]:
        args = list(good)
        args[i] = bad
        if i == 4:
            args[5] = np.zeros(3, i8)
        with pytest.raises(err):
            op.infer(*args)
    with pytest.raises(ShapeError, match="activation"):
        op.infer(*good, activation="gelu")
    conv = get("qlinear_conv")
    cargs = [np.zeros((1, 4, 5, 5), u8), f(1), u8(0), np.zeros((6, 2, 3, 3), i8), np.ones(6, f),
             np.zeros(6, i8), f(1), u8(0), np.zeros(6, i32)]
    assert conv.infer(*cargs, groups=2).shape == (1, 6, 3, 3)
    with pytest.raises(ShapeError, match="groups"):
        conv.infer(*cargs, groups=1)


# --- post-training quantisation of a graph ---------------------------------------------------
@pytest.fixture(scope="module")
def digits_mlp():
    x, y = load_digits()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    model = nn.Sequential(nn.Linear(64, 48, rng=0), nn.ReLU(), nn.Linear(48, 10, rng=1))
    opt = ml.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(6):
        for i in range(0, 1200, 100):
            loss = ml.ops.cross_entropy(model(ml.tensor(x[i:i + 100])), ml.tensor(y[i:i + 100]))
            opt.zero_grad()
            loss.backward()
            opt.step()
    graph = P.to_inference(model, x[:100], passes=P.inference_pipeline(fuse=False)).graph
    return model, graph, x, y


def _accuracy(run, x, y):
    return float(np.mean(P.run_batched(run, x, 100).argmax(1) == y))


@pytest.mark.parametrize("method", ["minmax", "percentile", "kl"])
def test_ptq_on_digits_int8_matches_qdq_and_keeps_accuracy(digits_mlp, method):
    model, graph, x, y = digits_mlp
    cal = Q.calibrate(graph, [x[i:i + 100] for i in range(0, 1200, 100)], method)
    qdq = Q.quantize_static(graph, cal)
    int8 = K.lower_qdq(qdq)
    assert [n.op for n in int8.nodes] == ["quantize_linear", "qlinear_matmul", "qlinear_matmul",
                                          "dequantize_linear"], int8
    test = x[1200:1700]
    out_qdq, out_int8 = P.run_batched(qdq, test, 100), P.run_batched(int8, test, 100)
    step = float(graph_output_scale(int8))
    assert np.abs(out_qdq - out_int8).max() <= step * 1.001  # within one quantisation step
    compiled = ml.compile(int8, x[:100], passes=None)
    assert "numba.qgemm_int8" in compiled.explain()
    np.testing.assert_array_equal(np.asarray(compiled(test[:100])), out_int8[:100])
    float_acc = _accuracy(graph, test, y[1200:1700])
    assert float_acc > 0.9
    assert _accuracy(int8, test, y[1200:1700]) >= float_acc - 0.02


def graph_output_scale(graph):
    last = [r for r in Q.qdq_tensors(graph) if r["op"] == "dequantize_linear"][-1]
    return last["scale"]


def test_int8_weights_take_a_quarter_of_the_bytes(digits_mlp):
    _, graph, x, _ = digits_mlp
    qdq = Q.quantize_static(graph, Q.calibrate(graph, [x[:100]]))
    float_w = [a for v, a in graph.consts.items() if a.ndim == 2]
    int_w = [a for v, a in K.lower_qdq(qdq).consts.items() if a.dtype == np.int8 and a.ndim == 2]
    assert sum(a.nbytes for a in int_w) * 4 == sum(a.nbytes for a in float_w)
    rows = Q.qdq_tensors(qdq)
    weights = [r for r in rows if r["dtype"] == "int8"]
    assert len(weights) == 2 and all(r["axis"] == 1 and r["scale"].shape == (r["zero_point"].size,)
                                     for r in weights)
    assert Q.model_bytes(K.lower_qdq(qdq)) < Q.model_bytes(graph) / 3


def test_weight_only_quantisation_and_bias_correction():
    """A layer whose input has a large mean: rounding the weights shifts the mean output by
    E[x]·(Ŵ - W); bias correction removes that shift on the calibration data."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 5))
    b = rng.standard_normal(5)
    x = rng.uniform(2.0, 4.0, (64, 16))
    graph = ml.trace(lambda t: ml.ops.matmul(t, w) + b, x)
    cal = Q.calibrate(graph, [x])
    plain = Q.quantize_static(graph, cal, weight_bits=3, act_bits=None)
    fixed = Q.quantize_static(graph, cal, weight_bits=3, act_bits=None, bias_correction=True)
    assert "quantize_linear" not in [n.op for n in plain.nodes]
    y = x @ w + b
    shift_plain = (P.run_numpy(plain, x)[0] - y).mean(0)
    shift_fixed = (P.run_numpy(fixed, x)[0] - y).mean(0)
    assert np.abs(shift_plain).max() > 0.05
    np.testing.assert_allclose(shift_fixed, 0.0, atol=1e-10)
    bias_free = ml.trace(lambda t: ml.ops.matmul(t, w), x)
    made = Q.quantize_static(bias_free, Q.calibrate(bias_free, [x]), weight_bits=3, act_bits=None,
                             bias_correction=True)
    assert [n.op for n in made.nodes] == ["dequantize_linear", "matmul", "add"]
    np.testing.assert_allclose((P.run_numpy(made, x)[0] - x @ w).mean(0), 0.0, atol=1e-10)


def test_bias_shift_of_a_convolution_is_the_response_to_the_mean_image():
    rng = np.random.default_rng(8)
    w, w_hat = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal((3, 2, 3, 3))
    mean = np.array([0.5, -2.0])
    x = np.broadcast_to(mean[None, :, None, None], (1, 2, 5, 5))
    g = ml.trace(lambda t: ml.ops.conv2d(t, w), x)
    shift = Q.bias_shift(w, w_hat, mean, g.nodes[0])
    want = (_conv_float(x, w_hat) - _conv_float(x, w))[0, :, 1, 1]
    np.testing.assert_allclose(shift, want, rtol=1e-12)


def test_calibration_refuses_what_it_cannot_use():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ArgumentError, match="constant weight"):
        Q.calibrate(ml.trace(lambda t: t * 2.0, x), [x])
    g = ml.trace(lambda t: ml.ops.matmul(t, np.ones((3, 2), np.float32)), x)
    with pytest.raises(ArgumentError, match="no calibration batches"):
        Q.calibrate(g, [])
    with pytest.raises(ArgumentError, match="calibration"):
        Q.quantize_static(g)


def test_a_cnn_lowers_to_qlinear_conv():
    rng = np.random.default_rng(9)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=0), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(4, 4, 3, padding=1, rng=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 3, rng=2)).eval()
    x = rng.uniform(0, 1, (8, 1, 8, 8)).astype(np.float32)
    graph = P.to_inference(model, x, passes=P.inference_pipeline(fuse=False)).graph
    qdq = Q.quantize_static(graph, Q.calibrate(graph, [x]))
    int8 = K.lower_qdq(qdq)
    ops = [n.op for n in int8.nodes]
    assert ops.count("qlinear_conv") == 2 and ops.count("qlinear_matmul") == 1, int8
    assert "reshape" in ops and ops.count("max_pool2d") == 1
    step = float(graph_output_scale(int8))
    np.testing.assert_allclose(P.run_numpy(int8, x)[0], P.run_numpy(qdq, x)[0], atol=step * 1.01)
    np.testing.assert_allclose(P.run_numpy(qdq, x)[0], P.run_numpy(graph, x)[0], atol=10 * step)


# --- quantisation-aware training ----------------------------------------------------------------
def test_qat_keeps_layer_order_and_converts_to_int8(digits_mlp):
    model, _, x, y = digits_mlp
    student = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 10))
    student.load_state_dict(model.state_dict())
    qat = Q.prepare_qat(student, weight_bits=4, act_bits=8)
    assert [type(m).__name__ for m in student] == ["QATLinear", "ReLU", "QATLinear"]
    opt = ml.optim.Adam(qat.parameters(), lr=2e-3)
    losses = []
    for i in range(0, 1200, 100):
        loss = ml.ops.cross_entropy(qat(ml.tensor(x[i:i + 100])), ml.tensor(y[i:i + 100]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    assert np.mean(losses[-3:]) < losses[0] + 0.1
    qat.eval()
    test = x[1200:1300]
    eager = qat(ml.tensor(test)).numpy()
    qdq = Q.qat_to_qdq(qat, test)
    np.testing.assert_allclose(P.run_numpy(qdq, test)[0], eager, atol=1e-4)
    int8 = K.lower_qdq(qdq)
    assert [n.op for n in int8.nodes].count("qlinear_matmul") == 2
    w_int = [a for a in int8.consts.values() if a.dtype == np.int8 and a.ndim == 2]
    assert all(np.abs(a).max() <= 7 for a in w_int), "4-bit weights live in [-7, 7]"
    step = float(graph_output_scale(int8))
    assert np.abs(P.run_numpy(int8, test)[0] - eager).max() <= step * 1.01


def test_fake_quant_to_qdq_refuses_a_narrow_activation_range():
    x = np.linspace(-1, 1, 8).reshape(2, 4)
    qp = Q.choose_qparams(-1.0, 1.0, bits=4, signed=False)
    g = ml.trace(lambda t: Q.fake_quant(t, qp) * 2.0, x)
    with pytest.raises(ArgumentError, match="cannot express"):
        Q.fake_quant_to_qdq(g)
    with pytest.raises(ArgumentError, match="no Linear"):
        Q.prepare_qat(nn.Sequential(nn.ReLU()))
