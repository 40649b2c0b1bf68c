"""The compute dtypes int16, uint16, uint32 and uint64 next to the others: the promotion table
against numpy (and PyTorch where it promotes at all), the documented deviations, and eager
arithmetic and comparisons on random data against numpy."""

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.engine import dtypes

from ..conformance import torch_misc_reference

COMPUTE = dtypes.COMPUTE
NEW_INTS = (dtypes.int16, dtypes.uint16, dtypes.uint32, dtypes.uint64)


def _deviation(a, b):
    """What mlsys_lab documents where it departs from numpy: an integer with a float gives
    the float (numpy may widen it), uint64 with a signed integer is an error."""
    ints = {a, b} - {dtypes.float16, dtypes.float32, dtypes.float64, dtypes.bool_}
    floats = {a, b} & {dtypes.float16, dtypes.float32, dtypes.float64}
    if len(ints) == 1 and len(floats) == 1:
        return floats.pop()
    if dtypes.uint64 in (a, b) and any(np.dtype(d).kind == "i" for d in (a, b)):
        return ml.DTypeError
    return None


@pytest.mark.parametrize("a, b", list(itertools.product(COMPUTE, COMPUTE)))
def test_promotion_table_against_numpy(a, b):
    deviation = _deviation(a, b)
    if deviation is ml.DTypeError:
        with pytest.raises(ml.DTypeError, match=r"uint64.*int|int.*uint64"):
            dtypes.promote(a, b)
        return
    got = dtypes.promote(a, b)
    assert got == dtypes.promote(b, a)  # symmetric
    assert got == (deviation if deviation is not None else np.promote_types(a, b)), (a, b)


def test_the_integer_with_float_deviation_is_real_and_documented():
    # numpy widens, mlsys_lab (as PyTorch) keeps the float: the docstring says so
    assert np.promote_types(np.int16, np.float16) == np.float32
    assert dtypes.promote(dtypes.int16, dtypes.float16) == np.float16
    assert "int16 + float16" in dtypes.__doc__ and "uint64" in dtypes.__doc__


def test_promotion_agrees_with_pytorch_where_it_promotes():
    ref = torch_misc_reference("promotion")  # torch.promote_types, committed
    names = [str(n) for n in ref["names"]]
    for (i, a), (j, b) in itertools.product(enumerate(names), enumerate(names)):
        assert dtypes.promote(np.dtype(a), np.dtype(b)) == np.dtype(str(ref["table"][i, j])), \
            (a, b)
    assert ref["uint16_int8_raises"]  # why uint16/32/64 follow numpy: PyTorch has no rule


@pytest.mark.parametrize("a, b, want", [
    ("int8", "uint8", "int16"), ("int16", "uint16", "int32"), ("int32", "uint32", "int64"),
    ("int8", "uint16", "int32"), ("int16", "uint8", "int16"), ("uint16", "uint32", "uint32"),
    ("int64", "uint32", "int64"), ("bool", "uint64", "uint64"), ("uint64", "float32", "float32")])
def test_signed_with_unsigned_takes_the_narrowest_int_holding_both(a, b, want):
    assert dtypes.promote(np.dtype(a), np.dtype(b)) == np.dtype(want)
    if np.dtype(want).kind not in "iu" or "bool" in (a, b):
        return
    lo = min(np.iinfo(a).min, np.iinfo(b).min)
    hi = max(np.iinfo(a).max, np.iinfo(b).max)
    assert np.iinfo(want).min <= lo and hi <= np.iinfo(want).max


def test_uint64_with_a_signed_int_is_a_clear_error_in_an_op():
    a = ml.tensor(np.array([1, 2], np.uint64))
    b = ml.tensor(np.array([1, 2], np.int64))
    with pytest.raises(ml.DTypeError, match=r"uint64 with int64.*cast one side"):
        a + b
    assert (a + ml.tensor(np.array([3, 4], np.uint8))).dtype == np.uint64


_OPS = {"add": (lambda x, y: x + y, np.add), "sub": (lambda x, y: x - y, np.subtract),
        "mul": (lambda x, y: x * y, np.multiply),
        "max": (ml.ops.maximum, np.maximum), "min": (ml.ops.minimum, np.minimum),
        "lt": (lambda x, y: x < y, np.less), "ge": (lambda x, y: x >= y, np.greater_equal),
        "eq": (lambda x, y: x == y, np.equal)}


def _ints(dt, n, seed):
    info = np.iinfo(dt)
    return np.random.default_rng(seed).integers(info.min, info.max, n, dtype=dt,
                                                endpoint=True)


@pytest.mark.parametrize("dt", NEW_INTS, ids=lambda d: d.name)
@pytest.mark.parametrize("op", sorted(_OPS))
def test_arithmetic_and_comparisons_match_numpy(dt, op):
    ours, ref = _OPS[op]
    x, y = _ints(dt, 64, 1), _ints(dt, 64, 2)
    x[:4] = [np.iinfo(dt).max, np.iinfo(dt).min, 0, 1]  # wrap-around edges
    y[:4] = [1, np.iinfo(dt).max, 0, np.iinfo(dt).max]
    got = ours(ml.tensor(x), ml.tensor(y)).numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = ref(x, y)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(NEW_INTS + (dtypes.int8, dtypes.uint8, dtypes.int32)),
       st.sampled_from(NEW_INTS + (dtypes.int8, dtypes.uint8, dtypes.int32)),
       st.integers(0, 2**32 - 1))
def test_mixed_integer_sums_never_wrap_the_other_range(a, b, seed):
    try:
        out = dtypes.promote(a, b)
    except ml.DTypeError:
        assert dtypes.uint64 in (a, b)
        return
    x, y = _ints(a, 16, seed), _ints(b, 16, seed + 1)
    got = (ml.tensor(x) + ml.tensor(y)).numpy()
    assert got.dtype == out
    # every input value is representable in the result dtype (no wrap of either operand)
    assert np.array_equal(x.astype(out).astype(object), x.astype(object))
    assert np.array_equal(y.astype(out).astype(object), y.astype(object))
    want = (x.astype(object) + y.astype(object))
    info = np.iinfo(out)
    want = np.array([((int(v) - int(info.min)) % 2**(8 * out.itemsize)) + int(info.min)
                     for v in want], dtype=object)
    np.testing.assert_array_equal(got.astype(object), want.astype(object))


def test_new_ints_print_with_short_names_and_refuse_overflowing_scalars():
    t = ml.tensor(np.array([1, 2], np.uint16))
    assert [dtypes.short(d) for d in NEW_INTS] == ["i16", "u16", "u32", "u64"]
    assert dtypes.as_dtype("u32") == np.uint32 and dtypes.as_dtype("int16") == np.int16
    assert (t + 1).dtype == np.uint16
    with pytest.raises(ml.DTypeOverflowError, match="70000 does not fit in uint16"):
        t + 70000
