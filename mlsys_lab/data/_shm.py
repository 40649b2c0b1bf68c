"""Hand a batch from a worker to the main process through POSIX shared memory.

In a worker, ``default_collate`` stacks each large field straight into a fresh segment
(:meth:`Packer.allocate`); the worker then sends only the segments' names and a small skeleton
(the batch's nesting with each array replaced by a :class:`_Slot`). The main process maps each
segment, unlinks its name at once and wraps the mapping in numpy arrays: no copy, and the memory
is freed when the last of those arrays is garbage collected.

``multiprocessing.shared_memory.SharedMemory`` is not used directly: before Python 3.13 it
registers every segment it creates *or attaches* with the resource tracker, which then warns
about, and unlinks, segments it does not own (bpo-39959). This module calls the same primitives
(``_posixshmem.shm_open`` / ``shm_unlink``) itself. Every segment's name starts with its pool's
prefix, so whatever a killed worker left behind is found and unlinked by :func:`unlink_prefix`.
"""

import collections.abc
import mmap
import os
import secrets

import numpy as np

from ..engine.tensor import Tensor

try:
    import _posixshmem
except ImportError:  # Windows: batches travel pickled through the pipe instead
    _posixshmem = None

AVAILABLE = _posixshmem is not None
PREFIX_ROOT = "mlsys_dl_"
THRESHOLD = 64 * 1024  # batches with fewer array bytes are pickled through the pipe
_ALIGN = 64
_SHM_DIR = "/dev/shm"


class _Slot:
    """Stands for array ``index`` of a message's ``refs`` inside a batch's skeleton (wrapped
    back into an ml Tensor if ``tensor``)."""

    __slots__ = ("index", "tensor", "requires_grad")

    def __init__(self, index, tensor=False, requires_grad=False):
        self.index, self.tensor, self.requires_grad = index, tensor, requires_grad

    def __reduce__(self):
        return (_Slot, (self.index, self.tensor, self.requires_grad))


def new_prefix():
    """A fresh name prefix for one pool's segments (short enough for macOS's 31 characters)."""
    return f"{PREFIX_ROOT}{secrets.token_hex(4)}_"


class Packer:
    """Worker side: shared-memory output arrays for collation, and batches -> messages.

    :meth:`allocate` gives ``default_collate`` an output array inside a fresh segment, so a
    batch is written to shared memory once, with no extra copy. :meth:`pack` turns a batch into
    ``(skeleton, refs)``: arrays that live in such a segment are sent by name; other arrays are
    copied into one new segment if together they reach ``threshold`` bytes, else pickled.
    """

    def __init__(self, prefix, threshold=THRESHOLD):
        self.prefix = prefix
        self.threshold = threshold
        self._count = 0
        self._owned = {}  # id(array) -> (array, segment name), for arrays made by allocate()

    def _new_name(self):
        self._count += 1
        return f"{self.prefix}{self._count}"

    def allocate(self, shape, dtype):
        """An empty array of ``shape`` in a new segment, or None when it is small or shared
        memory is unavailable or full."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if not AVAILABLE or nbytes < self.threshold or dtype.hasobject:
            return None
        name = self._new_name()
        try:
            segment = _create(name, nbytes)
        except OSError:
            return None
        array = np.ndarray(shape, dtype, buffer=segment)
        self._owned[id(array)] = (array, name)
        return array

    def pack(self, batch):
        """``(skeleton, refs)`` for :func:`unpack`; segments made for arrays not in ``batch``
        are unlinked."""
        arrays = []
        skeleton = _strip(batch, arrays)
        refs = [None] * len(arrays)
        loose = []
        for k, a in enumerate(arrays):
            owned = self._owned.get(id(a))
            if owned is not None and owned[0] is a:
                refs[k] = (owned[1], 0, a.dtype, a.shape)
                self._owned.pop(id(a))
            else:
                loose.append(k)
        if sum(arrays[k].nbytes for k in loose) >= self.threshold and AVAILABLE:
            self._copy_to_segment(arrays, loose, refs)
        for k in loose:
            if refs[k] is None:
                refs[k] = arrays[k]
        self.discard()
        return skeleton, refs

    def _copy_to_segment(self, arrays, picked, refs):
        offsets, size = [], 0
        for k in picked:
            offsets.append(size)
            size += -(-arrays[k].nbytes // _ALIGN) * _ALIGN
        name = self._new_name()
        try:
            segment = _create(name, size)
        except OSError:  # /dev/shm full: these arrays get pickled instead
            return
        try:
            for k, start in zip(picked, offsets):
                a = arrays[k]
                np.ndarray(a.shape, a.dtype, buffer=segment, offset=start)[...] = a
                refs[k] = (name, start, a.dtype, a.shape)
        finally:
            segment.close()

    def discard(self):
        """Unlink the segments :meth:`allocate` made that no packed batch took."""
        for _, name in self._owned.values():
            unlink(name)
        self._owned.clear()


def unpack(skeleton, refs):
    """The batch that :meth:`Packer.pack` described; segments are mapped and unlinked."""
    segments = {}
    arrays = []
    try:
        for ref in refs:
            if isinstance(ref, np.ndarray):
                arrays.append(ref)
                continue
            name, start, dtype, shape = ref
            if name not in segments:
                segments[name] = _attach(name)
            arrays.append(np.ndarray(shape, dtype, buffer=segments[name], offset=start))
    finally:
        for ref in refs:
            if not isinstance(ref, np.ndarray) and ref[0] not in segments:
                unlink(ref[0])
    return _fill(skeleton, arrays)


def _attach(name):
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size)
    finally:
        os.close(fd)
        _posixshmem.shm_unlink("/" + name)


def segment_names(refs):
    """The segment names a message's ``refs`` mention (to unlink a message never unpacked)."""
    return {ref[0] for ref in refs if not isinstance(ref, np.ndarray)}


def unlink(name):
    """Remove segment ``name`` if it still exists."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except (FileNotFoundError, AttributeError):
        pass


def leftover_segments(prefix=PREFIX_ROOT):
    """Names of segments under ``/dev/shm`` that start with ``prefix`` (Linux only)."""
    try:
        return sorted(n for n in os.listdir(_SHM_DIR) if n.startswith(prefix))
    except OSError:
        return []


def unlink_prefix(prefix):
    """Unlink every segment whose name starts with ``prefix``; returns how many there were."""
    names = leftover_segments(prefix)
    for name in names:
        unlink(name)
    return len(names)


def _create(name, size):
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        if hasattr(os, "posix_fallocate"):  # reserve now: ENOSPC here, not SIGBUS on write
            os.posix_fallocate(fd, 0, max(size, 1))
        else:
            os.ftruncate(fd, max(size, 1))
        return mmap.mmap(fd, max(size, 1))
    except OSError:
        unlink(name)
        raise
    finally:
        os.close(fd)


def _strip(obj, arrays):
    """``obj`` with each numeric array moved to ``arrays`` and replaced by a :class:`_Slot`."""
    if isinstance(obj, np.ndarray) and obj.dtype != object and obj.dtype.kind != "V":
        arrays.append(obj)
        return _Slot(len(arrays) - 1)
    if isinstance(obj, Tensor) and obj.data is not None:
        arrays.append(obj.data)
        return _Slot(len(arrays) - 1, tensor=True, requires_grad=obj.requires_grad)
    if type(obj) is dict:
        return {k: _strip(v, arrays) for k, v in obj.items()}
    if type(obj) is list:
        return [_strip(v, arrays) for v in obj]
    if isinstance(obj, tuple):
        items = [_strip(v, arrays) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, collections.abc.Mapping):
        try:
            return type(obj)({k: _strip(v, arrays) for k, v in obj.items()})
        except TypeError:
            return obj
    return obj


def _fill(skeleton, arrays):
    if isinstance(skeleton, _Slot):
        array = arrays[skeleton.index]
        return Tensor(array, requires_grad=skeleton.requires_grad) if skeleton.tensor else array
    if type(skeleton) is dict:
        return {k: _fill(v, arrays) for k, v in skeleton.items()}
    if type(skeleton) is list:
        return [_fill(v, arrays) for v in skeleton]
    if isinstance(skeleton, tuple):
        items = [_fill(v, arrays) for v in skeleton]
        return type(skeleton)(*items) if hasattr(skeleton, "_fields") else type(skeleton)(items)
    if isinstance(skeleton, collections.abc.Mapping):
        return type(skeleton)({k: _fill(v, arrays) for k, v in skeleton.items()})
    return skeleton
