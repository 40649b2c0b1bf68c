"""Differential privacy for federated training: local DP on updates, and DP-SGD.

* **Local DP** (本地差分隐私): each client clips its update ``delta = w_trained - w_global`` and
  adds noise before it leaves the device, ``W_p = W + G``: Gaussian noise of standard deviation
  ``noise * clip`` per coordinate on an L2-clipped update, or Laplace noise of scale
  ``noise * clip`` on an L1-clipped update (then each upload is ``epsilon = 2 / noise``-DP
  against replacing the client's data: the clipped update moves at most ``2 clip`` in L1).
  The server averages ``n`` such uploads, so the noise in the average shrinks like
  ``1 / sqrt(n)``: with enough clients it mostly cancels.
* **DP-SGD** (Abadi et al. 2016): clip every example's gradient to ``clip`` in L2
  (``ml.per_example_grad`` gives them from one backward pass), sum, add
  ``N(0, sigma^2 clip^2)`` per coordinate, divide by the expected batch size. With Poisson
  sampling at rate ``q``, :mod:`.accountant` gives its ``(epsilon, delta)``.
"""

from __future__ import annotations

import math

import numpy as np

from ..engine.per_example import per_example_grad
from ..errors import ArgumentError
from . import model as mdl
from .accountant import RDPAccountant

__all__ = ["LocalDP", "clip", "dp_sgd_step", "dp_sgd_train", "global_norm"]


def global_norm(tree, ord=2):
    """The L2 (or L1 with ``ord=1``) norm of all arrays of a dict together."""
    if ord == 1:
        return float(sum(np.abs(np.asarray(v, dtype=np.float64)).sum() for v in tree.values()))
    return math.sqrt(sum(float((np.asarray(v, dtype=np.float64) ** 2).sum())
                         for v in tree.values()))


def clip(update, max_norm, ord=2):
    """``update * min(1, max_norm / ||update||)`` over all arrays together; returns
    ``(clipped, norm)``."""
    if not max_norm > 0:
        raise ArgumentError(f"clip: max_norm={max_norm!r} must be > 0")
    norm = global_norm(update, ord)
    scale = min(1.0, max_norm / norm) if norm > 0 else 1.0
    return {k: np.asarray(v) * np.asarray(v).dtype.type(scale) for k, v in update.items()}, norm


class LocalDP:
    """A client-side update transform: clip the update, add Gaussian or Laplace noise.

    Args:
        mechanism: ``"gaussian"`` (L2 clipping, std ``noise * clip``) or ``"laplace"`` (L1
            clipping, scale ``noise * clip``).
        clip: the clipping norm ``C``.
        noise: the noise multiplier (noise scale over ``C``); 0 clips only.

    ``LocalDP(...)(global, trained, rng)`` returns ``global + clipped delta + noise`` (what
    :class:`~.server.Server` calls as ``update_transform``).
    """

    def __init__(self, mechanism="gaussian", clip=1.0, noise=1.0):
        if mechanism not in ("gaussian", "laplace"):
            raise ArgumentError(f"LocalDP: mechanism={mechanism!r} is not 'gaussian' or "
                                f"'laplace'")
        if not clip > 0 or not noise >= 0:
            raise ArgumentError(f"LocalDP: need clip > 0 and noise >= 0, got {clip}, {noise}")
        self.mechanism, self.clip, self.noise = mechanism, float(clip), float(noise)

    def __repr__(self):
        return f"LocalDP({self.mechanism!r}, clip={self.clip}, noise={self.noise})"

    @property
    def epsilon(self):
        """Laplace: ``2 / noise`` per upload (pure DP); Gaussian: None (see the accountant)."""
        if self.mechanism == "laplace" and self.noise > 0:
            return 2.0 / self.noise
        return None

    def __call__(self, global_params, trained, rng):
        delta = {k: np.asarray(trained[k], dtype=np.float64) - np.asarray(global_params[k])
                 for k in sorted(global_params)}
        delta, _ = clip(delta, self.clip, ord=1 if self.mechanism == "laplace" else 2)
        scale = self.noise * self.clip
        out = {}
        for k in sorted(delta):
            shape = delta[k].shape
            noise = (rng.normal(0.0, scale, shape) if self.mechanism == "gaussian"
                     else rng.laplace(0.0, scale, shape)) if scale > 0 else 0.0
            dtype = np.asarray(global_params[k]).dtype
            out[k] = (np.asarray(global_params[k]) + delta[k] + noise).astype(dtype)
        return out


def dp_sgd_step(params, x, y, *, lr, clip, sigma, rng, expected_batch=None,
                loss_fn=mdl.per_example_loss):
    """One DP-SGD step on the batch ``(x, y)``.

    Args:
        params: the model (dict of arrays).
        x, y: the batch (rows sampled by the caller; Poisson sampling in
            :func:`dp_sgd_train`).
        lr: learning rate. clip: per-example L2 clipping norm ``C``.
        sigma: noise multiplier: noise std is ``sigma * C``.
        rng: a numpy Generator; the noise is ``rng.standard_normal(shape)`` per parameter, in
            sorted key order.
        expected_batch: the divisor (``q N`` under Poisson sampling; default ``len(x)``).
        loss_fn: per-example loss for :func:`ml.per_example_grad` (batch-of-one form).

    Returns:
        ``(new_params, info)``: ``info`` holds the per-example gradient ``norms`` and the
        noisy mean gradient ``grad``.
    """
    if not clip > 0 or not sigma >= 0 or not lr > 0:
        raise ArgumentError(f"dp_sgd_step: need lr > 0, clip > 0, sigma >= 0; got {lr}, "
                            f"{clip}, {sigma}")
    keys = sorted(params)
    dtype = np.asarray(params[keys[0]]).dtype
    count = len(x)
    divisor = float(count if expected_batch is None else expected_batch)
    if count:
        grads = per_example_grad(loss_fn)(params, np.asarray(x, dtype=dtype), np.asarray(y))
        flat = np.concatenate([grads[k].reshape(count, -1) for k in keys], axis=1)
        norms = np.sqrt((flat.astype(np.float64) ** 2).sum(axis=1))
        factor = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    else:
        norms = np.zeros(0)
    total, out = {}, {}
    for k in keys:
        shape = np.shape(params[k])
        summed = (np.tensordot(factor, grads[k].astype(np.float64), axes=1) if count
                  else np.zeros(shape))
        total[k] = (summed + sigma * clip * rng.standard_normal(shape)) / divisor
        out[k] = (np.asarray(params[k]) - lr * total[k]).astype(dtype)
    return out, {"norms": norms, "grad": total}


def dp_sgd_train(params, x, y, *, steps, q, lr, clip, sigma, delta=1e-5, seed=0,
                 loss_fn=mdl.per_example_loss):
    """DP-SGD with Poisson sampling (each row joins a step's batch with probability ``q``).

    Returns:
        ``(params, epsilon)``: the trained model and its ``(epsilon, delta)`` guarantee from
        the RDP accountant.
    """
    if not 0 < q <= 1:
        raise ArgumentError(f"dp_sgd_train: q={q!r} must be in (0, 1]")
    rng = np.random.default_rng(seed)
    acc = RDPAccountant()
    n = len(y)
    for _ in range(int(steps)):
        rows = np.flatnonzero(rng.random(n) < q)
        params, _ = dp_sgd_step(params, x[rows], y[rows], lr=lr, clip=clip, sigma=sigma,
                                rng=rng, expected_batch=q * n, loss_fn=loss_fn)
        acc.step(q, sigma)
    return params, acc.epsilon(delta)[0]
