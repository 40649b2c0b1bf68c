"""Kernels of the compiled CPU backend: each writes its result into a given output array.

``ml.compile`` plans one arena for every intermediate and calls ``OUT_KERNELS[op](out, *inputs,
**attrs)`` with ``out`` already a view at the tensor's planned offset, so a kernel must write
``out`` and allocate nothing of the output's size. Most are numpy calls with ``out=``; these
are more than that:

* ``gemm`` calls ``cblas_sgemm``/``cblas_dgemm`` of numpy's own BLAS directly (ctypes),
  because only the BLAS interface has the ``alpha``/``beta`` and transpose flags that let
  ``C <- beta*C + alpha*A@B`` run as one call, in place, on transposed views without copies;
* ``sum_accumulate`` (a bias update), ``cross_entropy`` and its gradient, ``relu_grad`` and the
  bias + ReLU epilogue of ``fused_linear`` are small Numba loops: one pass over the input each,
  where numpy makes several passes and temporaries.

An elementwise kernel here must give what the op's own ``compute`` gives, bit for bit (signed
zeros and NaN included), so only ops that are one numpy ufunc have one; the others (``sigmoid``)
run their op's ``compute`` and copy the result.
"""

import math

import numba
import numpy as np

from ..errors import OpError

_UFUNC = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
          "maximum": np.maximum, "minimum": np.minimum, "neg": np.negative, "exp": np.exp,
          "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
          "abs": np.abs, "sign": np.sign, "pow": np.power}


@numba.njit(error_model="numpy", cache=False)
def _bias_relu_rows(out, b):
    """out[i, j] = max(out[i, j] + b[j], 0) in one pass."""
    for i in range(out.shape[0]):
        row = out[i]
        for j in range(row.shape[0]):
            v = row[j] + b[j]
            row[j] = 0 if v <= 0 else v  # NaN stays NaN, as with np.maximum


@numba.njit(error_model="numpy", cache=False)
def _relu_grad_flat(out, g, x):
    for i in range(out.shape[0]):
        out[i] = g[i] if x[i] > 0 else 0  # exactly 0, even where g is inf or NaN


def _fused_linear_out(out, a, w, b, activation=None):
    np.matmul(a, w, out=out)
    if (activation == "relu" and out.ndim == 2 and b.shape == out.shape[1:]
            and b.dtype == out.dtype and out.flags.c_contiguous):
        _bias_relu_rows(out, b)
        return
    np.add(out, b, out=out, casting="unsafe")
    if activation == "relu":
        np.maximum(out, 0, out=out)


def _relu_grad_out(out, g, x):
    """g where x > 0, else 0: one Numba pass when all three are alike and contiguous."""
    if (g.shape == x.shape == out.shape and g.dtype == out.dtype and x.dtype == out.dtype
            and out.flags.c_contiguous and g.flags.c_contiguous and x.flags.c_contiguous):
        _relu_grad_flat(out.reshape(-1), g.reshape(-1), x.reshape(-1))
    else:  # out may be g's own buffer (in place): build the result before writing it
        np.copyto(out, np.where(x > 0, g, np.zeros((), out.dtype)))


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
    import ctypes

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


def _operand(x):
    """``(pointer, transpose flag, leading dimension)`` of a 2-D operand for row-major BLAS;
    None unless it is C- or Fortran-contiguous (a transposed view is the latter)."""
    if x.flags.c_contiguous:
        return x.ctypes.data, _NO_TRANS, max(x.shape[1], 1)
    if x.flags.f_contiguous:
        return x.ctypes.data, _TRANS, max(x.shape[0], 1)
    return None


def gemm_out(out, c, a, b, alpha=1.0, beta=1.0):
    """``out <- beta * c + alpha * (a @ b)`` for 2-D float32/float64 operands, as one BLAS call.

    ``out`` may be ``c`` itself: the product is then accumulated in place and never stored on
    its own. ``a`` and ``b`` may be transposed views (BLAS's transpose flags read them without
    a copy). Anything BLAS cannot take here (other dtypes or layouts, ``out`` overlapping an
    operand, no BLAS found) takes the numpy route with the same result.
    """
    if not _CBLAS:
        _CBLAS.append(_find_cblas())
    fn = _CBLAS[0].get(out.dtype)
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
    m, n = out.shape
    fn(_ROW_MAJOR, pa[1], pb[1], m, n, a.shape[1], alpha, pa[0], pa[2], pb[0], pb[2], beta,
       out.ctypes.data, max(n, 1))


# --- column sum with accumulation (a bias gradient folded into its update) --------------------
@numba.njit(error_model="numpy", cache=False)
def _sum_rows_into(out, c, x, alpha, beta):
    acc = np.zeros(x.shape[1], np.float64)
    for i in range(x.shape[0]):
        row = x[i]
        for j in range(row.shape[0]):
            acc[j] += row[j]
    for j in range(out.shape[0]):
        out[j] = beta * c[j] + alpha * acc[j]


def sum_accumulate_out(out, c, x, alpha=1.0, beta=1.0):
    """``out <- beta * c + alpha * x.sum(axis=0)`` in one pass over ``x`` (``out`` may be
    ``c``); the sum is accumulated in float64."""
    if x.ndim == 2 and x.flags.c_contiguous and out.flags.c_contiguous and x.dtype == out.dtype:
        _sum_rows_into(out, c, x, alpha, beta)
    else:
        np.copyto(out, beta * c + alpha * x.sum(axis=0), casting="unsafe")


# --- softmax cross-entropy --------------------------------------------------------------------
@numba.njit(error_model="numpy", cache=False)
def _ce_loss(x, t):
    """Mean of logsumexp(x_i) - x_i[t_i]; returns (loss, index of a bad target or -1)."""
    n, c = x.shape
    total = 0.0
    for i in range(n):
        k = t[i]
        if k < 0 or k >= c:
            return 0.0, i
        m = x[i, 0]
        for j in range(1, c):
            m = max(m, x[i, j])
        s = 0.0
        for j in range(c):
            s += math.exp(x[i, j] - m)
        total += math.log(s) + m - x[i, k]
    return total / n, -1


@numba.njit(error_model="numpy", cache=False)
def _ce_grad(out, x, t):
    """out = (softmax(x) - onehot(t)) / N; returns the index of a bad target or -1."""
    n, c = x.shape
    for i in range(n):
        k = t[i]
        if k < 0 or k >= c:
            return i
        m = x[i, 0]
        for j in range(1, c):
            m = max(m, x[i, j])
        s = 0.0
        for j in range(c):
            e = math.exp(x[i, j] - m)
            out[i, j] = e
            s += e
        for j in range(c):
            out[i, j] = (out[i, j] / s - (1.0 if j == k else 0.0)) / n
    return -1


def _bad_target(op, t, c):
    raise OpError(f"{op}: targets must lie in [0, {c}), got min {t.min()} max {t.max()}")


def cross_entropy_out(out, x, t):
    loss, bad = _ce_loss(x, t)
    if bad >= 0:
        _bad_target("cross_entropy", t, x.shape[1])
    out[()] = loss


def cross_entropy_grad_out(out, x, t):
    if _ce_grad(out, x, t) >= 0:
        _bad_target("cross_entropy_grad", t, x.shape[1])


#: Kernels that write into a given output array: ``fn(out, *arrays, **attrs)``.
OUT_KERNELS = {
    "relu": lambda out, x: np.maximum(x, 0, out=out),
    "relu_grad": _relu_grad_out,
    "matmul": lambda out, a, b: np.matmul(a, b, out=out),
    "sum": lambda out, x, axis, keepdims: np.sum(x, axis=axis, keepdims=keepdims, out=out),
    "cast": lambda out, x, dtype: np.copyto(out, x, casting="unsafe"),
    "copy": lambda out, x, src, dst: np.copyto(out, x),
    "fused_linear": _fused_linear_out,
    "gemm": gemm_out,
    "sum_accumulate": sum_accumulate_out,
}
for _name, _uf in _UFUNC.items():
    OUT_KERNELS[_name] = (lambda uf: lambda out, *xs: uf(*xs, out=out))(_uf)

#: Kernels whose inputs need not share the output's dtype (e.g. integer class ids).
MIXED_DTYPE_KERNELS = {
    "cross_entropy": cross_entropy_out,
    "cross_entropy_grad": cross_entropy_grad_out,
}
