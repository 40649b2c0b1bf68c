"""Worker processes, each stepping a block of copies, with observations in shared memory.

The main process writes the actions into a shared array and sends each worker a one-word
command through its pipe; each worker steps its block (a :class:`SyncVectorEnv`, so auto-reset
is the same) and writes observations, rewards and flags straight into shared arrays, then
answers ``"ok"``. Nothing but commands and acknowledgements goes through the pipes: no pickling
of observations, as the DataLoader hands batches over in shared memory.

The shared arrays are ``multiprocessing`` ``RawArray`` s: anonymous memory the workers inherit,
with no name in ``/dev/shm`` that a crash could leave behind. Nothing outlives the environment:
:meth:`ProcessVectorEnv.close` (also run by ``with``, by garbage collection and at interpreter
exit) asks the workers to exit, then terminates and finally kills any that do not; a worker that
raises sends its traceback and the main process closes every worker before raising
:class:`VectorEnvError`; a worker whose parent disappears exits by itself.
"""

import multiprocessing
import multiprocessing.connection
import os
import signal
import time
import traceback
import weakref

import numpy as np

from ...engine.threads import cap_process_threads
from ...errors import ArgumentError, MLSysError
from .base import VectorEnv, env_seeds
from .sync import SyncVectorEnv

_PARENT_CHECK_S = 1.0
_GRACE_S = 1.0


class VectorEnvError(MLSysError, RuntimeError):
    """A worker of a :class:`ProcessVectorEnv` failed (its traceback is in the message) or died;
    the environment has closed every worker."""


def _worker(index, env_fns, lo, hi, shared, conn, parent):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the main process's to handle
    cap_process_threads(1)
    try:
        obs, rewards, terminated, truncated, actions = (np.frombuffer(buf, dtype).reshape(shape)
                                                        for buf, dtype, shape in shared)
        envs = SyncVectorEnv(env_fns[lo:hi])
    except BaseException:
        _report(conn, index, lo, hi)
        return
    while True:
        try:
            if not conn.poll(_PARENT_CHECK_S):
                if os.getppid() != parent:
                    return
                continue
            command = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):  # the main process is gone
            return
        try:
            if command[0] == "step":
                o, r, te, tr, _ = envs.step(actions[lo:hi])
                obs[lo:hi], rewards[lo:hi], terminated[lo:hi], truncated[lo:hi] = o, r, te, tr
            elif command[0] == "reset":
                obs[lo:hi], _ = envs.reset(seed=command[1], options=command[2])
            else:  # "close"
                envs.close()
                return
        except BaseException:
            _report(conn, index, lo, hi)
            return
        try:
            conn.send(("ok",))
        except OSError:
            return


def _report(conn, index, lo, hi):
    try:
        conn.send(("error", f"worker {index} (environments {lo}..{hi - 1}):\n"
                   + traceback.format_exc()))
    except OSError:
        pass


def _shutdown(processes, conns, owner):
    if os.getpid() != owner:  # a forked child's copy: not its processes
        return
    for c in conns:
        try:
            c.send(("close",))
        except OSError:
            pass
    deadline = time.monotonic() + _GRACE_S
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.exitcode is None:
            p.terminate()
    for p in processes:
        p.join(2.0)
        if p.exitcode is None:
            p.kill()
            p.join(2.0)
    for c in conns:
        c.close()


class ProcessVectorEnv(VectorEnv):
    """``len(env_fns)`` copies stepped by ``num_workers`` processes (contiguous blocks).

    Args:
        env_fns: functions that each make one environment (run in the workers; with a
            ``spawn`` context they must be picklable).
        num_workers: worker processes (default: one per core, at most one per copy).
        context: a ``multiprocessing`` start method (default ``fork`` where it exists).

    Raises:
        VectorEnvError: a worker raised (message: its traceback) or died.
    """

    def __init__(self, env_fns, num_workers=None, context=None):
        env_fns = list(env_fns)
        if not env_fns:
            raise ArgumentError("ProcessVectorEnv: needs at least one environment function")
        self.num_envs = n = len(env_fns)
        num_workers = min(n, num_workers or os.cpu_count() or 1)
        if int(num_workers) != num_workers or num_workers < 1:
            raise ArgumentError(f"ProcessVectorEnv: num_workers must be a positive integer, "
                                f"got {num_workers!r}")
        probe = env_fns[0]()
        self._set_spaces(probe.observation_space, probe.action_space)
        probe.close()
        if context is None:
            context = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        ctx = multiprocessing.get_context(context)
        space = self.single_observation_space
        layout = [(space.dtype, (n, *space.shape)), (np.float64, (n,)), (np.bool_, (n,)),
                  (np.bool_, (n,)), (np.int64, (n,))]
        shared = [(ctx.RawArray("b", max(1, int(np.prod(shape)) * np.dtype(dt).itemsize)),
                   dt, shape) for dt, shape in layout]
        (self._obs, self._rewards, self._terminated, self._truncated,
         self._actions) = (np.frombuffer(buf, dt).reshape(shape) for buf, dt, shape in shared)
        self.num_workers = num_workers
        self._bounds = bounds = np.linspace(0, n, num_workers + 1).round().astype(int).tolist()
        self._processes, self._conns = [], []
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._conns,
                                           os.getpid())
        try:
            for w in range(num_workers):
                mine, theirs = ctx.Pipe()
                p = ctx.Process(target=_worker, daemon=True, name=f"rl-vector-worker-{w}",
                                args=(w, env_fns, bounds[w], bounds[w + 1], shared,
                                      theirs, os.getpid()))
                p.start()
                theirs.close()
                self._processes.append(p)
                self._conns.append(mine)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self):
        """The worker processes' ids."""
        return [p.pid for p in self._processes]

    def _exchange(self, messages, where):
        """Send worker ``w`` ``messages[w]``, then wait for every acknowledgement; on any
        failure close every worker and raise :class:`VectorEnvError`."""
        if not self._finalizer.alive:
            raise VectorEnvError(f"ProcessVectorEnv.{where}: the environment is closed")
        try:
            for c, m in zip(self._conns, messages):
                try:
                    c.send(m)
                except OSError:  # the worker is gone; its last words, if any, are read below
                    pass
            waiting = dict(zip(self._conns, self._processes))
            while waiting:
                for c in multiprocessing.connection.wait(list(waiting), timeout=1.0):
                    p = waiting.pop(c)
                    try:
                        reply = c.recv()
                    except (EOFError, OSError):
                        raise VectorEnvError(f"ProcessVectorEnv.{where}: worker {p.name} died "
                                             f"(exit code {p.exitcode})") from None
                    if reply[0] == "error":
                        raise VectorEnvError(f"ProcessVectorEnv.{where}: {reply[1]}")
                for c, p in list(waiting.items()):
                    if not p.is_alive() and not c.poll():
                        raise VectorEnvError(f"ProcessVectorEnv.{where}: worker {p.name} died "
                                             f"(exit code {p.exitcode})")
        except BaseException:
            self.close()
            raise

    def reset(self, *, seed=None, options=None):
        """Reset every copy (copy ``i`` with ``seed + i``). Returns ``(obs, {})``."""
        seeds = env_seeds(seed, self.num_envs, "ProcessVectorEnv.reset")
        b = self._bounds
        self._exchange([("reset", seeds[b[w]:b[w + 1]], options)
                        for w in range(self.num_workers)], "reset")
        return self._obs.copy(), {}

    def step(self, actions):
        """Step every copy (NEXT_STEP auto-reset, as :class:`SyncVectorEnv`)."""
        self._actions[:] = self._check_actions(actions, "ProcessVectorEnv.step")
        self._exchange([("step",)] * self.num_workers, "step")
        return (self._obs.copy(), self._rewards.copy(), self._terminated.copy(),
                self._truncated.copy(), {})

    def close(self):
        """Stop every worker (idempotent)."""
        if self._finalizer.alive:
            self._finalizer()

    @property
    def closed(self):
        return not self._finalizer.alive
