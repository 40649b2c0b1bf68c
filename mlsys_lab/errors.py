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


class RankError(ShapeError, TypeError):
    """A tensor of the wrong rank or size where Python needs a number or a sequence:
    ``float()``, ``int()``, ``bool()`` or ``.item()`` of a tensor with more than one element,
    ``len()`` or ``iter()`` of a 0-d tensor. Also a TypeError, which Python's protocols (and
    numpy) raise there."""


class ArgumentError(MLSysError, ValueError):
    """An argument that is not a tensor has a value the call cannot take: a position out of
    range (``argnums``, ``wrt``), a probability outside [0, 1], a seed outside the generator's
    range, a count that does not match another argument's."""


class UnknownNameError(ArgumentError, KeyError):
    """A name that no table holds: an op, a device, a pass, a memory-planning strategy. The
    message lists the known names. A KeyError too, as the lookup it replaces."""

    __str__ = Exception.__str__  # KeyError's would quote the whole message


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


class TapeError(MLSysError, TypeError):
    """A numpy function met a Tensor that is being differentiated: its result would silently
    drop off the autodiff tape (use the ``ml.ops`` function, or ``np.asarray(t)`` to leave the
    tape on purpose)."""


class DTypeOverflowError(DTypeError, OverflowError):
    """A value does not fit in the dtype it must take (``2**63`` as int64, ``300`` next to a
    uint8 tensor). numpy 2 refuses these too; PyTorch wraps them silently."""


class OutOfMemoryError(MLSysError, MemoryError):
    """An allocation is larger than the machine can provide (names the shape and bytes)."""


class PlanError(MLSysError, ValueError):
    """A memory-planning request is invalid: a lifetime with a negative or too large size, an
    end before its start, or a non-integer field."""


class RecordError(MLSysError, ValueError):
    """A record file is truncated, corrupted or not a record file (names the file and record)."""


class PipelineError(MLSysError, RuntimeError):
    """A data-pipeline operator's function failed; ``.op`` and ``.index`` say which operator
    and item."""

    def __init__(self, message, op=None, index=None):
        super().__init__(message)
        self.op, self.index = op, index
