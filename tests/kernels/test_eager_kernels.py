"""Eager dispatch reaches the fast kernels (``Kernel.exact`` / ``Kernel.eager``), and the kernels
keep their promises: an ``exact`` kernel is bit-identical to its op's ``compute`` on random
inputs (NaN, infinities, signed zeros included); an ``eager`` kernel that is not exact differs
from ``compute`` only by the order of its sums (checked against a tolerance that a changed
algorithm would break)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine import dispatch
from mlsys_lab.engine.registry import REGISTRY, get, register_impl

from ..recsys.test_recsys_embedding import eager_bag_case
from .test_conv_kernels import _arrays, conv_cases, pool_cases

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-30, -3.5])


def _same_bits(got, want, what):
    """Bit for bit: equal values, NaN where NaN, and the sign of every zero."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    np.testing.assert_array_equal(got, want, err_msg=what)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want), err_msg=f"{what}: signs")


def _kernels(op_name, flag):
    return [k for k in get(op_name).impls.get("cpu", ()) if getattr(k, flag)]


def _values(rng, shape, dtype):
    """Random values with specials sprinkled in."""
    x = rng.standard_normal(shape) * 3
    mask = rng.random(shape) < 0.3
    x[mask] = rng.choice(SPECIALS, int(mask.sum()))
    return x.astype(dtype)


# --- what each op's kernels are held to: (arrays, attrs) from a seed --------------------------
def _unary(rng, dtype):
    return [_values(rng, (3, 5), dtype)], {}


def _binary(rng, dtype):
    shapes = [((3, 5), (3, 5)), ((3, 5), (5,)), ((4, 1), (1, 6))][rng.integers(3)]
    return [_values(rng, s, dtype) for s in shapes], {}


def _relu_grad(rng, dtype):
    return [_values(rng, (4, 7), dtype), _values(rng, (4, 7), dtype)], {}


def _pool_case(rng, dtype, with_grad=False):
    x = rng.choice([-1.0, 0.0, 0.5, 2.0, np.nan, -np.inf], (2, 3, 7, 6)).astype(dtype)
    attrs = dict(kernel=(2, 3), stride=(1, 2), padding=(1, 1))
    y_shape = get("max_pool2d").infer(x, **attrs).shape
    return x, attrs, y_shape


def _max_pool(rng, dtype):
    x, attrs, _ = _pool_case(rng, dtype)
    return [x], attrs


def _max_pool_select(rng, dtype):
    x, attrs, _ = _pool_case(rng, dtype)
    return [_values(rng, x.shape, dtype), x], attrs


def _max_pool_scatter(rng, dtype):
    x, attrs, y_shape = _pool_case(rng, dtype)
    return [rng.standard_normal(y_shape).astype(dtype), x], attrs


def _conv_attrs():
    return dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)


def _conv(rng, dtype):
    x, w, _ = _arrays((2, 4, 7, 8), (6, 2, 3, 2), _conv_attrs(), dtype, int(rng.integers(99)))
    return [x, w], _conv_attrs()


def _conv_grad_input(rng, dtype):
    x, w, g = _arrays((2, 4, 7, 8), (6, 2, 3, 2), _conv_attrs(), dtype, int(rng.integers(99)))
    return [g, w], dict(_conv_attrs(), x_shape=x.shape)


def _conv_grad_weight(rng, dtype):
    x, w, g = _arrays((2, 4, 7, 8), (6, 2, 3, 2), _conv_attrs(), dtype, int(rng.integers(99)))
    return [x, g], dict(_conv_attrs(), w_shape=w.shape)


CASES = {
    **{name: _unary for name in ("neg", "exp", "log", "sqrt", "tanh", "sin", "cos", "abs",
                                 "sign")},
    **{name: _binary for name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow")},
    "relu_grad": _relu_grad,
    "max_pool2d": _max_pool, "max_pool2d_select": _max_pool_select,
    "max_pool2d_scatter": _max_pool_scatter,
    "conv2d": _conv, "conv2d_grad_input": _conv_grad_input,
    "conv2d_grad_weight": _conv_grad_weight,
    "embedding_bag": eager_bag_case,
}
TOLERANCE = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def _flagged(flag):
    return sorted(name for name, op in REGISTRY.items()
                  if any(getattr(k, flag) for k in op.impls.get("cpu", ())))


def test_every_flagged_kernel_has_a_case_here():
    """A kernel that claims ``exact`` or ``eager`` must be held to it below."""
    missing = sorted(set(_flagged("exact") + _flagged("eager")) - set(CASES))
    assert not missing, f"no case for the flagged kernels of {missing}"
    assert {"conv2d", "conv2d_grad_input", "conv2d_grad_weight", "max_pool2d",
            "relu_grad"} <= set(_flagged("eager"))


def _run(kernel, op, arrays, attrs):
    out = np.full(op.infer(*arrays, **attrs).shape, 7.0, arrays[0].dtype)
    kernel.out_fn(out, *arrays, **attrs)
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_name", sorted(set(_flagged("exact"))))
def test_exact_kernels_are_bit_identical_to_compute(op_name, dtype):
    op = get(op_name)
    for seed in range(4):
        arrays, attrs = CASES[op_name](np.random.default_rng(seed), dtype)
        with np.errstate(all="ignore"):
            want = np.asarray(op.compute(*arrays, **attrs))
            for k in _kernels(op_name, "exact"):
                if k.accepts(arrays, op.infer(*arrays, **attrs), attrs) is None:
                    _same_bits(_run(k, op, arrays, attrs), want, f"{k.name} seed {seed}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("op_name", sorted(set(_flagged("eager"))))
def test_eager_kernels_agree_with_compute_and_eager_mode_runs_them(op_name, dtype):
    """Every eager kernel is exact or within the summing tolerance, and ``run_kernel`` (what
    ``ml.ops`` on Tensors and the interpreter call) returns the first accepting one's
    result, bit for bit."""
    op = get(op_name)
    for seed in range(4):
        arrays, attrs = CASES[op_name](np.random.default_rng(seed), dtype)
        if op_name.startswith("conv"):  # finite inputs: the sums' order is what differs
            arrays = [np.nan_to_num(a) for a in arrays]
        with np.errstate(all="ignore"):
            want = np.asarray(op.compute(*arrays, **attrs))
            eager = [k for k in op.eager_impls
                     if k.accepts(arrays, op.infer(*arrays, **attrs), attrs) is None]
            assert eager, f"{op_name}: no eager kernel accepts {dtype.__name__} inputs"
            got = _run(eager[0], op, arrays, attrs)
            if eager[0].exact:
                _same_bits(got, want, eager[0].name)
            else:
                np.testing.assert_allclose(got, want, **TOLERANCE[dtype], err_msg=eager[0].name)
            _same_bits(dispatch.run_kernel(op, arrays, attrs), got, "run_kernel")


@SETTINGS
@given(conv_cases(), st.sampled_from([np.float32, np.float64]))
def test_eager_conv2d_and_its_gradients_match_the_reference(case, dtype):
    """Eager ``ops.conv2d`` (now the img2col GEMM) and its tape gradients against the op's
    numpy reference on random shapes, strides, paddings, dilations and groups."""
    x_shape, w_shape, attrs = case
    x, w, g = _arrays(x_shape, w_shape, attrs, dtype)
    tx, tw = ml.tensor(x, requires_grad=True), ml.tensor(w, requires_grad=True)
    y = ops.conv2d(tx, tw, stride=attrs["stride"], padding=attrs["padding"],
                   dilation=attrs.get("dilation", 1), groups=attrs.get("groups", 1))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(y.numpy(), get("conv2d").compute(x, w, **attrs), **tol)
    (y * ml.tensor(g)).sum().backward()
    np.testing.assert_allclose(tw.grad.numpy(), get("conv2d_grad_weight").compute(
        x, g, w_shape=w.shape, **attrs), **tol)
    np.testing.assert_allclose(tx.grad.numpy(), get("conv2d_grad_input").compute(
        g, w, x_shape=x.shape, **attrs), **tol)


@SETTINGS
@given(pool_cases())
def test_eager_max_pooling_is_exactly_the_reference(case):
    x, attrs = case
    op = get("max_pool2d")
    with np.errstate(all="ignore"):
        got = ops.max_pool2d(ml.tensor(x), attrs["kernel"], attrs["stride"], attrs["padding"])
        _same_bits(got.numpy(), op.compute(x, **attrs), "max_pool2d")


def test_eager_uses_only_kernels_flagged_eager():
    """A kernel registered without ``eager`` is left to compiled graphs; one with it runs in
    eager mode, and ``register_impl`` keeps ``Op.eager_impls`` up to date."""
    double = ml.custom_op("eager_probe_double", compute=lambda x: x * 2,
                          infer=lambda x: get("neg").infer(x), replace=True)
    x = np.arange(4.0)

    def marks(out, x):
        out[...] = -1.0

    try:
        register_impl("eager_probe_double", "cpu", marks, name="probe.compiled_only")
        np.testing.assert_array_equal(double(ml.tensor(x)).numpy(), x * 2)
        assert double.op.eager_impls == ()
        register_impl("eager_probe_double", "cpu", marks, name="probe.eager", eager=True)
        assert [k.name for k in double.op.eager_impls] == ["probe.eager"]
        np.testing.assert_array_equal(double(ml.tensor(x)).numpy(), -np.ones(4))
    finally:
        del REGISTRY["eager_probe_double"]


def test_fused_elementwise_kernels_stay_out_of_eager_mode():
    """The generated fused loops round within 1 ulp of the reference, so they are never
    eager; Winograd changes the arithmetic, so it is not either."""
    assert get("fused_elementwise").eager_impls == ()
    assert not any("winograd" in k.name for k in get("conv2d").eager_impls)
