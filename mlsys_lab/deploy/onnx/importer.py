"""``import_onnx``: an ONNX model as a :class:`~mlsys_lab.engine.graph.Graph` of registry ops.

Each ONNX node goes to the importer that some op's mapping declares for its op type
(``Op.onnx.imports``, registered in :mod:`.ops_elementwise`,
:mod:`.ops_shape`, :mod:`.ops_nn`, :mod:`.qdq`; the lookup is derived by scanning the
registry). An importer emits registry ops through an :class:`ImportContext`; nothing is
optimised here (constant folding is a pass), but an input whose value decides shapes (a
Reshape's target computed by shape arithmetic) is evaluated at import time, the graph's shapes
being static. The few ONNX ops that only make constants (``Constant``, ``ConstantOfShape``,
``Shape``, ``Size``) become constants here.
An op type, attribute, dtype or output with no mapping is an error naming it and the node.
"""

import pathlib
from collections import Counter

import numpy as np

from ...engine import dtypes
from ...engine.dispatch import run_kernel
from ...engine.graph import Graph, Node, Value
from ...engine.interpreter import check_allocation, is_memory_error, out_of_memory
from ...engine.registry import REGISTRY, get
from ...errors import (
    ArgumentError,
    CheckpointError,
    DTypeError,
    GraphError,
    MLSysError,
    OutOfMemoryError,
    UnknownNameError,
)
from .mapping import OnnxImport

try:  # an optional dependency (the dev extra)
    import onnx
    from google.protobuf.message import DecodeError
    from onnx import helper, numpy_helper
except ImportError:  # pragma: no cover - exercised only where onnx is missing
    onnx = helper = numpy_helper = None
    DecodeError = ValueError

_DOMAINS = ("", "ai.onnx")


class StaticInputError(GraphError):
    """A node needs the value of a graph input at import time (a Reshape's target shape, a
    Slice's bounds): mlsys_lab graphs have static shapes. ``input_name`` names the input;
    pass its value in ``import_onnx(..., static_inputs={name: value})``."""

    def __init__(self, message, input_name):
        super().__init__(message)
        self.input_name = input_name


# --- ONNX ops that only make constants -------------------------------------------------------
def _constant(ctx, node, a):
    keys = [k for k in a if a[k] is not None]
    if len(keys) != 1:
        ctx.fail(node, f"expects exactly one value attribute, got {keys}")
    key, v = keys[0], a[keys[0]]
    if key in ("value", "sparse_value"):
        arr = v
    elif key in ("value_float", "value_int"):
        arr = np.asarray(v, np.float32 if key == "value_float" else np.int64)
    elif key in ("value_floats", "value_ints"):
        arr = np.asarray(v, np.float32 if key == "value_floats" else np.int64).reshape(-1)
    else:
        ctx.fail(node, f"attribute {key!r} (strings) is not supported")
    return [ctx.constant(arr)]


def _constant_of_shape(ctx, node, a):
    shape = ctx.array(node, 0, "shape")
    value = a.get("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)
    if fill.size != 1:
        ctx.fail(node, f"attribute 'value' must hold one element, got {fill.size}")
    dims = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    if any(d < 0 for d in dims):
        ctx.fail(node, f"input 0 (shape) {list(dims)} has a negative dimension")
    return [ctx.constant(ctx.full(dims, fill[0], fill.dtype))]


def _shape(ctx, node, a):
    shape = ctx.input(node, 0).shape
    start, end = a.get("start", 0), a.get("end")
    return [ctx.constant(np.asarray(shape[start:end], np.int64))]


def _size(ctx, node, a):
    return [ctx.constant(np.asarray(int(np.prod(ctx.input(node, 0).shape)), np.int64))]


#: ONNX ops evaluated at import time: their results are constants, so no registry op is needed.
CONSTANT_MAKERS = (
    OnnxImport("Constant", _constant, ("value", "value_float", "value_floats", "value_int",
                                       "value_ints", "value_string", "value_strings",
                                       "sparse_value")),
    OnnxImport("ConstantOfShape", _constant_of_shape, ("value",)),
    OnnxImport("Shape", _shape, ("start", "end")),
    OnnxImport("Size", _size, ()),
)


def importers():
    """ONNX op type -> (:class:`OnnxImport`, the registry op name or None for the constant
    makers), derived from the registry's ``Op.onnx`` records."""
    table = {imp.op_type: (imp, None) for imp in CONSTANT_MAKERS}
    for name in sorted(REGISTRY):
        mapping = REGISTRY[name].onnx
        for imp in (mapping.imports if mapping is not None else ()):
            if imp.op_type in table:
                other = table[imp.op_type][1] or "the constant makers"
                raise GraphError(f"ONNX op {imp.op_type} is imported by both {other} and {name}")
            table[imp.op_type] = (imp, name)
    return table


def supported_onnx_ops():
    """The ONNX op types that import to registry ops (the constant makers excluded), sorted."""
    return sorted(t for t, (_, op) in importers().items() if op is not None)


# --- the context an importer emits through ---------------------------------------------------
class OnnxNode:
    """One ONNX node as importers see it: ``op_type``, ``name``, ``inputs`` and ``outputs``
    (tensor names, '' for an absent optional one) and its position ``index``."""

    __slots__ = ("op_type", "name", "inputs", "outputs", "index")

    def __init__(self, proto, index):
        self.op_type, self.name, self.index = proto.op_type, proto.name, index
        self.inputs, self.outputs = list(proto.input), list(proto.output)

    def label(self):
        named = f" {self.name!r}" if self.name else ""
        return f"ONNX node #{self.index} {self.op_type}{named}"


class ImportContext:
    """The importer's side of a model being read: ONNX names bound to graph values, the
    constants, the emitted registry nodes and the model's opset.

    Attributes:
        opset: the version of the default ONNX domain the model imports.
    """

    def __init__(self, opset, uses, graph_outputs=()):
        self.opset = opset
        self._absorbed = set()
        self._computed = {}  # id(Value) -> array, for node outputs evaluated at import time
        self._graph_outputs = frozenset(graph_outputs)
        self.env = {}  # ONNX tensor name -> Value
        self.consts = {}  # Value -> ndarray
        self.nodes = []
        self._producer = {}  # id(Value) -> Node
        self._onnx_name = {}  # id(Value) -> ONNX tensor name
        self._uses = uses  # ONNX tensor name -> number of readers (graph outputs included)
        self._count = 0
        self.source = ""

    # --- reading inputs -------------------------------------------------------------------
    def input(self, node, i):
        """The value of input ``i`` of ``node``, or None when it is absent (optional)."""
        if i >= len(node.inputs) or not node.inputs[i]:
            return None
        return self.env[node.inputs[i]]

    def inputs(self, node):
        """The values of every present input of ``node``."""
        return [self.env[n] for n in node.inputs if n]

    def array(self, node, i, what):
        """Input ``i`` of ``node`` as a constant array (None when absent), for inputs whose
        value decides shapes (``what`` names it in errors).

        Raises:
            StaticInputError: the input is a graph input (its value is known only at run time).
            GraphError: the input is computed by a node.
        """
        v = self.input(node, i)
        if v is None:
            return None
        if v in self.consts:
            return self.consts[v]
        name = node.inputs[i]
        source = self._graph_input_behind(v)
        if source is not None:
            via = "is" if source is v else "is computed from"
            raise StaticInputError(
                f"import_onnx: {node.label()}: input {i} ({what}) {name!r} {via} the graph "
                f"input {source.name!r}, but mlsys_lab needs its value at import time (graphs "
                f"have static shapes); pass import_onnx(..., static_inputs="
                f"{{{source.name!r}: value}})", source.name)
        return self._evaluate(v)

    def _evaluate(self, value):
        """The array of ``value``, computed by a chain of nodes from constants only: run them
        now (each is marked absorbed: the graph keeps it only if something else reads it)."""
        if value in self.consts:
            return self.consts[value]
        if id(value) not in self._computed:
            node = self._producer[id(value)]
            args = [self._evaluate(v) for v in node.inputs]
            what = f"import_onnx: {node.source or 'a constant'}: {node.op}"
            if get(node.op).view is None:  # a view's output shares its input's memory
                check_allocation(what, value.shape, value.dtype)
            try:
                self._computed[id(value)] = run_kernel(get(node.op), args, node.attrs)
            except MLSysError as e:
                if not is_memory_error(e) or isinstance(e, OutOfMemoryError):
                    raise
                raise out_of_memory(what, value.shape, value.dtype, f" ({e.__cause__})"
                                    ) from e.__cause__
            self.absorb(node)
        return self._computed[id(value)]

    def _graph_input_behind(self, value):
        """The first graph input that ``value`` is (or is computed from), else None."""
        stack, seen = [value], set()
        while stack:
            v = stack.pop()
            if id(v) in seen or v in self.consts:
                continue
            seen.add(id(v))
            node = self._producer.get(id(v))
            if node is None:
                return v
            stack.extend(reversed(node.inputs))
        return None

    # --- making values --------------------------------------------------------------------
    def _new_value(self, shape, dtype):
        self._count += 1
        return Value(f"t{self._count}", shape, dtype)

    def full(self, shape, fill, dtype):
        """A new array of ``shape`` and ``dtype`` holding ``fill``, for a constant made at
        import time (``ConstantOfShape``, an empty reduction's identity, a mask).

        Raises:
            OutOfMemoryError: the array is larger than this machine's memory, or numpy cannot
                allocate it; the message names the ONNX node, the shape and the bytes.
        """
        what = f"import_onnx: {self.source or 'a constant'}"
        check_allocation(what, shape, dtype)
        try:
            return np.full(shape, fill, dtype)
        except MemoryError as e:
            raise out_of_memory(what, shape, dtype, f" ({e})") from None

    def constant(self, array):
        """A constant value holding ``array``."""
        arr = np.asarray(array)
        check_dtype(arr.dtype, f"import_onnx: {self.source or 'a constant'}")
        v = self._new_value(arr.shape, arr.dtype)
        self.consts[v] = arr
        return v

    def emit(self, op_name, *inputs, **attrs):
        """Apply registry op ``op_name`` to ``inputs`` (values, or arrays and Python numbers
        that become constants) with ``attrs``; returns the output value (checked with the op's
        shape rule)."""
        op = get(op_name)
        vals = [x if isinstance(x, Value) else self.constant(x) for x in inputs]
        if not op.storage and any(v.dtype == dtypes.bfloat16 for v in vals):
            return self._in_float32(op_name, vals, attrs)
        try:
            aval = op.infer(*[v.aval for v in vals], **attrs)
        except MLSysError as e:
            raise type(e)(f"import_onnx: {self.source}: {e}") from None
        out = self._new_value(aval.shape, aval.dtype)
        node = Node(op_name, vals, attrs, [out], source=self.source)
        self.nodes.append(node)
        self._producer[id(out)] = node
        return out

    def _in_float32(self, op_name, vals, attrs):
        """``op_name`` on bfloat16 values as ONNX's reference runtime computes it: the inputs
        widened to float32, the op computed there and a float32 result rounded back to
        bfloat16 (bfloat16 is a storage dtype: no registry op computes in it)."""
        wide = [self.emit("cast", v, dtype=dtypes.float32) if v.dtype == dtypes.bfloat16
                else v for v in vals]
        out = self.emit(op_name, *wide, **attrs)
        return self.emit("cast", out, dtype=dtypes.bfloat16) if out.dtype == dtypes.float32 \
            else out

    def prepare(self, op_name, *inputs, **attrs):
        """:meth:`emit` for preparing a parameter inside a decomposition (a Conv bias reshaped
        to broadcast, batch norm's scale and shift, a Gemm weight transposed): folded into a
        constant at once when every input is a constant, so an imported model's weights stay
        constants; else a node, as :meth:`emit` makes."""
        vals = [x if isinstance(x, Value) else self.constant(x) for x in inputs]
        out = self.emit(op_name, *vals, **attrs)
        if all(v in self.consts for v in vals) and not get(op_name).impure:
            arr = self._evaluate(out)
            self.nodes.pop()
            return self.constant(arr)
        return out

    # --- peepholes --------------------------------------------------------------------------
    def producer(self, value):
        """The registry node that computes ``value`` (None for inputs and constants)."""
        return self._producer.get(id(value))

    def single_use(self, value):
        """Whether ``value`` is an ONNX tensor read by exactly one node (and no graph output):
        an importer may then fold its producer into its own node (the producer, left
        unread, is dropped at the end)."""
        name = self._onnx_name.get(id(value))
        return name is not None and self._uses[name] == 1

    @staticmethod
    def numpy_dtype(code, where):
        """The numpy dtype of ONNX element type ``code`` (a supported one, else DTypeError)."""
        return element_dtype(code, where)

    def uses(self, value):
        """How many ONNX node inputs (and graph outputs) read ``value`` (0 if it is no ONNX
        tensor of its own)."""
        name = self._onnx_name.get(id(value))
        return 0 if name is None else self._uses[name]

    def uses_name(self, name):
        """How many ONNX node inputs (and graph outputs) read the tensor called ``name``."""
        return self._uses[name]

    def absorb(self, *nodes):
        """Mark emitted ``nodes`` as folded into a later one by a peephole: they are dropped at
        the end if nothing else reads them (any other unread node stays, as in the model)."""
        self._absorbed.update(map(id, nodes))

    def is_graph_output(self, name):
        """Whether the ONNX tensor ``name`` is one of the graph's outputs."""
        return name in self._graph_outputs

    def fail(self, node, reason):
        """Raise the error for something this importer does not support."""
        raise ArgumentError(f"import_onnx: {node.label()}: {reason}")

    def bind(self, name, value, fresh):
        """Give ONNX tensor ``name`` the value ``value`` (renamed after it when ``fresh``)."""
        if fresh:
            value.name = name
            self._onnx_name[id(value)] = name
        self.env[name] = value


def check_dtype(dtype, where):
    """Refuse a dtype mlsys_lab has no support for, naming ``where``."""
    dt = np.dtype(dtype)
    if dt not in dtypes.SUPPORTED:
        raise DTypeError(f"{where}: dtype {dt} is not supported by mlsys_lab (supported: "
                         f"{', '.join(d.name for d in dtypes.SUPPORTED)})")
    return dt


# --- reading the model -----------------------------------------------------------------------
def load_model(source):
    """An ``onnx.ModelProto`` from a path, bytes or a ModelProto, checked by onnx's checker.

    Raises:
        CheckpointError: the file is missing, truncated or not a valid ONNX model.
    """
    require = "import_onnx"
    if onnx is None:
        raise ImportError(f"{require} needs the onnx package: pip install onnx")
    if isinstance(source, onnx.ModelProto):
        model = source
    else:
        if isinstance(source, (bytes, bytearray)):
            data, where = bytes(source), "the bytes given"
        else:
            path = pathlib.Path(source)
            if not path.is_file():
                raise CheckpointError(f"import_onnx: no file {str(path)!r}")
            data, where = path.read_bytes(), repr(str(path))
        model = onnx.ModelProto()
        try:
            model.ParseFromString(data)
        except (DecodeError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"import_onnx: {where} is not an ONNX model (truncated or "
                                  f"corrupted: {e})") from None
        if not model.HasField("graph"):
            raise CheckpointError(f"import_onnx: {where} holds no ONNX graph (truncated, or not "
                                  f"an ONNX file)")
    try:
        onnx.checker.check_model(model)
    except UnicodeDecodeError as e:
        raise CheckpointError(f"import_onnx: the model holds a string that is not UTF-8 "
                              f"(corrupted: {e})") from None
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"import_onnx: the model is not valid ONNX: {first}") from None
    return model


def _opset(model):
    for o in model.opset_import:
        if o.domain in _DOMAINS:
            return int(o.version)
    raise CheckpointError("import_onnx: the model imports no version of the default ONNX domain")


def _static_shape(info, input_shapes):
    """The static shape of graph input ``info`` (overridden by ``input_shapes[name]``)."""
    if info.name in input_shapes:
        return tuple(int(d) for d in input_shapes[info.name])
    dims = []
    for i, d in enumerate(info.type.tensor_type.shape.dim):
        if not d.HasField("dim_value"):
            sym = d.dim_param or "?"
            raise GraphError(f"import_onnx: input {info.name!r} has a symbolic dimension "
                             f"{sym!r} at axis {i}; mlsys_lab graphs have static shapes: pass "
                             f"import_onnx(..., input_shapes={{{info.name!r}: (...)}})")
        dims.append(int(d.dim_value))
    return tuple(dims)


def _tensor_dtype(info, where):
    kind = info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise DTypeError(f"import_onnx: {where} {info.name!r} is a {kind or 'untyped'} value; "
                         f"mlsys_lab imports tensors only")
    return element_dtype(info.type.tensor_type.elem_type, f"import_onnx: {where} {info.name!r}")


def element_dtype(code, where):
    """The numpy dtype of ONNX element type ``code``, if mlsys_lab supports it.

    Raises:
        DTypeError: an element type mlsys_lab lacks, or no ONNX element type at all.
    """
    try:
        dt = helper.tensor_dtype_to_np_dtype(int(code))
    except (KeyError, ValueError, TypeError):
        raise DTypeError(f"{where}: unknown ONNX element type {code!r}") from None
    return check_dtype(dt, where)


def _attributes(proto, node, imp):
    """The node's attributes as Python values, refusing any the importer does not handle."""
    out = {}
    for a in proto.attribute:
        if a.name not in imp.attrs:
            known = ", ".join(imp.attrs) or "none"
            raise ArgumentError(f"import_onnx: {node.label()}: attribute {a.name!r} is not "
                                f"supported by the {node.op_type} import (supported: {known})")
        v = helper.get_attribute_value(a)
        if a.type == onnx.AttributeProto.TENSOR:
            element_dtype(v.data_type, f"import_onnx: {node.label()}: attribute {a.name!r}")
            try:
                v = numpy_helper.to_array(v)
            except (ValueError, TypeError, KeyError) as e:
                raise CheckpointError(f"import_onnx: {node.label()}: attribute {a.name!r} holds "
                                      f"a corrupted tensor ({e})") from None
        elif a.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.SPARSE_TENSORS):
            raise ArgumentError(f"import_onnx: {node.label()}: sparse tensor attribute "
                                f"{a.name!r} is not supported")
        elif a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            raise ArgumentError(f"import_onnx: {node.label()}: subgraph attribute {a.name!r} "
                                f"is not supported")
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
        out[a.name] = v
    return out


def _uses(graph):
    uses = Counter(n for node in graph.node for n in node.input if n)
    uses.update(o.name for o in graph.output)
    return uses


def _bind_inputs(ctx, graph, input_shapes, static_inputs):
    inits = {t.name for t in graph.initializer}
    for t in graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            raise CheckpointError(f"import_onnx: initializer {t.name!r} keeps its data in an "
                                  f"external file, which mlsys_lab does not read")
        element_dtype(t.data_type, f"import_onnx: initializer {t.name!r}")
        try:
            arr = numpy_helper.to_array(t)
        except (ValueError, TypeError, KeyError) as e:
            raise CheckpointError(f"import_onnx: initializer {t.name!r} is corrupted ({e})"
                                  ) from None
        ctx.bind(t.name, ctx.constant(arr), True)
    if len(graph.sparse_initializer):
        raise ArgumentError("import_onnx: sparse initializers are not supported")
    inputs = []
    for info in graph.input:
        if info.name in inits:
            continue  # an initializer listed as an input (IR < 4): its value is the default
        dtype = _tensor_dtype(info, "input")
        if info.name in static_inputs:
            arr = np.asarray(static_inputs[info.name], dtype)
            ctx.bind(info.name, ctx.constant(arr), True)
            continue
        v = Value(info.name, _static_shape(info, input_shapes), dtype)
        ctx.env[info.name] = v
        inputs.append(v)
    unknown = set(static_inputs) | set(input_shapes)
    unknown -= {i.name for i in graph.input}
    if unknown:
        raise ArgumentError(f"import_onnx: the model has no inputs named {sorted(unknown)}; its "
                            f"inputs: {[i.name for i in graph.input]}")
    return inputs


def _import_node(ctx, table, proto, index):
    node = OnnxNode(proto, index)
    ctx.source = node.label()
    if proto.domain not in _DOMAINS:
        raise UnknownNameError(f"import_onnx: {node.label()}: domain {proto.domain!r} is not "
                               f"supported (only the default ONNX domain)")
    if node.op_type not in table:
        raise UnknownNameError(
            f"import_onnx: {node.label()}: no mlsys_lab op imports the ONNX op "
            f"{node.op_type!r}; ONNX ops with a mapping: {', '.join(sorted(table))}")
    for name in node.inputs:
        if name and name not in ctx.env:
            raise GraphError(f"import_onnx: {node.label()} reads {name!r}, which no input, "
                             f"initializer or earlier node defines (the nodes must be in "
                             f"topological order)")
    imp = table[node.op_type][0]
    before = len(ctx.nodes), set(map(id, ctx.consts))
    attrs = _attributes(proto, node, imp)
    try:
        outs = imp.convert(ctx, node, attrs)
    except OutOfMemoryError:
        raise
    except (MemoryError, MLSysError) as e:  # an allocation no check saw coming
        if not is_memory_error(e):
            raise
        cause = e.__cause__ if isinstance(e, MLSysError) else e
        raise OutOfMemoryError(f"import_onnx: {node.label()}: out of memory evaluating the "
                               f"node at import time ({type(cause).__name__}: {cause})"
                               ) from cause
    fresh = {id(n.output) for n in ctx.nodes[before[0]:]}
    fresh |= set(map(id, ctx.consts)) - before[1]
    for i, name in enumerate(node.outputs):
        if not name:
            continue
        if i >= len(outs) or outs[i] is None:
            if ctx._uses[name]:
                ctx.fail(node, f"output {i} ({name!r}) is not supported")
            continue
        ctx.bind(name, outs[i], id(outs[i]) in fresh and id(outs[i]) not in ctx._onnx_name)


def _declared_type_check(graph_proto, ctx, outputs):
    for info, v in zip(graph_proto.output, outputs):
        if info.type.WhichOneof("value") != "tensor_type":
            continue
        tt = info.type.tensor_type
        declared = element_dtype(tt.elem_type, f"import_onnx: output {info.name!r}") \
            if tt.elem_type else v.dtype
        if declared != v.dtype:
            raise GraphError(f"import_onnx: output {info.name!r} is declared {declared} but "
                             f"the imported graph computes {v.dtype}")
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if tt.HasField("shape") and (len(dims) != len(v.shape) or any(
                d is not None and d != s for d, s in zip(dims, v.shape))):
            raise GraphError(f"import_onnx: output {info.name!r} is declared with shape "
                             f"{dims} but the imported graph computes {list(v.shape)}")


def _drop_absorbed(nodes, outputs, absorbed):
    """``nodes`` less those a peephole folded into a later node and nothing else reads."""
    live = set(map(id, outputs))
    kept = []
    for n in reversed(nodes):
        if id(n.output) in live or id(n) not in absorbed:
            kept.append(n)
            live.update(map(id, n.inputs))
    return kept[::-1]


def import_onnx(source, *, input_shapes=None, static_inputs=None, name=None):
    """Read an ONNX model into a Graph of registry ops, ready for ``graph(*inputs)``,
    ``ml.compile(graph, *inputs)`` and the passes.

    Args:
        source: a path to an ``.onnx`` file, its bytes, or an ``onnx.ModelProto``.
        input_shapes: ``{input name: shape}`` for inputs with symbolic dimensions (a batch
            size), or to override the declared shape.
        static_inputs: ``{input name: array}`` for graph inputs whose value must be known at
            import time (a Reshape's target shape fed as an input): they become constants.
        name: the graph's name (default: the ONNX graph's).

    Returns:
        A linted :class:`Graph`; its inputs are the model's non-constant inputs, in order.

    Raises:
        CheckpointError: the file is missing, truncated or not valid ONNX.
        UnknownNameError: an ONNX op type without a mapping (naming the node).
        ArgumentError: an attribute or attribute value without a mapping (naming the node).
        DTypeError: a dtype mlsys_lab does not support.
        StaticInputError: a graph input whose value is needed at import time.
        OutOfMemoryError: a value computed at import time (``ConstantOfShape``, a shape
            computation) is larger than this machine's memory or cannot be allocated; the
            message names the ONNX node, the shape and the bytes.
    """
    model = load_model(source)
    g = model.graph
    ctx = ImportContext(_opset(model), _uses(g), [o.name for o in g.output])
    table = importers()
    inputs = _bind_inputs(ctx, g, dict(input_shapes or {}), dict(static_inputs or {}))
    for index, proto in enumerate(g.node):
        _import_node(ctx, table, proto, index)
    outputs = []
    for info in g.output:
        if info.name not in ctx.env:
            raise GraphError(f"import_onnx: output {info.name!r} is never computed")
        outputs.append(ctx.env[info.name])
    _declared_type_check(g, ctx, outputs)
    nodes = _drop_absorbed(ctx.nodes, outputs, ctx._absorbed)
    graph = Graph(inputs, nodes, outputs, ctx.consts, name=name or g.name or "onnx_model")
    used = {id(v) for n in nodes for v in n.inputs} | set(map(id, outputs))
    graph.consts = {v: a for v, a in ctx.consts.items() if id(v) in used}
    return graph.relink().lint()


__all__ = ["import_onnx", "load_model", "supported_onnx_ops", "importers", "StaticInputError",
           "ImportContext"]
