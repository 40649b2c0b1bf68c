"""FlashAttention-style attention forward in ``numba.cuda`` (chapter 18).

The CPU kernels of :mod:`.attention` walk key blocks in a loop; on a GPU the same recurrence is
spread over a grid:

* one **block per (head, query tile)** of ``BR`` rows, one **thread per query row**: the thread
  keeps its row of q, its running max ``m``, its running sum ``l`` and its unnormalised output
  row (the (m, l, s) recurrence) in registers;
* the block walks the keys in tiles of ``BC``: its threads load the K and V tiles into
  **shared memory** together (consecutive threads read consecutive addresses: coalesced), wait
  at a barrier, and then every thread reads the whole tile from shared memory (all threads
  read the same element at once: a broadcast, no bank conflicts) — global memory is read once
  per block instead of once per row;
* with ``is_causal`` the walk stops at the block's last row: tiles above the diagonal are never
  loaded;
* head dimensions are compile-time constants (``dmax``, rows zero-padded), so the loops over
  features unroll and q and the output row stay in registers.

Tile sizes are captured by a kernel factory, as in :mod:`.cuda`: :data:`GPU_CONFIG` for a real
GPU, :data:`SIMULATOR_CONFIG` (tiny tiles) for Numba's CUDA simulator, where every thread is a
Python thread. Semantics and results are those of :func:`.attention.attention_forward`
(masks, broadcast batch axes, grouped heads, rows with no key).

The backward (:func:`attention_backward`) recomputes the probabilities from the saved
log-sum-exp as FlashAttention-2 does, in two kernels so that every gradient row has one writer:
a thread per key for dK and dV (query tiles in shared memory), a thread per query for dQ (key
tiles in shared memory) — no atomics, at the price of computing ``q·k`` and ``dO·v`` twice.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
from numba import config as _numba_config
from numba import cuda

from ..errors import ArgumentError, ShapeError
from . import attention


@dataclasses.dataclass(frozen=True)
class AttentionConfig:
    """Compile-time sizes of the CUDA forward.

    Attributes:
        br: query rows per block (= threads per block).
        bc: keys per shared-memory tile.
        pad: head dimensions are rounded up to a multiple of this (1: exact sizes).
    """

    br: int = 64
    bc: int = 64
    pad: int = 16

    def shared_bytes(self, dmax: int, dtype) -> int:
        """Shared memory of one block: the K and V tiles."""
        return 2 * self.bc * dmax * np.dtype(dtype).itemsize


GPU_CONFIG = AttentionConfig(64, 64, 16)
SIMULATOR_CONFIG = AttentionConfig(4, 4, 1)
SHARED_LIMIT = 48 << 10  # bytes of static shared memory a block may declare


@functools.lru_cache(maxsize=None)
def _forward_kernel(dtype_name: str, br: int, bc: int, dmax: int):
    """The forward kernel for one dtype and tile shape (compiled on first launch)."""
    from numba.np import numpy_support

    dtype = np.dtype(dtype_name)
    nt = numpy_support.from_dtype(dtype)
    zero, neg_inf = dtype.type(0), dtype.type(-np.inf)

    @cuda.jit
    def forward(q, k, v, mask, qi, ki, vi, mi, l_step, s_step, use_mask, causal, scale, out,
                lse):
        h, tile, tx = cuda.blockIdx.y, cuda.blockIdx.x, cuda.threadIdx.x
        length, e, keys, ev = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        ks = cuda.shared.array((bc, dmax), nt)
        vs = cuda.shared.array((bc, dmax), nt)
        qrow = cuda.local.array(dmax, nt)
        acc = cuda.local.array(dmax, nt)
        sc = cuda.local.array(bc, nt)
        row = tile * br + tx
        live = row < length
        qh, kh, vh, mh = qi[h], ki[h], vi[h], mi[h]
        for c in range(dmax):
            qrow[c] = q[qh, row, c] * scale if live and c < e else zero
            acc[c] = zero
        m, ell = neg_inf, zero
        block_end = min(tile * br + br, length)
        kend = min(keys, block_end) if causal else keys
        last = row if causal else keys - 1
        for j0 in range(0, kend, bc):
            for idx in range(tx, bc * dmax, br):  # the block loads the tiles together
                jj, c = idx // dmax, idx % dmax
                j = j0 + jj
                ks[jj, c] = k[kh, j, c] if j < keys and c < e else zero
                vs[jj, c] = v[vh, j, c] if j < keys and c < ev else zero
            cuda.syncthreads()
            nb = min(bc, kend - j0)
            if live and j0 <= last:
                mx = neg_inf
                for jj in range(nb):
                    s = zero
                    for c in range(dmax):
                        s += qrow[c] * ks[jj, c]
                    j = j0 + jj
                    if j > last:
                        s = neg_inf
                    elif use_mask:
                        s += mask[mh, row * l_step, j * s_step]
                    sc[jj] = s
                    mx = max(mx, s)
                m_new = max(m, mx)
                if m_new != neg_inf:
                    alpha = math.exp(m - m_new)
                    ell *= alpha
                    for c in range(dmax):
                        acc[c] *= alpha
                    for jj in range(nb):
                        p = math.exp(sc[jj] - m_new)
                        ell += p
                        for c in range(dmax):
                            acc[c] += p * vs[jj, c]
                    m = m_new
            cuda.syncthreads()
        if live:
            if ell > zero:
                for c in range(ev):
                    out[h, row, c] = acc[c] / ell
                lse[h, row] = m + math.log(ell)
            else:
                for c in range(ev):
                    out[h, row, c] = zero
                lse[h, row] = neg_inf

    return forward


@functools.lru_cache(maxsize=None)
def _backward_kernels(dtype_name: str, br: int, bc: int, dmax: int):
    """The two backward kernels (FlashAttention-2's recomputation, split so that no two threads
    write one gradient row and no atomics are needed): ``key_grads`` — a block per (head, key
    tile), a thread per key accumulating its dK and dV rows over query tiles staged in shared
    memory; ``query_grads`` — a block per (head, query tile), a thread per query accumulating
    its dQ row over key tiles in shared memory. Both recompute ``P = exp(s − lse)`` and
    ``dS = P ∘ (dO·v − D)``."""
    from numba.np import numpy_support

    dtype = np.dtype(dtype_name)
    nt = numpy_support.from_dtype(dtype)
    zero, neg_inf = dtype.type(0), dtype.type(-np.inf)

    @cuda.jit(device=True)
    def prob(s, row, j, last, mask, mh, l_step, s_step, use_mask, lse_row):
        if j > last or lse_row == neg_inf:
            return zero
        if use_mask:
            s += mask[mh, row * l_step, j * s_step]
        return math.exp(s - lse_row)

    @cuda.jit
    def key_grads(q, k, v, mask, qi, ki, vi, mi, l_step, s_step, use_mask, causal, scale, g,
                  lse, dsum, dk, dv):
        h, tile, tx = cuda.blockIdx.y, cuda.blockIdx.x, cuda.threadIdx.x
        length, e, keys, ev = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        qs = cuda.shared.array((br, dmax), nt)
        gs = cuda.shared.array((br, dmax), nt)
        krow = cuda.local.array(dmax, nt)
        vrow = cuda.local.array(dmax, nt)
        dka = cuda.local.array(dmax, nt)
        dva = cuda.local.array(dmax, nt)
        j = tile * bc + tx
        live = j < keys
        qh, kh, vh, mh = qi[h], ki[h], vi[h], mi[h]
        for c in range(dmax):
            krow[c] = k[kh, j, c] if live and c < e else zero
            vrow[c] = v[vh, j, c] if live and c < ev else zero
            dka[c] = zero
            dva[c] = zero
        first = (tile * bc // br) * br if causal else 0
        for i0 in range(first, length, br):
            for idx in range(tx, br * dmax, bc):
                ii, c = idx // dmax, idx % dmax
                i = i0 + ii
                qs[ii, c] = q[qh, i, c] if i < length and c < e else zero
                gs[ii, c] = g[h, i, c] if i < length and c < ev else zero
            cuda.syncthreads()
            if live:
                for ii in range(min(br, length - i0)):
                    i = i0 + ii
                    s = zero
                    dp = zero
                    for c in range(dmax):
                        s += qs[ii, c] * krow[c]
                        dp += gs[ii, c] * vrow[c]
                    p = prob(s * scale, i, j, i if causal else keys, mask, mh, l_step, s_step,
                             use_mask, lse[h, i])
                    ds = p * (dp - dsum[h, i]) * scale
                    for c in range(dmax):
                        dva[c] += p * gs[ii, c]
                        dka[c] += ds * qs[ii, c]
            cuda.syncthreads()
        if live:
            for c in range(e):
                dk[h, j, c] = dka[c]
            for c in range(ev):
                dv[h, j, c] = dva[c]

    @cuda.jit
    def query_grads(q, k, v, mask, qi, ki, vi, mi, l_step, s_step, use_mask, causal, scale, g,
                    lse, dsum, dq):
        h, tile, tx = cuda.blockIdx.y, cuda.blockIdx.x, cuda.threadIdx.x
        length, e, keys, ev = q.shape[1], q.shape[2], k.shape[1], v.shape[2]
        ks = cuda.shared.array((bc, dmax), nt)
        vs = cuda.shared.array((bc, dmax), nt)
        qrow = cuda.local.array(dmax, nt)
        grow = cuda.local.array(dmax, nt)
        dqa = cuda.local.array(dmax, nt)
        i = tile * br + tx
        live = i < length
        qh, kh, vh, mh = qi[h], ki[h], vi[h], mi[h]
        for c in range(dmax):
            qrow[c] = q[qh, i, c] if live and c < e else zero
            grow[c] = g[h, i, c] if live and c < ev else zero
            dqa[c] = zero
        lse_row = lse[h, i] if live else neg_inf
        d = dsum[h, i] if live else zero
        kend = min(keys, min(tile * br + br, length)) if causal else keys
        for j0 in range(0, kend, bc):
            for idx in range(tx, bc * dmax, br):
                jj, c = idx // dmax, idx % dmax
                j = j0 + jj
                ks[jj, c] = k[kh, j, c] if j < keys and c < e else zero
                vs[jj, c] = v[vh, j, c] if j < keys and c < ev else zero
            cuda.syncthreads()
            if live:
                for jj in range(min(bc, kend - j0)):
                    s = zero
                    dp = zero
                    for c in range(dmax):
                        s += qrow[c] * ks[jj, c]
                        dp += grow[c] * vs[jj, c]
                    p = prob(s * scale, i, j0 + jj, i if causal else keys, mask, mh, l_step,
                             s_step, use_mask, lse_row)
                    ds = p * (dp - d) * scale
                    for c in range(dmax):
                        dqa[c] += ds * ks[jj, c]
            cuda.syncthreads()
        if live:
            for c in range(e):
                dq[h, i, c] = dqa[c]

    return key_grads, query_grads


def simulator_enabled() -> bool:
    """True when Numba's CUDA simulator is on (``NUMBA_ENABLE_CUDASIM=1``)."""
    return bool(_numba_config.ENABLE_CUDASIM)


def _config_for(config, dmax, dtype):
    config = config or (SIMULATOR_CONFIG if simulator_enabled() else GPU_CONFIG)
    pad = max(config.pad, 1)
    dmax = max(-(-dmax // pad) * pad, 1)
    bc = config.bc
    while bc > 1 and config.shared_bytes(dmax, dtype) * bc // config.bc > SHARED_LIMIT:
        bc //= 2  # float64 or wide heads: smaller key tiles so K and V fit shared memory
    return dataclasses.replace(config, bc=bc), dmax


def attention_forward(q, k, v, attn_mask=None, *, is_causal=False, scale=None, enable_gqa=False,
                      config: AttentionConfig | None = None):
    """The tiled forward on the GPU: ``(out, lse)`` as :func:`.attention.attention_forward`.

    Args:
        q, k, v, attn_mask, is_causal, scale, enable_gqa: as for the CPU kernel. numpy arrays
            (any batch axes, broadcasting, masks), or CUDA device arrays of one shape
            ``(..., L, E)`` / ``(..., S, E)`` / ``(..., S, Ev)`` without a mask.
        config: tile sizes (default :data:`GPU_CONFIG`, or :data:`SIMULATOR_CONFIG` under the
            simulator).

    Returns:
        ``(out, lse)``: numpy arrays for numpy inputs, device arrays for device inputs.
    """
    if not isinstance(q, np.ndarray) and hasattr(q, "copy_to_host"):  # a device array
        return _forward_device(q, k, v, attn_mask, is_causal, scale, config)
    pb = attention._prepare(q, k, v, attn_mask, is_causal, scale, enable_gqa,
                            attention.Blocks(1, 1, 0, "unused"))
    L, e = pb.q.shape[1:]
    ev = pb.v.shape[2]
    out = np.zeros((pb.heads, L, ev), pb.q.dtype)
    lse = np.full((pb.heads, L), -np.inf, pb.q.dtype)
    if pb.heads and L:
        stack = pb.mask_stack
        steps = (int(stack.shape[1] != 1), int(stack.shape[2] != 1))
        d_out, d_lse = cuda.to_device(out), cuda.to_device(lse)
        _launch(pb.q, pb.k, pb.v, stack, pb.qi, pb.ki, pb.vi, pb.mi, steps,
                pb.mask_kind == attention.ADD_MASK, pb.causal, pb.scale, d_out, d_lse, config)
        out, lse = d_out.copy_to_host(), d_lse.copy_to_host()
    return out.reshape(pb.batch + (L, ev)), lse.reshape(pb.batch + (L,))


def _launch(q, k, v, mask, qi, ki, vi, mi, steps, use_mask, causal, scale, out, lse, config):
    heads, length, ev = out.shape
    dtype = np.dtype(q.dtype)
    cfg, dmax = _config_for(config, max(q.shape[2], ev), dtype)
    kernel = _forward_kernel(dtype.name, cfg.br, cfg.bc, dmax)
    grid = (-(-length // cfg.br), heads)
    ins = [cuda.to_device(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
           for a in (q, k, v, mask, qi, ki, vi, mi)]  # copied once, never written back
    kernel[grid, cfg.br](*ins, steps[0], steps[1], bool(use_mask), bool(causal),
                         dtype.type(scale), out, lse)


def _forward_device(q, k, v, attn_mask, is_causal, scale, config):
    if attn_mask is not None:
        raise ArgumentError(
            f"{attention.OP} (cuda): a mask is taken with numpy inputs only")
    qs, ks, vs = (tuple(a.shape) for a in (q, k, v))  # the simulator's shapes slice badly
    if not (qs[:-2] == ks[:-2] == vs[:-2]) or qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        raise ShapeError(f"{attention.OP} (cuda): device inputs need one batch shape, "
                         f"got q {qs}, k {ks}, v {vs}")
    batch, (L, e), (S, ev) = qs[:-2], qs[-2:], vs[-2:]
    heads = math.prod(batch)
    dtype = np.dtype(q.dtype)
    if scale is None:
        scale = 1.0 / math.sqrt(e) if e else 1.0
    out = cuda.device_array((heads, L, ev), dtype)
    lse = cuda.device_array((heads, L), dtype)
    if heads and L:
        index = cuda.to_device(np.arange(heads, dtype=np.int64))
        mask = cuda.to_device(np.zeros((1, 1, 1), dtype))
        _launch(q.reshape(heads, L, e), k.reshape(heads, S, e), v.reshape(heads, S, ev), mask,
                index, index, index, cuda.to_device(np.zeros(heads, np.int64)), (0, 0), False,
                is_causal, scale, out, lse, config)
    return out.reshape(*batch, L, ev), lse.reshape(*batch, L)


def attention_backward(g, q, k, v, out, lse, attn_mask=None, *, is_causal=False, scale=None,
                       enable_gqa=False, config: AttentionConfig | None = None):
    """FlashAttention-2's backward on the GPU, numpy in and out: ``(dq, dk, dv)`` as
    :func:`.attention.attention_backward` gives them, from the forward's ``out`` and ``lse``.
    ``D = rowsum(dO ∘ O)`` is computed on the host (O(L)); two kernels recompute the
    probabilities (see :func:`_backward_kernels`)."""
    pb = attention._prepare(q, k, v, attn_mask, is_causal, scale, enable_gqa,
                            attention.Blocks(1, 1, 0, "unused"))
    heads, (L, e), (S, ev) = pb.heads, pb.q.shape[1:], pb.v.shape[1:]
    dtype = pb.q.dtype
    want, want_lse = pb.batch + (L, ev), pb.batch + (L,)
    g, out, lse = (np.asarray(a) for a in (g, out, lse))
    if g.shape != want or out.shape != want or lse.shape != want_lse:
        raise ShapeError(f"{attention.OP} backward (cuda): g and out must be {want} and lse "
                         f"{want_lse}, got g {g.shape}, out {out.shape}, lse {lse.shape}")
    dq = np.zeros((heads, L, e), dtype)
    dk = np.zeros((heads, S, e), dtype)
    dv = np.zeros((heads, S, ev), dtype)
    if heads and L and S:
        g3, o3 = (np.ascontiguousarray(a, dtype).reshape(heads, L, ev) for a in (g, out))
        lse2 = np.ascontiguousarray(lse, dtype).reshape(heads, L)
        dsum = np.einsum("hlc,hlc->hl", g3, o3).astype(dtype)
        cfg, dmax = _config_for(config, max(e, ev), dtype)
        key_grads, query_grads = _backward_kernels(dtype.name, cfg.br, cfg.bc, dmax)
        stack = pb.mask_stack
        steps = (int(stack.shape[1] != 1), int(stack.shape[2] != 1))
        ins = [cuda.to_device(np.ascontiguousarray(a)) for a in
               (pb.q, pb.k, pb.v, stack, pb.qi, pb.ki, pb.vi, pb.mi)]
        common = (*ins, steps[0], steps[1], pb.mask_kind == attention.ADD_MASK, pb.causal,
                  pb.scale, *(cuda.to_device(a) for a in (g3, lse2, dsum)))
        d_dk, d_dv, d_dq = (cuda.to_device(a) for a in (dk, dv, dq))
        key_grads[(-(-S // cfg.bc), heads), cfg.bc](*common, d_dk, d_dv)
        query_grads[(-(-L // cfg.br), heads), cfg.br](*common, d_dq)
        dq, dk, dv = d_dq.copy_to_host(), d_dk.copy_to_host(), d_dv.copy_to_host()
    q, k, v = (np.asarray(a) for a in (q, k, v))
    return (attention._sum_to(dq, pb.qi, q.shape), attention._sum_to(dk, pb.ki, k.shape),
            attention._sum_to(dv, pb.vi, v.shape))
