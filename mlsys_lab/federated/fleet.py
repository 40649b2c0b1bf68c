"""The clients' devices: compute speed, links and reliability, one entry per client.

A :class:`Fleet` holds, per client, FLOP/s, uplink and downlink bandwidth (bytes/s), one-way
latency (s) and the probability that it drops out of a round it was sampled for. Two
presets follow the book's two settings: :meth:`Fleet.cloud_cloud` (a few data centres: fast,
reliable, alike) and :meth:`Fleet.device_cloud` (many phones: slow and varied compute, slow
asymmetric uplinks, drop-outs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError

__all__ = ["Fleet"]


@dataclass
class Fleet:
    """Per-client device profiles (arrays of one length, the number of clients)."""

    flops: np.ndarray
    uplink: np.ndarray
    downlink: np.ndarray
    latency: np.ndarray
    drop_prob: np.ndarray

    def __post_init__(self):
        n = len(np.atleast_1d(self.flops))
        for name in ("flops", "uplink", "downlink", "latency", "drop_prob"):
            v = np.broadcast_to(np.asarray(getattr(self, name), dtype=np.float64), (n,)).copy()
            if not np.all(np.isfinite(v)) or np.any(v < 0):
                raise ArgumentError(f"Fleet: {name} must be finite and >= 0")
            setattr(self, name, v)
        if np.any(self.flops <= 0) or np.any(self.uplink <= 0) or np.any(self.downlink <= 0):
            raise ArgumentError("Fleet: flops, uplink and downlink must be > 0")
        if np.any(self.drop_prob > 1):
            raise ArgumentError("Fleet: drop_prob must be in [0, 1]")

    def __len__(self):
        return len(self.flops)

    def __repr__(self):
        return (f"<Fleet: {len(self)} clients, median {np.median(self.flops):.3g} FLOP/s, "
                f"uplink {np.median(self.uplink) * 8 / 1e6:.3g} Mbit/s, drop-out "
                f"{self.drop_prob.mean():.2f}>")

    @classmethod
    def uniform(cls, n, flops=1e10, uplink=1e8, downlink=1e8, latency=1e-3, drop_prob=0.0):
        """``n`` identical clients."""
        return cls(np.full(n, float(flops)), uplink, downlink, latency, drop_prob)

    @classmethod
    def cloud_cloud(cls, n, seed=0):
        """Data centres: 1 TFLOP/s, 10 Gbit/s both ways, 20 ms, no drop-outs."""
        return cls.uniform(n, flops=1e12, uplink=1.25e9, downlink=1.25e9, latency=0.02)

    @classmethod
    def device_cloud(cls, n, seed=0, drop_prob=0.1, straggler_fraction=0.1):
        """Phones: ~2 GFLOP/s spread log-normally (a ``straggler_fraction`` 10x slower),
        uplinks ~2 Mbit/s (log-normal), downlinks 5x faster, 50–300 ms, drop-outs."""
        rng = np.random.default_rng(seed)
        flops = 2e9 * rng.lognormal(0.0, 0.5, n)
        flops[rng.random(n) < straggler_fraction] /= 10.0
        uplink = 2e6 / 8 * rng.lognormal(0.0, 0.7, n)
        return cls(flops, uplink, 5 * uplink, rng.uniform(0.05, 0.3, n),
                   np.full(n, float(drop_prob)))
