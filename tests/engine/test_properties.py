"""Property tests (hypothesis): gradients of broadcasting binary ops and reductions on random
shapes, axes and layouts, checked against float64 central differences."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import ops

from ..gradcheck import noncontiguous, numeric_vjp, tape_vjp

BINARY = {"add": ops.add, "sub": ops.sub, "mul": ops.mul, "div": ops.div}


@st.composite
def broadcast_pair(draw):
    """Two shapes that broadcast together (some dims 1, some missing)."""
    out = draw(st.lists(st.integers(1, 4), min_size=0, max_size=3))
    a, b = [], []
    for d in out:
        a.append(d if draw(st.booleans()) else 1)
        b.append(d if draw(st.booleans()) else 1)
    a = a[draw(st.integers(0, len(a))):]  # drop leading dims of one side
    return tuple(a), tuple(b)


@settings(max_examples=60, deadline=None)
@given(pair=broadcast_pair(), name=st.sampled_from(sorted(BINARY)), seed=st.integers(0, 2**16),
       strided=st.booleans())
def test_broadcasting_gradients(pair, name, seed, strided):
    rng = np.random.default_rng(seed)
    a = np.asarray(rng.standard_normal(pair[0]))
    b = np.asarray(rng.uniform(0.5, 2.0, pair[1]) * rng.choice([-1, 1], pair[1]))
    if strided:
        a, b = noncontiguous(a), noncontiguous(b)
    fn = BINARY[name]
    y = np.asarray(fn(ml.tensor(a), ml.tensor(b)))
    assert y.shape == np.broadcast_shapes(a.shape, b.shape)
    u = rng.standard_normal(y.shape)
    got = tape_vjp(fn, [a, b], u, (0, 1))
    want = numeric_vjp(fn, [np.array(a, order="C"), np.array(b, order="C")], u, (0, 1))
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


@settings(max_examples=60, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=3), data=st.data(),
       op=st.sampled_from(["sum", "mean", "max"]), keepdims=st.booleans(),
       seed=st.integers(0, 2**16))
def test_reduction_gradients_over_random_axes(shape, data, op, keepdims, seed):
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a:
                              a % len(shape), max_size=len(shape)))
    axis = tuple(axes) if axes else None
    rng = np.random.default_rng(seed)
    x = rng.permutation(np.arange(int(np.prod(shape)), dtype=float)).reshape(shape) * 0.31
    fn = lambda t: getattr(ops, op)(t, axis=axis, keepdims=keepdims)  # noqa: E731
    y = np.asarray(fn(ml.tensor(x)))
    assert y.shape == getattr(np, op if op != "max" else "amax")(x, axis=axis,
                                                                 keepdims=keepdims).shape
    u = rng.standard_normal(y.shape)
    np.testing.assert_allclose(tape_vjp(fn, [x], u, (0,))[0], numeric_vjp(fn, [x], u, (0,))[0],
                               rtol=1e-5, atol=1e-6)
