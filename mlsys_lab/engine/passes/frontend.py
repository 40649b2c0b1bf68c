"""Frontend (machine-independent) passes, book chapter 6: constant folding, dead code
elimination, common subexpression elimination and algebraic simplification.

Each is a :class:`~.rewrite.Pass`: ``new_graph = constant_folding(graph)``; the input graph is
never modified.
"""

import numpy as np

from ...errors import MLSysError
from ..graph import Graph
from ..registry import get
from ..tensor import run_kernel
from .rewrite import Rewriter, graph_pass, producer_of

#: Constants larger than this are neither created by folding nor compared by CSE (bytes).
MAX_CONST_BYTES = 1 << 20


@graph_pass
def constant_folding(graph, max_bytes=MAX_CONST_BYTES, skip=("dropout",)):
    """Evaluate, at compile time, every node whose inputs are all constants.

    The node's op ``compute`` kernel runs once and its output becomes a new constant; folding
    repeats along chains (``x + 2 * 3`` -> ``x + 6``). Constants only the folded nodes read are
    removed.

    Args:
        graph: the graph to optimise.
        max_bytes: a node whose output would exceed this many bytes is left alone: folding a
            ``broadcast_to`` of a scalar, say, would trade a cheap op for a big array baked into
            the graph (default 1 MiB).
        skip: ops never folded; ``dropout`` by default, because it stands for fresh randomness
            at training time, not for a fixed array.

    Returns:
        The folded graph.
    """
    rw = Rewriter(graph)
    for n in graph.nodes:
        ins = [rw[v] for v in n.inputs]
        folded = None
        if (n.op not in skip and ins and all(rw.is_const(v) for v in ins)
                and sum(o.nbytes for o in n.outputs) <= max_bytes and len(n.outputs) == 1):
            folded = _evaluate(n, [rw.consts[v] for v in ins])
        if folded is None:
            rw.copy(n)
            continue
        rw.drop(n)
        rw.bind(n.output, rw.const(folded, name=n.output.name))
    return rw.build()


def _evaluate(node, arrays):
    """The node's output as a fresh contiguous array, or None when its kernel refuses."""
    try:
        with np.errstate(all="ignore"):
            out = run_kernel(get(node.op), arrays, node.attrs)
    except MLSysError:
        return None  # leave the error to run time, where it names the node
    return np.array(out, copy=True, order="C")


@graph_pass
def dead_code_elimination(graph):
    """Remove nodes whose outputs no graph output needs, and constants no node reads.

    Graph inputs are kept (they are the function's signature). mlsys_lab ops have no side
    effects, so "not needed by an output" is the whole test.
    """
    rw = Rewriter(graph)
    for n in graph.nodes:
        rw.copy(n)
    return rw.build(prune=True)


@graph_pass
def common_subexpression_elimination(graph, max_bytes=MAX_CONST_BYTES):
    """Compute each distinct expression once.

    First, equal constants (same dtype, shape and bytes, up to ``max_bytes``) become one, so the
    two literals ``5`` in ``a*5 + a*5*b`` are the same value. Then a node with the same op, the
    same input values and equal attrs as an earlier node is dropped and its output replaced by
    the earlier one's. Attrs are compared by ``repr`` (slices and lists are not hashable); a
    sub-graph attr (``cond``) is compared by identity.
    """
    rw = Rewriter(graph)
    _merge_equal_consts(rw, graph, max_bytes)
    seen = {}
    for n in graph.nodes:
        key = (n.op, tuple(id(rw[v]) for v in n.inputs), _attrs_key(n.attrs))
        first = seen.get(key)
        if first is None:
            rw.copy(n)
            seen[key] = [rw[o] for o in n.outputs]
            continue
        for old, new in zip(n.outputs, first, strict=True):
            rw.bind(old, new)
        rw.drop(n)
    return rw.build()


def _merge_equal_consts(rw, graph, max_bytes):
    seen = {}
    for old, arr in graph.consts.items():
        if arr.nbytes > max_bytes:
            continue
        key = (arr.dtype.str, arr.shape, np.ascontiguousarray(arr).tobytes())
        if key in seen:
            dup = rw[old]
            rw.bind(old, seen[key])
            del rw.consts[dup]
        else:
            seen[key] = rw[old]


def _attrs_key(attrs):
    def one(v):
        if isinstance(v, Graph):
            return ("graph", id(v))
        if isinstance(v, np.ndarray):
            return ("array", v.dtype.str, v.shape, v.tobytes())
        return repr(v)
    return tuple(sorted((k, one(v)) for k, v in attrs.items()))


@graph_pass
def algebraic_simplification(graph, assume_finite=False):
    """Apply algebraic identities where they are exact.

    Rules (``c0``/``c1`` are constants whose every element is 0/1):

    * ``x * c1``, ``c1 * x``, ``x / c1``, ``x ** c1``, ``x + c0``, ``c0 + x``, ``x - c0`` -> ``x``
    * ``c0 - x`` -> ``neg(x)``;  ``neg(neg(x))`` -> ``x``
    * ``x ** c0`` -> ones (IEEE: ``pow(x, 0) == 1`` even for NaN and inf)
    * ``x * c0``, ``c0 * x`` -> zeros, for integer/bool x only: for floats ``inf * 0`` and
      ``nan * 0`` are NaN, so this needs ``assume_finite=True`` (a fast-math assumption)
    * ``identity(x)``, ``cast(x, x.dtype)``, ``reshape(x, x.shape)``, ``transpose(x, (0, 1, ..))``
      -> ``x``

    A rule that returns ``x`` fires only when the node's output has exactly x's shape and dtype,
    so a constant that broadcasts ``x`` to a bigger shape (``x + zeros((4, 3))`` with x of shape
    (3,)) or promotes its dtype (``int_x + 0.0``) is left alone. Rules that create zeros/ones
    create a constant of the output's shape, and only up to ``MAX_CONST_BYTES``. ``x + 0`` turns
    ``-0.0`` into itself rather than ``+0.0``, the one (harmless) bit that may differ.
    """
    rw = Rewriter(graph)
    for n in graph.nodes:
        ins = [rw[v] for v in n.inputs]
        new = _simplify(rw, n, ins, assume_finite) if len(n.outputs) == 1 else None
        if new is None:
            rw.copy(n)
        else:
            rw.drop(n)
            rw.bind(n.output, new)
    return rw.build()


def _is(rw, v, c):
    return rw.is_const(v) and rw.consts[v].size > 0 and bool(np.all(rw.consts[v] == c))


def _simplify(rw, n, ins, assume_finite):
    out = n.output

    def same(x):
        return x if (x.shape, x.dtype) == (out.shape, out.dtype) else None

    def filled(value):
        if out.nbytes > MAX_CONST_BYTES:
            return None
        return rw.const(np.full(out.shape, value, out.dtype))

    op = n.op
    if op in ("identity", "cast", "reshape"):
        return same(ins[0])
    if op == "transpose" and tuple(n.attrs["axes"]) == tuple(range(len(out.shape))):
        return same(ins[0])
    if op == "neg":
        inner = producer_of(rw, ins[0], "neg")
        return same(inner.inputs[0]) if inner is not None else None
    if len(ins) != 2:
        return None
    a, b = ins
    if op == "add":
        return (same(a) if _is(rw, b, 0) else None) or (same(b) if _is(rw, a, 0) else None)
    if op == "sub":
        if _is(rw, b, 0):
            return same(a)
        if _is(rw, a, 0) and same(b) is not None:
            return rw.emit("neg", [b], name=out.name, source=n.source)
        return None
    if op == "mul":
        one = (same(a) if _is(rw, b, 1) else None) or (same(b) if _is(rw, a, 1) else None)
        if one is not None:
            return one
        exact = assume_finite or out.dtype.kind in "biu"
        if exact and (_is(rw, a, 0) or _is(rw, b, 0)):
            return filled(0)
        return None
    if op in ("div", "pow") and _is(rw, b, 1):
        return same(a)
    if op == "pow" and _is(rw, b, 0):
        return filled(1)
    return None


#: Short aliases used in pipelines and notebooks.
cse = common_subexpression_elimination
dce = dead_code_elimination
