"""Greedy evaluation: the mean return of a policy over whole episodes."""

import numpy as np

from ...engine.threads import limit_threads
from ...errors import ArgumentError


def env_sizes(env):
    """``(observation size, number of actions)`` of a Gymnasium-shaped discrete-action env."""
    obs_space, act_space = getattr(env, "observation_space", None), \
        getattr(env, "action_space", None)
    if obs_space is None or not hasattr(act_space, "n"):
        raise ArgumentError(f"{type(env).__name__}: need observation_space and a Discrete "
                            f"action_space (with .n) as Gymnasium's")
    return int(np.prod(obs_space.shape)), int(act_space.n)


def evaluate(policy, env_fn, episodes=20, seed=10_000, max_steps=100_000):
    """Returns of ``episodes`` whole episodes, all run side by side.

    Args:
        policy: ``policy(obs_batch) -> actions`` (an agent's ``act``; greedy is usual).
        env_fn: makes one environment (Gymnasium API).
        episodes: how many episodes (one environment each).
        seed: episode ``i`` resets with ``seed + i``.
        max_steps: a guard against environments that never end.

    Returns:
        numpy array of the ``episodes`` undiscounted returns.
    """
    if episodes < 1:
        raise ArgumentError(f"evaluate: episodes must be >= 1, got {episodes}")
    with limit_threads(blas=1):  # a batch of <= `episodes` rows: BLAS threads only contend
        return _play(policy, env_fn, episodes, seed, max_steps)


def _play(policy, env_fn, episodes, seed, max_steps):
    envs = [env_fn() for _ in range(episodes)]
    obs = np.stack([np.asarray(e.reset(seed=seed + i)[0], np.float32)
                    for i, e in enumerate(envs)])
    returns = np.zeros(episodes)
    live = np.ones(episodes, bool)
    for _ in range(max_steps):
        idx = np.flatnonzero(live)
        if len(idx) == 0:
            break
        actions = np.asarray(policy(obs[idx]))
        for j, a in zip(idx, actions):
            o, r, term, trunc, _ = envs[j].step(int(a))
            returns[j] += r
            obs[j] = o
            if term or trunc:
                live[j] = False
    for e in envs:
        if hasattr(e, "close"):
            e.close()
    return returns


def record_episode(history, step, episode_return, target_return, until, window=20):
    """Note a finished training episode in ``history``; True when ``until == "training"``
    and the last ``window`` training episodes' mean has reached ``target_return``."""
    history["episodes"].append((step, float(episode_return)))
    recent = [r for _, r in history["episodes"][-window:]]
    if target_return is not None and len(recent) == window and np.mean(recent) >= target_return:
        history["train_solved_at"] = history["train_solved_at"] or step
        return until == "training"
    return False
