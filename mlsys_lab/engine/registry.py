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
        impls: extra kernels by device name, for operator selection.
    """

    name: str
    compute: Callable
    infer: Callable
    vjp: Callable | None = None
    jvp: Callable | None = None
    elementwise: bool = False
    inplace: tuple = ()
    impure: bool = False
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
