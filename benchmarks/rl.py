"""Reinforcement learning (book chapter 15): DQN and PPO to a solved CartPole-v1, the
actor-learner's throughput on processes and on the simulator to 1,000 actors.

    python benchmarks/rl.py [--seeds 0 1 2] [--skip-dqn] [--cleanrl PATH/TO/cleanrl/ppo.py]

Prints:

1. **PPO and DQN to 475** — for each seed, environment steps and training wall time (greedy
   evaluations excluded) until the greedy policy's 20-episode mean return reaches 475
   ("greedy": steps, s), and until the last 20 *training* episodes average 475 ("training":
   the exploring policy's episodic return, what CleanRL reports; "train s" is the time to
   there, or the whole budget's when it never gets there, "None"). PPO runs RL Zoo's CartPole
   setting (8 envs x 32 steps, 20 epochs, lr 1e-3 annealed, gamma 0.98, lambda 0.8), DQN RL
   Zoo's (256x256, lr 2.3e-3, 64-batches, 128 gradient steps every 256 env steps, target copy
   every 10 steps). Budgets: PPO 200k steps, DQN 100k. "ppo-cleanrl" is this library's PPO
   with CleanRL ppo.py's default settings (4 envs x 128 steps, lr 2.5e-4 annealed, 4 epochs of
   4 minibatches, gamma 0.99, lambda 0.95, entropy 0.01; budget 500k), the like-for-like row
   for part 2.
2. **CleanRL's ppo.py** — its reported CartPole-v1 result (docs/rl-algorithms/ppo.md:
   490.04 +- 6.12 average episodic return after its default 500k steps; dqn.py 488.69 +-
   16.11) and, with ``--cleanrl PATH``, a run of that file at its defaults (seed 1, 4 envs x
   128 steps, 500k steps; torch + gymnasium) timed to the same "training" criterion. Two shims
   let the unmodified file run here: ``tyro.cli`` gives the defaults, ``SummaryWriter`` records
   instead of writing TensorBoard files; the vector env keeps Gymnasium 0.29's same-step
   auto-reset and ``final_info`` list (what the file was written for) on Gymnasium 1.x; torch
   runs one thread. ``--cleanrl-timeout`` (default 600 s) stops it, reporting how far it got.
3. **Actor-learner on processes** — frames/s with 1, 2, 4 actor processes (4 CartPoles each,
   unrolls of 32), best of 3 rounds of ``--seconds`` each: the learner consuming with V-trace
   updates, and the actors alone (the learner only draining the queue), the two alternating
   on the same actors; mean policy lag in updates. Beside it A3C
   with as many workers (one CartPole each, unrolls of 32, gradients computed in the workers
   on the eager tape, Hogwild updates) and its lag.
4. **Simulated scaling** — ``simulate_actor_learner`` at 1 ... 1,000 actors, with the actor's
   seconds per frame and the learner's seconds per update measured in part 3 ("as here"), and
   an Atari-sized case (28 KB frames, 1.7 M parameters, a GPU learner at 20 us/frame, batches
   of 32 unrolls, 10 Gb/s links) where the learner's link saturates; A3C beside it.
5. ``benchmarks/rl_envs.py`` (vectorised CartPole) when present.

Numbers come from a shared 2-core machine (the load average is printed).
"""

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mlsys_lab.rl.agents import DQN, PPO
from mlsys_lab.rl.distributed import A3C, ActorLearner, simulate_a3c, simulate_actor_learner
from mlsys_lab.rl.envs import CartPole

TARGET = 475.0
CLEANRL_REPORTED = ("CleanRL docs/rl-algorithms/ppo.md (github.com/vwxyzjn/cleanrl, commit "
                    "fe8d8a0): ppo.py CartPole-v1 490.04 +- 6.12 average episodic return at "
                    "its default 500k steps; dqn.py 488.69 +- 16.11 (docs/rl-algorithms/dqn.md)")


# CleanRL ppo.py's defaults in this library's PPO (its value-loss clipping, clip_vloss, is
# the one thing not reproduced: the value loss here is unclipped)
CLEANRL_SETTINGS = dict(n_envs=4, n_steps=128, lr=2.5e-4, gamma=0.99, lam=0.95, epochs=4,
                        minibatch_size=128, ent_coef=0.01)


def to_target(algo, seed):
    if algo == "ppo-cleanrl":
        agent = PPO(4, 2, seed=seed, **CLEANRL_SETTINGS)
        budget, every = 500_000, 10_240
    else:
        agent = (PPO if algo == "ppo" else DQN)(4, 2, seed=seed)
        budget, every = (200_000, 5_120) if algo == "ppo" else (100_000, 2_000)
    t0 = time.perf_counter()
    h = agent.learn(CartPole, budget, eval_every=every, target_return=TARGET, until="training")
    return h, time.perf_counter() - t0


def part_agents(seeds, skip_dqn):
    print("\n== 1. steps and training time to a 20-episode mean >= 475 (CartPole-v1) ==")
    print(f"{'algo':11} {'seed':>4} {'greedy: steps':>14} {'greedy: s':>9} "
          f"{'training: steps':>16} {'train s':>8} {'wall s':>7} {'grad steps':>10}")
    for algo in ("ppo", "ppo-cleanrl") + (() if skip_dqn else ("dqn",)):
        for seed in seeds:
            h, wall = to_target(algo, seed)
            greedy_s = "-" if h["solved_seconds"] is None else f"{h['solved_seconds']:.1f}"
            print(f"{algo:11} {seed:>4} {str(h['solved_at']):>14} {greedy_s:>9} "
                  f"{str(h['train_solved_at']):>16} {h['seconds']:>8.1f} {wall:>7.1f} "
                  f"{h['grad_steps']:>10}", flush=True)


SHIM = r'''
import sys, time, types, runpy
import numpy as np
import gymnasium as gym
import torch
torch.set_num_threads(1)  # a 2-core machine shared with the other runs: no thread contention
t0 = time.perf_counter()
tyro = types.ModuleType("tyro"); tyro.cli = lambda cls: cls(); sys.modules["tyro"] = tyro
tb = types.ModuleType("torch.utils.tensorboard")
returns = []
class SummaryWriter:
    def __init__(self, *a, **k): pass
    def add_text(self, *a, **k): pass
    def add_scalar(self, tag, value, step):
        if tag == "charts/episodic_return":
            returns.append(float(value))
            if len(returns) >= 20 and np.mean(returns[-20:]) >= 475 and not hasattr(self, "done"):
                self.done = True
                print(f"CLEANRL_SOLVED step={step} seconds={time.perf_counter() - t0:.1f}",
                      flush=True)
    def close(self):
        print(f"CLEANRL_END seconds={time.perf_counter() - t0:.1f} "
              f"last20={np.mean(returns[-20:]):.1f}", flush=True)
tb.SummaryWriter = SummaryWriter; sys.modules["torch.utils.tensorboard"] = tb
class Compat(gym.vector.SyncVectorEnv):  # Gymnasium 0.29's same-step reset and info list
    def __init__(self, fns):
        super().__init__(fns, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    def step(self, actions):
        obs, r, te, tr, infos = super().step(actions)
        if "final_info" in infos:
            fi, mask = infos["final_info"], infos["_final_info"]
            infos = dict(infos)
            infos["final_info"] = [
                {"episode": {"r": fi["episode"]["r"][i], "l": fi["episode"]["l"][i]}}
                if mask[i] and "episode" in fi else None for i in range(self.num_envs)]
        return obs, r, te, tr, infos
gym.vector.SyncVectorEnv = Compat
sys.argv = [sys.argv[1]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def part_cleanrl(path, timeout=600.0):
    print("\n== 2. CleanRL ppo.py ==")
    print(CLEANRL_REPORTED)
    if not path:
        print("(not run here: pass --cleanrl PATH/TO/cleanrl/ppo.py to time it at its defaults)")
        return
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("gymnasium") is None:
        print("(not run: torch or gymnasium is not installed)")
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "out.txt"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-c", SHIM, str(Path(path).resolve())],
                                    cwd=tmp, stdout=out, stderr=subprocess.STDOUT, text=True)
            try:
                proc.wait(timeout=timeout)
                ended = f"exit {proc.returncode}"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                ended = f"stopped after {timeout:.0f} s"
        text = log.read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("CLEANRL_")]
    steps = [ln.split(",")[0] for ln in text.splitlines() if ln.startswith("global_step=")]
    print(f"ran cleanrl/ppo.py at its defaults (seed 1, 500k steps; {ended}; last "
          f"{steps[-1] if steps else 'no step'}):", "; ".join(lines) or "not solved by then")


def part_actor_learner(seconds, rounds=3):
    print("\n== 3. actor-learner on processes (CartPole, 4 envs x unroll 32 per actor) ==")
    print(f"{'actors':>6} {'learning frames/s':>18} {'mean lag':>9} {'updates/s':>10} "
          f"{'ms/update':>9} {'actors-only frames/s':>21} {'A3C frames/s':>13} "
          f"{'A3C lag':>8}")
    measured = {}
    for n in (1, 2, 4):
        best = {}
        with ActorLearner(CartPole, n_actors=n, unroll=32, envs_per_actor=4, seed=0) as s:
            s.run(updates=5)  # compile the step, fill the queue
            for _ in range(rounds):  # learning and draining alternate on the same actors
                for mode in ("learn", "alone"):
                    r = s.run(seconds=seconds, learn=mode == "learn")
                    if mode not in best or r["frames_per_s"] > best[mode]["frames_per_s"]:
                        best[mode] = r
        with A3C(CartPole, n_workers=n, unroll=32, seed=0) as s:
            s.run(updates=5)
            for _ in range(rounds):
                r = s.run(seconds=seconds)
                if "a3c" not in best or r["frames_per_s"] > best["a3c"]["frames_per_s"]:
                    best["a3c"] = r
        learn, alone, a3c = best["learn"], best["alone"], best["a3c"]
        measured[n] = (learn, alone)
        print(f"{n:>6} {learn['frames_per_s']:>18.0f} {np.mean(learn['lag']):>9.1f} "
              f"{learn['updates'] / learn['seconds']:>10.1f} "
              f"{1e3 * learn['learn_seconds'] / learn['updates']:>9.2f} "
              f"{alone['frames_per_s']:>21.0f} {a3c['frames_per_s']:>13.0f} "
              f"{np.mean(a3c['lag']):>8.1f}", flush=True)
    return measured


def part_simulated(measured):
    learn1, alone1 = measured[1]
    step_time = 1.0 / alone1["frames_per_s"]  # one actor's seconds per frame (4 envs)
    update_time = learn1["learn_seconds"] / learn1["updates"]  # the update alone
    frames_per_unroll = 4 * 32
    print("\n== 4. simulated actor-learner (distributed.sim), to 1,000 actors ==")
    print(f"as here: an actor makes a frame every {step_time * 1e6:.0f} us, the learner "
          f"takes {update_time * 1e3:.2f} ms per {frames_per_unroll}-frame update")
    cases = {
        "as here": dict(unroll=frames_per_unroll, step_time=step_time, frame_bytes=28,
                        param_bytes=4 * 9_155, learner_time_per_frame=0.0,
                        learner_overhead=update_time, bandwidth=1.25e9),
        "Atari-sized": dict(unroll=80, step_time=2e-3, frame_bytes=28_224,
                            param_bytes=4 * 1_700_000, batch=32, learner_time_per_frame=20e-6,
                            learner_overhead=5e-3, bandwidth=1.25e9),
    }
    print(f"{'case':12} {'actors':>6} {'frames/s':>10} {'learner busy':>12} {'link busy':>9} "
          f"{'mean lag':>8} {'bottleneck':>10} {'A3C frames/s':>12} {'A3C lag':>7} "
          f"{'A3C bottleneck':>14} "
          f"{'sim wall s':>10}")
    for name, kw in cases.items():
        for n in (1, 10, 30, 100, 300, 1000):
            t0 = time.perf_counter()
            r = simulate_actor_learner(n, unrolls_per_actor=3, **kw)
            a3c_kw = {k: kw[k] for k in ("unroll", "step_time", "param_bytes", "bandwidth")}
            a = simulate_a3c(n, unrolls_per_actor=3, grad_time_per_frame=2 * step_time
                             if name == "as here" else 4e-3, apply_time=2e-4, **a3c_kw)
            print(f"{name:12} {n:>6} {r.frames_per_s:>10.0f} {r.learner_busy:>12.2f} "
                  f"{r.link_busy:>9.2f} {r.lag.mean():>8.1f} {r.bottleneck:>10} "
                  f"{a.frames_per_s:>12.0f} {a.lag.mean():>7.1f} {a.bottleneck:>14} "
                  f"{time.perf_counter() - t0:>10.1f}", flush=True)


def part_envs():
    path = Path(__file__).with_name("rl_envs.py")
    if not path.exists():
        return
    print("\n== 5. benchmarks/rl_envs.py ==", flush=True)
    spec = importlib.util.spec_from_file_location("rl_envs_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--skip-dqn", action="store_true")
    parser.add_argument("--cleanrl", default=None, help="path to CleanRL's cleanrl/ppo.py")
    parser.add_argument("--cleanrl-timeout", type=float, default=600.0)
    parser.add_argument("--seconds", type=float, default=1.5,
                        help="wall time per actor-learner measurement (best of 3 rounds)")
    args = parser.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    part_agents(args.seeds, args.skip_dqn)
    part_cleanrl(args.cleanrl, args.cleanrl_timeout)
    part_simulated(part_actor_learner(args.seconds))
    part_envs()


if __name__ == "__main__":
    main()
