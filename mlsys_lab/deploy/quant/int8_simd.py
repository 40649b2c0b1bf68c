"""The inner dot product of the int8 kernels, written with AVX2's ``vpmaddwd`` where LLVM's
auto-vectoriser does not use it well.

``row_dot(row, bt, j) = Σ_k row[k] · bt[j, k]`` in int32, for an int16 row (an activation row
widened once) and a byte weight matrix. Compiled for an AVX-512 or VNNI target, LLVM vectorises
the plain loop itself into 256-bit ``vpmaddwd`` / ``vpdpwssd``. For an AVX2-only target
(``NUMBA_CPU_NAME=haswell``, a Zen 1-3) its cost model picks 128-bit ``vpmaddwd`` instead: 8
multiplies per instruction, no more than a float32 FMA on 8 lanes, so int8 gains nothing. There
:data:`USE_PMADDWD` is true and :func:`row_dot` is a Numba intrinsic that emits the 256-bit
instruction directly (``llvm.x86.avx2.pmadd.wd``): 16 int16 products summed pairwise into 8 int32
lanes, two independent accumulators over 32 values of k per step, then a scalar tail. The loop
nest around it is unchanged. Elsewhere (other CPUs, other targets) the plain loop is used.
"""

from __future__ import annotations

import platform

import numba
import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from ...engine.numba_cache import CACHE

#: CPU names (as ``NUMBA_CPU_NAME`` gives them) with AVX2 but neither AVX-512 nor AVX-VNNI.
AVX2_ONLY = frozenset({"haswell", "broadwell", "skylake", "znver1", "znver2", "znver3",
                       "x86-64-v3"})


def _use_pmaddwd():
    """Whether Numba compiles for an x86 target with AVX2 and without AVX-512 / VNNI."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    name = numba.config.CPU_NAME
    if name and name != "host":
        return name in AVX2_ONLY
    features = llvm.get_host_cpu_features()
    return bool(features.get("avx2")) and not any(
        features.get(f) for f in ("avx512bw", "avx512vnni", "avxvnni"))


USE_PMADDWD = _use_pmaddwd()


@intrinsic
def _pmaddwd_row_dot(typingctx, row, bt, j):
    """``Σ_k row[k] · bt[j, k]`` (int32) with 256-bit ``vpmaddwd``: row int16 1-D, bt a
    C-contiguous int8 or uint8 matrix of rows at least as long as row."""
    if not (isinstance(row, types.Array) and row.dtype == types.int16 and row.ndim == 1
            and isinstance(bt, types.Array) and bt.ndim == 2 and bt.layout == "C"
            and bt.dtype in (types.int8, types.uint8) and isinstance(j, types.Integer)):
        return None
    signed = bt.dtype == types.int8
    sig = types.int32(row, bt, j)

    def codegen(context, builder, signature, args):
        row_v, bt_v, j_v = args
        rows = context.make_array(signature.args[0])(context, builder, row_v)
        mat = context.make_array(signature.args[1])(context, builder, bt_v)
        intp = context.get_value_type(types.intp)
        i16, i32 = ir.IntType(16), ir.IntType(32)
        v16i16, v16i8, v8i32 = ir.VectorType(i16, 16), ir.VectorType(ir.IntType(8), 16), \
            ir.VectorType(i32, 8)
        k = builder.extract_value(rows.shape, 0)
        jv = context.cast(builder, j_v, signature.args[2], types.intp)
        stride = builder.extract_value(mat.strides, 0)
        b_base = builder.gep(builder.bitcast(mat.data, ir.IntType(8).as_pointer()),
                             [builder.mul(jv, stride)])
        r_base = builder.bitcast(rows.data, i16.as_pointer())
        widen = builder.sext if signed else builder.zext
        pmadd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v8i32, [v16i16, v16i16]), "llvm.x86.avx2.pmadd.wd")
        accs = [cgutils.alloca_once_value(builder, ir.Constant(v8i32, None)) for _ in range(2)]
        steps = builder.udiv(k, ir.Constant(intp, 32))
        with cgutils.for_range(builder, steps, intp=intp) as loop:
            start = builder.mul(loop.index, ir.Constant(intp, 32))
            for half, acc in zip((0, 16), accs):
                p = builder.add(start, ir.Constant(intp, half))
                r = builder.load(builder.bitcast(builder.gep(r_base, [p]), v16i16.as_pointer()),
                                 align=1)
                b = builder.load(builder.bitcast(builder.gep(b_base, [p]), v16i8.as_pointer()),
                                 align=1)
                builder.store(builder.add(builder.load(acc),
                                          builder.call(pmadd, [r, widen(b, v16i16)])), acc)
        lanes = builder.add(builder.load(accs[0]), builder.load(accs[1]))
        total = ir.Constant(i32, 0)
        for lane in range(8):
            total = builder.add(total, builder.extract_element(lanes, ir.Constant(i32, lane)))
        out = cgutils.alloca_once_value(builder, total)
        tail = builder.mul(steps, ir.Constant(intp, 32))
        with cgutils.for_range_slice(builder, tail, k, ir.Constant(intp, 1), intp=intp) as (p, _):
            r = builder.sext(builder.load(builder.gep(r_base, [p])), i32)
            b = widen(builder.load(builder.gep(b_base, [p])), i32)
            builder.store(builder.add(builder.load(out), builder.mul(r, b)), out)
        return builder.load(out)

    return sig, codegen


@numba.njit(inline="always", cache=CACHE)
def _loop_row_dot(row, bt, j):
    acc = np.int32(0)
    for p in range(row.shape[0]):
        acc += np.int32(row[p]) * np.int32(bt[j, p])
    return acc


#: ``row_dot(row, bt, j)``: the int32 dot product of an int16 row with byte row ``j`` of bt.
row_dot = _pmaddwd_row_dot if USE_PMADDWD else _loop_row_dot

__all__ = ["AVX2_ONLY", "USE_PMADDWD", "row_dot"]
