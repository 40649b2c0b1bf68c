"""``DataLoader``: batches from a dataset, loaded in worker processes (PyTorch's semantics).

With ``num_workers=0`` batches are loaded in the calling process. Otherwise each worker is a
process with its own copy of the dataset; the main process sends it batches of indices through
a pipe, at most ``prefetch_factor`` per worker in flight, and the worker sends each batch back
-- its large arrays through shared memory (recycled once the program drops the batch, see
``shm``), small ones pickled. Batches are delivered in the sampler's order (``in_order=True``)
or as they arrive. ``state_dict()`` / ``load_state_dict()`` resume an epoch where it stopped.

Nothing is left behind: an epoch that ends, a ``break``, an exception or a garbage-collected
iterator shuts the workers down and unlinks every shared-memory segment they made. A worker
that dies is noticed at once (the main process waits on the workers' process sentinels, not
only on their pipes), and every wait is bounded. The worker side lives in ``worker``.
"""

import collections
import multiprocessing
import sys
import time
import traceback

import numpy as np

from ...errors import ArgumentError
from . import shm
from .collate import default_collate, default_convert
from .dataset import IterableDataset
from .sampler import (
    BatchSampler,
    RandomSampler,
    SequentialSampler,
    check_seed,
    derive_seed,
    fresh_seed,
)
from .worker import (
    END,
    DataLoaderError,
    DataLoaderTimeoutError,
    Fetcher,
    FetchError,
    WorkerConfig,
    WorkerError,
    WorkerPool,
    short,
    worker_error,
)

_LIVENESS_CHECK_S = 5.0  # upper bound on one wait; process sentinels wake us sooner


class DataLoader:
    """Iterate over ``dataset`` in batches, optionally loading them in worker processes.

    Args:
        dataset: a map-style dataset (``__getitem__`` and ``__len__``) or an
            :class:`~mlsys_lab.data.IterableDataset`. With workers, an iterable dataset is
            copied into each worker, which iterates all of it: split it with
            :func:`~mlsys_lab.data.get_worker_info` or every item arrives ``num_workers`` times.
            ``drop_last`` then applies to each worker's last batch.
        batch_size: samples per batch; None loads one sample at a time, without collation.
        shuffle: draw a new random order each epoch (map-style only).
        sampler: the order of indices (an iterable of indices); excludes ``shuffle``.
        batch_sampler: yields whole lists of indices; excludes ``batch_size``, ``shuffle``,
            ``sampler`` and ``drop_last``.
        num_workers: worker processes; 0 loads in the calling process.
        collate_fn: samples -> batch (default :func:`~mlsys_lab.data.default_collate`, or
            :func:`~mlsys_lab.data.default_convert` when ``batch_size`` is None).
        drop_last: drop the last batch if it is short.
        timeout: seconds to wait for a batch from the workers before raising
            :class:`DataLoaderTimeoutError`; 0 waits as long as the workers are alive.
        worker_init_fn: called as ``worker_init_fn(worker_id)`` in each worker after seeding.
        prefetch_factor: batches in flight per worker (default 2; only with workers).
        persistent_workers: keep the workers (and their dataset copies) between epochs.
        in_order: deliver batches in the sampler's order; False delivers them as they are ready.
        seed: seeds the shuffle order and the workers' base seed (worker ``i`` gets
            ``base + i`` and seeds ``random`` and numpy's global generator from it); None draws
            them from numpy's global generator.
        multiprocessing_context: ``"fork"`` (the default on Linux: works with classes defined
            in a notebook), ``"spawn"`` or ``"forkserver"`` (these pickle the dataset), or a
            ``multiprocessing`` context.
        worker_threads: BLAS / OpenMP / Numba threads per worker (default 1, so that workers do
            not oversubscribe the cores).

    Raises:
        ArgumentError: an argument out of range or a combination PyTorch also refuses; the
            message names the argument.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
                 num_workers=0, collate_fn=None, drop_last=False, timeout=0, worker_init_fn=None,
                 prefetch_factor=None, persistent_workers=False, in_order=True, seed=None,
                 multiprocessing_context=None, worker_threads=1):
        self.dataset = dataset
        self._iterable = isinstance(dataset, IterableDataset)
        self.num_workers = _check_count("num_workers", num_workers, minimum=0)
        self.batch_size = None if batch_size is None else \
            _check_count("batch_size", batch_size, minimum=1)
        self.drop_last = _check_bool("drop_last", drop_last)
        self.timeout = _check_timeout(timeout)
        self.seed = check_seed("DataLoader", seed)
        self.in_order = _check_bool("in_order", in_order)
        self.persistent_workers = _check_bool("persistent_workers", persistent_workers)
        self.worker_threads = _check_count("worker_threads", worker_threads, minimum=1)
        self.prefetch_factor = _check_prefetch(prefetch_factor, self.num_workers)
        self.worker_init_fn = _check_callable("worker_init_fn", worker_init_fn)
        self.multiprocessing_context = _pick_context(multiprocessing_context, self.num_workers)
        if self.persistent_workers and self.num_workers == 0:
            raise ArgumentError("DataLoader: persistent_workers=True needs num_workers > 0")
        self.sampler, self.batch_sampler = self._pick_samplers(shuffle, sampler, batch_sampler)
        self._auto_collation = self.batch_sampler is not None or \
            (self._iterable and self.batch_size is not None)
        default = default_collate if self._auto_collation else default_convert
        self.collate_fn = default if collate_fn is None else \
            _check_callable("collate_fn", collate_fn)
        self._progress = None        # the current epoch's delivery record (for state_dict)
        self._resume = None          # a state from load_state_dict, used by the next iter()
        self._pool = None            # persistent workers
        self._pools_started = 0

    def _pick_samplers(self, shuffle, sampler, batch_sampler):
        shuffle = False if shuffle is None else _check_bool("shuffle", shuffle)
        if self._iterable:
            for name, value in (("shuffle", shuffle), ("sampler", sampler),
                                ("batch_sampler", batch_sampler)):
                if value is not None and value is not False:
                    raise ArgumentError(f"DataLoader: {name} cannot be used with an "
                                        f"IterableDataset (the dataset decides the order)")
            return None, None
        if not hasattr(self.dataset, "__getitem__"):
            raise ArgumentError(f"DataLoader: dataset must be map-style (__getitem__ and "
                                f"__len__) or an IterableDataset, got "
                                f"{type(self.dataset).__name__}")
        if batch_sampler is not None:
            if self.batch_size != 1 or shuffle or sampler is not None or self.drop_last:
                raise ArgumentError("DataLoader: batch_sampler is mutually exclusive with "
                                    "batch_size, shuffle, sampler and drop_last")
            self.batch_size = None
            return None, batch_sampler
        if sampler is not None and shuffle:
            raise ArgumentError("DataLoader: sampler is mutually exclusive with shuffle")
        if self.batch_size is None and self.drop_last:
            raise ArgumentError("DataLoader: batch_size=None disables batching and is mutually "
                                "exclusive with drop_last")
        if sampler is None:
            sampler = RandomSampler(self.dataset, seed=self.seed) if shuffle else \
                SequentialSampler(self.dataset)
        if self.batch_size is None:
            return sampler, None
        return sampler, BatchSampler(sampler, self.batch_size, self.drop_last)

    def __len__(self):
        """Batches per epoch, as PyTorch counts them (for an iterable dataset: from
        ``len(dataset)``, which may differ from what the workers actually produce)."""
        if self._iterable:
            n = len(self.dataset)
            if self.batch_size is None:
                return n
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return len(self.batch_sampler if self.batch_sampler is not None else self.sampler)

    def __iter__(self):
        resume, self._resume = self._resume, None
        if self.num_workers == 0:
            return _SingleProcessIter(self, resume)
        if self.persistent_workers:
            if self._pool is None or not self._pool.alive:
                self._pool = self._start_pool()
            return _MultiProcessIter(self, self._pool, resume, owns_pool=False)
        return _MultiProcessIter(self, self._start_pool(), resume, owns_pool=True)

    def _start_pool(self):
        self._pools_started += 1
        base_seed = fresh_seed() if self.seed is None else \
            derive_seed(self.seed, 1, self._pools_started)
        prefix = shm.new_prefix()
        configs = [WorkerConfig(worker_id=i, num_workers=self.num_workers, seed=base_seed + i,
                                shm_prefix=prefix, threads=self.worker_threads,
                                iterable=self._iterable, auto_collation=self._auto_collation,
                                batch_size=self.batch_size or 1, drop_last=self.drop_last)
                   for i in range(self.num_workers)]
        payload = (self.dataset, self.collate_fn, self.worker_init_fn)
        return WorkerPool(self.multiprocessing_context, payload, configs)

    def close(self):
        """Shut down persistent workers now (they also stop when the loader is collected)."""
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _index_source(self):
        return self.batch_sampler if self.batch_sampler is not None else self.sampler

    def _streams(self):
        return max(1, self.num_workers)

    def state_dict(self):
        """Where the current epoch stands, as plain values ``ml.save`` can store.

        ``{"kind", "in_epoch", "sampler", "delivered", "num_workers"}``: for a map-style dataset
        ``delivered`` lists the positions of the batches handed out this epoch and ``sampler``
        is the sampler's state at the epoch's start; for an iterable dataset ``delivered``
        counts the batches handed out from each worker's stream.
        """
        if self._resume is not None:
            return dict(self._resume)
        if self._progress is not None:
            return self._progress.state()
        return _Progress(self, in_epoch=False).state()

    def load_state_dict(self, state):
        """Make the next ``iter()`` deliver exactly the batches the saved epoch had not yet
        delivered (all of the next epoch if it had finished).

        Resuming replays the epoch's order and skips what was delivered, so a sampler without
        ``state_dict`` must give the same order again, and an iterable dataset must yield the
        same stream in each worker. A batch whose loading raised counts as delivered. (An
        iterable dataset's epoch whose every batch was delivered resumes as an empty epoch: its
        length is not known.)

        Raises:
            ArgumentError: ``state`` is malformed or was saved by a loader of another kind (or,
                for an iterable dataset, another ``num_workers``).
        """
        self._resume = _check_state(self, state)


class _Progress:
    """What an epoch has delivered so far; the loader keeps the latest for ``state_dict``."""

    def __init__(self, loader, in_epoch=True, sampler_state=None, delivered=(), counts=None):
        self.kind = "iterable" if loader._iterable else "map"
        self.num_workers = loader.num_workers
        self.in_epoch = in_epoch
        if sampler_state is None and not loader._iterable:
            sampler_state = _state_of(loader._index_source())
        self.sampler_state = sampler_state or {}
        self.delivered = list(delivered)
        self.counts = np.zeros(loader._streams(), np.int64) if counts is None else counts

    def record(self, position, worker_id):
        if self.kind == "map":
            self.delivered.append(position)
        else:
            self.counts[worker_id] += 1

    def finish(self, loader):
        self.in_epoch = False
        self.sampler_state = _state_of(loader._index_source()) if self.kind == "map" else {}
        self.delivered = []
        self.counts = np.zeros_like(self.counts)

    def state(self):
        delivered = self.counts if self.kind == "iterable" else self.delivered
        return {"kind": self.kind, "in_epoch": bool(self.in_epoch),
                "sampler": _copy_state(self.sampler_state),
                "delivered": np.array(delivered, dtype=np.int64),
                "num_workers": int(self.num_workers)}


def _state_of(source):
    return source.state_dict() if hasattr(source, "state_dict") else {}


def _copy_state(state):
    return {k: _copy_state(v) if isinstance(v, dict) else v for k, v in state.items()}


class _BaseIter:
    """Common to both iterators: the epoch's batches of indices and what was delivered."""

    def __init__(self, loader, resume):
        self.loader = loader
        self.closed = False
        self.fetcher = None
        if loader._iterable:
            in_epoch = resume is not None and resume["in_epoch"]
            counts = np.array(resume["delivered"], np.int64) if in_epoch else None
            self.skips = counts.tolist() if in_epoch else [0] * loader._streams()
            self.progress = _Progress(loader, sampler_state={}, counts=counts)
            self.batches = None
        else:
            self.batches, self.progress = self._begin_map_epoch(resume)
        loader._progress = self.progress

    def _begin_map_epoch(self, resume):
        source = self.loader._index_source()
        delivered = ()
        if resume is not None:
            if resume["sampler"] and hasattr(source, "load_state_dict"):
                source.load_state_dict(resume["sampler"])
            if resume["in_epoch"]:
                delivered = resume["delivered"].tolist()
            if delivered and hasattr(source, "__len__") and len(set(delivered)) >= len(source):
                for _ in source:  # that epoch is complete: move the sampler past it
                    pass
                delivered = ()
        indices = iter(source)
        progress = _Progress(self.loader, sampler_state=_state_of(source), delivered=delivered)
        skip = set(delivered)
        batches = ((pos, idx) for pos, idx in enumerate(indices) if pos not in skip)
        return batches, progress

    def _finish(self):
        self.progress.finish(self.loader)
        self.close()

    def __iter__(self):
        return self

    def state_dict(self):
        """The loader's state (see :meth:`DataLoader.state_dict`)."""
        return self.progress.state()

    def __len__(self):
        return len(self.loader)

    def close(self):
        self.closed = True


class _SingleProcessIter(_BaseIter):
    """Loads each batch in the calling process when asked for it."""

    def __init__(self, loader, resume):
        super().__init__(loader, resume)
        self.fetcher = _make_fetcher(loader)
        if loader._iterable:
            self.fetcher.start_epoch(skip=self.skips[0])

    def __next__(self):
        if self.closed:
            raise StopIteration
        position, indices = None, None
        if self.batches is not None:
            try:
                position, indices = next(self.batches)
            except StopIteration:
                self._finish()
                raise
        try:
            batch = self.fetcher.fetch(indices)
        except FetchError as failure:
            self.progress.record(position, 0)
            error = failure.original
            if hasattr(error, "add_note"):
                where = "" if indices is None else f" (batch {position}, sample indices " \
                    f"{short(indices)})"
                error.add_note(f"raised by the dataset or collate_fn in the main process{where}")
            raise error from None
        if batch is END:
            self._finish()
            raise StopIteration
        self.progress.record(position, 0)
        return batch


def _make_fetcher(loader):
    return Fetcher(loader.dataset, loader.collate_fn, loader._iterable, loader._auto_collation,
                   loader.batch_size, loader.drop_last)


class _MultiProcessIter(_BaseIter):
    """Keeps each worker fed with up to ``prefetch_factor`` requests and hands out the results.

    ``pending`` maps each requested batch position to ``(worker_id, indices)``; ``order`` holds
    the positions in request order (delivery order when ``in_order``); ``arrived`` maps positions
    to results that came in but were not yet handed out. A worker's requests count against its
    ``prefetch_factor`` until handed out, so at most ``prefetch_factor * num_workers`` batches
    are ever in memory.
    """

    def __init__(self, loader, pool, resume, owns_pool):
        self.pool, self.owns_pool = pool, owns_pool
        try:
            super().__init__(loader, resume)
            self.epoch = pool.begin_epoch(self.skips if loader._iterable else None)
        except BaseException:
            if owns_pool:
                pool.shutdown()
            raise
        n = loader.num_workers
        self.outstanding = [0] * n
        self.active = [True] * n
        self.next_worker = 0
        self.next_position = 0
        self.sampler_done = False
        self.pending, self.arrived = {}, {}
        self.order = collections.deque()
        self._dispatch()

    def __next__(self):
        if self.closed:
            raise StopIteration
        if self.pool.epoch != self.epoch:  # persistent workers moved on to a newer iterator
            self.close()
            raise DataLoaderError("DataLoader: this iterator's epoch was abandoned when a new "
                                  "iter(loader) started on the same persistent workers")
        try:
            return self._next_batch()
        except StopIteration:
            raise
        except WorkerError as error:  # the epoch may go on, as in PyTorch; but if the error is
            # kept (a notebook keeps the last one), its traceback must not keep this iterator,
            # and so its workers, alive: drop the frames' references to it
            traceback.clear_frames(error.__traceback__)
            del self
            raise
        except BaseException:  # fatal (crash, timeout, Ctrl-C): no workers may outlive it
            self._abort()
            raise

    def _next_batch(self):
        started = time.monotonic()
        while True:
            self._dispatch()
            position = self._ready_position()
            if position is not None:
                return self._hand_out(position)
            if not self.pending:
                self._finish()
                raise StopIteration
            wait = _LIVENESS_CHECK_S
            if self.loader.timeout:
                left = self.loader.timeout - (time.monotonic() - started)
                if left <= 0:
                    raise DataLoaderTimeoutError(self._timeout_message())
                wait = min(wait, left)
            for worker_id, message in self.pool.receive(wait, self._describe_pending):
                self._accept(worker_id, message)

    def _dispatch(self):
        self.pool.give_back()
        limit = self.loader.prefetch_factor
        while not self.closed:
            worker_id = self._free_worker(limit)
            if worker_id is None:
                return
            if self.batches is not None:
                if self.sampler_done:
                    return
                try:
                    position, indices = next(self.batches)
                except StopIteration:
                    self.sampler_done = True
                    return
            else:
                position, indices = self.next_position, None
                self.next_position += 1
            self.pool.send(worker_id, ("fetch", self.epoch, position, indices),
                           self._describe_pending)
            self.pending[position] = (worker_id, indices)
            self.order.append(position)
            self.outstanding[worker_id] += 1

    def _free_worker(self, limit):
        n = len(self.outstanding)
        for step in range(n):
            worker_id = (self.next_worker + step) % n
            if self.active[worker_id] and self.outstanding[worker_id] < limit:
                self.next_worker = (worker_id + 1) % n
                return worker_id
        return None

    def _accept(self, worker_id, message):
        kind, epoch, position = message[:3]
        receiver = self.pool.receiver
        if epoch != self.epoch or position not in self.pending:
            if kind == "data":  # a result for an abandoned epoch of persistent workers
                receiver.release(worker_id, message[4], message[5])
            return
        if kind == "data":
            try:
                batch = receiver.unpack(worker_id, *message[3:])
            except OSError as e:
                raise DataLoaderError(f"DataLoader: cannot map the shared memory of batch "
                                      f"{position} from worker {worker_id}: {e}") from e
            self.arrived[position] = ("data", batch)
        elif kind == "error":
            self.arrived[position] = ("error", message[3])
        else:  # "end": this worker's stream is exhausted
            self.active[worker_id] = False
            self.arrived[position] = ("end", None)

    def _ready_position(self):
        """The next position to hand out, skipping ends; None if it has not arrived."""
        while self.order:
            position = self.order[0] if self.loader.in_order else \
                next((p for p in self.order if p in self.arrived), None)
            if position is None or position not in self.arrived:
                return None
            if self.arrived[position][0] != "end":
                return position
            self._release(position)
        return None

    def _release(self, position):
        worker_id, indices = self.pending.pop(position)
        self.order.remove(position)
        self.outstanding[worker_id] -= 1
        return (worker_id, indices, *self.arrived.pop(position))

    def _hand_out(self, position):
        worker_id, indices, kind, value = self._release(position)
        self.progress.record(position, worker_id)
        self._dispatch()  # the freed slot gets its next request before the consumer runs
        if kind == "error":
            raise worker_error(worker_id, position, indices, value)
        return value

    def _describe_pending(self, worker_id):
        """Which batches ``worker_id`` was loading, for error messages."""
        mine = [(p, idx) for p, (w, idx) in self.pending.items() if w == worker_id]
        if not mine:
            return "while idle"
        if mine[0][1] is None:
            return f"while loading batches {[p for p, _ in mine]}"
        return "while loading " + "; ".join(f"batch {p} (sample indices {short(idx)})"
                                            for p, idx in mine)

    def _timeout_message(self):
        position = self.order[0] if self.order else None
        worker_id, indices = self.pending.get(position, (None, None))
        what = f"batch {position} from worker {worker_id}"
        if indices is not None:
            what += f" (sample indices {short(indices)})"
        return (f"DataLoader timed out after {self.loader.timeout} s waiting for {what}; raise "
                f"timeout= if loading is just slow")

    def _abort(self):
        self.closed = True
        self.pool.shutdown(grace=0.05)
        if self.loader._pool is self.pool:
            self.loader._pool = None

    def close(self):
        """Stop this epoch: its workers shut down (persistent workers stay for the next)."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        self.arrived.clear()
        if self.owns_pool:
            self.pool.shutdown()

    def __del__(self):
        if hasattr(self, "pool"):
            self.close()


def _check_count(name, value, minimum):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < minimum:
        what = "a non-negative" if minimum == 0 else "a positive"
        raise ArgumentError(f"DataLoader: {name} should be {what} integer, got {value!r}")
    return int(value)


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"DataLoader: {name} should be a bool, got {value!r}")
    return bool(value)


def _check_timeout(timeout):
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
        raise ArgumentError(f"DataLoader: timeout should be a non-negative number of seconds, "
                            f"got {timeout!r}")
    return timeout


def _check_prefetch(prefetch_factor, num_workers):
    if num_workers == 0:
        if prefetch_factor is not None:
            raise ArgumentError("DataLoader: prefetch_factor can only be given with "
                                "num_workers > 0 (there is nothing to prefetch without workers)")
        return None
    if prefetch_factor is None:
        return 2
    return _check_count("prefetch_factor", prefetch_factor, minimum=1)


def _check_callable(name, fn):
    if fn is not None and not callable(fn):
        raise ArgumentError(f"DataLoader: {name} should be callable, got {fn!r}")
    return fn


def _pick_context(context, num_workers):
    if context is None:
        if num_workers and sys.platform.startswith("linux"):
            return multiprocessing.get_context("fork")
        return multiprocessing.get_context() if num_workers else None
    if num_workers == 0:
        raise ArgumentError("DataLoader: multiprocessing_context can only be used with "
                            "num_workers > 0")
    if isinstance(context, str):
        methods = multiprocessing.get_all_start_methods()
        if context not in methods:
            raise ArgumentError(f"DataLoader: multiprocessing_context should be one of "
                                f"{methods}, got {context!r}")
        return multiprocessing.get_context(context)
    if not hasattr(context, "Process") or not hasattr(context, "get_start_method"):
        raise ArgumentError(f"DataLoader: multiprocessing_context should be a start method name "
                            f"or a multiprocessing context, got {context!r}")
    return context


def _check_state(loader, state):
    kind = "iterable" if loader._iterable else "map"
    try:
        checked = {"kind": str(state["kind"]), "in_epoch": bool(state["in_epoch"]),
                   "sampler": dict(state["sampler"] or {}),
                   "delivered": np.asarray(state["delivered"], dtype=np.int64).reshape(-1),
                   "num_workers": int(state["num_workers"])}
    except (KeyError, TypeError, ValueError) as e:
        raise ArgumentError(f"DataLoader.load_state_dict: not a DataLoader state ({e!r}); "
                            f"expected keys kind, in_epoch, sampler, delivered, "
                            f"num_workers") from None
    if checked["kind"] != kind:
        raise ArgumentError(f"DataLoader.load_state_dict: the state is for a {checked['kind']}-"
                            f"style dataset, this loader's is {kind}-style")
    if kind == "iterable" and checked["in_epoch"] and \
            len(checked["delivered"]) != loader._streams():
        raise ArgumentError(f"DataLoader.load_state_dict: the state was saved with "
                            f"num_workers={checked['num_workers']}; an iterable dataset resumes "
                            f"only with the same number of workers, this loader has "
                            f"{loader.num_workers}")
    return checked
