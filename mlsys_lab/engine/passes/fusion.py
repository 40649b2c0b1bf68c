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
    "tanh": "_tanh({0})", "sigmoid": "_sigmoid({0})", "relu": "_relu({0})",
    "sign": "_sign({0})", "where": "({1} if {0} else {2})",
    "relu_grad": "({0} if {1} > ZERO else ZERO)",
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
    """Globals of the generated source: typed constants and small inlined scalar functions.

    Each computes what the eager op's numpy kernel computes, over the whole float range (±0,
    ±inf, NaN and subnormals included): exact ops bit for bit (numpy's ``maximum`` returns its
    second argument on a tie, so ``maximum(-0., 0.)`` is ``0.``; ``relu(-0.)`` and
    ``sign(-0.)`` are ``+0.``), and the transcendental ones within a few ulp (the test in
    ``tests/test_compile_correctness.py`` measures them).
    """
    if dt.str not in _HELPERS:
        import numba

        inline = numba.njit(inline="always", error_model="numpy")
        zero, one, minus_one = dt.type(0), dt.type(1), dt.type(-1)

        def relu(x):
            return x if (x > zero or x != x) else zero  # NaN passes, as np.maximum(x, 0)

        def maximum(a, b):
            return a if (a > b or a != a) else b

        def minimum(a, b):
            return a if (a < b or a != a) else b

        def sign(x):
            return one if x > zero else (minus_one if x < zero else (x if x != x else zero))

        if dt == np.float32:
            tanh, sigmoid = inline(_tanh_f32()), inline(_sigmoid_f32())
        else:
            tanh, sigmoid = math.tanh, inline(_sigmoid_f64)
        _HELPERS[dt.str] = dict(
            math=math, ZERO=zero, ONE=one, _relu=inline(relu), _maximum=inline(maximum),
            _minimum=inline(minimum), _sign=inline(sign), _tanh=tanh, _sigmoid=sigmoid)
    return dict(_HELPERS[dt.str])


def _expm1_f64(k, degree):
    """``expm1(z)``: e**(z * 2**k) - 1 in float64 for small z >= 0, using only arithmetic, so
    LLVM vectorises a loop that calls it (a libm call per element is scalar and 5-30x slower
    than numpy's SIMD kernels).

    The Taylor series of ``degree`` at z, then k doublings ``e(2z) - 1 = (e(z) - 1) *
    (e(z) - 1 + 2)``. Every term is positive, so nothing cancels; a doubling at most doubles
    the relative error, so the relative truncation error ``z**degree / (degree + 1)!`` times
    2**k must stay far below a float32 ulp (6e-8): the callers keep it under 1e-9."""
    import numba

    coeffs = tuple(np.float64(1.0 / math.factorial(i)) for i in range(degree, 0, -1))
    two = np.float64(2.0)

    def expm1(z):
        p = np.float64(0.0)
        for c in coeffs:
            p = (p + c) * z
        for _ in range(k):
            p = p * (p + two)
        return p
    return numba.njit(inline="always")(expm1)


def _tanh_f32():
    """float32 tanh computed in float64 as ``e / (e + 2)`` with ``e = expm1(2|x|)``, then
    rounded once to float32: within 1 ulp of numpy's tanh everywhere. ``|x| >= 9.5`` gives
    exactly ±1 (as the correctly rounded result is), ``tanh(±0) = ±0``, NaN stays NaN.
    expm1: z <= 19 / 2**7 = 0.15, degree 8 (0.15**8 / 9! * 2**7 < 1e-10)."""
    expm1 = _expm1_f64(7, 8)
    f8, f4 = np.float64, np.float32

    def tanh(x):
        a = min(abs(f8(x)), f8(9.5))
        e = expm1(a * f8(2.0 / 2**7))  # e^(2a) - 1
        t = f4(math.copysign(e / (e + f8(2.0)), x))
        return x if x != x else t
    return tanh


def _sigmoid_f32():
    """float32 sigmoid computed in float64 with ``E = exp(|x|)``: ``E / (E + 1)`` for x >= 0
    and ``1 / (E + 1)`` for x < 0 (the eager op's stable formula written with e^|x| instead
    of e^-|x|), then rounded once to float32, subnormals included. ``|x| >= 110`` saturates
    to exactly 1 or 0 (as the correctly rounded results are); NaN stays NaN.
    expm1: z <= 110 / 2**9 = 0.21, degree 9 (0.21**9 / 10! * 2**9 < 2e-10)."""
    expm1 = _expm1_f64(9, 9)
    f8, f4 = np.float64, np.float32

    def sigmoid(x):
        a = min(abs(f8(x)), f8(110.0))
        e = expm1(a * f8(1.0 / 2**9)) + f8(1.0)  # e^a
        s = f4(e / (e + f8(1.0)) if x >= 0 else f8(1.0) / (e + f8(1.0)))
        return x if x != x else s
    return sigmoid


def _sigmoid_f64(x):
    """The eager op's formula: ``z = exp(-|x|)``, then 1 / (1 + z) or z / (1 + z)."""
    z = math.exp(-abs(x))
    return (1.0 if x >= 0 else z) / (1.0 + z)


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
    return (n.op in TEMPLATES and n.op in REGISTRY and get(n.op).elementwise
            and not get(n.op).impure and not n.attrs
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
