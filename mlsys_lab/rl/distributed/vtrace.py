"""V-trace (Espeholt et al. 2018, IMPALA): off-policy value targets for trajectories that a
possibly stale behaviour policy generated."""

from dataclasses import dataclass

import numpy as np

from ...errors import ArgumentError, ShapeError


@dataclass
class VTrace:
    """What :func:`vtrace` returns (arrays shaped like ``rewards``).

    Attributes:
        vs: the V-trace value targets ``v_s``.
        pg_advantages: ``rho_s (r_s + gamma_s v_{s+1} - V(x_s))`` with ``rho_s`` clipped at
            ``clip_pg_rho``: the policy gradient's advantage.
        rhos: the importance ratios ``pi(a|x) / mu(a|x)``, unclipped.
    """

    vs: np.ndarray
    pg_advantages: np.ndarray
    rhos: np.ndarray


def vtrace(behaviour_logp, target_logp, rewards, discounts, values, bootstrap_value,
           clip_rho=1.0, clip_c=1.0, clip_pg_rho=1.0):
    """V-trace targets for one unroll of length ``T`` (time first).

    With ``rho_t = min(clip_rho, pi/mu)``, ``c_t = min(clip_c, pi/mu)`` and
    ``delta_t = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))``, the paper's definition is
    ``v_s = V(x_s) + sum_{t >= s} (gamma_s ... gamma_{t-1}) (c_s ... c_{t-1}) delta_t``; it is
    computed here by the equivalent backward recursion
    ``v_s - V(x_s) = delta_s + gamma_s c_s (v_{s+1} - V(x_{s+1}))``, ``v_T = V(x_T)``.
    ``gamma_t`` is the discount after step ``t``: ``gamma`` within an episode, 0 where it
    ended. On-policy (``pi = mu``, no clipping active) ``v_s`` is the n-step return.

    Args:
        behaviour_logp: ``log mu(a_t | x_t)`` of the actions taken, shape ``(T,)`` or
            ``(T, B)``.
        target_logp: ``log pi(a_t | x_t)`` under the learner's current policy.
        rewards, discounts, values: ``r_t``, ``gamma_t``, ``V(x_t)``; same shape.
        bootstrap_value: ``V(x_T)``, shape ``()`` or ``(B,)``.
        clip_rho, clip_c, clip_pg_rho: the truncation levels rho-bar, c-bar and the policy
            gradient's rho-bar (None: no clipping).

    Returns:
        a :class:`VTrace` (float64).

    Raises:
        ShapeError: the shapes disagree. ArgumentError: a clipping level below 0.
    """
    arrays = [np.asarray(a, np.float64) for a in
              (behaviour_logp, target_logp, rewards, discounts, values)]
    shape = arrays[0].shape
    if any(a.shape != shape for a in arrays) or len(shape) not in (1, 2) or shape[0] == 0:
        raise ShapeError(f"vtrace: behaviour_logp, target_logp, rewards, discounts and values "
                         f"must share one shape (T,) or (T, B) with T >= 1, got "
                         f"{[a.shape for a in arrays]}")
    mu_logp, pi_logp, r, gam, v = arrays
    boot = np.asarray(bootstrap_value, np.float64)
    if boot.shape not in ((), shape[1:]):
        raise ShapeError(f"vtrace: bootstrap_value has shape {boot.shape}, expected "
                         f"{shape[1:]}")
    for name, level in (("clip_rho", clip_rho), ("clip_c", clip_c),
                        ("clip_pg_rho", clip_pg_rho)):
        if level is not None and not level >= 0:
            raise ArgumentError(f"vtrace: {name}={level!r} must be >= 0 or None")
    rhos = np.exp(pi_logp - mu_logp)
    rho_bar = rhos if clip_rho is None else np.minimum(clip_rho, rhos)
    cs = rhos if clip_c is None else np.minimum(clip_c, rhos)
    next_values = np.concatenate([v[1:], np.broadcast_to(boot, shape[1:])[None]], axis=0)
    deltas = rho_bar * (r + gam * next_values - v)
    diff = np.zeros_like(v)  # v_s - V(x_s)
    acc = np.zeros(shape[1:])
    for t in range(shape[0] - 1, -1, -1):
        acc = deltas[t] + gam[t] * cs[t] * acc
        diff[t] = acc
    vs = v + diff
    vs_next = np.concatenate([vs[1:], np.broadcast_to(boot, shape[1:])[None]], axis=0)
    pg_rho = rhos if clip_pg_rho is None else np.minimum(clip_pg_rho, rhos)
    return VTrace(vs=vs, pg_advantages=pg_rho * (r + gam * vs_next - v), rhos=rhos)
