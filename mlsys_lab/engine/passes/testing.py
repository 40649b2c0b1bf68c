"""Helpers for tests and notebooks: running a graph with a device's kernels (:func:`run_graph`)
and measuring float differences in ulps (:func:`ulp_distance`).

The random-graph generator lives in :mod:`mlsys_lab.engine.random_graphs`; its names are
re-exported here, where tests, chapters and exercises first imported them.
"""

import numpy as np

from ..interpreter import Interpreter
from ..random_graphs import (  # noqa: F401 - re-exported
    BINARY,
    LITERALS,
    SHAPES,
    UNARY,
    bind_inputs,
    random_graph,
    random_program,
)


def run_graph(graph, *args, device=None):
    """Run ``graph`` on numpy arrays and return its outputs as a list of arrays.

    With ``device`` (e.g. ``"cpu-numba"``), a node runs the kernel operator selection would give
    it on that device (``selection.kernel_for``: the device's most preferred kernel that accepts
    the node); a node with none runs the op's numpy ``compute``. Inputs are checked (one
    argument per graph input, of its shape and dtype), each intermediate array is released
    after its last reader, and a failing node is named: the
    :class:`~mlsys_lab.engine.interpreter.Interpreter` does all three.
    """
    return DeviceInterpreter(graph, device).run_flat(list(args))


class DeviceInterpreter(Interpreter):
    """The Interpreter with ``device``'s registered kernels where they accept a node (the op's
    numpy kernel elsewhere, and everywhere when ``device`` is None)."""

    def __init__(self, graph, device=None):
        super().__init__(graph)
        self.device = device

    def run_node(self, node, args):
        from ..selection import call_kernel, kernel_for

        kernel = kernel_for(node, self.device) if self.device else None
        if kernel is None:
            return super().run_node(node, args)
        return call_kernel(kernel, node, args)


def ulp_distance(a, b):
    """Elementwise distance between two float arrays of one dtype in ulps: how many
    representable values lie between them (``-0.`` and ``+0.`` are 1 apart, the smallest
    subnormal is 1 from zero, ``inf`` is 1 above the largest finite value). Two NaNs are 0
    apart, a NaN and a number ``inf``.

    Returns:
        A float64 array of the broadcast shape (exact up to 2**53 ulps).
    """
    a, b = np.broadcast_arrays(np.asarray(a), np.asarray(b))
    if a.dtype != b.dtype or a.dtype.kind != "f":
        raise TypeError(f"ulp_distance: expects two float arrays of one dtype, got {a.dtype} "
                        f"and {b.dtype}")
    ints = np.dtype(f"i{a.dtype.itemsize}")
    mask = np.iinfo(ints).max

    def ordered(x):  # the bit pattern as an int that grows with the float's value
        bits = np.ascontiguousarray(x).view(ints).astype(np.int64)
        return np.where(bits < 0, -(bits & mask) - 1, bits)

    ka, kb = ordered(a), ordered(b)
    hi, lo = np.maximum(ka, kb).astype(np.uint64), np.minimum(ka, kb).astype(np.uint64)
    d = (hi - lo).astype(np.float64)  # modular uint64 arithmetic: exact, no overflow
    na, nb = np.isnan(a), np.isnan(b)
    d[na | nb] = np.inf
    d[na & nb] = 0.0
    return d
