"""Image operators against independent oracles (float64 numpy, Pillow, scipy, np.rot90), their
batched forms against the per-item forms, and the chapter's data sources."""

import numpy as np
import pytest
import scipy.ndimage as ndimage
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from mlsys_lab.data import datasets
from mlsys_lab.data import transforms as T
from mlsys_lab.data.item_rng import ItemRngs, item_rng
from mlsys_lab.data.records import RecordFile
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError

RNG = np.random.default_rng(0)


def image(h, w, c=3, dtype=np.uint8, seed=0):
    values = np.random.default_rng(seed).integers(0, 256, (h, w, c))
    return values.astype(dtype)


def bilinear_reference(src, out_h, out_w):
    """Half-pixel-centre bilinear resize with edge clamping, written with float64 gathers."""
    src = src.astype(np.float64)
    in_h, in_w = src.shape[:2]
    y = np.clip((np.arange(out_h) + 0.5) * in_h / out_h - 0.5, 0, in_h - 1)
    x = np.clip((np.arange(out_w) + 0.5) * in_w / out_w - 0.5, 0, in_w - 1)
    y0, x0 = np.floor(y).astype(int), np.floor(x).astype(int)
    y1, x1 = np.minimum(y0 + 1, in_h - 1), np.minimum(x0 + 1, in_w - 1)
    wy, wx = (y - y0)[:, None, None], (x - x0)[None, :, None]
    top = src[y0][:, x0] * (1 - wx) + src[y0][:, x1] * wx
    bottom = src[y1][:, x0] * (1 - wx) + src[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


# -- decode ---------------------------------------------------------------------------------------

def test_png_round_trip_is_exact_and_jpeg_is_close():
    pixels = image(12, 9)
    assert np.array_equal(T.decode_png(T.encode_png(pixels)), pixels)
    smooth = np.repeat(np.linspace(0, 255, 16).astype(np.uint8)[None, :, None], 16, 0)
    smooth = np.repeat(smooth, 3, 2)
    decoded = T.decode_jpeg(T.encode_jpeg(smooth, quality=95))
    assert decoded.shape == (16, 16, 3) and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - smooth).mean() < 3
    gray = T.decode_image(T.encode_png(pixels[:, :, 0]), mode="L")
    assert gray.shape == (12, 9, 1) and np.array_equal(gray[:, :, 0], pixels[:, :, 0])


def test_decode_rejects_wrong_format_and_garbage():
    png = T.encode_png(image(4, 4))
    with pytest.raises(ArgumentError, match="JPEG signature"):
        T.decode_jpeg(png)
    with pytest.raises(ArgumentError, match="PNG signature"):
        T.decode_png(T.encode_jpeg(image(4, 4)))
    with pytest.raises(ArgumentError, match="cannot decode"):
        T.decode_png(png[:20])
    with pytest.raises(DTypeError, match="bytes"):
        T.decode_png(np.zeros(4))


def test_decode_batch_equals_stacked_decodes_and_refuses_mixed_sizes():
    items = [T.encode_png(image(5, 6, seed=s)) for s in range(3)]
    assert np.array_equal(T.decode_batch(items), np.stack([T.decode_png(b) for b in items]))
    assert np.array_equal(T.Decode().batched(items), T.decode_batch(items))
    with pytest.raises(ShapeError, match="differ in shape"):
        T.decode_batch(items + [T.encode_png(image(4, 4))])


# -- resize ---------------------------------------------------------------------------------------

@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 9), st.integers(1, 12), st.integers(1, 12),
       st.integers(1, 3))
def test_resize_matches_float64_reference(in_h, in_w, out_h, out_w, channels):
    src = RNG.standard_normal((in_h, in_w, channels))
    out = T.resize(src, (out_h, out_w))
    assert out.shape == (out_h, out_w, channels) and out.dtype == np.float64
    np.testing.assert_allclose(out, bilinear_reference(src, out_h, out_w), rtol=0, atol=1e-12)


def test_resize_uint8_matches_pillow_when_enlarging_and_keeps_identity():
    src = image(10, 13)
    ours = T.resize(src, (23, 31))
    pillow = np.asarray(Image.fromarray(src).resize((31, 23), Image.BILINEAR))
    assert ours.dtype == np.uint8 and np.abs(ours.astype(int) - pillow).max() <= 1
    assert np.array_equal(T.resize(src, (10, 13)), src)
    rounded = np.floor(bilinear_reference(src, 7, 5) + 0.5).astype(np.uint8)
    assert np.abs(T.resize(src, (7, 5)).astype(int) - rounded).max() <= 1


def test_resize_batch_equals_per_item_and_checks_arguments():
    batch = np.stack([image(9, 7, seed=s) for s in range(4)])
    assert np.array_equal(T.resize_batch(batch, 5), np.stack([T.resize(b, 5) for b in batch]))
    assert np.array_equal(T.Resize(5).batched(batch), T.resize_batch(batch, (5, 5)))
    with pytest.raises(ShapeError, match="HWC"):
        T.resize(batch, 5)
    with pytest.raises(ArgumentError, match="size"):
        T.resize(batch[0], 0)
    with pytest.raises(DTypeError, match="int16"):
        T.resize(batch[0].astype(np.int16), 3)


# -- rotation -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.float64])
def test_rotation_by_zero_is_identity_and_by_quarter_turns_is_rot90(dtype):
    square = image(8, 8, dtype=dtype)
    assert np.array_equal(T.rotate(square, 0), square)
    for k in (1, 2, 3, -1):
        assert np.array_equal(T.rotate(square, 90 * k), np.rot90(square, k)), k
    odd = image(7, 7, dtype=dtype)
    assert np.array_equal(T.rotate(odd, 90), np.rot90(odd))
    assert np.array_equal(T.random_rotation(square, 0, np.random.default_rng(1)), square)


@settings(max_examples=30, deadline=None)
@given(st.floats(-180, 180), st.integers(2, 9), st.integers(2, 9))
def test_rotation_matches_scipy(angle, height, width):
    src = RNG.standard_normal((height, width, 2))
    ours = T.rotate(src, angle)
    theirs = ndimage.rotate(src, angle, axes=(1, 0), reshape=False, order=1,
                            mode="grid-constant", cval=0.0)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)


def test_random_rotation_is_seeded_bounded_and_batched_matches():
    batch = np.stack([image(9, 9, seed=s) for s in range(5)])
    rngs = lambda: [np.random.default_rng([7, i]) for i in range(5)]
    per_item = np.stack([T.random_rotation(b, 30, r) for b, r in zip(batch, rngs())])
    assert np.array_equal(T.random_rotation_batch(batch, 30, rngs()), per_item)
    assert np.array_equal(T.RandomRotation(30).batched(batch, rngs()), per_item)
    angles = [r.uniform(-30, 30) for r in rngs()]
    assert np.array_equal(per_item, np.stack([T.rotate(b, a) for b, a in zip(batch, angles)]))
    assert not np.array_equal(per_item[0], batch[0])
    with pytest.raises(ArgumentError, match="max_degrees"):
        T.RandomRotation(200)
    with pytest.raises(ShapeError, match="angles"):
        T.rotate_batch(batch, [1, 2])


# -- normalise, layout ----------------------------------------------------------------------------

def test_normalize_uses_the_books_constants_and_matches_numpy():
    assert T.BOOK_MEAN == (100.0, 115.0, 121.0) and T.BOOK_STD == (71.0, 68.0, 70.0)
    pixels = image(4, 5)
    expected = (pixels - np.array([100, 115, 121.0])) / np.array([71, 68, 70.0])
    out = T.normalize(pixels)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    batch = np.stack([pixels, pixels[::-1]])
    assert np.array_equal(T.Normalize().batched(batch), np.stack([T.normalize(p) for p in batch]))
    np.testing.assert_allclose(T.normalize(pixels[:, :, :1], [3.0], [2.0]),
                               (pixels[:, :, :1] - 3.0) / 2.0, rtol=1e-6)
    with pytest.raises(ShapeError, match="3 channels"):
        T.normalize(pixels, mean=(1.0, 2.0))
    with pytest.raises(ArgumentError, match="positive"):
        T.normalize(pixels, std=(1.0, 0.0, 1.0))


def test_hwc_to_chw():
    pixels = image(4, 5, 3)
    chw = T.hwc_to_chw(pixels)
    assert chw.shape == (3, 4, 5) and chw.flags.c_contiguous
    assert all(np.array_equal(chw[c], pixels[:, :, c]) for c in range(3))
    batch = np.stack([pixels, pixels + 1])
    assert np.array_equal(T.HWCToCHW().batched(batch), np.stack([T.hwc_to_chw(p) for p in batch]))
    with pytest.raises(ShapeError):
        T.hwc_to_chw(np.zeros(3))


# -- datasets -------------------------------------------------------------------------------------

def test_load_digits():
    x, y = datasets.load_digits()
    assert x.shape == (1797, 64) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    assert y.dtype == np.int64 and set(np.unique(y)) == set(range(10))
    images, _ = datasets.load_digits(flat=False)
    assert images.shape == (1797, 8, 8) and np.array_equal(images.reshape(1797, -1), x)


def test_synthetic_images_are_deterministic_labelled_and_decodable():
    encoded, labels = datasets.synthetic_images(12, size=16, seed=3)
    again, labels_again = datasets.synthetic_images(12, size=16, seed=3)
    assert encoded == again and np.array_equal(labels, labels_again)
    assert datasets.synthetic_images(12, size=16, seed=4)[0] != encoded
    pixels, pixel_labels = datasets.synthetic_image_arrays(12, size=16, seed=3)
    assert np.array_equal(labels, pixel_labels) and labels.min() >= 0 and labels.max() <= 9
    assert all(np.array_equal(T.decode_png(e), p) for e, p in zip(encoded, pixels))
    jpegs, _ = datasets.synthetic_images(3, size=16, fmt="jpeg")
    assert all(T.decode_jpeg(j).shape == (16, 16, 3) for j in jpegs)
    with pytest.raises(ArgumentError, match="fmt"):
        datasets.synthetic_images(2, fmt="gif")
    with pytest.raises(ArgumentError, match="n must be"):
        datasets.synthetic_images(0)


def test_write_image_records(tmp_path):
    paths = datasets.write_image_records(tmp_path / "img.rec", 6, size=8, seed=1)
    pixels, labels = datasets.synthetic_image_arrays(6, size=8, seed=1)
    with RecordFile(paths[0]) as rf:
        assert rf.metadata["images"] == 6
        assert [r["label"] for r in rf] == labels.tolist()
        assert all(np.array_equal(T.decode_png(r["image"]), p) for r, p in zip(rf, pixels))
    shards = datasets.write_image_records(tmp_path / "img", 6, size=8, seed=1, num_shards=2)
    assert sum(len(RecordFile(p)) for p in shards) == 6


# -- per-item generators (counter-based, drawn vectorised for a batch) ---------------------------

@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**63 - 1), st.lists(st.integers(0, 50), max_size=2),
       st.integers(0, 2**40), st.integers(0, 70), st.floats(-180, 0), st.floats(0.001, 180))
def test_item_rngs_uniform_is_each_items_own_first_draw(seed, epoch, first, count, low, width):
    rngs = ItemRngs(seed, tuple(epoch), first, count)
    own = np.array([item_rng(seed, tuple(epoch), first + j).uniform(low, low + width)
                    for j in range(count)])  # numpy's own Philox generators: the oracle
    assert np.array_equal(rngs.uniform(low, low + width), own)
    assert np.array_equal([g.uniform(low, low + width) for g in rngs], own)
    assert len(rngs) == count and len(rngs[1:3]) == min(2, max(count - 1, 0))


def test_item_streams_differ_per_item_seed_and_epoch_and_repeat_exactly():
    draws = lambda seed, epoch: ItemRngs(seed, epoch, 0, 200).uniform()
    base = draws(3, (0,))
    assert len(set(base.tolist())) == 200 and 0 <= base.min() and base.max() < 1
    assert np.array_equal(base, draws(3, (0,)))
    assert not np.isin(base, draws(4, (0,))).any() and not np.isin(base, draws(3, (1,))).any()
    # an item's whole stream, not only its first draw, comes from its own counter
    long = item_rng(3, (0,), 5).random(9)
    assert long[0] == base[5] and np.array_equal(long, item_rng(3, (0,), 5).random(9))
    with pytest.raises(IndexError):
        ItemRngs(3, (0,), 0, 2)[2]


def test_random_rotation_batch_with_item_rngs_matches_per_item_generators():
    batch = np.stack([image(9, 9, seed=s) for s in range(6)])
    rngs = ItemRngs(11, (2,), 40, 6)
    per_item = np.stack([T.random_rotation(b, 25, item_rng(11, (2,), 40 + j))
                         for j, b in enumerate(batch)])
    assert np.array_equal(T.random_rotation_batch(batch, 25, rngs), per_item)
    assert np.array_equal(T.RandomRotation(25).batched(batch, list(rngs)), per_item)
