"""What a running pipeline shares: its clock, the context every operator sees (stop flag,
timeout, recorder), the messages and polling queue helpers of parallel operators, and the
errors they raise."""

from __future__ import annotations

import os
import queue
import threading
import time

from ...errors import MLSysError, PipelineError

__all__ = ["PipelineError", "PipelineTimeout", "now"]

CPU_COUNT = os.cpu_count() or 1
POLL_SECONDS = 0.02
JOIN_SECONDS = 5.0   # waiting for workers to finish their current item on a normal close
HASTY_JOIN_SECONDS = 0.2  # ... when an error is already on its way to the caller

#: Status of a message between a dispatcher, its workers and the consumer.
OK, ERROR, UPSTREAM_ERROR, END = 0, 1, 2, 3
STOPPED = (None, None, None)  # what a worker's wait returns once the pipeline closes

clock = time.perf_counter  # tests replace it to control measured costs


def now() -> float:
    """The pipeline's clock, in seconds."""
    return clock()


class PipelineTimeout(MLSysError, TimeoutError):
    """No item arrived from a parallel operator within the iteration's ``timeout``."""


class Context:
    """One iteration's shared state: the ``closing`` flag, the timeout and the recorder (None
    unless profiling)."""

    def __init__(self, recorder, timeout: float | None):
        self.closing = threading.Event()
        self.recorder = recorder
        self.timeout = timeout

    def work(self, stage, worker, item, start, end):
        if self.recorder is not None:
            self.recorder.work(stage, worker, item, start, end)

    def waited(self, stage, worker, seconds):
        if self.recorder is not None:
            self.recorder.waited(stage, worker, seconds)


def pulled(upstream, ctx: Context, stage: str):
    """``upstream``, with the time spent waiting for each item recorded when profiling."""
    if ctx.recorder is None:
        return upstream
    return _timed_pull(upstream, ctx, stage)


def _timed_pull(upstream, ctx, stage):
    while True:
        start = now()
        try:
            item = next(upstream)
        except StopIteration:
            return
        ctx.waited(stage, 0, now() - start)
        yield item


def op_error(node, index, exc) -> PipelineError:
    """The ``PipelineError`` for ``node``'s function failing on item (or batch) ``index``."""
    per_batch = node.kind == "batch" or getattr(node, "batch_size", None) is not None
    what = "batch" if per_batch else "item"
    return PipelineError(f"{node.kind} operator {node.name!r} failed on {what} {index}: "
                         f"{type(exc).__name__}: {exc}", op=node.name, index=index)


def put(q, message, stop, ctx) -> bool:
    """Put ``message`` on ``q``, polling; False (not put) once ``stop`` or the pipeline closes."""
    while True:
        try:
            q.put(message, timeout=POLL_SECONDS)
            return True
        except queue.Full:
            if stop.is_set() or ctx.closing.is_set():
                return False


def get(q, ctx, node, check_alive):
    """Wait for a message (the consumer side): honours ``ctx.timeout`` and dead workers."""
    waited = 0.0
    while True:
        try:
            return q.get(timeout=POLL_SECONDS)
        except queue.Empty:
            waited += POLL_SECONDS
            check_alive()
            if ctx.timeout is not None and waited >= ctx.timeout:
                raise PipelineTimeout(f"{node.kind} operator {node.name!r}: no item within "
                                      f"{ctx.timeout} s") from None


def worker_get(q, stop, ctx):
    """Wait for a message (a worker thread's side); ``STOPPED`` once the pipeline closes."""
    while True:
        try:
            return q.get(timeout=POLL_SECONDS)
        except queue.Empty:
            if stop.is_set() or ctx.closing.is_set():
                return STOPPED
