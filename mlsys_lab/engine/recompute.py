"""Activation recomputation on the eager tape: ``recompute(fn, *args)`` (book ch. 19).

PyTorch's ``torch.utils.checkpoint`` under another name (in this library "checkpoint" means saved
training state). ``fn`` runs once in the forward pass; afterwards the tape keeps only what enters
the segment (its tensor arguments and the tensors it captured, parameters say) and what leaves
it (its outputs): every activation in between is freed. When the backward pass reaches the
segment, ``fn`` runs again on the saved inputs with the tape on, and the backward pass continues
through that replay.

How it stays bit-identical to running without recomputation:

* **Same values.** The replay runs the same ops on the same arrays. Before ``fn`` first runs the
  state of the generator behind ``ml.ops.dropout``'s seeds (``ops_nn.get_rng_state``) is saved;
  the replay restores it, so every ``rng_seed`` draws the seed it drew the first time (the
  masks are equal), and afterwards the generator is put back where the backward pass found it.
* **Same sums.** The gradient of a tensor used several times is a sum, and floating-point sums
  depend on their order. The replay's backward walks the segment's ops in the order the tape
  would have (the tape's own depth-first order, restricted to the segment), and each use of an
  input leaves the segment as its own term (the segment's tape node lists an input once per
  use), so the tape adds the terms one by one, as it would have without recomputation.

What belongs to the segment: every op of ``fn`` whose result depends on a floating tensor
argument. Ops on captured tensors alone (``w.T`` of a captured weight) are computed in the
forward pass and kept, as inputs of the segment, like the parameters themselves; a function with
no floating tensor argument recomputes nothing. ``fn`` must be deterministic apart from
``ml.ops.dropout`` (the replay checks that it runs the same ops) and must not hand intermediate
tensors to the outside except through its return value.

Limits: bit-identity is the tape's order reproduced, which holds for a segment entered through
its outputs and read by ops outside it in the usual way (chains, residual blocks, shared
weights, several outputs consumed downstream: the tests' cases); where the outer tape would
interleave its own ops between two uses inside the segment, or for several outputs that feed
one another, the terms may group differently in the last bit. Higher-order gradients through a
segment (``create_graph=True``) are correct but equal only to rounding: the replay is a second
copy of the forward ops in the recorded graph.

Under ``no_grad`` or while tracing (``ml.trace``) ``recompute`` simply calls ``fn``: there is no
tape to shrink; a traced training graph is recomputed by the graph pass
``engine.passes.recompute.recompute_pass``.
"""

import numpy as np

from ..errors import DTypeError, GraphError, ShapeError
from . import dtypes
from .dispatch import MODE, enable_grad, is_grad_enabled, no_grad
from .ops_math import cast
from .ops_nn import get_rng_state, set_rng_state
from .pytree import flatten, unflatten
from .sparse import accumulate_grad
from .tensor import Tensor

__all__ = ["recompute"]


def recompute(fn, *args):
    """``fn(*args)``, with the activations inside ``fn`` recomputed in backward, not stored.

    Gradients are bit-identical to calling ``fn(*args)`` directly, dropout included (the replay
    restores the random state the first run started from). Tensors ``fn`` captures (a layer's
    parameters) get their gradients as usual. Nesting works (a recomputed segment inside
    another is recomputed again while the outer one replays).

    Args:
        fn: a callable returning a Tensor or a tuple/list/dict of Tensors.
        *args: its arguments; Tensors among them are the segment's inputs (they need not
            require grad); anything else is passed through unchanged.

    Returns:
        What ``fn`` returns.

    Raises:
        DTypeError: ``fn`` is not callable, or returns something other than Tensors.
        GraphError: in backward, the replay of ``fn`` ran different ops than the first run.
    """
    if not callable(fn):
        raise DTypeError(f"recompute: fn must be callable, got {type(fn).__name__}")
    name = getattr(fn, "__name__", type(fn).__name__)
    tracing = bool(MODE.builders) or any(isinstance(a, Tensor) and a.is_tracer for a in args)
    if tracing or not is_grad_enabled():
        out = fn(*args)
        _check_outputs(name, out)
        return out
    rng_state = get_rng_state()
    seeds, call_args = _stand_ins(args)
    with enable_grad():
        out = fn(*call_args)
    flat, tree = _check_outputs(name, out)
    seg = _Segment(fn, name, args, rng_state)
    result = seg.attach(flat, seeds)
    return unflatten(tree, result)


def _check_outputs(name, out):
    flat, tree = flatten(out)
    for leaf in flat:
        if not isinstance(leaf, Tensor):
            raise DTypeError(f"recompute: {name} must return a Tensor or a tuple/list/dict of "
                             f"Tensors, got {type(leaf).__name__}"
                             + (f" inside a {type(out).__name__}" if leaf is not out else ""))
    return flat, tree


def _stand_ins(args):
    """What ``fn`` runs on: the segment's seeds. An argument that requires grad is its own
    seed (so what the segment computes stays connected to it: higher-order derivatives); a
    floating one that does not is replaced by a leaf that does, so every op depending on it is
    recorded (and so known to belong to the segment). In forward mode nothing is forced: a
    tangent must not be recorded where its argument does not require grad. ``seeds`` maps
    ``id(seed) -> (position, seed, whether the gradient must reach it)``."""
    force = MODE.forward_depth == 0
    seeds, call_args = {}, []
    for pos, a in enumerate(args):
        if isinstance(a, Tensor) and a.requires_grad:
            seeds[id(a)] = (pos, a, True)
            call_args.append(a)
        elif force and isinstance(a, Tensor) and dtypes.is_float(a.dtype):
            s = Tensor._wrap(a.data)
            s.requires_grad = True
            s._tangent = a._tangent
            seeds[id(s)] = (pos, s, False)
            call_args.append(s)
        else:
            call_args.append(a)
    return seeds, call_args


class _Structure:
    """The segment's ops as the tape recorded them, in a canonical order.

    Attributes:
        inside: the recorded tensors of the segment, inputs before their users (the tape's
            depth-first post-order from the outputs, restricted to the segment).
        useful: ids of inside tensors that a real gradient source (an argument that requires
            grad, a captured tensor that does) reaches.
        externals: the tensors requiring grad that enter the segment without being recorded
            in it, by first use in ``inside`` order: ``("arg", position)`` for a seed or
            ``("tensor", t)`` for a captured one.
        signature: op names and input kinds per inside tensor, to compare a replay against.
    """

    def __init__(self, outputs, seeds):
        self.seeds = seeds
        depends = _depends(outputs, seeds)
        self.is_inside = {i for i, d in depends.items() if d}
        self.inside = _post_order(outputs, self.is_inside)
        self.useful, self.external_of, self.externals = set(), {}, []
        signature = []
        for t in self.inside:
            op, ins, _ = t._ctx
            kinds, useful = [], False
            for x in ins:
                kind = self._kind(x)
                kinds.append(kind)
                useful = useful or kind == "ext" or (kind == "in" and id(x) in self.useful)
            if useful:
                self.useful.add(id(t))
            signature.append((op.name, tuple(kinds)))
        self.signature = tuple(signature)
        self.uses = [0] * len(self.externals)  # how often each external is read inside
        for t in self.inside:
            for x in t._ctx[1]:
                n = self.external_of.get(id(x))
                if n is not None and id(x) not in self.is_inside:
                    self.uses[n] += 1

    def _kind(self, x):
        if id(x) in self.is_inside:
            return "in"
        seed = self.seeds.get(id(x))
        if seed is not None:
            if not seed[2]:
                return "const"
            key = ("arg", seed[0])
        elif x.requires_grad:
            key = ("tensor", x)
        else:
            return "const"
        if id(x) not in self.external_of:
            self.external_of[id(x)] = len(self.externals)
            self.externals.append(key)
        return "ext"

    def order(self, roots):
        """The order the tape's backward would process the segment in, from ``roots``."""
        return _post_order(roots, self.is_inside)[::-1]


def _depends(outputs, seeds):
    """id -> whether a recorded tensor reachable from ``outputs`` depends on a seed (inputs
    before users, iteratively: a deep segment never hits the recursion limit)."""
    depends = {}
    for root in outputs:
        if root._ctx is None or id(root) in depends or id(root) in seeds:
            continue
        stack = [(root, iter(root._ctx[1]))]
        depends[id(root)] = None  # on the stack
        while stack:
            t, it = stack[-1]
            for x in it:
                if x._ctx is not None and id(x) not in depends and id(x) not in seeds:
                    depends[id(x)] = None
                    stack.append((x, iter(x._ctx[1])))
                    break
            else:
                stack.pop()
                depends[id(t)] = any(id(x) in seeds or depends.get(id(x)) for x in t._ctx[1])
    return depends


def _post_order(roots, inside):
    """``autodiff.tape_order``'s depth-first walk (first unvisited input first), entering only
    tensors in ``inside``; post-order (inputs before users)."""
    order, seen = [], set()
    for root in roots:
        if id(root) not in inside or id(root) in seen:
            continue
        seen.add(id(root))
        stack = [(root, iter(root._ctx[1]))]
        while stack:
            t, it = stack[-1]
            for x in it:
                if id(x) in inside and id(x) not in seen:
                    seen.add(id(x))
                    stack.append((x, iter(x._ctx[1])))
                    break
            else:
                stack.pop()
                order.append(t)
    return order


class _Packed:
    """The cotangents of a multi-output segment's outputs, gathered on its hidden tape node.

    The tape adds cotangents with ``+``; adding two of these merges them. ``shape`` and
    ``dtype`` are those of the hidden node, so the tape's checks pass them through."""

    __slots__ = ("parts", "arrived", "shape", "dtype")

    def __init__(self, parts, arrived, like):
        self.parts, self.arrived = parts, arrived
        self.shape, self.dtype = like.shape, like.dtype

    def __add__(self, other):
        parts = dict(self.parts)
        for k, g in other.parts.items():
            parts[k] = accumulate_grad(parts.get(k), g)
        arrived = self.arrived + [k for k in other.arrived if k not in self.arrived]
        return _Packed(parts, arrived, self)


class _Pick:
    """Tape record of output ``index`` of a multi-output segment (read from the hidden node)."""

    name = "recompute_output"

    def __init__(self, index):
        self.index = index

    def vjp(self, g, xs, y, needs):
        return (_Packed({self.index: g}, [self.index], xs[0]),)


class _Segment:
    """Tape record of a recomputed segment (what the tape needs of an op: ``name``, ``vjp``).

    Its tape inputs are the segment's external tensors, each listed once per use inside the
    segment; its cotangent is the output's (one output) or a :class:`_Packed` (several)."""

    name = "recompute"

    def __init__(self, fn, fn_name, args, rng_state):
        self.fn, self.fn_name, self.args, self.rng_state = fn, fn_name, args, rng_state

    # --- forward ---------------------------------------------------------------------------
    def attach(self, flat, seeds):
        """Put the segment on the tape in place of what ``fn`` recorded; returns the outputs
        (what the caller gets: stand-ins become the arguments again)."""
        structure = _Structure(flat, seeds)
        result, outs, index = [], [], {}
        for t in flat:
            if id(t) in seeds:  # fn returned its argument
                result.append(self.args[seeds[id(t)][0]])
            elif id(t) in structure.useful:
                if id(t) not in index:
                    index[id(t)] = len(outs)
                    outs.append(t)
                result.append(t)
            else:
                if id(t) in structure.is_inside:  # depends only on arguments without grad
                    t._ctx, t.requires_grad = None, False
                result.append(t)
        self.out_positions = [next(i for i, t in enumerate(flat) if t is o) for o in outs]
        self.signature = structure.signature
        objects = [self.args[k] if kind == "arg" else k for kind, k in structure.externals]
        self.n_externals = len(objects)
        uses = structure.uses
        slots, self.slots_of = [], {}
        for obj, n in zip(objects, uses):
            group = self.slots_of.setdefault(id(obj), [])
            group.extend(range(len(slots), len(slots) + n))
            slots.extend([obj] * n)
        self.group_of = [id(obj) for obj in objects]
        if not outs:
            return result
        if len(outs) == 1:
            outs[0]._ctx = (self, tuple(slots), {})
        else:
            hidden = Tensor._wrap(np.empty((0,), np.float32))
            hidden.requires_grad = True
            hidden._ctx = (self, tuple(slots), {})
            for i, o in enumerate(outs):
                o._ctx = (_Pick(i), (hidden,), {})
        return result

    # --- backward ---------------------------------------------------------------------------
    def vjp(self, g, xs, y, needs):
        if isinstance(g, _Packed):
            cts, arrived = g.parts, g.arrived
        else:
            cts, arrived = {0: g}, [0]
        need_group = {}
        for x, need in zip(xs, needs):
            need_group[id(x)] = need_group.get(id(x), False) or need
        create_graph = is_grad_enabled()
        flat, structure = self._replay()
        outs = [flat[p] for p in self.out_positions]
        grads = {}
        for k, ct in cts.items():
            if ct is not None:
                grads[id(outs[k])] = ct
        roots = [outs[k] for k in reversed(arrived)] + outs
        contributions = {gid: [] for gid in self.slots_of}
        ext_group = {i: self.group_of[n] for i, n in structure.external_of.items()}
        with (enable_grad() if create_graph else no_grad()):
            for t in structure.order(roots):
                gt = grads.pop(id(t), None)
                if gt is None or id(t) not in structure.useful:
                    continue
                op, ins, attrs = t._ctx
                nd = tuple(id(x) in structure.useful if id(x) in structure.is_inside
                           else need_group.get(ext_group.get(id(x)), False) for x in ins)
                for x, gx, need in zip(ins, op.vjp(gt, ins, t, nd, **attrs), nd):
                    if gx is None or not need:
                        continue
                    gx = _conform(op, gx, x)
                    if id(x) in structure.is_inside:
                        grads[id(x)] = accumulate_grad(grads.get(id(x)), gx)
                    else:
                        contributions[ext_group[id(x)]].append(gx)
        gs = [None] * len(xs)
        for gid, slots in self.slots_of.items():
            for slot, gx in zip(slots, contributions[gid]):
                gs[slot] = gx
        return tuple(gs)

    def _replay(self):
        """Run ``fn`` again, with the tape on and the random state of the first run."""
        current = get_rng_state()
        set_rng_state(self.rng_state)
        try:
            seeds, call_args = _stand_ins(self.args)
            with enable_grad():
                out = self.fn(*call_args)
        finally:
            set_rng_state(current)
        flat, _ = _check_outputs(self.fn_name, out)
        structure = _Structure(flat, seeds)
        if (structure.signature != self.signature
                or len(structure.externals) != self.n_externals):
            raise GraphError(f"recompute: replaying {self.fn_name} in backward ran other ops "
                             f"than its first run ({len(structure.signature)} recorded ops "
                             f"instead of {len(self.signature)}, or other inputs); fn must "
                             f"be deterministic (randomness only from ml.ops.dropout)")
        return flat, structure


def _conform(op, gx, x):
    """A VJP rule's result checked and cast as ``autodiff._backprop`` does."""
    if tuple(gx.shape) != tuple(x.shape):
        raise ShapeError(f"backward: the VJP rule of {op.name} returned a gradient of shape "
                         f"{tuple(gx.shape)} for an input of shape {tuple(x.shape)}")
    if gx.dtype != x.dtype:
        gx = cast(gx, x.dtype) if isinstance(gx, Tensor) else gx.astype(x.dtype)
    return gx
