"""``apply`` — the single entry point of every op — and the modes it reads.

``apply(op, *args, **attrs)`` is where the ways of running an op meet:

* eager: run the op now: a ``cpu`` kernel flagged ``eager`` where one accepts the arrays,
  else the op's numpy reference (:func:`run_kernel`);
* tracing: if an input is a tracer, emit a node into the graph being built instead;
* autodiff: if an input requires grad, remember ``(op, inputs, attrs)`` on the output (the tape),
  and if an input carries a tangent (forward mode), push the tangent through the op's JVP rule.

It reads only the op record (:mod:`.registry`). The Tensor class sits above this module and
registers itself (:func:`use_tensor_type`), so imports flow one way: ``tensor`` imports
``dispatch``, never the reverse. :func:`custom_op` (``ml.custom_op``) defines a new op and
returns it as a Python function.
"""

import contextlib
import weakref

import numpy as np

from ..errors import MLSysError, OpError
from .registry import defop, get


class _Mode:
    allocator = None  # a CachingAllocator that accounts eager outputs (see memory.track_memory)
    grad_enabled = True
    forward_depth = 0  # >0 while ml.jvp is running
    forward_suspended = 0  # >0 while a JVP rule itself runs
    builders: list = []  # stack of active GraphBuilders (tracing)


MODE = _Mode()

# How apply makes Tensors, set by tensor.py (see use_tensor_type).
_lift = _wrap = None


def use_tensor_type(lift, wrap):
    """Tell :func:`apply` how to make tensors: ``lift(args, op_name)`` turns an op's arguments
    into Tensors, ``wrap(array)`` wraps a result. ``tensor.py`` calls this once, right after it
    defines ``Tensor``."""
    global _lift, _wrap
    _lift, _wrap = lift, wrap


@contextlib.contextmanager
def no_grad():
    """Context manager: ops inside record nothing on the tape (like ``torch.no_grad``)."""
    prev, MODE.grad_enabled = MODE.grad_enabled, False
    try:
        yield
    finally:
        MODE.grad_enabled = prev


@contextlib.contextmanager
def enable_grad():
    """Context manager: record on the tape even inside ``no_grad``."""
    prev, MODE.grad_enabled = MODE.grad_enabled, True
    try:
        yield
    finally:
        MODE.grad_enabled = prev


def is_grad_enabled():
    """Whether ops record on the tape now (False inside ``no_grad``)."""
    return MODE.grad_enabled


def apply(op, *args, **attrs):
    """Run ``op`` on ``args`` eagerly, or emit it into the active trace; tape and JVP as needed."""
    # The eager path runs once per op call, so it is written for speed: one pass over the
    # inputs finds a tracer (emit instead) and an input that requires grad (record the tape).
    ts = _lift(args, op.name)
    builder, taped = None, False
    for t in ts:
        if t.data is None:
            builder = t._builder
            break
        if t.requires_grad:
            taped = True
    if builder is None and op.impure and MODE.builders:  # fresh randomness: record, don't run
        builder = MODE.builders[-1]
    if builder is None:
        out = _wrap(run_kernel(op, [t.data for t in ts], attrs))
        if MODE.allocator is not None:
            _account(out)
    else:
        out = builder.emit(op, ts, attrs)
        taped = any(t.requires_grad for t in ts)
    if taped and MODE.grad_enabled and op.vjp is not None:
        out.requires_grad = True
        out._ctx = (op, ts, attrs)
    if MODE.forward_depth and not MODE.forward_suspended:
        _push_tangent(op, ts, out, attrs)
    return out


def run_kernel(op, arrays, attrs):
    """Check shapes/dtypes with ``op.infer``, run the op, return an array of that type.

    The op runs as the first of its ``eager_impls`` (``cpu`` kernels flagged ``eager``: exact,
    or differing from ``compute`` only in summation order; see
    :class:`~.registry.Kernel`) that accepts the arrays, writing a fresh array; else as its
    numpy reference ``compute``."""
    aval = op.infer(*arrays, **attrs)  # rules read only .shape and .dtype, which arrays have
    try:
        for kernel in op.eager_impls:
            if kernel.accepts(arrays, aval, attrs) is None:
                res = np.empty(aval.shape, aval.dtype)
                kernel.out_fn(res, *arrays, **attrs)
                return res
        res = op.compute(*arrays, **attrs)
    except MLSysError:
        raise
    except Exception as e:
        shapes = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
        raise OpError(f"{op.name}: kernel failed on inputs ({shapes}): {e}") from e
    if not isinstance(res, np.ndarray) or res.dtype != aval.dtype:
        res = np.asarray(res, dtype=aval.dtype)
    return res


# --- memory accounting --------------------------------------------------------------------------
def _account(t):
    """Book the tensor's bytes in the tracking allocator; free them when it is collected."""
    alloc = MODE.allocator
    block = alloc.malloc(t.data.nbytes)
    weakref.finalize(t, _free_quietly, alloc, block)


def _free_quietly(alloc, block):
    try:
        alloc.free(block)
    except ValueError:  # the allocator was emptied or replaced meanwhile
        pass


@contextlib.contextmanager
def account_outputs(allocator):
    """Book every eager op output in ``allocator`` (a ``CachingAllocator``) while the block
    runs; each block returns to the cache when its tensor is garbage-collected."""
    prev, MODE.allocator = MODE.allocator, allocator
    try:
        yield allocator
    finally:
        MODE.allocator = prev


# --- forward mode -------------------------------------------------------------------------------
def _push_tangent(op, ts, out, attrs):
    if op.jvp is None or all(t._tangent is None for t in ts):
        return
    tangents = tuple(t._tangent for t in ts)
    MODE.forward_suspended += 1
    try:
        tan = op.jvp(tangents, ts, out, **attrs)
    finally:
        MODE.forward_suspended -= 1
    out._tangent = conform_tangent(tan, out)


def conform_tangent(tan, out):
    """Broadcast/cast a JVP rule's result to the output's type (None stays None = zero)."""
    if tan is None:
        return None
    if tuple(tan.shape) != tuple(out.shape):
        tan = apply(get("broadcast_to"), tan, shape=tuple(out.shape))
    return tan if tan.dtype == out.dtype else apply(get("cast"), tan, dtype=out.dtype)


def tsum(*terms):
    """Sum of the tangent terms that are not None (None means a zero tangent)."""
    terms = [t for t in terms if t is not None]
    if not terms:
        return None
    out = terms[0]
    for t in terms[1:]:
        out = out + t
    return out


# --- user-defined ops ---------------------------------------------------------------------------
def custom_op(name, *, compute, infer, vjp=None, jvp=None, elementwise=False, view=None,
              fusion=None, unfusable_reason=None, inplace=(), impure=False, replace=False):
    """Define a new operator and return it as a Python function (``ml.custom_op``).

    The op joins the registry like every built-in op: eager mode, tracing, the tape, the graph
    autodiff transform, forward mode and ``ml.compile`` all read its definition, and with
    ``elementwise=True`` and a ``fusion`` template the fusion pass folds it into the generated
    elementwise loops. The arguments are those of
    :func:`~mlsys_lab.engine.registry.defop`, all keywords::

        def swish_vjp(g, xs, y, needs):
            s = ml.ops.sigmoid(xs[0])
            return (g * (s + y * (1.0 - s)),)

        swish = ml.custom_op("swish", compute=lambda x: x / (1 + np.exp(-x)),
                             infer=same_shape_float, vjp=swish_vjp, jvp=swish_jvp,
                             elementwise=True)
        swish(ml.tensor([1.0, 2.0]))

    Args:
        name: the op's name (``replace=True`` redefines one already registered, handy when a
            notebook cell runs again).
        compute: numpy kernel ``compute(*arrays, **attrs) -> ndarray``.
        infer: shape/dtype rule ``infer(*avals, **attrs) -> AVal``.
        vjp: reverse-mode rule ``vjp(g, xs, y, needs, **attrs) -> tuple`` in framework ops.
        jvp: forward-mode rule ``jvp(tangents, xs, y, **attrs) -> tangent``.
        elementwise, view, fusion, unfusable_reason, inplace, impure: as for ``defop``.
        replace: redefine an op of the same name.

    Returns:
        ``f(*inputs, **attrs)`` that applies the op; ``f.op`` is the registered ``Op``.
    """
    op = defop(name, compute=compute, infer=infer, vjp=vjp, jvp=jvp, elementwise=elementwise,
               view=view, fusion=fusion, unfusable_reason=unfusable_reason, inplace=inplace,
               impure=impure, replace=replace)

    def call(*inputs, **attrs):
        return apply(op, *inputs, **attrs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Apply the custom op {name!r} (defined with ml.custom_op)."
    call.op = op
    return call
