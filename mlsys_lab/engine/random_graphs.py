"""Random traced graphs, for property tests, differential tests and the chapters' exercises.

``random_graph(seed, n_nodes)`` writes a random Python function of elementwise ops, matmuls,
transposes, sums, reshapes, concatenations and constants (:func:`random_program`), traces it
with ``ml.trace`` and returns the graph with matching numpy inputs. The generator plants what the
passes look for: repeated expressions (CSE), unused results (DCE), ``x * 1.0`` and
``neg(neg(x))`` (algebraic simplification), transpose pairs, ``relu(x @ w + b)`` and, by binding
some inputs as constants (:func:`bind_inputs`), constant sub-graphs (constant folding).
"""

import numpy as np

from .graph import Graph
from .passes.rewrite import Rewriter
from .trace import trace

UNARY = ("neg", "tanh", "sigmoid", "relu", "abs", "sin", "cos")
BINARY = ("add", "sub", "mul", "maximum", "minimum")
SHAPES = ((3, 4), (4, 3), (4, 4), (3, 3), (2, 3, 4), (4,), (1, 4), ())
LITERALS = (0.5, 2.0, -1.5, 1.0, 0.0)


class _Program:
    """Builds the random function's source line by line, tracking each variable's shape."""

    def __init__(self, rng):
        self.rng, self.lines, self.consts, self.shapes = rng, [], [], {}
        self.n_nodes = 0

    def pick(self, pred=lambda s: True):
        names = [v for v, s in self.shapes.items() if pred(s)]
        if not names:
            return None
        recent = names[-3:] if self.rng.random() < 0.7 else names  # keep most results live
        return recent[self.rng.integers(len(recent))]

    def const(self, shape):
        self.consts.append((self.rng.standard_normal(shape) * 0.5).astype(np.float32))
        return f"C[{len(self.consts) - 1}]"

    def line(self, expr, shape, n_nodes=1):
        name = f"v{len(self.shapes)}"
        self.lines.append(f"    {name} = {expr}")
        self.shapes[name] = tuple(shape)
        self.n_nodes += n_nodes
        return name


def _compatible(a, b):
    try:
        np.broadcast_shapes(a, b)
        return True
    except ValueError:
        return False


def _step(p):
    """Append one random statement to program ``p``."""
    r, kind = p.rng, p.rng.choice(["unary", "binary", "binary", "matmul", "transpose", "sum",
                                   "reshape", "concat", "repeat", "identity", "linear"])
    a = p.pick()
    sa = p.shapes[a]
    if kind == "unary":
        return p.line(f"ops.{r.choice(UNARY)}({a})", sa)
    if kind == "binary" or (kind in ("matmul", "linear") and len(sa) < 2):
        op = r.choice(BINARY + ("div",))
        if op == "div":
            return p.line(f"ops.div({a}, {p.const(sa[-1:])} + 2.0)", sa)
        b = p.pick(lambda s: _compatible(s, sa)) if r.random() < 0.6 else None
        b = b or (str(r.choice(LITERALS)) if r.random() < 0.5 else p.const(sa[-1:]))
        args = (a, b) if r.random() < 0.7 else (b, a)
        shape = np.broadcast_shapes(sa, p.shapes.get(b, sa[-1:] if "C" in b else ()))
        return p.line(f"ops.{op}({args[0]}, {args[1]})", shape)
    if kind in ("matmul", "linear"):
        k = sa[-1]
        b = p.pick(lambda s: len(s) == 2 and s[0] == k) or p.const((k, int(r.choice([3, 4]))))
        n = p.shapes[b][1] if b in p.shapes else p.consts[-1].shape[1]
        out = sa[:-1] + (n,)
        if kind == "matmul":
            return p.line(f"ops.matmul({a}, {b})", out)
        return p.line(f"ops.relu(ops.add(ops.matmul({a}, {b}), {p.const((n,))}))", out, 3)
    if kind == "transpose" and len(sa) >= 2:
        perm = tuple(int(i) for i in r.permutation(len(sa)))
        shape = tuple(sa[i] for i in perm)
        if r.random() < 0.4:
            back = tuple(int(i) for i in np.argsort(perm))
            return p.line(f"ops.transpose(ops.transpose({a}, {perm}), {back})", sa, 2)
        return p.line(f"ops.transpose({a}, {perm})", shape)
    if kind == "sum" and sa:
        axis, keep = int(r.integers(len(sa))), bool(r.random() < 0.5)
        shape = tuple(1 if i == axis else d for i, d in enumerate(sa) if keep or i != axis)
        return p.line(f"ops.sum({a}, {axis}, {keep})", shape)
    if kind == "reshape" and sa:
        shape = (int(np.prod(sa)),) if r.random() < 0.5 else tuple(reversed(sa))
        return p.line(f"ops.reshape({a}, {shape})", shape)
    if kind == "concat" and sa:
        same = [v for v, s in p.shapes.items() if s == sa]
        parts = [same[i] for i in r.integers(len(same), size=int(r.integers(2, 5)))]
        shape = (sa[0] * len(parts),) + sa[1:]
        return p.line(f"ops.concatenate([{', '.join(parts)}], 0)", shape)
    if kind == "repeat" and p.lines:
        old = p.lines[r.integers(len(p.lines))].split(" = ", 1)
        return p.line(old[1], p.shapes[old[0].strip()])
    if kind == "identity":
        expr = r.choice([f"ops.mul({a}, 1.0)", f"ops.add(0.0, {a})", f"ops.neg(ops.neg({a}))",
                         f"ops.div({a}, 1.0)", f"ops.sub({a}, 0.0)"])
        return p.line(expr, sa, 1 + expr.count("neg("))
    return p.line(f"ops.tanh({a})", sa)


def random_program(seed, n_nodes=12, n_inputs=3):
    """Source of a random function of ``n_inputs`` float32 arrays with about ``n_nodes`` ops.

    Returns:
        ``(source, input_shapes, consts)``: the function ``f`` refers to ``ops`` (``ml.ops``) and
        to the constant arrays as ``C[i]``.
    """
    rng = np.random.default_rng(seed)
    p = _Program(rng)
    params = [f"x{i}" for i in range(n_inputs)]
    for x in params:
        p.shapes[x] = SHAPES[rng.integers(len(SHAPES) - 3)]
    while p.n_nodes < n_nodes:
        _step(p)
    produced = list(p.shapes)[n_inputs:]
    outs = [produced[-1]] + ([produced[rng.integers(len(produced))]] if rng.random() < 0.4 else [])
    src = "\n".join([f"def f({', '.join(params)}):", *p.lines, f"    return {', '.join(outs)}"])
    return src + "\n", [p.shapes[x] for x in params], p.consts


def random_graph(seed, n_nodes=12, n_inputs=3, bind=True):
    """A random traced graph and matching float32 inputs.

    Args:
        seed: makes the graph and inputs reproducible.
        n_nodes: about how many ops the traced function performs.
        n_inputs: how many arrays the function takes.
        bind: with probability 1/2, turn one input into a constant (:func:`bind_inputs`), so
            the graph has constant sub-graphs to fold.

    Returns:
        ``(graph, args)`` with ``graph(*args)`` runnable.
    """
    from .. import ops

    source, shapes, consts = random_program(seed, n_nodes, n_inputs)
    namespace = {"ops": ops, "C": consts}
    exec(compile(source, f"<random_graph {seed}>", "exec"), namespace)
    rng = np.random.default_rng(seed + 1)
    args = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    graph = trace(namespace["f"], *args, name=f"random_{seed}")
    if bind and n_inputs > 1 and rng.random() < 0.5:
        i = int(rng.integers(n_inputs))
        graph = bind_inputs(graph, {i: args[i]})
        args = args[:i] + args[i + 1:]
    return graph, args


def bind_inputs(graph, values):
    """A copy of ``graph`` in which the inputs at the positions in ``values`` (dict position ->
    array) are constants: what a compiler sees when weights are known at compile time."""
    rw = Rewriter(graph)
    kept = []
    for i, (old, new) in enumerate(zip(graph.inputs, rw.inputs, strict=True)):
        if i in values:
            rw.bind(old, rw.const(np.asarray(values[i], old.dtype).copy(), name=old.name))
        else:
            kept.append(new)
    rw.inputs = kept
    for n in graph.nodes:
        rw.copy(n)
    g = rw.build()
    return Graph(g.inputs, g.nodes, g.outputs, g.consts, "auto", None, g.name)


