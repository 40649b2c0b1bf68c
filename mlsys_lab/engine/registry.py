"""The op registry: every op is defined once and read by eager mode, tracing, autodiff and passes.

An :class:`Op` bundles the op's name, its shape/dtype rule (``infer``), its numpy reference kernel
(``compute``), its reverse-mode rule (``vjp``) and forward-mode rule (``jvp``), and what the
backend needs to know about it (elementwise, view, in-place, fusion template). The rules are
written with framework ops, so gradients are themselves differentiable. Devices can register further
kernels (``impls``) that operator selection may choose from.

Ops are defined with :func:`defop`, every rule a named function beside its op::

    def _exp_vjp(g, xs, y, needs):
        return (g * y,)

    EXP = defop("exp", compute=np.exp, infer=_unary_float, vjp=_exp_vjp, jvp=_exp_jvp,
                elementwise=True, fusion="math.exp({0})")
"""

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import numpy as np

from ..errors import ArgumentError, UnknownNameError
from . import dtypes


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
        exact: the kernel gives what the op's ``compute`` gives, bit for bit (signed zeros and
            NaN included), on every input it accepts. ``tests/kernels/test_eager_kernels.py`` holds
            each kernel that claims it to that on random inputs.
        eager: eager dispatch (``ml.ops`` on Tensors, the tape, the graph interpreter) runs
            this kernel in place of ``compute`` wherever it accepts the arrays. The rule:
            only an ``exact`` kernel, or one that differs from ``compute`` in nothing but the
            order of its floating-point sums (convolution as one GEMM over the whole batch,
            a pooling gradient whose windows overlap) may set it; such a kernel agrees with
            ``compute`` to the summing ops' conformance tolerance (``rtol`` scaled by the
            dtype's epsilon, ``tests/conformance.py``), and ``tests/kernels/test_eager_kernels.py``
            holds it to that. A kernel that changes the algorithm (Winograd) or rounds
            differently (generated fused loops, within 1 ulp) never sets it: selection may
            choose it for compiled graphs only.
        workspace: ``workspace(avals, out, attrs) -> int``, the bytes of scratch memory the
            kernel holds while it runs besides its inputs and output (tiles, per-thread
            buffers, a saved log-sum-exp); None: none. The memory planner books it at the
            node's step (:func:`~.memory.lifetimes`), so a plan's peak counts it.
    """

    name: str
    out_fn: Callable
    accepts: Callable = lambda avals, out, attrs: None
    exact: bool = False
    eager: bool = False
    workspace: Callable | None = None


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
            generator writes for it (``"math.exp({0})"``; ``{i}`` is input i, ``{s<i>}`` is
            ``_s`` where input i is one value for the whole loop). The template may use the
            generator's scalar helpers (``math``, ``ZERO``, ``ONE``, ``_relu``, ``_maximum``,
            ``_minimum``, ``_sign``, ``_tanh``, ``_sigmoid``, ``_pow`` / ``_pow_s``; see
            ``passes/fusion/elementwise.py``).
        unfusable_reason: for an elementwise op with a floating result that has no ``fusion``
            template, why not (``cast`` takes a dtype attribute, which a fused program
            cannot carry).
        impls: the kernels operator selection may choose, by device name: a list of
            :class:`Kernel`, most preferred first.
        eager_impls: the ``cpu`` kernels flagged ``eager`` (see :class:`Kernel`), in the
            order of ``impls["cpu"]``; kept up to date by :func:`register_impl`. Eager dispatch
            runs the first that accepts the arrays, else ``compute``.
        storage: the op only moves, selects or converts elements (reshape, getitem, where,
            cast, ...), so it takes the storage dtypes (bfloat16, float8, int4, ...,
            :data:`~mlsys_lab.engine.dtypes.STORAGE`); every other op refuses them.
        onnx: the op's ONNX mapping (how a node of it exports, which ONNX op types import to
            it), set by ``mlsys_lab.deploy.onnx.register_onnx``; None: no mapping. The
            engine never reads it (the deploy layer does).
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
    unfusable_reason: str | None = None
    impls: dict = field(default_factory=dict)
    onnx: object = None
    eager_impls: tuple = ()
    storage: bool = False

    def __repr__(self):
        return f"Op({self.name})"


REGISTRY: dict[str, Op] = {}


def register(op: Op, replace: bool = False) -> Op:
    """Add ``op`` to the registry. A name is defined once unless ``replace=True`` (handy when a
    notebook cell that defines a custom op is run again). :func:`defop` builds and registers
    an op in one call.

    Raises:
        ArgumentError: an op of that name is registered already (and ``replace`` is False).
    """
    if op.name in REGISTRY and not replace:
        raise ArgumentError(f"op {op.name!r} is already registered (pass replace=True to "
                            f"redefine it)")
    REGISTRY[op.name] = op
    return op


def defop(name, *, compute, infer, vjp=None, jvp=None, elementwise=False, view=None,
          fusion=None, unfusable_reason=None, inplace=(), impure=False, storage=False,
          replace=False) -> Op:
    """Define an op and register it: the one way every op of the library is made.

    Every argument but the name is a keyword, so a definition reads as a table of named rules.
    ``ml.custom_op`` calls this and returns the op as a Python function.

    Args:
        name: the op's name, unique in the registry.
        compute: numpy kernel ``compute(*arrays, **attrs) -> ndarray``.
        infer: shape/dtype rule ``infer(*avals, **attrs) -> AVal``; raises ShapeError or
            DTypeError for inputs the op cannot take.
        vjp: reverse-mode rule ``vjp(g, xs, y, needs, **attrs) -> tuple`` (one cotangent or
            None per input), written with framework ops; None: not differentiable.
        jvp: forward-mode rule ``jvp(tangents, xs, y, **attrs) -> tangent`` (tangents may
            hold None, a zero tangent).
        elementwise: output element i depends only on input elements i.
        view: ``view(x, **attrs) -> ndarray`` for an op whose output is a numpy view of its
            first input.
        fusion: the fused-kernel expression template (``"math.exp({0})"``) of a fusable
            elementwise op.
        unfusable_reason: why an elementwise op with a floating result has no ``fusion``.
        inplace: positions of inputs whose buffer the output may take over.
        impure: the result is not a function of the inputs alone (fresh randomness).
        storage: the op takes the storage dtypes (see :attr:`Op.storage`); else its ``infer``
            is wrapped to refuse them with a DTypeError naming the op and the dtype.
        replace: redefine an op already registered under ``name``.

    Returns:
        The registered :class:`Op`.

    Raises:
        ArgumentError: ``name`` is taken (and ``replace`` is False), or a rule is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ArgumentError(f"defop: the name must be a non-empty string, got {name!r}")
    for what, rule in (("compute", compute), ("infer", infer), ("vjp", vjp), ("jvp", jvp),
                       ("view", view)):
        if rule is not None and not callable(rule):
            raise ArgumentError(f"defop({name!r}): {what} must be a function, got "
                                f"{type(rule).__name__}")
    if compute is None or infer is None:
        raise ArgumentError(f"defop({name!r}): compute and infer are required")
    if fusion is not None and not elementwise:
        raise ArgumentError(f"defop({name!r}): a fusion template needs elementwise=True")
    if not storage:  # bfloat16, float8, int4, ...: only data-movement ops take them
        infer = dtypes.storage_guarded(name, infer)
    return register(Op(name, compute, infer, vjp, jvp, elementwise=bool(elementwise),
                       inplace=tuple(inplace), impure=bool(impure), view=view, fusion=fusion,
                       unfusable_reason=unfusable_reason, storage=bool(storage)),
                    replace=replace)


def get(name: str) -> Op:
    """The registered op called ``name``."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(REGISTRY))
        raise UnknownNameError(f"no op named {name!r}; known ops: {known}") from None


def register_impl(op_name: str, device: str, out_fn: Callable, *, name: str,
                  accepts: Callable | None = None, dtypes=(), max_inputs: int | None = None,
                  max_ndim: int | None = None, returns: bool = False, exact: bool = False,
                  eager: bool = False, workspace: Callable | None = None) -> Kernel:
    """Register a kernel of ``op_name`` on ``device``, for operator selection to choose.

    The kernel joins the end of ``Op.impls[device]`` (those registered earlier are preferred),
    or takes the place of the kernel of the same name (a module or notebook cell run again).

    Args:
        op_name: the op it implements.
        device: the device it runs on (``"cpu"``, ``"cpu-numba"``, ``"cuda"``, ``"npu"``).
        out_fn: ``out_fn(out, *arrays, **attrs)`` writes the result into ``out``; with
            ``returns=True`` it is ``out_fn(*arrays, **attrs) -> ndarray`` instead, and its
            result is copied into ``out``.
        name: what the kernel really is, as ``explain()`` prints it (``"cblas.sgemm"``).
        accepts: ``accepts(avals, out, attrs) -> None | reason`` for conditions beyond the
            limits below (checked after them).
        dtypes: the floating dtypes it takes; a node with another floating input is refused
            (``"dtype float64"``). Empty: any.
        max_inputs: the most inputs it takes (``"100 inputs > limit 63"``).
        max_ndim: the highest rank of an input it takes (``"rank > 2"``).
        returns: see ``out_fn``.
        exact: the kernel is bit-identical to the op's ``compute`` (see :class:`Kernel`).
        eager: eager dispatch may run it in place of ``compute`` (see :class:`Kernel` for the
            rule: exact, or differing only in summation order).
        workspace: ``workspace(avals, out, attrs) -> bytes`` of scratch memory it holds while
            it runs (see :class:`Kernel`).

    Returns:
        The registered :class:`Kernel`.
    """
    floats = tuple(np.dtype(d) for d in dtypes)

    def check(avals, out, attrs):
        if floats and any(a.dtype not in floats for a in avals if np.dtype(a.dtype).kind == "f"):
            return "dtype " + "/".join(sorted({np.dtype(a.dtype).name for a in avals}))
        if max_inputs is not None and len(avals) > max_inputs:
            return f"{len(avals)} inputs > limit {max_inputs}"
        if max_ndim is not None and any(len(a.shape) > max_ndim for a in avals):
            return f"rank > {max_ndim}"
        return None if accepts is None else accepts(avals, out, attrs)

    if returns:
        def run(out, *arrays, **attrs):
            np.copyto(out, out_fn(*arrays, **attrs), casting="unsafe")
        run.__wrapped__ = out_fn  # what it runs, for readers and the explain-matches-code test
    else:
        run = out_fn
    kernel = Kernel(name, run, check, exact=bool(exact), eager=bool(eager), workspace=workspace)
    op = get(op_name)
    impls = op.impls.setdefault(device, [])
    same = [i for i, k in enumerate(impls) if k.name == name]
    if same:
        impls[same[0]] = kernel
    else:
        impls.append(kernel)
    op.eager_impls = tuple(k for k in op.impls.get("cpu", ()) if k.eager)
    return kernel
