"""The compiled executor's per-call path: arguments passed straight through when they are
arrays, the profiled run as generated code with a clock around each call, and the same checks
and errors as every other way in."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops

RNG = np.random.default_rng(3)
F32 = np.float32
W1 = RNG.standard_normal((6, 5)).astype(F32)
W2 = RNG.standard_normal((5, 3)).astype(F32)


def mlp(x):
    return ops.relu(x @ W1 + 0.5) @ W2


def want(x):
    return np.maximum(np.asarray(x, np.float64) @ W1 + 0.5, 0) @ W2


@pytest.fixture(scope="module")
def compiled():
    return ml.compile(mlp, np.zeros((4, 6), F32))


@pytest.mark.parametrize("profile", [True, False])
def test_array_tensor_and_strided_arguments_agree(compiled, profile):
    x = RNG.standard_normal((4, 6)).astype(F32)
    strided = np.asfortranarray(x)  # same values, another layout
    for arg in (x, ml.tensor(x), strided):
        got = compiled(arg, profile=profile)
        assert isinstance(got, np.ndarray) and got.shape == (4, 3)
        np.testing.assert_allclose(got, want(x), rtol=1e-5, atol=1e-5)


def test_results_are_fresh_arrays_not_arena_views(compiled):
    a = compiled(np.ones((4, 6), F32), profile=False)
    keep = a.copy()
    b = compiled(np.full((4, 6), -3.0, F32), profile=False)
    np.testing.assert_array_equal(a, keep)  # the second call did not write into the first
    assert not np.shares_memory(a, b) and not np.shares_memory(a, compiled.arena)


@pytest.mark.parametrize("profile", [True, False])
def test_bad_arguments_raise_library_errors_naming_the_input(compiled, profile):
    name = compiled.graph.name
    with pytest.raises(ml.ShapeError, match=rf"{name}: input .* expects f32\[4,6\], got "
                                            r"f32\[3,6\]"):
        compiled(np.zeros((3, 6), F32), profile=profile)
    with pytest.raises(ml.DTypeError, match=r"expects f32\[4,6\], got f64\[4,6\]; cast it"):
        compiled(np.zeros((4, 6)), profile=profile)
    with pytest.raises(ml.GraphError, match=rf"{name}: expects 1 inputs, got 2"):
        compiled(np.zeros((4, 6), F32), np.zeros((4, 6), F32), profile=profile)
    with pytest.raises(ml.DTypeError, match="expected numeric data"):
        compiled(None, profile=profile)


def test_profiled_call_records_one_event_per_node_in_schedule_order(compiled):
    x = RNG.standard_normal((4, 6)).astype(F32)
    compiled(x)
    first = compiled.timeline
    nodes = compiled.graph.nodes
    assert [e.node_id for e in first] == [n.id for n in nodes]
    assert all(isinstance(e, ml.Span) for e in first)
    assert [e.name for e in first] == [f"{n.outputs[0].name}={n.op}" for n in nodes]
    assert [e.kind for e in first] == [n.op for n in nodes]
    assert [e.lane for e in first] == [f"{n.meta['device']}/stream0" for n in nodes]
    assert [e.device for e in first] == [n.meta["device"] for n in nodes]
    assert {e.worker for e in first} == {"stream0"}
    assert all(e.start <= e.end for e in first)
    assert all(a.end <= b.start for a, b in zip(first, first[1:]))  # back to back, in order
    first.check_dependencies(compiled.graph)
    compiled(x, profile=False)  # an unprofiled call leaves the last profile as it was
    assert compiled.timeline == first
    compiled(x)
    assert compiled.timeline[0].start >= first[-1].end  # a new run, a new timeline


def test_nested_arguments_still_flatten():
    def f(pair, scale):
        a, b = pair
        return a * scale + b

    a, b, s = (RNG.standard_normal((2, 3)).astype(F32) for _ in range(3))
    c = ml.compile(f, (a, b), s)
    for profile in (True, False):
        np.testing.assert_allclose(c((a, b), s, profile=profile), a * s + b, rtol=1e-6)
    with pytest.raises(ml.ShapeError, match="expects f32\\[2,3\\]"):
        c((a, b[:1]), s)


@pytest.mark.parametrize("profile", [True, False])
def test_a_failing_kernel_is_named_on_both_paths(profile):
    c = ml.compile(lambda i: ops.one_hot(i, 3), np.array([0]))
    with pytest.raises(ml.MLSysError, match=r"while running node #\d+ one_hot"):
        c(np.array([5]), profile=profile)
    np.testing.assert_array_equal(c(np.array([2]), profile=profile), [[0, 0, 1]])


def test_a_failed_profiled_run_keeps_only_the_nodes_that_finished():
    c = ml.compile(lambda i: ops.one_hot(i, 3) * 2.0 + 1.0, np.array([0]))
    c(np.array([1]))
    assert len(c.timeline) == len(c.graph.nodes)
    failing = [k for k, n in enumerate(c.graph.nodes) if n.op == "one_hot"][0]
    with pytest.raises(ml.MLSysError, match="one_hot"):
        c(np.array([7]))
    assert [e.node_id for e in c.timeline] == [n.id for n in c.graph.nodes[:failing]]
