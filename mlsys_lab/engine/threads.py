"""The two CPU thread pools a process runs: numpy's BLAS (OpenBLAS, MKL) and Numba's.

Each pool keeps its idle workers spinning for a while after a call, so a parallel kernel of
one pool started right after the other's call finds the cores still busy
(``benchmarks/matmul.py`` measures it). Three ways to set them:

* :func:`set_num_threads` — for the rest of the process: worker processes and grading kernels
  run ``set_num_threads(blas=1, numba=1)``, one thread of each per process;
* :func:`limit_threads` — a context manager, the settings restored on exit;
* ``ml.compile(..., threads=...)`` — per compiled graph (see
  :class:`~mlsys_lab.engine.compiler.Executable`): a ``cpu-numba`` graph that runs Numba's
  parallel kernels and BLAS kernels back to back holds BLAS at one thread while it runs
  (``threads="coordinate"``, its default), so no BLAS worker spins while Numba's run.

BLAS is reached through ``threadpoolctl`` (a dependency), Numba through
``numba.set_num_threads`` (at most ``NUMBA_NUM_THREADS``, fixed when Numba starts).
"""

import contextlib

from ..errors import ArgumentError

_controller = None


def _blas():
    """threadpoolctl's controller for the BLAS libraries loaded in this process (cached: its
    discovery walks every loaded library)."""
    global _controller
    if _controller is None:
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
    """
    before = set_num_threads(blas=blas, numba=numba)
    try:
        yield before
    finally:
        set_num_threads(blas=before["blas"] if blas is not None else None,
                        numba=before["numba"] if numba is not None else None)
