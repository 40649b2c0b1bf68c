"""Inference passes (book ch. 10): turn a traced model into a lean inference graph.

Each is a pure ``Graph -> Graph`` :class:`~mlsys_lab.engine.passes.Pass` that emits registered ops
only:

* :func:`remove_dropout` — ``dropout(x)`` is the identity at inference (inverted dropout already
  scaled the kept values while training); its random-seed node goes too;
* :func:`fold_batch_norm` — a chain of per-channel affine ops after a convolution or a matmul
  with a constant weight (a bias add, then inference batch norm's ``(z - mean) / std * gamma +
  beta``) is ``Y = A·X + B``: ``A`` scales the weight's output channels and ``B`` becomes one
  bias, so the chain disappears;
* :func:`collapse_affine` — op replacement: any other chain of three or more affine ops with
  constants (a batch norm not after a conv) becomes one ``mul`` and one ``add``.

:func:`inference_pipeline` strings them together with the engine's constant folding (weights
computed from weights, such as ``W.T``, become constants), CSE, DCE and conv/linear + bias +
ReLU fusion; :func:`to_inference` traces a model in eval mode and runs it; :func:`compare`
times two graphs side by side and reports their largest difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import timing
from ..engine.compiler import compile as compile_graph
from ..engine.interpreter import Interpreter
from ..engine.passes import (
    algebraic_simplification,
    cse,
    dce,
    fuse_matmul_bias_act,
    run_pipeline,
)
from ..engine.passes.frontend import constant_folding
from ..engine.passes.rewrite import Rewriter, graph_pass
from ..engine.trace import trace
from ..errors import ArgumentError

AFFINE_OPS = ("add", "sub", "mul", "div")
LINEAR_OPS = ("matmul", "conv2d")


# --- pattern helpers (shared with the quantisation passes) -------------------------------------
def output_channel_axis(node):
    """The axis of ``node``'s output that indexes its weight's output channels."""
    return 1 if node.op == "conv2d" else len(node.output.shape) - 1


def weight_channel_axis(node):
    """The axis of the weight that indexes output channels: O of OIHW, N of a (K, N) matmul."""
    return 0 if node.op == "conv2d" else 1


def constant_weight(graph, node):
    """The constant weight array of a ``conv2d``, or of a ``matmul`` by a constant matrix
    on the right; None for any other node."""
    if node.op not in LINEAR_OPS or len(node.inputs) != 2:
        return None
    w = graph.consts.get(node.inputs[1])
    if w is None or w.dtype.kind != "f":
        return None
    if node.op == "matmul" and (w.ndim != 2 or len(node.inputs[0].shape) < 1):
        return None
    return w


def sole_user(value, graph_outputs):
    """The one node reading ``value``, or None if it has several or is a graph output."""
    users = {id(u): u for u in value.users}
    if id(value) in graph_outputs or len(users) != 1:
        return None
    return next(iter(users.values()))


def channel_vector(array, out_shape, axis):
    """``array`` as one value per channel (a 1-D float64 vector of ``out_shape[axis]``) when,
    broadcast against ``out_shape``, it varies only along ``axis`` and grows nothing; else None."""
    a = np.asarray(array)
    n = len(out_shape)
    if a.ndim > n or np.broadcast_shapes(a.shape, tuple(out_shape)) != tuple(out_shape):
        return None
    full = (1,) * (n - a.ndim) + a.shape
    if any(d != 1 for i, d in enumerate(full) if i != axis):
        return None
    return np.broadcast_to(a.reshape(full[axis]) if a.size > 1 else a.reshape(1),
                           (out_shape[axis],)).astype(np.float64)


def _const_operand(graph, node, value):
    """``(constant array, its position)`` of a binary ``node`` whose other input is ``value``."""
    if len(node.inputs) != 2 or node.inputs[0] is node.inputs[1]:
        return None, None
    k = 1 if node.inputs[0] is value else 0
    arr = graph.consts.get(node.inputs[k])
    return (arr, k) if arr is not None else (None, None)


def _compose(op, k, c, a, b):
    """``(a', b')`` with ``op(a*z + b, c)`` = ``a'*z + b'`` (``k``: the constant's position),
    or None when the result is not affine in ``z`` (``c / z``)."""
    if op == "add":
        return a, b + c
    if op == "sub":
        return (a, b - c) if k == 1 else (-a, c - b)
    if op == "mul":
        return a * c, b * c
    if op == "div" and k == 1:
        return a / c, b / c
    return None


def affine_chain(graph, start, outs, vector_of):
    """Follow sole-user affine nodes (``add/sub/mul/div`` by a constant) from the value
    ``start``; returns ``(nodes, a, b)`` with the chain's result ``a * start + b``.

    ``vector_of(array, out_shape)`` turns each constant into the form ``a`` and ``b`` take
    (a channel vector, or any broadcastable array), or None to stop there."""
    nodes, a, b, v = [], 1.0, 0.0, start
    while True:
        user = sole_user(v, outs)
        if user is None or user.op not in AFFINE_OPS or user.output.aval != start.aval:
            break
        arr, k = _const_operand(graph, user, v)
        c = None if arr is None else vector_of(arr, start.shape)
        with np.errstate(all="ignore"):
            step = None if c is None else _compose(user.op, k, c, a, b)
        if step is None:
            break
        if not (np.all(np.isfinite(step[0])) and np.all(np.isfinite(step[1]))):
            break  # x / 0 and friends stay as they are: folding would bake inf into weights
        a, b = step
        nodes.append(user)
        v = user.output
        if id(v) in outs:
            break
    return nodes, a, b


# --- the passes --------------------------------------------------------------------------------
@graph_pass
def remove_dropout(graph):
    """Replace every ``dropout(x, seed)`` by ``x``; drop each ``rng_seed`` that only fed
    dropouts (an impure node is otherwise never removed)."""
    dropouts = {id(n) for n in graph.nodes if n.op == "dropout"}
    seeds = {id(n) for n in graph.nodes if n.op == "rng_seed" and n.output.users
             and all(id(u) in dropouts for u in n.output.users)
             and n.output not in graph.outputs}
    rw = Rewriter(graph)
    for n in graph.nodes:
        if id(n) in dropouts:
            if id(n.inputs[1].producer) not in seeds:
                rw.drop(n)
            rw.bind(n.output, rw[n.inputs[0]])
        elif id(n) not in seeds:
            rw.copy(n)
    return rw.build()


@graph_pass
def fold_batch_norm(graph):
    """Fold per-channel affine chains into the convolution or matmul before them.

    ``conv2d(x, W)`` followed by constants ``+ bias``, ``- mean``, ``/ sqrt(var + eps)``,
    ``* gamma``, ``+ beta`` (eval-mode batch norm, as ``nn.BatchNorm2d`` traces) is
    ``A·conv2d(x, W) + B`` with per-channel vectors ``A`` and ``B``, and ``A·conv2d(x, W)`` is
    ``conv2d(x, A·W)`` (``A`` scales output channel o of the weight). The result is one
    ``conv2d`` with the folded weight and one bias ``add``: the chain's four or five
    elementwise passes over the feature map are gone. Matmuls by a constant ``(K, N)`` weight
    fold the same way along N. ``A`` and ``B`` are composed in float64 and rounded once.

    It fires when every chain node is the only reader of its input, is not a graph output
    (except the last), keeps the conv's shape and dtype, and its constant is one value per
    output channel (or a scalar).
    """
    outs = set(map(id, graph.outputs))
    plan = {}
    for n in graph.nodes:
        if constant_weight(graph, n) is None:
            continue
        axis = output_channel_axis(n)
        nodes, a, b = affine_chain(graph, n.output, outs,
                                   lambda arr, shape, ax=axis: channel_vector(arr, shape, ax))
        if nodes:
            plan[id(n)] = (nodes, a, b)
            plan.update({id(m): None for m in nodes})
    rw = Rewriter(graph)
    for n in graph.nodes:
        if id(n) not in plan:
            rw.copy(n)
        elif plan[id(n)] is None:
            _drop_consts(rw, graph, n)
        else:
            _emit_folded(rw, graph, n, *plan[id(n)])
    return rw.build()


def _emit_folded(rw, graph, node, chain, a, b):
    w = graph.consts[node.inputs[1]]
    axis = weight_channel_axis(node)
    shape = [1] * w.ndim
    shape[axis] = w.shape[axis]
    scale = np.broadcast_to(np.asarray(a, np.float64), (w.shape[axis],)).reshape(shape)
    w_new = rw.const((w.astype(np.float64) * scale).astype(w.dtype), name=f"{node.inputs[1].name}f")
    rw.maybe_dead(rw[node.inputs[1]])
    y = rw.emit(node.op, [rw[node.inputs[0]], w_new], node.attrs, name=node.output.name,
                source=node.source)
    out_dtype = node.output.dtype
    bias_shape = [1] * len(node.output.shape)
    bias_shape[output_channel_axis(node)] = node.output.shape[output_channel_axis(node)]
    bias = np.broadcast_to(np.asarray(b, np.float64), (bias_shape[output_channel_axis(node)],))
    if node.op == "matmul":
        bias_shape = bias_shape[-1:]
    b_new = rw.const(bias.reshape(bias_shape).astype(out_dtype))
    last = chain[-1]
    rw.bind(last.output, rw.emit("add", [y, b_new], name=last.output.name, source=last.source))


def _drop_consts(rw, graph, node):
    """``node`` is not copied: the constants it read may now be dead."""
    for v in node.inputs:
        if v in graph.consts:
            rw.maybe_dead(rw[v])


def _same_shape(arr, shape):
    """A constant as an array that broadcasts to ``shape`` without growing it, else None."""
    a = np.asarray(arr)
    if a.ndim > len(shape) or np.broadcast_shapes(a.shape, tuple(shape)) != tuple(shape):
        return None
    return a.astype(np.float64)


@graph_pass
def collapse_affine(graph, min_nodes=3):
    """Op replacement (BN → scale): a chain of ``min_nodes`` or more affine ops by constants
    (``add/sub/mul/div``, as an inference batch norm that no conv precedes) becomes ``x * A +
    B`` — two nodes. ``A`` and ``B`` are composed in float64; the result differs from the chain
    by rounding only (a few ulps), which :func:`compare` reports."""
    outs = set(map(id, graph.outputs))
    plan, done = {}, set()
    for v in list(graph.inputs) + [o for n in graph.nodes for o in n.outputs]:
        if id(v) in done or v.dtype.kind != "f":
            continue
        nodes, a, b = affine_chain(graph, v, outs, _same_shape)
        if len(nodes) >= min_nodes:
            plan[id(nodes[-1])] = (v, nodes, a, b)
            done.update(id(m.output) for m in nodes)
    dropped = {id(m) for (_, nodes, _, _) in plan.values() for m in nodes}
    rw = Rewriter(graph)
    for n in graph.nodes:
        if id(n) in plan:
            v, nodes, a, b = plan[id(n)]
            dt = v.dtype
            scaled = rw.emit("mul", [rw[v], rw.const(np.asarray(a, np.float64).astype(dt))],
                             source=n.source)
            rw.bind(n.output, rw.emit("add", [scaled, rw.const(np.asarray(b).astype(dt))],
                                      name=n.output.name, source=n.source))
            _drop_consts(rw, graph, n)
        elif id(n) not in dropped:
            rw.copy(n)
        else:
            _drop_consts(rw, graph, n)
    return rw.build()


def inference_pipeline(fuse=True):
    """The passes :func:`to_inference` runs: dropout removal, constant folding of weights, BN
    folding, affine collapsing, the frontend clean-up and (``fuse``) conv/linear + bias + ReLU
    fusion into ``fused_conv`` / ``fused_linear``."""
    passes = [remove_dropout, constant_folding, fold_batch_norm, collapse_affine,
              algebraic_simplification, cse, dce]
    return passes + [fuse_matmul_bias_act, dce] if fuse else passes


def to_inference(model, *example_inputs, passes=None):
    """Trace ``model`` in eval mode on ``example_inputs`` and optimise the graph for inference.

    Returns:
        The :class:`~mlsys_lab.engine.passes.PipelineResult` (``.input`` the traced graph,
        ``.graph`` the optimised one, ``.stages`` each pass's output). The model's train/eval
        mode is restored afterwards.
    """
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        graph = trace(model, *example_inputs, name=type(model).__name__)
    finally:
        if was_training:
            model.train()
    return run_pipeline(graph, inference_pipeline() if passes is None else passes)


# --- before / after -----------------------------------------------------------------------------
@dataclass
class GraphComparison:
    """What :func:`compare` measured: seconds per call and node count of each graph, and the
    largest absolute and relative difference of their outputs."""

    before_s: float
    after_s: float
    before_nodes: int
    after_nodes: int
    max_abs_error: float
    max_rel_error: float

    @property
    def speedup(self):
        return self.before_s / self.after_s

    def __str__(self):
        saved = 100.0 * (1.0 - self.after_s / self.before_s)
        return (f"before: {self.before_nodes:3d} nodes {self.before_s * 1e3:8.3f} ms\n"
                f"after:  {self.after_nodes:3d} nodes {self.after_s * 1e3:8.3f} ms  "
                f"({self.speedup:.2f}x, {saved:.1f} % less time)\n"
                f"max |error| {self.max_abs_error:.3g}  (relative {self.max_rel_error:.3g})")


def run_numpy(graph, *inputs):
    """The outputs of ``graph`` on ``inputs`` by the interpreter (numpy reference kernels).

    Raises:
        OutOfMemoryError: a node's output does not fit in memory (refused before it is
            allocated when larger than the machine's memory); names the node, its op (and the
            ONNX node it came from, for an imported graph), the shape and the bytes.
        OpError: a kernel failed (naming the node).
    """
    return Interpreter(graph).run(*inputs)


def run_batched(run, x, batch):
    """``run`` (a graph, a compiled graph or any function of one array) over ``x`` in chunks
    of ``batch`` rows — the batch size a graph was traced for — padding the last chunk with
    zeros; returns the first output of every chunk, concatenated to ``len(x)`` rows."""
    x = np.asarray(x)
    if not isinstance(batch, (int, np.integer)) or batch < 1:
        raise ArgumentError(f"run_batched: batch must be a positive int, got {batch!r}")
    parts = []
    for start in range(0, len(x), batch):
        chunk = x[start:start + batch]
        n = len(chunk)
        if n < batch:
            chunk = np.concatenate([chunk, np.zeros((batch - n,) + x.shape[1:], x.dtype)])
        out = run_numpy(run, chunk)[0] if hasattr(run, "nodes") else run(chunk)
        out = out[0] if isinstance(out, (list, tuple)) else out
        parts.append(np.asarray(out)[:n])
    return np.concatenate(parts)


def compare(before, after, *inputs, rounds=10, compiled=True):
    """Time ``before`` and ``after`` on ``inputs`` (interleaved, best of ``rounds``) and
    compare their outputs.

    Args:
        before, after: graphs with the same inputs and outputs.
        inputs: arrays to run them on.
        rounds: timed calls of each.
        compiled: time each through ``ml.compile`` with no further passes (else the
            interpreter).

    Returns:
        A :class:`GraphComparison`.
    """
    if len(before.inputs) != len(after.inputs) or len(before.outputs) != len(after.outputs):
        raise ArgumentError(f"compare: the graphs differ in inputs or outputs "
                            f"({len(before.inputs)}/{len(after.inputs)} inputs, "
                            f"{len(before.outputs)}/{len(after.outputs)} outputs)")
    if compiled:
        run_b = compile_graph(before, *inputs, passes=None)
        run_a = compile_graph(after, *inputs, passes=None)
        fns = {"before": lambda: run_b(*inputs, profile=False),
               "after": lambda: run_a(*inputs, profile=False)}
    else:
        fns = {"before": lambda: run_numpy(before, *inputs),
               "after": lambda: run_numpy(after, *inputs)}
    times = timing.compare(fns, rounds=rounds)
    want, got = run_numpy(before, *inputs), run_numpy(after, *inputs)
    abs_err = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)),
                                initial=0.0)) for g, w in zip(got, want))
    scale = max(float(np.max(np.abs(np.asarray(w, np.float64)), initial=0.0)) for w in want)
    return GraphComparison(times["before"], times["after"], len(before.nodes), len(after.nodes),
                           abs_err, abs_err / scale if scale else abs_err)


__all__ = ["remove_dropout", "fold_batch_norm", "collapse_affine", "inference_pipeline",
           "to_inference", "compare", "GraphComparison", "run_numpy", "run_batched", "affine_chain",
           "channel_vector", "constant_weight", "sole_user", "output_channel_axis",
           "weight_channel_axis"]
