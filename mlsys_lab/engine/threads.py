"""The two CPU thread pools a process runs: numpy's BLAS (OpenBLAS, MKL) and Numba's.

Each pool keeps its idle workers spinning for a while after a call, so a parallel kernel of
one pool started right after the other's call finds the cores still busy
(``benchmarks/matmul.py`` measures it). Four ways to set them:

* :func:`set_num_threads` — BLAS and Numba, for the rest of the process, returning the counts
  it replaced;
* :func:`limit_threads` — the same for one ``with`` block, the counts restored on exit;
* :func:`cap_process_threads` — every pool of a process that was just started, for good: the
  DataLoader's workers call it first (one thread each by default, so that N workers do not run
  N × cores threads). It also caps OpenMP pools and sets the thread variables that libraries
  loaded later read;
* ``ml.compile(..., threads=...)`` — per compiled graph (see
  :class:`~mlsys_lab.engine.compiler.Executable`): a ``cpu-numba`` graph that runs Numba's
  parallel kernels and BLAS kernels back to back holds BLAS at one thread while it runs
  (``threads="coordinate"``, its default), so no BLAS worker spins while Numba's run.

BLAS is reached through ``threadpoolctl`` (a dependency), Numba through
``numba.set_num_threads`` (at most ``NUMBA_NUM_THREADS``, fixed when Numba starts).
"""

import contextlib
import os
import sys

from ..errors import ArgumentError

_controller = None
#: The variables that size the thread pools of libraries a process loads later. Numba's own
#: (``NUMBA_NUM_THREADS``) is left alone: Numba refuses a changed value once its pool runs, so
#: :func:`cap_process_threads` calls ``numba.set_num_threads`` instead.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


def _blas():
    """threadpoolctl's controller for the BLAS libraries of this process (cached: its discovery
    walks every loaded library). SciPy's BLAS is loaded first: Numba loads it itself the first
    time it compiles array math (``numba.np.arraymath``), and its compiled ``np.dot`` calls it.
    Loaded later, inside a :func:`limit_threads` block, it would run there at its own count."""
    global _controller
    if _controller is None:
        import scipy.linalg.cython_blas  # noqa: F401 - a dependency (Numba's BLAS)
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController().select(user_api="blas")
    return _controller


def check_count(what, n):
    """``n`` if it is a positive int (or None); else an ArgumentError naming ``what``."""
    if n is None:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"{what} must be a positive integer or None, got {n!r}")
    return n


def num_threads():
    """``{"blas": n, "numba": n}``: the threads each pool runs now (``blas`` None when numpy
    has no BLAS that threadpoolctl knows)."""
    import numba

    info = _blas().info()
    blas = max((p["num_threads"] for p in info), default=None)
    return {"blas": blas, "numba": numba.get_num_threads()}


def set_num_threads(blas=None, numba=None):
    """Set the threads of numpy's BLAS and of Numba's parallel kernels for the process (None
    leaves a pool as it is). Returns the previous :func:`num_threads`, so a caller can
    restore it. Numba's count is capped at ``NUMBA_NUM_THREADS``.

    Raises:
        ArgumentError: a count that is not a positive integer.
    """
    blas = check_count("set_num_threads: blas", blas)
    numba_n = check_count("set_num_threads: numba", numba)
    before = num_threads()
    if blas is not None:
        _blas().limit(limits=blas)
    if numba_n is not None:
        import numba as nb

        nb.set_num_threads(min(numba_n, nb.config.NUMBA_NUM_THREADS))
    return before


@contextlib.contextmanager
def limit_threads(blas=None, numba=None):
    """Context manager: :func:`set_num_threads` inside the block, the previous counts
    restored after it (even when it raises)::

        with ml.engine.threads.limit_threads(blas=1):
            c(x)            # BLAS on one thread, Numba on all of its threads

    Each BLAS library gets its own count back: numpy's and SciPy's may differ (a caller's
    ``threadpool_limits(1)`` made before SciPy's was loaded reaches numpy's only), and
    restoring the largest to both would undo the caller's limit.
    """
    blas = check_count("set_num_threads: blas", blas)
    numba_n = check_count("set_num_threads: numba", numba)
    before = num_threads()
    limiter = _blas().limit(limits=blas) if blas is not None else None
    try:
        if numba_n is not None:
            set_num_threads(numba=numba_n)
        yield before
    finally:
        if limiter is not None:
            limiter.restore_original_limits()
        if numba_n is not None:
            set_num_threads(numba=before["numba"])


def cap_process_threads(n):
    """Cap every thread pool of this process at ``n`` threads, for good (nothing is restored):
    the first call of a freshly started worker process.

    Where :func:`limit_threads` sets numpy's BLAS and Numba for one block and restores them,
    this reaches everything a worker may run on, now and later:

    * the variables of :data:`THREAD_VARIABLES` (``OMP_NUM_THREADS`` ...), read by libraries
      the process loads after this call and by the processes it starts;
    * every pool threadpoolctl finds loaded: BLAS and OpenMP;
    * Numba's threads (at most ``NUMBA_NUM_THREADS``) if Numba is imported already (it is not
      imported for this). Call again after loading code that may have imported it or a BLAS
      (the DataLoader's workers do, after unpickling the dataset).

    Raises:
        ArgumentError: ``n`` is not a positive integer.
    """
    n = check_count("cap_process_threads: n", n)
    if n is None:
        raise ArgumentError("cap_process_threads: n must be a positive integer, got None")
    for name in THREAD_VARIABLES:
        os.environ[name] = str(n)
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n)
    numba = sys.modules.get("numba")
    if numba is not None:
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
