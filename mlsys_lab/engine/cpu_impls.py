"""Kernels of the compiled CPU backend, registered as the ``cpu`` implementations of their ops.

``ml.compile`` plans one arena for every intermediate and calls the kernel that operator
selection chose for a node as ``out_fn(out, *inputs, **attrs)``, with ``out`` already a view at
the tensor's planned offset, so a kernel writes ``out`` and allocates nothing of the output's
size. Each is registered with :func:`~.registry.register_impl` under the name of what it really
runs, and with an ``accepts`` rule for the nodes it can take; a node no kernel here accepts runs
its op's numpy reference (``compute``) and has the result copied into ``out``. Most are numpy
calls with ``out=`` (``numpy.add(out=)``); ``numba.cross_entropy``, its gradient and
``numba.relu_grad`` are small Numba loops, one pass over the input each where numpy makes several
passes and temporaries. The fused ops' kernels (cblas GEMM, the bias + ReLU epilogue) are in
:mod:`.passes.fusion.kernels`.

An elementwise kernel here must give what the op's own ``compute`` gives, bit for bit (signed
zeros and NaN included), so only ops that are one numpy ufunc have one; the others (``sigmoid``)
run their op's reference. Those kernels say so (``exact=True``); eager mode runs
``numba.relu_grad`` too (``eager=True``: one pass where ``np.where`` makes a mask and a copy),
while the ufunc kernels would gain it nothing over ``compute``, the same ufunc.
"""

import math

import numba
import numpy as np

from ..errors import OpError
from . import ops_math, ops_nn, ops_shape  # noqa: F401  (the ops these kernels implement)
from .numba_cache import CACHE
from .registry import register_impl


# --- acceptance rules -------------------------------------------------------------------------
def same_dtype(avals, out, attrs):
    """Every input has the output's dtype (numpy's ``out=`` would cast otherwise)."""
    if all(a.dtype == out.dtype for a in avals):
        return None
    return "mixed dtypes " + "/".join(np.dtype(a.dtype).name for a in avals)


# --- relu_grad --------------------------------------------------
@numba.njit(error_model="numpy", cache=CACHE)
def _relu_grad_flat(out, g, x):
    for i in range(out.shape[0]):
        out[i] = g[i] if x[i] > 0 else 0  # exactly 0, even where g is inf or NaN


@numba.njit(error_model="numpy", cache=CACHE)
def _relu_grad_in_place(g, x):
    for i in range(g.shape[0]):
        g[i] = g[i] if x[i] > 0 else 0  # one array written: LLVM vectorises it


def _c_order_target(out):
    """``out`` itself when it is C-contiguous, else a temporary to copy into it afterwards."""
    return out if out.flags.c_contiguous else np.empty(out.shape, out.dtype)


def relu_grad_out(out, g, x):
    """``g`` where ``x > 0``, else exactly 0, in one Numba pass over flat arrays (``g``, ``x``
    and ``out`` of one shape and dtype; ``out`` may be ``g``'s buffer). Inputs in another
    layout are copied to C order first; a strided ``out`` is written through a temporary."""
    target = _c_order_target(out)
    if (target is out and g.flags.c_contiguous and g.ctypes.data == out.ctypes.data
            and g.shape == out.shape):  # in place over g: out and g alias
        _relu_grad_in_place(out.reshape(-1), np.ascontiguousarray(x).reshape(-1))
        return
    _relu_grad_flat(target.reshape(-1), np.ascontiguousarray(g).reshape(-1),
                    np.ascontiguousarray(x).reshape(-1))
    if target is not out:
        np.copyto(out, target)


def _relu_grad_accepts(avals, out, attrs):
    g, x = avals
    if not tuple(g.shape) == tuple(x.shape) == tuple(out.shape):
        return f"shapes {tuple(g.shape)} and {tuple(x.shape)} broadcast"
    return same_dtype(avals, out, attrs)


# --- softmax cross-entropy --------------------------------------------------------------------
@numba.njit(error_model="numpy", cache=CACHE)
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


@numba.njit(error_model="numpy", cache=CACHE)
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


def pow_out(out, a, b):
    """``a ** b`` into ``out`` by :func:`.ops_math.power`: numpy's power, with the special values
    chosen by the exponent's size (one value: numpy's ``x ** c`` rules), not by its layout."""
    ops_math.power(a, b, out=out)


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
                           ("sign", np.sign)):
        register_impl(op_name, "cpu", _ufunc_kernel(ufunc), name=f"numpy.{ufunc.__name__}(out=)",
                      accepts=same_dtype, exact=True)
    register_impl("pow", "cpu", pow_out, name="numpy.power(out=)", accepts=same_dtype, exact=True)
    register_impl("relu", "cpu", relu_out, name="numpy.maximum(out=)", accepts=same_dtype)
    register_impl("matmul", "cpu", matmul_out, name="numpy.matmul(out=)", accepts=same_dtype)
    register_impl("sum", "cpu", sum_out, name="numpy.sum(out=)", accepts=same_dtype)
    register_impl("cast", "cpu", copyto_out, name="numpy.copyto")
    register_impl("relu_grad", "cpu", relu_grad_out, name="numba.relu_grad",
                  accepts=_relu_grad_accepts, exact=True, eager=True)
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
