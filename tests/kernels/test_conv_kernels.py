"""Convolution algorithms (book ch. 10): direct, img2col + GEMM and Winograd agree with a
straightforward float64 reference, in both layouts."""

import numpy as np
import pytest

from mlsys_lab.errors import ShapeError
from mlsys_lab.kernels import conv


def reference_conv(x, w, stride, padding, dilation=(1, 1), groups=1):
    """Seven nested loops in float64: NCHW input, OIHW weight (C / groups channels per output
    channel), taps spaced by the dilation."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for b in range(n):
        for oc in range(o):
            c0 = oc // (o // groups) * cg  # the first input channel of oc's group
            for p in range(oh):
                for q in range(ow):
                    win = xp[b, c0:c0 + cg, p * sh:p * sh + dh * (kh - 1) + 1:dh,
                             q * sw:q * sw + dw * (kw - 1) + 1:dw]
                    y[b, oc, p, q] = np.sum(win * w[oc])
    return y


def to_layout(x, w, y, layout):
    """NCHW/OIHW/NCHW arrays → the given layout's (input, weight, output)."""
    if layout == "NCHW":
        return x, w, y
    return x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0), y.transpose(0, 2, 3, 1)


CASES = [  # (N, C, H, W), (O, KH, KW), stride, padding
    ((1, 1, 5, 5), (1, 3, 3), 1, 0),
    ((2, 3, 7, 6), (4, 3, 3), 1, 1),
    ((2, 3, 9, 8), (5, 3, 2), 2, 0),
    ((1, 2, 8, 11), (3, 1, 1), 1, 0),
    ((2, 4, 10, 7), (2, 5, 3), (2, 1), (2, 1)),
    ((1, 3, 6, 6), (2, 3, 3), 3, 2),
]


@pytest.mark.parametrize("layout", conv.LAYOUTS)
@pytest.mark.parametrize("xs, ws, stride, padding", CASES)
@pytest.mark.parametrize("algorithm", [conv.conv2d_direct, conv.conv2d_img2col])
def test_direct_and_img2col_match_reference(algorithm, xs, ws, stride, padding, layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(xs)
    w = rng.standard_normal((ws[0], xs[1], ws[1], ws[2]))
    expected = reference_conv(x, w, conv._pair(stride, "s"), conv._pair(padding, "p"))
    xl, wl, yl = to_layout(x, w, expected, layout)
    got = algorithm(xl, wl, stride=stride, padding=padding, layout=layout)
    assert got.shape == yl.shape
    np.testing.assert_allclose(got, yl, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", conv.LAYOUTS)
@pytest.mark.parametrize("xs, o, padding", [
    ((1, 1, 4, 4), 1, 0),    # exactly one tile
    ((2, 3, 7, 9), 4, 0),    # odd output sizes 5×7
    ((2, 3, 8, 5), 2, 1),    # 8×5 output
    ((1, 2, 3, 3), 3, 0),    # 1×1 output
    ((1, 4, 6, 7), 2, (2, 1)),
])
def test_winograd_matches_reference(xs, o, padding, layout):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(xs)
    w = rng.standard_normal((o, xs[1], 3, 3))
    expected = reference_conv(x, w, (1, 1), conv._pair(padding, "p"))
    xl, wl, yl = to_layout(x, w, expected, layout)
    got = conv.conv2d_winograd(xl, wl, padding=padding, layout=layout)
    assert got.shape == yl.shape
    np.testing.assert_allclose(got, yl, rtol=1e-10, atol=1e-10)


def test_float32_stays_float32():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    expected = reference_conv(x, w, (1, 1), (1, 1))
    for algorithm in (conv.conv2d_direct, conv.conv2d_img2col, conv.conv2d_winograd):
        got = algorithm(x, w, padding=1)
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)


def test_img2col_shapes_and_order():
    x = np.arange(2 * 3 * 4 * 5, dtype=np.float64).reshape(2, 3, 4, 5)
    cols = conv.img2col(x, 2, 3, stride=1, padding=0)
    assert cols.shape == (2, 3 * 2 * 3, 3 * 3)
    # column 0 is the top-left receptive field, rows ordered (c, i, j)
    np.testing.assert_array_equal(cols[0, :, 0], x[0, :, 0:2, 0:3].ravel())
    rows = conv.img2col(x.transpose(0, 2, 3, 1), 2, 3, layout="NHWC")
    assert rows.shape == (2, 9, 2 * 3 * 3)
    np.testing.assert_array_equal(rows[0, 0], x[0, :, 0:2, 0:3].transpose(1, 2, 0).ravel())


def test_winograd_f23_one_dimension():
    rng = np.random.default_rng(3)
    d, g = rng.standard_normal(4), rng.standard_normal(3)
    np.testing.assert_allclose(conv.winograd_f23(d, g), [d[:3] @ g, d[1:] @ g], atol=1e-12)


def test_book_at_is_wrong_and_ours_is_right():
    errors = conv.book_at_error()
    assert errors["book"] > 0.1
    assert errors["ours"] < 1e-12


def test_multiply_counts():
    assert conv.multiply_counts() == {
        "direct F(2x2,3x3)": 36, "winograd F(2x2,3x3)": 16,
        "direct F(2,3)": 6, "winograd F(2,3)": 4,
    }


def test_errors():
    x, w = np.zeros((1, 3, 5, 5)), np.zeros((2, 4, 3, 3))
    with pytest.raises(ShapeError, match="channels"):
        conv.conv2d_direct(x, w)
    with pytest.raises(ShapeError, match="3x3"):
        conv.conv2d_winograd(np.zeros((1, 3, 5, 5)), np.zeros((2, 3, 5, 5)))
    with pytest.raises(ShapeError, match="does not fit"):
        conv.conv2d_img2col(np.zeros((1, 3, 2, 2)), np.zeros((2, 3, 3, 3)))
    with pytest.raises(ValueError, match="layout"):
        conv.conv2d_direct(np.zeros((1, 3, 5, 5)), np.zeros((2, 3, 3, 3)), layout="CHWN")
    with pytest.raises(ShapeError):
        conv.winograd_f23(np.zeros(3), np.zeros(3))


@pytest.mark.parametrize("stride,padding", [(1, 0), (1, 1), (2, 1)])
def test_algorithms_match_the_framework_conv2d_op(stride, padding):
    """Every algorithm agrees with ml.ops.conv2d, in NCHW and (transposed) NHWC."""
    import mlsys_lab as ml
    from mlsys_lab.kernels import conv

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 7, 6))
    w = rng.standard_normal((4, 3, 3, 3))
    want = ml.ops.conv2d(ml.tensor(x), ml.tensor(w), stride=stride, padding=padding).numpy()
    algos = [conv.conv2d_direct, conv.conv2d_img2col]
    if stride == 1:
        algos.append(lambda x, w, stride, padding, layout: conv.conv2d_winograd(
            x, w, padding=padding, layout=layout))
    for algo in algos:
        np.testing.assert_allclose(algo(x, w, stride=stride, padding=padding, layout="NCHW"),
                                   want, rtol=1e-10, atol=1e-10)
        nhwc = algo(x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0), stride=stride,
                    padding=padding, layout="NHWC")
        np.testing.assert_allclose(nhwc.transpose(0, 3, 1, 2), want, rtol=1e-10, atol=1e-10)


# --- the conv2d / pooling kernels that operator selection chooses --------------------------------
# The op's numpy reference (``Op.compute``) is checked against the loops above, its gradients
# against the adjoint identities, and every cpu kernel against the reference, on random shapes,
# strides, paddings, dilations and groups.
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import mlsys_lab as ml  # noqa: E402
from mlsys_lab import nn, ops  # noqa: E402
from mlsys_lab.engine.registry import AVal, get  # noqa: E402
from mlsys_lab.kernels import conv_gemm, pooling, winograd  # noqa: E402

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@st.composite
def conv_cases(draw, max_groups=3):
    """(x shape, w shape, attrs): random but valid, the kernel's span fitting the padded input."""
    groups = draw(st.integers(1, max_groups))
    cg, og = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    span = [d * (kk - 1) + 1 for d, kk in zip(dilation, k)]
    hw = [draw(st.integers(max(1, s - 2 * p), max(1, s - 2 * p) + 5))
          for s, p in zip(span, padding)]
    x_shape = (draw(st.integers(0, 2)), groups * cg, *hw)
    w_shape = (groups * og, cg, *k)
    return x_shape, w_shape, ops_nn_attrs(stride, padding, dilation, groups)


def ops_nn_attrs(stride, padding, dilation, groups):
    from mlsys_lab.engine.ops_nn import conv_attrs

    return conv_attrs("conv2d", stride, padding, dilation, groups)


def _geometry(attrs):
    return (attrs["stride"], attrs["padding"], attrs.get("dilation", (1, 1)),
            attrs.get("groups", 1))


def _arrays(x_shape, w_shape, attrs, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    y_shape = get("conv2d").infer(x, w, **attrs).shape
    return x, w, rng.standard_normal(y_shape).astype(dtype)


def _run(impl, out_shape, dtype, *arrays, **attrs):
    out = np.full(out_shape, np.nan, dtype)  # a kernel must write every element
    impl.out_fn(out, *arrays, **attrs)
    return out


def _tolerance(dtype):
    return dict(rtol=1e-10, atol=1e-10) if dtype == np.float64 else dict(rtol=2e-4, atol=2e-4)


@SETTINGS
@given(conv_cases())
def test_the_reference_conv2d_matches_the_loops(case):
    x_shape, w_shape, attrs = case
    x, w, _ = _arrays(x_shape, w_shape, attrs)
    np.testing.assert_allclose(get("conv2d").compute(x, w, **attrs),
                               reference_conv(x, w, *_geometry(attrs)), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(conv_cases())
def test_the_reference_gradients_are_the_adjoints(case):
    """<conv(x, w), g> = <x, grad_input(g, w)> = <w, grad_weight(x, g)>: the two gradient ops
    are the transposes of the convolution in each argument."""
    x_shape, w_shape, attrs = case
    x, w, g = _arrays(x_shape, w_shape, attrs, seed=1)
    y = get("conv2d").compute(x, w, **attrs)
    gx = get("conv2d_grad_input").compute(g, w, x_shape=x_shape, **attrs)
    gw = get("conv2d_grad_weight").compute(x, g, w_shape=w_shape, **attrs)
    assert gx.shape == x_shape and gw.shape == w_shape
    inner = np.sum(y * g)
    np.testing.assert_allclose(np.sum(x * gx), inner, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(np.sum(w * gw), inner, rtol=1e-10, atol=1e-10)


def _check_cpu_kernels(x_shape, w_shape, attrs, dtype):
    """Every cpu kernel of conv2d and its gradients that accepts the case matches the op's
    reference; returns the names of those that ran."""
    x, w, g = _arrays(x_shape, w_shape, attrs, dtype, seed=2)
    jobs = [("conv2d", (x, w), {}, g.shape),
            ("conv2d_grad_input", (g, w), {"x_shape": x_shape}, x_shape),
            ("conv2d_grad_weight", (x, g), {"w_shape": w_shape}, w_shape)]
    ran = []
    for op_name, arrays, extra, out_shape in jobs:
        op, full = get(op_name), {**attrs, **extra}
        want = op.compute(*arrays, **full)
        for kernel in op.impls["cpu"]:
            if kernel.accepts(arrays, AVal(out_shape, np.dtype(dtype)), full) is None:
                got = _run(kernel, out_shape, dtype, *arrays, **full)
                np.testing.assert_allclose(got, want, **_tolerance(dtype),
                                           err_msg=f"{op_name} {kernel.name} {full}")
                ran.append(kernel.name)
    return ran


@SETTINGS
@given(conv_cases())
def test_every_cpu_conv_kernel_matches_the_reference(case):
    ran = _check_cpu_kernels(*case, np.float64)
    assert len(ran) >= 3  # img2col takes every float32/float64 convolution


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv_cases())
def test_every_cpu_conv_kernel_matches_the_reference_in_float32(case):
    _check_cpu_kernels(*case, np.float32)


@SETTINGS
@given(st.integers(0, 2), st.integers(1, 5), st.integers(1, 5), st.integers(1, 9),
       st.integers(1, 9), st.integers(0, 2), st.integers(0, 2))
def test_winograd_matches_the_reference_wherever_it_applies(n, c, o, h, w, ph, pw):
    """F(2x2, 3x3) for every stride-1 3x3 convolution (selection only picks it where it wins,
    at 32 channels and more, but it is correct at any size), forward and input gradient, with
    the bias and ReLU of fused_conv."""
    if h + 2 * ph < 3 or w + 2 * pw < 3:
        return
    attrs = dict(stride=(1, 1), padding=(ph, pw))
    x, wt, g = _arrays((n, c, h, w), (o, c, 3, 3), attrs, seed=3)
    assert winograd.applies(wt.shape, attrs) is None
    y = _run(get("conv2d").impls["cpu"][0], g.shape, np.float64, x, wt, **attrs)
    np.testing.assert_allclose(y, get("conv2d").compute(x, wt, **attrs), rtol=1e-10, atol=1e-10)
    b = np.random.default_rng(4).standard_normal((1, o, 1, 1))
    fused = np.empty_like(y)
    winograd.fused_conv_winograd_out(fused, x, wt, b, activation="relu", **attrs)
    np.testing.assert_allclose(fused, np.maximum(y + b, 0), rtol=1e-10, atol=1e-10)
    gx = np.empty(x.shape)
    winograd.conv2d_grad_input_winograd_out(gx, g, wt, x.shape, **attrs)
    np.testing.assert_allclose(gx, get("conv2d_grad_input").compute(g, wt, x_shape=x.shape,
                                                                    **attrs),
                               rtol=1e-10, atol=1e-10)


def test_winograd_is_chosen_where_it_wins_and_img2col_elsewhere():
    attrs = dict(stride=(1, 1), padding=(1, 1))
    f32 = np.dtype(np.float32)

    def chosen(op_name, avals, out):
        return [k.name for k in get(op_name).impls["cpu"]
                if k.accepts(avals, out, attrs) is None][0]
    wide = [AVal((2, 32, 8, 8), f32), AVal((32, 32, 3, 3), f32)]
    thin = [AVal((2, 3, 8, 8), f32), AVal((16, 3, 3, 3), f32)]
    assert chosen("conv2d", wide, AVal((2, 32, 8, 8), f32)).startswith("numba.winograd")
    assert chosen("conv2d", thin, AVal((2, 16, 8, 8), f32)).startswith("numba.img2col")
    grads = [AVal((2, 32, 8, 8), f32), AVal((32, 32, 3, 3), f32)]
    assert chosen("conv2d_grad_input", grads, AVal((2, 32, 8, 8), f32)).startswith(
        "numba.winograd")
    strided = dict(attrs, stride=(2, 2))
    assert winograd.winograd_accepts(wide, AVal((2, 32, 4, 4), f32), strided) is not None
    assert winograd.winograd_accepts(wide, AVal((2, 32, 8, 8), f32), dict(attrs, groups=2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernels_read_strided_inputs_and_write_strided_outputs(dtype):
    """Views in other layouts (a transposed input, an output inside a larger buffer) as the
    compiled executor may hand them over."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 7, 6, 2)).astype(dtype).transpose(3, 0, 1, 2)[:, :, :, ::-1]
    w = rng.standard_normal((4, 3, 3, 2)).astype(dtype)
    attrs = dict(stride=(2, 1), padding=(1, 1), dilation=(1, 2))
    want = get("conv2d").compute(np.ascontiguousarray(x), w, **attrs)
    big = np.zeros((want.shape[0], want.shape[1] + 2) + want.shape[2:], dtype)
    conv_gemm.conv2d_gemm_out(big[:, 1:-1], x, w, **attrs)
    np.testing.assert_allclose(big[:, 1:-1], want, **_tolerance(dtype))
    assert not big[:, 0].any() and not big[:, -1].any()
    g = rng.standard_normal(want.shape).astype(dtype)
    gw = np.zeros((4, 3, 3, 4), dtype)[..., 1:3]  # a strided weight-gradient buffer
    conv_gemm.conv2d_grad_weight_gemm_out(gw, x, g.transpose(0, 1, 3, 2).swapaxes(2, 3), w.shape,
                                          **attrs)
    np.testing.assert_allclose(gw, get("conv2d_grad_weight").compute(
        np.ascontiguousarray(x), g, w_shape=w.shape, **attrs), **_tolerance(dtype))


def test_non_finite_values_stay_where_the_reference_puts_them():
    """At stride 1 the kernels compute over the padded grid, whose extra columns hold pixels
    from the next row: an inf there must not leak into a gradient as 0 * inf = NaN."""
    rng = np.random.default_rng(9)
    x, w = rng.standard_normal((2, 2, 5, 6)), rng.standard_normal((3, 2, 3, 3))
    x[0, 1, 2, 0], w[1, 0, 2, 2] = np.inf, np.nan  # a first-column pixel; one tap
    attrs = dict(stride=(1, 1), padding=(1, 1))
    g = rng.standard_normal(get("conv2d").infer(x, w, **attrs).shape)
    cases = [(conv_gemm.conv2d_grad_weight_gemm_out, (x, g), "conv2d_grad_weight",
              {"w_shape": w.shape}, w.shape),
             (conv_gemm.conv2d_grad_input_gemm_out, (g, w), "conv2d_grad_input",
              {"x_shape": x.shape}, x.shape),
             (conv_gemm.conv2d_gemm_out, (x, w), "conv2d", {}, g.shape)]
    with np.errstate(invalid="ignore"):
        for fn, arrays, op_name, extra, shape in cases:
            got = np.empty(shape)
            fn(got, *arrays, **attrs, **extra)
            want = get(op_name).compute(*arrays, **attrs, **extra)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=op_name)
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10, err_msg=op_name)


def test_fused_conv_kernels_add_the_bias_and_apply_relu():
    rng = np.random.default_rng(6)
    for c, o in ((3, 4), (32, 32)):  # img2col, then Winograd
        x = rng.standard_normal((2, c, 6, 5)).astype(np.float32)
        w = rng.standard_normal((o, c, 3, 3)).astype(np.float32)
        b = rng.standard_normal((1, o, 1, 1)).astype(np.float32)
        attrs = dict(stride=(1, 1), padding=(1, 1), activation="relu")
        op = get("fused_conv")
        out_aval = AVal((2, o, 6, 5), np.dtype(np.float32))
        kernel = [k for k in op.impls["cpu"] if k.accepts([x, w, b], out_aval, attrs) is None][0]
        assert kernel.name.startswith("numba.winograd" if c == 32 else "numba.img2col")
        got = _run(kernel, out_aval.shape, np.float32, x, w, b, **attrs)
        np.testing.assert_allclose(got, op.compute(x, w, b, **attrs), rtol=2e-4, atol=2e-4)
        assert (got >= 0).all()
    full_bias = [x, w, np.zeros((1, o, 6, 5), np.float32)]
    assert "per output channel" in conv_gemm.per_channel_bias(full_bias, out_aval, attrs)


# --- pooling ----------------------------------------------------------------------------------
@st.composite
def pool_cases(draw):
    """(x, attrs): windows up to 3x3, padding at most half of each side, values drawn from a few
    levels (ties) with NaN and -inf sprinkled in."""
    k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    hw = [draw(st.integers(max(1, kk - 2 * p), max(1, kk - 2 * p) + 5))
          for kk, p in zip(k, padding)]
    shape = (draw(st.integers(0, 2)), draw(st.integers(1, 3)), *hw)
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    x = rng.choice([-1.0, 0.0, 0.5, 2.0], shape)
    specials = draw(st.sampled_from(["none", "nan", "-inf"]))
    if specials != "none" and x.size:
        x[rng.random(shape) < 0.2] = np.nan if specials == "nan" else -np.inf
    return x, dict(kernel=k, stride=stride, padding=padding)


def _pool_check(op_name, out_shape, arrays, attrs, exact):
    op = get(op_name)
    with np.errstate(all="ignore"):
        want = op.compute(*arrays, **attrs)
    (kernel,) = [k for k in op.impls["cpu"] if k.name.startswith("numba.")]
    assert kernel.accepts(arrays, AVal(out_shape, arrays[0].dtype), attrs) is None
    got = _run(kernel, out_shape, arrays[0].dtype, *arrays, **attrs)
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=f"{op_name} {attrs}")
    else:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"{op_name}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool_cases())
def test_pooling_kernels_match_the_references(case):
    """Max pooling picks the first maximum (or first NaN) exactly as the reference does, in the
    forward pass, its gradient (scatter) and its JVP (select); average pooling counts the padding
    in the mean."""
    x, attrs = case
    y_shape = get("max_pool2d").infer(x, **attrs).shape
    rng = np.random.default_rng(7)
    g, u = rng.standard_normal(y_shape), rng.standard_normal(x.shape)
    _pool_check("max_pool2d", y_shape, [x], attrs, exact=True)
    _pool_check("max_pool2d_scatter", x.shape, [g, x], attrs, exact=False)
    _pool_check("max_pool2d_select", y_shape, [u, x], attrs, exact=True)
    finite = np.nan_to_num(x, nan=1.5, neginf=-3.0)
    _pool_check("avg_pool2d", y_shape, [finite], attrs, exact=False)
    _pool_check("avg_pool2d_grad", x.shape, [g], dict(attrs, x_shape=x.shape), exact=False)


def test_max_pool_gradient_goes_to_the_first_maximum_only():
    x = np.array([[[[1.0, 3.0, 3.0], [3.0, 0.0, np.nan], [-np.inf, -np.inf, 2.0]]]])
    g = np.ones((1, 1, 2, 2))
    out = np.empty_like(x)
    pooling.max_pool2d_scatter_out(out, g, x, (2, 2), (1, 1), (0, 0))
    # windows: {1,3,3,0} -> (0,1); {3,3,0,nan} -> nan at (1,2); {3,0,-inf,-inf} -> (1,0);
    # {0,nan,-inf,2} -> nan at (1,2)
    np.testing.assert_array_equal(out, [[[[0, 1, 0], [1, 0, 2], [0, 0, 0]]]])
    pad = np.full((1, 1, 1, 1), -np.inf)  # a window of padding and -inf: its first position
    pooling.max_pool2d_scatter_out(out := np.empty_like(pad), np.ones((1, 1, 1, 2)), pad,
                                   (1, 2), (1, 1), (0, 1))
    np.testing.assert_array_equal(out, [[[[1.0]]]])  # the window (pad, -inf) drops its share


# --- selection, the training step and errors ----------------------------------------------------
def small_cnn(seed=0):
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, rng=seed), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 4, 3, padding=1, rng=seed + 1), nn.ReLU(),
                         nn.AvgPool2d(2), nn.Flatten(), nn.Linear(4 * 2 * 2, 3, rng=seed + 2))


def test_the_compiled_cnn_training_step_runs_the_kernels_and_matches_eager():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 3, 4)
    eager = small_cnn()
    step = ml.compile_train_step(small_cnn(), ops.cross_entropy, x, y, lr=0.1)
    names = {n.op: n.meta["kernel_name"] for n in step.compiled.graph.nodes}
    assert names["fused_conv"].startswith("numba.img2col")
    for op_name in ("conv2d_grad_input", "conv2d_grad_weight", "max_pool2d",
                    "max_pool2d_scatter", "avg_pool2d", "avg_pool2d_grad"):
        assert names[op_name].startswith("numba."), (op_name, names[op_name])
    opt = ml.optim.SGD(eager.parameters(), lr=0.1)
    for _ in range(3):
        loss = ops.cross_entropy(eager(ml.tensor(x)), ml.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert abs(step(x, y) - loss.item()) < 1e-4
    for (name, p), q in zip(eager.named_parameters(), step.model.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("call, words", [
    (lambda x, w: ops.conv2d(x, w, groups=3), ["conv2d", "4 channels", "per group", "3 groups"]),
    (lambda x, w: ops.conv2d(x, w, dilation=0), ["conv2d", "dilation must be positive"]),
    (lambda x, w: ops.conv2d(x, w, groups=0), ["conv2d", "groups must be positive"]),
    (lambda x, w: ops.conv2d(x, w, dilation=4), ["conv2d", "dilation (4, 4)", "spans (9, 9)"]),
    (lambda x, w: ops.conv2d(x, w, groups=1.5), ["conv2d", "groups"]),
])
def test_dilation_and_groups_errors_name_the_op_and_the_values(call, words):
    x, w = ml.tensor(np.zeros((1, 4, 6, 6))), ml.tensor(np.zeros((2, 4, 3, 3)))
    with pytest.raises(ml.MLSysError) as info:
        call(x, w)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_output_channels_must_split_into_the_groups():
    with pytest.raises(ml.ShapeError, match="3 output channels do not split into 2 groups"):
        ops.conv2d(ml.tensor(np.zeros((1, 4, 5, 5))), ml.tensor(np.zeros((3, 2, 3, 3))), groups=2)


def test_default_dilation_and_groups_leave_the_graph_as_it_was():
    g = ml.trace(lambda x, w: ops.conv2d(x, w, padding=1), np.zeros((1, 2, 4, 4)),
                 np.zeros((3, 2, 3, 3)))
    (node,) = [n for n in g.nodes if n.op == "conv2d"]
    assert node.attrs == {"stride": (1, 1), "padding": (1, 1)}
    g = ml.trace(lambda x, w: ops.conv2d(x, w, dilation=2, groups=2), np.zeros((1, 2, 6, 6)),
                 np.zeros((4, 1, 3, 3)))
    (node,) = [n for n in g.nodes if n.op == "conv2d"]
    assert node.attrs == {"stride": (1, 1), "padding": (0, 0), "dilation": (2, 2), "groups": 2}


# --- the one im2col (mlsys_lab/engine/im2col.py) and every caller of it ----------------------
def naive_windows(x, kernel, stride, padding, dilation, pad_value):
    """(N, C, OH, OW, kh, kw) by four loops: entry [n, c, p, q, i, j] is the padded input's
    pixel (p·sh + i·dh, q·sw + j·dw), the pad value outside the input."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    n, c, h, w = x.shape
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.empty((n, c, oh, ow, kh, kw), x.dtype)
    for p in range(oh):
        for q in range(ow):
            for i in range(kh):
                for j in range(kw):
                    r, s = p * sh + i * dh - ph, q * sw + j * dw - pw
                    inside = 0 <= r < h and 0 <= s < w
                    out[:, :, p, q, i, j] = x[:, :, r, s] if inside else pad_value
    return out


def random_geometry(rng):
    """A random (N, C, H, W), kernel, stride, padding and dilation whose kernel fits."""
    kernel, stride = tuple(rng.integers(1, 4, 2)), tuple(rng.integers(1, 4, 2))
    padding, dilation = tuple(rng.integers(0, 3, 2)), tuple(rng.integers(1, 3, 2))
    span = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    hw = [int(rng.integers(max(1, s - 2 * p), s + 6)) for s, p in zip(span, padding)]
    shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), *hw)
    return shape, kernel, stride, padding, dilation


@pytest.mark.parametrize("seed", range(40))
def test_im2col_matches_a_loop_in_every_layout_and_order(seed):
    from mlsys_lab.engine.im2col import im2col, windows

    rng = np.random.default_rng(seed)
    shape, kernel, stride, padding, dilation = random_geometry(rng)
    dtype = [np.float32, np.float64, np.int8, np.uint8][seed % 4]
    x = rng.integers(-100, 100, shape).astype(dtype) if seed % 4 > 1 else \
        rng.standard_normal(shape).astype(dtype)
    pad = 7
    want = naive_windows(x, kernel, stride, padding, dilation, pad)  # (N, C, OH, OW, kh, kw)
    n, c, oh, ow, kh, kw = want.shape
    got = windows(x, kernel, stride, padding, dilation, pad_value=pad)
    np.testing.assert_array_equal(got, want)
    assert not got.flags.writeable
    xh = x.transpose(0, 2, 3, 1)  # the same image, channels last (a strided view)
    np.testing.assert_array_equal(
        windows(xh, kernel, stride, padding, dilation, pad_value=pad, layout="NHWC"),
        want.transpose(0, 2, 3, 1, 4, 5))
    nkp = want.transpose(0, 1, 4, 5, 2, 3).reshape(n, c * kh * kw, oh * ow)  # taps (c, i, j)
    expected = {"NKP": nkp, "NPK": nkp.transpose(0, 2, 1), "KNP": nkp.transpose(1, 0, 2)}
    for order, matrix in expected.items():
        cols, hw = im2col(x, kernel, stride, padding, dilation, pad_value=pad, order=order)
        assert hw == (oh, ow) and cols.dtype == x.dtype and cols.flags.c_contiguous
        np.testing.assert_array_equal(cols, matrix, err_msg=order)
    npk = want.transpose(0, 2, 3, 4, 5, 1).reshape(n, oh * ow, kh * kw * c)  # taps (i, j, c)
    rows, _ = im2col(xh, kernel, stride, padding, dilation, pad_value=pad, layout="NHWC")
    np.testing.assert_array_equal(rows, npk)


@pytest.mark.parametrize("seed", range(20))
def test_col2im_is_the_transpose_of_im2col(seed):
    """<im2col(x), C> == <x, col2im(C)> for random x and C, and col2im adds every window
    entry onto the pixel it was read from (checked by loops)."""
    from mlsys_lab.engine.im2col import col2im, im2col

    rng = np.random.default_rng(100 + seed)
    shape, kernel, stride, padding, dilation = random_geometry(rng)
    x = rng.standard_normal(shape)
    cols, (oh, ow) = im2col(x, kernel, stride, padding, dilation)
    c = rng.standard_normal(cols.shape)
    gx = col2im(c, shape, kernel, stride, padding, dilation)
    assert gx.shape == shape
    np.testing.assert_allclose(np.sum(cols * c), np.sum(x * gx), rtol=1e-10)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    want = np.zeros(shape)
    c6 = c.reshape(shape[0], shape[1], kh, kw, oh, ow)
    for p in range(oh):
        for q in range(ow):
            for i in range(kh):
                for j in range(kw):
                    r, s = p * sh + i * dh - ph, q * sw + j * dw - pw
                    if 0 <= r < shape[2] and 0 <= s < shape[3]:
                        want[:, :, r, s] += c6[:, :, i, j, p, q]
    np.testing.assert_allclose(gx, want, rtol=1e-12, atol=1e-12)


def test_im2col_refuses_bad_arguments_by_name():
    from mlsys_lab.engine.im2col import col2im, im2col, windows
    from mlsys_lab.errors import ArgumentError

    x = np.zeros((1, 2, 4, 4))
    with pytest.raises(ShapeError, match=r"im2col: kernel \(5, 5\) .* larger"):
        im2col(x, 5)
    with pytest.raises(ShapeError, match=r"im2col: needs a 4-D NCHW input, got shape \(4, 4\)"):
        windows(x[0, 0], 3)
    with pytest.raises(ArgumentError, match="im2col: stride must be an int >= 1"):
        windows(x, 3, stride=0)
    with pytest.raises(ArgumentError, match="im2col: layout must be one of"):
        windows(x, 3, layout="NWHC")
    with pytest.raises(ArgumentError, match="im2col: order must be one of"):
        im2col(x, 3, order="PKN")
    with pytest.raises(ShapeError, match=r"col2im: .* needs columns \(1, 18, 4\)"):
        col2im(np.zeros((1, 18, 5)), x.shape, 3)


def test_every_numpy_window_in_the_library_is_the_one_im2col():
    """No module but engine/im2col.py builds windows itself (as_strided, sliding_window_view
    or an im2col of its own): the four copies this replaced must not come back."""
    import pathlib
    import re

    root = pathlib.Path(conv.__file__).resolve().parents[1]
    pattern = re.compile(r"as_strided|sliding_window_view|def _?(im2col|img2col|unfold)\b")
    allowed = {"engine/im2col.py",
               "engine/ops_shape.py",  # as_strided of one zero: a broadcast probe, no windows
               "kernels/conv.py"}  # img2col: the teaching name, a call of the one im2col
    found = {str(p.relative_to(root)) for p in root.rglob("*.py")
             if pattern.search(p.read_text(encoding="utf-8"))}
    assert found <= allowed, sorted(found - allowed)


@pytest.mark.parametrize("seed", range(6))
def test_the_im2col_callers_agree_with_the_loop_convolution(seed):
    """The callers of the one im2col on dilated, strided, padded and grouped cases: the
    reference ``conv2d`` and its input gradient, the compiled GEMM kernels (strided path), the
    channels-last op and the teaching kernel, against the seven loops."""
    from mlsys_lab.engine import ops_nn
    from mlsys_lab.engine.passes import layout_ops
    from mlsys_lab.kernels import conv_gemm

    rng = np.random.default_rng(200 + seed)
    shape, kernel, stride, padding, dilation = random_geometry(rng)
    stride = (stride[0], 2)  # the GEMM kernels' strided path
    groups = shape[1] if seed % 2 else 1
    x = rng.standard_normal(shape)
    w = rng.standard_normal((2 * groups, shape[1] // groups, *kernel))
    want = reference_conv(x, w, stride, padding, dilation, groups)
    np.testing.assert_allclose(ops_nn._conv_np(x, w, stride, padding, dilation, groups), want,
                               rtol=1e-10, atol=1e-10)
    out = np.empty(want.shape)
    conv_gemm.conv2d_gemm_out(out, x, w, stride, padding, dilation, groups)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)
    g = rng.standard_normal(want.shape)  # <conv(x), g> == <x, conv_grad_input(g)>
    gx = ops_nn._conv_grad_input_np(g, w, shape, stride, padding, dilation, groups)
    np.testing.assert_allclose(np.sum(want * g), np.sum(x * gx), rtol=1e-9)
    if groups == 1 and dilation == (1, 1):
        xh, wh = x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)
        np.testing.assert_allclose(layout_ops._conv_nhwc(xh, wh, stride, padding),
                                   want.transpose(0, 2, 3, 1), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(conv.conv2d_img2col(x, w, stride, padding), want,
                                   rtol=1e-10, atol=1e-10)
