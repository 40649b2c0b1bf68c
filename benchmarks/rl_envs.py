"""Vectorised CartPole (book chapter 15): environment steps per second for 256 copies.

    python benchmarks/rl_envs.py [--envs 256] [--steps 50] [--rounds 5] [--workers 2]

Every contestant steps ``--envs`` CartPole-v1 copies with the same pre-drawn random actions
(NEXT_STEP auto-reset everywhere, Gymnasium's default), interleaved, best of ``--rounds`` blocks
of ``--steps`` batched steps each:

* ``loop``: :class:`mlsys_lab.rl.vector.SyncVectorEnv` (one Python ``step`` per copy) — the
  baseline;
* ``processes``: :class:`~mlsys_lab.rl.vector.ProcessVectorEnv` with ``--workers`` workers
  (shared-memory observations);
* ``numba``: :class:`~mlsys_lab.rl.vector.NumbaCartPoleVectorEnv` (one compiled kernel);
* when gymnasium is installed: ``gymnasium.vector.SyncVectorEnv``, ``AsyncVectorEnv`` (``--workers``
  is not Gymnasium's knob: it starts one process per copy, so it runs with 16 copies and its
  rate is per copy-step like the others) and ``CartPoleVectorEnv`` (numpy over the batch).

Targets (issue 32): numba >= 20x the loop, >= 5x Gymnasium's SyncVectorEnv, >= 1x its
CartPoleVectorEnv. ``benchmarks/rl.py`` calls :func:`main`. Numbers come from a shared 2-core
machine (the load average is printed).
"""

import argparse
import os

import numpy as np

from mlsys_lab import timing
from mlsys_lab.rl.envs import CartPole
from mlsys_lab.rl.vector import NumbaCartPoleVectorEnv, ProcessVectorEnv, SyncVectorEnv

TARGETS = {"loop": 20.0, "gymnasium SyncVectorEnv": 5.0, "gymnasium CartPoleVectorEnv": 1.0}


def load():
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def stepper(envs, actions):
    """A callable that makes ``len(actions)`` batched steps."""
    envs.reset(seed=0)

    def run():
        for a in actions:
            envs.step(a)
    return run


def contestants(n, steps, workers, rng):
    """``{label: (callable, copies, envs)}``."""
    actions = rng.integers(2, size=(steps, n))
    out = {}
    out["loop"] = SyncVectorEnv([CartPole] * n)
    out[f"processes ({workers} workers)"] = ProcessVectorEnv([CartPole] * n,
                                                             num_workers=workers)
    out["numba"] = NumbaCartPoleVectorEnv(n)
    try:
        import gymnasium as gym
        from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
    except ImportError:
        gym = None
    if gym is not None:
        make = lambda: gym.make("CartPole-v1")  # noqa: E731
        out["gymnasium SyncVectorEnv"] = gym.vector.SyncVectorEnv([make] * n)
        small = min(n, 16)
        out[f"gymnasium AsyncVectorEnv ({small} processes)"] = \
            gym.vector.AsyncVectorEnv([make] * small)
        out["gymnasium CartPoleVectorEnv"] = CartPoleVectorEnv(num_envs=n)
    table = {}
    for label, envs in out.items():
        copies = envs.num_envs
        acts = actions[:, :copies] if copies != n else actions
        table[label] = (stepper(envs, acts), copies, envs)
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=256)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    print(f"# CartPole-v1 x {args.envs}: environment steps per second ({load()})")
    table = contestants(args.envs, args.steps, args.workers, np.random.default_rng(0))
    try:
        result = timing.compare({k: fn for k, (fn, _, _) in table.items()},
                                rounds=args.rounds, warmup=1)
    finally:
        for _, _, envs in table.values():
            envs.close()
    rate = {k: copies * args.steps / result[k] for k, (_, copies, _) in table.items()}
    width = max(map(len, rate))
    print(f"best of {args.rounds} interleaved blocks of {args.steps} batched steps each")
    print(f"{'implementation':<{width}}  {'steps/s':>12}  {'vs loop':>8}  {'numba is':>9}")
    for k, r in rate.items():
        print(f"{k:<{width}}  {r:>12,.0f}  {r / rate['loop']:>7.2f}x  "
              f"{rate['numba'] / r:>8.2f}x")
    print("targets: numba >= " + ", ".join(f"{t:g}x {k}" for k, t in TARGETS.items()))
    for k, t in TARGETS.items():
        if k in rate:
            got = rate["numba"] / rate[k]
            print(f"  numba / {k}: {got:.1f}x (target {t:g}x): "
                  f"{'met' if got >= t else 'NOT met'}")
        else:
            print(f"  numba / {k}: not measured (gymnasium not installed)")
    return rate


if __name__ == "__main__":
    main()
