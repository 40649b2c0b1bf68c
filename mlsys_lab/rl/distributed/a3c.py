"""A3C-style asynchronous updates (Mnih et al. 2016) on real processes: the contrast to IMPALA.

Every worker process holds the parameters in shared memory, plays one unroll with whatever
they are when it starts, computes an advantage actor-critic gradient *itself* (the eager tape,
:func:`mlsys_lab.value_and_grad`) and applies it to the shared parameters without a lock
(Hogwild, with A3C's shared RMSProp statistics). Nothing waits for anything: while one worker
computes, the others have usually moved the parameters on (``stats["lag"]``: the updates other
workers applied between a worker's read and its write). The main process only watches.
"""

import multiprocessing as mp
import os
import queue as queue_module
import time
import traceback
import weakref

import numpy as np

from ...engine.autodiff import value_and_grad
from ...engine.threads import set_num_threads
from ...errors import ArgumentError
from ..agents.advantage import gae
from ..agents.networks import forward
from ..agents.ppo import ActorCritic
from .actor_learner import ActorError, impala_loss, log_softmax_rows, orphaned, shutdown_workers


def _views(shared, shapes):
    out, at = [], 0
    flat = np.frombuffer(shared, np.float32)
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[at:at + n].reshape(shape))
        at += n
    return out


def a3c_worker(worker_id, env_fn, shared, square, version, lock, names, shapes, hidden,
               out_queue, errors, stop, unroll, seed, gamma, lr, alpha, eps, vf_coef, ent_coef,
               max_grad_norm, parent):
    """One A3C worker: play, compute the gradient, apply it to the shared parameters; exits
    when ``stop`` is set or the main process has died."""
    try:
        set_num_threads(blas=1)
        rng = np.random.default_rng(seed)
        env = env_fn()
        obs = np.asarray(env.reset(seed=seed)[0], np.float32)
        probe = env.observation_space.shape[0], env.action_space.n
        model = ActorCritic(probe[0], probe[1], hidden, rng=0)
        params = dict(model.named_parameters())
        theta, g2 = _views(shared, shapes), _views(square, shapes)
        ep_ret = 0.0

        def loss(p, o, onehot, adv, ret):
            return impala_loss(model, p, o, onehot, adv, ret, vf_coef, ent_coef)

        grad_fn = value_and_grad(loss, argnums=0)
        while not stop.is_set() and not orphaned(parent):
            read = version.value
            for name, view in zip(names, theta):
                params[name].data[...] = view  # a racy copy, as Hogwild reads
            o_buf = np.zeros((unroll, obs.shape[0]), np.float32)
            a_buf = np.zeros(unroll, np.int64)
            r_buf = np.zeros(unroll, np.float32)
            d_buf = np.zeros(unroll, np.float32)
            finished = []
            for t in range(unroll):
                o_buf[t] = obs
                p = np.exp(log_softmax_rows(forward(model.pi, obs[None]))[0])
                a = int(min(np.searchsorted(p.cumsum(), rng.random()), len(p) - 1))
                obs, r, term, trunc, _ = env.step(a)
                obs = np.asarray(obs, np.float32)
                ep_ret += r
                if trunc and not term:
                    r += gamma * float(forward(model.v, obs[None])[0, 0])
                a_buf[t], r_buf[t], d_buf[t] = a, r, float(term or trunc)
                if term or trunc:
                    finished.append(ep_ret)
                    ep_ret = 0.0
                    obs = np.asarray(env.reset()[0], np.float32)
            values = forward(model.v, o_buf)[:, 0]
            last = float(forward(model.v, obs[None])[0, 0])
            adv, ret = gae(r_buf, values, d_buf, last, gamma, 1.0)
            onehot = np.eye(len(p), dtype=np.float32)[a_buf]
            _, grads = grad_fn(params, o_buf, onehot, adv.astype(np.float32),
                               ret.astype(np.float32))
            grads = [np.asarray(getattr(grads[n], "data", grads[n]), np.float32) for n in names]
            norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads))
            scale = min(1.0, max_grad_norm / (norm + 1e-6))
            for view, sq, g in zip(theta, g2, grads):  # Hogwild: no lock around the update
                g = g * scale
                sq *= alpha
                sq += (1 - alpha) * g * g
                view -= lr * g / (np.sqrt(sq) + eps)
            with lock:
                version.value += 1
                applied = version.value
            item = (worker_id, applied - 1 - read, unroll, np.asarray(finished, np.float64))
            while not stop.is_set():
                try:
                    out_queue.put(item, timeout=0.05)
                    break
                except queue_module.Full:
                    if orphaned(parent):
                        return
    except BaseException:  # noqa: BLE001 - every failure goes back to the main process
        errors.put((worker_id, traceback.format_exc()))
    finally:
        out_queue.cancel_join_thread()


class A3C:
    """A3C on this machine: ``n_workers`` processes updating shared parameters asynchronously.

    Args:
        env_fn: makes one environment (Gymnasium API, discrete actions).
        n_workers: worker processes. unroll: steps per update (A3C's t_max).
        hidden: the policy and value MLPs' hidden sizes.
        lr, alpha, eps: shared RMSProp. gamma, vf_coef, ent_coef, max_grad_norm: the loss.
        seed: seeds the network and each worker (``seed + 1 + worker``).
        start_method: multiprocessing start method (default ``fork`` where available).

    ``run`` and ``close`` behave as :class:`~.actor_learner.ActorLearner`'s; ``run`` reports
    the updates the workers applied, not updates made here.
    """

    def __init__(self, env_fn, n_workers=2, unroll=32, hidden=(64, 64), lr=7e-4, alpha=0.99,
                 eps=1e-5, gamma=0.99, vf_coef=0.5, ent_coef=0.01, max_grad_norm=0.5, seed=0,
                 start_method=None):
        if not isinstance(n_workers, int) or n_workers < 1:
            raise ArgumentError(f"A3C: n_workers must be a positive int, got {n_workers!r}")
        probe = env_fn()
        model = ActorCritic(int(np.prod(probe.observation_space.shape)),
                            int(probe.action_space.n), hidden, rng=seed)
        self.model = model
        params = dict(model.named_parameters())
        self._names = list(params)
        shapes = [params[k].shape for k in self._names]
        ctx = mp.get_context(start_method or ("fork" if "fork" in mp.get_all_start_methods()
                                              else "spawn"))
        size = sum(int(np.prod(s)) for s in shapes)
        self._shared, self._square = ctx.RawArray("f", size), ctx.RawArray("f", size)
        for view, name in zip(_views(self._shared, shapes), self._names):
            view[...] = params[name].data
        self._version, self._lock = ctx.RawValue("q", 0), ctx.Lock()
        self._queue, self._errors, self._stop = ctx.Queue(maxsize=64), ctx.Queue(), ctx.Event()
        self._shapes = shapes
        self.procs = [ctx.Process(target=a3c_worker, name=f"rl-a3c-{i}", daemon=True,
                                  args=(i, env_fn, self._shared, self._square, self._version,
                                        self._lock, self._names, shapes, tuple(hidden),
                                        self._queue, self._errors, self._stop, unroll,
                                        seed + 1 + i, gamma, lr, alpha, eps, vf_coef,
                                        ent_coef, max_grad_norm, os.getpid()))
                      for i in range(n_workers)]
        for p in self.procs:
            p.start()
        self._finalizer = weakref.finalize(self, shutdown_workers, self.procs, self._stop,
                                           self._queue, self._errors)

    def sync_model(self):
        """Copy the shared parameters into ``self.model`` (to evaluate it)."""
        params = dict(self.model.named_parameters())
        for view, name in zip(_views(self._shared, self._shapes), self._names):
            params[name].data[...] = view
        return self.model

    def run(self, updates=None, seconds=None, timeout=60.0):
        """Watch until the workers applied ``updates`` updates or ``seconds`` passed; returns
        ``frames``, ``seconds``, ``frames_per_s``, ``updates``, ``lag``, ``returns``.

        Raises:
            ActorError: a worker failed or died (every worker is stopped first).
        """
        if updates is None and seconds is None:
            raise ArgumentError("A3C.run: give updates= or seconds=")
        stats = {"frames": 0, "updates": 0, "lag": [], "returns": []}
        t0 = time.perf_counter()
        try:
            while (updates is None or stats["updates"] < updates) and \
                    (seconds is None or time.perf_counter() - t0 < seconds):
                item = self._get(timeout)
                stats["frames"] += item[2]
                stats["lag"].append(item[1])
                stats["returns"].extend(item[3].tolist())
                stats["updates"] += 1
        except BaseException:
            self.close()
            raise
        stats["seconds"] = time.perf_counter() - t0
        stats["frames_per_s"] = stats["frames"] / stats["seconds"]
        return stats

    def _get(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            try:
                worker, tb = self._errors.get_nowait()
                raise ActorError(f"A3C: worker {worker} failed:\n{tb}")
            except queue_module.Empty:
                pass
            dead = [p for p in self.procs if not p.is_alive()]
            if dead:
                raise ActorError(f"A3C: worker process {dead[0].name} died with exit code "
                                 f"{dead[0].exitcode}")
            try:
                return self._queue.get(timeout=0.05)
            except queue_module.Empty:
                if time.monotonic() > deadline:
                    raise ActorError(f"A3C: no update arrived within {timeout} s") from None

    def close(self):
        """Stop and join every worker (terminating any that do not exit); idempotent."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
