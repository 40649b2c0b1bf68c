"""Model updates from training to serving: the book's transfer arithmetic, and a simulation of
how fresh the served rows stay under full, incremental and priority-based propagation for a
given bandwidth (the trade-off Monolith and Ekko make)."""

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError
from .data import zipf_sampler

STRATEGIES = ("full", "incremental", "priority")


def transfer_time(model_bytes, num_destinations, bandwidth_bps):
    """Seconds to send ``model_bytes`` to each of ``num_destinations`` data centres, one after
    another over one link of ``bandwidth_bps`` bits per second (100 GB to 5 DCs at 5 Gbps:
    800 s)."""
    if bandwidth_bps <= 0:
        raise ArgumentError(f"transfer_time: bandwidth must be > 0, got {bandwidth_bps}")
    return model_bytes * 8 * num_destinations / bandwidth_bps


@dataclass
class PropagationResult:
    """What one propagation strategy achieved.

    Attributes:
        strategy: "full", "incremental" or "priority".
        bytes_per_tick: mean bytes sent per tick (at most the bandwidth).
        stale_reads: fraction of serving reads that saw a row missing some trained update.
        missed_updates: mean number of trained updates a read's row was missing.
    """

    strategy: str
    bytes_per_tick: float
    stale_reads: float
    missed_updates: float


def simulate_propagation(strategy, num_rows=10_000, row_bytes=64, bandwidth=6_400, ticks=200,
                         updates_per_tick=200, reads_per_tick=500, skew=1.1, seed=0):
    """Trainer and server copies of one table, tick by tick.

    Each tick the trainer updates ``updates_per_tick`` rows, then up to ``bandwidth`` bytes of
    rows go to the server, then serving reads ``reads_per_tick`` rows (updates and reads drawn
    from the same Zipf popularity):

    * ``"full"``: the whole table streamed in a round-robin sweep, changed or not;
    * ``"incremental"``: only changed rows, the longest-waiting first;
    * ``"priority"``: only changed rows, the most-read (popularity x missed updates) first.

    Returns:
        A :class:`PropagationResult`.
    """
    if strategy not in STRATEGIES:
        raise ArgumentError(f"simulate_propagation: strategy must be one of {STRATEGIES}, got "
                            f"{strategy!r}")
    rng = np.random.default_rng(seed)
    draw, pop = zipf_sampler(num_rows, skew, rng)
    trained = np.zeros(num_rows, np.int64)  # updates each row has had on the trainer
    served = np.zeros(num_rows, np.int64)  # updates the server's copy includes
    dirty_since = np.full(num_rows, np.inf)
    per_tick = int(bandwidth // row_bytes)
    sweep, sent, stale, missed = 0, 0, 0, 0
    for tick in range(ticks):
        rows = draw(updates_per_tick)
        np.add.at(trained, rows, 1)
        dirty_since[rows] = np.minimum(dirty_since[rows], tick)
        if strategy == "full":
            chosen = (sweep + np.arange(per_tick)) % num_rows
            sweep = (sweep + per_tick) % num_rows
        else:
            dirty = np.flatnonzero(trained != served)
            if strategy == "incremental":
                key = dirty_since[dirty]
            else:
                key = -pop[dirty] * (trained[dirty] - served[dirty])
            chosen = dirty[np.argsort(key, kind="stable")[:per_tick]]
        served[chosen] = trained[chosen]
        dirty_since[chosen] = np.inf
        sent += chosen.size * row_bytes
        reads = draw(reads_per_tick)
        lag = trained[reads] - served[reads]
        stale += int(np.count_nonzero(lag))
        missed += int(lag.sum())
    reads = ticks * reads_per_tick
    return PropagationResult(strategy, sent / ticks, stale / reads, missed / reads)


__all__ = ["transfer_time", "simulate_propagation", "PropagationResult", "STRATEGIES"]
