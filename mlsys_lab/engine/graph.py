"""The Graph IR: a flat SSA list of nodes over typed values (like a jaxpr or a torch.fx graph).

A :class:`Graph` has input values, constant values (weights and literals captured while tracing),
nodes in a valid topological order, and output values. Each value is defined exactly once; each
node records the op name, its attrs and the user's source line that created it.
"""

import itertools
import math

import numpy as np

from ..errors import CycleError, GraphError, MLSysError
from . import dtypes
from .interpreter import TensorInterpreter, check_input  # noqa: F401 - check_input: public here
from .registry import AVal, get
from .source import user_source_line  # noqa: F401 - re-exported: trace and tests use it here

# The engine draws nothing itself: mlsys_lab.viz registers how a graph becomes SVG (Jupyter's
# rich display), so the engine never imports viz.
_SVG_RENDERER: list = []


def set_svg_renderer(render) -> None:
    """Use ``render(dot_source) -> svg_text | None`` for ``Graph._repr_svg_``."""
    _SVG_RENDERER[:] = [render]


class Value:
    """A typed SSA value: ``name:f32[2,3]``. ``producer`` is the node defining it (None for
    inputs and constants); ``users`` the nodes reading it."""

    __slots__ = ("name", "shape", "dtype", "producer", "users")

    def __init__(self, name, shape, dtype):
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.producer = None
        self.users = []

    @property
    def aval(self):
        return AVal(self.shape, self.dtype)

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.dtype.itemsize  # Python ints: never wraps

    def type_str(self):
        return f"{dtypes.short(self.dtype)}[{','.join(map(str, self.shape))}]"

    def __repr__(self):
        return f"{self.name}:{self.type_str()}"


class Node:
    """One op application: ``outputs = op[attrs](*inputs)``, created at ``source``."""

    __slots__ = ("op", "inputs", "attrs", "outputs", "source", "id", "meta")

    def __init__(self, op, inputs, attrs, outputs, source="", id=None, meta=None):
        self.op = op
        self.inputs = list(inputs)
        self.attrs = dict(attrs)
        self.outputs = list(outputs)
        self.source = source
        self.id = id
        self.meta = dict(meta or {})  # annotations of later stages (device, kernel, ...)

    @property
    def output(self):
        return self.outputs[0]

    def __repr__(self):
        outs = " ".join(map(repr, self.outputs))
        return f"{outs} = {self.op}{_attr_str(self.attrs)} {' '.join(v.name for v in self.inputs)}"


def name_generator():
    """a, b, ..., z, ba, bb, ... (the naming jaxprs use)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for n in itertools.count(1):
        for combo in itertools.product(letters, repeat=n):
            if n > 1 and combo[0] == "a":
                continue
            yield "".join(combo)


class Graph:
    """A traced program.

    Attributes:
        inputs: input values, in call order (flattened).
        consts: dict value -> numpy array (captured tensors and literals).
        nodes: nodes in a topological order.
        outputs: output values (flattened).
        out_tree: how to rebuild the Python structure of the outputs.
        in_tree: the Python structure of the inputs.
        name: a display name.
    """

    def __init__(self, inputs, nodes, outputs, consts=None, out_tree="auto", in_tree=None,
                 name="graph"):
        self.inputs = list(inputs)
        self.nodes = list(nodes)
        self.outputs = list(outputs)
        self.consts = dict(consts or {})
        self.out_tree = out_tree
        self.in_tree = in_tree
        self.name = name
        self.relink()

    # --- structure ------------------------------------------------------------------------
    def copy(self, name=None):
        """A deep structural copy: fresh Values and Nodes (constant arrays are shared), so a
        pass can rewrite it without touching this graph. A Value belongs to one Graph: building
        a Graph links its values (``producer``/``users``) to it."""
        new = {}

        def cp(v):
            if id(v) not in new:
                new[id(v)] = Value(v.name, v.shape, v.dtype)
            return new[id(v)]

        nodes = [Node(n.op, [cp(v) for v in n.inputs], n.attrs, [cp(o) for o in n.outputs],
                      n.source, meta=n.meta) for n in self.nodes]
        return Graph([cp(v) for v in self.inputs], nodes, [cp(v) for v in self.outputs],
                     {cp(v): a for v, a in self.consts.items()}, self.out_tree, self.in_tree,
                     name or self.name)

    def relink(self):
        """Recompute producer/users links and node ids from the node list."""
        for v in self.values():
            v.users = []
            v.producer = None
        for i, n in enumerate(self.nodes):
            n.id = i
            for o in n.outputs:
                o.producer = n
            for v in n.inputs:
                v.users.append(n)
        return self

    def values(self):
        """Every value: inputs, constants, then node outputs in order."""
        seen = {}
        for v in itertools.chain(self.inputs, self.consts):
            seen[id(v)] = v
        for n in self.nodes:
            for v in itertools.chain(n.inputs, n.outputs):
                seen.setdefault(id(v), v)
        for v in self.outputs:
            seen.setdefault(id(v), v)
        return list(seen.values())

    def node(self, key):
        """Look a node up by id, by the name of one of its outputs, or pass a Node through."""
        if isinstance(key, Node):
            return key
        if isinstance(key, Value):
            if key.producer is None:
                raise GraphError(f"value {key.name} is an input or constant, not a node output")
            return key.producer
        for n in self.nodes:
            if n.id == key or any(o.name == key for o in n.outputs):
                return n
        raise GraphError(f"no node {key!r} in graph {self.name}")

    def users(self, value):
        """The nodes that read ``value`` (a copy of ``value.users``)."""
        return list(value.users)

    # --- printing ---------------------------------------------------------------------------
    def __str__(self):
        return self.pretty()

    def __repr__(self):
        return (f"<Graph {self.name}: {len(self.inputs)} inputs, {len(self.nodes)} nodes, "
                f"{len(self.outputs)} outputs>")

    def pretty(self, indent=0, sources=False):
        """Readable text in the style of a jaxpr:
        ``{ lambda consts ; inputs. let ... in (outs) }``."""
        pad = " " * indent
        big = [v for v in self.consts if not _is_literal(self.consts[v])]
        head = " ".join(map(repr, big))
        ins = " ".join(map(repr, self.inputs))
        lines = [f"{pad}{{ lambda {head}{' ' if head else ''}; {ins}. let"]
        for n in self.nodes:
            args = " ".join(self._arg_str(v) for v in n.inputs)
            outs = " ".join(map(repr, n.outputs))
            line = f"{pad}    {outs} = {n.op}{_attr_str(n.attrs, indent + 4)} {args}".rstrip()
            if sources and n.source:
                line += f"    # {n.source}"
            lines.append(line)
        outs = ", ".join(self._arg_str(v) for v in self.outputs)
        lines.append(f"{pad}  in ({outs}{',' if len(self.outputs) == 1 else ''}) }}")
        return "\n".join(lines)

    def _arg_str(self, v):
        arr = self.consts.get(v)
        if arr is not None and _is_literal(arr):
            return _literal(arr)
        return v.name

    # --- checking ---------------------------------------------------------------------------
    def lint(self):
        """Check the graph is well formed: SSA, acyclic, ordered, and types agree with each op's
        shape/dtype rule. Raises GraphError (CycleError for a cycle) naming the node; returns
        self."""
        defined = set(map(id, self.inputs)) | set(map(id, self.consts))
        if len(defined) != len(self.inputs) + len(self.consts):
            raise GraphError(f"{self.name}: an input or constant value is listed twice")
        later = {id(o): n for n in self.nodes for o in n.outputs}
        for n in self.nodes:
            for v in n.inputs:
                if id(v) not in defined:
                    if id(v) in later:
                        self._raise_cycle_or_order(n, v)
                    raise GraphError(f"{self.name}: node {_node_label(n)} reads {v.name}, which "
                                     f"no input, constant or node defines{_at(n)}")
            try:
                op = get(n.op)
            except KeyError as e:
                raise GraphError(f"{self.name}: node {_node_label(n)}: {e}") from None
            try:
                aval = op.infer(*[v.aval for v in n.inputs], **n.attrs)
            except MLSysError as e:
                raise GraphError(f"{self.name}: node {_node_label(n)} is ill-typed: {e}"
                                 f"{_at(n)}") from None
            except (TypeError, ValueError, AttributeError, IndexError, KeyError) as e:
                # garbage attrs (a wrong name, a string where a tuple goes) crash the rule
                raise GraphError(f"{self.name}: node {_node_label(n)} has attributes its op "
                                 f"{n.op!r} does not accept ({sorted(n.attrs)}): "
                                 f"{type(e).__name__}: {e}{_at(n)}") from None
            out = n.outputs[0]
            if tuple(aval.shape) != out.shape or aval.dtype != out.dtype:
                raise GraphError(f"{self.name}: node {_node_label(n)} declares "
                                 f"{out.type_str()} but its rule gives "
                                 f"{dtypes.short(aval.dtype)}{list(aval.shape)}{_at(n)}")
            for o in n.outputs:
                if id(o) in defined:
                    raise GraphError(f"{self.name}: value {o.name} is defined twice (not SSA)"
                                     f"{_at(n)}")
                defined.add(id(o))
        for v in self.outputs:
            if id(v) not in defined:
                raise GraphError(f"{self.name}: output {v.name} is never defined")
        return self

    def _raise_cycle_or_order(self, node, value):
        cycle = find_cycle(self.nodes)
        if cycle:
            names = " -> ".join(_node_label(n) for n in cycle + cycle[:1])
            raise CycleError(f"{self.name}: the graph has a cycle: {names}; a computational "
                             f"graph must be acyclic", [n.id for n in cycle])
        raise GraphError(f"{self.name}: node {_node_label(node)} reads {value.name} before the "
                         f"node that defines it (nodes must be in topological order){_at(node)}")

    def infer(self, *avals):
        """Re-run static shape/dtype inference for new input types, before anything runs.

        Each argument is an array, a Tensor, an AVal or a ``(shape, dtype)`` pair. Returns the
        output AVals; raises ShapeError/DTypeError naming the offending node and the user's line.
        """
        if len(avals) != len(self.inputs):
            raise GraphError(f"{self.name}: expects {len(self.inputs)} inputs, got {len(avals)}")
        env = {id(v): _as_aval(a) for v, a in zip(self.inputs, avals)}
        for v, arr in self.consts.items():
            env[id(v)] = AVal(arr.shape, arr.dtype)
        for n in self.nodes:
            try:
                aval = get(n.op).infer(*[env[id(v)] for v in n.inputs], **n.attrs)
            except MLSysError as e:
                raise type(e)(f"{e}\n  in node {_node_label(n)}{_at(n)}") from None
            env[id(n.outputs[0])] = AVal(tuple(aval.shape), np.dtype(aval.dtype))
        return [env[id(v)] for v in self.outputs]

    # --- dependencies ------------------------------------------------------------------------
    def ancestors(self, node):
        """All nodes that ``node`` depends on, directly or indirectly."""
        node = self.node(node)
        seen, stack = set(), [node]
        while stack:
            for v in stack.pop().inputs:
                p = v.producer
                if p is not None and p.id not in seen:
                    seen.add(p.id)
                    stack.append(p)
        return {self.nodes[i] for i in seen}

    def dependency(self, a, b):
        """How nodes ``a`` and ``b`` relate: 'direct' (one reads the other's output), 'indirect'
        (connected through other nodes) or 'independent' (may run in any order or in parallel)."""
        a, b = self.node(a), self.node(b)
        for x, y in ((a, b), (b, a)):
            if any(v.producer is x for v in y.inputs):
                return "direct"
        if a in self.ancestors(b) or b in self.ancestors(a):
            return "indirect"
        return "independent"

    # --- running -----------------------------------------------------------------------------
    def __call__(self, *args):
        """Interpret the graph: run every node with its op's kernel (through the eager
        ``apply``, so the tape and an enclosing trace see each op). Returns Tensors.

        See :class:`~mlsys_lab.engine.interpreter.TensorInterpreter`."""
        from .pytree import unflatten

        outs = TensorInterpreter(self).run(*args)
        if self.out_tree == "auto":
            return outs[0] if len(outs) == 1 else tuple(outs)
        return unflatten(self.out_tree, outs)

    # --- drawing -----------------------------------------------------------------------------
    def to_dot(self, highlight=(), live=(), rankdir="TB"):
        """Graphviz DOT text: values are ellipses, ops are boxes. ``highlight`` node ids are
        filled orange, values named in ``live`` are filled green."""
        live, highlight = set(live), set(highlight)
        lines = [f'digraph "{self.name}" {{', f"  rankdir={rankdir};",
                 '  node [fontname="Helvetica", fontsize=10];']

        def vnode(v, kind):
            fill = "palegreen" if v.name in live else {"in": "lightblue", "const": "lightgrey",
                                                       "out": "khaki"}.get(kind, "white")
            label = self._arg_str(v) if kind == "const" else f"{v.name}\\n{v.type_str()}"
            lines.append(f'  v_{id(v)} [label="{label}", shape=ellipse, style=filled, '
                         f'fillcolor={fill}];')

        outs = set(map(id, self.outputs))
        for v in self.inputs:
            vnode(v, "out" if id(v) in outs else "in")
        for v in self.consts:
            vnode(v, "const")
        for n in self.nodes:
            fill = "orange" if n.id in highlight else "white"
            label = f"{n.op}{_attr_str(n.attrs, short=True)}"
            lines.append(f'  n_{n.id} [label="{label}", shape=box, style="rounded,filled", '
                         f'fillcolor={fill}];')
            for v in n.inputs:
                lines.append(f"  v_{id(v)} -> n_{n.id};")
            for v in n.outputs:
                vnode(v, "out" if id(v) in outs else "mid")
                lines.append(f"  n_{n.id} -> v_{id(v)};")
        lines.append("}")
        return "\n".join(lines)

    def _repr_svg_(self):
        return _SVG_RENDERER[0](self.to_dot()) if _SVG_RENDERER else None


def find_cycle(nodes):
    """A list of nodes forming a cycle through producer links, or [] when acyclic.

    A depth-first search with an explicit stack (any depth, no recursion): ``path`` holds the
    nodes being visited (grey); meeting one of them again closes a cycle."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {id(n): WHITE for n in nodes}
    producer = {id(o): n for n in nodes for o in n.outputs}
    for root in nodes:
        if color[id(root)] != WHITE:
            continue
        color[id(root)] = GREY
        path, inputs = [root], [iter(root.inputs)]
        while inputs:
            for v in inputs[-1]:
                p = producer.get(id(v))
                if p is None or color[id(p)] == BLACK:
                    continue
                if color[id(p)] == GREY:
                    return list(reversed(path[path.index(p):]))
                color[id(p)] = GREY
                path.append(p)
                inputs.append(iter(p.inputs))
                break
            else:
                inputs.pop()
                color[id(path.pop())] = BLACK
    return []


def _as_aval(a):
    if isinstance(a, AVal):
        return a
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], (tuple, list)):
        return AVal(tuple(a[0]), np.dtype(a[1]))
    return AVal(tuple(np.shape(a)), np.dtype(getattr(a, "dtype", np.asarray(a).dtype)))


def _is_literal(arr):
    return np.ndim(arr) == 0


def _literal(arr):
    x = np.asarray(arr).item()
    return repr(float(x)) if isinstance(x, float) else repr(x)


def _fmt_attr(v, indent):
    if isinstance(v, Graph):
        return "\n" + v.pretty(indent + 2)
    if isinstance(v, np.dtype):
        return v.name
    if callable(v):
        return getattr(v, "__name__", "fn")
    return repr(v)


def _attr_str(attrs, indent=0, short=False):
    shown = {k: v for k, v in attrs.items()
             if v is not None and v is not False and not k.startswith("_")}
    if not shown:
        return ""
    if short:
        shown = {k: v for k, v in shown.items() if not isinstance(v, Graph)}
        if not shown:
            return ""
        return "[" + ",".join(f"{k}={_fmt_attr(v, 0)}" for k, v in shown.items()) + "]"
    return "[" + ", ".join(f"{k}={_fmt_attr(v, indent)}" for k, v in shown.items()) + "]"


def _node_label(n):
    outs = ",".join(o.name for o in n.outputs)
    return f"#{n.id} {outs} = {n.op}"


def _at(n):
    return f"\n  at {n.source}" if n.source else ""


