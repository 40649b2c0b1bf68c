"""What an int8 GEMM computes on an x86 CPU without VNNI (book ch. 10: the same quantised model
can give different answers on different CPUs).

An x86 u8 × s8 kernel without VNNI multiplies bytes with ``vpmaddubsw``: it multiplies unsigned
activation bytes by signed weight bytes and adds *adjacent pairs* of products into a **saturating
int16** lane, before ``vpmaddwd`` (by ones) widens the pairs to int32. Two products of up to
255 · 127 = 32385 each can sum past 32767, and then the pair is clipped: the accumulator is no
longer the exact dot product. With VNNI (``vpdpbusd``, AVX512-VNNI or AVX-VNNI) four products go
straight into int32 and nothing saturates. onnxruntime's optimised QDQ → QLinear path (its MLAS
U8S8 kernels) works this way, so on a Zen 3 it can be many quantisation steps off where a Zen 5
is exact; its documented remedies are 7-bit weights (``reduce_range``: two products then stay
below 2 · 255 · 63 = 32130) or u8 × u8 kernels (session option
``session.x64quantprecision=1``). mlsys_lab's own int8 kernels widen to int16 *before* the
multiply (``vpmaddwd``), so they are exact on every CPU.

This module is the arithmetic model of the saturating kernel, for teaching and for tests:

* :func:`pair_sums_matmul` — ``a @ w`` with every adjacent pair of products clipped to int16;
* :func:`run_int16_pairs` — a graph lowered by :func:`~.int8_kernels.lower_qdq`, run with every
  u8 × s8 ``qlinear_matmul`` accumulating that way (checked against onnxruntime's optimised
  session on an AVX2-only CPU: identical outputs; convolutions are not modelled, as the order in
  which a convolution kernel pairs its window's bytes is its own);
* :func:`host_has_vnni` — whether this CPU has the instruction that avoids it.

Where the activation zero point is not 0, the kernel still multiplies the raw bytes and corrects
with ``z_x · Σ_k w`` afterwards, so the saturation happens on the raw bytes; the model below does
the same.
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import binding as llvm

from ...engine.interpreter import Interpreter
from ...errors import DTypeError, ShapeError
from .int8_kernels import qmm_accumulator, requantize_np

INT16 = np.iinfo(np.int16)


def host_has_vnni() -> bool:
    """Whether this CPU is x86 with AVX512-VNNI or AVX-VNNI (int8 dot products into int32)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = llvm.get_host_cpu_features()
    return bool(features.get("avx512vnni") or features.get("avxvnni"))


def pair_sums_matmul(a, w):
    """``a @ w`` for uint8 ``a`` (M, K) and int8 ``w`` (K, N) as ``vpmaddubsw`` computes it:
    products ``a[:, k] · w[k]`` summed over the pairs ``(0, 1), (2, 3), …`` of k, each pair
    clipped to int16, then the pairs summed exactly. Returns int64 (M, N); an odd K is padded
    with a zero product, as the packed kernel does."""
    a, w = np.asarray(a), np.asarray(w)
    if a.dtype != np.uint8 or w.dtype != np.int8:
        raise DTypeError(f"pair_sums_matmul: models uint8 x int8 (vpmaddubsw), got {a.dtype} x "
                         f"{w.dtype}")
    if a.ndim != 2 or w.ndim != 2 or a.shape[1] != w.shape[0]:
        raise ShapeError(f"pair_sums_matmul: need (M, K) @ (K, N), got {a.shape} @ {w.shape}")
    if a.shape[1] % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        w = np.pad(w, ((0, 1), (0, 0)))
    a16, w16 = a.astype(np.int64), w.astype(np.int64)
    pairs = a16[:, 0::2, None] * w16[None, 0::2] + a16[:, 1::2, None] * w16[None, 1::2]
    return np.clip(pairs, INT16.min, INT16.max).sum(axis=1)


def _saturation(a, w):
    """What int16 pair sums change in ``a @ w`` (zero where nothing saturates)."""
    return pair_sums_matmul(a, w) - a.astype(np.int64) @ w.astype(np.int64)


def _saturates(x, w):
    return x.dtype == np.uint8 and w.dtype == np.int8


class Int16PairsInterpreter(Interpreter):
    """The interpreter, with every u8 × s8 ``qlinear_matmul`` accumulating in saturating int16
    pairs (every other node, and other byte types, exactly as usual)."""

    def run_node(self, node, args):
        if node.op != "qlinear_matmul" or not _saturates(args[0], args[3]):
            return super().run_node(node, args)
        x, xs, xz, w, ws, wz, ys, yz, bias = args
        a = x.reshape(-1, x.shape[-1])
        acc = qmm_accumulator(a, xz, w, wz, bias) + _saturation(a, w)
        y = requantize_np(acc, xs, ws, ys, yz, node.attrs.get("activation"), yz.dtype, 1)
        return y.reshape(x.shape[:-1] + (w.shape[1],))


def run_int16_pairs(graph, *inputs):
    """The outputs of a lowered int8 graph (:func:`~.int8_kernels.lower_qdq`) as an x86 CPU
    without VNNI computes them: u8 × s8 ``qlinear_matmul`` products summed in saturating int16
    pairs. Convolutions run exactly: onnxruntime, for one, runs the exported ``Conv`` whose bias
    is a separate ``Add`` in float32 (dequantised), and fuses only ``MatMul`` + ``Add`` into its
    integer ``QGemm``."""
    return Int16PairsInterpreter(graph).run(*inputs)
