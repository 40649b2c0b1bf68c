"""Regression tests for engine defects the issue-9 guard tests found, where those guards check
less than the fix promises (gradients, PyTorch-compatible acceptance, the errors' types)."""

import operator

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.ops_nn import check_dropout_p
from mlsys_lab.errors import ArgumentError, DTypeError, RankError


def test_dropout_p_one_gives_zeros_and_a_zero_gradient_everywhere():
    x = np.arange(1.0, 5.0, dtype=np.float32)
    t = ml.tensor(x, requires_grad=True)
    y = ops.dropout(t, 1.0)
    ops.sum(y * 3.0).backward()
    np.testing.assert_array_equal(y.numpy(), 0.0)
    np.testing.assert_array_equal(t.grad.numpy(), 0.0)
    loss = lambda v: ops.sum(ops.dropout(v, 1.0) * v)  # noqa: E731
    np.testing.assert_array_equal(ml.grad(loss)(x).numpy(), 0.0)
    np.testing.assert_array_equal(ml.compile(ml.grad(loss), x)(x), 0.0)
    np.testing.assert_array_equal(ml.compile(lambda v: ops.dropout(v, 1.0), x)(x), 0.0)


@pytest.mark.parametrize("p, error", [(-0.1, ArgumentError), (1.5, ArgumentError),
                                      (float("nan"), ArgumentError), ("a", DTypeError),
                                      (True, DTypeError)])
def test_dropout_p_outside_unit_interval_is_refused(p, error):
    with pytest.raises(error, match="Dropout"):
        check_dropout_p(p, "Dropout")
    with pytest.raises(error, match="dropout"):
        ops.dropout(ml.ones(3), p)
    assert check_dropout_p(1) == 1.0 and check_dropout_p(np.float32(0.25)) == 0.25


def test_manual_seed_takes_pytorchs_range():
    ops.manual_seed(-1)
    a = ops.rng_seed().item()
    ops.manual_seed(2**64 - 1)  # -1 is its two's complement, as in PyTorch
    assert ops.rng_seed().item() == a
    for bad in (-2**63 - 1, 2**64):
        with pytest.raises(ArgumentError, match="manual_seed"):
            ops.manual_seed(bad)


def test_two_index_arrays_gather_and_accumulate_their_gradient():
    x = np.arange(9.0).reshape(3, 3)
    t = ml.tensor(x, requires_grad=True)
    y = t[[0, 1, 0], [1, 2, 1]]
    np.testing.assert_array_equal(y.numpy(), [1.0, 5.0, 1.0])
    ops.sum(y).backward()
    want = np.zeros((3, 3))
    want[0, 1], want[1, 2] = 2.0, 1.0  # (0, 1) is picked twice
    np.testing.assert_array_equal(t.grad.numpy(), want)


def test_scalar_conversions_are_rank_errors_and_still_type_errors():
    for convert in (float, int, bool, lambda t: t.item()):
        with pytest.raises(RankError, match="2 elements"):
            convert(ml.ones(2))
    for convert in (len, list):
        with pytest.raises(TypeError, match="0-d"):  # Python's protocols expect TypeError
            convert(ml.tensor(1.0))
    assert float(ml.ones((1, 1))) == 1.0 and int(ml.tensor([[3]])) == 3  # one element: fine


def test_a_float_tensor_is_not_an_index():
    assert operator.index(ml.tensor(2)) == 2
    with pytest.raises(DTypeError, match="integer"):
        operator.index(ml.tensor(2.5))  # it used to truncate silently to 2


def test_vjp_casts_the_cotangent_and_checks_how_many_there_are():
    w = np.ones((3, 2), np.float32)
    _, f = ml.vjp(lambda a: a @ w, np.ones((2, 3), np.float32))
    (g,) = f(np.ones((2, 2)))  # a float64 cotangent for a float32 output, as PyTorch takes it
    assert g.dtype == np.float32
    np.testing.assert_array_equal(g.numpy(), 2.0)
    _, f2 = ml.vjp(lambda a: (a * 2.0, a * 3.0), np.ones(2))
    with pytest.raises(ArgumentError, match="vjp"):
        f2((np.ones(2),))  # one cotangent for two outputs: not a silent zero for the second


def test_grad_graph_keeps_input_dtypes_and_checks_positions():
    g = ml.trace(lambda x, w: ops.sum(x * w), np.ones(3, np.float32), np.ones(3))
    out = ml.grad_graph(g)(np.ones(3, np.float32), np.full(3, 2.0))
    assert [o.dtype for o in out[1:]] == [np.float32, np.float64]
    np.testing.assert_array_equal(out[1], 2.0)
    last = ml.grad_graph(g, wrt=-1)(np.ones(3, np.float32), np.full(3, 2.0))
    assert len(last) == 2 and last[1].dtype == np.float64
    with pytest.raises(ArgumentError, match="grad_graph"):
        ml.grad_graph(g, wrt=[2])
    with pytest.raises(DTypeError, match="wrt"):
        ml.grad_graph(g, wrt=[0.5])


def test_grad_argnums_accepts_lists_and_refuses_bad_positions():
    f = ml.grad(lambda a, b: ops.sum(a * b), argnums=[0, 1])
    ga, gb = f(np.ones(2), np.full(2, 3.0))
    np.testing.assert_array_equal(ga.numpy(), 3.0)
    np.testing.assert_array_equal(gb.numpy(), 1.0)
    with pytest.raises(ArgumentError, match="argnums"):
        ml.grad(lambda a: ops.sum(a), argnums=-2)(np.ones(2))


def test_op_argument_errors_name_the_op_in_traces_too():
    with pytest.raises(DTypeError, match="^exp: "):
        ml.trace(lambda v: v + ops.exp(None), np.ones(2))
    with pytest.raises(DTypeError, match="^mul: "):
        ops.mul(ml.ones(2), "x")
