"""What the exercises of several chapters share: the graph helpers of chapters 4 and 6.

* ``AUTODIFF``: the forbidden set of every exercise that asks for derivatives by hand (4.4,
  6.1, 6.2): everything in the library that differentiates.
* ``random_program`` and ``random_inputs``: random straight-line functions to trace, and their
  inputs, drawn from a seed the same way on both sides (4.2, 6.3, 6.4).
* Graphs on the wire: a probe sends a student's graph as plain data (``graph_data``), a judge
  rebuilds it (``graph_from_data``) to lint and run it itself (``lint_and_run``,
  ``outputs_of``); ``graph_snapshot`` and ``first_difference`` tell whether a function changed
  a graph it was given (4.3, 6.3, 6.4).
* Arrays on the wire: ``as_array`` and ``as_arrays`` (a pair of results; for probes) and
  ``to_wire``/``from_wire`` keep a 0-d array 0-d (4.3, 4.4, 6.1, 6.2).
"""

from __future__ import annotations

import importlib
import types

import numpy as np

from mlsys_lab.grading.core.exercise import describe

# ----------------------------------------------------------------------------- forbidden sets


def _rule_specs() -> tuple[str, ...]:
    """Every op's VJP and JVP rule, as guard specs (``"mlsys_lab.engine.ops_math:MUL.vjp"``)."""
    from mlsys_lab.engine.registry import Op

    specs = set()
    for name in ("ops_math", "ops_shape", "ops_nn", "control", "selection"):
        module = importlib.import_module(f"mlsys_lab.engine.{name}")
        for attr, obj in vars(module).items():
            if isinstance(obj, Op):
                for rule in ("vjp", "jvp"):
                    if isinstance(getattr(obj, rule), types.FunctionType):
                        specs.add(f"mlsys_lab.engine.{name}:{attr}.{rule}")
    return tuple(sorted(specs))


#: Everything in the library that differentiates: the functional API and the tape
#: (``grad``, ``vjp``, ``jvp``, ``value_and_grad``, ``gradients``, ``hvp``, ``backward``), the
#: graph transforms (``grad_graph``, ``vjp_graph``, ``jvp_graph``), ``Tensor.backward``, every
#: op's VJP/JVP rule and the broadcasting rule ``unbroadcast``.
AUTODIFF = (
    "mlsys_lab.engine.autodiff",
    "mlsys_lab.engine.autodiff_graph",
    "mlsys_lab.engine.tensor:Tensor.backward",
    "mlsys_lab.engine.ops_math:unbroadcast",
    *_rule_specs(),
)

# ----------------------------------------------------------------------------- random programs


def random_program(seed: int, n_inputs: int = 2, n_ops: int = 12, repeat: float = 0.3):
    """A random straight-line function of ``n_inputs`` (3, 4) tensors, for tracing.

    It mixes unary ops, binary ops with broadcasting, products with scalar literals and
    reductions with attrs; with probability ``repeat`` an op repeats an earlier one on the same
    operands (a common subexpression). It returns every value no op reads (no dead code).
    """
    import mlsys_lab as ml

    def program(*xs):
        rng = np.random.default_rng(seed)
        vals, used, history = list(xs), set(), []
        for _ in range(n_ops):
            if history and rng.random() < repeat:
                kind, args = history[int(rng.integers(len(history)))]
            else:
                r = rng.random()
                pick = lambda: int(rng.integers(len(vals)))  # noqa: E731
                if r < 0.25:
                    kind, args = str(rng.choice(["tanh", "sin", "neg"])), (pick(),)
                elif r < 0.7:
                    kind, args = str(rng.choice(["add", "mul", "sub"])), (pick(), pick())
                elif r < 0.85:
                    kind, args = "scale", (pick(), float(rng.choice([2.0, 3.0])))
                else:
                    kind, args = "sum", (pick(), int(rng.integers(2)))
            history.append((kind, args))
            x = vals[args[0]]
            used.add(args[0])
            if kind in ("tanh", "sin", "neg"):
                out = getattr(ml.ops, kind)(x)
            elif kind in ("add", "mul", "sub"):
                used.add(args[1])
                out = getattr(ml.ops, kind)(x, vals[args[1]])
            elif kind == "scale":
                out = x * args[1]
            else:
                out = ml.ops.sum(x, axis=args[1], keepdims=True)
            vals.append(out)
        sinks = [v for i, v in enumerate(vals) if i >= len(xs) and i not in used]
        return tuple(sinks) if len(sinks) > 1 else sinks[0]

    program.__name__ = f"program{seed}"
    return program


def random_inputs(seed: int, n_inputs: int = 2, dtype=np.float32):
    """``n_inputs`` random (3, 4) arrays drawn from ``seed``."""
    rng = np.random.default_rng(seed + 1000)
    return [rng.standard_normal((3, 4)).astype(dtype) for _ in range(n_inputs)]



# ----------------------------------------------------------------------------- graphs on the wire


def graph_snapshot(graph):
    """Everything a pass could change in place: text, node list, links of every value."""
    values = graph.values()
    return (
        str(graph),
        [id(n) for n in graph.nodes],
        [(id(n), [id(v) for v in n.inputs], [id(v) for v in n.outputs]) for n in graph.nodes],
        [id(v) for v in graph.inputs],
        [id(v) for v in graph.outputs],
        [id(v) for v in graph.consts],
        [(id(v), v.name, id(v.producer), [id(u) for u in v.users]) for v in values],
    )


def first_difference(before, after) -> str:
    """What differs between two ``graph_snapshot``s, in words ('' when nothing does)."""
    labels = (
        "its printed text",
        "its node list",
        "a node's inputs or outputs",
        "its inputs",
        "its outputs",
        "its constants",
        "a value's name, producer or users",
    )
    if not isinstance(before, (list, tuple)) or not isinstance(after, (list, tuple)):
        return "its structure"
    for label, x, y in zip(labels, before, after, strict=False):
        if x != y:
            return label
    return "" if len(before) == len(after) else "its structure"


def outputs_of(graph, args):
    """The graph's outputs on ``args`` as a list of numpy arrays."""
    out = graph(*args)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return [np.asarray(o) for o in outs]


def graph_data(graph) -> dict:
    """A graph as plain data for the wire: a table of its values and its nodes over their indices.

    Values are numbered by identity, so one Value object used twice stays one entry and two
    objects with one name stay two; ``graph_from_data`` rebuilds exactly that structure.
    ``ids`` and ``node_ids`` carry the objects' identities, to compare with another graph's.
    """
    from mlsys_lab.engine.graph import Graph

    data = {"type": type(graph).__name__, "is_graph": isinstance(graph, Graph)}
    if not data["is_graph"]:
        return data
    index: dict[int, int] = {}
    values: list = []

    def ref(v) -> int:
        if id(v) not in index:
            index[id(v)] = len(values)
            values.append(v)
        return index[id(v)]

    inputs = [ref(v) for v in graph.inputs]
    consts = [[ref(v), to_wire(arr)] for v, arr in graph.consts.items()]
    nodes = [[n.op, [ref(v) for v in n.inputs], dict(n.attrs), [ref(o) for o in n.outputs],
              str(n.source or "")] for n in graph.nodes]
    outputs = [ref(v) for v in graph.outputs]
    data.update(
        values=[[str(v.name), [int(s) for s in v.shape], np.dtype(v.dtype).str] for v in values],
        inputs=inputs, consts=consts, nodes=nodes, outputs=outputs,
        ids=[id(v) for v in values], node_ids=[id(n) for n in graph.nodes],
    )
    return data


def graph_from_data(data, what: str):
    """Rebuild a real ``Graph`` from ``graph_data`` (in the judge), or fail with a message."""
    from mlsys_lab.engine.graph import Graph, Node, Value

    if not isinstance(data, dict) or not data.get("is_graph"):
        got = data.get("type") if isinstance(data, dict) else describe(data)
        raise AssertionError(f"{what} returned a {got}, expected a new Graph")
    try:
        values = [Value(name, shape, dtype) for name, shape, dtype in data["values"]]
        consts = {}
        for i, arr in data["consts"]:
            arr = from_wire(arr)
            if not isinstance(arr, (np.ndarray, np.generic)):
                raise AssertionError(f"{what}: constant {values[i].name} holds {describe(arr)}; "
                                     f"graph.consts maps each constant Value to a numpy array")
            consts[values[i]] = np.asarray(arr)
        nodes = [Node(op, [values[i] for i in ins], attrs, [values[i] for i in outs], source)
                 for op, ins, attrs, outs, source in data["nodes"]]
        return Graph([values[i] for i in data["inputs"]], nodes,
                     [values[i] for i in data["outputs"]], consts, name="result")
    except AssertionError:
        raise
    except Exception as error:
        raise AssertionError(f"{what}: the returned graph is malformed ({type(error).__name__}: "
                             f"{error})") from None


def lint_and_run(graph, args, what: str) -> list[np.ndarray]:
    """Lint a rebuilt graph and run it on ``args``, failing with the first line of any error."""
    try:
        graph.lint()
    except Exception as error:
        raise AssertionError(f"{what}: lint() failed: {str(error).splitlines()[0]}") from None
    try:
        return outputs_of(graph, args)
    except Exception as error:
        raise AssertionError(f"{what}: running the graph failed: "
                             f"{type(error).__name__}: {str(error).splitlines()[0]}") from None


_ZERO_D = "0-d array"


def to_wire(x):
    """``x`` ready for the wire: a 0-d array travels as ``{"0-d array": <its 1-element copy>}``
    (the wire's encoder would flatten it to shape (1,)); anything else unchanged."""
    if isinstance(x, np.ndarray) and x.ndim == 0:
        return {_ZERO_D: x.reshape(1)}
    return x


def from_wire(x):
    """The inverse of ``to_wire``, for judges."""
    if isinstance(x, dict) and set(x) == {_ZERO_D}:
        inner = x[_ZERO_D]
        if isinstance(inner, np.ndarray) and inner.shape == (1,):
            return inner.reshape(())
    return x


def as_array(x):
    """A student's array-like result as a numpy array, ready for the wire (see ``to_wire``);
    anything else unchanged. For probes."""
    if isinstance(x, (int, float, np.generic, np.ndarray)) and not isinstance(x, bool):
        return to_wire(np.asarray(x))
    if hasattr(x, "__array__"):
        return to_wire(np.asarray(x))
    return x


def as_arrays(result):
    """A student's pair (or tuple, or list) of array-like results as a list of ``as_array`` of
    each; a single result as ``as_array`` of it. For probes."""
    if isinstance(result, (tuple, list)):
        return [as_array(r) for r in result]
    return as_array(result)
