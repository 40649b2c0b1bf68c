"""Local training: plain SGD on many clients at once, and the centralised reference.

Every client sampled in a round starts from the same global model and runs ``epochs`` passes
of minibatch SGD over its own data (reshuffled each epoch by its own seeded generator;
``ceil(n_k / batch_size)`` steps per epoch, the last batch smaller). The clients are
independent, so they train together: their parameters are stacked on a leading client axis
(:func:`.model.stack`), step ``s`` gathers batch ``s`` of every client into a ``(C, B, in)``
array (padded rows masked out), and one ``ml.value_and_grad`` of the sum of the clients' mean
losses gives every client its own gradient (each client's parameters touch only its own
loss). A client whose epoch has fewer steps than the longest stops updating (its step is
masked). FedProx (Li et al. 2020) adds ``mu/2 ||w - w_global||^2`` to each local objective.
"""

from __future__ import annotations

import numpy as np

from ..engine.autodiff import value_and_grad
from ..errors import ArgumentError
from . import model as mdl

__all__ = ["centralised", "client_orders", "local_sgd"]


def _stacked_loss(params, x, y, mask, inv_count):
    nll = mdl.per_example_loss(params, x, y)            # (C, B)
    return ((nll * mask).sum(axis=-1) * inv_count).sum()


_GRAD = value_and_grad(_stacked_loss)


def client_orders(sizes, epochs, seeds, shuffle=True):
    """The visiting order of each client's samples, epoch by epoch: a list (clients) of lists
    (epochs) of local positions ``0..n_k-1``; a permutation from ``default_rng(seed)`` per
    epoch, or ``range(n_k)`` when ``shuffle`` is off."""
    out = []
    for n, seed in zip(sizes, seeds):
        rng = np.random.default_rng(seed)
        out.append([rng.permutation(n) if shuffle else np.arange(n) for _ in range(epochs)])
    return out


def local_sgd(global_params, x, y, parts, *, epochs=1, batch_size=10, lr=0.1, mu=0.0,
              seeds=None, shuffle=True):
    """Train one copy of ``global_params`` per client on its samples, all at once.

    Args:
        global_params: the model every client starts from (dict of arrays).
        x, y: the whole data set (features ``(n, in)``, int labels ``(n,)``).
        parts: one index array per client (rows of ``x``).
        epochs, batch_size, lr: local SGD.
        mu: FedProx's proximal coefficient (0: plain FedAvg local training).
        seeds: one shuffle seed per client (default ``0..C-1``).
        shuffle: reshuffle each epoch (off: visit samples in index order).

    Returns:
        ``(stacked, num_examples)``: the trained models with a leading client axis
        (:func:`.model.unstack`) and each client's sample count.
    """
    count = len(parts)
    if count == 0:
        raise ArgumentError("local_sgd: no clients")
    if epochs < 1 or batch_size < 1 or not lr > 0 or mu < 0:
        raise ArgumentError(f"local_sgd: need epochs >= 1, batch_size >= 1, lr > 0, mu >= 0; "
                            f"got {epochs}, {batch_size}, {lr}, {mu}")
    sizes = np.array([len(p) for p in parts])
    if sizes.min() < 1:
        raise ArgumentError("local_sgd: every client needs at least one sample")
    seeds = list(range(count)) if seeds is None else list(seeds)
    dtype = np.asarray(global_params["W1"]).dtype
    classes = np.asarray(global_params[f"W{len(mdl.layer_names(global_params))}"]).shape[-1]
    onehot = np.eye(classes, dtype=dtype)[np.asarray(y)]
    x = np.asarray(x, dtype=dtype)
    stacked = mdl.stack(global_params, count)
    anchor = mdl.stack(global_params, count) if mu > 0 else None
    orders = client_orders(sizes, epochs, seeds, shuffle)
    steps = -(-sizes // batch_size)                       # ceil
    width = int(min(batch_size, sizes.max()))
    rows = np.arange(width)
    for epoch in range(epochs):
        # (C, n_max) global row numbers in this epoch's order, padded with row 0
        order = np.zeros((count, int(sizes.max())), dtype=np.int64)
        for c in range(count):
            order[c, :sizes[c]] = np.asarray(parts[c])[orders[c][epoch]]
        for s in range(int(steps.max())):
            pos = s * batch_size + rows                               # (width,)
            live = pos[None, :] < sizes[:, None]                      # (C, width)
            active = steps > s
            idx = order[:, np.minimum(pos, order.shape[1] - 1)]
            mask = live.astype(dtype)
            n_b = mask.sum(axis=1)
            inv = np.where(n_b > 0, 1.0 / np.maximum(n_b, 1), 0.0).astype(dtype)
            _, grads = _GRAD(stacked, x[idx], onehot[idx], mask, inv)
            for k, g in grads.items():
                g = np.asarray(g.data)
                if mu > 0:
                    g = g + mu * (stacked[k] - anchor[k])
                shape = (count,) + (1,) * (g.ndim - 1)
                stacked[k] = stacked[k] - (lr * active.reshape(shape)).astype(dtype) * g
    return stacked, sizes


def centralised(params, x, y, *, epochs=1, batch_size=10, lr=0.1, seed=0, shuffle=True):
    """The reference: minibatch SGD on all the data in one place (one client holding every
    sample, so the same step as the clients'); returns the trained parameters."""
    stacked, _ = local_sgd(params, x, y, [np.arange(len(y))], epochs=epochs,
                           batch_size=batch_size, lr=lr, seeds=[seed], shuffle=shuffle)
    return mdl.unstack(stacked, 0)
