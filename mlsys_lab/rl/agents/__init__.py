"""Reinforcement-learning agents on the engine (chapter 15): replay, GAE, DQN, PPO.

Public names (the chapter notebook and the exercises refer to these)::

    from mlsys_lab.rl.agents import ReplayBuffer, gae, DQN, PPO, evaluate, load_pretrained

* ``ReplayBuffer(capacity, obs_shape, seed=...)`` — uniform sampling, ring eviction (the
  oldest transition is overwritten first); ``add``, ``add_batch``, ``sample(batch_size)``.
* ``gae(rewards, values, dones, last_value, gamma, lam)`` — generalised advantage
  estimation (Schulman et al. 2016); returns ``(advantages, returns)``.
* ``DQN`` — target network, epsilon-greedy, Huber or MSE loss, on ``mlsys_lab.nn`` /
  ``mlsys_lab.optim`` with a compiled loss-and-gradient step.
* ``PPO`` — clipped objective, value loss, entropy bonus, minibatch epochs over GAE; collects
  from ``n_envs`` single environments or from a NEXT_STEP vector env (``learn(...,
  vector_env=NumbaCartPoleVectorEnv(8))``).
* ``evaluate(policy, env_fn, episodes)`` — greedy returns; ``load_pretrained("dqn"|"ppo")``
  — the committed CartPole-v1 policies (``weights/*.npz``).

Distributed RL lives in :mod:`mlsys_lab.rl.distributed` (``vtrace``, ``ActorLearner``,
``simulate_actor_learner``, ``simulate_a3c``).
"""

from .advantage import gae
from .dqn import DQN, DQNConfig, huber
from .evaluation import evaluate
from .networks import GradStep, mlp
from .ppo import PPO, ActorCritic, PPOConfig, ppo_loss
from .pretrained import load_agent, load_pretrained, save_agent
from .replay import ReplayBuffer

__all__ = ["ReplayBuffer", "gae", "DQN", "DQNConfig", "PPO", "PPOConfig", "ActorCritic",
           "ppo_loss", "huber", "evaluate", "GradStep", "mlp", "load_agent", "load_pretrained",
           "save_agent"]
