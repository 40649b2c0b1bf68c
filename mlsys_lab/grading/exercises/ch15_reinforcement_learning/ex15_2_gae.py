"""Exercise 15.2: generalised advantage estimation (GAE, Schulman et al. 2016) over a rollout
with terminations and truncations.

The student writes ``gae(rewards, values, next_values, terminated, truncated, gamma, lam)``.
All arrays have shape ``(T,)`` or ``(T, N)`` (time first, ``N`` environments): ``values[t]`` is
V(s_t), ``next_values[t]`` is V(s_{t+1}) of the state step ``t`` really reached (an episode's
final observation when it ended there). With
``delta_t = r_t + gamma * (1 - terminated_t) * next_values_t - values_t`` the advantage is
``A_t = delta_t + gamma * lam * (1 - terminated_t) * (1 - truncated_t) * A_{t+1}`` (and 0
after the last step). A terminal state is worth 0; a truncated episode still bootstraps from
its final state's value, but the next episode's advantages must not flow back into it.

The judge computes each ``A_t`` directly, as the sum ``sum_k (gamma lam)^k delta_{t+k}`` up to
the end of ``t``'s episode or of the rollout, in float64 (not the backward recursion).

Wrong ideas rejected: not cutting at ``terminated`` (bootstrapping from, or summing into, the
next episode); treating truncation as termination (dropping the final state's value); not
cutting the sum at a truncation (the next episode leaks in); ``gamma`` and ``lam`` swapped or
``lam`` alone in the sum; a missing bootstrap at the rollout's end (``next_values`` of the last
step ignored); running the sum forwards in time; mixing environments (the sum along the wrong
axis of a ``(T, N)`` rollout).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register


def _rollout(seed: int, kind: str):
    rng = np.random.default_rng(15500 + seed + 31 * len(kind))
    T, N = (int(rng.integers(12, 20)), 3) if kind == "batched" else (int(rng.integers(14, 22)), 0)
    shape = (T, N) if N else (T,)
    rewards = rng.normal(1.0, 0.5, shape)
    values = rng.normal(5.0, 2.0, shape)
    next_values = np.roll(values, -1, axis=0) + rng.normal(0, 0.01, shape)
    next_values[-1] = rng.normal(5.0, 2.0, shape[1:])
    terminated = np.zeros(shape, dtype=bool)
    truncated = np.zeros(shape, dtype=bool)
    if kind in ("terminated", "both", "batched"):
        terminated[rng.choice(T - 2, size=2, replace=False) + 1] = True
    if kind in ("truncated", "both", "batched"):
        idx = rng.choice(T - 2, size=2, replace=False) + 1
        truncated[idx] = ~terminated[idx]
    if kind == "batched":
        for n in range(N):  # each environment its own episode ends
            terminated[:, n] = np.roll(terminated[:, n], n)
            truncated[:, n] = np.roll(truncated[:, n], 2 * n) & ~terminated[:, n]
            truncated[-1, n] = False
    # a step that ends an episode reaches the episode's final state, not the next start
    ends = terminated | truncated
    next_values[ends] = rng.normal(5.0, 2.0, int(ends.sum()))
    gamma, lam = (0.97, 0.9) if kind != "plain" else (0.99, 0.95)
    return rewards, values, next_values, terminated, truncated, gamma, lam


def _direct(rewards, values, next_values, terminated, truncated, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k} over t's episode, one column at a time."""
    r, v, nv = (np.asarray(a, dtype=np.float64) for a in (rewards, values, next_values))
    te, tr = np.asarray(terminated, dtype=bool), np.asarray(truncated, dtype=bool)
    if r.ndim == 1:
        return _direct(r[:, None], v[:, None], nv[:, None], te[:, None], tr[:, None], gamma,
                       lam)[:, 0]
    T, N = r.shape
    delta = r + gamma * np.where(te, 0.0, nv) - v
    out = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, weight = 0.0, 1.0
            for k in range(t, T):
                total += weight * delta[k, n]
                if te[k, n] or tr[k, n]:
                    break
                weight *= gamma * lam
            out[t, n] = total
    return out


# ----------------------------------------------------------------------------- probes / judges


def _probe(kind, **override):
    def probe(gae, seed):
        args = list(_rollout(seed, kind))
        if override:
            args[5], args[6] = override["gamma"], override["lam"]
        copies = [np.array(a, copy=True) for a in args[:5]]
        out = gae(*args)
        untouched = all(np.array_equal(a, c) for a, c in zip(args[:5], copies))
        return {"advantages": np.asarray(out, dtype=np.float64), "untouched": untouched}
    return probe


def _judge(kind, what, **override):
    def judge(raw, seed):
        args = list(_rollout(seed, kind))
        if override:
            args[5], args[6] = override["gamma"], override["lam"]
        want = _direct(*args)
        got = raw["advantages"]
        if got.shape != want.shape:
            raise AssertionError(f"{what}: advantages of shape {got.shape}, expected "
                                 f"{want.shape} (one per step and environment)")
        if not np.allclose(got, want, rtol=1e-9, atol=1e-9):
            bad = np.argwhere(~np.isclose(got, want, rtol=1e-9, atol=1e-9))[0]
            raise AssertionError(f"{what}: A at step {tuple(int(i) for i in bad)} is "
                                 f"{describe(float(got[tuple(bad)]))}, expected "
                                 f"{describe(float(want[tuple(bad)]))}")
        if not raw["untouched"]:
            raise AssertionError(f"{what}: gae changed its input arrays")
    return judge


def _extremes_probe(gae, seed):
    return [_probe("both", gamma=0.9, lam=lam)(gae, seed) for lam in (0.0, 1.0)]


def _extremes_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 2:
        raise AssertionError(f"expected two results, got {describe(raw)}")
    for lam, part in zip((0.0, 1.0), raw):
        _judge("both", f"lam = {lam:g}", gamma=0.9, lam=lam)(part, seed)


_CASES = (
    ("one episode, cut by the rollout's end: bootstrap from next_values", "plain", 1.5,
     "delta_T = r_T + gamma * next_values_T - values_T at the last step"),
    ("terminations: no bootstrap, no flow across", "terminated", 1.5,
     "at terminated: delta = r - V and the sum stops"),
    ("truncations: bootstrap, but no flow across", "truncated", 1.5,
     "at truncated: keep gamma * next_values in delta, but stop the sum"),
    ("both, and gamma != lam", "both", 1,
     "the sum's factor is gamma * lam; delta's discount is gamma"),
    ("a (T, N) rollout of 3 environments", "batched", 1.5,
     "run the recursion backwards along axis 0, each environment its own column"),
)

register(
    Exercise(
        id="15.2",
        title="Generalised advantage estimation with terminations and truncations",
        target="gae",
        task="GAE",
        forbidden=("mlsys_lab.rl.agents.advantage:gae",),
        cases=tuple(
            Case(name, points, feedback=fb, probe=_probe(kind), judge=_judge(kind, name))
            for name, kind, points, fb in _CASES
        ) + (
            Case("lam = 0 gives the TD error, lam = 1 the discounted return minus V", 1,
                 feedback="A = delta when lam = 0; the sum of gamma^k delta when lam = 1",
                 probe=_extremes_probe, judge=_extremes_judge),
        ),
    ),
)
