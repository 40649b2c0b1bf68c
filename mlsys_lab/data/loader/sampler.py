"""Samplers: the order in which a map-style dataset's indices are visited (PyTorch's semantics).

Every sampler here can be checkpointed in the middle of an epoch: ``state_dict()`` holds plain
ints (``ml.save`` stores them) and, after ``load_state_dict(state)``, the next ``iter()`` yields
exactly the indices that epoch had not yet yielded, in the same order. A state taken at the end
of an epoch resumes with the next epoch.

``iter(sampler)`` begins the epoch at once (it draws the epoch's order before returning the
iterator), so ``state_dict()`` called right after ``iter()`` already describes that epoch.
"""

import math
import os

import numpy as np

from ...errors import ArgumentError

_MAX_SEED = 2**63 - 1
_CHUNK = 4096  # indices converted to Python ints at a time


def check_seed(fn, seed):
    """``seed`` as an int in [0, 2**63), or None; ArgumentError naming ``fn`` otherwise."""
    if seed is None:
        return None
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) \
            or not 0 <= seed <= _MAX_SEED:
        raise ArgumentError(f"{fn}: seed must be an int in [0, 2**63), got {seed!r}")
    return int(seed)


def check_positive_int(fn, name, value):
    """``value`` as an int >= 1; ArgumentError naming ``fn`` and ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < 1:
        raise ArgumentError(f"{fn}: {name} should be a positive integer, got {value!r}")
    return int(value)


def _check_bool(fn, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{fn}: {name} should be a bool, got {value!r}")
    return bool(value)


def derive_seed(*words):
    """A 63-bit seed mixed from non-negative ints with numpy's SeedSequence."""
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1])) & _MAX_SEED


def fresh_seed():
    """A 63-bit seed drawn from numpy's global generator (so ``np.random.seed`` makes it
    reproducible, as ``torch.manual_seed`` does for PyTorch's loader)."""
    return int(np.random.randint(0, _MAX_SEED, dtype=np.int64))


class Sampler:
    """Base class of samplers: ``iter(sampler)`` yields dataset indices, ``len(sampler)`` counts
    them. A subclass that defines its own ``__iter__`` is replayed, not restored, when a loader
    resumes (it must then yield the same order again)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class _OrderSampler(Sampler):
    """A sampler whose epoch is an int64 array drawn when the epoch begins; resumable.

    Subclasses implement ``_epoch_order()`` and ``_epoch_length()``, may draw per-epoch
    randomness in ``_new_epoch()``, and extend ``state_dict`` with what the order depends on.
    """

    def __init__(self):
        self._order = None      # the current epoch's indices
        self._position = 0      # how many of them this epoch has yielded
        self._resume_at = None  # position to restart at, set by load_state_dict

    def __iter__(self):
        order, start = self._begin_epoch()
        return self._yield(order, start)

    def _begin_epoch(self):
        """Draw (or, after load_state_dict, restore) the epoch's order; return it and the
        position to start at."""
        resume = self._resume_at
        self._resume_at = None
        if resume is None or not self._resumes(resume):
            self._new_epoch()
            resume = 0
        self._order = self._epoch_order()
        self._position = min(resume, len(self._order))
        return self._order, self._position

    def _resumes(self, position):
        """Whether a loaded state at ``position`` continues its epoch (it has indices left)."""
        return self._has_begun() and position < self._epoch_length()

    def _has_begun(self):
        return True

    def _new_epoch(self):
        """Move to the next epoch (draw its seed); the default has nothing to draw."""

    def _yield(self, order, start):
        for chunk in range(start, len(order), _CHUNK):
            for index in order[chunk:chunk + _CHUNK].tolist():
                self._position += 1
                yield index

    def _take(self, count):
        """The next ``count`` indices of the begun epoch as a list (for BatchSampler)."""
        piece = self._order[self._position:self._position + count].tolist()
        self._position += len(piece)
        return piece

    def state_dict(self):
        """``{"position": indices yielded this epoch}`` plus what the order depends on."""
        position = self._position if self._resume_at is None else self._resume_at
        return {"position": int(position)}

    def load_state_dict(self, state):
        """Make the next ``iter()`` continue the epoch described by ``state``.

        Raises:
            ArgumentError: ``state`` lacks a key this sampler needs or has a negative position.
        """
        position = _read_int(self, state, "position")
        if position < 0:
            raise ArgumentError(f"{type(self).__name__}.load_state_dict: position must be >= 0, "
                                f"got {position}")
        self._resume_at = position

    def _epoch_order(self):
        raise NotImplementedError

    def _epoch_length(self):
        raise NotImplementedError


def _read_int(sampler, state, key):
    try:
        return int(state[key])
    except (KeyError, TypeError, ValueError):
        raise ArgumentError(f"{type(sampler).__name__}.load_state_dict: state needs an integer "
                            f"{key!r}, got {state!r}") from None


class SequentialSampler(_OrderSampler):
    """Indices ``0, 1, ..., len(data_source) - 1``."""

    def __init__(self, data_source):
        super().__init__()
        self.data_source = data_source

    def _epoch_order(self):
        return np.arange(len(self.data_source), dtype=np.int64)

    def _epoch_length(self):
        return len(self.data_source)

    def __len__(self):
        return len(self.data_source)


class RandomSampler(_OrderSampler):
    """A random order of the dataset's indices, drawn anew each epoch.

    Args:
        data_source: the dataset (only its length is used).
        replacement: draw ``num_samples`` indices independently (with repeats).
        num_samples: indices per epoch (default ``len(data_source)``); without replacement and
            larger than the dataset, whole permutations are concatenated, as PyTorch.
        seed: epoch ``k`` (counting from 0) uses a seed mixed from ``(seed, k)``, so the whole
            sequence of epochs is reproducible; None draws each epoch's seed from numpy's global
            generator.

    Raises:
        ArgumentError: ``num_samples`` not a positive int, ``replacement`` not a bool, a bad seed.
    """

    def __init__(self, data_source, replacement=False, num_samples=None, seed=None):
        super().__init__()
        self.data_source = data_source
        self.replacement = _check_bool("RandomSampler", "replacement", replacement)
        self._num_samples = None if num_samples is None else \
            check_positive_int("RandomSampler", "num_samples", num_samples)
        self.seed = check_seed("RandomSampler", seed)
        self._epochs_begun = 0
        self._epoch_seed = 0

    @property
    def num_samples(self):
        return len(self.data_source) if self._num_samples is None else self._num_samples

    def __len__(self):
        return self.num_samples

    def _has_begun(self):
        return self._epochs_begun > 0

    def _new_epoch(self):
        self._epoch_seed = fresh_seed() if self.seed is None else \
            derive_seed(self.seed, self._epochs_begun)
        self._epochs_begun += 1

    def _epoch_length(self):
        return self.num_samples if len(self.data_source) else 0

    def _epoch_order(self):
        n, count = len(self.data_source), self.num_samples
        rng = np.random.default_rng(self._epoch_seed)
        if n == 0:
            return np.zeros(0, np.int64)
        if self.replacement:
            return rng.integers(0, n, size=count, dtype=np.int64)
        rounds = [rng.permutation(n) for _ in range(math.ceil(count / n))]
        return np.concatenate(rounds)[:count].astype(np.int64, copy=False)

    def state_dict(self):
        """``{"position", "epochs_begun", "epoch_seed", "seed"}``: ints (seed -1 for None)."""
        return {**super().state_dict(), "epochs_begun": self._epochs_begun,
                "epoch_seed": self._epoch_seed, "seed": -1 if self.seed is None else self.seed}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self._epochs_begun = _read_int(self, state, "epochs_begun")
        self._epoch_seed = _read_int(self, state, "epoch_seed")
        seed = _read_int(self, state, "seed")
        self.seed = None if seed < 0 else seed


class SubsetRandomSampler(_OrderSampler):
    """The given indices in a random order each epoch (seeded like :class:`RandomSampler`)."""

    def __init__(self, indices, seed=None):
        super().__init__()
        self.indices = np.asarray(list(indices), dtype=np.int64)
        self._inner = RandomSampler(self.indices, seed=seed)

    def __len__(self):
        return len(self.indices)

    def _has_begun(self):
        return self._inner._has_begun()

    def _new_epoch(self):
        self._inner._new_epoch()

    def _epoch_order(self):
        return self.indices[self._inner._epoch_order()]

    def _epoch_length(self):
        return len(self.indices)

    def state_dict(self):
        return {**self._inner.state_dict(), **super().state_dict()}

    def load_state_dict(self, state):
        self._inner.load_state_dict(state)
        super().load_state_dict(state)


class DistributedSampler(_OrderSampler):
    """The share of the dataset that one of ``num_replicas`` processes visits, as PyTorch's.

    Every rank draws the same permutation (from ``seed`` and the epoch set by
    :meth:`set_epoch`), makes its length a multiple of ``num_replicas`` -- padding by repeating
    indices from its start when ``drop_last`` is False, cutting the tail when True -- and takes
    every ``num_replicas``-th index starting at ``rank``. So all ranks get the same number of
    samples: ``ceil(n / num_replicas)`` (padded) or ``floor(n / num_replicas)`` (drop_last).

    Args:
        dataset: the dataset (only its length is used).
        num_replicas: number of processes; None reads ``WORLD_SIZE`` (torchrun),
            ``PMI_SIZE`` (MPICH's mpiexec) or ``OMPI_COMM_WORLD_SIZE`` (Open MPI).
        rank: this process's rank in ``[0, num_replicas)``; None reads ``RANK``, ``PMI_RANK``
            or ``OMPI_COMM_WORLD_RANK``.
        shuffle: permute the indices each epoch (else ``0..n-1``).
        seed: must be the same on every rank.
        drop_last: drop the tail instead of padding.

    Raises:
        ArgumentError: ``num_replicas`` < 1, ``rank`` outside ``[0, num_replicas)``, either not
            given and not in the environment, or a bad seed.
    """

    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        super().__init__()
        self.dataset = dataset
        self.num_replicas = check_positive_int(
            "DistributedSampler", "num_replicas",
            _from_env("num_replicas", num_replicas, ("WORLD_SIZE", "PMI_SIZE",
                                                     "OMPI_COMM_WORLD_SIZE")))
        rank = _from_env("rank", rank, ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"))
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < self.num_replicas:
            raise ArgumentError(f"DistributedSampler: rank should be in "
                                f"[0, {self.num_replicas - 1}] (num_replicas={self.num_replicas}),"
                                f" got {rank!r}")
        self.rank = int(rank)
        self.shuffle = _check_bool("DistributedSampler", "shuffle", shuffle)
        self.drop_last = _check_bool("DistributedSampler", "drop_last", drop_last)
        self.seed = check_seed("DistributedSampler", seed)
        if self.seed is None:
            raise ArgumentError("DistributedSampler: seed must be an int shared by all ranks, "
                                "got None")
        self.epoch = 0

    @property
    def num_samples(self):
        """Indices per rank per epoch."""
        n = len(self.dataset)
        if self.drop_last:
            return n // self.num_replicas
        return math.ceil(n / self.num_replicas)

    @property
    def total_size(self):
        return self.num_samples * self.num_replicas

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Use epoch ``epoch``'s permutation next (call it before each epoch, on every rank).

        A state loaded by :meth:`load_state_dict` survives ``set_epoch`` with the same epoch.
        """
        epoch = int(epoch)
        if epoch != self.epoch:
            self._resume_at = None
        self.epoch = epoch

    def _epoch_length(self):
        return self.num_samples

    def _epoch_order(self):
        n = len(self.dataset)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(n)
        else:
            order = np.arange(n)
        if self.drop_last:
            order = order[:self.total_size]
        elif self.total_size > n:  # pad by repetition, wrapping as often as needed
            order = np.resize(order, self.total_size)
        return order[self.rank:self.total_size:self.num_replicas].astype(np.int64, copy=False)

    def state_dict(self):
        """``{"position", "epoch", "seed"}``: ints."""
        return {**super().state_dict(), "epoch": self.epoch, "seed": self.seed}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.epoch = _read_int(self, state, "epoch")
        self.seed = _read_int(self, state, "seed")


def _from_env(name, value, variables):
    if value is not None:
        return value
    for var in variables:
        if os.environ.get(var, "").strip().lstrip("-").isdigit():
            return int(os.environ[var])
    raise ArgumentError(f"DistributedSampler: {name} was not given and none of "
                        f"{', '.join(variables)} is set")


class BatchSampler(Sampler):
    """Groups another sampler's indices into lists of ``batch_size`` (the last one shorter
    unless ``drop_last``).

    Args:
        sampler: a sampler or any iterable of indices.
        batch_size: indices per batch (a positive int).
        drop_last: drop the last batch if it is short.

    Raises:
        ArgumentError: ``batch_size`` not a positive int, ``drop_last`` not a bool.
    """

    def __init__(self, sampler, batch_size, drop_last):
        self.sampler = sampler
        self.batch_size = check_positive_int("BatchSampler", "batch_size", batch_size)
        self.drop_last = _check_bool("BatchSampler", "drop_last", drop_last)
        self._batches_done = 0
        self._skip = 0

    def __len__(self):
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self):
        if isinstance(self.sampler, _OrderSampler):
            _, start = self.sampler._begin_epoch()
            self._batches_done = start // self.batch_size
            return self._sliced()
        self._batches_done = 0
        skip, self._skip = self._skip, 0
        return self._grouped(iter(self.sampler), skip)

    def _sliced(self):
        size = self.batch_size
        while True:
            batch = self.sampler._take(size)
            if not batch or (len(batch) < size and self.drop_last):
                return
            self._batches_done += 1
            yield batch

    def _grouped(self, indices, skip):
        for batch in self._chunks(indices):
            self._batches_done += 1
            if self._batches_done > skip:
                yield batch

    def _chunks(self, indices):
        batch = []
        for index in indices:
            batch.append(index)
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    def state_dict(self):
        """``{"batches": batches yielded this epoch, "sampler": the sampler's state}``.

        A sampler without ``state_dict`` is assumed to replay the same order, and resuming
        skips the batches already yielded.
        """
        inner = self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else {}
        return {"batches": int(self._batches_done), "sampler": inner}

    def load_state_dict(self, state):
        """Make the next ``iter()`` continue the epoch described by ``state``."""
        if hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state.get("sampler", {}))
        else:
            self._skip = _read_int(self, state, "batches")
