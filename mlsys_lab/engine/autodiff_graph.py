"""Source transformation: reverse-mode and forward-mode autodiff as Graph -> Graph functions.

``grad_graph(g)`` builds a new graph that recomputes g's forward pass and then walks g's nodes
backwards, emitting each op's VJP rule as new nodes — the same rules the eager tape uses.
"""

import numpy as np

from ..errors import ArgumentError, GraphError
from . import dtypes
from .interpreter import TensorInterpreter
from .ops_math import cast
from .ops_shape import as_int
from .registry import get
from .tensor import Tensor, conform_tangent, no_grad, zeros_like
from .trace import GraphBuilder


def _reverse(graph, env, seeds, wrt):
    """Emit VJP nodes for ``graph`` given forward tracers ``env`` and output cotangents."""
    ct = {}
    for v, s in zip(graph.outputs, seeds):
        ct[id(v)] = ct[id(v)] + s if id(v) in ct else s
    wanted = set(map(id, wrt))
    useful = set(wanted)
    for n in graph.nodes:  # values that lie on a path to a wanted input
        if any(id(v) in useful for v in n.inputs):
            useful.update(id(o) for o in n.outputs)
    for n in reversed(graph.nodes):
        out = n.outputs[0]
        g = ct.pop(id(out), None)
        if g is None or id(out) not in useful:
            continue
        op = get(n.op)
        if op.vjp is None:
            where = f" (at {n.source})" if n.source else ""
            raise GraphError(f"grad_graph: node #{n.id} {n.op}{where} has no gradient rule; "
                             f"differentiate the traced graph before backend passes rewrite it")
        ins = [env[id(v)] for v in n.inputs]
        needs = tuple(id(v) in useful and dtypes.is_float(v.dtype) for v in n.inputs)
        gs = op.vjp(g, ins, env[id(out)], needs, **n.attrs)
        for v, gv, need in zip(n.inputs, gs, needs):
            if gv is not None and need:
                if gv.dtype != v.dtype:  # as the tape: a gradient takes its input's dtype
                    gv = cast(gv, v.dtype)
                ct[id(v)] = ct[id(v)] + gv if id(v) in ct else gv
    return [ct.get(id(v)) for v in wrt]


def _forward(graph, inputs):
    """Re-emit ``graph``'s nodes on ``inputs`` (into the active trace); returns the env, which
    keeps every value for the reverse sweep."""
    interp = TensorInterpreter(graph, free=False)
    interp.run_flat(list(inputs))
    return interp.env


class _TangentInterpreter(TensorInterpreter):
    """Re-emits each node and, beside it, the node's JVP rule on the tangents of its inputs."""

    def __init__(self, graph, tangents):
        super().__init__(graph, free=False)
        self.tangent = {id(v): t for v, t in zip(graph.inputs, tangents)}

    def run_node(self, node, args):
        y = super().run_node(node, args)
        op, tan = get(node.op), self.tangent
        ts = tuple(tan.get(id(v)) for v in node.inputs)
        if op.jvp is not None and any(t is not None for t in ts):
            t = conform_tangent(op.jvp(ts, args, y, **node.attrs), y)
            if t is not None:
                tan[id(node.outputs[0])] = t
        return y


def grad_graph(graph, wrt=None, name=None):
    """The gradient graph of a scalar-output ``graph``.

    Returns a Graph with the same inputs whose outputs are ``(value, d value / d input_i for i in
    wrt)``. ``wrt`` holds input positions (default: every floating input).
    """
    if len(graph.outputs) != 1 or int(np.prod(graph.outputs[0].shape)) != 1:
        raise GraphError(f"grad_graph: {graph.name} must have one scalar output, has "
                         f"{[repr(v) for v in graph.outputs]}")
    wrt = [i for i, v in enumerate(graph.inputs) if dtypes.is_float(v.dtype)] \
        if wrt is None else _positions(graph, wrt)
    b = GraphBuilder(name or f"grad_{graph.name}")
    with b, no_grad():
        ins = [b.add_input(v.shape, v.dtype) for v in graph.inputs]
        env = _forward(graph, ins)
        y = env[id(graph.outputs[0])]
        seed = Tensor._wrap(np.ones(y.shape, y.dtype))
        gs = _reverse(graph, env, [seed], [graph.inputs[i] for i in wrt])
        outs = [y] + [g if g is not None else zeros_like(graph.inputs[i])
                      for g, i in zip(gs, wrt)]
        return b.build(outs, out_tree=(tuple, [None] * len(outs)))


def _positions(graph, wrt):
    """``wrt`` (a position or a sequence of them) as a list of input positions in range
    (negative ones count from the end)."""
    n = len(graph.inputs)
    out = []
    for i in wrt if isinstance(wrt, (tuple, list, range)) else (wrt,):
        i = as_int("grad_graph", "wrt", i)
        if not -n <= i < n:
            raise ArgumentError(f"grad_graph: wrt position {i} is out of range for "
                                f"{graph.name}, which has {n} input{'s' if n != 1 else ''}")
        out.append(i % n)
    return out


def vjp_graph(graph, name=None):
    """A graph of ``(*inputs, cotangent)`` returning one cotangent per input (single output)."""
    b = GraphBuilder(name or f"vjp_{graph.name}")
    with b, no_grad():
        ins = [b.add_input(v.shape, v.dtype) for v in graph.inputs]
        (out,) = graph.outputs
        ct = b.add_input(out.shape, out.dtype)
        env = _forward(graph, ins)
        gs = _reverse(graph, env, [ct], graph.inputs)
        outs = [g if g is not None else zeros_like(v) for g, v in zip(gs, graph.inputs)]
        return b.build(outs, out_tree=(tuple, [None] * len(outs)))


def jvp_graph(graph, name=None):
    """A graph of ``(*inputs, *tangents)`` returning the output tangent (single output)."""
    b = GraphBuilder(name or f"jvp_{graph.name}")
    with b, no_grad():
        ins = [b.add_input(v.shape, v.dtype) for v in graph.inputs]
        tans = [b.add_input(v.shape, v.dtype) for v in graph.inputs]
        interp = _TangentInterpreter(graph, tans)
        interp.run_flat(ins)
        tan = interp.tangent
        (out,) = graph.outputs
        t = tan.get(id(out))
        return b.build([t if t is not None else zeros_like(out)])
