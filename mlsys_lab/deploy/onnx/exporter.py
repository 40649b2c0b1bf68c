"""``export_onnx``: a traced function, module or Graph as an ONNX model.

Each node is written by its op's exporter (``Op.onnx.export``, registered in
:mod:`.ops_elementwise`, :mod:`.ops_shape`, :mod:`.ops_nn`) through an :class:`ExportContext`;
an op without one is an error naming the node. Constants become initializers, inputs and
outputs keep their static shapes.
"""

import numpy as np

from ...engine.graph import Graph
from ...engine.registry import get
from ...engine.trace import trace
from ...errors import ArgumentError, GraphError, UnknownNameError
from .mapping import exportable_ops

try:  # an optional dependency (the dev extra): the rest of mlsys_lab.deploy works without it
    import onnx
    from onnx import helper, numpy_helper
except ImportError:  # pragma: no cover - exercised only where onnx is missing
    onnx = helper = numpy_helper = None

#: The opset of the default ONNX domain that exported models declare.
EXPORT_OPSET = 18
#: The ONNX IR version written for the default opset (opset 18 belongs to IR 8; onnxruntime
#: >= 1.14 reads it); a newer opset gets the IR version it needs (opset 23, ``Attention``: 11).
IR_VERSION = 8
#: The domain of nodes an exporter writes for an op that ONNX has no operator for.
PRODUCER = "mlsys_lab"


def require_onnx(what):
    """Raise an ImportError naming ``what`` and the fix when the onnx package is missing."""
    if onnx is None:
        raise ImportError(f"{what} needs the onnx package: pip install onnx (it is part of "
                          f"mlsys-lab's dev extra)")


class ExportContext:
    """What an op's exporter writes through: value names, initializers and ONNX nodes.

    An exporter is ``export(ctx, node)``; it reads the graph node (``node.inputs``,
    ``node.attrs``, ``node.outputs``) and emits ONNX nodes whose last result is named
    ``ctx.name(node.output)``.
    """

    def __init__(self, graph, opset=EXPORT_OPSET):
        self.graph = graph
        self.opset = opset
        self.nodes, self.initializers = [], []
        self._names, self._taken = {}, set()
        self.node = None  # the graph node being exported, for error messages

    # --- names ----------------------------------------------------------------------------
    def fresh(self, hint):
        """A new ONNX tensor name, unique in the model, built from ``hint``."""
        base = "".join(c if c.isalnum() or c in "_." else "_" for c in str(hint)) or "t"
        name, k = base, 0
        while name in self._taken:
            k += 1
            name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def name(self, value):
        """The ONNX name of graph value ``value`` (given on first use)."""
        key = id(value)
        if key not in self._names:
            self._names[key] = self.fresh(value.name)
        return self._names[key]

    # --- tensors --------------------------------------------------------------------------
    def const(self, array, hint="const", dtype=None):
        """An initializer holding ``array`` (as ``dtype`` when given); returns its name."""
        arr = np.asarray(array, dtype=dtype)
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def ints(self, values, hint="ints"):
        """An int64 1-D initializer (shapes, axes, pads) for an input that ONNX reads as data."""
        return self.const(np.asarray(list(values), np.int64).reshape(-1), hint)

    def emit(self, op_type, inputs, outputs=None, domain="", **attrs):
        """Append an ONNX node; ``outputs`` default to one fresh name. Returns the output
        names (a list), or the single name when there is one."""
        if outputs is None:
            outputs = [self.fresh(f"{op_type.lower()}_out")]
        elif isinstance(outputs, str):
            outputs = [outputs]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs),
                                           name=self.fresh(f"{op_type}_{len(self.nodes)}"),
                                           domain=domain or None, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def cast(self, name, from_dtype, to_dtype):
        """``name`` converted to ``to_dtype`` (a Cast node only when the dtypes differ)."""
        if np.dtype(from_dtype) == np.dtype(to_dtype):
            return name
        return self.emit("Cast", [name], to=onnx_dtype(to_dtype))

    @staticmethod
    def onnx_dtype(dtype):
        """The ONNX element type code of a numpy dtype (for ``Cast``'s ``to``)."""
        return onnx_dtype(dtype)

    def fail(self, reason):
        """Raise the error for an attribute (or input type) this exporter cannot write."""
        raise ArgumentError(f"export_onnx: {_label(self.node)}: {reason}")


def onnx_dtype(dtype):
    """The ONNX TensorProto element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _label(node):
    if node is None:
        return "graph"
    outs = ",".join(o.name for o in node.outputs)
    where = f" (at {node.source})" if node.source else ""
    return f"node #{node.id} {outs} = {node.op}{where}"


def _value_info(ctx, value):
    return helper.make_tensor_value_info(ctx.name(value), onnx_dtype(value.dtype),
                                         list(value.shape))


def _ir_version(opset):
    """The IR version a model of ``opset`` declares: IR_VERSION, or the first that knows it."""
    return max(IR_VERSION, helper.find_min_ir_version_for([helper.make_opsetid("", opset)]))


def graph_to_onnx(graph, opset=EXPORT_OPSET, name=None):
    """``graph`` as an ONNX ``ModelProto`` (checked with ``onnx.checker``).

    Raises:
        UnknownNameError: a node's op has no ONNX mapping (the message names the node).
        ArgumentError: an attribute value the mapping cannot write.
    """
    require_onnx("export_onnx")
    if opset < 17:
        raise ArgumentError(f"export_onnx: opset {opset} is too old; mlsys_lab writes opset 17 "
                            f"or newer")
    graph.lint()
    ctx = ExportContext(graph, opset)
    inputs = [_value_info(ctx, v) for v in graph.inputs]
    for v, arr in graph.consts.items():
        ctx.initializers.append(numpy_helper.from_array(np.ascontiguousarray(arr), ctx.name(v)))
    for node in graph.nodes:
        _export_node(ctx, node)
    outputs = _outputs(ctx, graph)
    model = helper.make_model(
        helper.make_graph(ctx.nodes, name or graph.name, inputs, outputs, ctx.initializers),
        opset_imports=[helper.make_opsetid("", opset)], producer_name=PRODUCER,
        ir_version=_ir_version(opset))
    onnx.checker.check_model(model)
    return model


def _export_node(ctx, node):
    op = get(node.op)
    mapping = op.onnx
    if mapping is None or mapping.export is None:
        raise UnknownNameError(
            f"export_onnx: {_label(node)}: op {node.op!r} has no ONNX mapping"
            f"{_reason(mapping)}; ops that export: {', '.join(exportable_ops())}")
    if len(node.outputs) != 1:
        raise GraphError(f"export_onnx: {_label(node)} has {len(node.outputs)} outputs")
    ctx.node = node
    mapping.export(ctx, node)
    ctx.node = None


def _reason(mapping):
    return f" ({mapping.no_export_reason})" if mapping is not None and \
        mapping.no_export_reason else ""


def _outputs(ctx, graph):
    """Graph outputs; one that is an input, a constant or listed twice goes through an
    Identity so that each ONNX output is a node's result of its own."""
    infos, seen = [], set()
    produced = {id(n.output) for n in graph.nodes}
    for v in graph.outputs:
        if id(v) not in produced or id(v) in seen:
            name = ctx.emit("Identity", [ctx.name(v)])
            infos.append(helper.make_tensor_value_info(name, onnx_dtype(v.dtype),
                                                       list(v.shape)))
        else:
            infos.append(_value_info(ctx, v))
        seen.add(id(v))
    return infos


def export_onnx(fn_or_module, example_args=(), path=None, *, opset=EXPORT_OPSET, name=None):
    """Export a function, a Module or a Graph as an ONNX model.

    The function is traced on ``example_args`` (static shapes: the model takes inputs of
    exactly those shapes and dtypes); a Module is traced through its ``__call__`` and should be
    in eval mode (training-mode dropout has no ONNX equivalent). Weights become initializers.

    Args:
        fn_or_module: a Python function of tensors, a Module, or a :class:`Graph`.
        example_args: the arguments to trace with (a single array may be passed bare).
        path: where to write the ``.onnx`` file; None: write nothing.
        opset: the ONNX opset to target (17 or newer; default 18).
        name: the model graph's name.

    Returns:
        The ``onnx.ModelProto``.

    Raises:
        UnknownNameError: an op of the traced graph has no ONNX mapping (naming the node).
        ArgumentError: an attribute value that cannot be written (naming the node).
    """
    require_onnx("export_onnx")
    if isinstance(fn_or_module, Graph):
        graph = fn_or_module
    else:
        if not isinstance(example_args, (tuple, list)):
            example_args = (example_args,)
        if not callable(fn_or_module):
            raise ArgumentError(f"export_onnx: expects a function, a Module or a Graph, got "
                                f"{type(fn_or_module).__name__}")
        graph = trace(fn_or_module, *example_args,
                      name=name or getattr(fn_or_module, "__name__", type(fn_or_module).__name__))
    model = graph_to_onnx(graph, opset=opset, name=name)
    if path is not None:
        onnx.save_model(model, str(path))
    return model
