"""Dataset abstractions with PyTorch's semantics.

A *map-style* dataset answers ``len(ds)`` and ``ds[i]`` for ``0 <= i < len(ds)``; the loader's
sampler decides the order. An *iterable-style* dataset (:class:`IterableDataset`) is a stream:
it decides the order itself and may not know its length. A map-style dataset may also define
``__getitems__(indices)`` to fetch a whole batch at once (the loader then calls it instead of
``__getitem__`` once per index).
"""

import bisect
import math

import numpy as np

from ...errors import ArgumentError, ShapeError


class Dataset:
    """Base class of map-style datasets: subclasses define ``__getitem__`` and ``__len__``.

    Any object with those two methods works with :class:`~mlsys_lab.data.DataLoader`; this
    class only adds ``ds1 + ds2`` (a :class:`ConcatDataset`).
    """

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __add__(self, other):
        return ConcatDataset([self, other])


class IterableDataset(Dataset):
    """Base class of iterable-style datasets (streams): subclasses define ``__iter__``.

    With ``num_workers > 0`` every worker process gets its own copy of the dataset and calls
    ``iter()`` on it, so a dataset that ignores the workers yields each item once *per worker*.
    To split the stream, read :func:`~mlsys_lab.data.get_worker_info` inside ``__iter__``::

        def __iter__(self):
            info = get_worker_info()
            start, step = (0, 1) if info is None else (info.id, info.num_workers)
            yield from self.items[start::step]
    """

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")

    def __getitem__(self, index):
        raise TypeError(f"{type(self).__name__} is an IterableDataset: iterate it, do not index it")

    def __add__(self, other):
        return ChainDataset([self, other])


class TensorDataset(Dataset):
    """Samples ``(a[i], b[i], ...)`` from arrays (or ml Tensors) that share their first dimension.

    Args:
        *arrays: numpy arrays, ml Tensors or anything ``np.asarray`` accepts.

    Raises:
        ShapeError: no arrays, a 0-d array, or first dimensions that differ.
    """

    def __init__(self, *arrays):
        if not arrays:
            raise ShapeError("TensorDataset: needs at least one array")
        self.arrays = tuple(np.asarray(a) for a in arrays)
        for k, a in enumerate(self.arrays):
            if a.ndim == 0:
                raise ShapeError(f"TensorDataset: array {k} is 0-d; each array needs a first "
                                 f"(sample) dimension")
        lengths = [len(a) for a in self.arrays]
        if len(set(lengths)) != 1:
            shapes = ", ".join(str(a.shape) for a in self.arrays)
            raise ShapeError(f"TensorDataset: arrays must share their first dimension, got shapes "
                             f"{shapes}")

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)

    def __getitems__(self, indices):
        rows = np.asarray(indices, dtype=np.int64)
        return [tuple(cols) for cols in zip(*(a[rows] for a in self.arrays))]

    def __len__(self):
        return len(self.arrays[0])


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices``, in that order (``Subset(ds, idx)[k]`` is
    ``ds[idx[k]]``)."""

    def __init__(self, dataset, indices):
        self.dataset = dataset
        self.indices = [int(i) for i in indices]

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]

    def __getitems__(self, indices):
        inner = [self.indices[i] for i in indices]
        if hasattr(self.dataset, "__getitems__"):
            return self.dataset.__getitems__(inner)
        return [self.dataset[i] for i in inner]

    def __len__(self):
        return len(self.indices)


class ConcatDataset(Dataset):
    """Map-style datasets one after another: index ``i`` runs through the first, then the second.

    Raises:
        ArgumentError: no datasets, or an :class:`IterableDataset` among them (use
            :class:`ChainDataset`).
    """

    def __init__(self, datasets):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ArgumentError("ConcatDataset: needs at least one dataset")
        for k, d in enumerate(self.datasets):
            if isinstance(d, IterableDataset):
                raise ArgumentError(f"ConcatDataset: dataset {k} is an IterableDataset, which has "
                                    f"no indices; use ChainDataset for streams")
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets]).tolist()

    def __len__(self):
        return self.cumulative_sizes[-1]

    def __getitem__(self, index):
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"ConcatDataset: index {index} is out of range for length {n}")
        if index < 0:
            index += n
        which = bisect.bisect_right(self.cumulative_sizes, index)
        start = self.cumulative_sizes[which - 1] if which else 0
        return self.datasets[which][index - start]


class ChainDataset(IterableDataset):
    """Iterable datasets one after another (each worker chains its own copies)."""

    def __init__(self, datasets):
        self.datasets = list(datasets)

    def __iter__(self):
        for d in self.datasets:
            yield from d

    def __len__(self):
        return sum(len(d) for d in self.datasets)


def random_split(dataset, lengths, seed=None):
    """Split a map-style dataset into non-overlapping :class:`Subset`\\ s of the given lengths.

    Args:
        dataset: a map-style dataset.
        lengths: integer lengths summing to ``len(dataset)``, or fractions summing to 1 (the
            remainder after flooring is handed out one by one from the first split, as PyTorch).
        seed: seeds the permutation; None draws from numpy's global generator.

    Raises:
        ArgumentError: lengths that are negative or do not add up.
    """
    n = len(dataset)
    lengths = list(lengths)
    if lengths and all(isinstance(x, float) for x in lengths) and math.isclose(sum(lengths), 1):
        counts = [int(math.floor(n * f)) for f in lengths]
        for k in range(n - sum(counts)):
            counts[k % len(counts)] += 1
        lengths = counts
    if any(not isinstance(x, (int, np.integer)) or x < 0 for x in lengths) or sum(lengths) != n:
        raise ArgumentError(f"random_split: lengths {lengths} must be non-negative integers "
                            f"summing to the dataset's length {n} (or fractions summing to 1)")
    seed = np.random.randint(0, 2**63 - 1, dtype=np.int64) if seed is None else seed
    order = np.random.default_rng(int(seed)).permutation(n).tolist()
    bounds = np.cumsum([0, *lengths]).tolist()
    return [Subset(dataset, order[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
