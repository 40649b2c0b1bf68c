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
def constant_folding(graph, max_bytes=MAX_CONST_BYTES, skip=()):
    """Evaluate, at compile time, every node whose inputs are all constants.

    The node's op ``compute`` kernel runs once and its output becomes a new constant; folding
    repeats along chains (``x + 2 * 3`` -> ``x + 6``). Constants only the folded nodes read are
    removed. A node of an impure op (``Op.impure``: it draws fresh randomness on every run)
    is never folded, not even one with no inputs at all.

    Args:
        graph: the graph to optimise.
        max_bytes: a node whose output would exceed this many bytes is left alone: folding a
            ``broadcast_to`` of a scalar, say, would trade a cheap op for a big array baked into
            the graph (default 1 MiB).
        skip: names of further ops never to fold.

    Returns:
        The folded graph.
    """
    rw = Rewriter(graph)
    for n in graph.nodes:
        ins = [rw[v] for v in n.inputs]
        folded = None
        if (n.op not in skip and not get(n.op).impure and ins
                and all(rw.is_const(v) for v in ins)
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

    Graph inputs are kept (they are the function's signature). Nodes of impure ops
    (``Op.impure``) are kept too, even unread: each draws from the random stream, so removing
    one would change what the later ones draw. Every other op is free of side effects, so
    "not needed by an output" is the whole test for it.
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
    the earlier one's. Attrs are compared by value (see :func:`attr_key`: an index array is
    compared element by element, never through its truncated ``repr``). Nodes of impure ops
    (``Op.impure``) are never merged: two draws of fresh randomness are two different values.
    """
    rw = Rewriter(graph)
    _merge_equal_consts(rw, graph, max_bytes)
    seen = {}
    for n in graph.nodes:
        if get(n.op).impure:
            rw.copy(n)
            continue
        key = (n.op, tuple(id(rw[v]) for v in n.inputs), attr_key(n.attrs))
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


def attr_key(v):
    """A hashable key equal for two attr values exactly when they are equal as values.

    Containers (tuple, list, dict, slice) are compared element by element, numpy arrays and
    scalars by dtype, shape and bytes, floats by ``repr`` (so ``0.0`` and ``-0.0`` differ and
    ``nan`` equals ``nan``), and every key carries its type (``True`` is not ``1``: they index
    differently). A sub-graph (``cond``) or any other unhashable object is compared by
    identity.
    """
    if isinstance(v, Graph):
        return ("graph", id(v))
    if isinstance(v, np.ndarray):
        return ("ndarray", v.dtype.str, v.shape, np.ascontiguousarray(v).tobytes())
    if isinstance(v, np.generic):
        return ("npscalar", v.dtype.str, v.tobytes())
    if isinstance(v, np.dtype):
        return ("dtype", v.str)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, *map(attr_key, v))
    if isinstance(v, dict):
        return ("dict", *sorted((repr(k), attr_key(x)) for k, x in v.items()))
    if isinstance(v, slice):
        return ("slice", attr_key(v.start), attr_key(v.stop), attr_key(v.step))
    if isinstance(v, float):
        return ("float", repr(v))
    try:
        hash(v)
    except TypeError:
        return ("id", id(v))
    return (type(v).__qualname__, v)


@graph_pass
def algebraic_simplification(graph, assume_finite=False):
    """Apply algebraic identities that are exact in IEEE arithmetic: the rewritten graph gives
    the same bits as the original for every input, ±0, ±inf and NaN included.

    Rules (``c1``: a constant whose every element is 1; ``+0``/``-0``: one whose every element
    is a zero of that sign; for integer and bool results a zero has no sign):

    * ``x * c1``, ``c1 * x``, ``x / c1``, ``x ** c1`` -> ``x``: IEEE multiplication and
      division by 1 and ``pow(x, 1)`` return x itself (-0, inf and NaN included).
    * ``x + (-0)``, ``(-0) + x`` -> ``x``: ``x + -0 == x`` for every x, ``+0 + -0 == +0``
      included. NOT ``x + (+0)``: ``-0 + +0`` is ``+0``, so that rewrite would flip the sign
      of a negative zero (only applied to integers).
    * ``x - (+0)`` -> ``x``: ``x - +0 == x + -0``. NOT ``x - (-0)`` (``-0 - -0 == +0``).
    * ``(-0) - x`` -> ``neg(x)``: ``-0 - x == -0 + (-x) == -x`` for every x. NOT
      ``(+0) - x``: ``0 - 0 == +0`` but ``neg(0) == -0`` (``1 / (0 - x)`` at x = 0 would turn
      +inf into -inf); only applied to integers, where it is two's-complement negation.
    * ``neg(neg(x))`` -> ``x``: negation only flips the sign bit.
    * ``x ** c0`` (either zero) -> ones: IEEE ``pow(x, ±0) == 1`` for every x, NaN included.
    * ``x * c0``, ``c0 * x`` -> zeros, for integer/bool results only. For floats ``inf * 0`` and
      ``nan * 0`` are NaN and ``-3 * 0`` is ``-0``: ``assume_finite=True`` applies it anyway
      (a fast-math assumption: no inf/NaN, the sign of zero does not matter), NOT exact.
    * ``identity(x)``, ``cast(x, x.dtype)``, ``reshape(x, x.shape)``, ``transpose(x, (0, 1, ..))``
      -> ``x``: they move no bits.

    A rule that returns ``x`` fires only when the node's output has exactly x's shape and dtype,
    so a constant that broadcasts ``x`` to a bigger shape (``x + zeros((4, 3))`` with x of shape
    (3,)) or promotes its dtype (``int_x + 0.0``) is left alone. Rules that create zeros/ones
    create a constant of the output's shape, and only up to ``MAX_CONST_BYTES``. Nodes of
    impure ops are never rewritten.
    """
    rw = Rewriter(graph)
    for n in graph.nodes:
        ins = [rw[v] for v in n.inputs]
        new = None
        if len(n.outputs) == 1 and not get(n.op).impure:
            new = _simplify(rw, n, ins, assume_finite)
        if new is None:
            rw.copy(n)
        else:
            rw.drop(n)
            rw.bind(n.output, new)
    return rw.build()


def _is(rw, v, c):
    return rw.is_const(v) and rw.consts[v].size > 0 and bool(np.all(rw.consts[v] == c))


def _is_zero(rw, v, negative, out_dtype):
    """Whether ``v`` is a constant of zeros of the given sign (any zero for an integer or bool
    result, whose zero has no sign)."""
    if not _is(rw, v, 0):
        return False
    if out_dtype.kind in "biu":
        return True
    return bool(np.all(np.signbit(rw.consts[v]) == negative))


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
        if _is_zero(rw, b, True, out.dtype) and same(a) is not None:
            return a
        return same(b) if _is_zero(rw, a, True, out.dtype) else None
    if op == "sub":
        if _is_zero(rw, b, False, out.dtype):
            return same(a)
        if _is_zero(rw, a, True, out.dtype) and same(b) is not None:
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
