"""Hand a batch from a worker to the main process through POSIX shared memory, and recycle it.

In a worker, ``default_collate`` stacks each large field straight into a shared-memory segment
(:meth:`Packer.allocate`); the worker then sends only the segments' names and a small skeleton
(the batch's nesting with each array replaced by a :class:`_Slot`). The main process maps each
segment (:meth:`Receiver.unpack`) and wraps the mapping in numpy arrays: no copy.

Segments are recycled, because a fresh one costs more than the copy itself (the kernel must
allocate and zero its pages, and both processes fault them in). When the last array over a
segment is garbage collected in the main process, its name goes back to the worker that made it
(``Receiver.released`` -> a ``("free", name)`` message -> ``Packer.returned``), which writes its
next batch there, into pages both processes already have mapped. A worker reuses only what was
given back, so a batch the program still holds is never overwritten. A worker keeps a few free
segments and unlinks the rest, telling the main process (``dropped`` in its next message) so
that it forgets its mapping too.

``multiprocessing.shared_memory.SharedMemory`` is not used: before Python 3.13 it registers
every segment it creates *or attaches* with the resource tracker, which then warns about, and
unlinks, segments it does not own (bpo-39959). This module calls the same primitives
(``_posixshmem.shm_open`` / ``shm_unlink``) itself. Every name starts with its pool's prefix:
workers unlink their segments when they exit, and the pool unlinks whatever is left under its
prefix (:func:`unlink_prefix`) once its workers are gone, killed ones included.
"""

import collections
import collections.abc
import mmap
import os
import secrets
import weakref

import numpy as np

from ...engine.tensor import Tensor

try:
    import _posixshmem
except ImportError:  # Windows: batches travel pickled through the pipe instead
    _posixshmem = None

AVAILABLE = _posixshmem is not None
PREFIX_ROOT = "mlsys_dl_"
THRESHOLD = 64 * 1024  # batches with fewer array bytes are pickled through the pipe
KEEP_FREE = 4          # segments a worker keeps for reuse
MAX_MAPPED = 32        # segments a worker keeps mapped (others are mapped again when reused)
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

    :meth:`allocate` gives ``default_collate`` an output array in a (recycled) segment, so a
    batch is written to shared memory once. :meth:`pack` turns a batch into ``(skeleton, refs,
    dropped)``: arrays in such a segment are sent by name; other arrays are copied into one
    segment if together they reach ``threshold`` bytes, else pickled; ``dropped`` lists names
    unlinked since the last message. Names given back by the main process arrive in
    :attr:`returned` (a deque the worker's task reader appends to).
    """

    def __init__(self, prefix, threshold=THRESHOLD):
        self.prefix = prefix
        self.threshold = threshold
        self.returned = collections.deque()
        self._count = 0
        self._segments = {}  # name -> [mmap or None, size]: every name this worker has linked
        self._free = []      # names given back, oldest first
        self._owned = {}     # id(array) -> (array, name) for arrays made by allocate()
        self._dropped = []

    def allocate(self, shape, dtype):
        """An empty array of ``shape`` in shared memory, or None when it is small or shared
        memory is unavailable or full."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if not AVAILABLE or nbytes < self.threshold or dtype.hasobject:
            return None
        name = self._segment(nbytes)
        if name is None:
            return None
        array = np.ndarray(shape, dtype, buffer=self._mapping(name))
        self._owned[id(array)] = (array, name)
        return array

    def pack(self, batch):
        """``(skeleton, refs, dropped)`` for :meth:`Receiver.unpack`."""
        arrays = []
        skeleton = _strip(batch, arrays)
        refs, loose = [None] * len(arrays), []
        for k, a in enumerate(arrays):
            owned = self._owned.pop(id(a), None)
            if owned is not None and owned[0] is a:
                refs[k] = (owned[1], 0, a.dtype, a.shape)
            else:
                loose.append(k)
        if AVAILABLE and sum(arrays[k].nbytes for k in loose) >= self.threshold:
            self._copy_to_segment(arrays, loose, refs)
        for k in loose:
            if refs[k] is None:
                refs[k] = arrays[k]
        self.discard()
        self._unmap_extra()
        dropped, self._dropped = self._dropped, []
        return skeleton, refs, dropped

    def discard(self):
        """Take back the segments :meth:`allocate` made that no packed batch took."""
        for _, name in self._owned.values():
            self._free.append(name)
        self._owned.clear()

    def close(self):
        """Unlink every segment (the worker is exiting; the main process keeps its mappings)."""
        self._owned.clear()
        for name in list(self._segments):
            self._unlink(name)

    def _segment(self, nbytes):
        """The name of a free segment of ``nbytes`` to ``2 nbytes`` bytes, or of a new one."""
        while self.returned:
            name = self.returned.popleft()
            if name in self._segments and name not in self._free:
                self._free.append(name)
        for k, name in enumerate(self._free):
            if nbytes <= self._segments[name][1] <= 2 * nbytes + 4096:
                return self._free.pop(k)
        while len(self._free) >= KEEP_FREE:
            self._drop(self._free.pop(0))
        self._count += 1
        name = f"{self.prefix}{self._count}"
        try:
            self._segments[name] = [_create(name, nbytes), nbytes]
        except OSError:  # /dev/shm full or missing: the caller falls back to private memory
            return None
        return name

    def _mapping(self, name):
        entry = self._segments[name]
        if entry[0] is None:
            entry[0] = _map(name, entry[1])
        return entry[0]

    def _drop(self, name):
        self._unlink(name)
        self._dropped.append(name)

    def _unlink(self, name):
        segment, _ = self._segments.pop(name)
        _close(segment)
        unlink(name)

    def _unmap_extra(self):
        mapped = [n for n, (m, _) in self._segments.items() if m is not None]
        for name in mapped[:max(0, len(mapped) - MAX_MAPPED)]:
            if _close(self._segments[name][0]):
                self._segments[name][0] = None

    def _copy_to_segment(self, arrays, picked, refs):
        offsets, size = [], 0
        for k in picked:
            offsets.append(size)
            size += -(-arrays[k].nbytes // _ALIGN) * _ALIGN
        name = self._segment(size)
        if name is None:  # /dev/shm full: these arrays get pickled instead
            return
        segment = self._mapping(name)
        for k, start in zip(picked, offsets):
            a = arrays[k]
            np.ndarray(a.shape, a.dtype, buffer=segment, offset=start)[...] = a
            refs[k] = (name, start, a.dtype, a.shape)


class Receiver:
    """Main-process side: batches from :meth:`Packer.pack` messages, and names to give back.

    Mappings are kept per name, so a recycled segment costs no new mapping. When the arrays of a
    batch are garbage collected, ``(worker_id, name)`` is appended to :attr:`released`; the
    pool sends those names back to their workers.
    """

    def __init__(self):
        self.released = collections.deque()
        self._maps = {}

    def unpack(self, worker_id, skeleton, refs, dropped):
        """The batch that ``(skeleton, refs)`` describe (``dropped``: names to forget)."""
        self._forget(dropped)
        holders = {}
        arrays = []
        for ref in refs:
            if isinstance(ref, np.ndarray):
                arrays.append(ref)
                continue
            name, start, dtype, shape = ref
            if name not in holders:
                holders[name] = self._holder(worker_id, name)
            arrays.append(np.ndarray(shape, dtype, buffer=holders[name], offset=start))
        return _fill(skeleton, arrays)

    def release(self, worker_id, refs, dropped):
        """Give back the segments of a message that will not be unpacked."""
        self._forget(dropped)
        for name in segment_names(refs):
            self.released.append((worker_id, name))

    def _forget(self, dropped):
        for name in dropped:  # unlinked by their worker; arrays still in use keep their mapping
            self._maps.pop(name, None)

    def _holder(self, worker_id, name):
        """A byte array over segment ``name``; every array of the batch is a view of it, so
        its collection means the batch is gone."""
        if name not in self._maps:
            self._maps[name] = _map(name)
        segment = self._maps[name]
        holder = np.ndarray(len(segment), np.uint8, buffer=segment)
        weakref.finalize(holder, self.released.append, (worker_id, name)).atexit = False
        return holder


def segment_names(refs):
    """The segment names a message's ``refs`` mention."""
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


def _map(name, size=None):
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size if size is None else max(size, 1))
    finally:
        os.close(fd)


def _close(segment):
    """Unmap ``segment`` unless arrays still use it; whether it was closed."""
    if segment is None:
        return True
    try:
        segment.close()
    except BufferError:
        return False
    return True


def _rebuild(obj, leaf):
    """``obj`` with every part for which ``leaf`` returns something other than ``_KEEP``
    replaced by that, through dicts, lists, (named) tuples and other mappings."""
    out = leaf(obj)
    if out is not _KEEP:
        return out
    if type(obj) is dict:
        return {k: _rebuild(v, leaf) for k, v in obj.items()}
    if type(obj) is list:
        return [_rebuild(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        items = [_rebuild(v, leaf) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, collections.abc.Mapping):
        try:
            return type(obj)({k: _rebuild(v, leaf) for k, v in obj.items()})
        except TypeError:  # a mapping that cannot be built from a dict travels as it is
            return obj
    return obj


_KEEP = object()


def _strip(obj, arrays):
    """``obj`` with each numeric array moved to ``arrays`` and replaced by a :class:`_Slot`."""

    def take(part):
        if isinstance(part, np.ndarray) and not part.dtype.hasobject and part.dtype.kind != "V":
            arrays.append(part)
            return _Slot(len(arrays) - 1)
        if isinstance(part, Tensor) and part.data is not None:
            arrays.append(part.data)
            return _Slot(len(arrays) - 1, tensor=True, requires_grad=part.requires_grad)
        return _KEEP

    return _rebuild(obj, take)


def _fill(skeleton, arrays):
    """The batch ``skeleton`` stands for: each :class:`_Slot` replaced by its array."""

    def put_back(part):
        if not isinstance(part, _Slot):
            return _KEEP
        array = arrays[part.index]
        return Tensor(array, requires_grad=part.requires_grad) if part.tensor else array

    return _rebuild(skeleton, put_back)
