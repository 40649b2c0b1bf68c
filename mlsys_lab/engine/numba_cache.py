"""Where Numba keeps the library's compiled kernels between processes.

Every Numba kernel in ``mlsys_lab`` is declared ``cache=CACHE``: compiled once, then loaded from
disk by every later process (a notebook kernel, a DataLoader worker, a test worker) instead of
being compiled again, which is most of a kernel's first-call cost.

Numba's own cache notices when a kernel's *own* source file changes, but not when a kernel it
calls (often in another module) does. So the library's kernels live in a directory named after a
fingerprint of the whole package source (every ``.py`` file's path, size and modification
time): any edit to ``mlsys_lab`` starts a fresh directory, and a stale binary is never loaded.
The CPU name and features are part of Numba's own key, so a ``NUMBA_CPU_NAME=haswell`` build
and the native build never share a binary.

``MLSYS_LAB_NUMBA_CACHE`` in the environment: ``0`` (or ``off``) compiles in every process, as
Numba does without ``cache=True``; a path puts the cache there instead of
``$XDG_CACHE_HOME/mlsys_lab/numba`` (default ``~/.cache/mlsys_lab/numba``). A directory that
cannot be written turns caching off. Fingerprint directories not used for a week are removed.

Code loaded from the cache cannot be inspected (``inspect_asm`` returns nothing): code that
reads the emitted instructions compiles its own uncached copy (``cache=False``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from numba.core import caching

PACKAGE = Path(__file__).resolve().parents[1]
STALE_AFTER = 7 * 24 * 3600  # seconds since a fingerprint directory was last used


def fingerprint(package: Path = PACKAGE) -> str:
    """A hash of every ``.py`` file under ``package``: its relative path, size and mtime."""
    h = hashlib.sha1()
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(package)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def cache_root(environ=os.environ) -> Path | None:
    """The folder that holds one directory per fingerprint, or None when caching is off."""
    setting = environ.get("MLSYS_LAB_NUMBA_CACHE", "").strip()
    if setting.lower() in ("0", "off", "false", "no"):
        return None
    if setting:
        return Path(setting).expanduser()
    base = environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mlsys_lab" / "numba"


def _prepare(root: Path | None, package: Path = PACKAGE) -> Path | None:
    """This source tree's cache directory, created (None if it cannot be); old siblings go."""
    if root is None:
        return None
    here = root / fingerprint(package)
    try:
        here.mkdir(parents=True, exist_ok=True)
        os.utime(here)  # "last used": what the pruning below reads
        probe = here / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError:
        return None
    now = time.time()
    for other in root.iterdir():
        try:
            if other != here and other.is_dir() and now - other.stat().st_mtime > STALE_AFTER:
                shutil.rmtree(other, ignore_errors=True)
        except OSError:
            pass
    return here


class LabCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Numba cache locator for functions defined in ``mlsys_lab``'s own files: their cache goes
    to :data:`DIRECTORY`, mirroring the package's folders."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        folder = Path(py_file).resolve().parent.relative_to(PACKAGE)
        self._cache_path = str(DIRECTORY / folder)

    def get_cache_path(self):
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        if DIRECTORY is None or not Path(py_file).resolve().is_relative_to(PACKAGE):
            return None  # not ours: Numba's own locators decide
        return super().from_function(py_func, py_file)


DIRECTORY = _prepare(cache_root())
"""This source tree's kernel cache (None: caching is off)."""

CACHE = DIRECTORY is not None
"""What the library's kernels pass as ``numba.njit(cache=...)``."""

_IMPL = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # renamed in Numba 0.61
if LabCacheLocator not in _IMPL._locator_classes:
    _IMPL._locator_classes.insert(0, LabCacheLocator)

# Two processes that compile different signatures of one kernel at once (two test workers, a
# notebook and its DataLoader workers, on a cold cache) read the same index, pick the same next
# data file name (``kernel.3.nbc``) and both write it: the index can then list one signature
# against the other's machine code, and a later process that loads it fails with "can't unbox
# array" (seen once in the suite). In our directory each process names its data files with a
# token of its own, so two writers never share a file; the index, rewritten whole by its last
# writer, may drop the other's entry, which only costs a compile.
_TOKEN = f"{os.getpid():x}{os.urandom(2).hex()}"
_numba_data_name = caching.IndexDataCacheFile._data_name


def _own_data_name(self, number):
    name = _numba_data_name(self, number)
    if DIRECTORY is None or not str(self._cache_path).startswith(str(DIRECTORY)):
        return name  # not ours: Numba's own names
    stem, _, suffix = name.rpartition(".")
    return f"{stem}.{_TOKEN}.{suffix}"


if getattr(caching.IndexDataCacheFile._data_name, "__name__", "") != "_own_data_name":
    caching.IndexDataCacheFile._data_name = _own_data_name
