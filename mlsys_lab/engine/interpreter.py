"""One interpreter for the Graph IR, in the shape of torch.fx's ``Interpreter``.

``Interpreter(graph).run(*inputs)`` checks the inputs once (:func:`check_inputs`), runs every node
of ``schedule()`` through ``run_node(node, args)``, releases each intermediate as soon as its last
reader has run, and turns any failure into the library's error naming the node, its op and the
user's source line (:func:`node_error`). Everything that runs a graph node by node builds on it:

* ``Graph.__call__`` — :class:`TensorInterpreter`: ``run_node`` is the eager ``apply``, so a call
  records on the tape, or emits nodes when it happens inside a trace;
* ``runtime.run_serial`` / ``run_parallel`` / ``run_heterogeneous`` — numpy kernels, a timeline
  of :class:`~mlsys_lab.span.Span` records,
  a thread pool or simulated device streams driving :meth:`Interpreter.step`;
* ``runtime.run_graph`` — a device's registered kernels where they accept the node.

A subclass changes what one node does by overriding ``run_node``, the order by overriding
``schedule``, and what happens around a node (timing, locking) by wrapping ``step`` or driving
``fetch`` / ``call`` / ``store`` itself.
"""

import math
import os
from collections import Counter

import numpy as np

from ..errors import (
    DTypeError,
    DTypeOverflowError,
    GraphError,
    MLSysError,
    OpError,
    OutOfMemoryError,
    ShapeError,
)
from . import dtypes
from .pytree import flatten
from .registry import get
from .tensor import Tensor, apply, run_kernel

# --- the input check -----------------------------------------------------------------------------
_SCALARS = (bool, int, float, np.bool_, np.integer, np.floating)


def as_input(a, dtype, where="input"):
    """An argument as an array. Arrays (and Tensors) keep their dtype, checked afterwards;
    Python and numpy numbers, and lists of them, are weakly typed as next to a tensor: bools
    and integers take the input's dtype (an integer one for a bool input stays int64), floats
    take a floating input's dtype and stay floats otherwise (so ``1.5`` for an int input is
    refused, not truncated). ``where`` names the input in errors.

    Raises:
        DTypeError: ``a`` is None, a string or anything else that is not numeric data (numpy
            would turn None into NaN and ``"1.5"`` into 1.5 without a word).
        DTypeOverflowError: a number that does not fit in the dtype it takes (``300`` for a
            uint8 input).
    """
    dtype = np.dtype(dtype)
    arr = None
    if isinstance(a, _SCALARS):
        return dtypes.scalar_array(a, dtypes.weak_dtype(a, dtype), where)
    if isinstance(a, np.ndarray) or hasattr(a, "__array__") and not isinstance(a, (list, tuple)):
        arr = np.asarray(a)
    elif a is not None and not isinstance(a, (str, bytes)):
        try:
            arr = np.asarray(a)
            if arr.dtype.kind in "biuf":
                arr = np.asarray(a, _weak_kind(arr.dtype, dtype))
        except OverflowError as e:
            raise DTypeOverflowError(f"{where}: a value does not fit in {dtype.name} ({e})"
                                     ) from None
        except (TypeError, ValueError):
            arr = None
    if arr is None or arr.dtype.kind not in "biuf" and not dtypes.is_storage(arr.dtype):
        raise DTypeError(f"{where}: expected numeric data for a {dtype.name} input, got "
                         f"{type(a).__name__}" + (f" of dtype {arr.dtype}" if arr is not None
                                                  else ""))
    return arr


def _weak_kind(got, want):
    """The dtype weakly typed data that numpy reads as ``got`` takes for an input of ``want``."""
    if got.kind == "b" or got.kind in "iu" and want.kind != "b" or got.kind == want.kind == "f":
        return want
    return got


def check_input(graph_name, value, shape, dtype):
    """Raise ShapeError/DTypeError, naming the input, unless ``shape``/``dtype`` match it."""
    if tuple(shape) == value.shape and dtype == value.dtype:
        return
    got = f"{dtypes.short(dtype)}[{','.join(map(str, shape))}]"
    if tuple(shape) != value.shape:
        raise ShapeError(f"{graph_name}: input {value.name} expects {value.type_str()}, got {got}")
    raise DTypeError(f"{graph_name}: input {value.name} expects {value.type_str()}, got "
                     f"{got}; cast it first")


def check_inputs(graph, flat, convert=None):
    """The graph's one input check: ``flat`` (the arguments, flattened) as the values to run on.

    Args:
        graph: the graph about to run.
        flat: one argument per ``graph.inputs``.
        convert: ``convert(value, arg) -> array-like`` turns an argument into what the nodes
            compute on (default :func:`as_input`); the result's shape and dtype are checked.

    Raises:
        GraphError: the number of arguments is wrong.
        ShapeError, DTypeError: an argument does not match its input's type (named).
    """
    if len(flat) != len(graph.inputs):
        raise GraphError(f"{graph.name}: expects {len(graph.inputs)} inputs, got {len(flat)}")
    out = []
    for v, a in zip(graph.inputs, flat):
        a = convert(v, a) if convert else as_input(a, v.dtype, f"{graph.name}: input {v.name}")
        check_input(graph.name, v, a.shape, a.dtype)
        out.append(a)
    return out


# --- memory: refuse what cannot fit before allocating it ---------------------------------------
def _physical_memory():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        return None


#: The largest array, in bytes, that a graph runner (and the ONNX importer's import-time
#: evaluation) will try to allocate: this machine's physical memory, None where unknown. A
#: larger request could only succeed lazily (overcommitted pages) and the process be killed
#: when they are touched, so it is refused up front with :class:`OutOfMemoryError`.
MEMORY_LIMIT = _physical_memory()


def _gib(nbytes):
    return f"{nbytes:,} bytes ({nbytes / 2**30:,.1f} GiB)"


def array_bytes(shape, dtype):
    """The bytes of an array of ``shape`` and ``dtype``, in Python ints (never wraps)."""
    return math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize


def out_of_memory(what, shape, dtype, reason=""):
    """The :class:`OutOfMemoryError` for an array of ``shape`` and ``dtype`` that ``what``
    (an op, a node) cannot allocate: it names the shape, dtype and bytes, and ``reason``."""
    dims = tuple(int(d) for d in shape)
    return OutOfMemoryError(f"{what}: cannot allocate shape {dims} of {np.dtype(dtype)}: "
                            f"{_gib(array_bytes(dims, dtype))}{reason}")


def check_allocation(what, shape, dtype):
    """Raise :func:`out_of_memory` when an array of ``shape`` and ``dtype`` is larger than
    :data:`MEMORY_LIMIT` (this machine's physical memory); return its bytes otherwise."""
    nbytes = array_bytes(shape, dtype)
    limit = MEMORY_LIMIT
    if limit is not None and nbytes > limit:
        raise out_of_memory(what, shape, dtype, f", more than this machine's {_gib(limit)} of "
                                                f"memory")
    return nbytes


def is_memory_error(e):
    """Whether ``e`` is an allocation failure: a ``MemoryError``, numpy's "array is too big"
    ``ValueError``, or the :class:`OpError` a kernel raised for either."""
    if isinstance(e, OpError):
        e = e.__cause__
    return isinstance(e, MemoryError) or (
        isinstance(e, ValueError) and "array is too big" in str(e))


def _oversize_outputs(node):
    """The first output of ``node`` that :func:`check_allocation` refuses, with its error;
    None when every output fits. A view op's output shares its input's memory: never refused."""
    if get(node.op).view is not None:
        return None
    for v in node.outputs:
        try:
            check_allocation(node.op, v.shape, v.dtype)
        except OutOfMemoryError as e:
            return e
    return None


# --- the error -----------------------------------------------------------------------------------
def node_error(e, node):
    """The library error to raise for ``e``, raised while running graph ``node``.

    A library error keeps its type and gains ``while running node #i <op>`` and the user's line;
    any other exception (a kernel's ``ZeroDivisionError``, numpy's ``ValueError``) becomes an
    :class:`~mlsys_lab.errors.OpError` naming the op and its input types. An allocation failure
    (:func:`is_memory_error`: numpy's ``MemoryError``, also when a kernel wrapped it in an
    ``OpError``) becomes an :class:`~mlsys_lab.errors.OutOfMemoryError` naming the op, its
    output shapes and their bytes. Raise it ``from`` :func:`error_cause` ``(e)``.
    """
    where = f"\n  while running node #{node.id} {node.op}"
    if node.source:
        where += f"\n  at {node.source}"
    if is_memory_error(e) and not isinstance(e, OutOfMemoryError):
        outs = ", ".join(f"{v.dtype}{list(v.shape)}" for v in node.outputs)
        nbytes = sum(array_bytes(v.shape, v.dtype) for v in node.outputs)
        cause = e.__cause__ if isinstance(e, OpError) else e
        return OutOfMemoryError(f"{node.op}: out of memory computing {outs}: {_gib(nbytes)} "
                                f"({type(cause).__name__}: {cause}){where}")
    if isinstance(e, MLSysError):
        return type(e)(f"{e}{where}")
    shapes = ", ".join(f"{v.dtype}{list(v.shape)}" for v in node.inputs)
    return OpError(f"{node.op}: kernel failed on inputs ({shapes}): {type(e).__name__}: "
                   f"{e}{where}")


def error_cause(e):
    """What :func:`node_error`'s result is raised from: the original exception of a kernel
    failure, the cause a library error already had (usually None)."""
    return e.__cause__ if isinstance(e, MLSysError) else e


# --- the interpreter -----------------------------------------------------------------------------
class Interpreter:
    """Runs a Graph node by node on numpy arrays.

    Args:
        graph: the graph to run.
        free: release each intermediate value once its last reader has run (a runtime would
            reuse its memory); ``False`` keeps every value in ``env``.

    Attributes:
        env: ``id(value) -> its current value`` during (and after) a run.
    """

    def __init__(self, graph, free=True):
        self.graph = graph
        self.free = free
        self.env = {}
        self._readers = {}
        self._keep = frozenset()
        self._oversize = {}

    # --- what a subclass overrides --------------------------------------------------------------
    def schedule(self):
        """The nodes in the order they run: the graph's own (a topological order)."""
        return self.graph.nodes

    def convert_input(self, value, arg):
        """``arg``, the argument for input ``value``, as what the nodes compute on (checked
        against ``value``'s type afterwards)."""
        return as_input(arg, value.dtype, f"{self.graph.name}: input {value.name}")

    def load_const(self, value, array):
        """A constant of the graph as what the nodes compute on."""
        return array

    def run_node(self, node, args):
        """The result of ``node`` on its input values ``args``: its op's numpy kernel, checked
        against the op's shape/dtype rule."""
        return run_kernel(get(node.op), args, node.attrs)

    def allocates(self, node, args):
        """Whether ``run_node(node, args)`` allocates ``node``'s outputs (so that one larger
        than :data:`MEMORY_LIMIT` is refused before it runs)."""
        return True

    # --- running --------------------------------------------------------------------------------
    def run(self, *args):
        """Run the graph on ``args`` (nested as the graph's inputs were traced); returns the list
        of output values, in ``graph.outputs`` order."""
        flat, _ = flatten(args)
        return self.run_flat(flat)

    def run_flat(self, flat):
        """:meth:`run` on arguments already flattened into ``graph.inputs`` order."""
        self.bind(flat)
        step = self.step
        for node in self.schedule():
            step(node)
        return self.outputs()

    def bind(self, flat):
        """Check the arguments and start a run: ``env`` holds the inputs and constants."""
        g = self.graph
        values = check_inputs(g, flat, self.convert_input)
        self.env = env = {id(v): a for v, a in zip(g.inputs, values)}
        for v, arr in g.consts.items():
            env[id(v)] = self.load_const(v, arr)
        readers = Counter(id(v) for n in g.nodes for v in n.inputs)
        self._readers = readers
        self._keep = frozenset(map(id, g.outputs))
        self._oversize = {} if MEMORY_LIMIT is None else {  # refused before allocating
            id(n): e for n in g.nodes if (e := _oversize_outputs(n))}
        return env

    def step(self, node):
        """Run one node: fetch its inputs, run it, store its outputs; returns its result."""
        result = self.call(node, self.fetch(node))
        self.store(node, result)
        return result

    def fetch(self, node):
        """The current values of ``node``'s inputs."""
        env = self.env
        return [env[id(v)] for v in node.inputs]

    def call(self, node, args):
        """``run_node(node, args)``, any failure raised as :func:`node_error`.

        Raises:
            OutOfMemoryError: the node's output is larger than this machine's memory
                (:data:`MEMORY_LIMIT`; checked before running it) or numpy could not allocate
                it; the message names the node, its op, the shape and the bytes.
        """
        if self._oversize and id(node) in self._oversize and self.allocates(node, args):
            raise node_error(self._oversize[id(node)], node) from None
        try:
            return self.run_node(node, args)
        except Exception as e:
            raise node_error(e, node) from error_cause(e)

    def store(self, node, result):
        """Record ``node``'s result (a tuple for a node with several outputs) and release the
        values no later node reads."""
        env, outs = self.env, node.outputs
        if len(outs) == 1:
            env[id(outs[0])] = result
        else:
            for o, r in zip(outs, result, strict=True):
                env[id(o)] = r
        if not self.free:
            return
        readers, keep = self._readers, self._keep
        for v in node.inputs:
            k = id(v)
            left = readers[k] = readers[k] - 1
            if not left and k not in keep:
                env.pop(k, None)
        for o in outs:  # a result nothing reads (dead code) goes at once
            if id(o) not in readers and id(o) not in keep:
                env.pop(id(o), None)

    def outputs(self):
        """The output values of the run, in ``graph.outputs`` order."""
        return [self.env[id(v)] for v in self.graph.outputs]


class TensorInterpreter(Interpreter):
    """The interpreter behind ``Graph.__call__``: every node goes through the eager ``apply``,
    so a call records on the autodiff tape (and, inside ``ml.trace``, emits the graph's nodes
    into the new trace). Inputs and outputs are Tensors."""

    def convert_input(self, value, arg):
        if isinstance(arg, Tensor):
            return arg
        return Tensor._wrap(super().convert_input(value, arg))

    def load_const(self, value, array):
        return Tensor._wrap(array)

    def run_node(self, node, args):
        return apply(get(node.op), *args, **node.attrs)

    def allocates(self, node, args):
        """Not while tracing: a node with a traced input is emitted, not computed."""
        return all(a.data is not None for a in args)
