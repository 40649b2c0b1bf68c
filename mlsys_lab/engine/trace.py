"""Tracing: run a Python function on tracer tensors and record every op into a Graph.

Python control flow runs at trace time: a loop is unrolled into fresh nodes, and a Python ``if``
on a traced value raises a TraceError pointing to :func:`cond`, which records both branches.
"""

import numpy as np

from ..errors import DTypeError, ShapeError, TraceError
from .graph import Graph, Node, Value, name_generator
from .pytree import flatten, unflatten
from .registry import AVal
from .source import user_source_line
from .tensor import MODE, Tensor, as_tensor


class GraphBuilder:
    """Collects values and nodes while a function is traced."""

    def __init__(self, name="graph"):
        self.name = name
        self.names = name_generator()
        self.inputs, self.nodes, self.consts = [], [], {}
        self._const_of = {}  # id(array) -> Value; self.consts keeps the arrays (and ids) alive

    def new_value(self, shape, dtype):
        return Value(next(self.names), shape, dtype)

    def add_input(self, shape, dtype):
        v = self.new_value(shape, dtype)
        self.inputs.append(v)
        return self.tracer(v)

    def tracer(self, value):
        t = Tensor._wrap(None)
        t._value, t._builder = value, self
        return t

    def value_of(self, t):
        """The graph value standing for ``t`` (a captured concrete tensor becomes a constant)."""
        if t._builder is self:
            return t._value
        if t._builder is not None:
            raise TraceError(
                f"value {t._value.name} {t.shape} belongs to another trace (an enclosing "
                f"function or an earlier trace); pass it in as an argument/operand instead"
                f"\n  at {user_source_line()}")
        arr = t.data
        v = self._const_of.get(id(arr))
        if v is None:
            v = Value(f"c{len(self.consts)}" if arr.ndim else "lit", arr.shape, arr.dtype)
            self.consts[v] = arr
            self._const_of[id(arr)] = v
        return v

    def emit(self, op, ts, attrs):
        if not MODE.builders or MODE.builders[-1] is not self:
            raise TraceError(f"{op.name}: a traced value is used after its trace ended (or "
                             f"inside another trace)\n  at {user_source_line()}")
        ins = [self.value_of(t) for t in ts]
        src = user_source_line()
        try:
            aval = op.infer(*[v.aval for v in ins], **attrs)
        except (ShapeError, DTypeError) as e:
            raise type(e)(f"{e}\n  at {src}") from None
        out = self.new_value(aval.shape, aval.dtype)
        node = Node(op.name, ins, attrs, [out], src, id=len(self.nodes))
        out.producer = node
        self.nodes.append(node)
        return self.tracer(out)

    def build(self, outputs, out_tree="auto", in_tree=None):
        outs = [self.value_of(as_tensor(o)) for o in outputs]
        for v in outs:  # an output that is a constant still has to be named
            if v.name == "lit":
                v.name = next(self.names)
        return Graph(self.inputs, self.nodes, outs, self.consts, out_tree, in_tree, self.name)

    def __enter__(self):
        MODE.builders.append(self)
        return self

    def __exit__(self, *exc):
        MODE.builders.pop()


def _leaf_aval(x):
    if isinstance(x, (Tensor, AVal)):
        return x.shape, x.dtype
    if isinstance(x, (bool, int, float, np.ndarray, np.generic, list)):
        t = as_tensor(x)
        return t.shape, t.dtype
    raise TraceError(f"trace: cannot trace an argument of type {type(x).__name__}; pass arrays, "
                     f"Tensors, numbers, or tuples/lists/dicts of them")


def static_positions(static_argnums, n_args=None):
    """``static_argnums`` (an int or an iterable of ints) as a set of positions; with
    ``n_args``, negative positions count from the end and each must name an argument."""
    nums = [static_argnums] if isinstance(static_argnums, (int, np.integer)) else \
        list(static_argnums)
    if not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in nums):
        raise TraceError(f"static_argnums must be ints, got {static_argnums!r}")
    if n_args is None:
        return {int(i) for i in nums}
    bad = [int(i) for i in nums if not -n_args <= i < n_args]
    if bad:
        raise TraceError(f"static_argnums {bad} out of range for a call with {n_args} "
                         f"arguments")
    return {int(i) % n_args for i in nums}


def static_key(args, positions):
    """The hashable key of the static arguments at ``positions`` of ``args`` (each value with
    its type, so ``2`` and ``2.0`` or ``1`` and ``True`` are traced apart): what a cache of
    compiled specialisations is keyed by, as in ``jax.jit``.

    Raises:
        TraceError: a static argument is not hashable (a list or an array, say).
    """
    key = []
    for i in sorted(positions):
        v = args[i]
        try:
            hash(v)
        except TypeError:
            raise TraceError(f"static argument {i} must be hashable: compiled versions are "
                             f"cached by their static values, got a {type(v).__name__} "
                             f"({v!r:.60}); pass a tuple instead of a list, or make it a "
                             f"traced argument") from None
        key.append((i, type(v), v))
    return tuple(key)


def trace(f, *example_args, name=None, static_argnums=()):
    """Trace ``f`` on tracers shaped like ``example_args`` and return its :class:`Graph`.

    Args:
        f: a Python function of tensors (may close over model parameters, which become constants).
        example_args: arrays/Tensors/numbers (or tuples/lists/dicts of them) giving input types;
            only their shapes and dtypes are used.
        name: display name of the graph (default: ``f.__name__``).
        static_argnums: positions passed to ``f`` unchanged (Python values baked into the graph).
    """
    static = static_positions(static_argnums, len(example_args))
    name = name or getattr(f, "__name__", "graph")
    builder = GraphBuilder(name)
    traced = [a for i, a in enumerate(example_args) if i not in static]
    flat, in_tree = flatten(traced)
    with builder:
        tracers = [builder.add_input(*_leaf_aval(x)) for x in flat]
        it = iter(unflatten(in_tree, tracers))
        call_args = [a if i in static else next(it) for i, a in enumerate(example_args)]
        out = f(*call_args)
        out_flat, out_tree = flatten(out)
        for o in out_flat:
            if not isinstance(o, (Tensor, int, float, np.ndarray, np.generic)):
                raise TraceError(f"trace: {name} returned a {type(o).__name__}; a traced "
                                 f"function must return tensors (or tuples/lists/dicts of them)")
        graph = builder.build(out_flat, out_tree, in_tree)
    return graph


def trace_branch(fn, avals, name):
    """Trace a branch function of ``len(avals)`` operands into a closed single-output Graph."""
    builder = GraphBuilder(name)
    with builder:
        tracers = [builder.add_input(a.shape, a.dtype) for a in avals]
        out = fn(*tracers)
        if not isinstance(out, (Tensor, int, float, np.ndarray)):
            raise TraceError(f"cond: branch {name} must return a single tensor, "
                             f"got {type(out).__name__}")
        return builder.build([out])
