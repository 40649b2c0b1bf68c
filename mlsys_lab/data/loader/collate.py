"""Collation: a list of samples -> one batch (PyTorch's ``default_collate``, on numpy arrays).

A sample is a nest of dicts, tuples and lists whose leaves are numpy arrays, ml Tensors,
numbers or strings. :func:`default_collate` keeps the nest and stacks each leaf across the
samples: arrays and Tensors become one numpy array with a new first (batch) axis, Python numbers
become an int64 / float64 / bool / complex128 array, numpy scalars keep their dtype, strings and
bytes stay a list. As in PyTorch, a tuple of fields comes back as a list of batched fields.
"""

import collections.abc
import numbers

import numpy as np

from ...engine.tensor import Tensor
from ...errors import DTypeError, ShapeError

# Inside a DataLoader worker: (shape, dtype) -> an output array in shared memory, or None.
_output_allocator = None


def set_output_allocator(allocate):
    """Let :func:`default_collate` stack large fields into arrays made by ``allocate(shape,
    dtype)`` (which may return None); None restores plain ``np.stack``. Returns the old one."""
    global _output_allocator
    old, _output_allocator = _output_allocator, allocate
    return old


def default_collate(batch):
    """Stack a list of samples into one batch, keeping the samples' nesting.

    Args:
        batch: a non-empty list of samples that share one structure.

    Returns:
        The batch: dicts of batched fields for dict samples, a list of batched fields for
        tuple/list samples, numpy arrays at the leaves.

    Raises:
        ShapeError: leaves disagree in shape, a dict misses a key, or sequences differ in length;
            the message names the path (``['image'][0]``) and the samples involved.
        DTypeError: a leaf of a type that cannot be batched (None, an object array, ...), or
            samples whose leaves differ in type.
    """
    batch = list(batch)
    if not batch:
        raise ShapeError("default_collate: got an empty batch")
    return _collate(batch, "")


def default_convert(sample):
    """The sample with every ml Tensor replaced by its numpy array (used without batching)."""
    if isinstance(sample, Tensor):
        return sample.numpy()
    if isinstance(sample, collections.abc.Mapping):
        return _rebuild_mapping(sample, {k: default_convert(v) for k, v in sample.items()})
    if isinstance(sample, tuple) and hasattr(sample, "_fields"):
        return type(sample)(*(default_convert(v) for v in sample))
    if isinstance(sample, (list, tuple)):
        return type(sample)(default_convert(v) for v in sample)
    return sample


def _where(path):
    return f" at {path}" if path else ""


def _collate(batch, path):
    elem = batch[0]
    if isinstance(elem, (np.ndarray, Tensor)):
        return _stack_arrays(batch, path)
    if isinstance(elem, np.generic):
        _check_same_kind(batch, path, np.generic)
        return np.array(batch)
    if isinstance(elem, (str, bytes)):
        return batch
    if isinstance(elem, numbers.Number):
        _check_same_kind(batch, path, numbers.Number)
        return _stack_numbers(batch, path)
    if isinstance(elem, collections.abc.Mapping):
        return _collate_mapping(batch, path)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):  # namedtuple: keep its type
        fields = _transpose(batch, path)
        return type(elem)(*(_collate(f, f"{path}.{name}") for f, name in zip(fields, elem._fields)))
    if isinstance(elem, collections.abc.Sequence):
        fields = _transpose(batch, path)
        return [_collate(f, f"{path}[{k}]") for k, f in enumerate(fields)]
    raise DTypeError(f"default_collate: sample 0{_where(path)} is a {type(elem).__name__}; a batch "
                     f"must hold numpy arrays, ml Tensors, numbers, strings, dicts, lists or "
                     f"tuples (pass collate_fn for other types)")


def _check_same_kind(batch, path, kind):
    for k, item in enumerate(batch):
        if not isinstance(item, kind) or isinstance(item, (np.ndarray, Tensor)):
            raise DTypeError(f"default_collate: sample {k}{_where(path)} is a "
                             f"{type(item).__name__} but sample 0 is a {type(batch[0]).__name__}")


def _stack_arrays(batch, path):
    arrays = []
    for k, item in enumerate(batch):
        if isinstance(item, Tensor):
            item = item.numpy()
        if not isinstance(item, np.ndarray):
            raise DTypeError(f"default_collate: sample {k}{_where(path)} is a "
                             f"{type(item).__name__} but sample 0 is an array")
        if item.dtype == object:
            raise DTypeError(f"default_collate: sample {k}{_where(path)} is an object array, "
                             f"which cannot be batched (pass collate_fn)")
        arrays.append(item)
    shape = arrays[0].shape
    for k, a in enumerate(arrays):
        if a.shape != shape:
            raise ShapeError(f"default_collate: samples differ in shape{_where(path)}: sample 0 "
                             f"has {shape}, sample {k} has {a.shape} (resize them, or pass a "
                             f"collate_fn that pads)")
    if _output_allocator is not None:
        out = _output_allocator((len(arrays), *shape), np.result_type(*arrays))
        if out is not None:
            return np.stack(arrays, out=out)
    return np.stack(arrays)


def _stack_numbers(batch, path):
    """Python numbers -> the narrowest of bool, int64, float64, complex128 that holds them all."""
    if all(isinstance(x, (bool, np.bool_)) for x in batch):
        dtype = np.bool_
    elif all(isinstance(x, numbers.Integral) for x in batch):
        dtype = np.int64
    elif all(isinstance(x, numbers.Real) for x in batch):
        dtype = np.float64
    else:
        dtype = np.complex128
    try:
        return np.array(batch, dtype=dtype)
    except (TypeError, OverflowError) as e:
        raise DTypeError(f"default_collate: numbers{_where(path)} do not fit "
                         f"{np.dtype(dtype)}: {e}") from None


def _collate_mapping(batch, path):
    keys = list(batch[0].keys())
    for k, item in enumerate(batch):
        if not isinstance(item, collections.abc.Mapping):
            raise DTypeError(f"default_collate: sample {k}{_where(path)} is a "
                             f"{type(item).__name__} but sample 0 is a dict")
        if set(item.keys()) != set(keys):
            raise ShapeError(f"default_collate: samples differ in keys{_where(path)}: sample 0 has "
                             f"{sorted(map(str, keys))}, sample {k} has "
                             f"{sorted(map(str, item.keys()))}")
    fields = {key: _collate([item[key] for item in batch], f"{path}[{key!r}]") for key in keys}
    return _rebuild_mapping(batch[0], fields)


def _rebuild_mapping(like, fields):
    try:
        return type(like)(fields)
    except TypeError:  # a Mapping type that cannot be built from a dict
        return fields


def _transpose(batch, path):
    length = len(batch[0])
    for k, item in enumerate(batch):
        if not isinstance(item, collections.abc.Sequence) or isinstance(item, (str, bytes)):
            raise DTypeError(f"default_collate: sample {k}{_where(path)} is a "
                             f"{type(item).__name__} but sample 0 is a {type(batch[0]).__name__}")
        if len(item) != length:
            raise ShapeError(f"default_collate: samples differ in length{_where(path)}: sample 0 "
                             f"has {length} fields, sample {k} has {len(item)}")
    return [list(field) for field in zip(*batch)]
