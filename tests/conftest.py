"""Test configuration shared by every test module.

Numba's CUDA simulator must be switched on before numba is first imported, so CUDA kernels
are tested on machines without a GPU.
"""

import os

import pytest

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# If a plugin imported numba before this file ran, make it re-read the environment.
import numba.core.config  # noqa: E402

numba.core.config.reload_config()


# --- running on every core (pytest-xdist, `-n auto --dist loadgroup`) ---------------------------
# Tests that start a service (JupyterLab, Chromium, mpiexec) share one xdist group, so they run
# one after another on one worker and never compete for ports or browsers; mark a new one with
# `@pytest.mark.service` (or list its module here). Each notebook under nbval is one group too:
# its cells must run in order in one kernel.
SERVICE_MODULES = {"test_browser.py", "test_mpi.py", "test_viz_keyboard.py", "test_cli_reader.py"}

# A module whose module-scoped fixture is expensive (grading a class of notebooks, loading the
# ONNX node-test corpus) runs on one worker, so the fixture is built once, not once per worker.
WHOLE_MODULES = {"test_grading_class.py", "test_onnx_conformance.py"}

# --- the quick tier (`python -m pytest -m "not slow"`) --------------------------------------------
# Everything that starts a kernel, a browser, mpiexec or the ONNX node-test corpus is `slow`: the
# notebooks under nbval, the grader's round trips and the service tests. The inner loop runs the
# rest; the README's full command (CI) runs everything. Mark a slow test elsewhere with
# `@pytest.mark.slow`, or list its module here.
SLOW_MODULES = SERVICE_MODULES | {
    "test_grading.py", "test_grading_class.py", "test_grading_integrity.py",
    "test_exercises_ch02_ch03.py", "test_exercises_ch04_ch06.py", "test_exercises_ch07_ch08.py",
    "test_exercises_ch09.py", "test_exercises_ch10.py", "test_exercises_ch11.py",
    "test_exercises_ch13.py", "test_exercises_ch14.py", "test_exercises_ch15.py",
    "test_exercises_ch16.py", "test_exercises_ch17.py", "test_exercises_ch18.py",
    "test_exercises_ch19.py", "test_onnx_conformance.py",
}


class _GroupsOnStructuredIds:
    """``--dist loadgroup`` keeps a group on one worker by the ``@group`` suffix pytest-xdist
    (3.8) appends to ``item._nodeid``. pytest 9.2 derives ``item.nodeid`` from a structured id
    instead, so the suffix was lost: a notebook's cells were spread over the workers, each
    worker's kernel missing the cells the other ran. Put the suffix on the structured id too
    (a no-op before 9.2, which has none)."""

    @pytest.hookimpl(trylast=True)  # after xdist's own hook has added the suffix
    def pytest_collection_modifyitems(self, config, items):
        for item in items:
            wanted, ident = getattr(item, "_nodeid", None), getattr(item, "_id", None)
            if isinstance(wanted, str) and hasattr(ident, "parse") and str(ident) != wanted:
                item._id = type(ident).parse(wanted)


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(_GroupsOnStructuredIds(), "groups-on-structured-ids")
        # `-n auto` already runs one worker per core: numpy's BLAS threads on top of that
        # oversubscribe the cores, and OpenBLAS's spinning workers then make a BLAS-heavy test
        # ten times slower (tests/llm/test_pretrained.py: 13 s instead of 1.6 s with two busy
        # cores). One BLAS thread per worker; subprocesses and tests that set a count themselves
        # (tests/engine/test_threads.py) are unaffected.
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=1, user_api="blas")
    config.addinivalue_line("markers", "service: starts a server, a browser or mpiexec (such "
                            "tests share one xdist group)")
    config.addinivalue_line("markers", "slow: starts a kernel, a browser, mpiexec or runs a "
                            "notebook; left out of the quick tier (-m 'not slow')")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path
        if path.suffix == ".ipynb" or path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if path.suffix == ".ipynb":
            group = f"notebook:{path.parent.name}/{path.name}"
        elif path.name in SERVICE_MODULES or item.get_closest_marker("service"):
            group = "services"
        elif path.name in WHOLE_MODULES:
            group = f"module:{path.name}"
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def own_segments(monkeypatch):
    """``leftover()``: the shared-memory segments still linked that loaders started in this
    test made. Other xdist workers run loaders at the same time, so a leak check that listed
    every ``mlsys_dl_`` segment would count theirs too."""
    from mlsys_lab.data.loader import shm as _shm

    prefixes = []
    make = _shm.new_prefix

    def recording():
        prefixes.append(make())
        return prefixes[-1]

    monkeypatch.setattr(_shm, "new_prefix", recording)
    return lambda: sorted(n for p in prefixes for n in _shm.leftover_segments(p))
