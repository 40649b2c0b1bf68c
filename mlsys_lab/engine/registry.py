"""The op registry: every op is defined once and read by eager mode, tracing, autodiff and passes.

An :class:`Op` bundles the op's name, its shape/dtype rule (``infer``), its numpy reference kernel
(``compute``), its reverse-mode rule (``vjp``) and forward-mode rule (``jvp``). The rules are
written with framework ops, so gradients are themselves differentiable. Devices can register further
kernels (``impls``) that operator selection may choose from.
"""

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from ..errors import UnknownNameError


class AVal(NamedTuple):
    """Abstract value: what static analysis knows about a tensor (shape and dtype)."""

    shape: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class Kernel:
    """One implementation of an op on one device, as operator selection sees it.

    Attributes:
        name: what the kernel really is, as ``explain()`` prints it (``"cblas.sgemm"``,
            ``"numba.relu_grad"``, ``"numpy.add"``).
        out_fn: ``out_fn(out, *arrays, **attrs)`` writes the result into ``out`` (the arena
            buffer the memory plan gave the node).
        accepts: ``accepts(avals, out_aval, attrs) -> None`` when the kernel can run the node,
            else a short reason (``"dtype float16"``), shown by ``explain()``.
    """

    name: str
    out_fn: Callable
    accepts: Callable = lambda avals, out, attrs: None


@dataclass
class Op:
    """One primitive operation.

    Attributes:
        name: the op's name (numpy/PyTorch style, e.g. ``"matmul"``).
        compute: numpy kernel ``compute(*arrays, **attrs) -> ndarray``.
        infer: shape/dtype rule ``infer(*avals, **attrs) -> AVal``; raises ShapeError/DTypeError.
        vjp: ``vjp(g, inputs, out, needs, **attrs) -> tuple`` of input cotangents (None = no
            gradient); ``needs[i]`` tells whether input i wants one.
        jvp: ``jvp(tangents, inputs, out, **attrs) -> tangent`` (tangents may hold None = zero).
        elementwise: output element i depends only on input elements i (fusable).
        inplace: positions of inputs (besides those of an elementwise op) whose buffer the
            output may take over: element i of that input is read only to write element i
            of the output (``gemm``'s accumulator C).
        impure: the result is not a function of the inputs alone (it draws fresh randomness
            on every run, like ``rng_seed``): passes never fold, merge or drop such a node,
            and tracing records it even when it has no traced input.
        view: for an op whose output is a view of its first input (reshape, transpose,
            broadcast_to), ``view(x, **attrs) -> ndarray`` makes that numpy view; executors
            then allocate no buffer for the output.
        fusion: for a fusable elementwise op, the expression template the fused-kernel
            generator writes for it (``"math.exp({0})"``; ``{i}`` is input i).
        impls: the kernels operator selection may choose, by device name: a list of
            :class:`Kernel`, most preferred first.
    """

    name: str
    compute: Callable
    infer: Callable
    vjp: Callable | None = None
    jvp: Callable | None = None
    elementwise: bool = False
    inplace: tuple = ()
    impure: bool = False
    view: Callable | None = None
    fusion: str | None = None
    impls: dict = field(default_factory=dict)

    def __repr__(self):
        return f"Op({self.name})"


REGISTRY: dict[str, Op] = {}


def register(op: Op, replace: bool = False) -> Op:
    """Add ``op`` to the registry. A name is defined once unless ``replace=True`` (handy when a
    notebook cell that defines a custom op is run again)."""
    if op.name in REGISTRY and not replace:
        raise ValueError(f"op {op.name!r} is already registered (pass replace=True to redefine)")
    REGISTRY[op.name] = op
    return op


def get(name: str) -> Op:
    """The registered op called ``name``."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise UnknownNameError(f"no op named {name!r}; known ops: {known}") from None


def register_impl(op_name: str, device: str, kernel: Callable, **info):
    """Register ``kernel`` as an implementation of ``op_name`` on ``device``.

    ``info`` describes what the kernel accepts (dtypes, layouts, limits) for operator selection.
    """
    get(op_name).impls[device] = dict(kernel=kernel, **info)
