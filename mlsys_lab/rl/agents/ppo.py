"""PPO (Schulman et al. 2017): clipped surrogate objective over GAE, minibatch epochs."""

from dataclasses import asdict, dataclass

import numpy as np

from ... import ops
from ...engine.threads import limit_threads
from ...errors import ArgumentError
from ...nn import Module
from .advantage import gae
from .evaluation import TrainingRecord, env_sizes
from .networks import GradStep, call, forward, mlp


@dataclass
class PPOConfig:
    """PPO's hyper-parameters (defaults: RL Zoo's CartPole-v1 setting)."""

    hidden: tuple = (64, 64)
    n_envs: int = 8
    n_steps: int = 32              # steps per environment per rollout
    lr: float = 1e-3
    anneal_lr: bool = True         # linearly to 0 over total_steps
    gamma: float = 0.98
    lam: float = 0.8
    epochs: int = 20
    minibatch_size: int = 256
    clip: float = 0.2
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    normalize_advantages: bool = True
    compiled: bool = True


class ActorCritic(Module):
    """Separate policy and value MLPs (tanh), as CleanRL's PPO: ``forward(obs) -> (logits,
    value)``."""

    def __init__(self, obs_size, n_actions, hidden=(64, 64), rng=None):
        super().__init__()
        rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        self.pi = mlp((obs_size, *hidden, n_actions), "tanh", rng=rng, out_gain=0.01)
        self.v = mlp((obs_size, *hidden, 1), "tanh", rng=rng, out_gain=1.0)

    def forward(self, obs):
        return self.pi(obs), self.v(obs)


def ppo_loss(model, params, obs, actions_onehot, old_logp, advantages, returns, clip=0.2,
             vf_coef=0.5, ent_coef=0.0, weights=None):
    """PPO's loss: ``-E[min(rho A, clip(rho, 1-eps, 1+eps) A)] + vf_coef * E[(V - R)^2] / 2
    - ent_coef * entropy`` with ``rho = pi(a|s) / pi_old(a|s)``.

    ``weights`` (0/1 per sample, optional) turns each mean into a weighted one: samples with
    weight 0 (a vector env's auto-reset steps, whose action did nothing) drop out."""
    logits, value = call(model, params, obs)
    logp_all = ops.log_softmax(logits, axis=1)
    logp = ops.sum(logp_all * actions_onehot, axis=1)
    ratio = ops.exp(logp - old_logp)
    clipped = ops.minimum(ops.maximum(ratio, 1.0 - clip), 1.0 + clip)

    def mean(x):
        return ops.mean(x) if weights is None else ops.sum(x * weights) / ops.sum(weights)

    policy_loss = -mean(ops.minimum(ratio * advantages, clipped * advantages))
    v = ops.reshape(value, (-1,))
    value_loss = 0.5 * mean((v - returns) * (v - returns))
    loss = policy_loss + vf_coef * value_loss
    if ent_coef:
        entropy = -mean(ops.sum(ops.exp(logp_all) * logp_all, axis=1))
        loss = loss - ent_coef * entropy
    return loss


def log_softmax_np(logits):
    z = logits - logits.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


class PPO:
    """A PPO agent for a discrete-action environment.

    Args:
        obs_size: observation length. n_actions: number of actions.
        config: a :class:`PPOConfig` (keyword overrides below win).
        seed: seeds the networks, the environments and the action sampling.
        **overrides: any :class:`PPOConfig` field.
    """

    def __init__(self, obs_size, n_actions, config=None, seed=0, **overrides):
        cfg = asdict(config or PPOConfig())
        unknown = set(overrides) - set(cfg)
        if unknown:
            raise ArgumentError(f"PPO: unknown settings {sorted(unknown)}; known: {sorted(cfg)}")
        cfg.update(overrides)
        self.config = c = PPOConfig(**cfg)
        if (c.n_envs * c.n_steps) % c.minibatch_size:
            raise ArgumentError(f"PPO: the rollout (n_envs * n_steps = {c.n_envs * c.n_steps}) "
                                f"must split into minibatches of {c.minibatch_size}")
        self.obs_size, self.n_actions, self.seed = int(obs_size), int(n_actions), seed
        self.rng = np.random.default_rng(seed)
        self.model = ActorCritic(self.obs_size, self.n_actions, c.hidden, rng=self.rng)
        self._step = None

    # -- acting ---------------------------------------------------------------------------
    def logits(self, obs):
        return forward(self.model.pi, np.asarray(obs, np.float32).reshape(-1, self.obs_size))

    def value(self, obs):
        return forward(self.model.v, np.asarray(obs, np.float32).reshape(-1, self.obs_size))[:, 0]

    def act(self, obs):
        """Greedy (most probable) actions for a batch of observations."""
        return self.logits(obs).argmax(axis=1)

    def sample(self, obs):
        """Sampled actions and their log-probabilities under the current policy."""
        logp = log_softmax_np(self.logits(obs))
        u = self.rng.random((len(logp), 1))
        actions = (np.exp(logp).cumsum(axis=1) < u).sum(axis=1).clip(0, self.n_actions - 1)
        return actions, logp[np.arange(len(actions)), actions]

    # -- learning -------------------------------------------------------------------------
    def loss_fn(self, params, obs, onehot, old_logp, adv, ret, weights):
        c = self.config
        return ppo_loss(self.model, params, obs, onehot, old_logp, adv, ret, c.clip,
                        c.vf_coef, c.ent_coef, weights)

    def update(self, rollout):
        """Minibatch epochs of the clipped objective over one rollout (flattened arrays
        ``obs``, ``actions``, ``logp``, ``advantages``, ``returns``, ``weights``); returns the
        mean loss."""
        c = self.config
        n = len(rollout["obs"])
        onehot = np.eye(self.n_actions, dtype=np.float32)[rollout["actions"]]
        losses = []
        for _ in range(c.epochs):
            order = self.rng.permutation(n)
            for start in range(0, n, c.minibatch_size):
                i = order[start:start + c.minibatch_size]
                adv, w = rollout["advantages"][i], rollout["weights"][i]
                if c.normalize_advantages and w.sum() > 1:
                    real = adv[w > 0]
                    adv = (adv - real.mean()) / (real.std() + 1e-8) * w
                batch = (rollout["obs"][i], onehot[i], rollout["logp"][i],
                         adv.astype(np.float32), rollout["returns"][i], w)
                if self._step is None:
                    self._step = GradStep(self.model, self.loss_fn, batch, lr=c.lr,
                                          max_grad_norm=c.max_grad_norm, compiled=c.compiled,
                                          eps=1e-5)
                losses.append(self._step(*batch))
        return float(np.mean(losses))

    def collect(self, envs, obs):
        """One rollout of ``n_steps`` from every env in ``envs`` starting at ``obs``;
        returns ``(rollout, obs after it)``. A truncated episode's last reward gets
        ``gamma V(final obs)`` (its value was not zero) and counts as done."""
        c = self.config
        t_, n_ = c.n_steps, len(envs)
        buf = {"obs": np.zeros((t_, n_, self.obs_size), np.float32),
               "actions": np.zeros((t_, n_), np.int64), "logp": np.zeros((t_, n_), np.float32),
               "rewards": np.zeros((t_, n_), np.float32), "dones": np.zeros((t_, n_), np.float32),
               "values": np.zeros((t_, n_), np.float32)}
        finished = []
        for t in range(t_):
            buf["obs"][t] = obs
            actions, logp = self.sample(obs)
            buf["actions"][t], buf["logp"][t], buf["values"][t] = actions, logp, self.value(obs)
            for j, env in enumerate(envs):
                o, r, term, trunc, _ = env.step(int(actions[j]))
                self._episode_return[j] += r
                if trunc and not term:
                    r += c.gamma * float(self.value(o)[0])
                buf["rewards"][t, j], buf["dones"][t, j] = r, float(term or trunc)
                if term or trunc:
                    finished.append(self._episode_return[j])
                    self._episode_return[j] = 0.0
                    o, _ = env.reset()
                obs[j] = o
        adv, ret = gae(buf["rewards"], buf["values"], buf["dones"], self.value(obs), c.gamma,
                       c.lam)
        flat = {k: buf[k].reshape(t_ * n_, *buf[k].shape[2:])
                for k in ("obs", "actions", "logp")}
        flat["advantages"] = adv.reshape(-1).astype(np.float32)
        flat["returns"] = ret.reshape(-1).astype(np.float32)
        flat["weights"] = np.ones(t_ * n_, np.float32)
        flat["episode_returns"] = finished
        return flat, obs

    def collect_vector(self, venv, obs):
        """:meth:`collect` from a vector env with Gymnasium's NEXT_STEP auto-reset
        (:mod:`mlsys_lab.rl.vector`): the step after an episode's end only resets its copy
        (reward 0, the action ignored), so it gets weight 0 and counts as done; a truncated
        episode's last step returns the final observation, which bootstraps its reward."""
        c = self.config
        t_, n_ = c.n_steps, venv.num_envs
        buf = {k: np.zeros((t_, n_), np.float32)
               for k in ("logp", "rewards", "dones", "values", "weights")}
        buf["obs"] = np.zeros((t_, n_, self.obs_size), np.float32)
        buf["actions"] = np.zeros((t_, n_), np.int64)
        finished = []
        for t in range(t_):
            buf["obs"][t] = obs
            actions, logp = self.sample(obs)
            buf["actions"][t], buf["logp"][t], buf["values"][t] = actions, logp, self.value(obs)
            resetting = self._needs_reset.copy()
            obs, r, term, trunc, _ = venv.step(actions)
            obs = np.asarray(obs, np.float32)
            r = np.where(resetting, 0.0, r)
            ended = (term | trunc) & ~resetting
            self._episode_return += r
            bootstrap = trunc & ~term & ~resetting
            if bootstrap.any():
                r = r + c.gamma * np.where(bootstrap, self.value(obs), 0.0)
            buf["rewards"][t] = r
            buf["dones"][t] = ended | resetting
            buf["weights"][t] = ~resetting
            finished.extend(self._episode_return[ended].tolist())
            self._episode_return[ended] = 0.0
            self._needs_reset = ended
        adv, ret = gae(buf["rewards"], buf["values"], buf["dones"], self.value(obs), c.gamma,
                       c.lam)
        flat = {k: buf[k].reshape(t_ * n_, *buf[k].shape[2:])
                for k in ("obs", "actions", "logp", "weights")}
        flat["advantages"] = (adv * buf["weights"]).reshape(-1).astype(np.float32)
        flat["returns"] = ret.reshape(-1).astype(np.float32)
        flat["episode_returns"] = finished
        return flat, obs

    def learn(self, env_fn, total_steps, eval_every=None, eval_episodes=20, target_return=None,
              log=None, time_limit=None, until="greedy", vector_env=None):
        """Train for up to ``total_steps`` environment steps (all envs together).

        ``vector_env``: collect rollouts from this vector environment (NEXT_STEP
        auto-reset, e.g. :class:`~mlsys_lab.rl.vector.NumbaCartPoleVectorEnv`) instead of
        ``n_envs`` copies made by ``env_fn`` (still used for the evaluations); its
        ``num_envs`` must equal ``n_envs``.

        Evaluation, early stopping and the returned history as :meth:`DQN.learn
        <mlsys_lab.rl.agents.dqn.DQN.learn>` (the greedy policy, checked after the first
        rollout that passes each multiple of ``eval_every``).
        """
        with limit_threads(blas=1):  # small matrices: more BLAS threads only contend
            return self._learn(env_fn, total_steps, eval_every, eval_episodes, target_return,
                               log, time_limit, until, vector_env)

    def _learn(self, env_fn, total_steps, eval_every, eval_episodes, target_return, log,
               time_limit, until, vector_env=None):
        if until not in ("greedy", "training"):
            raise ArgumentError(f"{type(self).__name__}.learn: until={until!r}, expected "
                                f"'greedy' or 'training'")
        c = self.config
        if vector_env is not None:
            if vector_env.num_envs != c.n_envs:
                raise ArgumentError(f"PPO.learn: the vector env has {vector_env.num_envs} "
                                    f"copies, the config n_envs={c.n_envs}")
            obs = np.asarray(vector_env.reset(seed=int(self.seed) * 1000)[0], np.float32)
            self._needs_reset = np.zeros(c.n_envs, bool)
        else:
            envs = [env_fn() for _ in range(c.n_envs)]
            env_sizes(envs[0])
            obs = np.stack([np.asarray(e.reset(seed=int(self.seed) * 1000 + i)[0], np.float32)
                            for i, e in enumerate(envs)])
        self._episode_return = np.zeros(c.n_envs)
        record = TrainingRecord(self, env_fn, eval_episodes, target_return, until, log, "ppo")
        history, next_eval = record.history, eval_every
        per_rollout = c.n_envs * c.n_steps
        iterations = max(1, total_steps // per_rollout)
        for it in range(iterations):
            if c.anneal_lr and self._step is not None:
                self._step.optimizer.hyper["lr"] = c.lr * (1.0 - it / iterations)
            rollout, obs = self.collect_vector(vector_env, obs) if vector_env is not None \
                else self.collect(envs, obs)
            self.update(rollout)
            steps = history["steps"] = (it + 1) * per_rollout
            stop = False
            for ret in rollout["episode_returns"]:
                stop = record.episode(steps, ret) or stop
            if stop:
                break
            if eval_every and steps >= next_eval:
                next_eval += eval_every
                if record.evaluate(steps):
                    break
            if time_limit and record.training_seconds() > time_limit:
                break
        return record.finish(self._step.steps if self._step is not None else 0)

    # -- saving ---------------------------------------------------------------------------
    def state_dict(self):
        return {k: v.copy() for k, v in self.model.state_dict().items()}

    def load_state_dict(self, state):
        self.model.load_state_dict(state)
