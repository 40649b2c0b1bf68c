"""The workers of a parallel map: one pool base (dispatcher, worker loop, ordered reading,
shutdown) and its two executors, threads and forked processes.

Ordered (``deterministic=True``): lane ``i`` (an input and an output queue) belongs to
producer ``i`` of ``M``, and item ``n`` travels in lane ``n % M``; the consumer reads the lanes
round-robin, so results come out in input order. Unordered: one lane shared by every producer,
results as they finish. Every wait polls, so closing the pipeline stops every worker.

The executors differ only in how a worker is started and stopped, how an item crosses to it
(as is, or pickled: a process has its own memory) and how its timings come back (recorded
directly, or sent with the result).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle  # only to hand items to worker processes, never for files
import queue
import signal
import threading
import traceback

from ...errors import ArgumentError, PipelineError
from ..loader.worker import NUMBA_OPENMP_HINT, numba_openmp_in_use
from .runtime import (
    END,
    ERROR,
    HASTY_JOIN_SECONDS,
    JOIN_SECONDS,
    OK,
    STOPPED,
    UPSTREAM_ERROR,
    get,
    now,
    op_error,
    put,
    worker_get,
)

__all__ = ["Pool", "ProcessPool", "ThreadPool", "make_pool"]

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def make_pool(node, ctx, epoch, upstream):
    """The pool that runs map ``node`` (``node.executor``: "thread" or "process")."""
    return (ProcessPool if node.executor == "process" else ThreadPool)(node, ctx, epoch,
                                                                         upstream)


class Pool:
    """Dispatcher, worker loop, ordered reading and shutdown, shared by both executors.

    Subclasses say how to make a queue and a worker (``make_queue``, ``spawn``), how a worker
    waits for, processes and sends a message (``receive``, ``process``, ``send``), how an item
    crosses to a worker and back (``pack``, ``unwrap``, ``worker_error``), how a dead worker is
    noticed (``check_alive``) and how workers are stopped (``stop_workers``).
    """

    def __init__(self, node, ctx, epoch: tuple, upstream):
        self.node, self.ctx, self.epoch, self.upstream = node, ctx, epoch, upstream
        self.degree = node.num_parallel
        self.ordered = node.deterministic
        lanes = self.degree if self.ordered else 1
        depth = 2 if self.ordered else 2 * self.degree
        self.inputs = [self.make_queue(depth) for _ in range(lanes)]
        self.outputs = [self.make_queue(depth) for _ in range(lanes)]
        self.stop = threading.Event()
        self.workers = []
        self.upstream_error = None
        self.dispatcher = threading.Thread(target=self.dispatch, daemon=True,
                                           name=f"dispatch:{node.name}")

    def lane(self, n: int) -> int:
        return n % len(self.inputs)

    def worker_lane(self, w: int) -> int:
        return w if self.ordered else 0

    # -- the three parties: dispatcher, workers, consumer --------------------------------------
    def dispatch(self):
        """Read the upstream and send item ``n`` down lane ``n % M``; then an end marker for
        every worker (or, if the upstream raised, an error marker at its position)."""
        n = 0
        try:
            for item in self.upstream:
                item = self.pack(n, item)
                if not put(self.inputs[self.lane(n)], (n, OK, item), self.stop, self.ctx):
                    return
                n += 1
        except BaseException as exc:  # raised by the consumer, in order, at position n
            self.upstream_error = exc
            put(self.inputs[self.lane(n)], (n, UPSTREAM_ERROR, None), self.stop, self.ctx)
            return
        for w in range(self.degree):
            if not put(self.inputs[self.lane(n + w)], (n + w, END, None), self.stop, self.ctx):
                return

    def work(self, w: int):
        """Worker ``w``'s loop (in a thread or a forked process): take a message, apply the
        map to an item, send the result on; forward a marker and stop after it, or after an
        error."""
        while True:
            start = now()
            n, status, item = self.receive(w)
            if n is None:  # the pipeline is closing
                return
            if status == OK:
                status, item = self.process(w, n, item, start)
            if not self.send(w, (n, status, item)) or status != OK:
                return

    def results(self):
        """The consumer: results in order (lane by lane) or as they come; closes the pool."""
        self.workers = [self.spawn(w) for w in range(self.degree)]
        for worker in self.workers:
            worker.start()
        self.dispatcher.start()
        ended, k, failed = 0, 0, False
        try:
            while True:
                lane = self.lane(k)
                n, status, value = get(self.outputs[lane], self.ctx, self.node,
                                       lambda lane=lane: self.check_alive(lane))
                if status == END:
                    ended += 1
                    if self.ordered or ended == self.degree:
                        return
                    continue
                if status == UPSTREAM_ERROR:
                    raise self.upstream_error
                if status == ERROR:
                    raise self.worker_error(n, value)
                yield self.unwrap(n, value)
                k += 1
        except GeneratorExit:
            raise
        except BaseException:
            failed = True
            raise
        finally:
            self.shutdown(HASTY_JOIN_SECONDS if failed else JOIN_SECONDS)

    def shutdown(self, patience: float):
        """Stop the dispatcher and workers; a worker thread still inside the user's function
        is left to finish that item (it exits by itself: it checks ``stop`` before the next)."""
        self.stop.set()
        deadline = now() + patience
        self.stop_workers(deadline)
        self.dispatcher.join(max(0.0, deadline - now()))
        if not self.dispatcher.is_alive():
            self.upstream.close()


class ThreadPool(Pool):
    """Worker threads: items cross as they are; timings are recorded where they are taken."""

    make_queue = staticmethod(lambda depth: queue.Queue(maxsize=depth))

    def spawn(self, w):
        return threading.Thread(target=self.work, args=(w,), daemon=True,
                                name=f"{self.node.name}:{w}")

    def receive(self, w):
        return worker_get(self.inputs[self.worker_lane(w)], self.stop, self.ctx)

    def process(self, w, n, item, start):
        begin = now()
        self.ctx.waited(self.node.name, w, begin - start)
        try:
            result = self.node.apply(item, self.epoch, n)
        except Exception as exc:
            return ERROR, exc
        finally:
            self.ctx.work(self.node.name, w, n, begin, now())
        return OK, result

    def send(self, w, message):
        start = now()
        sent = put(self.outputs[self.worker_lane(w)], message, self.stop, self.ctx)
        self.ctx.waited(self.node.name, w, now() - start)
        return sent

    @staticmethod
    def pack(n, item):
        return item

    @staticmethod
    def unwrap(n, value):
        return value

    def worker_error(self, n, exc):
        error = op_error(self.node, n, exc)
        error.__cause__ = exc
        return error

    def check_alive(self, lane):
        pass

    def stop_workers(self, deadline):
        for thread in self.workers:
            thread.join(max(0.0, deadline - now()))


class ProcessPool(Pool):
    """Forked worker processes (fork: functions defined in a notebook need no pickling).

    Items and results cross pickled (results are pickled in the worker, not in the queue's
    feeder thread, so a failure is reported); each result carries its worker's timings back.
    """

    def __init__(self, node, ctx, epoch, upstream):
        if "fork" not in multiprocessing.get_all_start_methods():
            raise ArgumentError(f"map {node.name!r}: executor='process' needs the fork start "
                                "method, which this platform lacks; use threads")
        self._mp = multiprocessing.get_context("fork")
        self._parent = os.getpid()
        super().__init__(node, ctx, epoch, upstream)

    def make_queue(self, depth):
        return self._mp.Queue(maxsize=depth)

    def spawn(self, w):
        return self._mp.Process(target=self.work, args=(w,), daemon=True,
                                name=f"{self.node.name}:{w}")

    # -- in the worker process --
    def receive(self, w):
        while True:
            try:
                return self.inputs[self.worker_lane(w)].get(timeout=0.5)
            except queue.Empty:
                if os.getppid() != self._parent:  # the parent died: do not linger
                    return STOPPED

    def process(self, w, n, item, start):
        begin = now()
        try:
            result = self.node.apply(pickle.loads(item), self.epoch, n)
        except Exception as exc:
            return ERROR, (type(exc).__name__, str(exc), traceback.format_exc())
        try:
            return OK, pickle.dumps((result, (w, begin - start, begin, now())), _PROTOCOL)
        except Exception as exc:
            return ERROR, (type(exc).__name__, "its result cannot be sent back to the main "
                           f"process: {exc}", "")

    def send(self, w, message):
        self.outputs[self.worker_lane(w)].put(message)
        return True

    # -- in the main process --
    def pack(self, n, item):
        try:
            return pickle.dumps(item, _PROTOCOL)
        except Exception as exc:
            raise PipelineError(f"map operator {self.node.name!r}: item {n} cannot be sent to a "
                                f"worker process ({type(exc).__name__}: {exc}); use threads",
                                op=self.node.name, index=n) from exc

    def unwrap(self, n, value):
        item, (w, wait, begin, end) = pickle.loads(value)
        self.ctx.waited(self.node.name, w, wait)
        self.ctx.work(self.node.name, w, n, begin, end)
        return item

    def worker_error(self, n, info):
        name, message, trace = info
        return PipelineError(f"map operator {self.node.name!r} failed on item {n}: {name}: "
                             f"{message}\n--- worker traceback ---\n{trace}",
                             op=self.node.name, index=n)

    def check_alive(self, lane):
        for proc in self.workers if not self.ordered else [self.workers[lane]]:
            if proc.exitcode not in (None, 0):
                hint = ""
                if proc.exitcode == -signal.SIGTERM and numba_openmp_in_use():
                    hint = f". {NUMBA_OPENMP_HINT}"
                raise PipelineError(f"map operator {self.node.name!r}: worker process "
                                    f"{proc.name} died (exit code {proc.exitcode}){hint}",
                                    op=self.node.name)

    def stop_workers(self, deadline):
        for proc in self.workers:
            if proc.is_alive():
                proc.terminate()
        for proc in self.workers:
            proc.join(max(0.1, deadline - now()))
            if proc.is_alive():
                proc.kill()
                proc.join(JOIN_SECONDS)
        for q in (*self.inputs, *self.outputs):
            q.cancel_join_thread()
            q.close()
