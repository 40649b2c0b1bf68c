"""DQN (Mnih et al. 2015): a Q-network, a target network, a replay buffer, epsilon-greedy."""

from dataclasses import asdict, dataclass

import numpy as np

from ... import ops
from ...engine.threads import limit_threads
from ...errors import ArgumentError
from .evaluation import TrainingRecord, env_sizes
from .networks import GradStep, call, forward, mlp
from .replay import ReplayBuffer


@dataclass
class DQNConfig:
    """DQN's hyper-parameters (defaults: a CartPole-v1 setting close to RL Zoo's)."""

    hidden: tuple = (256, 256)
    lr: float = 2.3e-3
    gamma: float = 0.99
    buffer_size: int = 100_000
    batch_size: int = 64
    learning_starts: int = 1_000
    train_freq: int = 256          # env steps between training phases
    gradient_steps: int = 128      # gradient steps per phase
    target_update: int = 10        # env steps between hard target-network copies
    eps_start: float = 1.0
    eps_end: float = 0.04
    exploration_fraction: float = 0.16  # of total_steps, linear decay
    loss: str = "huber"            # or "mse"
    double: bool = False           # Double DQN's target
    compiled: bool = True


def huber(x, delta=1.0):
    """Huber loss elementwise: ``x^2 / 2`` for ``|x| <= delta``, linear beyond."""
    a = ops.abs(x)
    q = ops.minimum(a, delta)
    return 0.5 * q * q + delta * (a - q)


class DQN:
    """A DQN agent for a discrete-action environment.

    Args:
        obs_size: observation length. n_actions: number of actions.
        config: a :class:`DQNConfig` (keyword overrides below win).
        seed: seeds the network, the buffer and exploration.
        **overrides: any :class:`DQNConfig` field.
    """

    def __init__(self, obs_size, n_actions, config=None, seed=0, **overrides):
        cfg = asdict(config or DQNConfig())
        unknown = set(overrides) - set(cfg)
        if unknown:
            raise ArgumentError(f"DQN: unknown settings {sorted(unknown)}; known: {sorted(cfg)}")
        cfg.update(overrides)
        self.config = DQNConfig(**cfg)
        if self.config.loss not in ("huber", "mse"):
            raise ArgumentError(f"DQN: loss={self.config.loss!r}, expected 'huber' or 'mse'")
        self.obs_size, self.n_actions, self.seed = int(obs_size), int(n_actions), seed
        self.rng = np.random.default_rng(seed)
        sizes = (self.obs_size, *self.config.hidden, self.n_actions)
        self.q = mlp(sizes, "relu", rng=self.rng, out_gain=1.0)
        self.target = mlp(sizes, "relu", rng=0)
        self.sync_target()
        self._step = None

    # -- acting ---------------------------------------------------------------------------
    def q_values(self, obs):
        return forward(self.q, np.asarray(obs, np.float32).reshape(-1, self.obs_size))

    def act(self, obs, epsilon=0.0):
        """Greedy actions for a batch of observations, random with probability ``epsilon``."""
        greedy = self.q_values(obs).argmax(axis=1)
        if epsilon > 0:
            explore = self.rng.random(len(greedy)) < epsilon
            greedy = np.where(explore, self.rng.integers(0, self.n_actions, len(greedy)),
                              greedy)
        return greedy

    def epsilon(self, step, total_steps):
        c = self.config
        frac = min(1.0, step / max(1.0, c.exploration_fraction * total_steps))
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    def sync_target(self):
        """Copy the online network's weights into the target network."""
        self.target.load_state_dict({k: v.copy() for k, v in self.q.state_dict().items()})

    # -- learning -------------------------------------------------------------------------
    def loss_fn(self, params, obs, actions_onehot, targets):
        q = call(self.q, params, obs)
        q_taken = ops.sum(q * actions_onehot, axis=1)
        err = q_taken - targets
        per = huber(err) if self.config.loss == "huber" else 0.5 * err * err
        return ops.mean(per)

    def targets(self, batch):
        """``r + gamma (1 - terminated) max_a Q_target(s', a)`` (Double DQN: the online
        network picks ``a``, the target network values it)."""
        q_next = forward(self.target, batch["next_obs"])
        if self.config.double:
            pick = self.q_values(batch["next_obs"]).argmax(axis=1)
            best = q_next[np.arange(len(pick)), pick]
        else:
            best = q_next.max(axis=1)
        return (batch["rewards"] + self.config.gamma * (1.0 - batch["terminated"])
                * best).astype(np.float32)

    def train_step(self, batch):
        """One gradient step on a sampled batch; returns the loss."""
        onehot = np.eye(self.n_actions, dtype=np.float32)[batch["actions"]]
        obs = batch["obs"].astype(np.float32)
        tgt = self.targets(batch)
        if self._step is None:
            self._step = GradStep(self.q, self.loss_fn, (obs, onehot, tgt), lr=self.config.lr,
                                  compiled=self.config.compiled)
        return self._step(obs, onehot, tgt)

    def learn(self, env_fn, total_steps, eval_every=None, eval_episodes=20, target_return=None,
              log=None, time_limit=None, until="greedy"):
        """Train on one environment for up to ``total_steps`` environment steps.

        Every ``eval_every`` steps the greedy policy plays ``eval_episodes`` episodes (not
        counted as training steps); the best evaluated weights are kept and restored at the
        end. Training stops early once the greedy mean reaches ``target_return``
        (``until="greedy"``) or once the last 20 *training* episodes (exploring, as CleanRL
        reports its returns) average ``target_return`` (``until="training"``).

        Returns:
            a dict: ``steps``, ``seconds`` (training wall time, evaluations excluded),
            ``evals`` (list of (step, mean return)), ``solved_at`` (the step at which the greedy
            mean first reached ``target_return``, or None), ``solved_seconds`` (the training
            time by then), ``best``, ``episodes`` (step and
            return of each finished training episode), ``train_solved_at`` (the step at which
            the last 20 training episodes first averaged ``target_return``, or None).
        """
        with limit_threads(blas=1):  # small matrices: more BLAS threads only contend
            return self._learn(env_fn, total_steps, eval_every, eval_episodes, target_return,
                               log, time_limit, until)

    def _learn(self, env_fn, total_steps, eval_every, eval_episodes, target_return, log,
               time_limit, until):
        if until not in ("greedy", "training"):
            raise ArgumentError(f"{type(self).__name__}.learn: until={until!r}, expected "
                                f"'greedy' or 'training'")
        c = self.config
        env = env_fn()
        obs_size, _ = env_sizes(env)
        buffer = ReplayBuffer(c.buffer_size, (obs_size,), seed=self.rng)
        obs, _ = env.reset(seed=int(self.seed))
        record = TrainingRecord(self, env_fn, eval_episodes, target_return, until, log, "dqn")
        history, episode_return = record.history, 0.0
        for step in range(1, total_steps + 1):
            action = int(self.act(obs, self.epsilon(step, total_steps))[0])
            next_obs, reward, term, trunc, _ = env.step(action)
            buffer.add(obs, action, reward, next_obs, float(term))
            history["steps"] = step
            obs = next_obs
            episode_return += reward
            if term or trunc:
                obs, _ = env.reset()
                if record.episode(step, episode_return):
                    break
                episode_return = 0.0
            if step > c.learning_starts and step % c.train_freq == 0:
                for _ in range(c.gradient_steps):
                    self.train_step(buffer.sample(c.batch_size))
            if step % c.target_update == 0:
                self.sync_target()
            if eval_every and step % eval_every == 0 and step > c.learning_starts:
                if record.evaluate(step):
                    break
            if time_limit and record.training_seconds() > time_limit:
                break
        return record.finish(self._step.steps if self._step is not None else 0)

    # -- saving ---------------------------------------------------------------------------
    def state_dict(self):
        return {f"q.{k}": v.copy() for k, v in self.q.state_dict().items()}

    def load_state_dict(self, state):
        self.q.load_state_dict({k[2:]: v for k, v in state.items() if k.startswith("q.")})
        self.sync_target()
