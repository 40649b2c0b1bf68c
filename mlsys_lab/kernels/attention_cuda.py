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
(masks, broadcast batch axes, grouped heads, rows with no key). The backward stays on the CPU.
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
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) or q.shape[-1] != k.shape[-1] \
            or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{attention.OP} (cuda): device inputs need one batch shape, "
                                   f"got q {q.shape}, k {k.shape}, v {v.shape}")
    batch, (L, e), (S, ev) = q.shape[:-2], q.shape[-2:], v.shape[-2:]
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
