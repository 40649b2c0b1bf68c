"""Exercise 9.2: a shard-aware sampler.

DistributedSampler's semantics: one permutation shared by every rank, padding by repetition to
equal lengths, strided shards, ``set_epoch``, ``drop_last``.

Wrong ideas rejected (a wrong idea that still gives plausible shards): contiguous blocks of the
permutation, or of 0..n-1, differ from the strided shards (exact case) and a fixed block per
rank keeps the same samples every epoch (epoch case); seeding each rank's permutation with its
rank makes shards overlap (shared-order case); dropping the tail instead of padding gives
floor(n / R) indices and loses samples (lengths case); padding with 0, -1 or random indices
instead of the first indices of the order fails the exact case; uneven shards (the first
n % R ranks one longer) fail the lengths case; ignoring ``set_epoch`` repeats the order (epoch
case); ``drop_last`` that pads or cuts from the front fails the drop_last case.
"""

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    register,
)
from mlsys_lab.grading.exercises.ch09_data_processing.common import expect_type

# ----------------------------------------------------------------------------- inputs (both sides)


def _shard_configs(seed, count=12):
    """(n, num_replicas, sampler seed, epoch); n is rarely a multiple of num_replicas, and one
    config has fewer samples than replicas."""
    rng = np.random.default_rng(9500 + seed)
    configs = []
    for k in range(count):
        replicas = int(rng.integers(2, 9))
        n = int(rng.integers(1, replicas)) if k == 0 else \
            int(rng.integers(replicas + 1, 120))
        if k > 1 and n % replicas == 0:
            n += 1
        configs.append((n, replicas, int(rng.integers(0, 10_000)), int(rng.integers(0, 5))))
    return configs


def _epoch_order(n, seed, epoch, shuffle):
    if shuffle:
        return np.random.default_rng([seed, epoch]).permutation(n).tolist()
    return list(range(n))


def _reference_shard(n, replicas, rank, seed, epoch, shuffle=True, drop_last=False):
    order = _epoch_order(n, seed, epoch, shuffle)
    per_rank = n // replicas if drop_last else -(-n // replicas)
    total = per_rank * replicas
    if drop_last:
        order = order[:total]
    else:
        while len(order) < total:
            order += order[:total - len(order)]
    return order[rank::replicas]


# ----------------------------------------------------------------------------- probes


def _shards(sampler_cls, n, replicas, seed, epoch, shuffle=True, drop_last=False):
    """Every rank's (len, indices) for one configuration."""
    out = []
    for rank in range(replicas):
        sampler = sampler_cls(n, replicas, rank, seed=seed, shuffle=shuffle,
                              drop_last=drop_last)
        sampler.set_epoch(epoch)
        out.append([len(sampler), [int(i) for i in sampler]])
    return out


def _ss_equal_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e, shuffle=(k % 2 == 0))
            for k, (n, r, s, e) in enumerate(_shard_configs(seed))]


def _ss_exact_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e, shuffle=(k % 3 != 1))
            for k, (n, r, s, e) in enumerate(_shard_configs(seed + 1))]


def _ss_shared_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e) for n, r, s, e in _shard_configs(seed + 2, 6)[1:]]


def _ss_epoch_probe(ShardSampler, seed):
    n, replicas, s, _ = _shard_configs(seed + 3, 2)[1]
    n = max(n, 4 * replicas)
    sampler = ShardSampler(n, replicas, replicas - 1, seed=s, shuffle=True, drop_last=False)
    runs = []
    for epoch in (0, 1, 1, 2):
        sampler.set_epoch(epoch)
        runs.append([int(i) for i in sampler])
    again = [int(i) for i in sampler]          # iterating twice in one epoch: the same order
    other_seed = ShardSampler(n, replicas, replicas - 1, seed=s + 1, shuffle=True,
                              drop_last=False)
    other_seed.set_epoch(2)
    return {"n": n, "replicas": replicas, "runs": runs, "again": again,
            "other_seed": [int(i) for i in other_seed]}


def _ss_drop_probe(ShardSampler, seed):
    return [_shards(ShardSampler, n, r, s, e, shuffle=(k % 2 == 0), drop_last=True)
            for k, (n, r, s, e) in enumerate(_shard_configs(seed + 4, 8)[1:])]


SS_BAD_CALLS = ((10, 4, 4), (10, 4, -1), (10, 0, 0))  # rank R of R, rank -1, R = 0


def _ss_errors_probe(ShardSampler):
    return [attempt(ShardSampler, *args) for args in SS_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _shard_list(raw, configs, what):
    expect_type(raw, list, what)
    if len(raw) != len(configs):
        raise AssertionError(f"{what}: expected {len(configs)} configurations, got {len(raw)}")
    for got, (n, replicas, _, _) in zip(raw, configs):
        if not isinstance(got, list) or len(got) != replicas:
            raise AssertionError(f"{what}: n={n}, {replicas} replicas: the check got "
                                 f"{describe(got)}")
    return raw


def _ss_equal_judge(raw, seed):
    configs = _shard_configs(seed)
    for got, (n, replicas, _, epoch) in zip(_shard_list(raw, configs, "lengths"), configs):
        want = -(-n // replicas)
        for rank, (length, indices) in enumerate(got):
            if len(indices) != length:
                raise AssertionError(f"n={n}, {replicas} replicas, rank {rank}: len() says "
                                     f"{length} but iterating gives {len(indices)} indices")
            if length != want:
                hint = (" (dropping the tail instead of padding?)" if length == n // replicas
                        else " (every rank must get the same number: pad, do not split unevenly)")
                raise AssertionError(f"n={n}, {replicas} replicas, rank {rank}: {length} "
                                     f"indices, expected ceil(n / num_replicas) = {want}{hint}")
        seen = {i for _, indices in got for i in indices}
        if seen != set(range(n)):
            missing = sorted(set(range(n)) - seen)[:5]
            extra = sorted(seen - set(range(n)))[:5]
            raise AssertionError(f"n={n}, {replicas} replicas, epoch {epoch}: the shards "
                                 f"together miss {missing} and contain {extra} outside 0..n-1; "
                                 "their union must be the whole dataset")


def _ss_exact_judge(raw, seed):
    configs = _shard_configs(seed + 1)
    for k, (got, (n, replicas, s, epoch)) in enumerate(zip(_shard_list(raw, configs, "shards"),
                                                           configs)):
        shuffle = k % 3 != 1
        for rank, (_, indices) in enumerate(got):
            want = _reference_shard(n, replicas, rank, s, epoch, shuffle)
            if indices != want:
                raise AssertionError(
                    f"n={n}, {replicas} replicas, seed={s}, epoch {epoch}, shuffle={shuffle}, "
                    f"rank {rank}: got {indices[:8]}{'...' if len(indices) > 8 else ''}, "
                    f"expected {want[:8]}{'...' if len(want) > 8 else ''} (the epoch's order "
                    "padded by repeating its first indices, then every num_replicas-th index "
                    "starting at rank)")


def _ss_shared_judge(raw, seed):
    configs = _shard_configs(seed + 2, 6)[1:]
    for got, (n, replicas, _, epoch) in zip(_shard_list(raw, configs, "shared order"), configs):
        total = -(-n // replicas) * replicas
        padded = total - n
        counts = {}
        for _, indices in got:
            for i in indices:
                counts[i] = counts.get(i, 0) + 1
        repeats = sum(c - 1 for c in counts.values())
        if repeats > padded or len(counts) != n:
            raise AssertionError(f"n={n}, {replicas} replicas, epoch {epoch}: {repeats} indices "
                                 f"appear on more than one rank (only the {padded} padded ones "
                                 "may): every rank must draw the same permutation, from seed "
                                 "and epoch alone, not from its rank")


def _ss_epoch_judge(raw, seed):
    got = expect_type(raw, dict, "epochs")
    runs, n, replicas = got["runs"], got["n"], got["replicas"]
    if runs[1] != runs[2]:
        raise AssertionError("the same epoch must give the same order (set_epoch(1) twice gave "
                             f"{runs[1][:6]}... and {runs[2][:6]}...)")
    if got["again"] != runs[3]:
        raise AssertionError("iterating the sampler twice in one epoch gave two orders")
    if runs[0] == runs[1] or runs[1] == runs[3]:
        raise AssertionError("set_epoch did not change the order: each epoch must draw a new "
                             "permutation (seed the generator with [seed, epoch])")
    if set(runs[0]) == set(runs[1]) == set(runs[3]):
        raise AssertionError(f"rank {replicas - 1} of {replicas} sees the same {len(runs[0])} "
                             f"samples of the {n} in every epoch, only reordered: shuffle the "
                             "whole dataset and then split it, not split it and shuffle each "
                             "part")
    if got["other_seed"] == runs[3]:
        raise AssertionError("a different seed gave the same order")


def _ss_drop_judge(raw, seed):
    configs = _shard_configs(seed + 4, 8)[1:]
    for k, (got, (n, replicas, s, epoch)) in enumerate(zip(_shard_list(raw, configs, "drop_last"),
                                                           configs)):
        shuffle = k % 2 == 0
        for rank, (length, indices) in enumerate(got):
            want = _reference_shard(n, replicas, rank, s, epoch, shuffle, drop_last=True)
            if length != len(want) or indices != want:
                raise AssertionError(
                    f"drop_last=True, n={n}, {replicas} replicas, rank {rank}: len {length}, "
                    f"indices {indices[:8]}; expected {len(want)} = floor(n / num_replicas) "
                    f"indices {want[:8]} (drop the tail of the epoch's order, then stride)")


def _ss_errors_judge(raw):
    expect_each_raised("ShardSampler", SS_BAD_CALLS, raw, "ValueError",
                       "rank must lie in 0..num_replicas-1 and num_replicas >= 1")


register(
    Exercise(
        id="9.2",
        title="A shard-aware sampler",
        target="ShardSampler",
        task="the shard-aware sampler",
        forbidden=(
            "mlsys_lab.data.loader.sampler:DistributedSampler",
            "mlsys_lab.data.pipeline.ops:ShardNode",
            "mlsys_lab.data.records:read_shard",
        ),
        cases=(
            Case("every rank gets ceil(n / R) indices; together all of 0..n-1", 2,
                 feedback="pad the order to a multiple of num_replicas",
                 probe=_ss_equal_probe, judge=_ss_equal_judge),
            Case("padding repeats the first indices; rank r takes order[r::R]", 2,
                 feedback="pad by repetition, then stride",
                 probe=_ss_exact_probe, judge=_ss_exact_judge),
            Case("all ranks split one permutation: shards overlap only in the padding", 1,
                 feedback="seed the permutation with seed and epoch only",
                 probe=_ss_shared_probe, judge=_ss_shared_judge),
            Case("set_epoch reshuffles the whole dataset; the same epoch repeats", 1,
                 feedback="default_rng([seed, epoch]).permutation(n)",
                 probe=_ss_epoch_probe, judge=_ss_epoch_judge),
            Case("drop_last cuts the tail: floor(n / R) each", 1,
                 feedback="drop the tail instead of padding",
                 probe=_ss_drop_probe, judge=_ss_drop_judge),
            Case("a rank outside 0..R-1 or R < 1 raises ValueError", 1,
                 feedback="check the arguments", probe=_ss_errors_probe,
                 judge=_ss_errors_judge),
        ),
    ),
)
