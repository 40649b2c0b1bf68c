"""Operator selection (book ch. 7): the one place a kernel is chosen for every node, falling back
to another device (with inserted copies) or a lower precision.

A device's operator-information table (算子信息库) is the set of kernels its ops registered for
it: ``Op.impls[device]``, a list of :class:`~.registry.Kernel` (name, ``out_fn(out, *arrays,
**attrs)``, ``accepts(avals, out, attrs)``), most preferred first. ``cpu`` holds the compiled
CPU backend's kernels (:mod:`.cpu_impls`, the generated fused loops) and, after them, every
op's numpy reference, so it runs every op; a view op (reshape, transpose, ...) runs on ``cpu`` as
its numpy view, with no buffer and no copy. ``cpu-numba`` and ``cuda`` hold the kernels that
``mlsys_lab.kernels`` registers. ``npu`` is a simulated accelerator for teaching: float16-only
matmul/conv/add/relu/mul kernels and a concat limited to 63 inputs.

:func:`select` writes the chosen :class:`~.registry.Kernel` into ``node.meta['kernel']`` (and
its name, device and the reason into ``meta['kernel_name']``, ``['device']``, ``['choice']``).
``ml.compile`` runs exactly that kernel for the node, so ``explain()`` is true by construction.
"""

from dataclasses import dataclass

import numpy as np

from ..errors import GraphError, MLSysError, UnknownNameError
from . import cpu_impls, dtypes
from .dispatch import apply
from .graph import Graph, Node, Value
from .registry import REGISTRY, AVal, Kernel, defop, get, register_impl

F16, F32, F64 = dtypes.float16, dtypes.float32, dtypes.float64


@dataclass
class Device:
    """A device: its name, its per-launch cost (for simulation) and its memory space.

    Its kernels are those its ops registered for it (:meth:`kernels`)."""

    name: str
    launch_overhead_s: float = 0.0
    memory: str = "host"  # devices sharing a memory space need no copies between them

    def kernels(self, op):
        """The kernels of ``op`` on this device, most preferred first (empty: none)."""
        if self.name != "cpu":
            return list(op.impls.get(self.name, ()))
        if op.view is not None:
            return [view_kernel(op)]
        return [*op.impls.get("cpu", ()), reference_kernel(op)]

    def choose(self, op, avals, out, attrs):
        """``(kernel, None)``: the first of :meth:`kernels` that accepts inputs of types
        ``avals``, output type ``out`` and ``attrs``; else ``(None, why)``, why being None when
        the device has no kernel for ``op`` at all."""
        rejected = []
        for k in self.kernels(op):
            why = k.accepts(avals, out, attrs)
            if why is None:
                return k, None
            rejected.append(f"{k.name} rejects: {why}")
        return None, "; ".join(rejected) or None

    def choose_for(self, node):
        """:meth:`choose` for ``node``."""
        return self.choose(get(node.op), [v.aval for v in node.inputs], node.outputs[0].aval,
                           node.attrs)


def reference_kernel(op):
    """The ``cpu`` kernel every op has: its numpy reference ``compute``, copied into ``out``."""
    def run(out, *arrays, **attrs):
        np.copyto(out, op.compute(*arrays, **attrs), casting="unsafe")
    run.__wrapped__ = op.compute
    return Kernel(f"numpy.{op.name}", run)


def view_kernel(op):
    """The kernel of a view op: ``out_fn(*arrays, **attrs)`` returns the numpy view (its
    ``Op.view``); it has no ``out`` and no buffer of its own."""
    return Kernel(f"view.{op.name}", op.view)


def makes_view(node):
    """Whether the kernel selected for ``node`` is a view (it returns its result, aliasing its
    input, instead of writing a planned buffer)."""
    kernel = node.meta.get("kernel")
    return kernel is not None and kernel.out_fn is get(node.op).view


def kernel_for(node, device_name="cpu"):
    """The kernel :func:`select` gives ``node`` on ``device_name`` when it does not fall back:
    the device's most preferred kernel that accepts the node, or None."""
    return device(device_name).choose_for(node)[0]


def call_kernel(kernel, node, arrays):
    """Run ``kernel`` for ``node`` on ``arrays``: a new array of the node's output type (or the
    view, for a view kernel)."""
    if kernel.out_fn is get(node.op).view:
        return kernel.out_fn(*arrays, **node.attrs)
    out = node.outputs[0]
    result = np.empty(out.shape, out.dtype)
    kernel.out_fn(result, *arrays, **node.attrs)
    return result


DEVICES = {
    "cpu": Device("cpu"),
    "cpu-numba": Device("cpu-numba"),
    "cuda": Device("cuda", launch_overhead_s=5e-6, memory="cuda"),
    "npu": Device("npu", launch_overhead_s=2e-4, memory="npu"),
}


def device(name):
    """The :class:`Device` called ``name``.

    Raises:
        UnknownNameError: no device has that name; the message lists the known ones.
    """
    if not isinstance(name, str) or name not in DEVICES:
        raise UnknownNameError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[name]


# --- the copy op --------------------------------------------------------------------------------
def _copy_np(x, src, dst):
    return np.array(x, copy=True)


def _copy_infer(x, src, dst):
    return AVal(tuple(x.shape), x.dtype)


def _copy_vjp(g, xs, y, needs, src, dst):
    return (apply(COPY, g, src=dst, dst=src),)


def _copy_jvp(ts, xs, y, src, dst):
    return None if ts[0] is None else apply(COPY, ts[0], src=src, dst=dst)


COPY = REGISTRY.get("copy") or defop("copy", compute=_copy_np, infer=_copy_infer, vjp=_copy_vjp,
                                      jvp=_copy_jvp)
register_impl("copy", "cpu", cpu_impls.copyto_out, name="numpy.copyto")


# --- the simulated npu's kernels ----------------------------------------------------------------
def _npu_kernel(op_name):
    op = get(op_name)

    def kernel(*arrays, **attrs):
        return op.compute(*arrays, **attrs)
    kernel.__name__ = f"npu_{op_name}_fp16"
    return kernel


for _name in ("matmul", "conv2d", "add", "relu", "mul"):
    register_impl(_name, "npu", _npu_kernel(_name), name=f"npu.{_name}_fp16", returns=True,
                  dtypes=(F16,))
register_impl("concatenate", "npu", _npu_kernel("concatenate"), name="npu.concat63",
              returns=True, dtypes=(F16, F32), max_inputs=63)
register_impl("cast", "npu", _npu_kernel("cast"), name="npu.cast", returns=True,
              dtypes=(F16, F32))


# --- selection ----------------------------------------------------------------------------------
@dataclass
class Choice:
    """The kernel chosen for one node and why."""

    device: str
    kernel: str
    reason: str


def _new_value(graph_values, shape, dtype, base):
    v = Value(f"{base}_{len(graph_values)}", shape, dtype)
    graph_values.append(v)
    return v


def select(graph, device_name="cpu", fallback=("cpu",)):
    """Choose a kernel for every node on ``device_name``; returns a new, annotated Graph.

    For each node: use the device's first kernel that accepts it; else, if one of its kernels
    accepts the node in float16 (and the device can cast there and back), insert casts to
    float16 and back; else fall back to the first device in ``fallback`` with a kernel that
    accepts it. Values that cross memories get ``copy`` nodes. Every node's ``meta`` gets the
    chosen ``kernel`` (a :class:`~.registry.Kernel`), its ``kernel_name``, the ``device`` and
    the ``choice`` (device, kernel name and the reason for the decision).

    Raises:
        GraphError: no device offers a kernel that accepts some node.
    """
    dev = device(device_name)
    fallback = (fallback,) if isinstance(fallback, str) else tuple(fallback)
    fallbacks = [device(f) for f in fallback]
    graph = graph.copy()  # selection rewrites values; never touch the caller's graph
    made = []
    nodes, home = [], {}  # home: id(value) -> device name where it lives
    for v in list(graph.inputs) + list(graph.consts):
        home[id(v)] = "cpu"
    copies = {}
    low_of = {}  # id(float32 value) -> the float16 value it was cast up from

    def on(v, where):
        """The value ``v`` made available on device ``where`` (inserting a copy once)."""
        src = home.get(id(v), "cpu")
        if DEVICES[src].memory == DEVICES[where].memory:
            return v
        key = (id(v), where)
        if key not in copies:
            out = _new_value(made, v.shape, v.dtype, f"{v.name}@{where}")
            copy = Node("copy", [v], dict(src=src, dst=where), [out])
            kernel, _ = DEVICES["cpu"].choose_for(copy)  # the host drives every transfer
            nodes.append(_annotated(copy, where, kernel, f"move {v.name} to {where}"))
            home[id(out)] = where
            copies[key] = out
        return copies[key]

    def emit(n, ins, where, kernel, reason):
        nodes.append(_annotated(Node(n.op, ins, n.attrs, n.outputs, n.source), where, kernel,
                                reason))
        for o in n.outputs:
            home[id(o)] = where

    for n in graph.nodes:
        kernel, why = dev.choose_for(n)
        if kernel is not None:
            reason = (f"a view of {n.inputs[0].name}: no kernel, no copy"
                      if kernel.out_fn is get(n.op).view else
                      f"{dev.name} has {kernel.name}" + _passed_over(dev, n, kernel))
            emit(n, [on(v, dev.name) for v in n.inputs], dev.name, kernel, reason)
            continue
        lowered = why is not None and _lower_precision(n, dev, nodes, made, home, low_of, on)
        if lowered is True:
            continue
        for fb in fallbacks:
            fkernel, _ = fb.choose_for(n)
            if fkernel is not None:
                reason = (f"{dev.name} has no kernel for {n.op}" if why is None else
                          f"{dev.name}'s {why}") + (f"; {lowered}" if lowered else "") + \
                    f"; fell back to {fb.name}"
                emit(n, [on(v, fb.name) for v in n.inputs], fb.name, fkernel, reason)
                break
        else:
            avals = [f"{v.dtype}{list(v.shape)}" for v in n.inputs]
            raise GraphError(f"select: no device among {[dev.name, *fallback]} has a kernel for "
                             f"node #{n.id} {n.op} with inputs {avals}"
                             + (f" ({dev.name}'s {why})" if why else "")
                             + (f"\n  at {n.source}" if n.source else ""))
    outs = [on(v, "cpu") for v in graph.outputs]
    return Graph(graph.inputs, _drop_unused(nodes, outs), outs, graph.consts, graph.out_tree,
                 graph.in_tree, f"{graph.name}@{device_name}")


def _passed_over(dev, node, chosen):
    """Why the device's more preferred kernels were not taken, when its numpy reference was
    (``""`` otherwise)."""
    if chosen.name != f"numpy.{node.op}" or chosen.out_fn is get(node.op).view:
        return ""
    avals, out = [v.aval for v in node.inputs], node.outputs[0].aval
    skipped = [f"{k.name} rejects: {k.accepts(avals, out, node.attrs)}"
               for k in dev.kernels(get(node.op)) if k.name != chosen.name]
    return f" ({'; '.join(skipped)})" if skipped else ""


def _lower_precision(n, dev, nodes, made, home, low_of, on):
    """Run ``n`` on ``dev`` in float16 when one of its kernels accepts it so, casting the
    inputs down and the result back on ``dev``: True. Otherwise nothing is emitted and the
    result is None (no kernel takes the node in float16 either) or why the float16 route is
    closed (``dev`` cannot run one of the casts)."""
    op, out = get(n.op), n.outputs[0]
    avals = [v.aval for v in n.inputs]
    low_avals = [AVal(a.shape, F16) if dtypes.is_float(a.dtype) else a for a in avals]
    if low_avals == avals or len(n.outputs) != 1:
        return None
    try:
        low_out = op.infer(*low_avals, **n.attrs)
    except MLSysError:
        return None
    lowered, _ = dev.choose(op, low_avals, low_out, n.attrs)
    if lowered is None:
        return None
    casts = {}  # (from dtype, to dtype) -> the device's cast kernel
    for src, dst in [(a.dtype, F16) for a in avals] + [(low_out.dtype, out.dtype)]:
        if src != dst and dtypes.is_float(src) and (src, dst) not in casts:
            casts[src, dst], _ = dev.choose(get("cast"), [AVal((), src)], AVal((), dst),
                                            {"dtype": dst})
            if casts[src, dst] is None:
                return (f"{lowered.name} takes float16, but {dev.name} cannot cast "
                        f"{np.dtype(src).name} to {np.dtype(dst).name}")
    ins = []
    for v in n.inputs:
        if id(v) in low_of:  # the value was just cast up from float16: reuse that
            ins.append(low_of[id(v)])
            continue
        v = on(v, dev.name)
        if dtypes.is_float(v.dtype) and v.dtype != F16:
            c = _new_value(made, v.shape, F16, f"{v.name}_f16")
            nodes.append(_annotated(Node("cast", [v], {"dtype": F16}, [c]), dev.name,
                                    casts[v.dtype, F16], "lower precision to float16"))
            home[id(c)] = dev.name
            v = c
        ins.append(v)
    low = out if low_out.dtype == out.dtype else _new_value(made, out.shape, low_out.dtype,
                                                            f"{out.name}_f16")
    nodes.append(_annotated(Node(n.op, ins, n.attrs, [low], n.source), dev.name, lowered,
                            f"{dev.name} has only a float16 kernel ({lowered.name}): "
                            f"lowered precision"))
    home[id(low)] = dev.name
    if low is not out:
        nodes.append(_annotated(Node("cast", [low], {"dtype": out.dtype}, [out]), dev.name,
                                casts[low.dtype, out.dtype], f"back to {out.dtype.name}"))
        home[id(out)] = dev.name
        low_of[id(out)] = low
    return True


def _drop_unused(nodes, outputs):
    """Remove nodes whose results nothing reads (casts made redundant by float16 reuse); a node
    of an impure op stays (it consumes randomness)."""
    needed = {id(v) for v in outputs}
    kept = []
    for n in reversed(nodes):
        if any(id(o) in needed for o in n.outputs) or get(n.op).impure:
            kept.append(n)
            needed.update(id(v) for v in n.inputs)
    return kept[::-1]


def _annotated(node, device_name, kernel, reason):
    node.meta.update(device=device_name, kernel=kernel, kernel_name=kernel.name,
                     choice=Choice(device_name, kernel.name, reason))
    return node


def explain_selection(graph):
    """Text table: node, op, device, the selected kernel's name and the reason."""
    chosen = [n for n in graph.nodes if n.meta.get("choice") is not None]
    width = max([26] + [len(n.meta["kernel"].name) + 1 for n in chosen])
    ops_width = max([22] + [len(n.op) + 2 for n in graph.nodes])
    rows = [f"{'node':<6}{'op':<{ops_width}}{'device':<11}{'kernel':<{width}}reason"]
    for n in chosen:
        c = n.meta["choice"]
        rows.append(f"#{n.id:<5}{n.op:<{ops_width}}{c.device:<11}{n.meta['kernel'].name:<{width}}"
                    f"{c.reason}")
    return "\n".join(rows)
