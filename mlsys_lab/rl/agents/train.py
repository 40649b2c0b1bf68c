"""Train the committed CartPole-v1 policies.

    python -m mlsys_lab.rl.agents.train ppo --seed 0
    python -m mlsys_lab.rl.agents.train dqn --seed 0 --steps 100000

Trains until the greedy policy's 20-episode mean return reaches ``--target`` (checked every
``--eval-every`` steps; evaluation episodes are not training steps), then scores the result on
20 fresh episodes (reset seeds 0..19, not those used while training) and writes
``weights/<algo>_cartpole.npz`` only if that score also reaches the target.
"""

import argparse
import sys
import time

from ..envs import CartPole
from .dqn import DQN
from .evaluation import evaluate
from .ppo import PPO
from .pretrained import WEIGHTS, save_agent


def train(algo, seed=0, steps=None, target=475.0, eval_every=None, log=print):
    """Train ``algo`` ("dqn" or "ppo") on CartPole; returns ``(agent, history)``."""
    probe = CartPole()
    obs_size, n_actions = probe.observation_space.shape[0], probe.action_space.n
    if algo == "dqn":
        agent = DQN(obs_size, n_actions, seed=seed)
        steps, eval_every = steps or 100_000, eval_every or 2_000
    else:
        agent = PPO(obs_size, n_actions, seed=seed)
        steps, eval_every = steps or 100_000, eval_every or 5_120
    history = agent.learn(CartPole, steps, eval_every=eval_every, target_return=target, log=log)
    return agent, history


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algo", choices=("dqn", "ppo"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--eval-every", type=int, default=None)
    parser.add_argument("--out", default=None, help="default: weights/<algo>_cartpole.npz")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    agent, history = train(args.algo, args.seed, args.steps, args.target, args.eval_every)
    score = evaluate(agent.act, CartPole, episodes=20, seed=0).mean()
    print(f"{args.algo}: solved_at={history['solved_at']} steps, training "
          f"{history['seconds']:.1f} s (wall {time.perf_counter() - t0:.1f} s); fresh 20-episode "
          f"mean return {score:.1f}")
    if score < args.target:
        print(f"not saved: {score:.1f} < {args.target}")
        return 1
    out = args.out or WEIGHTS / f"{args.algo}_cartpole.npz"
    WEIGHTS.mkdir(exist_ok=True)
    save_agent(agent, out, env="CartPole-v1", seed=args.seed, solved_at=history["solved_at"],
               train_seconds=round(history["seconds"], 1), eval_mean_return=float(score))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
