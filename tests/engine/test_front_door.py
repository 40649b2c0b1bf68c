"""The front door (issue 9): numpy functions on Tensors, dtype overflow, malformed tensors and
checkpoints, allocation failures, and the memory planner's lower bound."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine import memory
from mlsys_lab.engine.memory import STRATEGIES, Lifetime, lower_bound, plan, verify
from mlsys_lab.nn.checkpoint import FORMAT

F32 = np.float32


def _message(excinfo):
    assert isinstance(excinfo.value, ml.MLSysError), type(excinfo.value)
    return str(excinfo.value)


# --------------------------------------------------------------------------------------------
# numpy functions on Tensors: dispatched to ml.ops, or refused; never a silent zero gradient
# --------------------------------------------------------------------------------------------


def test_numpy_ufunc_on_a_tensor_keeps_the_tape():
    g = ml.grad(lambda v: ops.sum(np.exp(v)))(np.ones(3))
    np.testing.assert_allclose(g.numpy(), np.e * np.ones(3))
    x = np.array([-1.0, 0.5, 2.0])
    g = ml.grad(lambda v: np.sum(np.maximum(v, 0.0) * np.sin(v) + np.square(v) / 2))(x)
    want = np.where(x > 0, np.sin(x) + x * np.cos(x), 0.0) + x
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-12)


@pytest.mark.parametrize("numpy_f, ml_f", [
    (lambda v: np.sum(np.tanh(v), axis=0), lambda v: ops.sum(ops.tanh(v), axis=0)),
    (lambda v: np.mean(v * v, 1, None, None, True), lambda v: ops.mean(v * v, 1, True)),
    (lambda v: np.max(np.abs(v), axis=1), lambda v: ops.max(ops.abs(v), axis=1)),
    (lambda v: np.matmul(v, np.transpose(v)), lambda v: ops.matmul(v, ops.transpose(v))),
    (lambda v: np.concatenate([v, np.log(v * v + 1)], axis=1),
     lambda v: ops.concatenate([v, ops.log(v * v + 1)], axis=1)),
    (lambda v: np.stack([v, -v * v], 0), lambda v: ops.stack([v, ops.neg(v * v)], 0)),
    (lambda v: np.where(v > 0, v, np.sqrt(v * v)), lambda v: ops.where(v > 0, v, ops.sqrt(v * v))),
    (lambda v: np.reshape(v, (3, 2)) ** 2.0, lambda v: ops.reshape(v, (3, 2)) ** 2.0),
    (lambda v: np.take(v, [1, 1, 0], axis=1), lambda v: ops.take(v, np.array([1, 1, 0]), 1)),
    (lambda v: np.broadcast_to(v, (4, 2, 3)), lambda v: ops.broadcast_to(v, (4, 2, 3))),
])
def test_numpy_functions_with_an_ops_counterpart_differentiate_like_it(numpy_f, ml_f):
    x = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]])
    got, want = ml.value_and_grad(lambda v: ops.sum(numpy_f(v) * 1.7))(x), \
        ml.value_and_grad(lambda v: ops.sum(ml_f(v) * 1.7))(x)
    np.testing.assert_allclose(float(got[0]), float(want[0]), rtol=1e-12)
    np.testing.assert_allclose(got[1].numpy(), want[1].numpy(), rtol=1e-12)
    assert np.abs(got[1].numpy()).sum() > 0


def test_numpy_calls_are_traced_and_compiled():
    x = np.linspace(-1, 1, 6).astype(F32)
    f = lambda v: np.exp(v) + np.maximum(v, 0)  # noqa: E731
    g = ml.trace(f, x)
    assert [n.op for n in g.nodes] == ["exp", "maximum", "add"]
    np.testing.assert_allclose(np.asarray(g(x)), np.exp(x) + np.maximum(x, 0), rtol=1e-6)
    t = ml.jvp(lambda v: np.sin(v), [np.zeros(2)], [np.ones(2)])[1]
    np.testing.assert_allclose(t.numpy(), [1.0, 1.0])


@pytest.mark.parametrize("call, name, hint", [
    (lambda v: np.floor(v), "np.floor", "np.asarray(t)"),
    (lambda v: np.linalg.norm(v), "np.linalg.norm", "np.asarray(t)"),
    (lambda v: np.dot(v, v), "np.dot", "ml.ops.matmul"),
    (lambda v: np.clip(v, 0, 1), "np.clip", "ml.ops.maximum"),
    (lambda v: np.sum(v, dtype=np.float64), "np.sum", "ml.ops.sum"),
    (lambda v: np.arctan2(v, 1.0), "np.arctan2", "np.asarray(t)"),
])
def test_numpy_without_a_counterpart_refuses_a_tensor_being_differentiated(call, name, hint):
    with pytest.raises(ml.TapeError) as info:
        ml.grad(lambda v: ops.sum(call(v)))(np.ones(3, F32))
    msg = _message(info)
    assert isinstance(info.value, TypeError) and name in msg and hint in msg, msg
    with pytest.raises(ml.TapeError):  # forward mode carries a tangent: the same rule
        ml.jvp(call, [np.ones(3)], [np.ones(3)])
    with pytest.raises(ml.TraceError, match=name.replace(".", r"\.")):
        ml.trace(call, np.ones(3, F32))


def test_numpy_refuses_to_write_into_a_tensor_being_differentiated():
    w = ml.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ml.TapeError, match="np.add.at"):
        np.add.at(w, [0], 5.0)
    with pytest.raises(ml.TapeError, match="np.multiply"):
        np.multiply(w, 2.0, out=w)
    a = np.zeros(2)
    with pytest.raises(ml.TapeError, match="np.add"):
        a += w
    with pytest.raises(ml.TapeError, match="np.sum"):
        np.sum(w, out=np.zeros((), np.float32))
    # refused before anything was written
    assert w.numpy().tolist() == [1.0, 2.0] and a.tolist() == [0.0, 0.0]
    flags = np.zeros(2, bool)
    np.greater(w, 1.5, out=flags)  # a bool result carries no gradient
    assert flags.tolist() == [False, True]


def test_numpy_keeps_working_where_no_gradient_can_be_lost():
    x = ml.tensor(np.array([1.0, 4.0], F32))
    w = ml.tensor([1.0, 4.0], requires_grad=True)
    # explicit exits from the tape
    assert type(np.asarray(w)) is np.ndarray and np.shares_memory(np.asarray(w), w.numpy())
    assert np.array(w, dtype=np.float64).dtype == np.float64
    np.testing.assert_allclose(w, [1.0, 4.0])
    np.testing.assert_array_equal(x, [1.0, 4.0])
    # non-floating results carry no gradient, so they are fine even on the tape
    assert np.allclose(w, [1.0, 4.0]) is True and np.array_equal(w, x)
    assert np.shape(w) == (2,) and np.isnan(w).dtype == np.bool_
    # ufuncs always give Tensors, with ml.ops dtype rules; other functions give numpy's result
    for r in (np.exp(x), np.add(x, 2.0), np.floor(x), np.ones(2, F32) + x, np.float64(2) * x):
        assert isinstance(r, ml.Tensor) and r.dtype == np.float32, (r, r.dtype)
    assert isinstance(np.linalg.norm(x), np.floating) and float(np.linalg.norm(x)) > 4.1
    m = np.mean(ml.tensor([True, False, True, True]))  # ml.ops.mean refuses bool: numpy's answer
    assert isinstance(m, ml.Tensor) and f"{m:.2f}" == "0.75"
    with ml.no_grad():  # nothing is recorded, so nothing can be lost
        assert float(np.linalg.norm(w)) == pytest.approx(17 ** 0.5)
    out = np.zeros(2, F32)
    assert np.add(x, 1, out=out) is out and out.tolist() == [2.0, 5.0]


# --------------------------------------------------------------------------------------------
# Values that do not fit, ragged data, truth values, huge and negative shapes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [2**63, [1, 2**63], [-1, 2**63], 2**64, -(2**63) - 1,
                                  [[0, 2**70]]])
def test_tensor_refuses_integers_outside_int64(data):
    with pytest.raises(ml.DTypeOverflowError) as info:
        ml.tensor(data)
    msg = _message(info)
    assert isinstance(info.value, OverflowError) and isinstance(info.value, ml.DTypeError)
    assert "int64" in msg and "does not fit" in msg, msg


def test_tensor_keeps_the_int64_range_and_explicit_dtypes():
    assert ml.tensor(2**63 - 1).item() == 2**63 - 1 and ml.tensor(-(2**63)).item() == -(2**63)
    assert ml.tensor(2**63, dtype="float64").item() == 2.0**63
    with pytest.raises(ml.DTypeOverflowError, match="uint8"):
        ml.tensor([1, 300], dtype="uint8")


def test_ragged_data_is_a_shape_error():
    with pytest.raises(ml.ShapeError) as info:
        ml.tensor([[1, 2], [3]])
    assert "ragged" in _message(info)


def test_truth_value_of_a_tensor_with_several_elements():
    with pytest.raises(ml.ShapeError) as info:
        bool(ml.tensor([1.0, 2.0]))
    msg = _message(info)
    assert "2 elements" in msg and ".any()" in msg and ".all()" in msg
    assert bool(ml.tensor([3.0])) and not bool(ml.tensor(0))
    t = ml.tensor([[0.0, 1.0], [2.0, 3.0]])
    assert bool(t.any()) and not bool(t.all())
    assert t.all(axis=1).tolist() == [False, True] and t.any(axis=0).tolist() == [True, True]
    assert not bool(ml.zeros((0,)).any()) and bool(ml.zeros((0,)).all())


@pytest.mark.parametrize("make", [lambda s: ml.zeros(s), lambda s: ml.ones(s),
                                  lambda s: ml.randn(*s, seed=0)])
@pytest.mark.parametrize("shape", [(10**12,), (10**20, 10**5)])
def test_huge_allocations_are_a_library_memory_error(make, shape):
    with pytest.raises(ml.OutOfMemoryError) as info:
        make(shape)
    msg = _message(info)
    assert isinstance(info.value, MemoryError)
    assert str(shape) in msg and f"{4 * int(np.prod(shape, dtype=object)):,} bytes" in msg, msg


def test_negative_and_non_integer_shapes_are_shape_errors():
    for fn in (ml.zeros, ml.ones):
        with pytest.raises(ml.ShapeError, match=r"\(2, -3\).*negative"):
            fn((2, -3))
        with pytest.raises(ml.ShapeError, match="non-integer"):
            fn((2.5,))
    with pytest.raises(ml.ShapeError, match="negative"):
        ml.randn(-1)
    assert ml.randn(2, 3, seed=1).shape == ml.randn((2, 3), seed=1).shape == (2, 3)


@pytest.mark.parametrize("make, op, value, dtype", [
    (lambda: ml.tensor(np.ones(3, np.uint8)) + 300, "add", "300", "uint8"),
    (lambda: 300 - ml.tensor(np.ones(3, np.uint8)), "sub", "300", "uint8"),
    (lambda: ml.tensor(np.ones(3, np.uint8)) * -1, "mul", "-1", "uint8"),
    (lambda: ml.tensor([1, 2]) + 2**63, "add", str(2**63), "int64"),
    (lambda: ops.maximum(ml.tensor(np.ones(2, np.int32)), 2**40), "maximum", str(2**40), "int32"),
])
def test_weak_scalars_that_do_not_fit_are_refused(make, op, value, dtype):
    with pytest.raises(ml.DTypeOverflowError) as info:
        make()
    msg = _message(info)
    assert isinstance(info.value, OverflowError)
    assert msg.startswith(op + ":") and value in msg and dtype in msg, msg
    assert (ml.tensor(np.ones(3, np.uint8)) + 254).tolist() == [255, 255, 255]


# --------------------------------------------------------------------------------------------
# Hostile checkpoint files
# --------------------------------------------------------------------------------------------


def _craft(path, header, **arrays):
    text = header if isinstance(header, str) else json.dumps(header)
    np.savez(path, __mlsys_lab__=np.asarray(text), **arrays)
    return path


def _hdr(kinds):
    return {"format": FORMAT, "kinds": kinds}


ARR = np.arange(3.0)

HOSTILE = {
    "clash": (_hdr({"a": "array", "a/b": "array"}), {"a": ARR, "a/b": ARR},
              "clashing keys 'a' and 'a/b'"),
    "clash, folder first": (_hdr({"a/b": "int", "a": "array"}), {"a": ARR, "a/b": np.int64(1)},
                            "clashing keys 'a' and 'a/b'"),
    "unknown kind": (_hdr({"a": "tensor"}), {"a": ARR}, "unknown kind 'tensor'"),
    "kind not a string": (_hdr({"a": 3}), {"a": ARR}, "unknown kind 3"),
    "no kinds": ({"format": FORMAT}, {"a": ARR}, "'kinds'"),
    "kinds a list": ({"format": FORMAT, "kinds": ["a"]}, {"a": ARR}, "'kinds'"),
    "int on an array": (_hdr({"a": "int"}), {"a": ARR}, "'a' has kind 'int'"),
    "str on a number": (_hdr({"a": "str"}), {"a": np.float64(1)}, "'a' has kind 'str'"),
    "not JSON": ("{format: nope", {}, "not valid JSON"),
    "JSON list": ("[1, 2]", {}, "JSON object"),
    "wrong format": ({"format": "other/9", "kinds": {}}, {}, "format 'other/9'"),
    "listed, not stored": (_hdr({"a": "array", "b": "array"}), {"a": ARR}, "['b']"),
    "stored, not listed": (_hdr({"a": "array"}), {"a": ARR, "zz": ARR}, "['zz']"),
    "value for none": (_hdr({"a": "none"}), {"a": ARR}, "incomplete"),
    "empty key part": (_hdr({"a//b": "array"}), {"a//b": ARR}, "empty part"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_checkpoint_headers_raise_checkpoint_error(tmp_path, case):
    header, arrays, words = HOSTILE[case]
    path = _craft(tmp_path / "bad.npz", header, **arrays)
    with pytest.raises(ml.CheckpointError) as info:
        ml.load(path)
    msg = _message(info)
    assert str(path) in msg and words in msg, msg


def test_header_that_is_not_a_string(tmp_path):
    path = tmp_path / "numeric.npz"
    np.savez(path, __mlsys_lab__=np.arange(3))
    with pytest.raises(ml.CheckpointError, match="JSON string"):
        ml.load(path)


def test_load_never_unpickles(tmp_path):
    path = tmp_path / "pickled.npz"
    np.savez(path, __mlsys_lab__=np.asarray(json.dumps(_hdr({"a": "array"}))),
             a=np.array([{"evil": 1}], dtype=object))  # np.savez pickles object arrays
    with pytest.raises(ml.CheckpointError, match="allow_pickle"):
        ml.load(path)


def test_checkpoint_round_trip_and_empty_keys(tmp_path):
    state = {"w": np.arange(4.0).reshape(2, 2), "opt": {"step": 3, "lr": 0.1, "on": True,
             "name": "adam", "none": None, "empty": {}}, "t": ml.tensor([1.0, 2.0])}
    ml.save(state, tmp_path / "ok.npz")
    back = ml.load(tmp_path / "ok.npz")
    assert back["opt"] == {"step": 3, "lr": 0.1, "on": True, "name": "adam", "none": None,
                           "empty": {}}
    np.testing.assert_array_equal(back["w"], state["w"])
    ml.save({}, tmp_path / "empty.npz")
    assert ml.load(tmp_path / "empty.npz") == {}
    with pytest.raises(ml.CheckpointError, match="non-empty string"):
        ml.save({"a": {"": 1}}, tmp_path / "x.npz")


# --------------------------------------------------------------------------------------------
# The memory planner: record checks and the lower bound with in-place pairs
# --------------------------------------------------------------------------------------------


def test_planner_refuses_sizes_beyond_int64():
    with pytest.raises(ml.PlanError, match="size .* does not fit in int64"):
        lower_bound([Lifetime("a", 10**30, 0, 1)])
    huge = [Lifetime("a", 2**62, 0, 1), Lifetime("b", 2**62, 1, 2)]  # each fits, the sum not
    for call in (lambda: lower_bound(huge), lambda: plan(huge, "first_fit", 1),
                 lambda: memory.naive_size(huge)):
        with pytest.raises(ml.PlanError, match="more than int64"):
            call()
    assert lower_bound([Lifetime("a", 2**61, 0, 1), Lifetime("b", 2**61, 1, 2)]) == 2**62


def test_planner_refuses_bad_records_everywhere():
    assert issubclass(ml.PlanError, ValueError)
    with pytest.raises(ml.PlanError, match="negative"):
        Lifetime("a", -1, 0, 1)
    with pytest.raises(ml.PlanError, match="start 3 is after end 1"):
        Lifetime("a", 8, 3, 1)
    with pytest.raises(ml.PlanError, match="must be an int"):
        Lifetime("a", 8.0, 0, 1)
    good = Lifetime("b", 8, 0, 1)
    p = plan([good], alignment=1)
    for field, value, words in [("size", -8, "negative"), ("end", -1, "after end")]:
        bad = Lifetime("a", 8, 0, 1)
        object.__setattr__(bad, field, value)  # a record changed behind the constructor's back
        with pytest.raises(ml.PlanError, match=words):
            lower_bound([bad])
        with pytest.raises(ml.PlanError, match=words):
            plan([bad, good])
        with pytest.raises(ml.PlanError, match=words):
            verify(p, [good, bad])
    with pytest.raises(ml.PlanError, match="expected Lifetime records, got tuple"):
        lower_bound([("a", 8, 0, 1)])


def _chain():
    """Four same-size tensors, each overwriting the one before it (an elementwise chain)."""
    lts = [Lifetime(f"v{i}", 64, i, i + 1) for i in range(4)]
    return lts, [(f"v{i + 1}", f"v{i}") for i in range(3)]


def test_lower_bound_counts_an_inplace_pair_once():
    lts, pairs = _chain()
    with_pairs = plan(lts, "best", alignment=1, inplace=pairs)
    assert with_pairs.arena_size == 64
    assert lower_bound(lts) == 128  # without the pairs: the old bound, above this plan
    assert lower_bound(lts, inplace=pairs) == 64 <= with_pairs.arena_size
    assert lower_bound(lts, 64, with_pairs.inplace) == 64
    with pytest.raises(ml.GraphError, match="must die where the output is born"):
        lower_bound(lts, inplace=[("v2", "v0")])  # the same pairs plan refuses


def test_compiled_arena_is_never_below_its_bound():
    x = np.linspace(-1, 1, 16).astype(F32)
    c = ml.compile(lambda v: ops.tanh(ops.exp(v) * 2.0) + 1.0, x, passes=None)
    assert c.plan.inplace  # the elementwise chain reuses buffers in place
    bound = lower_bound(c.lifetimes, c.plan.alignment, inplace=c.plan.inplace)
    assert 0 < bound <= c.plan.arena_size < lower_bound(c.lifetimes, c.plan.alignment)


def _reference_bound(lts, pairs, alignment):
    """Brute force: at each step, bytes of the live tensors, an in-place chain counted once."""
    group = {r.id: r.id for r in lts}
    for out_id, in_id in pairs:
        group[out_id] = group[in_id]
    for i in group:
        while group[group[i]] != group[i]:
            group[i] = group[group[i]]
    size = {r.id: -(-r.size // alignment) * alignment for r in lts}
    steps = range(min((r.start for r in lts), default=0), max((r.end for r in lts), default=-1) + 1)
    return max((sum({group[r.id]: size[r.id] for r in lts if r.start <= t <= r.end}.values())
                for t in steps), default=0)


row = st.tuples(st.one_of(st.just(0), st.integers(1, 3000)), st.integers(0, 15),
                st.integers(0, 6), st.booleans())


@st.composite
def lifetimes_with_pairs(draw):
    """Random lifetimes where some tensors continue the one before them in place."""
    lts, pairs = [], []
    for i, (size, start, length, chained) in enumerate(draw(st.lists(row, max_size=24))):
        prev = lts[-1] if lts else None
        if chained and prev is not None and all(src != prev.id for _, src in pairs):
            lts.append(Lifetime(f"t{i}", prev.size, prev.end, prev.end + length))
            pairs.append((f"t{i}", prev.id))
        else:
            lts.append(Lifetime(f"t{i}", size, start, start + length))
    return lts, pairs


@pytest.mark.parametrize("strategy", [*STRATEGIES, "best"])
@settings(max_examples=150, deadline=None)
@given(case=lifetimes_with_pairs(), alignment=st.sampled_from([1, 8, 64]))
def test_every_plan_is_at_least_the_inplace_bound(strategy, case, alignment):
    lts, pairs = case
    bound = lower_bound(lts, alignment, inplace=pairs)
    assert bound == _reference_bound(lts, pairs, alignment)
    assert lower_bound(lts, alignment) == _reference_bound(lts, [], alignment) >= bound
    shared = plan(lts, strategy, alignment, inplace=pairs)
    assert verify(shared, lts) and shared.arena_size >= bound
    assert plan(lts, strategy, alignment).arena_size >= lower_bound(lts, alignment)
