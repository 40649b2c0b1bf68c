"""Generalised advantage estimation (GAE; Schulman et al. 2016), PPO's advantages."""

import numpy as np

from ...errors import ArgumentError, ShapeError


def gae(rewards, values, dones, last_value, gamma=0.99, lam=0.95):
    """Advantages ``A_t = sum_k (gamma lam)^k delta_{t+k}`` within each episode.

    ``delta_t = r_t + gamma (1 - done_t) V_{t+1} - V_t``, where ``V_{T} = last_value`` (the
    value of the observation after the rollout) and ``done_t = 1`` means the episode ended
    at step ``t`` (terminated: nothing follows it; the sum stops there too). A truncated
    episode (time limit) is not terminal for the value: fold ``gamma V(final obs)`` into its
    last reward and mark it done, as :class:`~.ppo.PPO` does.

    Computed by the backward recursion ``A_t = delta_t + gamma lam (1 - done_t) A_{t+1}``.

    Args:
        rewards, values, dones: arrays of shape ``(T,)`` or ``(T, N)`` (N environments).
        last_value: ``V`` of the observation after step ``T - 1``: a number or shape ``(N,)``.
        gamma: discount in [0, 1]. lam: GAE's lambda in [0, 1].

    Returns:
        ``(advantages, returns)`` with ``returns = advantages + values`` (the value
        targets), float64 unless every input is float32.

    Raises:
        ShapeError: the shapes disagree. ArgumentError: gamma or lam outside [0, 1].
    """
    rewards, values, dones = np.asarray(rewards), np.asarray(values), np.asarray(dones)
    last_value = np.asarray(last_value)
    if not (rewards.shape == values.shape == dones.shape) or rewards.ndim not in (1, 2):
        raise ShapeError(f"gae: rewards {rewards.shape}, values {values.shape} and dones "
                         f"{dones.shape} must share one shape (T,) or (T, N)")
    if last_value.shape not in ((), rewards.shape[1:]):
        raise ShapeError(f"gae: last_value has shape {last_value.shape}, expected "
                         f"{rewards.shape[1:]} (one per environment)")
    for name, v in (("gamma", gamma), ("lam", lam)):
        if not 0.0 <= float(v) <= 1.0:
            raise ArgumentError(f"gae: {name}={v!r} must lie in [0, 1]")
    dtype = np.result_type(rewards.dtype, values.dtype, np.float32)
    not_done = 1.0 - dones.astype(dtype)
    adv = np.zeros(rewards.shape, dtype)
    running = np.zeros(rewards.shape[1:], dtype)
    next_value = np.broadcast_to(last_value, rewards.shape[1:]).astype(dtype)
    for t in range(len(rewards) - 1, -1, -1):
        delta = rewards[t] + gamma * not_done[t] * next_value - values[t]
        running = delta + gamma * lam * not_done[t] * running
        adv[t] = running
        next_value = values[t]
    return adv, adv + values
