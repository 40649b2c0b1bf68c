"""Image operators for the data pipeline: decode, resize, random rotation, normalise, HWC→CHW.

Each operator has a per-item form (one HWC image) and a batched form (an NHWC batch), so the
map+batch vectorisation pass has something real to use. The arithmetic runs in Numba kernels
compiled with ``nogil=True``: several pipeline threads run them at once on different cores.
Pillow decodes (it releases the GIL while decoding too).

The callable classes (``Decode``, ``Resize``, ``RandomRotation``, ``Normalize``, ``HWCToCHW``)
carry their batched form as ``.batched``; ``Pipeline.map`` picks it up. A per-item form and its
batched form give identical results (they share one kernel).

Conventions: images are HWC (height, width, channels); pixel centres sit at integer
coordinates; resize is plain bilinear with half-pixel centres (OpenCV's ``INTER_LINEAR``,
PyTorch's ``interpolate(align_corners=False)``: no antialiasing when shrinking); rotation is
counter-clockwise about the image centre ``((h-1)/2, (w-1)/2)``, bilinear, zero outside (as
``scipy.ndimage.rotate(reshape=False, order=1, mode="grid-constant")``).
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Sequence

import numba
import numpy as np

from ..engine.numba_cache import CACHE
from ..errors import ArgumentError, DTypeError, ShapeError
from .item_rng import ItemRngs

__all__ = ["BOOK_MEAN", "BOOK_STD", "decode_png", "decode_jpeg", "decode_image", "decode_batch",
           "encode_png", "encode_jpeg", "resize", "resize_batch", "rotate", "rotate_batch",
           "random_rotation", "random_rotation_batch", "normalize", "hwc_to_chw",
           "Decode", "Resize", "RandomRotation", "Normalize", "HWCToCHW"]

#: The chapter's normalisation constants (per RGB channel), as the book gives them.
BOOK_MEAN = (100.0, 115.0, 121.0)
BOOK_STD = (71.0, 68.0, 70.0)

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SIGNATURE = b"\xff\xd8\xff"


# ---------------------------------------------------------------------------------------------
# Decode / encode (Pillow).

def _pil():
    from PIL import Image  # Pillow: a dependency of the data chapter

    return Image


def decode_image(data: bytes, mode: str = "RGB") -> np.ndarray:
    """Decode PNG or JPEG bytes to an HWC uint8 array (``mode`` "RGB" or "L"; "L" gives HW1)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DTypeError(f"decode_image: expected encoded bytes, got {type(data).__name__}")
    if mode not in ("RGB", "L"):
        raise ArgumentError(f"decode_image: mode must be 'RGB' or 'L', got {mode!r}")
    try:
        with _pil().open(io.BytesIO(data)) as img:
            array = np.asarray(img.convert(mode))
    except Exception as exc:  # Pillow raises several types for bad data
        raise ArgumentError(f"decode_image: cannot decode {len(data)} bytes: {exc}") from exc
    return array[:, :, None] if array.ndim == 2 else array


def _check_signature(fn: str, data, signature: bytes, kind: str) -> None:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DTypeError(f"{fn}: expected encoded bytes, got {type(data).__name__}")
    if bytes(data[:len(signature)]) != signature:
        raise ArgumentError(f"{fn}: the data does not start with the {kind} signature "
                            f"(first bytes {bytes(data[:8])!r})")


def decode_png(data: bytes, mode: str = "RGB") -> np.ndarray:
    """Decode PNG bytes to an HWC uint8 array."""
    _check_signature("decode_png", data, _PNG_SIGNATURE, "PNG")
    return decode_image(data, mode)


def decode_jpeg(data: bytes, mode: str = "RGB") -> np.ndarray:
    """Decode JPEG bytes to an HWC uint8 array."""
    _check_signature("decode_jpeg", data, _JPEG_SIGNATURE, "JPEG")
    return decode_image(data, mode)


def decode_batch(items: Sequence[bytes], mode: str = "RGB") -> np.ndarray:
    """Decode a list of equally sized PNG/JPEG images into one NHWC uint8 array.

    Each image is decoded straight into its slot of the batch (no per-image array to stack).
    """
    if len(items) == 0:
        return np.zeros((0, 0, 0, 3 if mode == "RGB" else 1), np.uint8)
    first = decode_image(items[0], mode)
    out = np.empty((len(items), *first.shape), np.uint8)
    out[0] = first
    for n in range(1, len(items)):
        image = decode_image(items[n], mode)
        if image.shape != first.shape:
            raise ShapeError(f"decode_batch: images differ in shape: image 0 is {first.shape}, "
                             f"image {n} is {image.shape}")
        out[n] = image
    return out


def _encode(image: np.ndarray, fmt: str, **options) -> bytes:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise DTypeError(f"encode_{fmt.lower()}: expected a uint8 HW or HWC image, got "
                         f"{image.dtype} with shape {image.shape}")
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    buffer = io.BytesIO()
    _pil().fromarray(image).save(buffer, format=fmt, **options)
    return buffer.getvalue()


def encode_png(image: np.ndarray) -> bytes:
    """Encode a uint8 HW/HWC image as PNG bytes."""
    return _encode(image, "PNG")


def encode_jpeg(image: np.ndarray, quality: int = 90) -> bytes:
    """Encode a uint8 HW/HWC image as JPEG bytes."""
    return _encode(image, "JPEG", quality=quality)


# ---------------------------------------------------------------------------------------------
# Numba kernels (nogil: pipeline threads run them in parallel).

@numba.njit(nogil=True, cache=CACHE)
def _store(out, i, j, c, value, to_uint8):
    if to_uint8:  # value is a convex combination of uint8 values (or less): in [0, 255]
        out[i, j, c] = np.uint8(np.int32(value + 0.5))
    else:
        out[i, j, c] = value


@numba.njit(nogil=True, cache=CACHE)
def _source_coordinates(out_size, in_size):
    """Per output index: the two source indices and the weight of the second (half-pixel
    centres, clamped at the edges)."""
    first = np.empty(out_size, np.int64)
    second = np.empty(out_size, np.int64)
    weight = np.empty(out_size, np.float64)
    scale = in_size / out_size
    for k in range(out_size):
        pos = min(max((k + 0.5) * scale - 0.5, 0.0), in_size - 1.0)
        first[k] = int(pos)
        second[k] = min(first[k] + 1, in_size - 1)
        weight[k] = pos - first[k]
    return first, second, weight


@numba.njit(nogil=True, cache=CACHE)
def _resize_into(src, out, ys0, ys1, wys, xs0, xs1, wxs, to_uint8):
    channels = src.shape[2]
    for i in range(out.shape[0]):
        y0, y1, wy = ys0[i], ys1[i], wys[i]
        for j in range(out.shape[1]):
            x0, x1, wx = xs0[j], xs1[j], wxs[j]
            for c in range(channels):
                top = src[y0, x0, c] * (1.0 - wx) + src[y0, x1, c] * wx
                bottom = src[y1, x0, c] * (1.0 - wx) + src[y1, x1, c] * wx
                _store(out, i, j, c, top * (1.0 - wy) + bottom * wy, to_uint8)


@numba.njit(nogil=True, cache=CACHE)
def _resize_one(src, out, to_uint8):
    ys0, ys1, wys = _source_coordinates(out.shape[0], src.shape[0])
    xs0, xs1, wxs = _source_coordinates(out.shape[1], src.shape[1])
    _resize_into(src, out, ys0, ys1, wys, xs0, xs1, wxs, to_uint8)


@numba.njit(nogil=True, cache=CACHE)
def _resize_many(src, out, to_uint8):
    ys0, ys1, wys = _source_coordinates(out.shape[1], src.shape[1])  # the same for every image
    xs0, xs1, wxs = _source_coordinates(out.shape[2], src.shape[2])
    for n in range(src.shape[0]):
        _resize_into(src[n], out[n], ys0, ys1, wys, xs0, xs1, wxs, to_uint8)


@numba.njit(nogil=True, cache=CACHE)
def _tap(index, size):
    """A neighbour's index clamped into the image, and 1.0 if it was inside (else 0.0)."""
    if 0 <= index < size:
        return index, 1.0
    return min(max(index, 0), size - 1), 0.0


@numba.njit(nogil=True, cache=CACHE)
def _rotation_terms(angle_degrees):
    """``cos`` and ``sin`` of the angle, exact at multiples of 90 degrees (so that a quarter
    turn is a pure permutation)."""
    radians = angle_degrees * (math.pi / 180.0)
    cos_t, sin_t = math.cos(radians), math.sin(radians)
    if abs(cos_t - round(cos_t)) < 1e-12:
        cos_t = float(round(cos_t))
    if abs(sin_t - round(sin_t)) < 1e-12:
        sin_t = float(round(sin_t))
    return cos_t, sin_t


@numba.njit(nogil=True, cache=CACHE)
def _rotate_one(src, out, angle_degrees, to_uint8):
    cos_t, sin_t = _rotation_terms(angle_degrees)
    height, width, channels = src.shape
    cy, cx = (height - 1) / 2.0, (width - 1) / 2.0
    for i in range(height):
        dy = i - cy
        for j in range(width):
            dx = j - cx
            sy = cos_t * dy + sin_t * dx + cy
            sx = cos_t * dx - sin_t * dy + cx
            y0, x0 = math.floor(sy), math.floor(sx)
            if y0 < -1 or y0 >= height or x0 < -1 or x0 >= width:  # no neighbour inside
                for c in range(channels):
                    _store(out, i, j, c, 0.0, to_uint8)
                continue
            wy, wx = sy - y0, sx - x0
            if 0 <= y0 and y0 + 1 < height and 0 <= x0 and x0 + 1 < width:  # all inside
                ya, yb, xa, xb = y0, y0 + 1, x0, x0 + 1
                w00 = (1.0 - wy) * (1.0 - wx)
                w01 = (1.0 - wy) * wx
                w10 = wy * (1.0 - wx)
                w11 = wy * wx
            else:  # on the border: a neighbour outside the image weighs 0
                ya, in_ya = _tap(y0, height)
                yb, in_yb = _tap(y0 + 1, height)
                xa, in_xa = _tap(x0, width)
                xb, in_xb = _tap(x0 + 1, width)
                w00 = (1.0 - wy) * (1.0 - wx) * in_ya * in_xa
                w01 = (1.0 - wy) * wx * in_ya * in_xb
                w10 = wy * (1.0 - wx) * in_yb * in_xa
                w11 = wy * wx * in_yb * in_xb
            for c in range(channels):
                value = (w00 * src[ya, xa, c] + w01 * src[ya, xb, c]) \
                    + (w10 * src[yb, xa, c] + w11 * src[yb, xb, c])
                _store(out, i, j, c, value, to_uint8)


@numba.njit(nogil=True, cache=CACHE)
def _rotate_many(src, out, angles_degrees, to_uint8):
    for n in range(src.shape[0]):
        _rotate_one(src[n], out[n], angles_degrees[n], to_uint8)


@numba.njit(nogil=True, cache=CACHE)
def _normalize_pixels(src, mean, inv_std, out):
    channels = src.shape[1]
    for p in range(src.shape[0]):
        for c in range(channels):
            out[p, c] = (np.float32(src[p, c]) - mean[c]) * inv_std[c]


# ---------------------------------------------------------------------------------------------
# Argument checks.

_KERNEL_DTYPES = (np.uint8, np.float32, np.float64)


def _check_images(fn: str, images, ndim: int) -> np.ndarray:
    images = np.asarray(images)
    layout = "HWC" if ndim == 3 else "NHWC"
    if images.ndim != ndim:
        raise ShapeError(f"{fn}: expected a {layout} array ({ndim}-d), got shape {images.shape}")
    if images.dtype not in _KERNEL_DTYPES:
        raise DTypeError(f"{fn}: expected uint8, float32 or float64 pixels, got {images.dtype}")
    return np.ascontiguousarray(images)


def _check_size(fn: str, size) -> tuple[int, int]:
    pair = (size, size) if isinstance(size, (int, np.integer)) else tuple(size)
    if len(pair) != 2 or not all(isinstance(s, (int, np.integer)) and s > 0 for s in pair):
        raise ArgumentError(f"{fn}: size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


def _check_degrees(fn: str, max_degrees) -> float:
    if not isinstance(max_degrees, (int, float, np.number)) or not 0 <= max_degrees <= 180:
        raise ArgumentError(f"{fn}: max_degrees must be a number in [0, 180], got {max_degrees!r}")
    return float(max_degrees)


# ---------------------------------------------------------------------------------------------
# Operators: per item and batched.

def resize(image: np.ndarray, size) -> np.ndarray:
    """Bilinear resize of one HWC image to ``size`` (int or (height, width)); keeps the dtype."""
    image = _check_images("resize", image, 3)
    out = np.empty(_check_size("resize", size) + image.shape[2:], image.dtype)
    _resize_one(image, out, image.dtype == np.uint8)
    return out


def resize_batch(images: np.ndarray, size) -> np.ndarray:
    """Bilinear resize of an NHWC batch (identical to ``resize`` on each image)."""
    images = _check_images("resize_batch", images, 4)
    shape = (images.shape[0], *_check_size("resize_batch", size), images.shape[3])
    out = np.empty(shape, images.dtype)
    _resize_many(images, out, images.dtype == np.uint8)
    return out


def rotate(image: np.ndarray, angle_degrees: float) -> np.ndarray:
    """Rotate one HWC image counter-clockwise by ``angle_degrees`` (bilinear, zeros outside)."""
    image = _check_images("rotate", image, 3)
    out = np.empty_like(image)
    _rotate_one(image, out, float(angle_degrees), image.dtype == np.uint8)
    return out


def rotate_batch(images: np.ndarray, angles_degrees) -> np.ndarray:
    """Rotate each image of an NHWC batch by its own angle (identical to ``rotate`` per image)."""
    images = _check_images("rotate_batch", images, 4)
    angles = np.asarray(angles_degrees, dtype=np.float64).reshape(-1)
    if angles.shape[0] != images.shape[0]:
        raise ShapeError(f"rotate_batch: {images.shape[0]} images but {angles.shape[0]} angles")
    out = np.empty_like(images)
    _rotate_many(images, out, angles, images.dtype == np.uint8)
    return out


def random_rotation(image: np.ndarray, max_degrees: float, rng: np.random.Generator):
    """Rotate by an angle drawn uniformly from ``[-max_degrees, max_degrees]`` with ``rng``."""
    max_degrees = _check_degrees("random_rotation", max_degrees)
    return rotate(image, rng.uniform(-max_degrees, max_degrees))


def random_rotation_batch(images: np.ndarray, max_degrees: float, rngs) -> np.ndarray:
    """Batched ``random_rotation``: image ``n`` draws its angle from ``rngs[n]``.

    ``rngs`` is a list of generators, or the pipeline's ``ItemRngs``, whose ``uniform`` draws
    every image's angle in one call (the same angles the images' own generators would draw).
    """
    max_degrees = _check_degrees("random_rotation_batch", max_degrees)
    if isinstance(rngs, ItemRngs):
        angles = rngs.uniform(-max_degrees, max_degrees)
    else:
        angles = [rng.uniform(-max_degrees, max_degrees) for rng in rngs]
    return rotate_batch(images, angles)


@functools.lru_cache(maxsize=64)
def _normalize_constants(mean: tuple, std: tuple):
    mean32 = np.asarray(mean, np.float32)
    std32 = np.asarray(std, np.float32)
    if np.any(std32 <= 0):
        raise ArgumentError(f"normalize: std must be positive, got {tuple(std32)}")
    return mean32, (np.float32(1) / std32).astype(np.float32)


def normalize(images: np.ndarray, mean=BOOK_MEAN, std=BOOK_STD) -> np.ndarray:
    """``(x - mean) / std`` per channel (the last axis) as float32; HWC or NHWC alike.

    The defaults are the chapter's constants ``BOOK_MEAN`` = (100, 115, 121) and ``BOOK_STD`` =
    (71, 68, 70).
    """
    images = np.asarray(images)
    if images.ndim < 1 or images.dtype not in _KERNEL_DTYPES:
        raise DTypeError(f"normalize: expected a uint8/float image, got {images.dtype} "
                         f"with shape {images.shape}")
    channels = images.shape[-1]
    as_tuple = lambda v: tuple(float(x) for x in np.asarray(v, np.float64).reshape(-1))
    mean, std = as_tuple(mean), as_tuple(std)
    if len(mean) != channels or len(std) != channels:
        raise ShapeError(f"normalize: {channels} channels but mean has {len(mean)} and std "
                         f"{len(std)} values")
    mean32, inv_std32 = _normalize_constants(mean, std)
    pixels = np.ascontiguousarray(images).reshape(-1, channels)
    out = np.empty(pixels.shape, np.float32)
    _normalize_pixels(pixels, mean32, inv_std32, out)
    return out.reshape(images.shape)


def hwc_to_chw(images: np.ndarray) -> np.ndarray:
    """HWC → CHW (or NHWC → NCHW), as a contiguous copy."""
    images = np.asarray(images)
    if images.ndim not in (3, 4):
        raise ShapeError(f"hwc_to_chw: expected HWC or NHWC, got shape {images.shape}")
    return np.ascontiguousarray(images.transpose((2, 0, 1) if images.ndim == 3 else (0, 3, 1, 2)))


# ---------------------------------------------------------------------------------------------
# Callable operators for Pipeline.map (per-item __call__, batched form as .batched).

class Decode:
    """Decode PNG/JPEG bytes; ``.batched`` decodes a list of bytes into an NHWC array."""

    __name__ = "decode"

    def __init__(self, mode: str = "RGB"):
        self.mode = mode

    def __call__(self, data):
        return decode_image(data, self.mode)

    def batched(self, items):
        return decode_batch(items, self.mode)


class Resize:
    """Bilinear resize to ``size``; ``.batched`` resizes an NHWC batch."""

    __name__ = "resize"

    def __init__(self, size):
        self.size = _check_size("Resize", size)

    def __call__(self, image):
        return resize(image, self.size)

    def batched(self, images):
        return resize_batch(images, self.size)


class RandomRotation:
    """Random rotation in ``[-max_degrees, max_degrees]``; needs a per-item generator.

    Use it with a seed, ``pipe.map(RandomRotation(30), seed=0)``: the pipeline then calls it as
    ``fn(image, rng)`` with ``rng`` derived from ``(seed, item index)``, so results do not depend
    on thread timing or on vectorisation.
    """

    __name__ = "random_rotation"
    needs_rng = True

    def __init__(self, max_degrees: float):
        self.max_degrees = _check_degrees("RandomRotation", max_degrees)

    def __call__(self, image, rng):
        return random_rotation(image, self.max_degrees, rng)

    def batched(self, images, rngs):
        return random_rotation_batch(images, self.max_degrees, rngs)


class Normalize:
    """Per-channel ``(x - mean) / std`` as float32 (defaults: the book's constants)."""

    __name__ = "normalize"

    def __init__(self, mean=BOOK_MEAN, std=BOOK_STD):
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, images):
        return normalize(images, self.mean, self.std)

    batched = __call__


class HWCToCHW:
    """HWC → CHW; ``.batched``: NHWC → NCHW."""

    __name__ = "hwc_to_chw"

    def __call__(self, images):
        return hwc_to_chw(images)

    batched = __call__
