"""Thread pools: ``set_num_threads`` / ``limit_threads`` set numpy's BLAS and Numba's threads,
``cap_process_threads`` caps every pool of a worker process for good, and the compiled executor
holds BLAS at one thread while a graph that mixes the pools runs."""

import os

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine import threads
from mlsys_lab.engine.compiler import pool_coordination
from mlsys_lab.engine.registry import REGISTRY, get


@pytest.fixture
def restore_threads():
    before = threads.num_threads()
    yield before
    threads.set_num_threads(**before)


def test_set_num_threads_sets_both_pools_and_returns_the_previous_counts(restore_threads):
    prev = threads.set_num_threads(blas=1, numba=1)
    assert prev == restore_threads
    assert threads.num_threads() == {"blas": 1, "numba": 1}
    with threads.limit_threads(blas=2) as inside:
        assert inside == {"blas": 1, "numba": 1}
        assert threads.num_threads()["numba"] == 1  # untouched
    assert threads.num_threads() == {"blas": 1, "numba": 1}  # restored on exit
    with pytest.raises(RuntimeError), threads.limit_threads(numba=1, blas=2):
        raise RuntimeError("inside")
    assert threads.num_threads() == {"blas": 1, "numba": 1}


def test_limit_threads_gives_each_blas_library_its_own_count_back():
    # numpy's and SciPy's OpenBLAS are two libraries (a Numba kernel's np.dot calls SciPy's):
    # a caller holding numpy's at one thread keeps it there after a block that limited both,
    # although SciPy's ran two (restoring the largest count to every library broke this)
    import scipy.linalg.cython_blas  # noqa: F401 - loads SciPy's BLAS
    from threadpoolctl import ThreadpoolController

    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    assert len(libs) >= 2, [lib.filepath for lib in libs]
    before = [lib.num_threads for lib in libs]
    try:
        for i, lib in enumerate(libs):
            lib.set_num_threads(1 + i % 2)
        with threads.limit_threads(blas=1):
            assert [lib.num_threads for lib in libs] == [1] * len(libs)
        assert [lib.num_threads for lib in libs] == [1 + i % 2 for i in range(len(libs))]
    finally:
        for lib, n in zip(libs, before):
            lib.set_num_threads(n)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_thread_counts_are_refused(bad):
    with pytest.raises(ml.ArgumentError, match="set_num_threads: blas"):
        threads.set_num_threads(blas=bad)
    with pytest.raises(ml.ArgumentError, match="threads must be"):
        ml.compile(lambda x: x * 2, np.ones(2, np.float32), threads={"cores": 2})
    with pytest.raises(ml.ArgumentError, match=r"compile: threads\['blas'\]"):
        ml.compile(lambda x: x * 2, np.ones(2, np.float32), threads={"blas": bad})


def _mixed(probe):
    """A batched product (BLAS: the packed rung takes matrices only), then a plain one (the
    Numba packed rung on cpu-numba), then ``probe``."""
    def f(a, b, c):
        n = b.shape[0]
        h = ops.reshape(ops.matmul(a, b), (n, n))
        return probe(ops.matmul(h, c))
    return f


def test_a_graph_mixing_numba_and_blas_runs_with_one_blas_thread(restore_threads):
    seen = []

    def probe_compute(x):  # records the BLAS threads while the graph runs
        seen.append(threads.num_threads()["blas"])
        return x.copy()

    probe = ml.custom_op("threads_probe", compute=probe_compute,
                         infer=lambda x: get("neg").infer(x), replace=True)
    f = _mixed(probe)
    try:
        rng = np.random.default_rng(0)
        a = rng.standard_normal((1, 16, 16)).astype(np.float32)
        b, c = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
        mixed = ml.compile(f, a, b, c, device="cpu-numba")
        kernels = {n.meta["kernel_name"] for n in mixed.graph.nodes}
        assert {"numba.matmul_packed", "numpy.matmul(out=)"} <= kernels
        assert mixed.thread_limits == pool_coordination(mixed.graph) == {"blas": 1}
        as_set = ml.compile(f, a, b, c, device="cpu-numba", threads=None)
        plain = ml.compile(f, a, b, c)  # cpu only: nothing to coordinate
        assert as_set.thread_limits is None and plain.thread_limits is None
        threads.set_num_threads(blas=2)
        before = threads.num_threads()["blas"]
        seen.clear()
        for profile in (False, True):
            got = mixed(a, b, c, profile=profile)
        np.testing.assert_allclose(got, (a[0] @ b) @ c, rtol=1e-4, atol=1e-4)
        assert seen == [1, 1]  # BLAS at one thread while the graph ran
        assert threads.num_threads()["blas"] == before  # and restored after
        seen.clear()
        np.testing.assert_array_equal(as_set(a, b, c), got)
        assert seen == [before]
    finally:
        REGISTRY.pop("threads_probe", None)


CAP_IN_A_FRESH_PROCESS = """
import json, os, sys
import os

import numpy as np
from threadpoolctl import threadpool_info
import numba
from mlsys_lab.engine.threads import THREAD_VARIABLES, cap_process_threads, num_threads
before = num_threads()
cap_process_threads(1)
print(json.dumps({"before": before, "after": num_threads(),
                  "pools": [p["num_threads"] for p in threadpool_info()],
                  "env": {k: os.environ.get(k) for k in THREAD_VARIABLES}}))
"""


def test_cap_process_threads_caps_every_pool_and_the_variables_for_later_libraries():
    """The DataLoader workers' helper, distinct from ``limit_threads``: permanent, and it also
    sets the thread variables (for libraries a worker loads later) and every threadpoolctl pool;
    run in a fresh process because nothing is restored."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARIABLES}
    env.pop("NUMBA_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", CAP_IN_A_FRESH_PROCESS], env=env, text=True,
                          capture_output=True, timeout=300, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["after"] == {"blas": 1, "numba": 1}
    assert got["pools"] and set(got["pools"]) == {1}
    assert got["env"] == {k: "1" for k in threads.THREAD_VARIABLES}
    if (os.cpu_count() or 1) > 1:  # it did change something
        assert got["before"]["numba"] > 1


def test_the_data_loader_workers_use_the_one_process_cap():
    from mlsys_lab.data.loader import worker as _worker

    assert _worker.cap_process_threads is threads.cap_process_threads
    assert not hasattr(_worker, "limit_threads")  # the second meaning of the name is gone


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, None, "1"])
def test_cap_process_threads_refuses_a_bad_count_before_changing_anything(bad, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    with pytest.raises(ml.ArgumentError, match="cap_process_threads: n must be a positive"):
        threads.cap_process_threads(bad)
    assert os.environ["OMP_NUM_THREADS"] == "7"
