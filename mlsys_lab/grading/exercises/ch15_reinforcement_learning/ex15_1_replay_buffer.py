"""Exercise 15.1: a replay buffer with ring eviction and uniform sampling (DQN's memory).

The student writes a class ``ReplayBuffer(capacity, obs_dim)`` with ``add(obs, action, reward,
next_obs, terminated)``, ``len(buffer)`` and ``sample(batch_size, rng)`` returning the arrays
``(obs, actions, rewards, next_obs, terminated)`` of ``batch_size`` transitions drawn uniformly
*with replacement* from the ones it holds (``rng`` is a numpy Generator). Once ``capacity``
transitions are stored, each new one overwrites the oldest.

The probes add transitions whose fields all encode the transition's number ``k`` (obs
``(k, -k, ...)``, action ``k % 3``, reward ``k / 2``, next_obs ``(k + 1, ...)``, terminated
``k % 7 == 0``), so what comes back out says which transitions the buffer holds.

Wrong ideas rejected: holding one transition too many or too few (``len`` and the sampled set
are judged after every add); evicting the newest instead of the oldest (the newest must always
be there); sampling over all ``capacity`` slots before the buffer is full (empty slots come out
as transition 0, which was never added); sampling only the most recent transitions, or with a
bias (a chi-square test over 40,000 draws); sampling without replacement (a batch larger than
the buffer must work, and batches repeat transitions as often as draws with replacement do);
drawing each field with its own indices (the fields of a sampled row must be one transition);
keeping a reference to the caller's array (the probe reuses one obs array for every add).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register

OBS_DIM = 3


def _transition(k: int):
    obs = np.array([k, -k, 0.5 * k], dtype=np.float64)
    return obs, k % 3, k / 2, obs + 1.0, k % 7 == 0


def _fill(ReplayBuffer, capacity: int, count: int, start: int = 1):
    """A buffer with transitions ``start .. start + count - 1`` added through one reused array."""
    buffer = ReplayBuffer(capacity, OBS_DIM)
    scratch_obs, scratch_next = np.zeros(OBS_DIM), np.zeros(OBS_DIM)
    for k in range(start, start + count):
        obs, a, r, nxt, done = _transition(k)
        scratch_obs[...] = obs  # the caller reuses its arrays, as a rollout loop does
        scratch_next[...] = nxt
        buffer.add(scratch_obs, a, r, scratch_next, done)
    scratch_obs[...] = -999.0
    scratch_next[...] = -999.0
    return buffer


def _batch(buffer, size, rng):
    out = buffer.sample(size, rng)
    if not isinstance(out, (tuple, list)) or len(out) != 5:
        raise AssertionError(f"sample should return (obs, actions, rewards, next_obs, "
                             f"terminated), got {describe(out)}")
    return [np.asarray(part, dtype=np.float64).reshape(size, -1) for part in out]


def _ids(batch):
    return batch[0][:, 0]


# ----------------------------------------------------------------------------- probes


def _probe_sizes(ReplayBuffer, seed):
    """``len`` and the set of transitions seen in a big sample, after each add."""
    rng = np.random.default_rng(15100 + seed)
    capacity = int(rng.integers(5, 9))
    buffer = ReplayBuffer(capacity, OBS_DIM)
    out = []
    for k in range(1, 2 * capacity + 3):
        obs, a, r, nxt, done = _transition(k)
        buffer.add(obs.copy(), a, r, nxt.copy(), done)
        held = np.unique(_ids(_batch(buffer, 400, rng))).tolist()
        out.append([int(len(buffer)), held])
    return {"capacity": capacity, "after": out}


def _probe_fields(ReplayBuffer, seed):
    rng = np.random.default_rng(15200 + seed)
    buffer = _fill(ReplayBuffer, 30, 45)
    return _batch(buffer, 256, rng)


def _probe_uniform(ReplayBuffer, seed):
    rng = np.random.default_rng(15300 + seed)
    buffer = _fill(ReplayBuffer, 40, 90)
    counts = np.zeros(200)
    for _ in range(625):
        np.add.at(counts, _ids(_batch(buffer, 64, rng)).astype(int), 1)
    return counts


def _probe_replacement(ReplayBuffer, seed):
    rng = np.random.default_rng(15400 + seed)
    small = _fill(ReplayBuffer, 50, 6)
    big_batch = _ids(_batch(small, 20, rng))
    buffer = _fill(ReplayBuffer, 100, 100)
    repeats = [len(np.unique(_ids(_batch(buffer, 16, rng)))) < 16 for _ in range(400)]
    return {"big_batch": big_batch, "repeat_fraction": float(np.mean(repeats))}


# ----------------------------------------------------------------------------- judges


def _judge_sizes(raw, seed):
    capacity = raw["capacity"]
    for k, (length, held) in enumerate(raw["after"], start=1):
        want = list(range(max(1, k - capacity + 1), k + 1))
        if length != min(k, capacity):
            raise AssertionError(f"capacity {capacity}: after {k} adds len(buffer) is {length}, "
                                 f"expected {min(k, capacity)}")
        if [int(h) for h in held] != want:
            raise AssertionError(
                f"capacity {capacity}: after adding transitions 1..{k} a big sample holds "
                f"{[int(h) for h in held]}, expected exactly the newest {len(want)}: {want} "
                f"(evict the oldest; never sample an empty slot)")


def _judge_fields(raw):
    obs, act, rew, nxt, term = raw
    k = obs[:, 0]
    want = np.stack([_transition(int(i))[0] for i in k])
    checks = (("obs", obs, want), ("actions", act[:, 0], k % 3), ("rewards", rew[:, 0], k / 2),
              ("next_obs", nxt, want + 1.0), ("terminated", term[:, 0], (k % 7 == 0) * 1.0))
    for name, got, expected in checks:
        if not np.array_equal(got, expected):
            raise AssertionError(f"the {name} of a sampled row do not belong to the transition "
                                 f"its obs names (one index per row for every field; copy the "
                                 f"arrays you are given)")
    if not set(k.astype(int)) <= set(range(16, 46)):
        raise AssertionError(f"sampled transitions {sorted(set(k.astype(int)))[:8]}... are not "
                             f"among the 30 newest (16..45)")


def _judge_uniform(raw):
    counts = np.asarray(raw)
    held = np.arange(51, 91)
    if counts.sum() != 40_000 or counts[held].sum() != 40_000:
        raise AssertionError(f"of 40,000 draws, {int(counts[held].sum())} came from the 40 "
                             f"transitions held (51..90)")
    expected = 1000.0
    chi2 = float(((counts[held] - expected) ** 2 / expected).sum())
    # 39 degrees of freedom: P(chi2 > 85) < 2e-5 under uniform sampling
    if chi2 > 85:
        raise AssertionError(f"draws per held transition range {int(counts[held].min())}.."
                             f"{int(counts[held].max())} (chi-square {chi2:.0f} on 39 degrees "
                             f"of freedom): sampling is not uniform over what the buffer holds")


def _judge_replacement(raw):
    big = np.asarray(raw["big_batch"])
    if big.shape != (20,) or not set(big.astype(int)) <= set(range(1, 7)):
        raise AssertionError(f"a batch of 20 from 6 transitions gave {describe(big)}")
    frac = raw["repeat_fraction"]
    p = 1 - np.prod(1 - np.arange(16) / 100)  # P(a batch of 16 from 100 repeats one) = 0.71
    if abs(frac - p) > 0.1:
        raise AssertionError(f"{frac:.0%} of batches of 16 (from 100) repeat a transition; "
                             f"drawing with replacement repeats in {p:.0%}")


register(
    Exercise(
        id="15.1",
        title="A replay buffer: ring eviction, uniform sampling",
        target="ReplayBuffer",
        task="the replay buffer",
        forbidden=("mlsys_lab.rl.agents.replay:ReplayBuffer",),
        cases=(
            Case("holds the newest min(k, capacity) transitions after k adds", 2.5,
                 feedback="write at position (count % capacity); len = min(count, capacity)",
                 probe=_probe_sizes, judge=_judge_sizes),
            Case("a sampled row is one transition, copied when added", 1.5,
                 feedback="one index per row for all five fields; store copies",
                 probe=_probe_fields, judge=_judge_fields),
            Case("uniform over the transitions held", 1.5,
                 feedback="indices uniform in 0 .. len(buffer) - 1",
                 probe=_probe_uniform, judge=_judge_uniform),
            Case("with replacement: batches may repeat a transition", 1.5,
                 feedback="rng.integers(0, len(self), size=batch_size)",
                 probe=_probe_replacement, judge=_judge_replacement),
        ),
    ),
)
