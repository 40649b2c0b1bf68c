"""The actor-learner system on real processes (throughput counted, learning with V-trace, clean
shutdown after normal exit, early exit and an actor's error: no process left behind) and on the
cluster simulator (conservation of frames, the saturating resource against its bound)."""

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mlsys_lab.errors import ArgumentError
from mlsys_lab.rl.distributed import (
    A3C,
    ActorError,
    ActorLearner,
    simulate_a3c,
    simulate_actor_learner,
)
from mlsys_lab.rl.envs import CartPole


class ExplodingEnv(CartPole):
    """CartPole whose 40th step raises inside the actor."""

    def step(self, action):
        self.count = getattr(self, "count", 0) + 1
        if self.count == 40:
            raise ValueError("the environment broke")
        return super().step(action)


def running(pid):
    """True while ``pid`` exists and is not a zombie (an exited process nobody reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_gone(pids, seconds=5):
    deadline = time.monotonic() + seconds
    for pid in pids:
        while running(pid):
            assert time.monotonic() < deadline, f"actor pid {pid} is still alive"
            time.sleep(0.02)
    assert not [p for p in mp.active_children() if p.name.startswith(("rl-actor", "rl-a3c"))]


KILLED_PARENT = """
import os, signal, sys
from mlsys_lab.rl.distributed import ActorLearner, A3C
from mlsys_lab.rl.envs import CartPole
a = ActorLearner(CartPole, n_actors=2, unroll=8, envs_per_actor=1, queue_size=1)
b = A3C(CartPole, n_workers=1, unroll=8)
print(" ".join(str(p.pid) for p in a.procs + b.procs), flush=True)
a.run(updates=2)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads /proc")
def test_actors_exit_when_their_learner_is_killed():
    out = subprocess.run([sys.executable, "-c", KILLED_PARENT], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == -signal.SIGKILL, out.stderr
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3
    assert_gone(pids, seconds=10)


def test_actor_learner_counts_frames_and_learns_with_vtrace():
    with ActorLearner(CartPole, n_actors=2, unroll=32, envs_per_actor=4, seed=0) as system:
        pids = [p.pid for p in system.procs]
        stats = system.run(updates=300)
    assert_gone(pids)
    assert stats["updates"] == 300 and system.updates == 300
    assert stats["frames"] == 300 * 32 * 4
    assert min(stats["lag"]) >= 0 and max(stats["lag"]) > 0  # some unrolls were stale
    returns = stats["returns"]
    assert np.mean(returns[:20]) < 40  # random play: about 22
    assert np.mean(returns[-20:]) > 80, (np.mean(returns[:20]), np.mean(returns[-20:]))


def test_an_actor_error_is_raised_and_nothing_is_left_behind():
    system = ActorLearner(ExplodingEnv, n_actors=2, unroll=16, envs_per_actor=1, seed=0)
    pids = [p.pid for p in system.procs]
    with pytest.raises(ActorError, match="the environment broke"):
        system.run(updates=1000, timeout=20)
    assert_gone(pids)
    system = A3C(ExplodingEnv, n_workers=2, unroll=16)
    pids = [p.pid for p in system.procs]
    with pytest.raises(ActorError, match="the environment broke"):
        system.run(updates=1000, timeout=20)
    assert_gone(pids)


def test_injected_failure_and_early_exit_leave_nothing_behind():
    system = ActorLearner(CartPole, n_actors=2, unroll=8, envs_per_actor=1, fail_after=3)
    pids = [p.pid for p in system.procs]
    with pytest.raises(ActorError, match="injected failure"):
        system.run(updates=1000, timeout=20)
    assert_gone(pids)
    # early exit: actors blocked on a full queue nobody drains
    with ActorLearner(CartPole, n_actors=3, unroll=8, envs_per_actor=1, queue_size=1) as s:
        pids = [p.pid for p in s.procs]
        time.sleep(0.5)
    assert_gone(pids)
    s.close()  # idempotent


def test_a3c_workers_learn_asynchronously_and_leave_nothing_behind():
    with A3C(CartPole, n_workers=2, unroll=32, seed=0) as system:
        pids = [p.pid for p in system.procs]
        stats = system.run(updates=500)
    assert_gone(pids)
    assert stats["frames"] == stats["updates"] * 32 >= 500 * 32
    assert max(stats["lag"]) >= 1  # another worker's update landed between read and write
    returns = stats["returns"]
    assert np.mean(returns[-20:]) > 80, (np.mean(returns[:20]), np.mean(returns[-20:]))
    model = system.sync_model()  # the shared parameters, readable after the workers stopped
    assert all(np.isfinite(p.data).all() for p in model.parameters())


def test_simulated_frames_are_conserved_and_one_actor_is_actor_bound():
    r = simulate_actor_learner(1, unrolls_per_actor=5, unroll=32, step_time=1e-3)
    assert r.frames == 5 * 32
    assert r.bottleneck == "actors"
    # alone, the actor plays 32 ms per unroll and waits only for messages and the update
    assert 0.9 * r.bounds["actors"] < r.frames_per_s <= r.bounds["actors"]
    # the learner updates on each unroll before it answers with the parameters: on-policy
    assert r.lag.tolist() == [0, 0, 0, 0, 0]


def test_many_actors_saturate_the_learner_then_the_network():
    # learner-bound: 64 actors at 1,000 frames/s each against a learner of ~24,600 frames/s
    r = simulate_actor_learner(64, unrolls_per_actor=4, learner_time_per_frame=2e-5,
                               learner_overhead=1e-3)
    assert r.bottleneck == "learner"
    assert r.learner_busy > 0.9
    assert 0.8 * r.bounds["learner"] < r.frames_per_s <= r.bounds["learner"] * 1.001
    small = simulate_actor_learner(8, unrolls_per_actor=4)
    assert small.lag.mean() < r.lag.mean()  # more actors, staler data
    # network-bound: Atari-sized frames over a 1 Gb/s learner link
    n = simulate_actor_learner(64, unrolls_per_actor=4, frame_bytes=28_224, batch=8,
                               learner_time_per_frame=1e-6, bandwidth=1.25e8)
    assert n.bottleneck == "network" and n.link_busy > 0.9
    assert 0.8 * n.bounds["network"] < n.frames_per_s <= n.bounds["network"] * 1.001


def test_a3c_workers_pay_for_gradients_and_its_server_link_saturates():
    # few workers: each computes its own gradient, so it makes frames slower than an actor
    kw = dict(unrolls_per_actor=4, step_time=1e-3)
    a3c = simulate_a3c(4, grad_time_per_frame=1e-3, **kw)
    impala = simulate_actor_learner(4, **kw)
    assert a3c.bottleneck == impala.bottleneck == "actors"
    assert a3c.frames_per_s < 0.6 * impala.frames_per_s
    assert 0.8 * a3c.bounds["actors"] < a3c.frames_per_s <= a3c.bounds["actors"]
    # a big model: every update moves a model-sized gradient into the server
    big = simulate_a3c(32, unrolls_per_actor=3, param_bytes=4_000_000, bandwidth=1.25e9,
                       grad_time_per_frame=1e-4)
    assert big.bottleneck == "network" and big.link_busy > 0.8
    assert 0.8 * big.bounds["network"] < big.frames_per_s <= big.bounds["network"] * 1.001
    with pytest.raises(ArgumentError, match="n_actors"):
        simulate_a3c(0)
