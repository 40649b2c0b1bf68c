"""Kernels of the compiled CPU backend, registered as the ``cpu`` implementations of their ops.

``ml.compile`` plans one arena for every intermediate and calls the kernel that operator
selection chose for a node as ``out_fn(out, *inputs, **attrs)``, with ``out`` already a view at
the tensor's planned offset, so a kernel writes ``out`` and allocates nothing of the output's
size. Each is registered with :func:`~.registry.register_impl` under the name of what it really
runs, and with an ``accepts`` rule for the nodes it can take; a node no kernel here accepts runs
its op's numpy reference (``compute``) and has the result copied into ``out``. Most are numpy
calls with ``out=`` (``numpy.add(out=)``); these are more than that:

* ``cblas.sgemm`` / ``cblas.dgemm`` (op ``gemm``) call numpy's own BLAS directly (ctypes),
  because only the BLAS interface has the ``alpha``/``beta`` and transpose flags that let
  ``C <- beta*C + alpha*A@B`` run as one call, in place, on transposed views without copies;
* ``numba.sum_accumulate`` (a bias update), ``numba.cross_entropy`` and its gradient,
  ``numba.relu_grad`` and the bias + ReLU epilogue of ``fused_linear``
  (``numpy.matmul+numba.bias_relu``) are small Numba loops: one pass over the input each,
  where numpy makes several passes and temporaries.

An elementwise kernel here must give what the op's own ``compute`` gives, bit for bit (signed
zeros and NaN included), so only ops that are one numpy ufunc have one; the others (``sigmoid``)
run their op's reference.
"""

import math

import numba
import numpy as np

from ..errors import OpError
from . import ops_math, ops_nn, ops_shape  # noqa: F401  (the ops these kernels implement)
from .passes import backend_ops  # noqa: F401  (gemm, sum_accumulate, fused_linear)
from .registry import register_impl


# --- acceptance rules -------------------------------------------------------------------------
def same_dtype(avals, out, attrs):
    """Every input has the output's dtype (numpy's ``out=`` would cast otherwise)."""
    if all(a.dtype == out.dtype for a in avals):
        return None
    return "mixed dtypes " + "/".join(np.dtype(a.dtype).name for a in avals)


def _blas_dtype(dtype):
    """None when numpy's BLAS has a GEMM for ``dtype``, else why not."""
    return None if np.dtype(dtype) in _cblas() else f"numpy's BLAS has no {np.dtype(dtype)} GEMM"


# --- relu_grad and the fused_linear epilogue --------------------------------------------------
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


def _c_order_target(out):
    """``out`` itself when it is C-contiguous, else a temporary to copy into it afterwards."""
    return out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)


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


def relu_grad_out(out, g, x):
    """``g`` where ``x > 0``, else exactly 0, in one Numba pass over flat arrays (``g``, ``x``
    and ``out`` of one shape and dtype; ``out`` may be ``g``'s buffer). Inputs in another
    layout are copied to C order first; a strided ``out`` is written through a temporary."""
    target = _c_order_target(out)
    _relu_grad_flat(target.reshape(-1), np.ascontiguousarray(g).reshape(-1),
                    np.ascontiguousarray(x).reshape(-1))
    if target is not out:
        np.copyto(out, target)


def _relu_grad_accepts(avals, out, attrs):
    g, x = avals
    if not tuple(g.shape) == tuple(x.shape) == tuple(out.shape):
        return f"shapes {tuple(g.shape)} and {tuple(x.shape)} broadcast"
    return same_dtype(avals, out, attrs)


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
@numba.njit(error_model="numpy", cache=False)
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


# --- softmax cross-entropy --------------------------------------------------------------------
@numba.njit(error_model="numpy", cache=False)
def _cross_entropy_loss(x, t):
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
def _cross_entropy_grad(out, x, t):
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
    """Mean softmax cross-entropy of logits ``x`` (N, C) against class ids ``t``, one pass."""
    loss, bad = _cross_entropy_loss(x, t)
    if bad >= 0:
        _bad_target("cross_entropy", t, x.shape[1])
    out[()] = loss


def cross_entropy_grad_out(out, x, t):
    """Its gradient ``(softmax(x) - onehot(t)) / N``, written into ``out`` in one pass."""
    if _cross_entropy_grad(out, x, t) >= 0:
        _bad_target("cross_entropy_grad", t, x.shape[1])


def _float_logits_int_targets(avals, out, attrs):
    x, t = avals
    if x.dtype != out.dtype or x.dtype not in (np.float32, np.float64):
        return f"logits {np.dtype(x.dtype).name} (float32/float64 only)"
    return None if np.dtype(t.dtype).kind in "iu" else f"targets {np.dtype(t.dtype).name}"


# --- registration -----------------------------------------------------------------------------
def _ufunc_kernel(ufunc):
    def run(out, *arrays):
        ufunc(*arrays, out=out)
    run.__name__ = run.__qualname__ = f"{ufunc.__name__}_out"
    run.__wrapped__ = ufunc
    return run


def _register():
    """Register every kernel of this module as a ``cpu`` impl of its op (most preferred
    first within each op)."""
    for op_name, ufunc in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                           ("div", np.true_divide), ("maximum", np.maximum),
                           ("minimum", np.minimum), ("neg", np.negative), ("exp", np.exp),
                           ("log", np.log), ("sqrt", np.sqrt), ("tanh", np.tanh),
                           ("sin", np.sin), ("cos", np.cos), ("abs", np.abs),
                           ("sign", np.sign), ("pow", np.power)):
        register_impl(op_name, "cpu", _ufunc_kernel(ufunc), name=f"numpy.{ufunc.__name__}(out=)",
                      accepts=same_dtype)
    register_impl("relu", "cpu", relu_out, name="numpy.maximum(out=)", accepts=same_dtype)
    register_impl("matmul", "cpu", matmul_out, name="numpy.matmul(out=)", accepts=same_dtype)
    register_impl("sum", "cpu", sum_out, name="numpy.sum(out=)", accepts=same_dtype)
    register_impl("cast", "cpu", copyto_out, name="numpy.copyto")
    register_impl("relu_grad", "cpu", relu_grad_out, name="numba.relu_grad",
                  accepts=_relu_grad_accepts)
    register_impl("fused_linear", "cpu", fused_linear_relu_out,
                  name="numpy.matmul+numba.bias_relu", accepts=_bias_relu_accepts)
    register_impl("fused_linear", "cpu", fused_linear_out, name="numpy.matmul+add(out=)",
                  accepts=_no_activation)
    for dtype, letter in ((np.dtype(np.float32), "s"), (np.dtype(np.float64), "d")):
        register_impl("gemm", "cpu", blas_gemm_out, name=f"cblas.{letter}gemm",
                      accepts=_blas_accepts(dtype))
    register_impl("sum_accumulate", "cpu", sum_accumulate_out, name="numba.sum_accumulate",
                  accepts=same_dtype)
    register_impl("cross_entropy", "cpu", cross_entropy_out, name="numba.cross_entropy",
                  accepts=_float_logits_int_targets)
    register_impl("cross_entropy_grad", "cpu", cross_entropy_grad_out,
                  name="numba.cross_entropy_grad", accepts=_float_logits_int_targets)


def relu_out(out, x):
    """``relu(x)`` as numpy's ``maximum(x, 0, out=out)``."""
    np.maximum(x, 0, out=out)


def matmul_out(out, a, b):
    """``a @ b`` as numpy's ``matmul(a, b, out=out)``."""
    np.matmul(a, b, out=out)


def sum_out(out, x, axis, keepdims):
    """``x.sum(axis)`` as numpy's ``sum(..., out=out)``."""
    np.sum(x, axis=axis, keepdims=keepdims, out=out)


def copyto_out(out, x, **attrs):
    """``x`` converted into ``out``'s dtype (``cast``, ``copy``): numpy's ``copyto``."""
    np.copyto(out, x, casting="unsafe")


_register()
