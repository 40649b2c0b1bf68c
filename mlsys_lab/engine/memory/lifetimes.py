"""Lifetime records from a scheduled graph, and the (out, in) pairs that may share memory.
"""

from __future__ import annotations

import math
from typing import Iterable

import numpy as np

from mlsys_lab.errors import GraphError

from ..registry import REGISTRY
from .records import Lifetime, Workspace


def _nbytes(value) -> int:
    return math.prod(value.shape) * np.dtype(value.dtype).itemsize


def workspace_bytes(node) -> int:
    """The scratch bytes the kernel selected for ``node`` declares (``Kernel.workspace``; 0
    when the node has no selected kernel or the kernel declares none).

    Raises:
        GraphError: the declaration is not a non-negative int.
    """
    kernel = getattr(node, "meta", {}).get("kernel")
    declare = getattr(kernel, "workspace", None)
    if declare is None:
        return 0
    avals = [v.aval for v in node.inputs]
    size = declare(avals, node.outputs[0].aval, node.attrs)
    if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or size < 0:
        raise GraphError(f"node {node!r}: kernel {kernel.name} declares a workspace of "
                         f"{size!r}; it must be an int >= 0 (bytes)")
    return int(size)


def lifetimes(
    graph, order=None, include_inputs: bool = True, long_lived: Iterable = (),
    workspace: bool = True,
) -> list[Lifetime]:
    """Lifetime records for every value of a scheduled graph, keyed by the ``Value`` itself.

    Step ``i`` is the ``i``-th node of ``order`` (default ``graph.nodes``). A node's outputs
    are born at its step and die at the step of their last user (at their own step if
    unused); graph outputs live to the last step. Graph inputs and constants (weights) live
    from step 0 to the last step and are flagged ``long_lived``; pass
    ``include_inputs=False`` to leave them out (the caller owns their memory).

    A node whose selected kernel declares scratch memory (``Kernel.workspace``: a tiled
    attention kernel's tiles, say) gets one more record, keyed by a :class:`Workspace`, live at
    that node's step only; so the plan's peak counts what the kernel really holds.

    Args:
        graph: An object with ``inputs``, ``outputs``, ``nodes`` and ``consts``; nodes have
            ``inputs`` and ``outputs``; values have ``shape`` and ``dtype``.
        order: A topological order of the nodes (a list of nodes).
        include_inputs: Whether graph inputs and constants get records.
        long_lived: Further values to flag ``long_lived`` (for the ``two_cursor`` strategy).
        workspace: Whether declared kernel workspaces get records.

    Raises:
        GraphError: a node reads a value that no earlier node, input or constant provides.
    """
    nodes = list(graph.nodes if order is None else order)
    last_step = max(len(nodes) - 1, 0)
    consts = getattr(graph, "consts", None) or {}
    external = list(dict.fromkeys([*graph.inputs, *consts]))
    birth = {v: 0 for v in external}
    death = {v: last_step for v in external}
    for step, node in enumerate(nodes):
        for v in node.inputs:
            if v not in birth:
                raise GraphError(f"step {step}: node {node!r} reads {v!r} before it is produced")
            death[v] = max(death[v], step)
        for v in node.outputs:
            birth[v], death[v] = step, step
    for v in graph.outputs:
        death[v] = last_step
    flagged = set(long_lived) | set(external)
    skip = set() if include_inputs else set(external)
    records = [
        Lifetime(v, _nbytes(v), birth[v], death[v], v in flagged) for v in birth if v not in skip
    ]
    if workspace:
        for step, node in enumerate(nodes):
            size = workspace_bytes(node)
            if size:
                ws = Workspace(node, size, node.meta["kernel"].name)
                records.append(Lifetime(ws, size, step, step))
    return records


def _op_name(node) -> str:
    op = getattr(node, "op", None)
    return getattr(op, "name", op)


def inplace_pairs(graph, order=None, elementwise: Iterable[str] | None = None,
                  overwrites: dict | None = None) -> list:
    """``(out, in)`` pairs where a node may write its output over an input.

    A pair qualifies when the node's op (``node.op``, a name or an object with ``.name``) is
    elementwise (any input) or listed in ``overwrites`` (op name -> input positions it may
    overwrite, e.g. ``{"gemm": (0,)}``), the node has one output, and the input is an
    intermediate (not a graph input, constant or output) of the same byte size whose last use
    is this node. At most one input per node is chosen. Pass the result to
    ``plan(..., inplace=...)``. ``elementwise`` defaults to the registry's elementwise ops.
    """
    nodes = list(graph.nodes if order is None else order)
    records = {r.id: r for r in lifetimes(graph, nodes)}
    consts = getattr(graph, "consts", None) or {}
    protected = {*graph.inputs, *consts, *graph.outputs}
    if elementwise is None:
        elementwise = [name for name, op in REGISTRY.items() if op.elementwise]
    elementwise, overwrites = set(elementwise), overwrites or {}
    pairs = []
    for step, node in enumerate(nodes):
        name = _op_name(node)
        if len(node.outputs) != 1:
            continue
        if name in elementwise:
            candidates = node.inputs
        elif name in overwrites:  # not an input that the node also reads at another position
            others = [v for i, v in enumerate(node.inputs) if i not in overwrites[name]]
            candidates = [node.inputs[i] for i in overwrites[name] if node.inputs[i] not in others]
        else:
            continue
        out = records[node.outputs[0]]
        for v in dict.fromkeys(candidates):
            src = records[v]
            if v not in protected and src.end == step and src.size == out.size:
                pairs.append((out.id, v))
                break
    return pairs
