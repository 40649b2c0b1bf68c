"""Server strategies with the shape of Flower's ``Strategy``.

A strategy decides three things per round (Flower's method names):

* ``configure_fit(server_round, parameters, num_clients, rng)`` — which clients train and with
  what local settings (a list of :class:`FitIns`);
* ``aggregate_fit(server_round, results, failures)`` — the next global model from the
  :class:`FitRes` that reached the server (``failures``: the sampled clients that did not);
* ``evaluate(server_round, parameters)`` — centralised evaluation (``evaluate_fn``), or None.

:class:`FedAvg` (McMahan et al. 2017) averages the returned models weighted by sample count;
:class:`FedProx` (Li et al. 2020) is FedAvg with a proximal term in every local objective;
:class:`FedAvgM` and :class:`FedAdam` (Hsu et al. 2019; Reddi et al. 2021) treat
``average − current`` as a pseudo-gradient for a server-side optimiser.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import ArgumentError, ShapeError

__all__ = ["FedAdam", "FedAvg", "FedAvgM", "FedProx", "FitIns", "FitRes", "Strategy",
           "weighted_average"]


@dataclass
class FitIns:
    """An instruction to one client: its id and the local training settings."""

    cid: int
    config: dict = field(default_factory=dict)


@dataclass
class FitRes:
    """What one client returned: its id, trained parameters and number of training samples."""

    cid: int
    parameters: dict
    num_examples: int
    metrics: dict = field(default_factory=dict)


def weighted_average(models, num_examples):
    """``sum_k n_k w_k / sum_k n_k`` over a list of parameter dicts (FedAvg's aggregate).

    Each weight ``n_k / N`` is formed first, so a single model comes back exactly.
    """
    models = list(models)
    counts = np.asarray(num_examples, dtype=np.float64)
    if not models or counts.shape != (len(models),):
        raise ArgumentError(f"weighted_average: need one sample count per model, got "
                            f"{len(models)} models and counts of shape {counts.shape}")
    if np.any(counts < 0) or counts.sum() <= 0:
        raise ArgumentError(f"weighted_average: counts must be >= 0 with a positive sum, got "
                            f"{counts.tolist()}")
    keys = sorted(models[0])
    for m in models[1:]:
        if sorted(m) != keys or any(np.shape(m[k]) != np.shape(models[0][k]) for k in keys):
            raise ShapeError("weighted_average: models differ in their parameter names or "
                             "shapes")
    share = counts / counts.sum()
    out = {}
    for k in keys:
        dtype = np.asarray(models[0][k]).dtype
        acc = np.zeros(np.shape(models[0][k]), dtype=dtype)
        for s, m in zip(share, models):
            acc = acc + dtype.type(s) * np.asarray(m[k])
        out[k] = acc
    return out


class Strategy:
    """Flower's strategy interface; subclasses implement the three methods."""

    def configure_fit(self, server_round, parameters, num_clients, rng):
        raise NotImplementedError

    def aggregate_fit(self, server_round, results, failures):
        raise NotImplementedError

    def evaluate(self, server_round, parameters):
        raise NotImplementedError


class FedAvg(Strategy):
    """Federated averaging.

    Args:
        fraction_fit: share of the clients sampled each round (uniformly, without
            replacement); at least ``min_fit_clients``.
        min_fit_clients: the fewest clients a round samples.
        local_epochs, batch_size, lr: the clients' local SGD.
        shuffle: clients reshuffle their data every local epoch.
        evaluate_fn: ``evaluate_fn(parameters) -> dict`` for :meth:`evaluate`.
    """

    mu = 0.0

    def __init__(self, fraction_fit=1.0, min_fit_clients=1, local_epochs=1, batch_size=10,
                 lr=0.1, shuffle=True, evaluate_fn=None):
        if not 0.0 < float(fraction_fit) <= 1.0:
            raise ArgumentError(f"{type(self).__name__}: fraction_fit={fraction_fit!r} must be "
                                f"in (0, 1]")
        if min_fit_clients < 1 or local_epochs < 1 or batch_size < 1 or not lr > 0:
            raise ArgumentError(f"{type(self).__name__}: need min_fit_clients, local_epochs, "
                                f"batch_size >= 1 and lr > 0")
        self.fraction_fit, self.min_fit_clients = float(fraction_fit), int(min_fit_clients)
        self.local_epochs, self.batch_size, self.lr = int(local_epochs), int(batch_size), lr
        self.shuffle, self.evaluate_fn = bool(shuffle), evaluate_fn
        self.current = None

    def __repr__(self):
        return (f"{type(self).__name__}(fraction_fit={self.fraction_fit}, local_epochs="
                f"{self.local_epochs}, batch_size={self.batch_size}, lr={self.lr}"
                + (f", mu={self.mu}" if self.mu else "") + ")")

    def num_fit_clients(self, num_clients):
        """How many clients a round samples out of ``num_clients``."""
        want = max(self.min_fit_clients, int(round(self.fraction_fit * num_clients)))
        return min(num_clients, want)

    def configure_fit(self, server_round, parameters, num_clients, rng):
        """Sample clients uniformly without replacement; give each the local settings."""
        self.current = parameters
        m = self.num_fit_clients(num_clients)
        chosen = np.sort(rng.choice(num_clients, size=m, replace=False))
        config = {"epochs": self.local_epochs, "batch_size": self.batch_size, "lr": self.lr,
                  "mu": self.mu, "shuffle": self.shuffle, "server_round": server_round}
        return [FitIns(int(c), dict(config)) for c in chosen]

    def aggregate_fit(self, server_round, results, failures):
        """Sample-weighted average of the returned models; the current model when none
        returned."""
        if not results:
            return self.current
        return weighted_average([r.parameters for r in results],
                                [r.num_examples for r in results])

    def evaluate(self, server_round, parameters):
        """``evaluate_fn(parameters)`` or None."""
        return None if self.evaluate_fn is None else self.evaluate_fn(parameters)


class FedProx(FedAvg):
    """FedAvg whose clients minimise ``loss + mu/2 ||w - w_global||^2`` (``mu >= 0``)."""

    def __init__(self, mu=0.01, **kwargs):
        super().__init__(**kwargs)
        if not mu >= 0:
            raise ArgumentError(f"FedProx: mu={mu!r} must be >= 0")
        self.mu = float(mu)


class _ServerOpt(FedAvg):
    """FedAvg's average as a pseudo-gradient ``delta = avg - current`` for a server update."""

    def aggregate_fit(self, server_round, results, failures):
        if not results:
            return self.current
        avg = super().aggregate_fit(server_round, results, failures)
        delta = {k: np.asarray(avg[k], dtype=np.float64) - np.asarray(self.current[k])
                 for k in avg}
        step = self.server_step(delta)
        return {k: (np.asarray(self.current[k]) + step[k]).astype(np.asarray(avg[k]).dtype)
                for k in avg}


class FedAvgM(_ServerOpt):
    """Server momentum: ``v = momentum v + delta``, ``w += server_lr v`` (``momentum=0`` and
    ``server_lr=1``: FedAvg)."""

    def __init__(self, server_lr=1.0, momentum=0.9, **kwargs):
        super().__init__(**kwargs)
        self.server_lr, self.momentum = float(server_lr), float(momentum)
        self.velocity = None

    def server_step(self, delta):
        if self.velocity is None:
            self.velocity = {k: np.zeros_like(v) for k, v in delta.items()}
        self.velocity = {k: self.momentum * self.velocity[k] + delta[k] for k in delta}
        return {k: self.server_lr * v for k, v in self.velocity.items()}


class FedAdam(_ServerOpt):
    """FedAdam (Reddi et al. 2021): Adam on the pseudo-gradient, ``tau`` the adaptivity."""

    def __init__(self, server_lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3, **kwargs):
        super().__init__(**kwargs)
        self.server_lr, self.beta1, self.beta2, self.tau = server_lr, beta1, beta2, tau
        self.m = self.v = None

    def server_step(self, delta):
        if self.m is None:
            self.m = {k: np.zeros_like(d) for k, d in delta.items()}
            self.v = {k: np.zeros_like(d) for k, d in delta.items()}
        b1, b2 = self.beta1, self.beta2
        self.m = {k: b1 * self.m[k] + (1 - b1) * delta[k] for k in delta}
        self.v = {k: b2 * self.v[k] + (1 - b2) * delta[k] ** 2 for k in delta}
        return {k: self.server_lr * self.m[k] / (np.sqrt(self.v[k]) + self.tau) for k in delta}
