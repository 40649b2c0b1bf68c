"""Saving and loading agents as ``.npz`` (no pickle): the weights and a JSON config."""

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ...errors import ArgumentError, CheckpointError
from .dqn import DQN
from .ppo import PPO

WEIGHTS = Path(__file__).with_name("weights")
KINDS = {"dqn": DQN, "ppo": PPO}


def save_agent(agent, path, **meta):
    """Write ``agent``'s weights and config (plus ``meta``, JSON-able) to ``path`` (.npz)."""
    kind = {DQN: "dqn", PPO: "ppo"}.get(type(agent))
    if kind is None:
        raise ArgumentError(f"save_agent: expected a DQN or PPO, got {type(agent).__name__}")
    header = {"kind": kind, "obs_size": agent.obs_size, "n_actions": agent.n_actions,
              "config": asdict(agent.config), "meta": meta}
    arrays = {f"w/{k}": v for k, v in agent.state_dict().items()}
    np.savez(path, __header__=np.array(json.dumps(header)), **arrays)


def load_agent(path):
    """The agent saved at ``path`` by :func:`save_agent`.

    Raises:
        CheckpointError: the file is not such an archive.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["__header__"]))
            state = {k[2:]: z[k] for k in z.files if k.startswith("w/")}
    except (OSError, KeyError, ValueError) as e:
        raise CheckpointError(f"load_agent: {path} is not a saved agent ({e})") from None
    cfg = header["config"]
    cfg["hidden"] = tuple(cfg["hidden"])
    agent = KINDS[header["kind"]](header["obs_size"], header["n_actions"], **cfg)
    agent.load_state_dict(state)
    agent.meta = header.get("meta", {})
    return agent


def load_pretrained(name):
    """The committed CartPole-v1 policy ``"dqn"`` or ``"ppo"`` (``weights/<name>_cartpole.npz``,
    written by ``python -m mlsys_lab.rl.agents.train``); act greedily with ``agent.act``."""
    if name not in KINDS:
        raise ArgumentError(f"load_pretrained: name={name!r}; known: {sorted(KINDS)}")
    return load_agent(WEIGHTS / f"{name}_cartpole.npz")
