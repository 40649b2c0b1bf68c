"""Operator selection (book ch. 7): pick a kernel for every node from per-device operator-info
tables, falling back to another device (with inserted copies) or a lower precision.

A device's table maps an op name to :class:`KernelInfo` — the dtypes and layouts the kernel
accepts and its limits. ``cpu`` is the numpy reference and has every op. ``cpu-numba`` and
``cuda`` hold the kernels that ``mlsys_lab.kernels`` registers. ``npu`` is a simulated
accelerator for teaching: float16-only matmul/conv kernels and a concat limited to 63 inputs.
"""

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import GraphError, UnknownNameError
from . import dtypes
from .graph import Graph, Node, Value
from .registry import REGISTRY, AVal, Op, get, register

F16, F32, F64 = dtypes.float16, dtypes.float32, dtypes.float64

#: Ops that exist to be compiled: on ``cpu`` they run their generated Numba kernel (the numpy
#: reference stays available as ``Op.compute`` and on other devices).
GENERATED_ON_CPU = {"fused_elementwise"}


@dataclass(frozen=True)
class KernelInfo:
    """What one kernel accepts. ``kernel(*arrays, **attrs) -> array``."""

    op: str
    device: str
    kernel: Callable
    dtypes: tuple = ()  # empty: any dtype
    layouts: tuple = ("any",)
    max_inputs: int | None = None
    max_ndim: int | None = None
    name: str = ""

    def accepts(self, avals):
        if self.dtypes and any(a.dtype not in self.dtypes for a in avals
                               if dtypes.is_float(a.dtype)):
            return "dtype " + "/".join(sorted({a.dtype.name for a in avals}))
        if self.max_inputs is not None and len(avals) > self.max_inputs:
            return f"{len(avals)} inputs > limit {self.max_inputs}"
        if self.max_ndim is not None and any(len(a.shape) > self.max_ndim for a in avals):
            return f"rank > {self.max_ndim}"
        return None


@dataclass
class Device:
    """A device: its name, its operator-info table and its per-launch cost (for simulation)."""

    name: str
    table: dict = field(default_factory=dict)
    launch_overhead_s: float = 0.0
    memory: str = "host"  # devices sharing a memory space need no copies between them

    def lookup(self, op_name):
        if self.name == "cpu" and op_name in REGISTRY:
            op = REGISTRY[op_name]
            if op_name in GENERATED_ON_CPU and "cpu-numba" in op.impls:
                impl = op.impls["cpu-numba"]
                return KernelInfo(op_name, "cpu", impl["kernel"],
                                  tuple(np.dtype(d) for d in impl.get("dtypes", ())),
                                  name=f"numba.{op_name}")
            return KernelInfo(op_name, "cpu", op.compute, name=f"numpy.{op_name}")
        info = self.table.get(op_name)
        if info is None:
            impl = REGISTRY[op_name].impls.get(self.name) if op_name in REGISTRY else None
            if impl:
                info = KernelInfo(op_name, self.name, impl["kernel"],
                                  tuple(np.dtype(d) for d in impl.get("dtypes", ())),
                                  tuple(impl.get("layouts", ("any",))), impl.get("max_inputs"),
                                  impl.get("max_ndim"), impl.get("name", f"{self.name}.{op_name}"))
        return info


def _npu_kernel(op_name):
    op = get(op_name)

    def kernel(*arrays, **attrs):
        return op.compute(*arrays, **attrs)
    kernel.__name__ = f"npu_{op_name}_fp16"
    return kernel


def _npu_table():
    table = {name: KernelInfo(name, "npu", _npu_kernel(name), (F16,), name=f"npu.{name}_fp16")
             for name in ("matmul", "conv2d", "add", "relu", "mul")}
    table["concatenate"] = KernelInfo("concatenate", "npu", _npu_kernel("concatenate"),
                                      (F16, F32), max_inputs=63, name="npu.concat63")
    table["cast"] = KernelInfo("cast", "npu", _npu_kernel("cast"), (F16, F32), name="npu.cast")
    return table


DEVICES = {
    "cpu": Device("cpu"),
    "cpu-numba": Device("cpu-numba"),
    "cuda": Device("cuda", launch_overhead_s=5e-6, memory="cuda"),
    "npu": Device("npu", _npu_table(), launch_overhead_s=2e-4, memory="npu"),
}


def device(name):
    """The :class:`Device` called ``name`` (registering kernels of mlsys_lab.kernels first).

    Raises:
        UnknownNameError: no device has that name; the message lists the known ones.
    """
    _load_kernel_registrations()
    if not isinstance(name, str) or name not in DEVICES:
        raise UnknownNameError(f"unknown device {name!r}; known devices: {', '.join(DEVICES)}")
    return DEVICES[name]


_loaded = False


def _load_kernel_registrations():
    global _loaded
    if not _loaded:
        _loaded = True
        try:
            from ..kernels import registration  # noqa: F401  (registers numba kernels)
        except ImportError:
            pass


# --- the copy op --------------------------------------------------------------------------------
def _copy_infer(x, src, dst):
    return AVal(tuple(x.shape), x.dtype)


COPY = REGISTRY.get("copy") or register(Op(
    "copy", lambda x, src, dst: np.array(x, copy=True), _copy_infer,
    lambda g, xs, y, n, src, dst: (_copy(g, dst, src),),
    lambda ts, xs, y, src, dst: None if ts[0] is None else _copy(ts[0], src, dst)))


def _copy(x, src, dst):
    from .tensor import apply

    return apply(COPY, x, src=src, dst=dst)


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
    """Annotate every node with a kernel (``node.meta['device']``, ``['kernel']``,
    ``['choice']``) for ``device_name``; returns a new Graph.

    For each node: use the device's kernel if it accepts the inputs; else, if it only lacks
    precision (it has a float16 kernel), insert casts to float16 and back; else fall back to the
    first device in ``fallback`` that has a kernel. Values that cross devices get ``copy`` nodes.
    The reason for every decision is recorded in ``meta['choice']``.
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
            nodes.append(_annotated(Node("copy", [v], dict(src=src, dst=where), [out]),
                                    where, "copy", f"move {v.name} to {where}"))
            home[id(out)] = where
            copies[key] = out
        return copies[key]

    for n in graph.nodes:
        avals = [v.aval for v in n.inputs]
        info = dev.lookup(n.op)
        why = None if info is None else info.accepts(avals)
        if info is not None and why is None:
            _emit(nodes, n, [on(v, dev.name) for v in n.inputs], dev.name, info,
                  f"{dev.name} has {info.name}", home)
            continue
        low_avals = [AVal(a.shape, F16) if dtypes.is_float(a.dtype) else a for a in avals]
        if info is not None and F16 in info.dtypes and info.accepts(low_avals) is None:
            ins = []
            for v in n.inputs:
                if id(v) in low_of:  # the value was just cast up from float16: reuse that
                    ins.append(low_of[id(v)])
                    continue
                v = on(v, dev.name)
                if dtypes.is_float(v.dtype) and v.dtype != F16:
                    c = _new_value(made, v.shape, F16, f"{v.name}_f16")
                    nodes.append(_annotated(Node("cast", [v], {"dtype": F16}, [c]), dev.name,
                                            "cast", "lower precision to float16"))
                    home[id(c)] = dev.name
                    v = c
                ins.append(v)
            out = n.outputs[0]
            low = _new_value(made, out.shape, F16, f"{out.name}_f16")
            nodes.append(_annotated(Node(n.op, ins, n.attrs, [low], n.source), dev.name,
                                    info.name, f"{dev.name} has only a float16 kernel "
                                    f"({info.name}): lowered precision"))
            home[id(low)] = dev.name
            nodes.append(_annotated(Node("cast", [low], {"dtype": out.dtype}, [out]), dev.name,
                                    "cast", f"back to {out.dtype.name}"))
            home[id(out)] = dev.name
            low_of[id(out)] = low
            continue
        for fb in fallbacks:
            finfo = fb.lookup(n.op)
            if finfo is not None and finfo.accepts(avals) is None:
                reason = (f"{dev.name} has no kernel for {n.op}" if info is None else
                          f"{dev.name}'s {info.name} rejects: {why}") + f"; fell back to {fb.name}"
                _emit(nodes, n, [on(v, fb.name) for v in n.inputs], fb.name, finfo, reason,
                      home)
                break
        else:
            raise GraphError(f"select: no device among {[dev.name, *fallback]} has a kernel for "
                             f"node #{n.id} {n.op} with inputs "
                             f"{[f'{a.dtype}{list(a.shape)}' for a in avals]}")
    outs = [on(v, "cpu") for v in graph.outputs]
    return Graph(graph.inputs, _drop_unused(nodes, outs), outs, graph.consts, graph.out_tree,
                 graph.in_tree, f"{graph.name}@{device_name}")


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


def _annotated(node, device_name, kernel_name, reason, kernel=None):
    node.meta.update(device=device_name, kernel_name=kernel_name, kernel=kernel,
                     choice=Choice(device_name, kernel_name, reason))
    return node


def _emit(nodes, n, ins, device_name, info, reason, home):
    node = Node(n.op, ins, n.attrs, n.outputs, n.source)
    nodes.append(_annotated(node, device_name, info.name, reason, info.kernel))
    for o in n.outputs:
        home[id(o)] = device_name


def explain_selection(graph):
    """Text table: node, op, device, kernel, reason."""
    rows = [f"{'node':<6}{'op':<22}{'device':<11}{'kernel':<26}reason"]
    for n in graph.nodes:
        c = n.meta.get("choice")
        if c is not None:
            rows.append(f"#{n.id:<5}{n.op:<22}{c.device:<11}{c.kernel:<26}{c.reason}")
    return "\n".join(rows)
