"""Vector environments: the loop against Gymnasium's SyncVectorEnv (committed arrays), the
processes and the Numba kernel against the loop, NEXT_STEP auto-reset, and worker processes
leaving nothing behind."""

import gc
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.rl.envs import CartPole, GridWorld
from mlsys_lab.rl.vector import (
    NEXT_STEP,
    NumbaCartPoleVectorEnv,
    ProcessVectorEnv,
    SyncVectorEnv,
    VectorEnvError,
)

REF = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                   "gymnasium_cartpole_reference.npz")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def balance(obs):
    """A controller that keeps most poles up (episodes reach the time limit)."""
    return (obs[:, 2] + 0.5 * obs[:, 3] + 0.01 * obs[:, 0] + 0.05 * obs[:, 1] > 0).astype(int)


def rollout(envs, seed, steps, policy, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    obs, _ = envs.reset(seed=seed)
    out = [(obs, None, None, None)]
    for _ in range(steps):
        a = rng.integers(2, size=envs.num_envs) if policy == "random" else balance(obs)
        obs, r, te, tr, info = envs.step(a)
        assert info == {}
        out.append((obs, r, te, tr))
    return out


def assert_same(a, b):
    for t, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_allclose(x[0], y[0], rtol=0, atol=1e-12, err_msg=f"obs at step {t}")
        for k in (1, 2, 3):
            if x[k] is not None:
                np.testing.assert_array_equal(x[k], y[k], err_msg=f"field {k} at step {t}")
                assert x[k].dtype == y[k].dtype


def test_loop_equals_gymnasium_sync_vector_env():
    with np.load(REF, allow_pickle=False) as d:
        envs = SyncVectorEnv([CartPole] * 4)
        obs, _ = envs.reset(seed=10)
        np.testing.assert_array_equal(obs, d["vec_reset_obs"])
        assert d["vec_terminated"].sum() >= 10
        for t in range(len(d["vec_actions"])):
            obs, r, te, tr, _ = envs.step(d["vec_actions"][t])
            np.testing.assert_allclose(obs, d["vec_obs"][t], rtol=0, atol=1e-12)
            np.testing.assert_array_equal(r, d["vec_reward"][t])
            np.testing.assert_array_equal(te, d["vec_terminated"][t])
            np.testing.assert_array_equal(tr, d["vec_truncated"][t])


@pytest.mark.parametrize("policy,limit", [("random", 500), ("balance", 40)])
def test_numba_kernel_equals_the_loop(policy, limit):
    n = 64
    loop = rollout(SyncVectorEnv([lambda: CartPole(limit)] * n), 5, 400, policy)
    fast = rollout(NumbaCartPoleVectorEnv(n, max_episode_steps=limit), 5, 400, policy)
    assert_same(loop, fast)
    ends = sum(int((x[2] | x[3]).sum()) for x in loop[1:])
    assert ends > n * 3  # many copies went through several episodes (and the stock refills)
    if policy == "balance":
        assert sum(int(x[3].sum()) for x in loop[1:]) > n


def test_processes_equal_the_loop():
    n = 7
    loop = rollout(SyncVectorEnv([lambda: CartPole(60)] * n), 3, 200, "balance")
    with ProcessVectorEnv([lambda: CartPole(60)] * n, num_workers=2) as envs:
        assert envs.num_workers == 2
        procs = rollout(envs, 3, 200, "balance")
    assert_same(loop, procs)


def test_processes_carry_discrete_observations():
    with ProcessVectorEnv([GridWorld] * 3, num_workers=2) as envs:
        obs, _ = envs.reset(seed=0)
        assert obs.tolist() == [0, 0, 0]
        obs, r, te, tr, _ = envs.step(np.array([1, 2, 0]))
        assert obs.tolist() == [1, 4, 0] and r.tolist() == [-1.0, -1.0, -1.0]


@pytest.mark.parametrize("make", [lambda n: SyncVectorEnv([CartPole] * n),
                                  lambda n: NumbaCartPoleVectorEnv(n)],
                         ids=["loop", "numba"])
def test_next_step_autoreset(make):
    """The step that ends an episode returns its last observation; the next step ignores the
    action, resets (unseeded: the copy's generator continues) and returns reward 0, no flags."""
    envs = make(2)
    assert envs.autoreset_mode == NEXT_STEP
    envs.reset(seed=[21, 22])
    twin = CartPole()
    twin.reset(seed=21)
    for _ in range(200):
        a = np.array([1, 0])  # copy 0 always pushes right: it falls within ~10 steps
        obs, r, te, tr, _ = envs.step(a)
        last, *_ = twin.step(1)
        np.testing.assert_array_equal(obs[0], last)
        if te[0]:
            break
    assert te[0] and r[0] == 1.0 and not tr[0]
    obs2, r2, te2, tr2, _ = envs.step(np.array([1, 0]))
    np.testing.assert_array_equal(obs2[0], twin.reset()[0])  # next initial state of copy 0
    assert r2[0] == 0.0 and not te2[0] and not tr2[0]
    # the action at the reset step is ignored: stepping on from here equals a twin that resets
    obs3, *_ = envs.step(np.array([0, 0]))
    np.testing.assert_array_equal(obs3[0], twin.step(0)[0])


def test_autoreset_action_is_ignored():
    a, b = NumbaCartPoleVectorEnv(1), NumbaCartPoleVectorEnv(1)
    a.reset(seed=0)
    b.reset(seed=0)
    for _ in range(100):
        ra = a.step(np.array([1]))
        b.step(np.array([1]))
        if ra[2][0]:
            break
    np.testing.assert_array_equal(a.step(np.array([0]))[0], b.step(np.array([1]))[0])


def test_bad_actions_are_refused():
    for envs in (SyncVectorEnv([CartPole] * 3), NumbaCartPoleVectorEnv(3)):
        envs.reset(seed=0)
        with pytest.raises(ShapeError, match="step"):
            envs.step(np.zeros(2, np.int64))
        with pytest.raises(ShapeError, match="step"):
            envs.step(np.zeros(3))
        with pytest.raises(ArgumentError, match="0..1"):
            envs.step(np.array([0, 2, 1]))
    with pytest.raises(ArgumentError, match="seeds"):
        SyncVectorEnv([CartPole] * 3).reset(seed=[1, 2])


class Faulty(CartPole):
    def step(self, action):
        if self.elapsed_steps >= 3:
            raise RuntimeError("the simulator broke")
        return super().step(action)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes: it holds no memory and runs nothing
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


def _all_gone(pids, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _shm_names():
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def test_worker_error_is_reported_and_every_worker_stops():
    before = _shm_names()
    envs = ProcessVectorEnv([CartPole, CartPole, Faulty, CartPole], num_workers=3)
    pids = envs.pids
    envs.reset(seed=0)
    with pytest.raises(VectorEnvError, match="the simulator broke") as err:
        for _ in range(10):
            envs.step(np.zeros(4, np.int64))
    assert "worker 1 (environments 1..2)" in str(err.value) and "Traceback" in str(err.value)
    assert envs.closed and _all_gone(pids)
    with pytest.raises(VectorEnvError, match="closed"):
        envs.step(np.zeros(4, np.int64))
    assert not {n for n in _shm_names() - before if n.startswith("pym-")}


def test_closing_early_and_dropping_the_object_stop_the_workers():
    envs = ProcessVectorEnv([CartPole] * 4, num_workers=2)
    pids = envs.pids
    with envs:
        envs.reset(seed=0)
        envs.step(np.zeros(4, np.int64))
    assert _all_gone(pids)
    envs.close()  # twice is fine
    dropped = ProcessVectorEnv([CartPole] * 2, num_workers=2)
    pids = dropped.pids
    del dropped
    gc.collect()
    assert _all_gone(pids)
    with pytest.raises(KeyError):
        with ProcessVectorEnv([CartPole] * 2, num_workers=2) as envs:
            pids = envs.pids
            raise KeyError("the caller fails mid-episode")
    assert _all_gone(pids)


def test_a_killed_worker_is_reported():
    envs = ProcessVectorEnv([CartPole] * 2, num_workers=2)
    envs.reset(seed=0)
    pids = envs.pids
    os.kill(pids[1], 9)
    with pytest.raises(VectorEnvError, match="died"):
        envs.step(np.zeros(2, np.int64))
    assert _all_gone(pids)


def test_workers_exit_when_the_main_process_dies_abruptly():
    script = textwrap.dedent("""
        import os, sys
        from mlsys_lab.rl.envs import CartPole
        from mlsys_lab.rl.vector import ProcessVectorEnv
        envs = ProcessVectorEnv([CartPole] * 2, num_workers=2)
        envs.reset(seed=0)
        print(*envs.pids, flush=True)
        os._exit(0)  # no atexit, no finalizers: the workers must notice on their own
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 2, out.stderr
    assert _all_gone(pids, within=10.0)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 9), st.integers(0, 2**31), st.integers(1, 40), st.integers(0, 2**31))
def test_numba_kernel_equals_the_loop_on_random_cases(n, seed, limit, action_seed):
    steps = 120
    loop = rollout(SyncVectorEnv([lambda: CartPole(limit)] * n), seed, steps, "random",
                   action_seed)
    fast = rollout(NumbaCartPoleVectorEnv(n, max_episode_steps=limit), seed, steps, "random",
                   action_seed)
    assert_same(loop, fast)


def test_unseeded_numba_reset_draws_fresh_states_and_step_needs_a_reset():
    envs = NumbaCartPoleVectorEnv(3)
    with pytest.raises(ArgumentError, match="reset"):
        envs.step(np.zeros(3, np.int64))
    obs, _ = envs.reset()
    assert (np.abs(obs) <= 0.05).all() and len(np.unique(obs)) == 12


def test_processes_with_the_spawn_start_method():
    with ProcessVectorEnv([CartPole] * 3, num_workers=2, context="spawn") as envs:
        obs, _ = envs.reset(seed=5)
        expected, _ = SyncVectorEnv([CartPole] * 3).reset(seed=5)
        np.testing.assert_array_equal(obs, expected)
        assert envs.step(np.ones(3, np.int64))[1].tolist() == [1.0, 1.0, 1.0]


class BrokenInWorkers(CartPole):
    """Builds in the main process (the probe) but not in a worker."""

    parent = os.getpid()

    def __init__(self):
        if os.getpid() != self.parent:
            raise OSError("no simulator licence on this host")
        super().__init__()


def test_an_environment_that_cannot_be_built_in_a_worker_is_reported():
    envs = ProcessVectorEnv([BrokenInWorkers] * 2, num_workers=2)
    pids = envs.pids
    with pytest.raises(VectorEnvError, match="no simulator licence"):
        envs.reset(seed=0)
    assert envs.closed and _all_gone(pids)
