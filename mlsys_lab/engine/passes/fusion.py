"""Elementwise fusion: a chain or tree of elementwise ops becomes ONE ``fused_elementwise`` node
that runs as ONE generated Numba loop over the output.

The fused node's ``program`` attr is a tuple of steps ``(op_name, arg_indices)``: index ``i <
n_inputs`` is the node's i-th input, index ``n_inputs + k`` the result of step k; the last step is
the output. ``relu(x * a + b)`` with inputs (x, a, b) is
``(('mul', (0, 1)), ('add', (3, 2)), ('relu', (4,)))``.

The op has two kernels: the numpy reference ``compute`` (each step with the op's own kernel, so it
matches the unfused graph bit for bit) for the ``cpu`` device, and the generated Numba kernel,
registered as ``register_impl("fused_elementwise", "cpu-numba", ...)``. The Numba kernel reads
each input element once, keeps the intermediates in registers and writes the output once, where
the unfused graph makes one full pass over memory (and one temporary array) per op.
"""

import math

import numpy as np

from .. import dtypes
from ..registry import REGISTRY, AVal, Op, get, register, register_impl
from ..tensor import run_kernel
from .rewrite import Rewriter, graph_pass

#: How each fusable op reads in the generated loop body ({0}, {1}, ... are its arguments).
TEMPLATES = {
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "pow": "{0} ** {1}", "maximum": "_maximum({0}, {1})", "minimum": "_minimum({0}, {1})",
    "neg": "-{0}", "abs": "abs({0})", "exp": "math.exp({0})", "log": "math.log({0})",
    "sqrt": "math.sqrt({0})", "sin": "math.sin({0})", "cos": "math.cos({0})",
    "tanh": "_tanh({0})", "sigmoid": "HALF * (ONE + _tanh(HALF * {0}))", "relu": "_relu({0})",
    "sign": "_sign({0})", "where": "({1} if {0} else {2})",
    "relu_grad": "{0} * (ONE if {1} > ZERO else ZERO)",
}

#: Generated kernels by (program, input kinds, dtype): each is compiled once.
KERNEL_CACHE = {}

#: The loop is serial: with prange, thread start-up outweighed the win on the 2-core machines
#: the notebooks target, and a serial loop is already vectorised by LLVM.
PARALLEL = False


# --- the program ------------------------------------------------------------------------------
def program_aval(avals, program):
    """The output type of ``program`` on inputs of types ``avals`` (each step's op rule)."""
    env = list(avals)
    for op, args in program:
        env.append(get(op).infer(*[env[i] for i in args]))
    return AVal(tuple(env[-1].shape), np.dtype(env[-1].dtype))


def run_program(*arrays, program):
    """Reference kernel: evaluate ``program`` step by step with each op's numpy kernel."""
    env = list(arrays)
    for op, args in program:
        env.append(run_kernel(get(op), [env[i] for i in args], {}))
    return env[-1]


def expression(program, n_inputs, names=None):
    """``program`` as one readable expression, e.g. ``mul(tanh(relu(add(mul(x, a), b))), c)``."""
    env = list(names or [f"in{i}" for i in range(n_inputs)])
    for op, args in program:
        env.append(f"{op}({', '.join(env[i] for i in args)})")
    return env[-1]


def _fused_infer(*avals, program):
    return program_aval(avals, program)


FUSED_ELEMENTWISE = REGISTRY.get("fused_elementwise") or register(
    Op("fused_elementwise", run_program, _fused_infer, vjp=None, elementwise=True))


# --- code generation --------------------------------------------------------------------------
def kernel_source(program, kinds):
    """Python source of the loop for ``program``; ``kinds[i]`` is 's' when input i is a single
    element (read once, before the loop) and 'a' when it is a flat array of the output's size."""
    n = len(kinds)
    lines = [f"def fused_kernel(out{''.join(f', in{i}' for i in range(n))}):"]
    lines += [f"    x{i} = in{i}[0]" for i, k in enumerate(kinds) if k == "s"]
    lines.append("    for i in range(out.size):")
    lines += [f"        x{i} = in{i}[i]" for i, k in enumerate(kinds) if k == "a"]
    names = [f"x{i}" for i in range(n)]
    for k, (op, args) in enumerate(program):
        lines.append(f"        t{k} = " + TEMPLATES[op].format(*[names[a] for a in args]))
        names.append(f"t{k}")
    lines.append(f"        out[i] = {names[-1]}")
    return "\n".join(lines) + "\n"


def compile_kernel(program, kinds, dtype):
    """The compiled Numba kernel for ``program`` (cached: compiled once per program, input kinds
    and dtype)."""
    key = (program, tuple(kinds), np.dtype(dtype).str)
    kernel = KERNEL_CACHE.get(key)
    if kernel is None:
        import numba

        namespace = _helpers(np.dtype(dtype))
        exec(compile(kernel_source(program, kinds), f"<fused_elementwise {len(KERNEL_CACHE)}>",
                     "exec"), namespace)
        kernel = numba.njit(fastmath=False, error_model="numpy", parallel=PARALLEL)(
            namespace["fused_kernel"])
        KERNEL_CACHE[key] = kernel
    return kernel


_HELPERS = {}


def _helpers(dt):
    """Globals of the generated source: typed constants and small inlined scalar functions."""
    if dt.str not in _HELPERS:
        import numba

        inline = numba.njit(inline="always", error_model="numpy")
        zero, one, minus_one = dt.type(0), dt.type(1), dt.type(-1)

        def relu(x):
            return x if not x < zero else zero  # NaN passes through, as np.maximum does

        def maximum(a, b):
            return a if (a >= b or a != a) else b

        def minimum(a, b):
            return a if (a <= b or a != a) else b

        def sign(x):
            return one if x > zero else (minus_one if x < zero else x)

        tanh = _tanh_f32() if dt == np.float32 else math.tanh
        _HELPERS[dt.str] = dict(
            math=math, ZERO=zero, ONE=one, HALF=dt.type(0.5), _relu=inline(relu),
            _maximum=inline(maximum), _minimum=inline(minimum), _sign=inline(sign),
            _tanh=inline(tanh) if tanh is not math.tanh else tanh)
    return dict(_HELPERS[dt.str])


def _tanh_f32():
    """float32 tanh as Eigen's (and XLA's) rational approximation: within a few ulp of the
    exact value, and plain arithmetic, so LLVM vectorises the loop (a libm call per element,
    as ``math.tanh`` compiles to, is ~30x slower than numpy's SIMD tanh)."""
    f = np.float32
    clamp, tiny = f(7.99881172180175781), f(0.0004)
    a1, a3, a5, a7 = f(4.89352455891786e-03), f(6.37261928875436e-04), \
        f(1.48572235717979e-05), f(5.12229709037114e-08)
    a9, a11, a13 = f(-8.60467152213735e-11), f(2.00018790482477e-13), f(-2.76076847742355e-16)
    b0, b2, b4, b6 = f(4.89352518554385e-03), f(2.26843463243900e-03), \
        f(1.18534705686654e-04), f(1.19825839466702e-06)

    def tanh(a):
        x = a
        if a > clamp:
            x = clamp
        if a < -clamp:
            x = -clamp
        x2 = x * x
        p = x2 * (x2 * (x2 * (x2 * (x2 * (x2 * a13 + a11) + a9) + a7) + a5) + a3) + a1
        q = x2 * (x2 * (x2 * b6 + b4) + b2) + b0
        return a if abs(a) < tiny else x * p / q
    return tanh


def fused_elementwise_numba(*arrays, program):
    """The ``cpu-numba`` kernel of ``fused_elementwise``: one generated loop over the output.

    Inputs of one element are passed as scalars; inputs of the output's shape as flat arrays;
    any other broadcast input is materialised at the output's shape first (a copy). float16
    and non-float programs fall back to the numpy reference.
    """
    arrays = [np.asarray(a) for a in arrays]
    aval = program_aval([AVal(a.shape, a.dtype) for a in arrays], program)
    if aval.dtype not in (np.float32, np.float64):
        return run_program(*arrays, program=program)
    out = np.empty(aval.shape, aval.dtype)
    fused_elementwise_into(out, *arrays, program=program)
    return out


def fused_elementwise_into(out, *arrays, program):
    """Run the generated kernel writing into ``out`` (a C-contiguous float32/float64 array of
    the output's shape and dtype), e.g. a planned arena buffer."""
    dt = out.dtype
    args, kinds = [], []
    for a in arrays:
        a = np.asarray(a)
        if a.dtype != np.bool_:
            a = a.astype(dt, copy=False)
        if a.size == 1:
            args.append(a.reshape(1))
            kinds.append("s")
        else:
            args.append(np.ascontiguousarray(np.broadcast_to(a, out.shape)).reshape(-1))
            kinds.append("a")
    compile_kernel(program, tuple(kinds), dt)(out.reshape(-1), *args)


register_impl("fused_elementwise", "cpu-numba", fused_elementwise_numba,
              dtypes=("float32", "float64"), layouts=("any",))


# --- the pass ---------------------------------------------------------------------------------
def _fusable(n):
    return (n.op in TEMPLATES and n.op in REGISTRY and get(n.op).elementwise and not n.attrs
            and len(n.outputs) == 1 and dtypes.is_float(n.output.dtype))


def fusion_groups(graph):
    """Group elementwise nodes: ``{id(node): root}``, where root is the group's last node.

    Walking backwards, a fusable node joins the group of its readers when every reader is in
    that one group, its output is not a graph output, and it has the group's shape and dtype
    (so each interior value lives only inside the loop; inputs that broadcast are fine).
    """
    outs = set(map(id, graph.outputs))
    root_of = {}
    for n in reversed(graph.nodes):
        if not _fusable(n):
            continue
        v = n.output
        roots = {id(root_of.get(id(u))): root_of.get(id(u)) for u in v.users}
        root = next(iter(roots.values())) if len(roots) == 1 else None
        if (root is not None and id(v) not in outs
                and (v.shape, v.dtype) == (root.output.shape, root.output.dtype)):
            root_of[id(n)] = root
        else:
            root_of[id(n)] = n
    return root_of


@graph_pass
def fuse_elementwise(graph):
    """Replace each maximal group of two or more elementwise nodes (see :func:`fusion_groups`)
    by one ``fused_elementwise`` node whose ``program`` replays them (see the module doc)."""
    root_of = fusion_groups(graph)
    members = {}
    for n in graph.nodes:
        if id(n) in root_of:
            members.setdefault(id(root_of[id(n)]), []).append(n)
    rw = Rewriter(graph)
    for n in graph.nodes:
        group = members.get(id(root_of.get(id(n), n)), [n])
        if len(group) < 2:
            rw.copy(n)
        elif group[-1] is n:
            ext, program = _program(group)
            rw.bind(n.output, rw.emit("fused_elementwise", [rw[v] for v in ext],
                                      {"program": program}, name=n.output.name, source=n.source))
    return rw.build()


def _program(group):
    """(external input values, program) for a group of nodes in graph order."""
    inside = {id(m.output) for m in group}
    ext, index = [], {}
    for m in group:
        for v in m.inputs:
            if id(v) not in inside and id(v) not in index:
                index[id(v)] = len(ext)
                ext.append(v)
    for k, m in enumerate(group):
        index[id(m.output)] = len(ext) + k
    program = tuple((m.op, tuple(index[id(v)] for v in m.inputs)) for m in group)
    return ext, program
