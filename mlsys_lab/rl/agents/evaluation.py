"""Greedy evaluation: the mean return of a policy over whole episodes, and the record a training
run keeps of its evaluations (:class:`TrainingRecord`)."""

import time

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


class TrainingRecord:
    """What ``DQN.learn`` and ``PPO.learn`` report, kept in one place: the ``history`` dict,
    the training clock (evaluations excluded), the best evaluated weights and the step at which
    the greedy mean first reached ``target_return``."""

    def __init__(self, agent, env_fn, eval_episodes, target_return, until, log, name):
        self.agent, self.env_fn, self.episodes = agent, env_fn, eval_episodes
        self.target, self.until, self.log, self.name = target_return, until, log, name
        self.history = {"steps": 0, "seconds": 0.0, "evals": [], "solved_at": None,
                        "best": -np.inf, "episodes": [], "train_solved_at": None,
                        "solved_seconds": None}
        self.best_state, self.t0, self.spent_eval = None, time.perf_counter(), 0.0

    def training_seconds(self):
        return time.perf_counter() - self.t0 - self.spent_eval

    def episode(self, step, episode_return):
        """A finished training episode; True when training should stop (``until="training"``)."""
        return record_episode(self.history, step, episode_return, self.target, self.until)

    def evaluate(self, step):
        """Evaluate the greedy policy now; True when training should stop (``until="greedy"``
        and the target reached)."""
        e0 = time.perf_counter()
        mean = float(evaluate(self.agent.act, self.env_fn, self.episodes).mean())
        trained = e0 - self.t0 - self.spent_eval
        self.spent_eval += time.perf_counter() - e0
        history = self.history
        history["evals"].append((step, mean))
        if self.log:
            self.log(f"{self.name} step {step}: greedy mean return {mean:.1f}")
        if mean >= history["best"]:
            history["best"], self.best_state = mean, self.agent.state_dict()
        if self.target is not None and mean >= self.target:
            if history["solved_at"] is None:
                history["solved_at"], history["solved_seconds"] = step, trained
            return self.until == "greedy"
        return False

    def finish(self, grad_steps):
        """Close the record: training time, gradient steps, and the best weights restored."""
        self.history["seconds"] = self.training_seconds()
        self.history["grad_steps"] = grad_steps
        if self.best_state is not None:
            self.agent.load_state_dict(self.best_state)
        return self.history
