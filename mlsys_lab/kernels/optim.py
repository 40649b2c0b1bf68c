"""Dense optimiser updates in one fused pass: ``p -= lr * g`` in place, with no temporary.

numpy's ``p -= lr * g`` first writes ``lr * g`` into a fresh array the size of ``p``. For a
10^6 x 64 float32 embedding table that is 256 MB of new pages to fault in and zero, written and
read again: the update took 34 ms where one pass over ``p`` and ``g`` takes 13 ms
(``benchmarks/recsys.py`` times the dense embedding step that uses it). The loop does the same
float operations in the parameter's dtype (the product rounded to the dtype, then the
difference), so it leaves ``p`` bit-identical to numpy's. The row-sparse updates are in
:mod:`mlsys_lab.kernels.embedding`.
"""

import numba
import numpy as np

from .embedding import _KERNEL_DTYPES


@numba.njit(cache=False)
def _sgd_kernel(p, g, lr):
    for i in range(p.shape[0]):
        p[i] -= lr * g[i]


def sgd_dense(p, g, lr):
    """``p -= p.dtype(lr) * g`` in place (float ops as numpy's); returns ``p``. A fused Numba
    pass for C-contiguous float32/float64 arrays of one shape and dtype, numpy otherwise."""
    if (p.dtype in _KERNEL_DTYPES and g.dtype == p.dtype and g.shape == p.shape and p.size
            and p.flags.c_contiguous and g.flags.c_contiguous and p.flags.writeable):
        _sgd_kernel(p.reshape(-1), g.reshape(-1), p.dtype.type(lr))
    else:
        p -= np.asarray(lr, p.dtype) * g
    return p


__all__ = ["sgd_dense"]
