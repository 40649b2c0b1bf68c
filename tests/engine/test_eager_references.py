"""The lean numpy references of the eager hot path (issue 12) against independent oracles.

``cross_entropy`` (one logsumexp pass, worked in place), its gradient and ``softmax`` are
checked against float64 formulas written out here; the target-range check (one max over the
ids read as unsigned) against the plain rule on every integer dtype, including int8 ids with
more than 128 classes, where reading as unsigned alone would miss -1; the two-shape
broadcasting shortcut of the elementwise rules against ``numpy.broadcast_shapes``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.ops_math import _broadcast2
from mlsys_lab.errors import OpError, ShapeError


def _ce_oracle(x, t):
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return float(np.mean(lse - x[np.arange(len(t)), t]))


def _softmax_oracle(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 9), c=st.integers(1, 12), seed=st.integers(0, 2**31 - 1),
       scale=st.sampled_from([0.1, 3.0, 60.0]), dtype=st.sampled_from(["float32", "float64"]),
       tdtype=st.sampled_from(["int64", "int32", "uint8", "int8"]))
def test_cross_entropy_and_gradient_match_float64_oracle(n, c, seed, scale, dtype, tdtype):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, c)) * scale).astype(dtype)
    t = rng.integers(0, c, n).astype(tdtype)
    xt = ml.tensor(x, requires_grad=True)
    loss = ops.cross_entropy(xt, ml.tensor(t))
    tol = 1e-5 if dtype == "float32" else 1e-12
    assert loss.dtype == np.dtype(dtype)
    np.testing.assert_allclose(loss.item(), _ce_oracle(x, t), rtol=tol, atol=tol * scale)
    loss.backward()
    p = _softmax_oracle(x, 1)
    p[np.arange(n), t] -= 1.0
    np.testing.assert_allclose(xt.grad.numpy(), p / n, rtol=tol, atol=tol)
    np.testing.assert_array_equal(x, xt.numpy())  # the in-place work never touches the input


@pytest.mark.parametrize("tdtype,c,bad", [
    ("int8", 200, -1),      # -1 read as uint8 is 255 >= 200: found; but -100 is 156 < 200
    ("int8", 200, -100),
    ("int8", 5, -128),
    ("int8", 129, -1),
    ("int64", 10, -1),
    ("int64", 10, 10),
    ("uint8", 10, 255),
    ("uint8", 3, 3),
    ("int32", 7, 2**31 - 1),
])
def test_cross_entropy_refuses_every_out_of_range_target(tdtype, c, bad):
    x = np.zeros((4, c), np.float32)
    t = np.array([0, 1, bad, 0], tdtype)
    with pytest.raises(OpError, match=r"cross_entropy: targets must lie in \[0, " + str(c)):
        ops.cross_entropy(ml.tensor(x), ml.tensor(t))


@pytest.mark.parametrize("tdtype", ["int8", "uint8", "int32", "int64"])
def test_cross_entropy_accepts_the_largest_valid_id(tdtype):
    c = 127 if tdtype == "int8" else 200
    x = np.random.default_rng(0).standard_normal((3, c)).astype(np.float32)
    t = np.array([0, c - 1, c // 2], tdtype)
    np.testing.assert_allclose(ops.cross_entropy(ml.tensor(x), ml.tensor(t)).item(),
                               _ce_oracle(x, t.astype(np.int64)), rtol=1e-5)


def test_cross_entropy_strided_targets_and_logits():
    rng = np.random.default_rng(1)
    x = np.asfortranarray(rng.standard_normal((6, 5)).astype(np.float32))
    t = rng.integers(0, 5, 12)[::2]  # a non-contiguous view
    np.testing.assert_allclose(ops.cross_entropy(ml.tensor(x), ml.tensor(t)).item(),
                               _ce_oracle(x, t), rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 10**6),
       data=st.data())
def test_softmax_matches_oracle_and_leaves_input(shape, seed, data):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = (np.random.default_rng(seed).standard_normal(shape) * 20).astype(np.float32)
    before = x.copy()
    y = ops.softmax(ml.tensor(x), axis).numpy()
    np.testing.assert_allclose(y, _softmax_oracle(x, axis), rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(x, before)


_dims = st.lists(st.sampled_from([0, 1, 2, 3]), max_size=4).map(tuple)


@settings(max_examples=200, deadline=None)
@given(a=_dims, b=_dims)
def test_two_shape_broadcasting_matches_numpy(a, b):
    try:
        want = np.broadcast_shapes(a, b)
    except ValueError:
        with pytest.raises(ShapeError, match="add: cannot broadcast"):
            _broadcast2("add", a, b)
    else:
        assert _broadcast2("add", a, b) == want
        assert _broadcast2("add", list(a), b) == want
