"""Argument checks of layers, optimisers, checkpoints, the compiler options and the runtime
that the malformed-input guard does not reach (issue 9): each used to be accepted silently or
to fail later with a bare Python or numpy error."""

import operator
import os

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn, ops
from mlsys_lab.engine import memory, runtime
from mlsys_lab.engine.ops_nn import check_dropout_p
from mlsys_lab.engine.passes import run_pipeline
from mlsys_lab.errors import ArgumentError, DTypeError, MLSysError, RankError

F = np.ones(3, np.float32)


def _params():
    return nn.Linear(3, 2, rng=0).parameters()


def _raises(fn, builtin, *words):
    """``fn()`` raises a library error that is also ``builtin`` and names every word."""
    with pytest.raises(MLSysError) as info:
        fn()
    assert isinstance(info.value, builtin), type(info.value).__mro__
    for w in words:
        assert w in str(info.value), str(info.value)
    return info.value


# --- optimisers ----------------------------------------------------------------------------
def test_optimizer_load_state_dict_checks_the_loaded_hyper_parameters():
    opt = ml.optim.SGD(_params(), lr=0.1)
    sd = opt.state_dict()
    sd["hyper"]["lr"] = -1.0
    _raises(lambda: opt.load_state_dict(sd), ValueError, "SGD", "learning rate")
    assert opt.hyper["lr"] == 0.1  # nothing changed
    sd["hyper"] = {"lr": 0.1, "lrr": 0.2}
    _raises(lambda: opt.load_state_dict(sd), ValueError, "lrr")


def test_nesterov_needs_momentum_and_adam_needs_a_pair_of_betas():
    _raises(lambda: ml.optim.SGD(_params(), lr=0.1, nesterov=True), ValueError, "Nesterov")
    _raises(lambda: ml.optim.Adam(_params(), betas=0.9), TypeError, "betas")
    _raises(lambda: ml.optim.SGD(nn.Parameter(F), lr=0.1), TypeError, "iterable")


def test_optimizers_still_accept_lr_zero_and_plain_tensors():
    p = ml.tensor(F.copy(), requires_grad=True)
    opt = ml.optim.SGD([p], lr=0.0)
    p.grad = ml.tensor(F)
    opt.step()
    np.testing.assert_array_equal(p.numpy(), F)


# --- layers -------------------------------------------------------------------------------
def test_layers_refuse_bad_sizes_when_built():
    _raises(lambda: nn.Embedding(-1, 2), ValueError, "Embedding", "num_embeddings")
    _raises(lambda: nn.LayerNorm(-3), ValueError, "LayerNorm")
    _raises(lambda: nn.BatchNorm2d(2.5), ValueError, "BatchNorm2d")
    _raises(lambda: nn.Conv2d(1, 1, (3, 0)), ValueError, "Conv2d", "kernel")
    _raises(lambda: nn.Dropout(-0.1), ValueError, "Dropout")  # not only on the first call


def test_zero_size_layers_build_like_pytorch():
    layer = nn.Linear(0, 2)
    assert layer.weight.shape == (0, 2)
    np.testing.assert_array_equal(layer(np.ones((4, 0), np.float32)).numpy(), np.zeros((4, 2)))


def test_layers_lift_arrays_and_check_them():
    bn = nn.BatchNorm2d(3)
    x = np.random.default_rng(0).standard_normal((2, 3, 2, 2)).astype(np.float32)
    np.testing.assert_allclose(bn(x).numpy(), bn(ml.tensor(x)).numpy())
    bn.eval()
    _raises(lambda: bn(np.ones((2, 4, 2, 2), np.float32)), ValueError, "BatchNorm2d", "3")
    assert nn.Flatten()([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 2)


# --- checkpoints --------------------------------------------------------------------------
def test_save_onto_a_folder_is_refused_and_leaves_nothing_behind(tmp_path):
    _raises(lambda: ml.save({"a": 1}, tmp_path), ValueError, "save")
    assert os.listdir(tmp_path) == []


# --- compile options ----------------------------------------------------------------------
def test_compile_refuses_unknown_options_and_accepts_single_names():
    _raises(lambda: ml.compile(lambda v: v * 2.0, F, devise="cpu"), ValueError, "devise",
            "device")
    c = ml.compile(lambda v: v * 2.0 + 0.0, F, passes="algebraic_simplification",
                   device="npu", fallback="cpu")
    np.testing.assert_array_equal(c(F), 2 * F)


def test_compiled_refuses_none_instead_of_computing_nan():
    c = ml.compile(lambda v: v * 2.0, np.float32(1.0))
    _raises(lambda: c(None), TypeError, "input")
    _raises(lambda: c("1.5"), TypeError, "input")
    assert c(3) == 6.0


def test_pipeline_resolves_every_name_before_running_a_pass():
    ran = []

    def spy(g):
        ran.append(g)
        return g.copy()

    g = ml.trace(lambda v: v * 2.0, F)
    _raises(lambda: run_pipeline(g, [spy, "nope"]), ValueError, "nope", "cse")
    assert ran == []


def test_unknown_names_are_library_errors_listing_the_known_ones():
    e = _raises(lambda: memory.plan([], "tetris"), KeyError, "tetris", "greedy_by_size")
    assert str(e).startswith("plan: unknown strategy")  # not KeyError's quoted repr
    _raises(lambda: ml.compile(lambda v: v, F, device="tpu"), ValueError, "tpu", "cpu-numba")


# --- runtime and the caching allocator ----------------------------------------------------
def test_runtime_options_are_checked():
    g = ml.trace(lambda v: v * 2.0, F)
    _raises(lambda: runtime.run_parallel(g, F, workers=0), ValueError, "workers")
    _raises(lambda: runtime.run_serial(g, F, order="random"), ValueError, "random", "dfs")
    _raises(lambda: runtime.run_heterogeneous(g, F, mode="async"), ValueError, "async")


def test_caching_allocator_errors_are_the_librarys():
    pool = memory.CachingAllocator(capacity=1 << 20)
    _raises(lambda: pool.malloc(1.5), ValueError, "malloc")
    _raises(lambda: pool.malloc(-1), ValueError, "malloc")
    _raises(lambda: pool.malloc(4 << 20), MemoryError, "malloc", "out of memory")


# --- engine defects the issue-9 guard tests found, where those guards check less than the
# fix promises (gradients, PyTorch-compatible acceptance, the errors' types) -------------


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
