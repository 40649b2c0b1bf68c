"""Backend (hardware-aware) passes, book chapter 7: transpose cancelling, Concat splitting for a
device input limit, NCHW -> NHWC layout transformation, precision lowering, fusing a matmul
or convolution with its bias and activation, and folding ``c +- s * (a @ b)`` into one GEMM.
Elementwise fusion lives in :mod:`.fusion`.
"""

import numpy as np

from .. import dtypes
from ..registry import REGISTRY, get
from . import backend_ops  # noqa: F401  (registers the ops these passes emit)
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
        if nhwc_op(n.op) is not None and len(ins[0].shape) == 4:
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


@graph_pass
def fuse_matmul_bias_act(graph):
    """Fuse ``relu(matmul(a, w) + b)`` into one ``fused_linear`` node and
    ``relu(conv2d(x, w) + b)`` into one ``fused_conv`` node (the relu is optional).

    What it saves: unfused, the matmul writes its result, the add reads it and writes a second
    buffer, the relu reads that and writes a third — three passes over the output and two
    temporaries. Fused, bias and activation are an *epilogue* applied to the fresh result in
    place (one output buffer, no intermediate graph values); in a real backend (cuBLAS/oneDNN
    epilogues) they run while the tile is still in registers, so the output is written once.

    It fires only when the intermediate values have no other reader and are not graph outputs,
    and the add keeps the matmul's shape and dtype (the bias broadcasts into it).
    """
    plan = _linear_patterns(graph)
    rw = Rewriter(graph)
    for n in graph.nodes:
        pattern = plan.get(id(n))
        if pattern is None:
            rw.copy(n)
        elif pattern[-1] is n:
            main, add, act = pattern[0], pattern[1], (pattern[2] if len(pattern) == 3 else None)
            bias = add.inputs[1] if add.inputs[0] is main.output else add.inputs[0]
            attrs = dict(main.attrs, activation="relu" if act is not None else None)
            op = "fused_linear" if main.op == "matmul" else "fused_conv"
            rw.bind(n.output, rw.emit(op, [rw[main.inputs[0]], rw[main.inputs[1]], rw[bias]],
                                      attrs, name=n.output.name, source=n.source))
    return rw.build()


def _sole_user(v, graph_outputs, op):
    users = {id(u): u for u in v.users}
    if id(v) in graph_outputs or len(users) != 1:
        return None
    (u,) = users.values()
    return u if u.op == op else None


def _linear_patterns(graph):
    """id(node) -> (main, add[, relu]) for each node of a fusable pattern."""
    outs = set(map(id, graph.outputs))
    plan = {}
    for main in graph.nodes:
        if main.op not in ("matmul", "conv2d"):
            continue
        add = _sole_user(main.output, outs, "add")
        if add is None or add.inputs[0] is add.inputs[1]:
            continue
        if (add.output.shape, add.output.dtype) != (main.output.shape, main.output.dtype):
            continue
        relu = _sole_user(add.output, outs, "relu")
        pattern = (main, add) if relu is None else (main, add, relu)
        for m in pattern:
            plan[id(m)] = pattern
    return plan


@graph_pass
def fuse_gemm_accumulate(graph):
    """Fold ``c + s * (a @ b)`` (also ``c - a @ b``, ``a @ b * s - c``, ...) into ONE ``gemm``
    node: ``beta * c + alpha * (a @ b)``, the operation BLAS itself provides.

    The SGD update ``w - lr * (x.T @ g)`` of a training step is the case that matters: unfused,
    the weight gradient is written to a temporary, scaled into a second one and subtracted
    from ``w`` in a third pass. As one GEMM with ``alpha = -lr`` and ``beta = 1`` the product
    is accumulated straight into ``w``'s buffer (``gemm`` may overwrite ``c`` when ``c`` dies
    there, or when the caller donates it), and the gradient never exists in memory. A residual
    connection ``h + x @ w`` fits the pattern too, unless :func:`fuse_matmul_bias_act` (earlier
    in the default pipeline) has already taken it as a matmul with a full-size bias.

    The bias update ``b - lr * g.sum(axis=0)`` is the same shape of computation (a column sum
    is ``ones @ g``) and becomes one ``sum_accumulate`` node: the bias gradient is summed and
    applied in one pass.

    It fires when ``a @ b`` is 2-D (for a sum: a 2-D ``x`` summed over axis 0), ``c`` has
    exactly the result's shape and dtype (float), the scale ``s`` is a scalar constant, and the
    product and scaled product have no other reader and are not graph outputs. Rounding
    differs from the unfused graph by a few ulps (BLAS computes ``alpha * acc + beta * c``
    with its own operation order); inf and NaN propagate as unfused. A scale of 0 is left
    alone: BLAS skips the product when ``alpha == 0``, so ``c + 0 * (a @ b)`` would lose the
    NaN that an inf in ``a`` or ``b`` makes.
    """
    plan = _gemm_patterns(graph)
    rw = Rewriter(graph)
    for n in graph.nodes:
        pattern = plan.get(id(n))
        if pattern is None:
            rw.copy(n)
        elif pattern[0] is n:
            _, prod, c, alpha, beta = pattern
            op = "gemm" if prod.op == "matmul" else "sum_accumulate"
            rw.bind(n.output, rw.emit(op, [rw[c], *(rw[v] for v in prod.inputs)],
                                      {"alpha": alpha, "beta": beta}, name=n.output.name,
                                      source=n.source))
    return rw.build()


def _scalar_const(graph, v):
    arr = graph.consts.get(v)
    return float(arr.reshape(())) if arr is not None and arr.size == 1 else None


def _is_product(node):
    """A 2-D matmul, or a 2-D tensor summed over axis 0 (``ones @ x``)."""
    if node.op == "matmul":
        return len(node.output.shape) == 2
    return (node.op == "sum" and len(node.inputs[0].shape) == 2
            and tuple(node.attrs.get("axis") or ()) == (0,) and not node.attrs.get("keepdims"))


def _scaled_product(graph, v, outs):
    """``(product node, scale, inner nodes)`` when ``v`` is a product (see _is_product) or
    ``s * product`` (either order) whose intermediates only feed this pattern; else None."""
    p = v.producer
    if p is None or id(v) in outs or len({id(u) for u in v.users}) != 1:
        return None
    if _is_product(p):
        return p, 1.0, (p,)
    if p.op != "mul" or len(p.inputs) != 2:
        return None
    for k in (0, 1):
        s, m = _scalar_const(graph, p.inputs[k]), p.inputs[1 - k]
        if s is None or s == 0 or m is p.inputs[k] or m.producer is None:
            continue  # s == 0: BLAS skips the product when alpha == 0 (NaN would be lost)
        if not _is_product(m.producer):
            continue
        if id(m) in outs or len({id(u) for u in m.users}) != 1 or m.aval != v.aval:
            continue
        return m.producer, s, (m.producer, p)
    return None


def _gemm_patterns(graph):
    """id(node) -> (add/sub node, product node, c, alpha, beta) for every node of a pattern."""
    outs = set(map(id, graph.outputs))
    plan = {}
    for n in graph.nodes:
        if n.op not in ("add", "sub") or len(n.inputs) != 2 or len(n.outputs) != 1:
            continue
        for k in (1, 0):  # prefer c on the left: c - s * (a @ b)
            found = _scaled_product(graph, n.inputs[k], outs)
            c = n.inputs[1 - k]
            if found is None or c is n.inputs[k]:
                continue
            mm, s, inner = found
            if (c.aval != n.output.aval or mm.output.aval != n.output.aval
                    or not dtypes.is_float(c.dtype) or any(id(m) in plan for m in inner)):
                continue
            if n.op == "add":
                alpha, beta = s, 1.0
            else:  # sub: c - s*ab (k == 1) or s*ab - c (k == 0)
                alpha, beta = (-s, 1.0) if k == 1 else (s, -1.0)
            pattern = (n, mm, c, alpha, beta)
            for m in (n, *inner):
                plan[id(m)] = pattern
            break
    return plan
