"""Backend (hardware-aware) passes, book chapter 7: transpose cancelling, Concat splitting for a
device input limit, NCHW -> NHWC layout transformation and precision lowering. Every fusion pass
lives in :mod:`.fusion`.
"""

import numpy as np

from .. import dtypes
from ..registry import REGISTRY, get
from . import layout_ops  # noqa: F401  (registers the channels-last ops layout_transform emits)
from .rewrite import Rewriter, clone, graph_pass, producer_of

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
OIHW_TO_HWIO = (2, 3, 1, 0)


def nhwc_op(name):
    """The channels-last op of ``name`` (``conv2d`` -> ``conv2d_nhwc``), None if it has none:
    an op ``X`` runs in NHWC when an op ``X_nhwc`` is registered."""
    return f"{name}_nhwc" if f"{name}_nhwc" in REGISTRY else None


def _is_identity(perm):
    return tuple(perm) == tuple(range(len(perm)))


@graph_pass
def cancel_transposes(graph):
    """Merge chains of transposes.

    ``transpose(transpose(x, p), q)`` reads axis ``p[q[i]]`` of x at position i: when that
    composed permutation is the identity both nodes go (x is used directly), otherwise one
    transpose with the composed permutation remains. A lone identity transpose is removed too.
    The inner transpose survives only if something else still reads it.
    """
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op != "transpose":
            rw.copy(n)
            continue
        x, perm = rw[n.inputs[0]], tuple(n.attrs["axes"])
        inner = producer_of(rw, x, "transpose")
        if inner is not None:
            perm = tuple(inner.attrs["axes"][i] for i in perm)
            x = inner.inputs[0]
        elif not _is_identity(perm):
            rw.copy(n)
            continue
        rw.drop(n)
        rw.bind(n.output, x if _is_identity(perm) else
                rw.emit("transpose", [x], {"axes": perm}, name=n.output.name, source=n.source))
    return rw.build()


@graph_pass
def split_concat(graph, max_inputs=63):
    """Split every Concat with more than ``max_inputs`` inputs into a tree of Concats that a
    device accepting at most ``max_inputs`` inputs can run.

    The inputs are cut into chunks of ``max_inputs`` (the last chunk takes the remainder), each
    chunk is concatenated, and the partial results are concatenated again (recursively if there
    are still too many): 100 inputs with a limit of 63 become Concat(63) + Concat(37) and a final
    Concat(2), the book's example. Concatenation along one axis is associative, so the result is
    unchanged.
    """
    if max_inputs < 2:
        raise ValueError(f"split_concat: max_inputs must be at least 2, got {max_inputs}")
    rw = Rewriter(graph)
    for n in graph.nodes:
        if n.op != "concatenate" or len(n.inputs) <= max_inputs:
            rw.copy(n)
            continue
        vals, axis = [rw[v] for v in n.inputs], n.attrs["axis"]
        while len(vals) > max_inputs:
            chunks = [vals[i:i + max_inputs] for i in range(0, len(vals), max_inputs)]
            vals = [c[0] if len(c) == 1 else
                    rw.emit("concatenate", c, {"axis": axis}, source=n.source) for c in chunks]
        rw.bind(n.output, rw.emit("concatenate", vals, {"axis": axis}, name=n.output.name,
                                  source=n.source))
    return rw.build()


@graph_pass
def layout_transform(graph, to="NHWC", cancel=True):
    """Run convolution and pooling regions in channels-last (NHWC) layout.

    Each ``conv2d``/``max_pool2d``/``avg_pool2d`` becomes its ``*_nhwc`` op, wrapped in a
    transpose NCHW->NHWC of its input (and OIHW->HWIO of a conv weight) and a transpose
    NHWC->NCHW of its output. An elementwise op reading such an output follows into NHWC (its
    4-D operands are transposed, scalars pass as they are) so the region grows across
    ``conv -> relu -> conv``. With ``cancel=True``, :func:`cancel_transposes` then removes each
    back-and-forth pair between two NHWC ops, leaving transposes only at the region's boundary
    (plus weight transposes, which :func:`~.frontend.constant_folding` folds when the weights
    are constants). ``cancel=False`` shows the naive rewrite with every pair still in place.

    Args:
        graph: an NCHW graph.
        to: the target layout; "NHWC" (or "NCHW", which leaves the graph as it is).
        cancel: whether to cancel transpose pairs afterwards.
    """
    if to == "NCHW":
        return cancel_transposes(graph) if cancel else clone(graph)
    if to != "NHWC":
        raise ValueError(f"layout_transform: unknown layout {to!r} (NHWC or NCHW)")
    rw, region = Rewriter(graph), set()
    for n in graph.nodes:
        ins = [rw[v] for v in n.inputs]
        channels_last = nhwc_op(n.op) is not None and len(ins[0].shape) == 4
        if channels_last and ("dilation" in n.attrs or "groups" in n.attrs):
            channels_last = False  # the NHWC kernels have neither: the node stays NCHW
        if channels_last:
            nhwc = [_transpose(rw, ins[0], TO_NHWC, n)]
            if n.op == "conv2d":
                nhwc.append(_transpose(rw, ins[1], OIHW_TO_HWIO, n))
            y = rw.emit(nhwc_op(n.op), nhwc, n.attrs, source=n.source)
        elif _follows_layout(n, ins, region):
            y = rw.emit(n.op, [_transpose(rw, v, TO_NHWC, n) if len(v.shape) == 4 else v
                               for v in ins], n.attrs, source=n.source)
        else:
            rw.copy(n)
            continue
        out = rw.emit("transpose", [y], {"axes": TO_NCHW}, name=n.output.name, source=n.source)
        region.add(id(out))
        rw.bind(n.output, out)
    g = rw.build()
    return cancel_transposes(g) if cancel else g


def _transpose(rw, v, perm, node):
    return rw.emit("transpose", [v], {"axes": perm}, source=node.source)


def _follows_layout(n, ins, region):
    op = get(n.op)
    if not op.elementwise or op.impure or len(n.outputs) != 1 or len(n.output.shape) != 4:
        return False  # an impure op keeps its layout: its draws land where eager puts them
    if not any(id(v) in region for v in ins):
        return False
    return all(len(v.shape) == 4 or (len(v.shape) < 4 and v.nbytes <= v.dtype.itemsize)
               for v in ins)


@graph_pass
def lower_precision(graph, dtype="float16", ops=("matmul", "conv2d")):
    """Run the chosen ops in a lower precision, as on a device with only fp16 kernels.

    Each floating input of a node whose op is in ``ops`` is cast to ``dtype``, the op runs in
    ``dtype``, and its result is cast back to the original dtype, so the rest of the graph is
    unchanged. A cast back to the low dtype of a value that was just widened from it
    (``cast(cast(h, f32), f16)``) reuses ``h``: widening and narrowing back is exact.

    Args:
        graph: the graph to rewrite.
        dtype: the low-precision dtype (default float16).
        ops: names of the ops to lower.
    """
    low = dtypes.as_dtype(dtype, "lower_precision")
    ops = (ops,) if isinstance(ops, str) else tuple(ops)
    rw = Rewriter(graph)
    for n in graph.nodes:
        ins = [rw[v] for v in n.inputs]
        if n.op not in ops or len(n.outputs) != 1 or not any(
                dtypes.is_float(v.dtype) and v.dtype != low for v in ins):
            rw.copy(n)
            continue
        lowered = [_cast(rw, v, low, n) if dtypes.is_float(v.dtype) else v for v in ins]
        y = rw.emit(n.op, lowered, n.attrs, source=n.source)
        if y.dtype != n.output.dtype:
            y = rw.emit("cast", [y], {"dtype": n.output.dtype}, name=n.output.name,
                        source=n.source)
        rw.bind(n.output, y)
    return rw.build()


def _cast(rw, v, dt, node):
    if v.dtype == dt:
        return v
    widened = producer_of(rw, v, "cast")
    if widened is not None and widened.inputs[0].dtype == dt and \
            np.can_cast(dt, v.dtype, casting="safe"):
        return widened.inputs[0]
    return rw.emit("cast", [v], {"dtype": dt}, source=node.source)
