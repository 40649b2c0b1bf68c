"""An IMPALA-style actor-learner system on real processes.

Actors (worker processes) play the environment with their copy of the policy and put fixed-length
unrolls on a bounded queue; the learner (this process) takes them off, corrects for the policy
lag with V-trace, takes one gradient step per unroll and publishes the new parameters in shared
memory, where each actor picks them up at the start of its next unroll. The actors' copies are
therefore stale by however many updates happened meanwhile (``stats["lag"]``).

Shutdown: :meth:`ActorLearner.close` (also on ``with`` exit, after an error, and when the object
is collected) sets a stop event, drains the queue so no actor stays blocked in ``put``, joins
every actor with a timeout and terminates any that did not exit. An exception inside an actor
is sent back with its traceback and raised in the learner as :class:`ActorError`. An actor
whose learner process died (killed, say) notices it is orphaned and exits by itself.
"""

import multiprocessing as mp
import os
import queue as queue_module
import time
import traceback
import weakref

import numpy as np

from ... import ops
from ...engine.threads import limit_threads
from ...errors import ArgumentError, MLSysError
from ..agents.networks import GradStep, call, forward
from ..agents.ppo import ActorCritic
from .vtrace import vtrace


class ActorError(MLSysError, RuntimeError):
    """An actor process failed (the message holds its traceback) or died."""


def _layers(flat, shapes):
    """Split the flat parameter vector into arrays of ``shapes``."""
    out, at = [], 0
    for shape in shapes:
        n = int(np.prod(shape))
        out.append(flat[at:at + n].reshape(shape))
        at += n
    return out


def numpy_policy(arrays, obs):
    """The actor's forward pass of the policy MLP (alternating weight, bias arrays; tanh
    between layers) in plain numpy: actors need no tape and no compiler."""
    h = obs
    for i in range(0, len(arrays), 2):
        h = h @ arrays[i] + arrays[i + 1]
        if i + 2 < len(arrays):
            h = np.tanh(h)
    return h


def log_softmax_rows(z):
    """log-softmax over the last axis, in numpy."""
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def orphaned(parent):
    """True once the process that started this one has gone (we were re-parented)."""
    return os.getppid() != parent


def actor_loop(actor_id, env_fn, shared, version, lock, shapes, n_pi, out_queue, errors,
               stop, unroll, n_envs, seed, gamma, fail_after, parent):
    """One actor process: play ``n_envs`` environments, ``unroll`` steps at a time; exits
    when ``stop`` is set or the learner's process has died."""
    try:
        rng = np.random.default_rng(seed)
        envs = [env_fn() for _ in range(n_envs)]
        obs = np.stack([np.asarray(e.reset(seed=seed * 1000 + i)[0], np.float32)
                        for i, e in enumerate(envs)])
        ep_ret = np.zeros(n_envs)
        seen, arrays, sent = -1, None, 0
        while not stop.is_set() and not orphaned(parent):
            with lock:
                if version.value != seen:
                    seen = version.value
                    arrays = [a.copy() for a in _layers(np.frombuffer(shared, np.float32),
                                                        shapes)]
            pi = arrays[:n_pi]
            o_buf = np.zeros((unroll + 1, n_envs, obs.shape[1]), np.float32)
            a_buf = np.zeros((unroll, n_envs), np.int64)
            lp_buf = np.zeros((unroll, n_envs), np.float32)
            r_buf = np.zeros((unroll, n_envs), np.float32)
            d_buf = np.zeros((unroll, n_envs), np.float32)
            finished = []
            for t in range(unroll):
                o_buf[t] = obs
                logp = log_softmax_rows(numpy_policy(pi, obs))
                u = rng.random((n_envs, 1))
                act = (np.exp(logp).cumsum(axis=1) < u).sum(axis=1).clip(0, logp.shape[1] - 1)
                a_buf[t], lp_buf[t] = act, logp[np.arange(n_envs), act]
                for j, env in enumerate(envs):
                    o, r, term, trunc, _ = env.step(int(act[j]))
                    ep_ret[j] += r
                    r_buf[t, j], d_buf[t, j] = r, 0.0 if (term or trunc) else gamma
                    if term or trunc:
                        finished.append(ep_ret[j])
                        ep_ret[j] = 0.0
                        o, _ = env.reset()
                    obs[j] = o
            o_buf[unroll] = obs
            if fail_after is not None and sent >= fail_after:
                raise RuntimeError(f"actor {actor_id}: injected failure after {sent} unrolls")
            item = (actor_id, seen, o_buf, a_buf, lp_buf, r_buf, d_buf,
                    np.asarray(finished, np.float64))
            while not stop.is_set():
                try:
                    out_queue.put(item, timeout=0.05)
                    sent += 1
                    break
                except queue_module.Full:
                    if orphaned(parent):
                        return
    except BaseException:  # noqa: BLE001 - every failure goes back to the learner
        errors.put((actor_id, traceback.format_exc()))
    finally:
        out_queue.cancel_join_thread()


def impala_loss(model, params, obs, actions_onehot, pg_advantages, vs, vf_coef=0.5,
                ent_coef=0.01):
    """IMPALA's loss: ``-E[rho_s A_s log pi(a_s|x_s)] + vf_coef/2 E[(v_s - V(x_s))^2] -
    ent_coef * entropy`` with the V-trace targets ``v_s`` and advantages ``A_s``."""
    logits, value = call(model, params, obs)
    logp_all = ops.log_softmax(logits, axis=1)
    logp = ops.sum(logp_all * actions_onehot, axis=1)
    pg = -ops.mean(pg_advantages * logp)
    v = ops.reshape(value, (-1,))
    vl = 0.5 * ops.mean((vs - v) * (vs - v))
    ent = -ops.mean(ops.sum(ops.exp(logp_all) * logp_all, axis=1))
    return pg + vf_coef * vl - ent_coef * ent


def shutdown_workers(procs, stop, q, errors):
    """Stop ``procs``: set ``stop``, drain ``q`` while they exit, join, terminate stragglers,
    close both queues."""
    stop.set()
    deadline = time.monotonic() + 5.0
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        try:
            while True:
                q.get_nowait()
        except (queue_module.Empty, OSError, ValueError):
            pass
        for p in procs:
            p.join(timeout=0.02)
    for p in procs:
        if p.is_alive():
            p.terminate()
            p.join(timeout=2.0)
        if p.is_alive():  # pragma: no cover - a process that ignores SIGTERM
            p.kill()
            p.join()
    for chan in (q, errors):
        chan.close()
        chan.join_thread()


class ActorLearner:
    """IMPALA on this machine: ``n_actors`` processes, one learner, a bounded queue.

    Args:
        env_fn: makes one environment (Gymnasium API, discrete actions); must be picklable
            where the start method is not ``fork``.
        n_actors: actor processes.
        unroll: steps per unroll (IMPALA's n).
        envs_per_actor: environments each actor steps side by side.
        queue_size: unrolls the queue holds before actors block (back-pressure).
        hidden: the policy and value MLPs' hidden sizes.
        lr, gamma, vf_coef, ent_coef, max_grad_norm: the learner's settings.
        correction: ``"vtrace"`` (clipped importance weights) or ``"none"`` (treat the stale
            actors' data as on-policy: the ablation).
        seed: seeds the network and each actor (``seed + 1 + actor``).
        fail_after: testing aid: actor 0 raises after sending this many unrolls.
        start_method: multiprocessing start method (default: ``fork`` where available).

    Example:
        >>> with ActorLearner(CartPole, n_actors=2) as system:   # doctest: +SKIP
        ...     stats = system.run(updates=200)
    """

    def __init__(self, env_fn, n_actors=2, unroll=32, envs_per_actor=4, queue_size=8,
                 hidden=(64, 64), lr=1e-3, gamma=0.99, vf_coef=0.5, ent_coef=0.01,
                 max_grad_norm=0.5, correction="vtrace", seed=0, fail_after=None,
                 start_method=None):
        if not isinstance(n_actors, int) or n_actors < 1:
            raise ArgumentError(f"ActorLearner: n_actors must be a positive int, got "
                                f"{n_actors!r}")
        if correction not in ("vtrace", "none"):
            raise ArgumentError(f"ActorLearner: correction={correction!r}, expected 'vtrace' "
                                f"or 'none'")
        probe = env_fn()
        obs_size = int(np.prod(probe.observation_space.shape))
        self.n_actions = int(probe.action_space.n)
        if hasattr(probe, "close"):
            probe.close()
        self.env_fn, self.n_actors, self.unroll, self.n_envs = env_fn, n_actors, unroll, \
            envs_per_actor
        self.gamma, self.correction, self.seed = gamma, correction, seed
        self.model = ActorCritic(obs_size, self.n_actions, hidden, rng=seed)
        self.obs_size = obs_size
        self.vf_coef, self.ent_coef = vf_coef, ent_coef
        self._names = [k for k, _ in self.model.named_parameters()]
        params = dict(self.model.named_parameters())
        pi_names = [k for k in self._names if k.startswith("pi.")]
        self._n_pi = len(pi_names)
        self._order = pi_names + [k for k in self._names if not k.startswith("pi.")]
        self._shapes = [params[k].shape for k in self._order]
        size = sum(int(np.prod(s)) for s in self._shapes)
        if start_method is None:
            start_method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        ctx = mp.get_context(start_method)
        self._shared = ctx.RawArray("f", size)
        self._version = ctx.RawValue("q", 0)
        self._lock = ctx.Lock()
        self._queue = ctx.Queue(maxsize=queue_size)
        self._errors = ctx.Queue()
        self._stop = ctx.Event()
        self._publish()
        self.lr, self.max_grad_norm = lr, max_grad_norm
        self._step = None
        self.updates = 0
        self.procs = [ctx.Process(target=actor_loop, name=f"rl-actor-{i}", daemon=True,
                                  args=(i, env_fn, self._shared, self._version, self._lock,
                                        self._shapes, self._n_pi, self._queue, self._errors,
                                        self._stop, unroll, envs_per_actor, seed + 1 + i, gamma,
                                        fail_after if i == 0 else None, os.getpid()))
                      for i in range(n_actors)]
        for p in self.procs:
            p.start()
        self._finalizer = weakref.finalize(self, shutdown_workers, self.procs, self._stop,
                                           self._queue, self._errors)

    # -- parameters -------------------------------------------------------------------------
    def _publish(self):
        params = dict(self.model.named_parameters())
        flat = np.concatenate([params[k].data.reshape(-1) for k in self._order])
        with self._lock:
            np.frombuffer(self._shared, np.float32)[:] = flat
            self._version.value += 1

    # -- the learner ------------------------------------------------------------------------
    def _check_actors(self):
        try:
            actor, tb = self._errors.get_nowait()
        except queue_module.Empty:
            dead = [p for p in self.procs if not p.is_alive()]
            if dead and not self._stop.is_set():
                p = dead[0]
                raise ActorError(f"ActorLearner: actor process {p.name} (pid {p.pid}) died "
                                 f"with exit code {p.exitcode}") from None
            return
        raise ActorError(f"ActorLearner: actor {actor} failed:\n{tb}")

    def _get(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            self._check_actors()
            try:
                return self._queue.get(timeout=0.05)
            except queue_module.Empty:
                if time.monotonic() > deadline:
                    raise ActorError(f"ActorLearner: no unroll arrived within {timeout} s") \
                        from None

    def learn_from(self, item):
        """One V-trace update from one unroll; returns the policy lag (updates)."""
        _, version, o, a, mu_logp, r, d, _ = item
        t_, n_ = a.shape
        flat_obs = o.reshape(-1, self.obs_size)
        logits = forward(self.model.pi, flat_obs).reshape(t_ + 1, n_, -1)
        values = forward(self.model.v, flat_obs).reshape(t_ + 1, n_)
        pi_logp = np.take_along_axis(log_softmax_rows(logits[:t_]), a[..., None], axis=2)[..., 0]
        if self.correction == "vtrace":
            vt = vtrace(mu_logp, pi_logp, r, d, values[:t_], values[t_])
        else:  # pretend the data is on-policy: every ratio 1
            vt = vtrace(pi_logp, pi_logp, r, d, values[:t_], values[t_])
        onehot = np.eye(self.n_actions, dtype=np.float32)[a.reshape(-1)]
        batch = (o[:t_].reshape(-1, self.obs_size), onehot,
                 vt.pg_advantages.reshape(-1).astype(np.float32),
                 vt.vs.reshape(-1).astype(np.float32))
        if self._step is None:
            self._step = GradStep(self.model, self._loss, batch, lr=self.lr,
                                  max_grad_norm=self.max_grad_norm)
        self._step(*batch)
        self._publish()
        self.updates += 1
        return self._version.value - 1 - version

    def _loss(self, params, obs, onehot, pg_adv, vs):
        return impala_loss(self.model, params, obs, onehot, pg_adv, vs, self.vf_coef,
                           self.ent_coef)

    def run(self, updates=None, seconds=None, timeout=60.0, learn=True):
        """Consume unrolls until ``updates`` updates or ``seconds`` have passed.

        Args:
            updates: stop after this many unrolls consumed.
            seconds: ... or after this much wall time.
            timeout: raise :class:`ActorError` if no unroll arrives for this long.
            learn: False only drains the queue (measures the actors' throughput alone).

        Returns:
            dict: ``frames`` (environment steps consumed), ``seconds``, ``frames_per_s``,
            ``updates``, ``lag`` (policy lag of each unroll, in updates), ``returns``
            (finished episodes' returns in arrival order), ``learn_seconds`` (time in the
            updates themselves, waiting for unrolls excluded).

        Raises:
            ActorError: an actor failed or died (every actor is stopped first).
        """
        if updates is None and seconds is None:
            raise ArgumentError("ActorLearner.run: give updates= or seconds=")
        stats = {"frames": 0, "updates": 0, "lag": [], "returns": [], "learn_seconds": 0.0}
        t0 = time.perf_counter()
        try:
            with limit_threads(blas=1):
                while (updates is None or stats["updates"] < updates) and \
                        (seconds is None or time.perf_counter() - t0 < seconds):
                    item = self._get(timeout)
                    stats["frames"] += item[2].shape[1] * self.unroll
                    stats["returns"].extend(item[7].tolist())
                    t_learn = time.perf_counter()
                    stats["lag"].append(self.learn_from(item) if learn else 0)
                    stats["learn_seconds"] += time.perf_counter() - t_learn
                    stats["updates"] += 1
        except BaseException:
            self.close()
            raise
        stats["seconds"] = time.perf_counter() - t0
        stats["frames_per_s"] = stats["frames"] / stats["seconds"]
        return stats

    def close(self):
        """Stop and join every actor (terminating any that do not exit); idempotent."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
