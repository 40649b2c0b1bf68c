"""The storage dtypes (bfloat16, float8, float4, int4/uint4/int2/uint2, via ml_dtypes): Tensors
hold and print them, data-movement and conversion ops take them, every computing op refuses
them by name, and casts / ONNX Cast / QuantizeLinear / DequantizeLinear on random values
(NaN, inf and out-of-range ones included) agree with ml_dtypes and ``onnx.reference``."""

import warnings

import ml_dtypes
import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import dtypes

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from mlsys_lab.deploy import import_onnx  # noqa: E402
from mlsys_lab.engine.interpreter import Interpreter  # noqa: E402

FLOAT8 = (dtypes.float8_e4m3fn, dtypes.float8_e4m3fnuz, dtypes.float8_e5m2,
          dtypes.float8_e5m2fnuz)
SUB_BYTE = (dtypes.int4, dtypes.uint4, dtypes.int2, dtypes.uint2)


def _same(a, b):
    """Equal dtype, and equal values with NaN matching NaN (compared through float64)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(
        a.astype(np.float64), b.astype(np.float64), equal_nan=True)


def _random(n, seed, dtype=np.float32):
    """Random values across many binades, with NaN, +-inf, +-0 and huge values mixed in."""
    r = np.random.default_rng(seed)
    x = r.standard_normal(n) * np.exp2(r.integers(-20, 20, n))
    x[:10] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 500.0, -70000.0, 0.5]
    with np.errstate(over="ignore"):  # float16: the huge values become inf on purpose
        return x.astype(dtype)


def test_storage_dtypes_are_supported_with_short_names():
    assert set(dtypes.STORAGE) <= set(dtypes.SUPPORTED)
    want = {"bfloat16": "bf16", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2",
            "float8_e4m3fnuz": "f8e4m3fnuz", "float8_e5m2fnuz": "f8e5m2fnuz",
            "float8_e8m0fnu": "f8e8m0", "float4_e2m1fn": "f4e2m1", "int4": "i4",
            "uint4": "u4", "int2": "i2", "uint2": "u2"}
    for name, short in want.items():
        dt = dtypes.as_dtype(name)
        assert dt == np.dtype(getattr(ml_dtypes, name)) and dtypes.short(dt) == short
        assert dtypes.as_dtype(short) == dt and dtypes.is_storage(dt)
        assert not dtypes.is_float(dt)  # float-only ops refuse them as storage, not compute
    assert dtypes.is_storage_float(dtypes.bfloat16) and not dtypes.is_storage_float(dtypes.int4)


def test_tensor_creation_printing_and_the_ir():
    t = ml.tensor([1.0, 2.5, -3.0], dtype="bfloat16")
    assert t.dtype == dtypes.bfloat16 and "bfloat16" in repr(t)
    assert t.numpy().astype(np.float32).tolist() == [1.0, 2.5, -3.0]
    assert ml.tensor([7, -8], dtype="int4").numpy().astype(int).tolist() == [7, -8]
    with pytest.raises(ml.DTypeOverflowError, match=r"9 does not fit in int4 \(range -8..7\)"):
        ml.tensor([1, 9], dtype="int4")
    with pytest.raises(ml.DTypeOverflowError, match="uint2"):
        ml.tensor([4], dtype="u2")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 3])
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=TensorProto.BFLOAT16)], "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 21)])
    text = str(import_onnx(model))
    assert "bf16[2,3]" in text and "f32[2,3]" in text


def test_data_movement_takes_storage_dtypes():
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.float8_e4m3fn)
    t = ml.tensor(a)
    assert _same(ml.ops.transpose(t).numpy(), a.T)
    assert _same(ml.ops.reshape(t, (3, 2)).numpy(), a.reshape(3, 2))
    assert _same(ml.ops.concatenate([t, t], axis=0).numpy(), np.concatenate([a, a]))
    assert _same(t[1:, ::2].numpy(), a[1:, ::2])
    assert _same(ml.ops.cast(t, "float32").numpy(), a.astype(np.float32))


@pytest.mark.parametrize("dt", dtypes.STORAGE, ids=lambda d: d.name)
def test_computing_ops_refuse_storage_dtypes_by_name(dt):
    t = ml.tensor(np.zeros(3, np.float32).astype(dt))
    with pytest.raises(ml.DTypeError, match=rf"exp: dtype {dt.name} .*storage.*cast"):
        ml.ops.exp(t)
    with pytest.raises(ml.DTypeError, match=rf"add: dtype {dt.name}"):
        t + t
    with pytest.raises(ml.DTypeError, match=rf"matmul: dtype {dt.name}"):
        ml.ops.matmul(ml.ops.reshape(t, (1, 3)), ml.ops.reshape(t, (3, 1)))
    with pytest.raises(ml.DTypeError, match=rf"promote: .*{dt.name}"):
        dtypes.promote(dt, dtypes.float32)


@pytest.mark.parametrize("dt", dtypes.STORAGE, ids=lambda d: d.name)
def test_cast_round_trips_match_ml_dtypes(dt):
    x = _random(400, 7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dt in SUB_BYTE:  # integers: finite, in range or wrapping as ml_dtypes wraps
            x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).clip(-40, 40).round()
        want = x.astype(dt)
        got = ml.ops.cast(ml.tensor(x), dt).numpy()
        assert _same(got, want)
        back = ml.ops.cast(ml.tensor(got), "float32").numpy()
        assert _same(back, want.astype(np.float32))
        # a value of the format survives the round trip through float32 exactly
        assert _same(ml.ops.cast(ml.tensor(back), dt).numpy(), want)


def _cast_model(src, dst, opset=23, **attrs):
    x = helper.make_tensor_value_info("x", src, [400])
    y = helper.make_tensor_value_info("y", dst, [400])
    node = helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)
    return helper.make_model(helper.make_graph([node], "cast", [x], [y]),
                             opset_imports=[helper.make_opsetid("", opset)])


def _both(model, *inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ReferenceEvaluator(model).run(None, dict(zip(["x", "s", "z"], inputs)))
        got = Interpreter(import_onnx(model)).run(*[a for a in inputs[:1]])
    return got, want


_CAST_TARGETS = [(d, 1) for d in FLOAT8] + [(d, 0) for d in FLOAT8] + [
    (d, None) for d in (dtypes.bfloat16, dtypes.float4_e2m1fn) + SUB_BYTE]


@pytest.mark.parametrize("dst, saturate", _CAST_TARGETS,
                         ids=[f"{d.name}-sat{s}" for d, s in _CAST_TARGETS])
@pytest.mark.parametrize("src", [np.float32, np.float16], ids=["f32", "f16"])
def test_onnx_cast_matches_the_reference(src, dst, saturate):
    code = helper.np_dtype_to_tensor_dtype(dst)
    attrs = {} if saturate is None else {"saturate": saturate}  # float8 only
    x = _random(400, 11 + (saturate or 0), src)
    if dst in SUB_BYTE:
        x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0).clip(-20, 20)
    model = _cast_model(helper.np_dtype_to_tensor_dtype(np.dtype(src)), code, **attrs)
    (got,), (want,) = _both(model, x)
    assert _same(got, want), f"{np.sum(~np.isclose(got.astype(float), want.astype(float)))}"
    if dst in FLOAT8:  # the rule that differs between the two: saturating huge values
        m = float(ml_dtypes.finfo(dst).max)
        x64 = x.astype(np.float64)
        big = got[np.isinf(x64) | (np.abs(np.nan_to_num(x64)) > 2 * m)].astype(np.float64)
        assert big.size >= 3
        assert (np.all(np.abs(big) == m) if saturate else
                np.all(np.isnan(big) | np.isinf(big)))


def _e8m0_inputs():
    """Powers of two, their float32 neighbours, subnormals, 0, huge values, NaN and inf."""
    k = np.arange(-126, 128, 5).astype(np.float32)
    p = np.exp2(k)
    x = np.concatenate([p, np.nextafter(p, np.float32(np.inf)), np.nextafter(p, np.float32(0)),
                        p * 1.5, p * 0.75, -p * 1.25, _random(200, 13),
                        np.array([0.0, -0.0, 1e-40, 1e-45, 3e38, -3e38, np.float32(2**127),
                                  np.nan, np.inf, -np.inf], np.float32)])
    return x[np.isfinite(x) | np.isnan(x) | np.isinf(x)].astype(np.float32)


@pytest.mark.parametrize("round_mode", ["up", "down"])
@pytest.mark.parametrize("saturate", [1, 0])
def test_cast_to_float8_e8m0_matches_the_reference(round_mode, saturate):
    x = _e8m0_inputs()
    model = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E8M0, opset=24,
                        round_mode=round_mode, saturate=saturate)
    for info in (model.graph.input[0], model.graph.output[0]):
        info.type.tensor_type.shape.dim[0].dim_value = x.size
    (got,), (want,) = _both(model, x)
    assert _same(got, want)
    # what differs from ml_dtypes' own rounding (nearest): 3 rounds up to 4, down to 2
    three = np.array([3.0], np.float32)
    model = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E8M0, opset=24,
                        round_mode=round_mode, saturate=saturate)
    for info in (model.graph.input[0], model.graph.output[0]):
        info.type.tensor_type.shape.dim[0].dim_value = 1
    (got,), _ = _both(model, three)
    assert float(got.astype(np.float32)[0]) == (4.0 if round_mode == "up" else 2.0)


def test_float8_e8m0_round_to_nearest_is_refused_by_name():
    model = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E8M0, opset=24,
                        round_mode="nearest")
    with pytest.raises(ml.ArgumentError, match=r"Cast.*round_mode 'nearest'.*float8_e8m0fnu"):
        import_onnx(model)


def _qdq_model(qtype, shape, scale_shape, block_size=0, axis=1, dq=False):
    x_type = qtype if dq else TensorProto.FLOAT
    y_type = TensorProto.FLOAT if dq else qtype
    ins = [helper.make_tensor_value_info("x", x_type, shape)]
    attrs = {"axis": axis}
    if block_size:
        attrs["block_size"] = block_size
    node = helper.make_node("DequantizeLinear" if dq else "QuantizeLinear", ["x", "s", "z"],
                            ["y"], **attrs)
    return ins, [helper.make_tensor_value_info("y", y_type, shape)], node


def _run_qdq(qdt, x, s, z, block_size=0, axis=1, dq=False):
    code = helper.np_dtype_to_tensor_dtype(qdt)
    ins, outs, node = _qdq_model(code, list(x.shape), list(s.shape), block_size, axis, dq)
    inits = [onnx.numpy_helper.from_array(s, "s"), onnx.numpy_helper.from_array(z, "z")]
    model = helper.make_model(helper.make_graph([node], "qdq", ins, outs, inits),
                              opset_imports=[helper.make_opsetid("", 21)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (want,) = ReferenceEvaluator(model).run(None, {"x": x})
        (got,) = Interpreter(import_onnx(model)).run(x)
    return got, want


@pytest.mark.parametrize("qdt", (dtypes.int16, dtypes.uint16) + SUB_BYTE + FLOAT8
                         + (dtypes.float4_e2m1fn,), ids=lambda d: d.name)
@pytest.mark.parametrize("block_size", [0, 3])
def test_quantize_and_dequantize_match_the_reference(qdt, block_size):
    r = np.random.default_rng(3)
    x = (r.standard_normal((4, 7)) * 3).astype(np.float32)
    floats = qdt in FLOAT8 or qdt == dtypes.float4_e2m1fn
    # the reference casts rint(x / s) to int32 first: inf and > 2**31 are undefined there
    x[0, :3] = [np.inf, -np.inf, 1e9] if floats else [1e5, -1e5, 3e4]
    sshape = (4, 3) if block_size else (7,)
    s = r.uniform(0.01, 0.5, sshape).astype(np.float32)
    if qdt in FLOAT8 or qdt == dtypes.float4_e2m1fn:
        z = np.zeros(sshape, np.float32).astype(qdt)
    else:
        lo, hi = int(ml_dtypes.iinfo(qdt).min), int(ml_dtypes.iinfo(qdt).max)
        z = r.integers(lo, hi + 1, sshape).astype(qdt)
    axis = 1
    got, want = _run_qdq(qdt, x, s, z, block_size, axis)
    assert _same(got, want)
    assert not np.all(got.astype(np.float64) == 0)  # a real signal, not all zeros
    back, back_want = _run_qdq(qdt, got, s, z, block_size, axis, dq=True)
    assert _same(back, back_want) and back.dtype == np.float32
    if not floats:  # the spec's saturation, where the reference's int32 cast is undefined
        x[0, :2] = [np.inf, -np.inf]
        got, _ = _run_qdq(qdt, x, s, z, block_size, axis)
        info = ml_dtypes.iinfo(qdt)
        assert got[0, :2].astype(int).tolist() == [int(info.max), int(info.min)]


def test_blocked_scale_of_the_wrong_shape_is_a_shape_error():
    from mlsys_lab.deploy.quant.ops import quantize_linear

    x = ml.tensor(np.ones((4, 6), np.float32))
    s = ml.tensor(np.ones((4, 3), np.float32))
    z = ml.tensor(np.zeros((4, 3), np.int16))
    assert quantize_linear(x, s, z, axis=1, block_size=2).dtype == np.int16
    with pytest.raises(ml.ShapeError, match=r"blocks of 4 .*scale of shape \(4, 2\)"):
        quantize_linear(x, s, z, axis=1, block_size=4)


def test_bfloat16_ops_compute_in_float32_and_round_back_as_onnx_reference():
    r = np.random.default_rng(5)
    x = (r.standard_normal(200) * 4).astype(ml_dtypes.bfloat16)
    xi = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [200])
    yi = helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [200])
    nodes = [helper.make_node("Mul", ["x", "x"], ["m"]), helper.make_node("Add", ["m", "x"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "bf", [xi], [yi]),
                              opset_imports=[helper.make_opsetid("", 21)])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    graph = import_onnx(model)
    (got,) = Interpreter(graph).run(x)
    assert got.dtype == dtypes.bfloat16 and _same(got, want)
    ops = [n.op for n in graph.nodes]
    assert ops.count("cast") >= 2 and "mul" in ops and "add" in ops  # widened, rounded back


def test_the_package_root_names_the_new_dtypes():
    for name in ("int16", "uint16", "uint32", "uint64", "bfloat16"):
        assert getattr(ml, name) == dtypes.as_dtype(name) and name in ml.__all__
    assert ml.tensor([1, 2], dtype=ml.uint16).dtype == np.uint16
