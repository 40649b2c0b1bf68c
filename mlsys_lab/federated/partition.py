"""Splitting one data set over clients: IID, Dirichlet label skew, quantity skew.

Every partition returns one sorted int64 index array per client, and every sample appears in
exactly one of them (the tests check this for many random cases).
"""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError

__all__ = ["dirichlet", "iid", "label_counts", "quantity_skew"]


def _check(where, n, num_clients, **positive):
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) \
            or num_clients < 1:
        raise ArgumentError(f"{where}: num_clients={num_clients!r} must be an int >= 1")
    if num_clients > n:
        raise ArgumentError(f"{where}: {num_clients} clients for {n} samples: every client "
                            f"needs at least one")
    for name, value in positive.items():
        if not (isinstance(value, (int, float, np.floating)) and value > 0):
            raise ArgumentError(f"{where}: {name}={value!r} must be a number > 0")


def _split_by_sizes(order, sizes):
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [np.sort(order[a:b]).astype(np.int64) for a, b in zip(bounds[:-1], bounds[1:])]


def iid(n, num_clients, seed=0):
    """A seeded shuffle of ``range(n)`` cut into ``num_clients`` near-equal parts."""
    n = int(n)
    _check("partition.iid", n, num_clients)
    order = np.random.default_rng(seed).permutation(n)
    sizes = np.full(num_clients, n // num_clients)
    sizes[:n % num_clients] += 1
    return _split_by_sizes(order, sizes)


def quantity_skew(n, num_clients, beta=0.5, seed=0):
    """IID labels, unequal sizes: client shares drawn from ``Dirichlet(beta)`` (small ``beta``:
    a few clients hold most of the data), every client at least one sample."""
    n = int(n)
    _check("partition.quantity_skew", n, num_clients, beta=beta)
    rng = np.random.default_rng(seed)
    share = rng.dirichlet(np.full(num_clients, float(beta)))
    extra = n - num_clients
    sizes = 1 + np.floor(share * extra).astype(np.int64)
    rest = n - sizes.sum()          # the rounding remainder, to the largest fractional parts
    frac = share * extra - np.floor(share * extra)
    sizes[np.argsort(-frac, kind="stable")[:rest]] += 1
    return _split_by_sizes(rng.permutation(n), sizes)


def dirichlet(labels, num_clients, alpha=1.0, seed=0, min_size=1):
    """Label skew: for each class, its samples are shared out by proportions drawn from
    ``Dirichlet(alpha)`` over the clients (Hsu et al. 2019). ``alpha`` 0.1: most clients see
    one or two classes; 100: close to IID. Redrawn (a new draw of the same seeded generator)
    until every client has at least ``min_size`` samples; after 20 short draws (tiny data), a
    short client takes random samples from the largest one.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ArgumentError(f"partition.dirichlet: labels must be a 1-D int array, got "
                            f"{labels.dtype} of shape {labels.shape}")
    n = len(labels)
    _check("partition.dirichlet", n, num_clients, alpha=alpha)
    if min_size * num_clients > n:
        raise ArgumentError(f"partition.dirichlet: min_size={min_size} x {num_clients} clients "
                            f"> {n} samples")
    rng = np.random.default_rng(seed)
    classes = np.unique(labels)
    for _attempt in range(20):
        parts = [[] for _ in range(num_clients)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            share = rng.dirichlet(np.full(num_clients, float(alpha)))
            cuts = (np.cumsum(share)[:-1] * len(idx)).astype(np.int64)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        parts = [np.concatenate(part) for part in parts]
        if min(len(p) for p in parts) >= min_size:
            break
    else:
        # still short after 20 draws (tiny data, small alpha): the last draw, with clients
        # below min_size topped up by random samples of the currently largest client
        for k in range(num_clients):
            while len(parts[k]) < min_size:
                big = int(np.argmax([len(p) for p in parts]))
                take = int(rng.integers(len(parts[big])))
                parts[k] = np.append(parts[k], parts[big][take])
                parts[big] = np.delete(parts[big], take)
    return [np.sort(p).astype(np.int64) for p in parts]


def label_counts(labels, parts, num_classes=None):
    """``(clients, classes)`` counts of each label on each client."""
    labels = np.asarray(labels)
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    return np.stack([np.bincount(labels[p], minlength=k) for p in parts])
