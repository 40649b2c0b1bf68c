"""What every pass is built from: a :class:`Rewriter` that builds a *new* graph from an old one,
and :class:`Pass`, a named ``Graph -> Graph`` function with options.

Passes never mutate their input. A Rewriter copies every value it meets (same names, shapes and
dtypes) and keeps a substitution map ``old value -> new value``; a pass walks the old nodes in
order and, for each, either copies it (``rw.copy(node)``), or emits new nodes (``rw.emit``) and
binds the old output to their result (``rw.bind``). Constant arrays are shared between the two
graphs and treated as immutable.
"""

import inspect

import numpy as np

from ..graph import Graph, Node, Value, name_generator
from ..registry import get


class Rewriter:
    """Builds a new graph from ``graph``, copying values and nodes (never sharing them).

    Attributes:
        graph: the graph being rewritten (read only).
        inputs: the new graph's input values (copies of the old ones).
        consts: the new graph's constants, new value -> array.
        nodes: the new graph's nodes, in order.
        producer: id(new value) -> the new node that defines it.
    """

    def __init__(self, graph):
        self.graph = graph
        self._env = {}
        self.inputs = [self._copy_value(v) for v in graph.inputs]
        self.consts = {self._copy_value(v): arr for v, arr in graph.consts.items()}
        self.nodes = []
        self.producer = {}
        self._maybe_dead = {}
        used = {v.name for v in graph.values()}
        self._names = (n for n in name_generator() if n not in used)

    def _copy_value(self, v):
        new = Value(v.name, v.shape, v.dtype)
        self._env[id(v)] = new
        return new

    def __getitem__(self, old):
        """The new value standing for the old value ``old``."""
        return self._env[id(old)]

    def bind(self, old, new):
        """From now on, the old value ``old`` is computed by the new value ``new``."""
        self._env[id(old)] = new

    def is_const(self, value):
        """Whether the new value ``value`` is a constant of the new graph."""
        return value in self.consts

    def const(self, array, name=None):
        """Add a constant holding ``array``; returns its new value."""
        array = np.asarray(array)
        v = Value(name or next(self._names), array.shape, array.dtype)
        self.consts[v] = array
        return v

    def emit(self, op, inputs, attrs=None, name=None, source=""):
        """Append a node ``op[attrs](*inputs)`` (new values); its type comes from the op's rule."""
        attrs = dict(attrs or {})
        aval = get(op).infer(*[v.aval for v in inputs], **attrs)
        out = Value(name or next(self._names), aval.shape, aval.dtype)
        self._append(Node(op, inputs, attrs, [out], source))
        return out

    def copy(self, node):
        """Append a copy of the old ``node`` reading the new values of its inputs."""
        outs = [self._copy_value(o) for o in node.outputs]
        self._append(Node(node.op, [self[v] for v in node.inputs], node.attrs, outs,
                          node.source))
        return outs[0]

    def drop(self, node):
        """Note that the old ``node`` is not copied: the values it read may now be dead."""
        for v in node.inputs:
            self.maybe_dead(self[v])

    def maybe_dead(self, value):
        """Remove the new ``value`` (node or constant) at build time if nothing reads it."""
        self._maybe_dead[id(value)] = value

    def _append(self, node):
        self.nodes.append(node)
        for o in node.outputs:
            self.producer[id(o)] = node

    def build(self, prune=False):
        """The new graph. Values passed to :meth:`maybe_dead` (and, transitively, what only they
        read) are removed when unused; ``prune=True`` removes every unused node and constant."""
        outputs = [self[v] for v in self.graph.outputs]
        nodes, consts = self.nodes, self.consts
        if prune or self._maybe_dead:
            nodes, consts = _prune(nodes, consts, outputs, None if prune else self._maybe_dead)
        g = self.graph
        return Graph(self.inputs, nodes, outputs, consts, g.out_tree, g.in_tree, g.name)


def _prune(nodes, consts, outputs, candidates):
    """Drop unused nodes/constants (all of them, or only those in ``candidates`` and what only
    they read), walking backwards so a dropped node's inputs can become unused in turn. A node
    of an impure op (``Op.impure``) is never dropped: it consumes randomness."""
    readers = {}
    for n in nodes:
        for v in n.inputs:
            readers[id(v)] = readers.get(id(v), 0) + 1
    for v in outputs:
        readers[id(v)] = readers.get(id(v), 0) + 1
    cand = None if candidates is None else set(candidates)
    keep = []
    for n in reversed(nodes):
        dead = all(readers.get(id(o), 0) == 0 for o in n.outputs) and not get(n.op).impure
        if dead and (cand is None or any(id(o) in cand for o in n.outputs)):
            for v in n.inputs:
                readers[id(v)] -= 1
                if cand is not None:
                    cand.add(id(v))
            continue
        keep.append(n)
    kept_consts = {v: a for v, a in consts.items()
                   if readers.get(id(v), 0) > 0 or (cand is not None and id(v) not in cand)}
    return keep[::-1], kept_consts


def clone(graph):
    """A deep copy of ``graph``'s structure (new values and nodes; constant arrays shared):
    :meth:`Graph.copy <mlsys_lab.engine.graph.Graph.copy>`, the identity pass."""
    return graph.copy()


def producer_of(rw, value, op):
    """The new node of kind ``op`` that defines the new ``value``, or None."""
    p = rw.producer.get(id(value))
    return p if p is not None and p.op == op else None


class Pass:
    """A named graph transformation ``Graph -> Graph`` with options.

    Call it with a graph to run it: ``split_concat(g)`` or ``split_concat(g, 63)``. Call it with
    options only to get a configured pass for a pipeline: ``split_concat(max_inputs=63)``, whose
    ``name`` records the options (``"split_concat(max_inputs=63)"``).

    Attributes:
        fn: ``fn(graph, **options) -> Graph``; must not mutate ``graph``.
        options: the bound options.
    """

    def __init__(self, fn, name=None, options=None):
        self.fn = fn
        self.base_name = name or fn.__name__
        self.options = dict(options or {})
        self.__doc__ = fn.__doc__
        self.__name__ = self.base_name

    @property
    def name(self):
        if not self.options:
            return self.base_name
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"{self.base_name}({opts})"

    def __call__(self, *args, **kwargs):
        if args and isinstance(args[0], Graph):
            return self.fn(args[0], **{**self.options, **self._bind(args[1:], kwargs)})
        return Pass(self.fn, self.base_name, {**self.options, **self._bind(args, kwargs)})

    def _bind(self, args, kwargs):
        params = list(inspect.signature(self.fn).parameters)[1:]
        if len(args) > len(params):
            raise TypeError(f"{self.base_name}: takes at most {len(params)} options "
                            f"({', '.join(params)}), got {len(args)}")
        opts = dict(zip(params, args, strict=False))
        for k, v in kwargs.items():
            if k not in params:
                raise TypeError(f"{self.base_name}: unknown option {k!r} "
                                f"(options: {', '.join(params) or 'none'})")
            opts[k] = v
        return opts

    def __repr__(self):
        return f"<Pass {self.name}>"


def graph_pass(fn):
    """Decorator: make ``fn(graph, **options)`` a :class:`Pass` named after it."""
    return Pass(fn)
