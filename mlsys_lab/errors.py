"""The library's own exceptions.

Each subclasses the matching Python built-in, so ``except ValueError`` still works, and each
message names the op, the shapes or dtypes involved and, for traced code, the user's line.
"""


class MLSysError(Exception):
    """Base class of every mlsys_lab error."""


class ShapeError(MLSysError, ValueError):
    """Operands have shapes an op cannot accept."""


class DTypeError(MLSysError, TypeError):
    """Operands have dtypes an op cannot accept."""


class GraphError(MLSysError, RuntimeError):
    """A graph is malformed (not SSA, cyclic, mistyped) or was used in a way it cannot be."""


class CycleError(GraphError):
    """A dependency graph has a cycle; ``.cycle`` lists the nodes on it."""

    def __init__(self, message, cycle=()):
        super().__init__(message)
        self.cycle = list(cycle)


class TraceError(MLSysError, TypeError):
    """Tracing met Python that needs a concrete value (``if`` on a traced tensor, ``.numpy()``)."""


class CheckpointError(MLSysError, ValueError):
    """A checkpoint file is truncated, corrupted or does not match the model."""


class OpError(MLSysError, RuntimeError):
    """An op's kernel failed on inputs its shape/dtype rule accepted."""
