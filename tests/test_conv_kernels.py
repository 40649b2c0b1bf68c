"""Convolution algorithms (book ch. 10): direct, img2col + GEMM and Winograd agree with a
straightforward float64 reference, in both layouts."""

import numpy as np
import pytest

from mlsys_lab.errors import ShapeError
from mlsys_lab.kernels import conv


def reference_conv(x, w, stride, padding):
    """Seven nested loops in float64: NCHW input, OIHW weight."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (sh, sw), (ph, pw) = stride, padding
    n, c, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    y = np.zeros((n, o, oh, ow))
    for b in range(n):
        for oc in range(o):
            for p in range(oh):
                for q in range(ow):
                    y[b, oc, p, q] = np.sum(xp[b, :, p * sh:p * sh + kh, q * sw:q * sw + kw]
                                            * w[oc])
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
