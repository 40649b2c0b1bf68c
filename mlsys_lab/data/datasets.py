"""Small real and synthetic data for the data chapter (no downloads).

``load_digits`` reads scikit-learn's bundled 8x8 digits. ``synthetic_images`` draws labelled
colour images (a class-dependent shape over a smooth background, plus noise) and encodes them as
PNG or JPEG, so a pipeline's workers do real decoding work; ``write_image_records`` puts them
into record files.
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError
from .records import RecordWriter, write_sharded
from .transforms import encode_jpeg, encode_png

__all__ = ["load_digits", "synthetic_images", "synthetic_image_arrays", "write_image_records"]

NUM_CLASSES = 10
_FORMATS = {"png": encode_png, "jpeg": encode_jpeg}


def load_digits(flat: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1797 handwritten digits as float32 in [0, 1] and int64 labels.

    Args:
        flat: ``(1797, 64)`` rows if true, else ``(1797, 8, 8)`` images.
    """
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = (bunch.images / 16.0).astype(np.float32)
    return (images.reshape(len(images), -1) if flat else images), bunch.target.astype(np.int64)


def _check_positive(fn: str, name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ArgumentError(f"{fn}: {name} must be a positive int, got {value!r}")
    return int(value)


def _draw_image(size: int, label: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size] / max(size - 1, 1)
    base = rng.uniform(40, 200, 3)
    tilt = rng.uniform(-60, 60, 3)
    image = base + tilt * (yy[..., None] * 0.7 + xx[..., None] * 0.3)
    cy, cx = rng.uniform(0.3, 0.7, 2)
    radius = 0.15 + 0.02 * label
    if label % 2 == 0:
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 < radius ** 2
    else:
        mask = (np.abs(yy - cy) < radius) & (np.abs(xx - cx) < radius * (1 + label / 10))
    image[mask] = np.array([25 * label, 255 - 20 * label, 128], float)
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def synthetic_image_arrays(n: int, size: int = 32, seed: int = 0):
    """``n`` labelled uint8 HWC images (the pixels ``synthetic_images`` encodes) and labels."""
    n = _check_positive("synthetic_image_arrays", "n", n)
    size = _check_positive("synthetic_image_arrays", "size", size)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, n).astype(np.int64)
    images = np.stack([_draw_image(size, int(label), rng) for label in labels])
    return images, labels


def synthetic_images(n: int, size: int = 32, seed: int = 0, fmt: str = "png"):
    """``n`` deterministic labelled colour images encoded as PNG or JPEG bytes.

    Returns:
        ``(encoded, labels)``: a list of ``bytes`` and an int64 array of labels in 0..9.
    """
    if fmt not in _FORMATS:
        raise ArgumentError(f"synthetic_images: fmt must be one of {sorted(_FORMATS)}, "
                            f"got {fmt!r}")
    images, labels = synthetic_image_arrays(n, size, seed)
    return [_FORMATS[fmt](image) for image in images], labels


def write_image_records(path_or_prefix, n: int, size: int = 32, seed: int = 0,
                        fmt: str = "png", num_shards: int | None = None) -> list[str]:
    """Write ``synthetic_images(n, size, seed, fmt)`` as records ``{"image": bytes, "label": int}``.

    Args:
        path_or_prefix: The file (``num_shards`` None) or the shard-file prefix.
        num_shards: Split round-robin into this many files (see ``records.write_sharded``).

    Returns:
        The paths written.
    """
    encoded, labels = synthetic_images(n, size, seed, fmt)
    records = ({"image": data, "label": int(label)} for data, label in zip(encoded, labels))
    meta = {"images": n, "size": size, "format": fmt, "seed": seed}
    if num_shards is None:
        with RecordWriter(path_or_prefix, meta) as writer:
            for record in records:
                writer.write(record)
        return [str(path_or_prefix)]
    return write_sharded(records, path_or_prefix, num_shards, meta)
