"""CPU kernels of the fused ops (``out=`` convention), registered as their ``cpu`` impls.

* ``cblas.sgemm`` / ``cblas.dgemm`` (op ``gemm``) call numpy's own BLAS directly (ctypes),
  because only the BLAS interface has the ``alpha``/``beta`` and transpose flags that let
  ``C <- beta*C + alpha*A@B`` run as one call, in place, on transposed views without copies;
* ``numba.sum_accumulate`` (a bias update) and the bias + ReLU epilogue of ``fused_linear``
  (``numpy.matmul+numba.bias_relu``) are small Numba loops: one pass over the data each.
"""

import ctypes

import numba
import numpy as np

from ...cpu_impls import _c_order_target, same_dtype
from ...numba_cache import CACHE
from ...registry import register_impl
from . import ops  # noqa: F401  (the ops these kernels implement)


def _blas_dtype(dtype):
    """None when numpy's BLAS has a GEMM for ``dtype``, else why not."""
    return None if np.dtype(dtype) in _cblas() else f"numpy's BLAS has no {np.dtype(dtype)} GEMM"


@numba.njit(error_model="numpy", cache=CACHE)
def _bias_relu_rows(out, b):
    """out[i, j] = max(out[i, j] + b[j], 0) in one pass."""
    for i in range(out.shape[0]):
        row = out[i]
        for j in range(row.shape[0]):
            v = row[j] + b[j]
            row[j] = 0 if v <= 0 else v  # NaN stays NaN, as with np.maximum


def fused_linear_relu_out(out, a, w, b, activation="relu"):
    """``relu(a @ w + b)``: numpy's matmul into ``out``, then bias and ReLU in one Numba pass
    (``b`` a vector along the last axis, one dtype throughout)."""
    target = _c_order_target(out)
    np.matmul(a, w, out=target)
    _bias_relu_rows(target.reshape(-1, target.shape[-1]), b)
    if target is not out:
        np.copyto(out, target)


def _bias_relu_accepts(avals, out, attrs):
    if attrs.get("activation") != "relu":
        return f"activation {attrs.get('activation')}"
    b = avals[2]
    if len(out.shape) == 0 or 0 in out.shape or tuple(b.shape) != tuple(out.shape[-1:]):
        return f"bias {tuple(b.shape)} is not one value per column of {tuple(out.shape)}"
    return same_dtype(avals, out, attrs)


def fused_linear_out(out, a, w, b, activation=None):
    """``a @ w + b`` with numpy's matmul and add, both writing ``out``."""
    np.matmul(a, w, out=out)
    np.add(out, b, out=out)


def _no_activation(avals, out, attrs):
    act = attrs.get("activation")
    return same_dtype(avals, out, attrs) if act is None else f"activation {act}"


# --- GEMM through numpy's own BLAS -----------------------------------------------------------
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112


def _find_cblas():
    """``{dtype: cblas_?gemm}`` from the BLAS library numpy itself is linked against, via ctypes;
    ``{}`` when it cannot be found (the numpy route is used then).

    It must be numpy's BLAS and not, say, SciPy's: each OpenBLAS copy keeps its own pool of
    spinning threads, and two pools on the same cores slow every GEMM down twentyfold.
    ``dlsym`` on numpy's extension module searches the libraries it loaded, so the lookup finds
    numpy's BLAS under whichever name its build gave it (OpenBLAS wheels use ILP64 symbols
    ``scipy_cblas_sgemm64_``; other builds the plain ``cblas_sgemm``)."""

    try:
        from numpy._core import _multiarray_umath as umath
    except ImportError:  # numpy < 2
        from numpy.core import _multiarray_umath as umath
    try:
        lib = ctypes.CDLL(umath.__file__)
    except OSError:
        return {}
    found = {}
    for dtype, letter, scalar in ((np.float32, "s", ctypes.c_float),
                                  (np.float64, "d", ctypes.c_double)):
        for name, size in ((f"scipy_cblas_{letter}gemm64_", ctypes.c_int64),
                           (f"cblas_{letter}gemm64_", ctypes.c_int64),
                           (f"cblas_{letter}gemm", ctypes.c_int)):
            fn = getattr(lib, name, None)
            if fn is not None:
                ptr = ctypes.c_void_p
                fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, size, size, size, scalar,
                               ptr, size, ptr, size, scalar, ptr, size]
                fn.restype = None
                found[np.dtype(dtype)] = fn
                break
    return found


_CBLAS = []


def _cblas():
    """The cached result of :func:`_find_cblas` (looked up on first use)."""
    if not _CBLAS:
        _CBLAS.append(_find_cblas())
    return _CBLAS[0]


def _operand(x):
    """``(pointer, transpose flag, leading dimension)`` of a 2-D operand for row-major BLAS;
    None unless it is C- or Fortran-contiguous (a transposed view is the latter)."""
    if x.flags.c_contiguous:
        return x.ctypes.data, _NO_TRANS, max(x.shape[1], 1)
    if x.flags.f_contiguous:
        return x.ctypes.data, _TRANS, max(x.shape[0], 1)
    return None


def _blas_call(fn, out, a, b, alpha, beta, pa, pb):
    """``out <- beta * out + alpha * (a @ b)``: one BLAS call (``out`` C-contiguous)."""
    m, n = out.shape
    fn(_ROW_MAJOR, pa[1], pb[1], m, n, a.shape[1], alpha, pa[0], pa[2], pb[0], pb[2], beta,
       out.ctypes.data, max(n, 1))


def gemm_out(out, c, a, b, alpha=1.0, beta=1.0):
    """``out <- beta * c + alpha * (a @ b)`` for 2-D float32/float64 operands, as one BLAS call.

    ``out`` may be ``c`` itself: the product is then accumulated in place and never stored on
    its own. ``a`` and ``b`` may be transposed views (BLAS's transpose flags read them without
    a copy). Anything BLAS cannot take here (other dtypes or layouts, ``out`` overlapping an
    operand, no BLAS found) takes the numpy route with the same result. (The compiled
    backend's ``cblas.?gemm`` kernels are :func:`blas_gemm_out`, which never leaves BLAS.)
    """
    fn = _cblas().get(out.dtype)
    same = c is out or (c.ctypes.data == out.ctypes.data and c.shape == out.shape
                        and c.strides == out.strides)
    pa, pb = _operand(a), _operand(b)
    if (fn is None or pa is None or pb is None or out.ndim != 2 or not out.flags.c_contiguous
            or a.dtype != out.dtype or b.dtype != out.dtype or 0 in out.shape
            or (not same and np.shares_memory(out, c))
            or np.may_share_memory(out, a) or np.may_share_memory(out, b)):
        np.copyto(out, beta * c + alpha * np.matmul(a, b), casting="unsafe")
        return
    if not same:
        np.copyto(out, c, casting="unsafe")
    _blas_call(fn, out, a, b, alpha, beta, pa, pb)


def blas_gemm_out(out, c, a, b, alpha=1.0, beta=1.0):
    """The ``cblas.sgemm`` / ``cblas.dgemm`` kernel of ``gemm``: ``out <- beta * c + alpha *
    (a @ b)`` always by one BLAS call, for operands of one dtype that BLAS has.

    What BLAS cannot read in place is copied first: an operand that is neither C- nor
    Fortran-contiguous, an operand or ``c`` that overlaps ``out`` (``out`` may be ``c``
    itself: then the product is accumulated in place), and a strided ``out`` (written through
    a C-order temporary).
    """
    fn = _cblas()[out.dtype]
    pa, pb = _operand(a), _operand(b)
    if pa is None or np.may_share_memory(out, a):
        a = np.array(a, order="C")
        pa = _operand(a)
    if pb is None or np.may_share_memory(out, b):
        b = np.array(b, order="C")
        pb = _operand(b)
    target = _c_order_target(out)
    same = c is target or (c.ctypes.data == target.ctypes.data and c.shape == target.shape
                           and c.strides == target.strides)
    if not same:
        np.copyto(target, np.array(c) if np.shares_memory(target, c) else c)
    _blas_call(fn, target, a, b, alpha, beta, pa, pb)
    if target is not out:
        np.copyto(out, target)


def _blas_accepts(dtype):
    def accepts(avals, out, attrs):
        if not all(a.dtype == dtype for a in avals):
            return "dtype " + "/".join(sorted({np.dtype(a.dtype).name for a in avals}))
        if 0 in out.shape:
            return f"empty result {tuple(out.shape)}"
        return _blas_dtype(dtype)
    return accepts


# --- column sum with accumulation (a bias gradient folded into its update) --------------------
@numba.njit(error_model="numpy", cache=CACHE)
def _sum_accumulate_rows(out, c, x, alpha, beta):
    acc = np.zeros(x.shape[1], np.float64)
    for i in range(x.shape[0]):
        row = x[i]
        for j in range(row.shape[0]):
            acc[j] += row[j]
    for j in range(out.shape[0]):
        out[j] = beta * c[j] + alpha * acc[j]


def sum_accumulate_out(out, c, x, alpha=1.0, beta=1.0):
    """``out <- beta * c + alpha * x.sum(axis=0)`` in one Numba pass over ``x`` (any layout;
    ``out`` may be ``c``); the sum is accumulated in float64. Operands of mixed dtypes take
    the numpy route."""
    if x.ndim == 2 and x.dtype == out.dtype == c.dtype:
        _sum_accumulate_rows(out, c, x, alpha, beta)
    else:
        np.copyto(out, beta * c + alpha * x.sum(axis=0), casting="unsafe")


def _register():
    register_impl("fused_linear", "cpu", fused_linear_relu_out,
                  name="numpy.matmul+numba.bias_relu", accepts=_bias_relu_accepts)
    register_impl("fused_linear", "cpu", fused_linear_out, name="numpy.matmul+add(out=)",
                  accepts=_no_activation)
    for dtype, letter in ((np.dtype(np.float32), "s"), (np.dtype(np.float64), "d")):
        register_impl("gemm", "cpu", blas_gemm_out, name=f"cblas.{letter}gemm",
                      accepts=_blas_accepts(dtype))
    register_impl("sum_accumulate", "cpu", sum_accumulate_out, name="numba.sum_accumulate",
                  accepts=same_dtype)


_register()
