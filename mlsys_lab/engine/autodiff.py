"""Automatic differentiation: reverse mode over the eager tape, the functional API
(``grad``, ``value_and_grad``, ``vjp``, ``jvp``) and forward mode with tangents.

Every rule is an op's own VJP/JVP from the registry, written in framework ops. With
``create_graph=True`` the backward pass is itself recorded, so gradients can be differentiated
again (``grad(grad(f))``, Hessian-vector products).
"""

import functools

import numpy as np

from ..errors import ArgumentError, DTypeError, GraphError, ShapeError
from . import dtypes
from .ops_math import cast
from .ops_shape import IDENTITY, as_int
from .pytree import flatten, unflatten
from .sparse import accumulate_grad
from .tensor import MODE, Tensor, apply, as_tensor, enable_grad, no_grad, zeros_like


def tape_order(roots):
    """Tape nodes (tensors with a ctx) reachable from ``roots``, outputs before inputs.

    The order ``backward`` walks; the tensors it lists are what the tape keeps alive (pipeline
    parallelism's memory model sums their bytes).
    """
    order, seen = [], set()
    for root in roots:
        if root._ctx is None or id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root._ctx[1]))]
        push, pop, add = stack.append, stack.pop, seen.add
        while stack:
            t, it = stack[-1]
            for child in it:  # the first unvisited input with a ctx goes on the stack
                if child._ctx is not None and id(child) not in seen:
                    add(id(child))
                    push((child, iter(child._ctx[1])))
                    break
            else:
                pop()
                order.append(t)
    order.reverse()
    return order


def _reaches(order, targets):
    """ids of tape tensors from which some target is reachable (only those need cotangents)."""
    useful = set(map(id, targets))
    for t in reversed(order):
        if any(id(x) in useful for x in t._ctx[1]):
            useful.add(id(t))
    return useful


def _backprop(outputs, cotangents, targets, retain_graph, create_graph, order=None):
    """Push ``cotangents`` from ``outputs`` back to ``targets``; returns {id(target): grad}.

    ``order`` may pass in the tape order already computed; then every taped tensor is assumed
    to lead to a target (true when the targets are all the leaves that require grad)."""
    if order is None:
        order = tape_order(outputs)
        useful = _reaches(order, targets)
    else:
        useful = None
    target_ids = set(map(id, targets))
    grads = {}  # id(tensor) -> accumulated cotangent
    for o, g in zip(outputs, cotangents):
        grads[id(o)] = grads[id(o)] + g if id(o) in grads else g
    result = {}
    ctxmgr = enable_grad if create_graph else no_grad
    with ctxmgr():
        for t in order:
            g = grads.pop(id(t), None)
            if id(t) in target_ids:
                result[id(t)] = g
            if g is None or (useful is not None and id(t) not in useful):
                continue
            if t._freed:
                raise GraphError(
                    "backward: trying to backward through the graph a second time (its saved "
                    "values were freed by the first backward); call backward(retain_graph=True) "
                    "the first time if you need to backward twice")
            op, inputs, attrs = t._ctx
            needs = (tuple([x.requires_grad for x in inputs]) if useful is None else
                     tuple([x.requires_grad and id(x) in useful for x in inputs]))
            gs = op.vjp(g, inputs, t, needs, **attrs)
            for x, gx, need in zip(inputs, gs, needs):
                if gx is None or not need:
                    continue
                if gx.shape != x.shape:
                    raise ShapeError(f"backward: the VJP rule of {op.name} returned a gradient "
                                     f"of shape {tuple(gx.shape)} for an input of shape "
                                     f"{tuple(x.shape)}")
                if gx.dtype != x.dtype:
                    gx = cast(gx, x.dtype) if isinstance(gx, Tensor) else gx.astype(x.dtype)
                grads[id(x)] = accumulate_grad(grads.get(id(x)), gx)  # Tensor or RowSparse
            if not retain_graph:
                t._freed = True
    for leaf_id, g in grads.items():  # targets that are leaves (never popped from the order)
        if leaf_id in target_ids and leaf_id not in result:
            result[leaf_id] = g
    return result


def _seed(out, grad):
    if grad is None:
        if out.size != 1:
            raise ShapeError(f"backward: the output has shape {tuple(out.shape)}; pass a "
                             f"gradient of that shape, or reduce it to a scalar first")
        return Tensor._wrap(np.ones(out.shape, out.dtype))
    g = as_tensor(grad, out.dtype, "backward")
    if tuple(g.shape) != tuple(out.shape):
        raise ShapeError(f"backward: gradient shape {tuple(g.shape)} does not match output "
                         f"shape {tuple(out.shape)}")
    if g.dtype != out.dtype and dtypes.is_float(out.dtype):  # as PyTorch: take the output's
        g = cast(g, out.dtype)
    return g


def backward(out, grad=None, retain_graph=False, create_graph=False):
    """Accumulate gradients of ``out`` into ``.grad`` of every leaf that requires grad."""
    if not out.requires_grad:
        raise GraphError("backward: the tensor does not require grad (no input had "
                         "requires_grad=True, or it was computed under no_grad)")
    order = tape_order([out])
    leaves = [x for t in order for x in t._ctx[1] if x.requires_grad and x._ctx is None]
    leaves = list({id(x): x for x in leaves}.values()) or ([out] if out._ctx is None else [])
    res = _backprop([out], [_seed(out, grad)], leaves, retain_graph or create_graph,
                    create_graph, order=order)
    for leaf in leaves:
        g = res.get(id(leaf))
        if g is None:
            continue
        if not create_graph:
            g = g.detach()
        leaf.grad = g if leaf.grad is None else leaf.grad + g


def gradients(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
              allow_unused=True):
    """Gradients of ``outputs`` with respect to ``inputs`` without touching ``.grad``
    (like ``torch.autograd.grad``). An input the outputs do not depend on gets zeros, or a
    GraphError with ``allow_unused=False``."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    seeds = [_seed(o, g) for o, g in zip(outputs, grad_outputs)]
    retain = create_graph if retain_graph is None else retain_graph
    res = _backprop(outputs, seeds, inputs, retain, create_graph)
    out = []
    for i, x in enumerate(inputs):
        g = res.get(id(x))
        if g is None and not allow_unused:
            raise GraphError(f"gradients: input {i} (shape {tuple(x.shape)}) was not used to "
                             f"compute the outputs; pass allow_unused=True to get zeros")
        out.append(zeros_like(x) if g is None else g)
    return out


# --- the functional API ------------------------------------------------------------------------
def _single(argnums):
    """Whether ``argnums`` names one argument (not a sequence of them)."""
    return isinstance(argnums, (int, np.integer)) or not hasattr(argnums, "__iter__")


def _argnums(argnums, n):
    """``argnums`` (an int or a sequence of ints) as a tuple, checked against ``n`` arguments."""
    many = not _single(argnums)
    nums = tuple(as_int("grad", "argnums", a) for a in (argnums if many else (argnums,)))
    for a in nums:
        if not -n <= a < n:
            raise ArgumentError(f"grad: argnums {argnums} is out of range for {n} positional "
                                f"argument{'s' if n != 1 else ''}")
    return nums


def _lift_input(x):
    """A fresh differentiable stand-in for argument ``x`` (linked to ``x`` if ``x`` is itself
    being differentiated by an outer transformation, so nesting works)."""
    t = as_tensor(x)
    if not dtypes.is_float(t.dtype):
        raise DTypeError(f"grad: can only differentiate with respect to floating inputs, got "
                         f"{t.dtype}")
    if t.requires_grad or t._tangent is not None or t.is_tracer:
        with enable_grad():
            y = apply(IDENTITY, t)
        y.requires_grad = True
        return y
    y = Tensor._wrap(t.data)
    y.requires_grad = True
    return y


def value_and_grad(f, argnums=0, has_aux=False):
    """Return a function computing ``(f(*args), d f / d args[argnums])`` (JAX style).

    ``f`` must return a scalar (or ``(scalar, aux)`` with ``has_aux=True``). Gradients come back
    as Tensors in the structure of the differentiated arguments (a tuple when argnums is a tuple).
    """

    @functools.wraps(f)
    def wrapped(*args):
        nums = _argnums(argnums, len(args))
        args = list(args)
        nested = any(_is_tracked(a) for a in args)
        lifted = {}
        for i in nums:
            flat, tree = flatten(args[i])
            lifted[i] = (tree, [_lift_input(x) for x in flat])
            args[i] = unflatten(tree, lifted[i][1])
        with enable_grad():
            out = f(*args)
        value, aux = out if has_aux else (out, None)
        if not isinstance(value, (Tensor, np.ndarray, np.generic, int, float)):
            raise DTypeError(f"grad: {getattr(f, '__name__', 'f')} must return a scalar Tensor "
                             f"or number, got {type(value).__name__}")
        value = as_tensor(value, op="grad")
        if value.size != 1:
            raise ShapeError(f"grad: {getattr(f, '__name__', 'f')} must return a scalar, got "
                             f"shape {tuple(value.shape)}")
        targets = [x for i in nums for x in lifted[i][1]]
        if value.requires_grad:
            gs = gradients([value], targets, create_graph=nested or MODE.forward_depth > 0)
        else:
            gs = [zeros_like(x) for x in targets]
        it = iter(gs)
        per_arg = [unflatten(lifted[i][0], [next(it) for _ in lifted[i][1]]) for i in nums]
        g = per_arg[0] if _single(argnums) else tuple(per_arg)
        if not nested and MODE.forward_depth == 0:
            value = value.detach()
        return ((value, aux), g) if has_aux else (value, g)

    return wrapped


def _is_tracked(x):
    leaves, _ = flatten(x)
    return any(isinstance(t, Tensor) and (t.requires_grad or t._tangent is not None
                                          or t.is_tracer) for t in leaves)


def grad(f, argnums=0, has_aux=False):
    """Return a function computing the gradient of scalar ``f`` w.r.t. ``args[argnums]``."""
    vg = value_and_grad(f, argnums, has_aux)

    def simple(*args):
        out = vg(*args)
        return (out[1], out[0][1]) if has_aux else out[1]

    return functools.wraps(f)(simple)


def vjp(f, *primals):
    """Return ``(f(*primals), vjp_fn)``; ``vjp_fn(cotangent)`` gives one cotangent per primal
    (a row of the Jacobian when the cotangent is a unit vector)."""
    xs = [_lift_input(p) for p in primals]
    nested = any(_is_tracked(p) for p in primals)
    with enable_grad():
        out = f(*xs)
    outs, tree = flatten(out)
    outs = [as_tensor(o, op="vjp") for o in outs]

    def vjp_fn(cotangent):
        cts = [cotangent] if tree is None else flatten(cotangent)[0]  # one output: one array
        if len(cts) != len(outs):
            raise ArgumentError(f"vjp: the cotangent has {len(cts)} leaves but the function "
                                f"returned {len(outs)} outputs; pass one per output, in the "
                                f"same structure")
        live = [(o, as_tensor(c, o.dtype, "vjp")) for o, c in zip(outs, cts) if o.requires_grad]
        if not live:
            return tuple(zeros_like(x) for x in xs)
        gs = gradients([o for o, _ in live], xs, [c for _, c in live], retain_graph=True,
                       create_graph=nested)
        return tuple(gs)

    value = unflatten(tree, [o if nested else o.detach() for o in outs])
    return value, vjp_fn


def jvp(f, primals, tangents):
    """Forward mode: return ``(f(*primals), J @ tangents)`` — a column of the Jacobian when the
    tangent is a unit vector. Tangents ride along with the primal values through every op's
    JVP rule (dual numbers)."""
    primals, tangents = tuple(primals), tuple(tangents)
    if len(primals) != len(tangents):
        raise ArgumentError(f"jvp: got {len(primals)} primals but {len(tangents)} tangents")
    xs = []
    for p, t in zip(primals, tangents):
        x = _lift_input(p) if _is_tracked(p) else Tensor._wrap(as_tensor(p).data)
        tt = as_tensor(t)
        if tuple(tt.shape) != tuple(x.shape):
            raise ShapeError(f"jvp: tangent shape {tuple(tt.shape)} does not match primal "
                             f"shape {tuple(x.shape)}")
        x._tangent = tt if tt.dtype == x.dtype else cast(tt, x.dtype)
        xs.append(x)
    MODE.forward_depth += 1
    try:
        out = f(*xs)
    finally:
        MODE.forward_depth -= 1
    outs, tree = flatten(out)
    outs = [as_tensor(o, op="jvp") for o in outs]
    tans = [o._tangent if o._tangent is not None else zeros_like(o) for o in outs]
    for o in outs:
        o._tangent = None
    return unflatten(tree, outs), unflatten(tree, tans)


def hvp(f, primals, tangents):
    """Hessian-vector product of scalar ``f`` (forward-over-reverse: jvp of grad)."""
    n = len(primals)
    return jvp(grad(f, argnums=tuple(range(n))), primals, tangents)[1]


def tape_to_graph(*outputs, name="tape"):
    """The dynamic graph the tape recorded for ``outputs``, as a Graph (leaves become inputs)."""
    from .graph import Graph, Node, Value, name_generator

    order = list(reversed(tape_order(outputs)))
    names = name_generator()
    vals, inputs, nodes, consts = {}, [], [], {}

    def val(t):
        """Leaves that require grad become inputs; other leaves (literals, data) constants."""
        if id(t) not in vals:
            vals[id(t)] = Value(t.name or next(names), t.shape, t.dtype)
            if t._ctx is None:
                if t.requires_grad or t.data is None:
                    inputs.append(vals[id(t)])
                else:
                    consts[vals[id(t)]] = t.data
        return vals[id(t)]

    for t in order:
        op, ins, attrs = t._ctx
        in_vals = [val(x) for x in ins]
        nodes.append(Node(op.name, in_vals, attrs, [val(t)]))
    outs = [val(o) for o in outputs]
    return Graph(inputs, nodes, outs, consts, name=name)
