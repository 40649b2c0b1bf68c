"""DataLoader worker processes: the loop each one runs, and the main process's side of them.

Inside a worker: :func:`worker_loop`, the :class:`Fetcher` that loads batches (the main process
uses it too when ``num_workers=0``) and :func:`get_worker_info`. In the main process:
:class:`WorkerPool`, which starts, feeds, watches and stops the workers, and the errors that
report their failures.

Messages from the main process (through the worker's task pipe):

- ``("epoch", epoch, skip)``: a new epoch begins; an iterable dataset restarts its stream and
  first discards ``skip`` batches (those a resumed loader already delivered).
- ``("fetch", epoch, position, indices)``: load one batch (``indices`` is None for an iterable
  dataset, a single index without automatic batching).
- ``("free", name)``: a shared-memory segment the main process no longer uses (see ``shm``).
- ``None``: exit.

Messages back (through the worker's result pipe): ``("data", epoch, position, skeleton, refs,
dropped)`` (see ``shm``), ``("error", epoch, position, info)``, ``("end", epoch, position)``
when an iterable dataset is exhausted, and ``("fatal", info)`` when the worker could not start
(it then exits).
"""

import dataclasses
import multiprocessing.connection
import os
import pickle
import queue
import random
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from multiprocessing.reduction import ForkingPickler

import numpy as np

from ...engine.threads import cap_process_threads
from ...errors import MLSysError
from . import collate, shm

_PARENT_CHECK_S = 1.0  # how often an idle worker checks that the main process still exists
_SHUTDOWN_GRACE_S = 0.5  # how long workers get to exit by themselves before SIGTERM


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What a worker process knows about itself (see :func:`get_worker_info`).

    Attributes:
        id: this worker's number, ``0 <= id < num_workers``.
        num_workers: how many workers the loader runs.
        seed: this worker's seed (the loader's base seed + ``id``); ``random`` and numpy's
            global generator are already seeded from it.
        dataset: this worker's copy of the dataset.
    """

    id: int
    num_workers: int
    seed: int
    dataset: object


_worker_info = None


def get_worker_info():
    """The :class:`WorkerInfo` of the current DataLoader worker, or None in the main process.

    An :class:`~mlsys_lab.data.IterableDataset` uses it to give each worker its own share of the
    stream; ``worker_init_fn`` may use it to configure the worker's copy of the dataset.
    """
    return _worker_info


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs besides the dataset and the functions (all picklable)."""

    worker_id: int
    num_workers: int
    seed: int
    shm_prefix: str
    threads: int
    iterable: bool
    auto_collation: bool
    batch_size: int
    drop_last: bool


def worker_loop(config, payload, task_conn, result_conn):
    """Serve fetch requests until told to exit, the main process disappears or a pipe breaks.

    ``payload`` is ``(dataset, collate_fn, worker_init_fn)``, or those pickled into bytes when
    the start method is spawn/forkserver (unpickled here so that a failure is reported).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    try:
        cap_process_threads(config.threads)
        dataset, collate_fn, init_fn = _start(config, payload)
    except BaseException as e:  # report every start-up failure, then exit
        _send(result_conn, ("fatal", describe(e, getattr(e, "_mlsys_stage", "start"))))
        return
    server = _Server(config, dataset, collate_fn, result_conn)
    inbox, stop, latest = queue.Queue(), threading.Event(), [0]
    reader = threading.Thread(target=_read_tasks, daemon=True,
                              args=(task_conn, inbox, stop, latest, server.packer.returned))
    reader.start()
    parent = os.getppid()  # the main process, or the forkserver (which exits with it)
    try:
        while not stop.is_set():
            try:
                message = inbox.get(timeout=_PARENT_CHECK_S)
            except queue.Empty:
                if os.getppid() != parent:
                    return
                continue
            if message is None or stop.is_set():
                return
            if message[0] == "fetch" and message[1] < latest[0]:
                continue  # a request of an epoch the main process has abandoned
            if not server.handle(message):
                return
    except KeyboardInterrupt:
        return
    finally:
        collate.set_output_allocator(None)
        server.packer.close()


def _start(config, payload):
    global _worker_info
    if isinstance(payload, bytes):
        try:
            payload = pickle.loads(payload)
        except BaseException as e:
            e._mlsys_stage = "unpickle"
            raise
        cap_process_threads(config.threads)  # again: unpickling may have loaded numba or a BLAS
    dataset, collate_fn, init_fn = payload
    _worker_info = WorkerInfo(config.worker_id, config.num_workers, config.seed, dataset)
    random.seed(config.seed)
    np.random.seed(np.random.SeedSequence(config.seed).generate_state(4))
    if init_fn is not None:
        try:
            init_fn(config.worker_id)
        except BaseException as e:
            e._mlsys_stage = "worker_init_fn"
            raise
    return dataset, collate_fn, init_fn


def _read_tasks(conn, inbox, stop, latest, returned):
    """Move task messages from the pipe into ``inbox`` so that the main process's sends never
    wait on a worker busy sending a result. On ``None`` (exit) set ``stop`` at once, and keep
    the newest epoch in ``latest[0]``, so that requests still queued can be dropped; segment
    names given back (``("free", name)``) go straight to ``returned``."""
    try:
        while True:
            message = conn.recv()
            if message is None:
                break
            if message[0] == "free":
                returned.append(message[1])
                continue
            if message[0] == "epoch":
                latest[0] = message[1]
            inbox.put(message)
    except (EOFError, OSError):
        pass
    stop.set()
    inbox.put(None)


def _send(conn, message):
    try:
        conn.send(message)
        return True
    except (BrokenPipeError, EOFError, OSError):
        return False


def describe(error, stage, sample=None):
    """A picklable account of ``error``: its type, message, traceback text, the sample index
    being loaded (if known), and the exception itself when it survives pickling."""
    try:
        pickled = pickle.dumps(error)
        pickle.loads(pickled)
    except Exception:
        pickled = None
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename == __file__:
        frames = frames.tb_next  # start the traceback at the user's code
    text = "".join(traceback.format_exception(type(error), error, frames))
    return {"type": type(error).__qualname__, "message": str(error), "stage": stage,
            "sample": sample, "exception": pickled, "traceback": text}


class _Server:
    """Turns fetch requests into result messages for one worker."""

    def __init__(self, config, dataset, collate_fn, conn):
        self.conn = conn
        self.fetcher = Fetcher(dataset, collate_fn, config.iterable, config.auto_collation,
                               config.batch_size, config.drop_last)
        self.packer = shm.Packer(f"{config.shm_prefix}{config.worker_id}_")
        collate.set_output_allocator(self.packer.allocate)

    def handle(self, message):
        """Answer one message; False once the result pipe is broken."""
        if message[0] == "epoch":
            self.fetcher.start_epoch(skip=message[2])
            return True
        _, epoch, position, indices = message
        try:
            batch = self.fetcher.fetch(indices)
        except FetchError as failure:
            self.packer.discard()
            return _send(self.conn, ("error", epoch, position, failure.info))
        if batch is END:
            return _send(self.conn, ("end", epoch, position))
        skeleton, refs, dropped = self.packer.pack(batch)
        del batch
        return _send(self.conn, ("data", epoch, position, skeleton, refs, dropped))


END = object()  # what Fetcher.fetch returns when an iterable dataset has no batch left


class FetchError(Exception):
    """A dataset or collate_fn failed; ``info`` describes it, ``original`` is the exception."""

    def __init__(self, info, original):
        super().__init__(info["message"])
        self.info = info
        self.original = original


class Fetcher:
    """Loads batches from a dataset, in a worker or in the main process.

    Args:
        dataset: map-style (``fetch(indices)``) or iterable (``fetch(None)`` takes the next
            batch of the stream begun by :meth:`start_epoch`).
        collate_fn: turns the samples (one sample without automatic batching) into the batch.
        iterable: whether ``dataset`` is an IterableDataset.
        auto_collation: batches of ``batch_size`` samples (else one sample at a time).
        batch_size, drop_last: for iterable datasets; a short last batch is dropped if asked.
    """

    def __init__(self, dataset, collate_fn, iterable, auto_collation, batch_size, drop_last):
        self.dataset = dataset
        self.collate_fn = collate_fn
        self.iterable = iterable
        self.per_batch = batch_size if auto_collation else 1
        self.auto_collation = auto_collation
        self.drop_last = drop_last
        self.stream = None
        self.exhausted = False
        self.skip = 0

    def start_epoch(self, skip=0):
        """Restart an iterable dataset's stream; its first ``skip`` batches will be discarded."""
        self.stream, self.exhausted, self.skip = None, False, int(skip)

    def fetch(self, indices):
        """The batch for ``indices`` (or the stream's next batch, or :data:`END`).

        Raises:
            FetchError: naming the stage (fetch / collate_fn / iter) and the sample index.
        """
        if self.iterable:
            samples = self._next_samples()
            if samples is END:
                return END
        elif not self.auto_collation:
            samples = _guarded(self.dataset.__getitem__, indices, "fetch", indices)
        elif hasattr(self.dataset, "__getitems__"):
            samples = _guarded(self.dataset.__getitems__, indices, "fetch")
        else:
            samples = [_guarded(self.dataset.__getitem__, index, "fetch", index)
                       for index in indices]
        return _guarded(self.collate_fn, samples, "collate_fn")

    def _next_samples(self):
        if self.exhausted:
            return END
        if self.stream is None:
            self.stream = _guarded(iter, self.dataset, "iter")
            for _ in range(self.skip * self.per_batch):
                if _guarded(_next_or_end, self.stream, "fetch") is END:
                    break
        items = []
        while len(items) < self.per_batch:
            item = _guarded(_next_or_end, self.stream, "fetch")
            if item is END:
                self.exhausted = True
                break
            items.append(item)
        if not items or (len(items) < self.per_batch and self.drop_last):
            return END
        return items if self.auto_collation else items[0]


def _next_or_end(stream):
    return next(stream, END)


def _guarded(function, argument, stage, sample=None):
    """``function(argument)``, any exception turned into a :class:`FetchError` describing it."""
    try:
        return function(argument)
    except Exception as e:
        raise FetchError(describe(e, stage, sample), e) from None


# --- the main process's side ----------------------------------------------------------------------

class DataLoaderError(MLSysError, RuntimeError):
    """Loading failed: a worker raised, died, did not start, or a batch did not come in time."""


class WorkerError(DataLoaderError):
    """The dataset or ``collate_fn`` raised inside a worker.

    Attributes:
        worker_id: the worker's number.
        batch: the batch's position in the epoch.
        indices: the batch's sample indices (None for an iterable dataset).
        sample: the index being loaded when it raised, if known.
        original: the worker's exception, when it could be pickled back (else None).
        worker_traceback: the worker's traceback, as text.
    """

    def __init__(self, message, worker_id, batch, indices, info):
        super().__init__(message)
        self.worker_id, self.batch, self.indices, self._info = worker_id, batch, indices, info
        self.sample = info["sample"]
        self.worker_traceback = info["traceback"]
        self.original = _unpickle_exception(info["exception"])

    def __reduce__(self):
        return (type(self), (str(self), self.worker_id, self.batch, self.indices, self._info))


class WorkerCrashedError(DataLoaderError):
    """A worker process exited or was killed while the loader needed it."""


class DataLoaderTimeoutError(DataLoaderError):
    """No batch arrived within the loader's ``timeout``."""


def worker_error(worker_id, position, indices, info):
    """The :class:`WorkerError` for a failed batch (``info`` from :func:`describe`)."""
    where = f"batch {position}"
    if indices is not None:
        where += f", sample indices {short(indices)}"
    if info["sample"] is not None and indices is not None and not np.isscalar(indices):
        where += f"; failing sample {info['sample']}"
    message = (f"DataLoader worker {worker_id} raised {info['type']} in {info['stage']} "
               f"({where}): {info['message']}\n\nWorker traceback:\n{info['traceback']}")
    return WorkerError(message, worker_id, position, indices, info)


def _unpickle_exception(data):
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:
        return None


def short(indices, limit=16):
    """``indices`` for a message, cut after ``limit`` of them."""
    if np.isscalar(indices):
        return str(indices)
    indices = list(indices)
    if len(indices) <= limit:
        return str(indices)
    return f"[{', '.join(map(str, indices[:limit]))}, ... ({len(indices)} in all)]"


class _Worker:
    """One worker process and the main process's ends of its two pipes."""

    __slots__ = ("worker_id", "process", "tasks", "results")

    def __init__(self, worker_id, process, tasks, results):
        self.worker_id, self.process, self.tasks, self.results = \
            worker_id, process, tasks, results


class WorkerPool:
    """The main process's side of a set of worker processes: starts them, sends requests,
    receives results, notices deaths and stops them, leaving no process or segment behind.

    Args:
        context: the multiprocessing context (its start method decides whether ``payload``
            is pickled once here, with a clear error naming what does not pickle).
        payload: ``(dataset, collate_fn, worker_init_fn)``.
        configs: one :class:`WorkerConfig` per worker (all with the same ``shm_prefix``).
    """

    def __init__(self, context, payload, configs):
        self.prefix = configs[0].shm_prefix
        self.workers = []
        self.epoch = 0
        self.receiver = shm.Receiver()
        self.start_method = context.get_start_method()
        if self.start_method != "fork":
            payload = _pickle_payload(payload, self.start_method)
        self._owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _shutdown, self.workers, self.prefix,
                                           self._owner_pid)
        try:
            for config in configs:
                self.workers.append(self._start(context, config, payload))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, context, config, payload):
        task_r, task_w = context.Pipe(duplex=False)
        result_r, result_w = context.Pipe(duplex=False)
        process = context.Process(target=worker_loop, args=(config, payload, task_r, result_w),
                                  name=f"DataLoader worker {config.worker_id}", daemon=True)
        try:
            with warnings.catch_warnings():  # Python >= 3.12 warns on every fork of a process
                # with threads (BLAS, numba); fork is the documented default, as in PyTorch
                warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                        DeprecationWarning)
                process.start()
        finally:
            task_r.close()
            result_w.close()
        return _Worker(config.worker_id, process, task_w, result_r)

    @property
    def alive(self):
        return self._finalizer.alive

    def begin_epoch(self, skips):
        """Tell every worker a new epoch begins; returns its number (results are tagged)."""
        self.epoch += 1
        for w in self.workers:
            skip = 0 if skips is None else skips[w.worker_id]
            self.send(w.worker_id, ("epoch", self.epoch, skip), lambda _: "at epoch start")
        return self.epoch

    def give_back(self):
        """Return the segments of batches the program no longer holds to their workers."""
        released = self.receiver.released
        while released:
            worker_id, name = released.popleft()
            try:
                self.workers[worker_id].tasks.send(("free", name))
            except OSError:  # that worker is gone; its death is reported elsewhere
                pass

    def send(self, worker_id, message, describe):
        try:
            self.workers[worker_id].tasks.send(message)
        except OSError:  # the pipe broke: the worker is gone
            self._raise_if_dead(describe, suspects=[self.workers[worker_id]])

    def receive(self, timeout, describe):
        """Messages that arrive within ``timeout`` seconds, as ``(worker_id, message)``.

        Raises:
            WorkerCrashedError: a worker exited (naming its exit code or signal and what it
                was loading).
            DataLoaderError: a worker could not start (its dataset did not unpickle,
                ``worker_init_fn`` raised, ...).
        """
        by_handle = {w.results: w for w in self.workers}
        by_handle.update({w.process.sentinel: w for w in self.workers})
        ready = multiprocessing.connection.wait(list(by_handle), timeout)
        messages, suspects = [], []
        for handle in ready:
            w = by_handle[handle]
            if handle is not w.results:
                suspects.append(w)  # its process exited
                continue
            try:
                while w.results.poll():
                    messages.append((w.worker_id, w.results.recv()))
            except (EOFError, OSError):  # the pipe closed: the worker is exiting
                suspects.append(w)
        for worker_id, message in messages:
            if message[0] == "fatal":
                raise DataLoaderError(_fatal_message(worker_id, message[1], self.start_method))
        if suspects:
            self._raise_if_dead(describe, suspects)
        return messages

    def _raise_if_dead(self, describe, suspects):
        """Raise WorkerCrashedError for the first worker that has exited (``suspects`` get a
        second to finish exiting)."""
        deadline = time.monotonic() + 1.0
        for w in suspects:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.process.exitcode is not None:
                raise WorkerCrashedError(_crash_message(w, describe(w.worker_id),
                                                        self.start_method))
        w = suspects[0]
        raise WorkerCrashedError(f"DataLoader worker {w.worker_id} (pid {w.process.pid}) closed "
                                 f"its pipes {describe(w.worker_id)}")

    def shutdown(self, grace=_SHUTDOWN_GRACE_S):
        """Stop every worker and unlink every segment they made (safe to call twice).

        Workers get ``grace`` seconds to finish the batch in hand and exit; then SIGTERM."""
        if self._finalizer.alive:
            self._finalizer.detach()
            _shutdown(self.workers, self.prefix, self._owner_pid, grace)


def _shutdown(workers, prefix, owner_pid, grace=_SHUTDOWN_GRACE_S):
    if os.getpid() != owner_pid:  # a forked child's copy of the pool: not its processes
        return
    for w in workers:
        try:
            w.tasks.send(None)
        except OSError:
            pass
    deadline = time.monotonic() + grace
    for w in workers:
        w.process.join(max(0.0, deadline - time.monotonic()))
    for w in workers:
        if w.process.exitcode is None:
            w.process.terminate()
    for w in workers:
        w.process.join(2.0)
        if w.process.exitcode is None:
            w.process.kill()
            w.process.join(2.0)
    for w in workers:
        w.tasks.close()
        w.results.close()
    shm.unlink_prefix(prefix)


def _crash_message(w, doing, start_method):
    code = w.process.exitcode
    hint = ""
    if code >= 0:
        how = f"exited unexpectedly with exit code {code}"
    else:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
        hint = _SIGNAL_HINTS.get(-code, "")
        if -code == signal.SIGTERM and start_method == "fork" and numba_openmp_in_use():
            hint = NUMBA_OPENMP_HINT
    message = f"DataLoader worker {w.worker_id} (pid {w.process.pid}) {how} {doing}"
    return f"{message}. {hint}" if hint else message


_SIGNAL_HINTS = {
    signal.SIGKILL: "SIGKILL comes from outside the loader (the out-of-memory killer sends it)",
    signal.SIGBUS: "SIGBUS in a worker often means /dev/shm is too small for the batches",
    signal.SIGSEGV: "The dataset or a library it calls crashed (segmentation fault)",
}
NUMBA_OPENMP_HINT = (
    "numba's OpenMP threading layer terminates processes forked after it ran parallel code. "
    "Install tbb (`pip install tbb`; numba then picks its fork- and thread-safe TBB "
    "layer, at some cost to parallel GEMM speed), or use multiprocessing_context='forkserver' (a "
    "Pipeline: executor='thread'). NUMBA_THREADING_LAYER=workqueue is fork-safe too, but "
    "aborts the program when several threads run numba-parallel code at once")


def numba_openmp_in_use():
    """Whether numba has started its GNU OpenMP threading layer in this process (a forked
    child that then runs numba-parallel code is terminated by numba)."""
    numba = sys.modules.get("numba")
    if numba is None:
        return False
    parallel = getattr(getattr(numba, "np", None), "ufunc", None)
    parallel = getattr(parallel, "parallel", None)
    return getattr(parallel, "_is_initialized", False) and \
        getattr(parallel, "_threading_layer", None) == "omp"


def _fatal_message(worker_id, info, start_method):
    hint = ""
    if info["stage"] == "unpickle":
        hint = (f"\n{start_method} workers import the dataset's class by name: objects defined "
                f"in a notebook or in __main__ cannot be found there. Use "
                f"multiprocessing_context='fork' or define them in an importable module.")
    return (f"DataLoader worker {worker_id} could not start: {info['stage']} raised "
            f"{info['type']}: {info['message']}{hint}\n\nWorker traceback:\n{info['traceback']}")


def _pickle_payload(payload, start_method):
    """The dataset and functions pickled once for all workers; a clear error naming the object
    that does not pickle."""
    try:
        return bytes(ForkingPickler.dumps(payload))
    except Exception as e:
        for name, obj in zip(("dataset", "collate_fn", "worker_init_fn"), payload):
            try:
                ForkingPickler.dumps(obj)
            except Exception as inner:
                culprit = _unpicklable_part(obj)
                raise DataLoaderError(
                    f"DataLoader: multiprocessing_context={start_method!r} sends the {name} to "
                    f"each worker by pickling, but the {name} ({type(obj).__qualname__} object)"
                    f"{culprit} cannot be pickled: {type(inner).__name__}: {inner}. Use "
                    f"multiprocessing_context='fork', or make it picklable.") from e
        raise


def _unpicklable_part(obj):
    for attribute, value in getattr(obj, "__dict__", {}).items():
        try:
            ForkingPickler.dumps(value)
        except Exception:
            return f": its attribute {attribute!r} ({type(value).__qualname__} object)"
    return ""


