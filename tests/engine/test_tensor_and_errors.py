"""Tensor semantics and the library's errors on bad input."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops


def test_dtypes_follow_the_documented_rules():
    assert ml.tensor(1.5).dtype == np.float32
    assert ml.tensor([1, 2]).dtype == np.int64
    assert ml.tensor(np.zeros(2)).dtype == np.float64  # float64 arrays are kept
    assert ml.tensor(np.zeros(2, np.uint8)).dtype == np.uint8
    x = ml.tensor(np.ones(3, np.float32))
    assert (x * 2).dtype == np.float32 and (x * 2.5).dtype == np.float32  # scalars are weak
    assert (ml.tensor([1, 2]) / 2).dtype == np.float32
    assert (ml.tensor(np.ones(2, np.int32)) + x[:2]).dtype == np.float32
    assert (x > 1).dtype == np.bool_


def test_image_cast_from_uint8():
    img = ml.tensor(np.full((96, 96, 3), 255, np.uint8))
    f = ops.cast(img, "float32") / 255.0
    assert img.numpy().nbytes == 27648 and f.numpy().nbytes == 110592
    assert f.dtype == np.float32 and float(f.max()) == 1.0


def test_indexing_and_methods():
    a = ml.tensor(np.arange(12.0).reshape(3, 4))
    np.testing.assert_array_equal(a[1], [4, 5, 6, 7])
    np.testing.assert_array_equal(a[:, 1:3].numpy(), np.arange(12.0).reshape(3, 4)[:, 1:3])
    np.testing.assert_array_equal(a[[2, 0]].numpy()[:, 0], [8, 0])
    assert a.T.shape == (4, 3) and a.reshape(2, 6).shape == (2, 6)
    assert float(a.sum()) == 66 and a.mean(axis=0).shape == (4,)
    assert np.asarray(a).shape == (3, 4)


@pytest.mark.parametrize("fn, err, words", [
    (lambda: ml.tensor(np.ones((2, 3))) + ml.tensor(np.ones((4,))), ml.ShapeError,
     ["add", "(2, 3)", "(4,)"]),
    (lambda: ml.tensor(np.ones((2, 3))) @ ml.tensor(np.ones((2, 3))), ml.ShapeError,
     ["matmul", "(2, 3)", "3 != 2"]),
    (lambda: ml.tensor(np.ones((2, 2), np.float32)) @ ml.tensor(np.ones((2, 2))), ml.DTypeError,
     ["matmul", "float32", "float64"]),
    (lambda: ops.exp(ml.tensor([1, 2])), ml.DTypeError, ["exp", "int64", "cast"]),
    (lambda: ops.reshape(ml.tensor(np.ones(6)), (4, 2)), ml.ShapeError, ["reshape", "(6,)"]),
    (lambda: ops.sum(ml.tensor(np.ones((2, 2))), axis=3), ml.ShapeError, ["sum", "axis 3"]),
    (lambda: ops.cross_entropy(ml.tensor(np.ones((3, 4))), ml.tensor(np.ones(3))),
     ml.DTypeError, ["cross_entropy", "integer"]),
    (lambda: ops.cross_entropy(ml.tensor(np.ones((3, 4))), ml.tensor([0, 1, 7])), ml.OpError,
     ["cross_entropy", "[0, 4)"]),
    (lambda: ops.conv2d(ml.tensor(np.ones((1, 3, 5, 5))), ml.tensor(np.ones((2, 4, 3, 3)))),
     ml.ShapeError, ["conv2d", "3 channels", "expects 4"]),
    (lambda: ml.tensor(np.ones(3))[5], ml.ShapeError, ["getitem", "(3,)"]),
    (lambda: ml.tensor(np.ones(3, np.complex64)), ml.DTypeError, ["complex64"]),
    (lambda: ml.tensor([1, 2], requires_grad=True), ml.DTypeError, ["floating"]),
])
def test_bad_input_raises_library_errors(fn, err, words):
    with pytest.raises(err) as info:
        fn()
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    assert isinstance(info.value, ml.MLSysError)


def test_errors_subclass_python_builtins():
    assert issubclass(ml.ShapeError, ValueError) and issubclass(ml.DTypeError, TypeError)
    assert issubclass(ml.GraphError, RuntimeError) and issubclass(ml.CheckpointError, ValueError)


def test_second_backward_needs_retain_graph():
    x = ml.tensor([1.0, 2.0], requires_grad=True)
    y = (ops.exp(x) * x).sum()
    y.backward()
    with pytest.raises(ml.GraphError, match="second time.*retain_graph=True"):
        y.backward()
    z = (ops.exp(x) * x).sum()
    x.grad = None
    z.backward(retain_graph=True)
    z.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * (np.exp([1, 2]) * (1 + np.array([1, 2]))),
                               rtol=1e-6)


def test_no_grad_records_nothing():
    x = ml.tensor([1.0], requires_grad=True)
    with ml.no_grad():
        y = x * 2
    assert not y.requires_grad and y.is_leaf
    with pytest.raises(ml.GraphError, match="does not require grad"):
        y.backward()


def test_backward_of_non_scalar_needs_a_gradient():
    x = ml.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(ml.ShapeError, match="shape"):
        (x * 2).backward()
    (x * 2).backward(np.array([1.0, 0.5], np.float32))
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 1.0])


def test_grad_requires_a_scalar_function():
    with pytest.raises(ml.ShapeError, match="scalar"):
        ml.grad(lambda x: x * 2)(np.ones(3))


def test_unused_inputs_and_integer_grads():
    x = ml.tensor([1.0, 2.0], requires_grad=True)
    z = ml.tensor([3.0], requires_grad=True)
    y = (x * x).sum()
    gx, gz = ml.gradients(y, [x, z], retain_graph=True)
    np.testing.assert_array_equal(gz.numpy(), [0.0])
    with pytest.raises(ml.GraphError, match="input 1 .* not used"):
        ml.gradients(y, [x, z], allow_unused=False)
    with pytest.raises(ml.DTypeError, match="floating"):
        ml.grad(lambda a: (a * 2).sum())(np.array([1, 2]))


def test_runtime_and_compiled_inputs_are_checked_alike():
    from mlsys_lab.engine.compiler import Compiled
    from mlsys_lab.engine.runtime import run_serial

    g = ml.trace(lambda a: ops.relu(a), np.ones(3, np.float32))
    c = Compiled(lambda a: ops.relu(a), np.ones(3, np.float32), passes=None)
    for run in (g, lambda a: run_serial(g, a), c):
        with pytest.raises(ml.ShapeError, match="input a expects f32\\[3\\]"):
            run(np.ones(4, np.float32))
        with pytest.raises(ml.DTypeError, match="input a expects f32\\[3\\], got f64"):
            run(np.ones(3))
