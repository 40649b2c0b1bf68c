"""Regenerate ``tests/data/gymnasium_cartpole_reference.npz``: Gymnasium's CartPole-v1 answers.

Run from the repository root where gymnasium is installed (CI never needs it)::

    python tests/data/make_gymnasium_reference.py

Written with gymnasium 1.4.0 (the version is stored in the file as ``gymnasium_version``).
Arrays only, no pickle. For each case ``c<k>`` it stores one environment's record, row by row:
``kind`` (0 a reset, 1 a step), ``seed`` (the reset's seed, -1 for none or for a step),
``action`` (-1 for a reset), ``obs`` (float32, what reset/step returned), ``state`` (float64,
``env.unwrapped.state`` afterwards), ``reward``, ``terminated``, ``truncated``.
The actions come from a seeded generator, or from a balancing controller (to reach the
500-step truncation), and one case keeps stepping after termination without a reset.
It also stores ``vec_*``: a ``gymnasium.vector.SyncVectorEnv`` of 4 CartPole-v1 copies (default
NEXT_STEP auto-reset) reset with seed 10 and stepped 400 times with seeded random actions, and
``discrete_samples``: ``Discrete(2, seed=3).sample()`` 32 times.
"""

import os

import gymnasium as gym
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gymnasium_cartpole_reference.npz")

#: case -> (reset seed, number of steps, policy, reset after an episode ends)
CASES = {
    "c0": (0, 300, "random", True),
    "c1": (1, 300, "random", True),
    "c2": (2, 300, "random", True),
    "c3": (123456789, 300, "random", True),
    "c4": (7, 620, "balance", True),
    "c5": (8, 520, "balance", True),
    "c6": (3, 60, "random", False),
}


def policy(kind, obs, rng):
    if kind == "random":
        return int(rng.integers(2))
    x, x_dot, theta, theta_dot = (float(v) for v in obs)
    return int(theta + 0.5 * theta_dot + 0.01 * x + 0.05 * x_dot > 0)


def record(seed, steps, kind, reset_after_end):
    env = gym.make("CartPole-v1")
    rng = np.random.default_rng(1000 + seed)
    rows = {k: [] for k in ("kind", "seed", "action", "obs", "state", "reward", "terminated",
                            "truncated")}

    def add(k, s, a, obs, r, te, tr):
        for key, v in zip(rows, (k, s, a, obs, np.array(env.unwrapped.state, dtype=np.float64),
                                 r, te, tr)):
            rows[key].append(v)

    obs, _ = env.reset(seed=seed)
    add(0, seed, -1, obs, 0.0, False, False)
    for _ in range(steps):
        a = policy(kind, obs, rng)
        obs, r, te, tr, _ = env.step(a)
        add(1, -1, a, obs, r, te, tr)
        if (te or tr) and reset_after_end:
            obs, _ = env.reset()
            add(0, -1, -1, obs, 0.0, False, False)
    env.close()
    return {k: np.array(v) for k, v in rows.items()}


def vector_record():
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)])
    rng = np.random.default_rng(99)
    obs, _ = envs.reset(seed=10)
    out = {"vec_reset_obs": obs, "vec_actions": [], "vec_obs": [], "vec_reward": [],
           "vec_terminated": [], "vec_truncated": []}
    for _ in range(400):
        a = rng.integers(2, size=4)
        obs, r, te, tr, _ = envs.step(a)
        for k, v in zip(("vec_actions", "vec_obs", "vec_reward", "vec_terminated",
                         "vec_truncated"), (a, obs, r, te, tr)):
            out[k].append(np.array(v))
    envs.close()
    return {k: np.array(v) for k, v in out.items()}


def main():
    arrays = {"gymnasium_version": np.array(gym.__version__)}
    for name, (seed, steps, kind, again) in CASES.items():
        for k, v in record(seed, steps, kind, again).items():
            arrays[f"{name}_{k}"] = v
    arrays.update(vector_record())
    space = gym.spaces.Discrete(2, seed=3)
    arrays["discrete_samples"] = np.array([space.sample() for _ in range(32)])
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT} (gymnasium {gym.__version__}, {len(arrays)} arrays)")


if __name__ == "__main__":
    main()
