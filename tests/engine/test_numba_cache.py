"""The library's Numba kernels are compiled once and loaded from disk afterwards
(``mlsys_lab/engine/numba_cache.py``), in a directory named after the package source, so an edit
anywhere in the package never loads a stale binary."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from mlsys_lab.engine import numba_cache

ROOT = Path(__file__).resolve().parents[2]

# One small library kernel, run in a fresh process: prints how its signature was obtained.
SCRIPT = """
import numpy as np
from mlsys_lab.engine import numba_cache, sparse
out = np.zeros((4, 3))
sparse.scatter_add_rows(out, np.array([0, 2, 0]), np.ones((3, 3)))
assert out[0, 0] == 2.0 and out[1, 0] == 0.0
stats = sparse._scatter_add_rows.stats
print(numba_cache.CACHE, sum(stats.cache_hits.values()), sum(stats.cache_misses.values()),
      numba_cache.DIRECTORY)
"""


def _run(tmp_path, setting):
    env = dict(os.environ, MLSYS_LAB_NUMBA_CACHE=str(setting))
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    cache, hits, misses, directory = out.stdout.split()
    return cache, int(hits), int(misses), directory


def test_a_kernel_compiled_once_is_loaded_by_the_next_process(tmp_path):
    root = tmp_path / "cache"
    assert _run(tmp_path, root)[:3] == ("True", 0, 1)  # compiled and saved
    cache, hits, misses, directory = _run(tmp_path, root)
    assert (cache, hits, misses) == ("True", 1, 0)  # loaded, not compiled
    assert Path(directory) == root / numba_cache.fingerprint()
    saved = list((Path(directory) / "engine").glob("sparse._scatter_add_rows*"))
    assert saved, sorted(p.name for p in Path(directory).rglob("*"))[:20]


def test_caching_can_be_switched_off(tmp_path):
    assert _run(tmp_path, "0") == ("False", 0, 1, "None")  # compiled, never looked up
    assert numba_cache.cache_root({"MLSYS_LAB_NUMBA_CACHE": "off"}) is None


def test_the_default_root_follows_xdg_cache_home(tmp_path):
    assert numba_cache.cache_root({"XDG_CACHE_HOME": str(tmp_path)}) == (
        tmp_path / "mlsys_lab" / "numba")


def _package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    return pkg


def test_an_edit_anywhere_in_the_package_changes_the_fingerprint(tmp_path):
    pkg = _package(tmp_path)
    first = numba_cache.fingerprint(pkg)
    assert numba_cache.fingerprint(pkg) == first  # stable while nothing changes
    (pkg / "sub" / "b.py").write_text("y = 3\n")  # same size: the mtime tells
    os.utime(pkg / "sub" / "b.py", ns=(1, 1))
    second = numba_cache.fingerprint(pkg)
    assert second != first
    (pkg / "sub" / "c.py").write_text("")  # a new module counts too
    assert numba_cache.fingerprint(pkg) not in (first, second)


def test_old_fingerprint_directories_go_and_recent_ones_stay(tmp_path):
    pkg, root = _package(tmp_path), tmp_path / "root"
    old, recent = root / "old", root / "recent"
    for d in (old, recent):
        d.mkdir(parents=True)
        (d / "kernel.nbi").write_text("")
    week_ago = time.time() - numba_cache.STALE_AFTER - 60
    os.utime(old, (week_ago, week_ago))
    here = numba_cache._prepare(root, pkg)
    assert here == root / numba_cache.fingerprint(pkg) and here.is_dir()
    assert not old.exists() and recent.exists()


def test_an_unwritable_cache_turns_caching_off(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert numba_cache._prepare(blocked / "numba", _package(tmp_path)) is None


def test_only_the_package_own_functions_use_its_locator(tmp_path):
    def mine():
        pass

    outside = tmp_path / "user.py"
    outside.write_text("")
    assert numba_cache.LabCacheLocator.from_function(mine, str(outside)) is None
    if numba_cache.CACHE:
        from mlsys_lab.engine import sparse

        fn = sparse._scatter_add_rows.py_func
        locator = numba_cache.LabCacheLocator.from_function(fn, sparse.__file__)
        assert Path(locator.get_cache_path()) == numba_cache.DIRECTORY / "engine"


def test_cached_kernels_still_match_numpy():
    from mlsys_lab.engine import sparse

    rng = np.random.default_rng(0)
    rows, values = rng.integers(0, 5, 40), rng.standard_normal((40, 3))
    want = np.zeros((5, 3))
    np.add.at(want, rows, values)
    np.testing.assert_allclose(sparse.scatter_add_rows(np.zeros((5, 3)), rows, values), want)


def test_two_processes_saving_a_kernel_at_once_never_write_one_data_file(tmp_path, monkeypatch):
    """Process A and process B read the same index, each add a signature, and their writes
    interleave (index A, index B, data B, data A). With the same next data file name, the index
    listed B's signature against A's machine code; with a token per process it cannot."""
    from numba.core import caching

    monkeypatch.setattr(numba_cache, "DIRECTORY", tmp_path)
    a = caching.IndexDataCacheFile(str(tmp_path), "kernel-7", (1.0, 10))
    b = caching.IndexDataCacheFile(str(tmp_path), "kernel-7", (1.0, 10))
    pending = []
    monkeypatch.setattr(caching.IndexDataCacheFile, "_save_data",
                        lambda self, name, data: pending.append((name, data)))
    stale = a._load_index()  # what both read: empty
    monkeypatch.setattr(numba_cache, "_TOKEN", "a0")
    a.save(("float64",), "machine code for float64")
    monkeypatch.setattr(numba_cache, "_TOKEN", "b1")
    monkeypatch.setattr(b, "_load_index", lambda: dict(stale))
    b.save(("int32",), "machine code for int32")
    monkeypatch.undo()
    for name, data in reversed(pending):  # B's data lands first, A's last
        a._save_data(name, data)
    index = a._load_index()
    assert index  # the last index written lists one of them
    for key, name in index.items():
        assert a._load_data(name) == f"machine code for {key[0]}", (key, name)
    assert pending[0][0] != pending[1][0] and all(n.endswith(".nbc") for n, _ in pending)
