"""Elementwise fusion: a chain or tree of elementwise ops becomes ONE ``fused_elementwise`` node
that runs as ONE generated Numba loop over the output.

The fused node's ``program`` attr is a tuple of steps ``(op_name, arg_indices)``: index ``i <
n_inputs`` is the node's i-th input, index ``n_inputs + k`` the result of step k; the last step is
the output. ``relu(x * a + b)`` with inputs (x, a, b) is
``(('mul', (0, 1)), ('add', (3, 2)), ('relu', (4,)))``.

The op has two kernels: the numpy reference ``compute`` (each step with the op's own kernel, so it
matches the unfused graph bit for bit), and the generated Numba kernel
(:func:`fused_elementwise_into`), registered as the ``numba.fused_elementwise`` kernel of the
``cpu`` and ``cpu-numba`` devices for float32/float64 results. The Numba kernel reads each input
element once, keeps the intermediates in registers and writes the output once, where the unfused
graph makes one full pass over memory (and one temporary array) per op.
"""

import math

import numpy as np

from ... import dtypes
from ...registry import REGISTRY, AVal, defop, get, register_impl
from ...tensor import run_kernel
from ..rewrite import Rewriter, graph_pass

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


FUSED_ELEMENTWISE = REGISTRY.get("fused_elementwise") or defop(
    "fused_elementwise", compute=run_program, infer=_fused_infer, elementwise=True,
    unfusable_reason="it is the fused loop itself (its program is an attribute)")


# --- code generation --------------------------------------------------------------------------
def kernel_source(program, kinds):
    """Python source of the loop for ``program``; ``kinds[i]`` is 's' when input i is a single
    element (read once, before the loop) and 'a' when it is a flat array of the output's size.

    Each step is its op's ``fusion`` template with its arguments' names as ``{0}``, ``{1}``,
    ... and ``{s0}``, ``{s1}``, ... as ``_s`` where that argument is one value for the whole
    loop, the one element the eager op would see as a one-element array (an input of kind
    's'; any argument when every input is one element), else as nothing: ``pow``'s
    ``_pow{s1}({0}, {1})`` takes numpy's scalar-exponent rules only then, as the eager op
    does."""
    n = len(kinds)
    lines = [f"def fused_kernel(out{''.join(f', in{i}' for i in range(n))}):"]
    lines += [f"    x{i} = in{i}[0]" for i, k in enumerate(kinds) if k == "s"]
    lines.append("    for i in range(out.size):")
    lines += [f"        x{i} = in{i}[i]" for i, k in enumerate(kinds) if k == "a"]
    names = [f"x{i}" for i in range(n)]
    one = [k == "s" for k in kinds]
    for k, (op, args) in enumerate(program):
        scalar = {f"s{j}": "_s" if one[a] else "" for j, a in enumerate(args)}
        lines.append(f"        t{k} = "
                     + get(op).fusion.format(*[names[a] for a in args], **scalar))
        names.append(f"t{k}")
        one.append("a" not in kinds)
    lines.append(f"        out[i] = {names[-1]}")
    return "\n".join(lines) + "\n"


def compile_kernel(program, kinds, dtype):
    """The compiled Numba kernel for ``program`` (cached: compiled once per program, input kinds
    and dtype)."""
    key = (program, tuple(kinds), dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))
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
    ``tests/engine/test_compile_correctness.py`` measures them). ``pow`` has the eager op's special
    values (:func:`~mlsys_lab.engine.ops_math.power`): ``_pow_s`` for one exponent for the
    whole loop, numpy's ``x ** c`` for a number (0.5 is ``sqrt``, so ``-inf ** 0.5`` is NaN;
    -1, 2, 1 and 0 as numpy), ``_pow`` for an exponent array, C's ``pow`` (``+inf``);
    ``tests/engine/test_special_values.py`` checks every op against numpy and eager.
    ``tanh`` and ``sigmoid`` use only arithmetic, FMAs and bit operations, so LLVM vectorises
    the loop: ``math.tanh`` and ``math.exp`` compile to one libm call per element, which it
    cannot vectorise (Numba has no SVML here), and are 5-20x slower than numpy's SIMD kernels.
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

        half, two = dt.type(0.5), dt.type(2)

        def pow_(a, b):  # an exponent array: C's pow
            return a ** b

        def pow_scalar(a, b):  # one exponent for the whole loop: numpy's x ** c for a number c
            if b == half:
                return math.sqrt(a)  # -inf -> NaN and -0. -> -0., where C's pow gives inf, 0.
            if b == two:
                return a * a
            if b == minus_one:
                return one / a
            if b == one:
                return a
            return one if b == zero else a ** b

        sigmoid = _sigmoid_f32() if dt == np.float32 else _sigmoid_f64()
        _HELPERS[dt.str] = dict(
            math=math, ZERO=zero, ONE=one, _relu=inline(relu), _maximum=inline(maximum),
            _minimum=inline(minimum), _sign=inline(sign), _pow=inline(pow_),
            _pow_s=inline(pow_scalar),
            _tanh=inline(_tanh(dt)), _sigmoid=inline(sigmoid))
    return dict(_HELPERS[dt.str])


# --- vectorisable tanh, exp and sigmoid ---------------------------------------------------------
#: Polynomial coefficients, highest degree first, by dtype. ``_TANH_R``: ``R(t) ~ (tanh(x) -
#: x) / x**3`` with ``t = x*x`` on ``0 <= x <= 1``; ``_EXP_2S``: ``E(s) ~ e**(2s)`` on ``|s| <=
#: ln(2) / 4``.
#: float32: minimax for the relative error of tanh and of e**(2s) (Lawson's algorithm), each
#: coefficient rounded to float32 in turn with the higher ones refitted; float64: Chebyshev fits
#: (``mpmath.chebyfit``, 50 digits). Each fit's error is far below half an ulp of its dtype.
_TANH_R = {
    "float32": (-0.00035841067, 0.002301272, -0.007946064, 0.0214867, -0.05387985, 0.13332346,
                -0.33333296),
    "float64": (2.5155023659382105e-08, -2.6330772232959337e-07, 1.3791814499083342e-06,
                -4.987760317520347e-06, 1.4606131676715378e-05, -3.8389607893147334e-05,
                9.646277743313181e-05, -0.00023895705228738225, 0.0005899792946300052,
                -0.0014558246920964941, 0.003592126679366341, -0.008863235404578283,
                0.02186948852912909, -0.05396825396804637, 0.1333333333333309,
                -0.3333333333333333),
}
_EXP_2S = {
    "float32": (0.088437095, 0.26779303, 0.6666927, 1.3333218, 1.9999998, 2.0, 1.0),
    "float64": (5.1425357017013815e-05, 0.00028295822990378013, 0.0014109307350312432,
                0.0063491802834760944, 0.025396825459260305, 0.08888888929481456,
                0.26666666666622724, 0.6666666666638096, 1.3333333333333344,
                2.0000000000000075, 2.0, 1.0),
}


_INTRINSICS = {}


def numba_intrinsics():
    """``fma(a, b, c)``: a*b + c rounded once (LLVM's ``llvm.fma``, one vector instruction on
    AVX2); ``add_exponent(p, kb)``: ``p * 2**k`` for a normal result, where ``kb = k + 1.5 *
    2**m`` (m = 23 or 52) holds k in its low mantissa bits, made by adding the bits of ``kb``
    shifted to the exponent field to those of ``p``. Both float32 and float64. ``llvm.fma`` gives
    the same bits on every target; on one without FMA instructions (``NUMBA_CPU_NAME=generic``)
    it becomes a libm call per element, 60x slower."""
    if "fma" not in _INTRINSICS:
        from llvmlite import ir
        from numba.core import types
        from numba.extending import intrinsic

        @intrinsic
        def fma(typingctx, a, b, c):
            if isinstance(a, types.Float) and a == b == c:
                return a(a, b, c), lambda context, builder, sig, args: builder.fma(*args)
            return None

        @intrinsic
        def add_exponent(typingctx, p, kb):
            if not (isinstance(p, types.Float) and p == kb):
                return None

            def codegen(context, builder, sig, args):
                bits = ir.IntType(p.bitwidth)
                shift = ir.Constant(bits, 23 if p.bitwidth == 32 else 52)
                p_bits, kb_bits = (builder.bitcast(a, bits) for a in args)
                total = builder.add(p_bits, builder.shl(kb_bits, shift))
                return builder.bitcast(total, context.get_value_type(p))
            return p(p, kb), codegen
        _INTRINSICS.update(fma=fma, add_exponent=add_exponent)
    return _INTRINSICS["fma"], _INTRINSICS["add_exponent"]


def _exp_2x_parts(dt):
    """``parts(v) -> (p, kb)`` with ``e**(2v) = p * 2**k`` (``kb`` as in :func:`numba_intrinsics`),
    for ``2v`` within the exponent range: ``k = rint(2v / ln 2)``, ``s = v - k ln(2)/2`` (Cody
    and Waite) and ``p = E(s)``, the polynomial ``_EXP_2S``. float64 splits ln(2)/2 in two (the
    high part, fdlibm's, has 21 trailing zero bits, so ``k * hi`` is exact); float32 uses one
    constant, the FMA rounding ``v - k * hi`` once: its error times the callers' ``k <= 27`` is
    below 3e-8, which tanh damps to a small fraction of an ulp."""
    import numba

    fma, _ = numba_intrinsics()
    f = dt.type
    coeffs = tuple(f(c) for c in _EXP_2S[dt.name])
    magic = f(1.5 * 2.0 ** (np.finfo(dt).nmant))  # adding it rounds to an integer, kept in bits
    to_k = f(2 / math.log(2))
    if dt == np.float64:
        ln2_hi, ln2_lo = f(6.93147180369123816490e-01 / 2), f(1.90821492927058770002e-10 / 2)
    else:
        ln2_hi, ln2_lo = f(math.log(2) / 2), f(0)

    @numba.njit(inline="always")
    def horner(z, cs):
        p = cs[0]
        for c in cs[1:]:
            p = fma(p, z, c)
        return p

    def parts(v):
        kb = fma(v, to_k, magic)
        k = kb - magic
        s = fma(k, -ln2_hi, v)
        if ln2_lo:
            s = fma(k, -ln2_lo, s)
        return horner(s, coeffs), kb
    return numba.njit(inline="always")(parts), horner


def _tanh_saturation(dt, clamp):
    """The smallest ``x <= clamp`` with ``np.tanh(x) == 1`` (bisection over the bit patterns; numpy
    2.4 saturates float32 from 10.0, float64 from 18.990341103219276, 1 ulp before the correctly
    rounded 19.0615), or ``clamp`` when numpy saturates later: the generated tanh gives exactly ±1
    from there on, so compiled and eager agree wherever eager saturates."""
    ints = np.dtype(f"i{dt.itemsize}")
    lo, hi = (int(b) for b in np.array([1, clamp], dt).view(ints))

    def is_one(i):
        return np.tanh(np.array(i, ints).view(dt)) == 1

    if not is_one(hi):
        return dt.type(clamp)
    while hi - lo > 1:  # np.tanh(lo) < 1 == np.tanh(hi)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if is_one(mid) else (mid, hi)
    return np.array(hi, ints).view(dt)[()]


def _tanh(dt):
    """tanh in float32 or float64, within 1 ulp of the correctly rounded result (float32:
    checked for every float; float64: on 9 million samples), and vectorisable.

    ``|x| < 1``: ``x + x**3 R(x*x)``; ``|x| >= 1``: ``1 - 2 / (1 + e**(2|x|))``. In both, the
    term added to the exact leading part is at most 0.24, a third of the result, so its rounding
    errors count a third. For the exponential ``|x|`` is clamped to 9.5 (float32) or 20
    (float64), where the formula gives exactly 1; exactly ±1 from :func:`_tanh_saturation` on.
    The sign is copied back, so ``tanh(-0.) = -0.``; NaN stays NaN.
    """
    fma, add_exponent = numba_intrinsics()
    parts, horner = _exp_2x_parts(dt)
    f = dt.type
    coeffs = tuple(f(c) for c in _TANH_R[dt.name])
    one, two, split = f(1), f(2), f(1)
    clamp = f(9.5) if dt == np.float32 else f(20)
    saturation = _tanh_saturation(dt, clamp)

    def tanh(x):
        a = abs(x)
        p, kb = parts(min(a, clamp))
        large = one - two / (one + add_exponent(p, kb))
        if saturation < clamp:  # a compile-time constant: float64 only
            large = one if a >= saturation else large
        t = a * a
        small = fma(a * t, horner(t, coeffs), a)
        return math.copysign(large if a >= split else small, x)  # NaN takes the `small` side
    return tanh


def _sigmoid_f32():
    """float32 sigmoid bit for bit as the eager op computes it: ``z = exp(-|x|)``, then ``(1 if
    x >= 0 else z) / (1 + z)`` in float32, with ``exp`` numpy's own float32 SIMD kernel replayed
    operation for operation (``simd_exp_FLOAT`` in numpy/_core/src/umath/
    loops_exponent_log.dispatch.c.src, constants from npy_simd_data.h: range reduction ``y = x
    - k ln 2``, a 5th/2nd degree rational for e**y, ``2**k`` by scaling, subnormals rounded once,
    0 below -103.97). So the generated kernel equals eager mode exactly wherever numpy uses that
    kernel (x86-64 with AVX2 or AVX512F); where numpy calls libm's expf instead, the two differ by
    numpy's kernel's error, at most 2.52 ulp in z."""
    fma, add_exponent = numba_intrinsics()
    f = np.float32
    num = tuple(map(f, (5.082762527590693718096e-04, 6.757896990527504603057e-03,
                        5.114512081637298353406e-02, 2.473615434895520810817e-01,
                        7.257664613233124478488e-01, 9.999999999980870924916e-01)))
    den = tuple(map(f, (2.159509375685829852307e-02, -2.742335390411667452936e-01, 1.0)))
    log2e, magic = f(1.442695040888963407359924681001892137), f(1.5 * 2**23)
    ln2_hi, ln2_lo = f(-6.93145752e-1), f(-1.42860677e-6)
    xmin, zero, one = f(-103.97208404541015625), f(0), f(1)
    up, down = f(64), f(2.0**-64)  # p * 2**(k + 64) is normal and exact; * 2**-64 rounds once

    def sigmoid(x):
        y = -abs(x)
        under = y <= xmin
        y = zero if under else y
        kb = y * log2e + magic  # two roundings, as in numpy
        k = kb - magic
        r = fma(k, ln2_lo, fma(k, ln2_hi, y))
        p = num[0]
        for c in num[1:]:
            p = fma(p, r, c)
        q = den[0]
        for c in den[1:]:
            q = fma(q, r, c)
        z = zero if under else add_exponent(p / q, kb + up) * down
        s = (one if x >= zero else z) / (one + z)
        return s if x == x else x
    return sigmoid


def _sigmoid_f64():
    """float64 sigmoid by the eager op's formula, ``z = exp(-|x|)``, then ``(1 if x >= 0 else z)
    / (1 + z)``, with ``exp`` from :func:`_exp_2x_parts` (``e**(-|x|) = e**(2v)``, ``v =
    -|x|/2``), rounded once into the subnormals (``e**-745.14`` already rounds to 0); NaN stays
    NaN."""
    _, add_exponent = numba_intrinsics()
    parts, _ = _exp_2x_parts(np.dtype(np.float64))

    def sigmoid(x):
        v = max(-0.5 * abs(x), -373.0)  # e**-746 rounds to 0
        p, kb = parts(v)
        z = add_exponent(p, kb + 512.0) * 2.0**-512  # p * 2**(k+512) is normal; rounds once
        z = 0.0 if v <= -373.0 else z
        s = (1.0 if x >= 0 else z) / (1.0 + z)
        return s if x == x else x
    return sigmoid


def fused_elementwise_numba(*arrays, program):
    """``program`` run by its generated loop (:func:`fused_elementwise_into`) into a new array;
    a float16 or non-float result is computed by the numpy reference instead."""
    arrays = [np.asarray(a) for a in arrays]
    aval = program_aval([AVal(a.shape, a.dtype) for a in arrays], program)
    if aval.dtype not in (np.float32, np.float64):
        return run_program(*arrays, program=program)
    out = np.empty(aval.shape, aval.dtype)
    fused_elementwise_into(out, *arrays, program=program)
    return out


def fused_elementwise_into(out, *arrays, program):
    """Run the generated kernel of ``program`` writing into ``out``, a float32/float64 array of
    the output's shape and dtype (a planned arena buffer, say): the ``numba.fused_elementwise``
    kernel that operator selection chooses on ``cpu`` and ``cpu-numba``.

    ``arrays`` are numpy arrays. Inputs of one element are passed as scalars and inputs of the
    output's size as flat arrays (copied only when not C-contiguous); an input that broadcasts
    is materialised at the output's shape first, and a strided ``out`` is written through a
    temporary. ``out`` may be one of the inputs (the loop reads element i of each input before
    it writes element i).
    """
    dt, size = out.dtype, out.size
    args, kinds = [], ""
    for a in arrays:
        if a.dtype != dt and a.dtype != np.bool_:
            a = a.astype(dt)
        if a.size == 1:
            args.append(a.reshape(1))
            kinds += "s"
            continue
        if a.size != size:  # it broadcasts; one of the output's size reads in the same order
            full = np.empty(out.shape, a.dtype)
            full[...] = a  # (a third of np.broadcast_to(a, shape).reshape(-1)'s cost)
            a = full
        args.append(a.reshape(-1))  # a view, or a C-order copy of a strided input
        kinds += "a"
    target = out if out.flags.c_contiguous else np.empty(out.shape, dt)
    key = (program, tuple(kinds), dt)
    kernel = KERNEL_CACHE.get(key) or compile_kernel(*key)
    kernel(target.reshape(-1), *args)
    if target is not out:
        np.copyto(out, target)


def _float_result(avals, out, attrs):
    """The generated loop computes in float32 or float64 only."""
    dt = np.dtype(out.dtype)
    return None if dt in (np.float32, np.float64) else f"result dtype {dt.name}"


for _device in ("cpu", "cpu-numba"):
    register_impl("fused_elementwise", _device, fused_elementwise_into,
                  name="numba.fused_elementwise", dtypes=("float32", "float64"),
                  accepts=_float_result)


# --- the pass ---------------------------------------------------------------------------------
def _fusable(n):
    return (n.op in REGISTRY and get(n.op).fusion is not None and get(n.op).elementwise
            and not get(n.op).impure and not n.attrs
            and len(n.outputs) == 1 and dtypes.is_float(n.output.dtype)
            and _computes_in_output_dtype(n))


def _computes_in_output_dtype(n):
    """Whether numpy computes the node in its output dtype. ``int32 + float32`` is float32 here
    (PyTorch's rule) but numpy adds in float64 and the eager op rounds once to float32, where
    the generated loop, which converts each input to the output dtype, would round twice (the
    int to float32, then the sum): such a node stays a node of its own."""
    try:
        return np.result_type(*[v.dtype for v in n.inputs]) == n.output.dtype
    except TypeError:
        return False


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
