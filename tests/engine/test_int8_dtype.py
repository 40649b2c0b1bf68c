"""int8 as a Tensor dtype: its promotion rules (int8 with uint8 gives int16, as numpy and
PyTorch) and, over every
conformance case of the registry, that an op given int8 data either refuses it with a library
error exactly where it refuses int32 data, or computes what it computes on int32 data (wrapped
to int8 where the result stays int8, as numpy's int8 arithmetic wraps)."""

import warnings

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.engine import dtypes

from .. import conformance as C

I8, U8, I32 = np.int8, np.uint8, np.int32


@pytest.mark.parametrize("a, b, want", [
    ("int8", "uint8", "int16"), ("uint8", "int8", "int16"), ("int8", "int32", "int32"),
    ("int8", "int64", "int64"), ("bool", "int8", "int8"), ("int8", "float16", "float16"),
    ("int8", "float32", "float32"), ("int8", "int8", "int8")])
def test_promotion_table(a, b, want):
    assert dtypes.promote(np.dtype(a), np.dtype(b)) == np.dtype(want)


def test_int8_with_uint8_keeps_both_ranges():
    a = ml.tensor(np.array([-128, 127, -1], I8))
    b = ml.tensor(np.array([255, 255, 0], U8))
    s = a + b
    assert s.dtype == np.int16
    np.testing.assert_array_equal(s.numpy(), [127, 382, -1])  # int8 or uint8 would wrap
    assert (a * b).numpy().tolist() == [-32640, 32385, 0]


def test_int8_tensors_scalars_and_overflow():
    t = ml.tensor(np.array([1, -2], I8))
    assert t.dtype == np.int8 and dtypes.short(t.dtype) == "i8"
    assert (t + 1).dtype == np.int8 and (t + 1).numpy().tolist() == [2, -1]  # weak scalar
    assert (t * 0.5).dtype == np.float32
    with pytest.raises(ml.DTypeOverflowError, match=r"200 does not fit in int8"):
        t + 200
    with pytest.raises(ml.DTypeOverflowError, match="int8"):
        ml.tensor([1, 200], dtype="int8")
    assert ml.tensor([1, -100], dtype="int8").numpy().dtype == np.int8


def _run(case, inputs):
    """The case's output as an array, the library error it raised, or a tuple describing any
    other exception (which is a bug)."""
    try:
        r = case.fn(*[ml.tensor(a) for a in inputs])
    except ml.MLSysError as e:
        return e
    except Exception as e:  # noqa: BLE001 - any other exception is the bug this test finds
        return (type(e).__name__, str(e)[:200])
    r = r[0] if isinstance(r, (tuple, list)) else r
    return np.asarray(r.numpy() if hasattr(r, "numpy") else r)


def _as_small_ints(a, dtype):
    """A float input as small integers (non-finite values as 0), so int8 holds them."""
    if a.dtype.kind != "f":
        return a.astype(dtype) if a.dtype.kind in "iu" else a
    finite = np.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)
    return np.clip(np.rint(finite * 4), -100, 100).astype(dtype)


def _cases():
    C.registered_ops()
    out = []
    for _, spec in sorted(C.SPECS.items()):
        for case in spec.cases:
            ints = [a for a in case.inputs if a.dtype.kind in "iu" and a.size]
            if any(a.min() < -128 or a.max() > 127 for a in ints):
                continue  # integer data int8 cannot hold
            if ints or any(a.dtype.kind == "f" for a in case.inputs):
                out.append(case)
    return out


def test_every_op_takes_int8_as_it_takes_int32_or_refuses_it():
    cases = _cases()
    assert len(cases) > 300  # the whole registry, not a handful
    refused = computed = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # integer division by zero and the like, both dtypes
        for case in cases:
            got = _run(case, [_as_small_ints(a, I8) for a in case.inputs])
            want = _run(case, [_as_small_ints(a, I32) for a in case.inputs])
            assert not isinstance(got, tuple), f"{case.id}: int8 raised {got}"
            if isinstance(got, ml.MLSysError) or isinstance(want, ml.MLSysError):
                assert isinstance(got, ml.MLSysError) and type(got) is type(want), (
                    f"{case.id}: int8 -> {got!r}, int32 -> {want!r}")
                assert "int8" in str(got) or "i8" in str(got), f"{case.id}: {got}"  # named
                refused += 1
                continue
            assert got.shape == want.shape, case.id
            if got.dtype.kind in "iu" and want.dtype.kind in "iu":
                np.testing.assert_array_equal(got.astype(np.int64),
                                              want.astype(got.dtype).astype(np.int64),
                                              err_msg=case.id)
            else:
                np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                                           rtol=1e-5, atol=1e-6, err_msg=case.id)
            computed += 1
    assert refused > 50 and computed > 100  # both outcomes happen: float-only ops refuse


def test_a_float_only_op_names_itself_and_int8_when_it_refuses():
    with pytest.raises(ml.DTypeError, match=r"exp.*int8"):
        ml.ops.exp(ml.tensor(np.array([1, 2], I8)))
