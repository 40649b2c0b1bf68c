"""Exercise 13.3: a shard placement that spreads hot keys over the servers without exceeding
their capacity.

Wrong ideas rejected: round-robin by id (key % S, what hashing does) ignores frequency and puts
a hot key together with a share of everything else, 1.5-2x the balanced maximum ("hot");
random placement likewise; greedy least-loaded placement that ignores the capacity overfills
the servers left with cold keys ("capacity"); placing keys in id order (not hottest first) onto
the least loaded server leaves a hot key to land late on a loaded server; not raising when the
keys cannot fit fails the error case.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    register,
)

# ----------------------------------------------------------------------------- inputs (both sides)


def _zipf_freq(rng, keys, skew):
    f = 1e6 / np.arange(1, keys + 1) ** skew
    return np.round(f[rng.permutation(keys)])


def _placement_configs(kind, seed):
    """(freq, num_servers, capacity)."""
    rng = np.random.default_rng([seed, 133, len(kind)])
    if kind == "hot":  # plenty of room: only the balance matters
        return [(_zipf_freq(rng, 400, 1.1), 8, 400), (_zipf_freq(rng, 300, 1.3), 4, 300),
                (_zipf_freq(rng, int(rng.integers(100, 300)), 1.0), int(rng.integers(3, 9)),
                 300)]
    # "capacity", tight room: n keys on S servers of about n / S each
    out = []
    for keys, servers in ((400, 8), (301, 4), (int(rng.integers(100, 300)), 5)):
        out.append((_zipf_freq(rng, keys, 1.1), servers, -(-keys // servers)))
    return out


PLACEMENT_BAD_CALLS = ((np.ones(10), 2, 4), (np.ones(7), 3, 2))


def _reference_max_load(freq, servers, capacity):
    from mlsys_lab.recsys.sharding import balanced_placement, server_loads

    return server_loads(freq, balanced_placement(freq, servers, capacity), servers).max()


# ----------------------------------------------------------------------------- probes


def _placement_probe_of(kind):
    def probe(place_shards, seed):
        return [np.asarray(place_shards(freq.copy(), s, c))
                for freq, s, c in _placement_configs(kind, seed)]
    return probe


def _placement_errors_probe(place_shards):
    return [attempt(place_shards, *args) for args in PLACEMENT_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _placement_judge_of(kind):
    def judge(raw, seed):
        configs = _placement_configs(kind, seed)
        if not isinstance(raw, list) or len(raw) != len(configs):
            raise AssertionError(f"expected {len(configs)} placements, got {describe(raw)}")
        for (freq, servers, capacity), got in zip(configs, raw):
            what = f"{len(freq)} keys on {servers} servers of capacity {capacity}"
            if not isinstance(got, np.ndarray) or got.shape != freq.shape or \
                    got.dtype.kind not in "iu":
                raise AssertionError(f"{what}: returned {describe(got)}; return one server "
                                     "number (an int) per key")
            if got.size and (got.min() < 0 or got.max() >= servers):
                raise AssertionError(f"{what}: server {int(got.max())} does not exist "
                                     f"(servers are 0..{servers - 1})")
            held = np.bincount(got, minlength=servers)
            if held.max() > capacity:
                raise AssertionError(f"{what}: server {int(held.argmax())} holds "
                                     f"{int(held.max())} keys, more than its capacity; a full "
                                     "server takes no more keys")
            loads = np.bincount(got, weights=freq, minlength=servers)
            best = _reference_max_load(freq, servers, capacity)
            if loads.max() > 1.05 * best:
                raise AssertionError(f"{what}: the busiest server serves {loads.max():.0f} "
                                     f"lookups ({loads.max() / loads.mean():.2f}x the mean); "
                                     f"placing the hottest keys first, each on the least-loaded "
                                     f"server, gets {best:.0f}")
    return judge


def _placement_errors_judge(raw):
    expect_each_raised("place_shards", PLACEMENT_BAD_CALLS, raw, "ValueError",
                       "the keys do not fit on the servers")


register(
    Exercise(
        id="13.3",
        title="A shard placement that balances hot keys",
        target="place_shards",
        task="the hot-key-balancing placement",
        forbidden=("mlsys_lab.recsys.sharding:balanced_placement",),
        cases=(
            Case("hot keys spread: busiest server within 5% of the balanced placement", 3,
                 feedback="hottest keys first, each onto the least-loaded server",
                 probe=_placement_probe_of("hot"), judge=_placement_judge_of("hot")),
            Case("tight capacity: no server over capacity, still balanced", 2,
                 feedback="a full server takes no more keys",
                 probe=_placement_probe_of("capacity"), judge=_placement_judge_of("capacity")),
            Case("keys that do not fit raise ValueError", 1,
                 feedback="more keys than num_servers * capacity cannot be placed",
                 probe=_placement_errors_probe, judge=_placement_errors_judge),
        ),
    ),
)
