"""The pieces every op's ONNX mapping is built from: the mapping records stored on the registry
(``Op.onnx``: :class:`OnnxMapping`, :class:`OnnxImport`), :func:`register_onnx`, the support
table, and the export / import helpers the op families share (:mod:`.ops_elementwise`,
:mod:`.ops_shape`, :mod:`.ops_nn`, :mod:`.qdq`; importing :mod:`mlsys_lab.deploy.onnx` loads
them all).

Exporter: ``export(ctx, node)`` writes ONNX nodes ending in ``ctx.name(node.output)``.
Importer: ``OnnxImport(op_type, convert, attrs)`` with ``convert(ctx, onnx_node, attrs) ->
[values]``; ``attrs`` lists the ONNX attributes it understands (any other is an error), and
it emits registry ops with ``ctx.emit``. This module needs no onnx package.
"""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...engine import dtypes
from ...engine.registry import REGISTRY, get

INT64_MAX = np.iinfo(np.int64).max
INT64_MIN = np.iinfo(np.int64).min


@dataclass(frozen=True)
class OnnxImport:
    """How one ONNX op type becomes registry ops.

    Attributes:
        op_type: the ONNX op type (``"Conv"``).
        convert: ``convert(ctx, onnx_node, attrs) -> [value per ONNX output]``.
        attrs: the ONNX attribute names ``convert`` handles; any other is refused.
    """

    op_type: str
    convert: Callable
    attrs: tuple = ()


@dataclass(frozen=True)
class OnnxMapping:
    """An op's ONNX mapping (the ``Op.onnx`` field).

    Attributes:
        export: ``export(ctx, node)``, or None when the op has no ONNX form.
        writes: the ONNX op types ``export`` writes (for the docs' table).
        imports: the :class:`OnnxImport` records of the ONNX op types that read into this op.
        no_export_reason: why the op has no export, for the error message.
    """

    export: Callable | None = None
    writes: tuple = ()
    imports: tuple = ()
    no_export_reason: str | None = None


def register_onnx(op_name, *, export=None, writes=(), imports=(), no_export_reason=None):
    """Attach an ONNX mapping to the registered op ``op_name`` (replacing any earlier one).

    Returns:
        The :class:`OnnxMapping` now on ``get(op_name).onnx``.
    """
    mapping = OnnxMapping(export, tuple(writes), tuple(imports), no_export_reason)
    get(op_name).onnx = mapping
    return mapping


def exportable_ops():
    """Names of the registered ops that export to ONNX, sorted."""
    return sorted(n for n, op in REGISTRY.items() if op.onnx is not None and op.onnx.export)


def support_table():
    """``(op name, ONNX types written, ONNX types imported)`` for every op with a mapping."""
    rows = []
    for name in sorted(REGISTRY):
        m = REGISTRY[name].onnx
        if m is not None:
            rows.append((name, m.writes if m.export else (), tuple(i.op_type for i in m.imports)))
    return rows


# --- shared export helpers ---------------------------------------------------------------------
def input_names(ctx, node, dtype=None):
    """ONNX names of the node's inputs, cast to ``dtype`` where one differs."""
    names = [ctx.name(v) for v in node.inputs]
    if dtype is None:
        return names
    return [ctx.cast(n, v.dtype, dtype) for n, v in zip(names, node.inputs)]


def common_dtype(node):
    out = node.inputs[0].dtype
    for v in node.inputs[1:]:
        out = dtypes.promote(out, v.dtype)
    return out


def export_binary(onnx_type, bool_type=None, compare=False):
    """Exporter of an elementwise binary op: inputs cast to one dtype, as ONNX requires."""
    def export(ctx, node):
        dt = common_dtype(node) if compare else node.output.dtype
        kind = onnx_type
        if dt == dtypes.bool_:
            if bool_type is None:
                ctx.fail(f"ONNX {onnx_type} takes no bool tensors")
            kind = bool_type
        ctx.emit(kind, input_names(ctx, node, dt), ctx.name(node.output))
    return export


def export_unary(onnx_type, signed=False):
    def export(ctx, node):
        if signed and node.inputs[0].dtype.kind in "ub":
            ctx.fail(f"ONNX {onnx_type} takes no {node.inputs[0].dtype} tensors")
        ctx.emit(onnx_type, input_names(ctx, node), ctx.name(node.output))
    return export


# --- shared import helpers ---------------------------------------------------------------------
def import_as(op_name):
    """Importer of an ONNX op that is exactly registry op ``op_name`` on the same inputs."""
    def convert(ctx, node, a):
        return [ctx.emit(op_name, *ctx.inputs(node))]
    return convert


def scalar_like(value, like):
    """A 0-d array of ``value`` in the dtype of value ``like``."""
    return np.asarray(value, like.dtype)


def fold_binary(ctx, op_name, values):
    out = values[0]
    for v in values[1:]:
        out = ctx.emit(op_name, out, v)
    return out


def import_variadic(op_name):
    def convert(ctx, node, a):
        return [fold_binary(ctx, op_name, ctx.inputs(node))]
    return convert


def require_bool(ctx, node, values):
    for v in values:
        if v.dtype != dtypes.bool_:
            ctx.fail(node, f"expects bool inputs, got {v.dtype}")


def check_axis(ctx, node, axis, rank):
    if not -max(rank, 1) <= axis < max(rank, 1):
        ctx.fail(node, f"axis {axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def unsqueeze_shape(shape, axes):
    out = list(shape)
    for ax in sorted(axes):
        out.insert(ax, 1)
    return tuple(out)
