"""Op definitions against independent oracles (issue 9): float64 central differences, numpy,
and PyTorch's answers written in as numbers (CI has no torch). One test per silently wrong
result or raw error that was found, plus a registry-wide JVP check."""

import warnings

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops as O
from mlsys_lab.engine import control, ops_math, ops_nn, ops_shape
from mlsys_lab.engine.autodiff_graph import jvp_graph
from mlsys_lab.engine.registry import REGISTRY, Op, get
from mlsys_lab.engine.tensor import apply

from ..gradcheck import numeric_vjp, tape_vjp

R = np.random.default_rng(9)
F32 = np.float32


# --- dropout: fresh randomness per call, reproducible under a seed, one mask fwd and bwd -----
def _masks(run, n=3, seed=11):
    ml.ops.manual_seed(seed)
    return [np.asarray(run()) for _ in range(n)]


def test_compiled_dropout_draws_a_fresh_mask_on_every_call():
    x = np.ones(1000, F32)
    c = ml.compile(lambda v: O.dropout(v, 0.5), x)
    a, b = c(x), c(x)
    assert not np.array_equal(a, b)
    for y in (a, b):
        assert set(np.unique(y)) <= {0.0, 2.0} and 400 < np.count_nonzero(y) < 600
    g = ml.trace(lambda v: O.dropout(v, 0.5), x)
    assert not np.array_equal(g(x).numpy(), g(x).numpy())


def test_manual_seed_makes_dropout_reproducible_eager_traced_and_compiled():
    x = np.ones(500, F32)
    graph = ml.trace(lambda v: O.dropout(v, 0.3), x)
    compiled = ml.compile(lambda v: O.dropout(v, 0.3), x)
    runs = {"eager": lambda: O.dropout(ml.tensor(x), 0.3), "traced": lambda: graph(x),
            "compiled": lambda: compiled(x)}
    seqs = {}
    for name, run in runs.items():
        first, again = _masks(run), _masks(run)
        assert all(np.array_equal(p, q) for p, q in zip(first, again)), name
        assert not np.array_equal(first[0], first[1]), name
        seqs[name] = first
    for name in ("traced", "compiled"):  # one seed drawn per dropout call in every mode
        assert all(np.array_equal(p, q) for p, q in zip(seqs["eager"], seqs[name])), name


def test_dropout_seed_is_an_input_drawn_by_the_impure_rng_seed_op():
    x = np.ones(64, F32)
    g = ml.trace(lambda v: O.dropout(v, 0.5), x)
    assert [n.op for n in g.nodes] == ["rng_seed", "dropout"]
    drop = g.nodes[1]
    assert "seed" not in drop.attrs and drop.inputs[1] is g.nodes[0].outputs[0]
    assert get("rng_seed").impure and not get("dropout").impure
    assert not get("dropout").elementwise  # its mask is drawn over the whole shape
    t = ml.tensor(x)
    fixed = O.dropout(t, 0.5, seed=5).numpy()
    np.testing.assert_array_equal(O.dropout(t, 0.5, seed=np.int64(5)).numpy(), fixed)
    np.testing.assert_array_equal(O.dropout(t, 0.5, seed=ml.tensor(5)).numpy(), fixed)
    assert O.rng_seed().dtype == np.int64 and O.rng_seed().shape == ()
    with pytest.raises(ml.DTypeError, match="dropout: seed must be an integer"):
        O.dropout(t, 0.5, seed=ml.tensor(1.5))


def _check_loss_and_grad(loss, grad, w, p):
    """d/dv sum(dropout(v) * w) at v = 1 is mask * w / (1 - p), and the loss is its sum."""
    grad = np.asarray(grad, np.float64)
    scaled = w / (1 - p)
    kept = np.isclose(grad, scaled)
    assert np.all(kept | (grad == 0)) and 0 < kept.sum() < len(w)
    assert float(loss) == pytest.approx(float(np.sum(grad)), rel=1e-5)
    return kept


def test_dropout_gradient_reuses_the_forward_mask_in_every_mode():
    p, x = 0.5, np.ones(300)
    w = R.uniform(1, 2, 300)

    def loss(v):
        return O.sum(O.dropout(v, p) * w)

    t = ml.tensor(x, requires_grad=True)
    y = loss(t)
    y.backward()
    _check_loss_and_grad(y.item(), t.grad.numpy(), w, p)
    vg = ml.value_and_grad(loss)
    _check_loss_and_grad(*vg(x), w, p)
    gg = ml.grad_graph(ml.trace(loss, x))
    kept = [_check_loss_and_grad(*gg(x), w, p) for _ in range(2)]
    assert not np.array_equal(*kept)
    c = ml.compile(vg, x)
    kept = [_check_loss_and_grad(*c(x), w, p) for _ in range(2)]
    assert not np.array_equal(*kept)


def test_compiled_train_step_with_dropout_draws_new_masks_per_step():
    x = R.standard_normal((16, 6)).astype(F32)
    y = R.integers(0, 3, 16)
    model = ml.nn.Sequential(ml.nn.Linear(6, 32, rng=1), ml.nn.ReLU(), ml.nn.Dropout(0.5),
                             ml.nn.Linear(32, 3, rng=2))
    step = ml.compile_train_step(model, O.cross_entropy, x, y, lr=0.0)  # lr 0: params fixed
    ml.ops.manual_seed(4)
    losses = [step(x, y) for _ in range(3)]
    assert len(set(losses)) == 3
    ml.ops.manual_seed(4)
    assert [step(x, y) for _ in range(3)] == losses


# --- getitem with index arrays ----------------------------------------------------------------
def test_getitem_list_index_accumulates_the_gradient_of_repeated_positions():
    g = ml.grad(lambda v: O.sum(O.getitem(v, [0, 0])))(np.ones(2))
    np.testing.assert_array_equal(np.asarray(g), [2.0, 0.0])
    x = R.standard_normal((4, 5))
    index = (slice(1, None), [0, 2, 2, 4, 0])
    fn = lambda a: O.getitem(a, index)  # noqa: E731
    u = R.standard_normal(x[index].shape)
    np.testing.assert_allclose(tape_vjp(fn, [x], u, (0,))[0],
                               numeric_vjp(fn, [x], u, (0,))[0], rtol=1e-7, atol=1e-9)
    mask = np.array([True, False, True, True])
    np.testing.assert_array_equal(O.getitem(ml.tensor(x), mask).numpy(), x[mask])


def test_getitem_long_index_arrays_forward_backward_and_compiled():
    x = R.standard_normal(3000)
    i1 = R.integers(0, 3000, 2000)
    i2 = i1.copy()
    i2[1000] = (i2[1000] + 1) % 3000  # differs in one element, deep inside numpy's "..."

    def f(v):
        return O.getitem(v, i1) * 2.0 + O.getitem(v, i2)

    want = x[i1] * 2 + x[i2]
    np.testing.assert_array_equal(f(ml.tensor(x)).numpy(), want)
    np.testing.assert_array_equal(ml.compile(f, x)(x), want)
    g = np.asarray(ml.grad(lambda v: O.sum(f(v)))(x))
    expect = np.zeros(3000)
    np.add.at(expect, i1, 2.0)
    np.add.at(expect, i2, 1.0)
    np.testing.assert_array_equal(g, expect)
    a, b = [n.attrs for n in ml.trace(f, x).nodes if n.op == "getitem"]
    assert a != b and hash(a["index"]) != hash(b["index"])  # compared by value, never by repr
    assert ml.trace(lambda v: O.getitem(v, i1.tolist()), x).nodes[0].attrs == a


def test_getitem_grad_accumulates_a_raw_list_index_given_to_apply():
    g = apply(get("getitem_grad"), ml.ones(3), shape=(3,), index=([0, 0, 2],))
    np.testing.assert_array_equal(g.numpy(), [2, 0, 1])


def test_getitem_refuses_float_and_traced_indices():
    with pytest.raises(ml.ShapeError, match="getitem: index arrays must hold integers"):
        O.getitem(ml.ones(3), [0.5])
    with pytest.raises(ml.ShapeError, match="getitem: cannot index with a traced tensor"):
        ml.trace(lambda v, i: O.getitem(v, i), np.ones(3), np.array([0]))


# --- pow at 0 (PyTorch: torch.pow(x, y).backward() in float64) --------------------------------
@pytest.mark.parametrize("x, y, dx, dy", [
    (0.0, 0.0, 0.0, 0.0), (0.0, 1.0, 1.0, 0.0), (0.0, 2.0, 0.0, 0.0), (0.0, 0.5, np.inf, 0.0),
    (2.0, 0.0, 0.0, np.log(2.0)), (3.0, 2.0, 6.0, 9 * np.log(3.0))])
def test_pow_gradients_match_pytorch_at_zero(x, y, dx, dy):
    a, b = np.array([x]), np.array([y])
    with warnings.catch_warnings():
        warnings.simplefilter("error" if y in (0.0, 1.0, 2.0) else "ignore")
        ga, gb = ml.grad(lambda p, q: O.sum(O.pow(p, q)), argnums=(0, 1))(a, b)
        _, ta = ml.jvp(lambda p: O.pow(p, ml.tensor(b)), [a], [np.ones(1)])
        _, tb = ml.jvp(lambda q: O.pow(ml.tensor(a), q), [b], [np.ones(1)])
    np.testing.assert_allclose([float(ga[0]), float(gb[0])], [dx, dy], rtol=1e-12)
    np.testing.assert_allclose([float(ta[0]), float(tb[0])], [dx, dy], rtol=1e-12)


# --- sigmoid on both tails --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log_sigmoid_is_finite_on_the_negative_tail(dtype):
    x = ml.tensor(np.array([-40.0], dtype), requires_grad=True)
    y = O.log(O.sigmoid(x))
    assert y.item() == pytest.approx(-40.0, rel=1e-6)  # PyTorch: -40.0; the tanh form gave -inf
    y.sum().backward()
    assert x.grad.item() == pytest.approx(1.0, rel=1e-6)
    if dtype == np.float64:  # PyTorch float64: log(sigmoid(-100)) = -100, gradient 1
        assert O.log(O.sigmoid(ml.tensor(np.array([-100.0])))).item() == pytest.approx(-100.0)
    assert O.sigmoid(ml.tensor(np.array([-20.0], dtype))).item() * 1e9 == pytest.approx(
        2.0611536, rel=1e-5)  # PyTorch's 2.06 (the sigmoid(-20) * 1e9)


@pytest.mark.parametrize("dtype, ulps", [(np.float32, 2), (np.float64, 2)])
def test_sigmoid_is_within_a_few_ulp_over_the_whole_range(dtype, ulps):
    x = np.concatenate([np.linspace(-120, 120, 4001), [-1e30, 1e30, -0.0, 0.0, 1e-30, -1e-30]])
    x = x.astype(dtype)
    got = O.sigmoid(ml.tensor(x)).numpy()
    xl = x.astype(np.longdouble)
    with np.errstate(over="ignore"):
        ref = (1 / (1 + np.exp(-xl))).astype(dtype)
    assert np.all(np.abs(got.astype(np.longdouble) - ref) <= ulps * np.spacing(np.abs(ref)))
    special = O.sigmoid(ml.tensor(np.array([np.inf, -np.inf, np.nan], dtype))).numpy()
    assert special[0] == 1 and special[1] == 0 and np.isnan(special[2])


# --- pooling and convolution arguments --------------------------------------------------------
IMG = np.ones((1, 1, 5, 5), F32)
BAD_WINDOWS = [
    (lambda v: O.max_pool2d(v, 2, 2, 3), r"max_pool2d: padding \(3, 3\) .*kernel_size \(2, 2\)"),
    (lambda v: O.avg_pool2d(v, 3, 1, 2), r"avg_pool2d: padding \(2, 2\) .*kernel_size \(3, 3\)"),
    (lambda v: O.max_pool2d(v, 0), r"max_pool2d: kernel_size must be positive, got \(0, 0\)"),
    (lambda v: O.max_pool2d(v, 2, 0), r"max_pool2d: stride must be positive, got \(0, 0\)"),
    (lambda v: O.avg_pool2d(v, 2, 2, -1), r"avg_pool2d: padding must be non-negative"),
    (lambda v: O.conv2d(v, ml.ones((1, 1, 3, 3)), stride=0), r"conv2d: stride must be positive"),
    (lambda v: O.conv2d(v, ml.ones((1, 1, 3, 3)), stride=(1, -2)), r"conv2d: stride .*-2"),
    (lambda v: O.conv2d(v, ml.ones((1, 1, 3, 3)), padding=-1), r"conv2d: padding must be non-n"),
]


@pytest.mark.parametrize("call, message", BAD_WINDOWS)
def test_bad_window_arguments_are_refused_eagerly_and_when_traced(call, message):
    with pytest.raises(ml.ShapeError, match=message):
        call(ml.tensor(IMG))
    with pytest.raises(ml.ShapeError, match=message):
        ml.trace(call, IMG)


def test_window_arguments_must_be_integers_and_half_kernel_padding_is_fine():
    with pytest.raises(ml.DTypeError, match="conv2d: stride must be an integer, got 1.5"):
        O.conv2d(ml.tensor(IMG), ml.ones((1, 1, 3, 3)), stride=1.5)
    with pytest.raises(ml.DTypeError, match="max_pool2d: kernel_size must be an integer"):
        O.max_pool2d(ml.tensor(IMG), 2.0)
    y = O.max_pool2d(ml.tensor(IMG), 2, 2, 1).numpy()  # PyTorch: shape (1, 1, 3, 3), all ones
    assert y.shape == (1, 1, 3, 3) and np.all(y == 1)


@pytest.mark.parametrize("shape", [(0, 1, 4, 4), (2, 0, 4, 4)])
def test_pooling_gradients_of_an_empty_batch_or_channel_axis_are_empty(shape):
    x = np.zeros(shape)
    for fn in (lambda v: O.max_pool2d(v, 2), lambda v: O.avg_pool2d(v, 2, 1, 1)):
        assert np.asarray(ml.grad(lambda v, f=fn: O.sum(f(v)))(x)).shape == shape
        assert np.asarray(ml.jvp(fn, [x], [x])[1]).shape == fn(ml.tensor(x)).shape


# --- axes and shapes ----------------------------------------------------------------------------
T23 = ml.ones((2, 3))
BAD_AXES = [("sum", lambda: O.sum(T23, axis=1.5)), ("mean", lambda: O.mean(T23, axis=(0, 1.5))),
            ("max", lambda: O.max(T23, axis=1.5)), ("softmax", lambda: O.softmax(T23, 1.5)),
            ("log_softmax", lambda: O.log_softmax(T23, axis=1.0)),
            ("argmax", lambda: O.argmax(T23, 1.5)),
            ("concatenate", lambda: O.concatenate([T23, T23], axis=0.5)),
            ("stack", lambda: O.stack([T23, T23], axis=1.5)),
            ("take", lambda: O.take(T23, ml.tensor([0]), axis=1.5))]


@pytest.mark.parametrize("op, call", BAD_AXES, ids=[b[0] for b in BAD_AXES])
def test_a_non_integer_axis_is_a_library_error_naming_the_op(op, call):
    with pytest.raises(ml.DTypeError, match=rf"^{op}: axis must be an integer, got (1.5|1.0|0.5)"):
        call()


@pytest.mark.parametrize("shape", [(-2, -3), (-1, -1), (-6,), (3, -2)])
def test_reshape_refuses_negative_dimensions_other_than_one_minus_one(shape):
    with pytest.raises(ml.ShapeError, match=r"reshape: cannot reshape \(6,\) into"):
        O.reshape(ml.ones(6), shape)
    with pytest.raises(ml.ShapeError, match="reshape"):
        ml.trace(lambda v: O.reshape(v, shape), np.ones(6))
    with pytest.raises(ml.ShapeError, match="reshape: negative dimension"):
        ops_shape.RESHAPE.infer(ml.ones(6), shape=shape)  # a graph built by hand is checked too
    with pytest.raises(ml.ShapeError, match="broadcast_to: negative dimension"):
        O.broadcast_to(ml.ones(1), (-1,))
    assert O.reshape(ml.ones(6), (3, -1)).shape == (3, 2)


# --- reductions and softmax over empty axes ---------------------------------------------------
E03 = np.zeros((0, 3))


@pytest.mark.parametrize("name, fn, shape", [
    ("max_axis1", lambda v: O.max(v, axis=1), (0,)),
    ("max_keepdims", lambda v: O.max(v, axis=1, keepdims=True), (0, 1)),
    ("sum_axis0", lambda v: O.sum(v, axis=0), (3,)),
    ("sum_all", lambda v: O.sum(v), ()),
    ("mean_axis0", lambda v: O.mean(v, axis=0), (3,)),
    ("mean_axis1", lambda v: O.mean(v, axis=1), (0,)),
    ("softmax", lambda v: O.softmax(v), (0, 3)),
    ("softmax_axis0", lambda v: O.softmax(v, 0), (0, 3)),
    ("log_softmax", lambda v: O.log_softmax(v, -1), (0, 3)),
    ("argmax_axis1", lambda v: O.argmax(v, 1), (0,))])
def test_reductions_over_empty_tensors_follow_numpy_and_pytorch(name, fn, shape):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" must not leak out
        y = fn(ml.tensor(E03)).numpy()
        compiled = ml.compile(fn, E03)(E03)
    assert y.shape == shape and compiled.shape == shape, name
    if name.startswith("sum"):
        assert np.all(y == 0)
    if name == "mean_axis0":  # PyTorch: mean over no elements is NaN
        assert np.all(np.isnan(y))
    if not name.startswith("argmax"):
        g = ml.grad(lambda v: O.sum(fn(v)))(E03)
        assert np.asarray(g).shape == (0, 3)


@pytest.mark.parametrize("fn", [O.softmax, O.log_softmax])
def test_softmax_over_a_length_zero_axis_is_empty(fn):
    x = np.zeros((3, 0))  # PyTorch: softmax(zeros(3, 0), -1) has shape (3, 0)
    assert fn(ml.tensor(x)).shape == (3, 0) and ml.compile(fn, x)(x).shape == (3, 0)
    assert np.asarray(ml.grad(lambda v: O.sum(fn(v)))(x)).shape == (3, 0)


@pytest.mark.parametrize("call", [lambda: O.max(ml.tensor(E03), axis=0),
                                  lambda: O.max(ml.tensor(E03)),
                                  lambda: O.max(ml.zeros((0, 0)), axis=1),
                                  lambda: O.argmax(ml.tensor(E03), 0)])
def test_max_over_a_length_zero_axis_is_refused_as_numpy_and_pytorch_do(call):
    with pytest.raises(ml.ShapeError, match=r"(max|argmax): cannot .*(length 0|empty axis)"):
        call()


# --- maximum / minimum ties -------------------------------------------------------------------
@pytest.mark.parametrize("fn, want_a, want_b", [(O.maximum, [0.5, 0, 1], [0.5, 1, 0]),
                                                (O.minimum, [0.5, 1, 0], [0.5, 0, 1])])
def test_maximum_and_minimum_split_ties_like_pytorch(fn, want_a, want_b):
    a, b = np.array([1.0, 2.0, 5.0]), np.array([1.0, 3.0, 4.0])
    ga, gb = ml.grad(lambda p, q: O.sum(fn(p, q)), argnums=(0, 1))(a, b)
    np.testing.assert_array_equal(np.asarray(ga), want_a)  # PyTorch: maximum -> [0.5, 0, 1]
    np.testing.assert_array_equal(np.asarray(gb), want_b)
    _, t = ml.jvp(fn, [a, b], [np.full(3, 2.0), np.full(3, 6.0)])
    np.testing.assert_array_equal(np.asarray(t), np.array(want_a) * 2 + np.array(want_b) * 6)
    x = np.array([0.5, -1.0])
    np.testing.assert_array_equal(np.asarray(ml.grad(lambda v: O.sum(fn(v, v)))(x)), [1, 1])


def test_maximum_ties_with_a_broadcast_scalar_and_nan():
    g = ml.grad(lambda v: O.sum(O.maximum(v, 1.0)))(np.array([1.0, 0.0, 2.0]))  # broadcast tie
    np.testing.assert_array_equal(np.asarray(g), [0.5, 0.0, 1.0])
    ga, gb = ml.grad(lambda p, q: O.sum(O.maximum(p, q)), argnums=(0, 1))(
        np.array([np.nan]), np.array([1.0]))
    assert float(ga[0]) == 0 and float(gb[0]) == 0  # unordered: no gradient (documented)


def test_relu_gradient_is_exactly_zero_at_dead_units_even_for_nan_or_inf():
    x = ml.tensor([-1.0, 0.0, 2.0], requires_grad=True)
    O.relu(x).backward(ml.tensor([np.nan, np.inf, np.nan]))
    got = x.grad.numpy()  # PyTorch: tensor([0., 0., nan])
    assert got[0] == 0 and got[1] == 0 and np.isnan(got[2])


# --- every differentiable op of the core modules: JVP against central differences -----------
def _rnd(*shape):
    return R.standard_normal(shape)


def _distinct(*shape):
    return R.permutation(np.arange(int(np.prod(shape)), dtype=float)).reshape(shape) * 0.37 + 0.1


def _away(*shape):
    return R.uniform(0.2, 1.5, shape) * R.choice([-1, 1], shape)


_MP = dict(kernel=(2, 2), stride=(1, 1), padding=(1, 1))
_AP = dict(kernel=(2, 2), stride=(2, 2), padding=(1, 1))
_CT = ml.tensor(np.array([1, 0, 3]))
_COND = ml.tensor(np.arange(12).reshape(3, 4) % 3 == 0)
# op name -> (function of tensors, input makers, differentiable positions)
JVP_CASES = {
    "add": (O.add, lambda: [_rnd(3, 4), _rnd(4)], (0, 1)),
    "sub": (O.sub, lambda: [_rnd(3, 1), _rnd(1, 4)], (0, 1)),
    "mul": (O.mul, lambda: [_rnd(2, 3), _rnd(3)], (0, 1)),
    "div": (O.div, lambda: [_rnd(3, 4), R.uniform(0.5, 2, (3, 4))], (0, 1)),
    "pow": (O.pow, lambda: [R.uniform(0.5, 2, (3, 4)), _rnd(4)], (0, 1)),
    "maximum": (O.maximum, lambda: [_distinct(3, 4), _distinct(4) + 0.185], (0, 1)),
    "minimum": (O.minimum, lambda: [_distinct(3, 4), _distinct(3, 4) + 0.1], (0, 1)),
    "neg": (O.neg, lambda: [_rnd(5)], (0,)),
    "exp": (O.exp, lambda: [_rnd(5)], (0,)),
    "log": (O.log, lambda: [R.uniform(0.5, 2, 5)], (0,)),
    "sqrt": (O.sqrt, lambda: [R.uniform(0.5, 2, 5)], (0,)),
    "tanh": (O.tanh, lambda: [_rnd(5)], (0,)),
    "sigmoid": (O.sigmoid, lambda: [_rnd(5) * 4], (0,)),
    "sin": (O.sin, lambda: [_rnd(5)], (0,)),
    "cos": (O.cos, lambda: [_rnd(5)], (0,)),
    "relu": (O.relu, lambda: [_away(3, 4)], (0,)),
    "relu_grad": (ops_math.relu_grad, lambda: [_rnd(3, 4), _away(3, 4)], (0,)),
    "abs": (O.abs, lambda: [_away(3, 4)], (0,)),
    "sign": (O.sign, lambda: [_away(3, 4)], (0,)),  # flat: both rules give zero
    "where": (lambda a, b: O.where(_COND, a, b), lambda: [_rnd(3, 4), _rnd(4)], (0, 1)),
    "cast": (lambda a: O.cast(a, "float64") * 3.0, lambda: [_rnd(4)], (0,)),
    "identity": (O.identity, lambda: [_rnd(3)], (0,)),
    "reshape": (lambda a: O.reshape(a, (3, -1)), lambda: [_rnd(2, 6)], (0,)),
    "transpose": (lambda a: O.transpose(a, (2, 0, 1)), lambda: [_rnd(2, 3, 4)], (0,)),
    "broadcast_to": (lambda a: O.broadcast_to(a, (2, 3, 4)), lambda: [_rnd(3, 1)], (0,)),
    "sum": (lambda a: O.sum(a, axis=(0, 2), keepdims=True), lambda: [_rnd(3, 4, 2)], (0,)),
    "mean": (lambda a: O.mean(a, axis=1), lambda: [_rnd(3, 4)], (0,)),
    "max": (lambda a: O.max(a, axis=0), lambda: [_distinct(4, 3)], (0,)),
    "concatenate": (lambda a, b: O.concatenate([a, b], 1), lambda: [_rnd(2, 3), _rnd(2, 1)],
                    (0, 1)),
    "stack": (lambda a, b: O.stack([a, b], -1), lambda: [_rnd(2, 3), _rnd(2, 3)], (0, 1)),
    "getitem": (lambda a: O.getitem(a, (slice(None, None, -1), [0, 2, 0])),
                lambda: [_rnd(3, 4)], (0,)),
    "getitem_grad": (lambda g: ops_shape.getitem_grad(g, (3, 4), (1, [0, 3, 3])),
                     lambda: [_rnd(3)], (0,)),
    "take": (lambda a: O.take(a, ml.tensor([2, 0, 2]), axis=1), lambda: [_rnd(3, 4)], (0,)),
    "take_grad": (lambda g: ops_shape.take_grad(g, ml.tensor([2, 0, 2]), (3, 4), 1),
                  lambda: [_rnd(3, 3)], (0,)),
    "pad": (lambda a: O.pad(a, ((1, 0), (2, 1))), lambda: [_rnd(2, 3)], (0,)),
    "matmul": (O.matmul, lambda: [_rnd(2, 3, 4), _rnd(4, 2)], (0, 1)),
    "softmax": (lambda a: O.softmax(a, 0), lambda: [_rnd(3, 4)], (0,)),
    "log_softmax": (lambda a: O.log_softmax(a, 1), lambda: [_rnd(3, 4)], (0,)),
    "cross_entropy": (lambda a: O.cross_entropy(a, _CT), lambda: [_rnd(3, 4)], (0,)),
    "cross_entropy_grad": (lambda a: ops_nn._ce_dlogits(a, _CT), lambda: [_rnd(3, 4)], (0,)),
    "mse_loss": (O.mse_loss, lambda: [_rnd(3, 4), _rnd(3, 4)], (0, 1)),
    "conv2d": (lambda x, w: O.conv2d(x, w, stride=2, padding=1),
               lambda: [_rnd(1, 2, 5, 5), _rnd(3, 2, 3, 3)], (0, 1)),
    "conv2d_grad_input": (lambda g, w: ops_nn.conv2d_grad_input(g, w, (1, 2, 5, 5), (2, 2),
                                                                (1, 1)),
                          lambda: [_rnd(1, 3, 3, 3), _rnd(3, 2, 3, 3)], (0, 1)),
    "conv2d_grad_weight": (lambda x, g: ops_nn.conv2d_grad_weight(x, g, (3, 2, 3, 3), (2, 2),
                                                                  (1, 1)),
                           lambda: [_rnd(1, 2, 5, 5), _rnd(1, 3, 3, 3)], (0, 1)),
    "max_pool2d": (lambda x: O.max_pool2d(x, 2, 1, 1), lambda: [_distinct(1, 2, 4, 4)], (0,)),
    "max_pool2d_select": (lambda u, x: apply(ops_nn.MAX_POOL2D_SELECT, u, x,
                                                              **_MP),
                          lambda: [_rnd(1, 2, 4, 4), _distinct(1, 2, 4, 4)], (0,)),
    "max_pool2d_scatter": (lambda g, x: apply(ops_nn.MAX_POOL2D_SCATTER, g, x,
                                                               **_MP),
                           lambda: [_rnd(1, 2, 5, 5), _distinct(1, 2, 4, 4)], (0,)),
    "avg_pool2d": (lambda x: O.avg_pool2d(x, 2, padding=1), lambda: [_rnd(1, 2, 4, 5)], (0,)),
    "avg_pool2d_grad": (lambda g: apply(ops_nn.AVG_POOL2D_GRAD, g,
                                                         x_shape=(1, 2, 4, 5), **_AP),
                        lambda: [_rnd(1, 2, 3, 3)], (0,)),
    "dropout": (lambda x: O.dropout(x, 0.4, seed=7), lambda: [_rnd(4, 5)], (0,)),
}


def _ops_defined_in(*modules):
    return {v.name for m in modules for v in vars(m).values() if isinstance(v, Op)}


def test_every_differentiable_core_op_has_a_jvp_and_a_case_here():
    core = _ops_defined_in(ops_math, ops_shape, ops_nn, control)
    differentiable = {n for n in core if REGISTRY[n].vjp is not None}
    assert not [n for n in differentiable if REGISTRY[n].jvp is None]
    assert differentiable - {"cond"} == set(JVP_CASES)  # cond: test_cond_jvp_and_vjp below


def _directional(fn, xs, diff, vs, eps=1e-6):
    def at(s):
        moved = list(xs)
        for i, v in zip(diff, vs):
            moved[i] = xs[i] + s * v
        return np.asarray(fn(*[ml.tensor(a) for a in moved]).numpy(), np.float64)
    return (at(eps) - at(-eps)) / (2 * eps)


@pytest.mark.parametrize("name", sorted(JVP_CASES))
def test_jvp_matches_central_differences_and_transposes_the_vjp(name):
    fn, make, diff = JVP_CASES[name]
    xs = make()
    vs = [R.standard_normal(xs[i].shape) for i in diff]

    def of_diff(*d):
        full = [ml.tensor(a) for a in xs]
        for i, a in zip(diff, d):
            full[i] = a
        return fn(*full)

    y, jv = ml.jvp(of_diff, [xs[i] for i in diff], vs)
    np.testing.assert_allclose(np.asarray(jv), _directional(fn, xs, diff, vs), rtol=1e-6,
                               atol=1e-7, err_msg=f"{name}: JVP")
    u = R.standard_normal(y.shape)
    vjp = tape_vjp(fn, xs, u, diff)
    lhs = float(np.sum(np.asarray(jv) * u))
    assert lhs == pytest.approx(sum(float(np.sum(v * g)) for v, g in zip(vs, vjp)),
                                rel=1e-9, abs=1e-12), f"{name}: <u, J v> != <J^T u, v>"


def test_cond_jvp_and_vjp_match_central_differences():
    def f(x, flag):
        return O.cond(flag, lambda a: O.sin(a) * a, lambda a: O.exp(a), x)

    x, v = _rnd(4), _rnd(4)
    for flag in (np.array(True), np.array(False)):
        g = ml.trace(f, x, flag)
        tangent = jvp_graph(g)(x, flag, v, np.array(False))
        want = _directional(lambda a, p=flag: f(a, ml.tensor(p)), [x], (0,), [v])
        np.testing.assert_allclose(np.asarray(tangent), want, rtol=1e-7)
        _, grad = ml.grad_graph(ml.trace(lambda a, p: O.sum(f(a, p)), x, flag), wrt=[0])(x, flag)
        assert float(np.sum(np.asarray(grad) * v)) == pytest.approx(float(np.sum(want)))
