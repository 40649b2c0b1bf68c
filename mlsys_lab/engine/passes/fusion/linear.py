"""Fusing a matmul or convolution with what follows it (book ch. 7): ``act(a @ w + b)`` becomes
one ``fused_linear`` (or ``fused_conv``) node, and ``c +- s * (a @ b)`` (a weight update) one
``gemm`` node, BLAS's own operation, that may write over ``c``.
"""

from ... import dtypes
from ..rewrite import Rewriter, graph_pass
from . import ops  # noqa: F401  (registers the ops these passes emit)


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
        if add is None or add.inputs[0] is add.inputs[1] or id(add) in plan:
            continue  # (two matmuls feeding one add: the first claims it)
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
