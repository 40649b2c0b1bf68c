"""FlashAttention-style scaled dot-product attention on the CPU, in Numba (chapter 18).

Exact attention ``softmax(q kᵀ · scale + mask) v`` writes an L×S score matrix per head: at
L = S = 8192 that is 268 MB of float32 for one head, and every byte of it crosses the memory
bus twice. FlashAttention (Dao et al. 2022; FlashAttention-2, Dao 2023) never forms it. It walks
the keys in blocks of ``Bc`` for each block of ``Br`` queries and keeps, per query row, three
running quantities — the **(m, l, s) recurrence** of online softmax:

* ``m``: the largest score seen so far;
* ``l``: Σ exp(score − m) over the keys seen so far;
* ``s``: Σ exp(score − m) · v over the keys seen so far (the unnormalised output row).

A new key block with row maximum ``m̃`` rescales the old sums by ``exp(m − max(m, m̃))`` before
adding its own terms, so after the last block ``s / l`` is the softmax-weighted sum, exact up to
rounding; ``m + log l`` (the row's log-sum-exp) is saved for the backward pass. Working memory is
one Br×Bc score tile and two row tiles (Br×E, Br×Ev) per thread: O(N), not O(N²).

**Backward** (FlashAttention-2): the probabilities are recomputed block by block from the saved
log-sum-exp, ``P = exp(q kᵀ · scale − lse)``; with ``D = rowsum(dO ∘ O)``,
``dV += Pᵀ dO``, ``dP = dO vᵀ``, ``dS = P ∘ (dP − D)``, ``dQ += dS k · scale``,
``dK += dSᵀ q · scale``.

What the kernels do to be fast (a kernel docstring states what it must have, as in MiniTorch):

* **tile products on BLAS**: ``Q_i K_jᵀ``, ``P_ij V_j`` and the backward's five products are
  ``np.dot`` on the tiles, which Numba compiles to calls of the BLAS SciPy ships (packed
  panels, register-blocked micro-kernels); the kernel keeps the row-wise work — the scale and
  mask, the (m, l, s) step, the probabilities and ``dS`` — in vectorised loops between them.
  The BLAS runs on one thread inside Numba's (held there for the call through threadpoolctl);
  the first version computed the products as axpy loops of its own: 65.8 ms forward and
  194.5 ms forward + backward on the machine below (L = 2048, d = 64, 8 heads), against
  28-33 ms and 78-95 ms now (``benchmarks/llm_attention.py``);
* **causal blocks skipped**: a key block entirely above the diagonal is never visited (half the
  work at L = S), and inside a diagonal block a row's softmax stops at its own position;
* **parallel** over batch × heads × query blocks (forward) or batch × heads (backward) with
  ``prange``: up to four workers per thread, worker w taking items w, w + W, ... (cheap and dear
  causal blocks spread evenly; tiles allocated once per worker), handed to threads one at a
  time so a thread the OS preempts on a busy machine holds up little;
* **vectorised row passes**: ``exp`` is a polynomial (Cody–Waite reduction, Horner with FMA,
  exponent added by bit arithmetic) that LLVM vectorises — Numba's ``math.exp`` is a libm call
  per element (no SVML) — and the row max runs as four independent maxima (LLVM leaves a max
  reduction scalar here; four chains ran 2× faster);
* **block sizes from the cache** (:func:`attention_blocks`): the book's rule keeps the tiles a
  block step touches in the fast memory; with BLAS packing K and V itself, the tile the kernel
  re-reads is the Br × Bc score tile, kept in a sixteenth of L2 (``Br = Bc = ⌊√(L2/16 /
  size)⌋``: 176 on a 2 MiB L2). Measured on an AVX-512 Xeon (48 KiB L1d, 2 MiB L2; causal,
  L = 2048, 8 heads, 2 threads, float32), forward + backward in ms, Br = Bc = 64 / 96 / 128 /
  160 / 176 (ranges: repeated sweeps): d = 32 77 / 56-66 / 56 / 50-62 / 51; d = 64 100-117 /
  86-100 / 107-114 / 80-102 / 98; d = 128 195 / 181-192 / 178 / 160-176 / 159 (the head
  dimension barely moves the best size; 128 and 256 ran slower than their neighbours). The
  earlier rule, K and V tiles in L1d (``Bc = ⌊L1d / 2d⌋``: 96 at d = 64, 48 at d = 128), suited
  the axpy loops, not the products.

Rounding: sums run in the inputs' dtype (the running denominator in float64); a float32 result
is within a few 1e-7 of float64 exact attention (the tests hold it to 2e-6). A bool mask is
applied as a bias of 0 / −∞ (one compiled kernel for both kinds of mask), which differs from
masking only where a masked score is +∞ or NaN.

Semantics are PyTorch's ``scaled_dot_product_attention``: shapes ``(..., L, E)``,
``(..., S, E)``, ``(..., S, Ev)`` with broadcasting batch dimensions; ``attn_mask`` boolean
(True = attend) or additive, broadcastable to ``(..., L, S)``; ``is_causal`` keeps key ``j`` for
query ``i`` when ``j ≤ i`` (top-left aligned); ``scale`` defaults to ``1/√E``. A row with no
key left (fully masked, or S = 0) gives zeros and a zero gradient, as PyTorch's math path does
since 2.5; its log-sum-exp is −∞.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..engine.numba_cache import CACHE
from ..engine.passes.fusion.elementwise import numba_intrinsics
from ..engine.threads import limit_threads
from ..errors import DTypeError, ShapeError
from . import cpu_config

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# ------------------------------------------------------------------------------------------------
# Block sizes
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Blocks:
    """The tile sizes of the tiled kernels and the rule that gave them.

    Attributes:
        br: query rows per block (``Br``).
        bc: keys per block (``Bc``).
        budget: the fast-memory budget ``M`` in bytes the rule used.
        rule: the rule in words, with the numbers.
    """

    br: int
    bc: int
    budget: int
    rule: str

    def __str__(self):
        return f"Br = {self.br}, Bc = {self.bc}: {self.rule}"


MIN_BLOCK, MAX_BLOCK = 16, 1024


#: The share of a core's L2 the score tile may take (the rest holds BLAS's packed panels).
L2_SHARE = 16


def attention_blocks(e: int, ev: int | None = None, dtype=np.float32,
                     caches: cpu_config.CacheSizes | None = None) -> Blocks:
    """Query and key block sizes for head dimensions ``e`` (queries, keys) and ``ev`` (values).

    The book's (and FlashAttention's) rule sizes the blocks so that what a block step touches
    stays in the fast memory ``M``: the four d-wide tiles Q, K, V, O, ``Bc = ⌊M / 4d⌋`` keys and
    ``Br = min(Bc, d)`` queries. These CPU kernels hand the tile products to BLAS, which packs
    K and V into cache-sized panels of its own; what the kernel itself re-reads is the
    ``Br × Bc`` score tile — written by ``Q Kᵀ``, read by the row max, the exp-and-sum and the
    product with V. So the rule here keeps that tile in a share of the core's L2 (``M`` = L2 /
    :data:`L2_SHARE`, the rest left to BLAS's panels), square so that query and key blocks line
    up on the causal diagonal: ``Br = Bc = ⌊√(M / size)⌋``, rounded down to a multiple of 16
    and clamped to [16, 1024]. The head dimension does not enter (measured: see the module
    docstring); ``e`` and ``ev`` are reported in the rule.

    Args:
        e: head dimension of queries and keys.
        ev: head dimension of values (default ``e``).
        dtype: float32 or float64.
        caches: cache sizes (this machine's by default, :func:`.cpu_config.cache_sizes`).
    """
    caches = caches if caches is not None else cpu_config.cache_sizes()
    d = max(e, ev if ev is not None else e, 1)
    size = np.dtype(dtype).itemsize
    budget = caches.l2 // L2_SHARE
    raw = math.isqrt(budget // size)
    bc = br = int(min(max(raw // 16 * 16, MIN_BLOCK), MAX_BLOCK))
    rule = (f"M = L2/{L2_SHARE} = {budget >> 10} KiB = {budget // size} {np.dtype(dtype).name} "
            f"elements (L2 {caches.l2 >> 10} KiB from {caches.source}) for the score tile: "
            f"Br = Bc = ⌊√M⌋ = {raw} -> {bc} (d = {d} does not enter)")
    return Blocks(br, bc, budget, rule)


def fitted_blocks(e: int, ev: int, length: int, keys: int, dtype=np.float32) -> Blocks:
    """:func:`attention_blocks` for this machine, no larger than the problem: ``Bc`` at most
    ``keys`` rounded up to 16, ``Br`` at most ``length`` (a short sequence allocates short
    tiles)."""
    b = attention_blocks(e, ev, dtype)
    bc = min(b.bc, max(-(-keys // 16) * 16, MIN_BLOCK))
    br = max(min(b.br, length), 1)
    if (br, bc) == (b.br, b.bc):
        return b
    note = f"; fitted to {length} queries x {keys} keys: Br = {br}, Bc = {bc}"
    return dataclasses.replace(b, br=br, bc=bc, rule=b.rule + note)


# ------------------------------------------------------------------------------------------------
# A vectorisable exp
# ------------------------------------------------------------------------------------------------


# fma(a, b, c) rounded once and p * 2**k by exponent bits: the same intrinsics the fused
# element-wise kernels use.
_fma, _add_exponent = numba_intrinsics()


_F32 = np.float32
_E32 = dict(
    magic=_F32(1.5 * 2**23), to_k=_F32(1 / math.log(2)), ln2=_F32(math.log(2)),
    # Taylor coefficients of e**s, |s| <= ln2/2: degree 7 leaves 5e-9 relative.
    c=tuple(_F32(1 / math.factorial(n)) for n in range(7, -1, -1)),
    low=_F32(-86.0))
_E64 = dict(
    magic=1.5 * 2.0**52, to_k=1 / math.log(2),
    ln2_hi=6.93147180369123816490e-01, ln2_lo=1.90821492927058770002e-10,
    c=tuple(1 / math.factorial(n) for n in range(13, -1, -1)), low=-708.0)

_M32, _K32, _L32, _LOW32 = _E32["magic"], _E32["to_k"], _E32["ln2"], _E32["low"]
(_A7, _A6, _A5, _A4, _A3, _A2, _A1, _A0) = _E32["c"]
_M64, _K64, _H64, _O64, _LOW64 = (_E64[k] for k in ("magic", "to_k", "ln2_hi", "ln2_lo", "low"))
_B = _E64["c"]


def _exp_f32(x):
    kb = _fma(x, _K32, _M32)
    k = kb - _M32
    s = _fma(k, -_L32, x)
    p = _fma(_fma(_fma(_fma(_fma(_fma(_fma(_A7, s, _A6), s, _A5), s, _A4), s, _A3), s, _A2),
                  s, _A1), s, _A0)
    r = _add_exponent(p, kb)
    r = _F32(0) if x < _LOW32 else r
    return r if x == x else x


def _exp_f64(x):
    kb = _fma(x, _K64, _M64)
    k = kb - _M64
    s = _fma(k, -_O64, _fma(k, -_H64, x))
    p = _B[0]
    p = _fma(p, s, _B[1])
    p = _fma(p, s, _B[2])
    p = _fma(p, s, _B[3])
    p = _fma(p, s, _B[4])
    p = _fma(p, s, _B[5])
    p = _fma(p, s, _B[6])
    p = _fma(p, s, _B[7])
    p = _fma(p, s, _B[8])
    p = _fma(p, s, _B[9])
    p = _fma(p, s, _B[10])
    p = _fma(p, s, _B[11])
    p = _fma(p, s, _B[12])
    p = _fma(p, s, _B[13])
    r = _add_exponent(p, kb)
    r = 0.0 if x < _LOW64 else r
    return r if x == x else x


def exp_nonpositive(x):
    """``e**x`` for ``x <= 0`` (−∞ gives 0, NaN stays NaN), vectorisable: within 2 ulp in
    float32 and float64; results below ``e**-86`` (float32) / ``e**-708`` (float64) are 0."""
    return math.exp(x)


@overload(exp_nonpositive, inline="always")
def _exp_nonpositive_impl(x):
    if x == types.float32:
        return _exp_f32
    if x == types.float64:
        return _exp_f64
    return None


# ------------------------------------------------------------------------------------------------
# Forward
# ------------------------------------------------------------------------------------------------

# Contraction to FMA only: no reassociation, so NaN and ±∞ keep their meaning and a sum's
# order is the one written.
_JIT = dict(cache=CACHE, fastmath={"contract"})
NO_MASK, ADD_MASK = 0, 1


@njit(**_JIT)
def _mask_scores(srow, nb, scale, row, j0, last, mask, mask_kind):
    """Scores ``srow[:nb]`` of one row for keys ``j0 ..``: times ``scale`` (unless it is 1),
    plus the additive mask's row (a bool mask arrives as 0 / −∞). Returns ``n``, the keys left
    of the causal limit ``last`` (0 ≤ n ≤ nb): only ``srow[:n]`` is touched, the caller treats
    the rest as masked."""
    n = min(max(last - j0 + 1, 0), nb)
    if scale != 1:
        for jj in range(n):
            srow[jj] *= scale
    if mask_kind == ADD_MASK:
        for jj in range(n):
            srow[jj] += mask[row, j0 + jj]
    return n


@njit(cache=CACHE, fastmath={"nnan", "nsz"})
def _row_max(s, n):
    """max(s[:n]), n >= 1, as four running maxima (LLVM does not vectorise a max reduction
    here: Numba's fast-math flags do not reach the ``select`` it compiles to; four independent
    chains ran 2x faster than one). A NaN score makes the row NaN whatever this returns."""
    a0 = a1 = a2 = a3 = s[0]
    n4 = n - n % 4
    for jj in range(0, n4, 4):
        a0 = max(a0, s[jj])
        a1 = max(a1, s[jj + 1])
        a2 = max(a2, s[jj + 2])
        a3 = max(a3, s[jj + 3])
    for jj in range(n4, n):
        a0 = max(a0, s[jj])
    return max(max(a0, a1), max(a2, a3))


@njit(cache=CACHE, fastmath={"reassoc", "contract"})
def _exp_shifted_sum(s, n, shift):
    """s[:n] = exp(s[:n] - shift) and their sum, in vector lanes (reassociated: partial sums
    per lane, added at the end)."""
    total = s.dtype.type(0)
    for jj in range(n):
        p = exp_nonpositive(s[jj] - shift)
        s[jj] = p
        total += p
    return total


@njit(cache=CACHE, fastmath={"contract"})
def _exp_shifted(s, n, shift):
    """s[:n] = exp(s[:n] - shift) (the backward's recomputed probabilities)."""
    for jj in range(n):
        s[jj] = exp_nonpositive(s[jj] - shift)


@njit(**_JIT)
def _online_step(s, nb, m, ell, i, orow):
    """One key block of the (m, l, s) recurrence for row ``i`` whose (masked) scores are in
    ``s``: new max, old sums rescaled by ``exp(m_old − m_new)``, ``s`` turned into the block's
    ``exp(score − m_new)`` (zeros while the row has seen no key)."""
    m_new = max(m[i], _row_max(s, nb))
    if m_new == -np.inf:
        for jj in range(nb):
            s[jj] = 0.0
        return
    alpha = exp_nonpositive(m[i] - m_new)
    ell[i] = ell[i] * alpha + _exp_shifted_sum(s, nb, m_new)
    m[i] = m_new
    if alpha != 1:
        for c in range(orow.shape[0]):
            orow[c] *= alpha


@njit(**_JIT)
def _add_into(dst, src):
    """dst += src (two C-contiguous 2-D arrays of one shape; Numba's own ``dst += src`` on
    these slices made the backward some 15 % slower)."""
    for i in range(src.shape[0]):
        for c in range(src.shape[1]):
            dst[i, c] += src[i, c]


@njit(**_JIT)
def _tile(buffer, rows, cols):
    """A C-contiguous ``rows × cols`` view on the front of a flat buffer (tiles at the ends of
    a sequence are smaller than the buffer)."""
    return buffer[:rows * cols].reshape((rows, cols))


@njit(**_JIT)
def _forward_block(qb, kb, vb, mask, mask_kind, causal, scale, i0, i1, bc, qs, s, pv, m, ell, ob,
                   lse):
    """Rows i0..i1 of one head: the (m, l, s) recurrence over key blocks of ``bc``. The query
    tile is scaled once (into ``qs``); per key block the score tile ``Q_i K_jᵀ`` and the tile
    ``P_ij V_j`` are BLAS products, and each row takes its (m, l, s) step in between over the
    keys left of its causal limit. ``ob`` holds the running unnormalised output, divided by
    ``l`` at the end."""
    e, keys, ev = qb.shape[1], kb.shape[0], vb.shape[1]
    rows = i1 - i0
    qt = _tile(qs, rows, e)
    for i in range(rows):
        for c in range(e):
            qt[i, c] = qb[i0 + i, c] * scale
        m[i] = -np.inf
        ell[i] = 0.0
        for c in range(ev):
            ob[i0 + i, c] = 0.0
    one = qb.dtype.type(1)  # 1 in the inputs' dtype (scale / scale would be NaN at scale 0)
    kend = min(keys, i1) if causal else keys
    ot = ob[i0:i1]
    for j0 in range(0, kend, bc):
        nb = min(bc, kend - j0)
        st = _tile(s, rows, nb)
        np.dot(qt, kb[j0:j0 + nb].T, st)
        for i in range(rows):
            row = i0 + i
            n = _mask_scores(st[i], nb, one, row, j0, row if causal else keys, mask, mask_kind)
            if n:
                _online_step(st[i], n, m, ell, i, ot[i])
            for jj in range(n, nb):
                st[i, jj] = 0.0
        pt = _tile(pv, rows, ev)
        np.dot(st, vb[j0:j0 + nb], pt)
        _add_into(ot, pt)
    for i in range(rows):
        row = i0 + i
        if ell[i] > 0.0:
            inv = 1.0 / ell[i]
            for c in range(ev):
                ob[row, c] = ob[row, c] * inv
            lse[row] = m[i] + math.log(ell[i])
        else:
            lse[row] = -np.inf


@njit(parallel=True, **_JIT)
def _forward(q, k, v, mask, qi, ki, vi, mi, mask_kind, causal, scale, br, bc, workers, out,
             lse):
    """out[h] = softmax(q[qi[h]] k[ki[h]]ᵀ · scale + mask[mi[h]]) v[vi[h]]; lse[h] its row
    log-sum-exp. One work item is (h, query block); worker w of ``workers`` takes items w,
    w + W, ..., so every worker gets early (cheap) and late causal blocks, and allocates its
    tiles once; workers are handed to threads one at a time (:func:`_run_parallel`), so a
    thread the OS preempts holds up one worker's share, not half the work."""
    heads, length, ev = out.shape
    blocks = (length + br - 1) // br
    items = heads * blocks
    for t in prange(workers):
        qs = np.empty(br * q.shape[2], q.dtype)
        s = np.empty(br * bc, q.dtype)
        pv = np.empty(br * ev, q.dtype)
        m = np.empty(br, q.dtype)
        ell = np.empty(br, np.float64)
        for item in range(t, items, workers):
            h, blk = item // blocks, item % blocks
            i0 = blk * br
            _forward_block(q[qi[h]], k[ki[h]], v[vi[h]], mask[mi[h]], mask_kind, causal, scale,
                           i0, min(i0 + br, length), bc, qs, s, pv, m, ell, out[h], lse[h])


# ------------------------------------------------------------------------------------------------
# Backward
# ------------------------------------------------------------------------------------------------


@njit(**_JIT)
def _dscores(prow, dsrow, nb, d, scale):
    """dsrow = scale · P ∘ (dP − D) on one row (``dsrow`` holds dP on entry)."""
    for jj in range(nb):
        dsrow[jj] = prow[jj] * (dsrow[jj] - d) * scale


@njit(**_JIT)
def _backward_head(qb, kb, vb, mask, mask_kind, causal, scale, br, bc, ob, lse, gb, dqb, dkb,
                   dvb, p, ds, t, dsum):
    """One head's gradients (``dqb``, ``dkb``, ``dvb`` zero on entry). Per key block (outer)
    and query block (inner), five BLAS products: S = Q Kᵀ and dP = dO Vᵀ, then P = exp(S·scale
    − lse) and dS = P ∘ (dP − D) · scale row by row, then dV += Pᵀ dO, dK += dSᵀ Q and
    dQ += dS K; a causal query block wholly above the key block is skipped."""
    length, e = qb.shape
    keys, ev = vb.shape
    for i in range(length):
        acc = 0.0
        for c in range(ev):
            acc += gb[i, c] * ob[i, c]
        dsum[i] = acc
    for j0 in range(0, keys, bc):
        nb = min(bc, keys - j0)
        kj, vj = kb[j0:j0 + nb], vb[j0:j0 + nb]
        first = (j0 // br) * br if causal else 0
        for i0 in range(first, length, br):
            rows = min(br, length - i0)
            qt, gt = qb[i0:i0 + rows], gb[i0:i0 + rows]
            pt, dst = _tile(p, rows, nb), _tile(ds, rows, nb)
            np.dot(qt, kj.T, pt)
            np.dot(gt, vj.T, dst)
            for i in range(rows):
                row = i0 + i
                n = 0
                if lse[row] != -np.inf:  # a row with no key has no gradient
                    n = _mask_scores(pt[i], nb, scale, row, j0, row if causal else keys, mask,
                                     mask_kind)
                    _exp_shifted(pt[i], n, lse[row])
                    _dscores(pt[i], dst[i], n, dsum[row], scale)
                for jj in range(n, nb):
                    pt[i, jj] = 0.0
                    dst[i, jj] = 0.0
            tv = _tile(t, nb, ev)
            np.dot(pt.T, gt, tv)
            _add_into(dvb[j0:j0 + nb], tv)
            tk = _tile(t, nb, e)
            np.dot(dst.T, qt, tk)
            _add_into(dkb[j0:j0 + nb], tk)
            tq = _tile(t, rows, e)
            np.dot(dst, kj, tq)
            _add_into(dqb[i0:i0 + rows], tq)


@njit(parallel=True, **_JIT)
def _backward(q, k, v, mask, qi, ki, vi, mi, mask_kind, causal, scale, br, bc, workers, out,
              lse, g, dq, dk, dv):
    """Gradients of attention for head h into dq[h], dk[h], dv[h] (per head: the caller sums
    heads that share a broadcast input). Worker w of ``workers`` takes heads w, w + W, ...."""
    heads, length, ev = out.shape
    e = q.shape[2]
    for w in prange(workers):
        p = np.empty(br * bc, q.dtype)
        ds = np.empty(br * bc, q.dtype)
        t = np.empty(max(br, bc) * max(e, ev), q.dtype)
        dsum = np.empty(length, q.dtype)
        for h in range(w, heads, workers):
            _backward_head(q[qi[h]], k[ki[h]], v[vi[h]], mask[mi[h]], mask_kind, causal, scale,
                           br, bc, out[h], lse[h], g[h], dq[h], dk[h], dv[h], p, ds, t, dsum)


# ------------------------------------------------------------------------------------------------
# The functions: shapes, broadcasting, masks
# ------------------------------------------------------------------------------------------------

OP = "scaled_dot_product_attention"


@dataclasses.dataclass
class _Problem:
    """The kernels' view of one call: inputs as (batch, length, features) stacks, and for each
    of the ``heads`` output heads the index of its q, k, v and mask stack."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    mask: np.ndarray
    qi: np.ndarray
    ki: np.ndarray
    vi: np.ndarray
    mi: np.ndarray
    mask_kind: int
    causal: bool
    scale: object
    batch: tuple
    blocks: Blocks
    mask_stack: np.ndarray  # the mask's own (stacks, 1 or L, 1 or S) array, mask its broadcast

    @property
    def heads(self):
        return len(self.qi)


def _shapes(*arrays):
    return ", ".join(f"{n} {tuple(a.shape)}" for n, a in zip(("q", "k", "v", "attn_mask"), arrays))


def _stack_index(shape, batch):
    """For each of prod(batch) heads (C order), the index into the stack ``shape`` makes."""
    shape = (1,) * (len(batch) - len(shape)) + tuple(shape)
    count = math.prod(shape)
    return np.ascontiguousarray(
        np.broadcast_to(np.arange(count, dtype=np.int64).reshape(shape), batch).ravel())


def _prepare(q, k, v, attn_mask, is_causal, scale, enable_gqa, blocks):
    """Check the arrays and lay them out for the kernels (no copy of a contiguous input)."""
    arrays = [np.asarray(a) for a in (q, k, v)]
    q, k, v = arrays
    for name, a in zip("qkv", arrays):
        if a.ndim < 2:
            raise ShapeError(f"{OP}: q, k and v need at least 2 dims (..., length, features), "
                             f"got {_shapes(q, k, v)}")
        if a.dtype not in FLOATS:
            raise DTypeError(f"{OP}: {name} must be float32 or float64, got {a.dtype}")
    if not q.dtype == k.dtype == v.dtype:
        raise DTypeError(f"{OP}: q, k and v must have one dtype, got {q.dtype}, {k.dtype} and "
                         f"{v.dtype}")
    if k.shape[-1] != q.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"{OP}: need q (..., L, E), k (..., S, E), v (..., S, Ev), got "
                         f"{_shapes(q, k, v)}")
    ks, vs = k.shape[:-2], v.shape[:-2]
    if enable_gqa:
        if min(q.ndim, k.ndim, v.ndim) < 3 or k.shape[-3] != v.shape[-3] or k.shape[-3] == 0 \
                or q.shape[-3] % k.shape[-3]:
            raise ShapeError(f"{OP}: with enable_gqa the key and value heads must be equal and "
                             f"divide the query heads, got {_shapes(q, k, v)}")
    try:
        batch = np.broadcast_shapes(q.shape[:-2], *(
            (s[:-1] + (q.shape[-3],)) if enable_gqa else s for s in (ks, vs)))
    except ValueError:
        raise ShapeError(f"{OP}: the batch axes of q, k and v do not broadcast, got "
                         f"{_shapes(q, k, v)}") from None
    dtype = q.dtype
    L, E, S = q.shape[-2], q.shape[-1], k.shape[-2]

    def stack(a):
        return np.ascontiguousarray(a).reshape((math.prod(a.shape[:-2]),) + a.shape[-2:])

    def index(shape):
        if enable_gqa:  # query head h reads key/value head h // (Hq / Hkv)
            group = q.shape[-3] // shape[-1]
            grouped = _stack_index(shape + (1,), batch[:-1] + (shape[-1], group))
            return grouped
        return _stack_index(shape, batch)

    qi, ki, vi = _stack_index(q.shape[:-2], batch), index(ks), index(vs)
    if attn_mask is None:
        mask_stack, mi, kind = np.zeros((1, 1, 1), dtype), np.zeros(len(qi), np.int64), NO_MASK
        mask = np.broadcast_to(mask_stack, (1, L, S))  # the type a mask has: one compiled kernel
    else:
        mask = np.asarray(attn_mask)
        if mask.dtype != np.bool_ and mask.dtype != dtype:
            raise DTypeError(f"{OP}: attn_mask must be bool or q's dtype {dtype}, got "
                             f"{mask.dtype}")
        want = batch + (L, S)
        if mask.ndim > len(want) or any(d not in (1, w) for d, w in
                                        zip(mask.shape[::-1], want[::-1])):
            raise ShapeError(f"{OP}: attn_mask {mask.shape} does not broadcast to the scores' "
                             f"shape {want} (batch, L, S) of {_shapes(q, k, v)}")
        mask = mask.reshape((1,) * max(2 - mask.ndim, 0) + mask.shape)
        mi = _stack_index(mask.shape[:-2], batch)
        if mask.dtype == np.bool_:  # as a bias of 0 / -inf: one compiled kernel for both kinds
            mask = np.where(mask, dtype.type(0), dtype.type(-np.inf))
        mask_stack = stack(mask)
        mask = np.broadcast_to(mask_stack, (mask_stack.shape[0], L, S))
        kind = ADD_MASK
    if scale is None:
        scale = 1.0 / math.sqrt(E) if E else 1.0
    blocks = blocks if blocks is not None else fitted_blocks(E, v.shape[-1], L, S, dtype)
    return _Problem(stack(q), stack(k), stack(v), mask, qi, ki, vi, mi, kind, bool(is_causal),
                    dtype.type(scale), tuple(batch), blocks, mask_stack)


def _threads(items):
    return max(min(numba.get_num_threads(), items), 1)


WORKERS_PER_THREAD = 4
#: A BLAS splits one product over its own threads above some size (OpenBLAS: M·N·K above
#: 2**18). The kernels' tile products run inside Numba's threads, so when a tile product is
#: larger than this the BLAS is held at one thread for the call (some 20 µs through
#: threadpoolctl; a decoding step's one-row tiles stay below it and pay nothing).
BLAS_SPLIT = 1 << 16


def _run_parallel(kernel, items, tile, *args):
    """``kernel(*args[:-1], workers, *args[-1])`` with ``workers`` = up to 4 per thread, handed
    to threads one at a time (Numba's dynamic chunks of 1): on a busy machine a preempted thread
    delays a quarter of its share, not the whole call. (The count is an argument because
    ``numba.get_num_threads()`` inside a kernel keeps it out of the disk cache.) ``tile`` is
    the size M·N·K of the kernel's largest tile product (see :data:`BLAS_SPLIT`)."""
    workers = max(min(items, WORKERS_PER_THREAD * numba.get_num_threads()), 1)
    blas = contextlib.nullcontext()
    if tile > BLAS_SPLIT:
        blas = limit_threads(blas=1)  # SciPy's BLAS too, which np.dot calls in Numba
    with numba.parallel_chunksize(1), blas:
        kernel(*args[:-1], workers, *args[-1])


def attention_forward(q, k, v, attn_mask=None, *, is_causal=False, scale=None, enable_gqa=False,
                      blocks: Blocks | None = None, out=None):
    """Tiled online-softmax attention (FlashAttention-2's forward): the output and the row
    log-sum-exp, without an L×S matrix.

    Args:
        q, k, v: ``(..., L, E)``, ``(..., S, E)``, ``(..., S, Ev)``, one of float32 / float64;
            batch axes broadcast.
        attn_mask: None, bool (True = the key takes part) or additive (q's dtype),
            broadcastable to ``(..., L, S)``.
        is_causal: key ``j`` takes part in row ``i`` when ``j <= i`` (top-left aligned).
        scale: factor of ``q kᵀ`` (default ``1/√E``).
        enable_gqa: k and v may have fewer heads (axis -3), a divisor of q's.
        blocks: tile sizes (default :func:`attention_blocks` for this machine).
        out: an array of the output's shape and dtype to write into (C-contiguous).

    Returns:
        ``(out, lse)``: ``(..., L, Ev)`` and ``(..., L)`` in q's dtype; ``lse`` is −∞ in a row
        with no key, whose output is 0.
    """
    pb = _prepare(q, k, v, attn_mask, is_causal, scale, enable_gqa, blocks)
    L, ev = pb.q.shape[1], pb.v.shape[2]
    shape = pb.batch + (L, ev)
    if out is None:
        out = np.empty(shape, pb.q.dtype)
    elif out.shape != shape or out.dtype != pb.q.dtype or not out.flags.c_contiguous:
        raise ShapeError(f"{OP}: out must be a C-contiguous {pb.q.dtype} array of shape {shape}, "
                         f"got {out.dtype} {out.shape}")
    lse = np.empty(pb.batch + (L,), pb.q.dtype)
    heads = pb.heads
    if heads and L:
        br, bc = pb.blocks.br, pb.blocks.bc
        items = heads * -(-L // br)
        tile = br * bc * max(pb.q.shape[2], ev)
        _run_parallel(_forward, items, tile, pb.q, pb.k, pb.v, pb.mask, pb.qi, pb.ki, pb.vi, pb.mi,
                      pb.mask_kind, pb.causal, pb.scale, br, bc,
                      (out.reshape(heads, L, ev), lse.reshape(heads, L)))
    return out, lse


def _sum_to(d, index, like_shape):
    """Per-head gradients ``d`` (heads, n, f) summed into the stacks the heads read
    (``index``), shaped ``like_shape``."""
    count = math.prod(like_shape[:-2])
    if count == len(index) and np.array_equal(index, np.arange(count)):
        return d.reshape(like_shape)
    total = np.zeros((count,) + d.shape[1:], d.dtype)
    np.add.at(total, index, d)
    return total.reshape(like_shape)


def attention_backward(g, q, k, v, out, lse, attn_mask=None, *, is_causal=False, scale=None,
                       enable_gqa=False, blocks: Blocks | None = None):
    """FlashAttention-2's backward: ``(dq, dk, dv)`` from the forward's ``out`` and ``lse``,
    recomputing the probabilities tile by tile (no L×S matrix).

    Args:
        g: the output's cotangent, shaped like ``out``.
        q, k, v, attn_mask, is_causal, scale, enable_gqa, blocks: as for
            :func:`attention_forward`.
        out, lse: what :func:`attention_forward` returned for them.

    Returns:
        ``(dq, dk, dv)`` shaped like q, k, v (broadcast batch axes and query-head groups
        summed). A fully masked row contributes nothing.
    """
    pb = _prepare(q, k, v, attn_mask, is_causal, scale, enable_gqa, blocks)
    heads, (L, e), (S, ev) = pb.heads, pb.q.shape[1:], pb.v.shape[1:]
    want, want_lse = pb.batch + (L, ev), pb.batch + (L,)
    g, out, lse = (np.asarray(a) for a in (g, out, lse))
    if g.shape != want or out.shape != want or lse.shape != want_lse:
        raise ShapeError(f"{OP} backward: g and out must be {want} and lse {want_lse}, got "
                         f"g {g.shape}, out {out.shape}, lse {lse.shape}")
    dtype = pb.q.dtype
    dq = np.zeros((heads, L, e), dtype)
    dk = np.zeros((heads, S, e), dtype)
    dv = np.zeros((heads, S, ev), dtype)
    if heads and L and S:
        flat = [np.ascontiguousarray(a, dtype).reshape((heads,) + a.shape[len(pb.batch):])
                for a in (out, lse, g)]
        tile = pb.blocks.br * pb.blocks.bc * max(e, ev)
        _run_parallel(_backward, heads, tile, pb.q, pb.k, pb.v, pb.mask, pb.qi, pb.ki, pb.vi, pb.mi,
                      pb.mask_kind, pb.causal, pb.scale, pb.blocks.br, pb.blocks.bc,
                      (*flat, dq, dk, dv))
    q, k, v = (np.asarray(a) for a in (q, k, v))
    return (_sum_to(dq, pb.qi, q.shape), _sum_to(dk, pb.ki, k.shape),
            _sum_to(dv, pb.vi, v.shape))


# ------------------------------------------------------------------------------------------------
# As the op's kernel: out_fn and the workspace it declares
# ------------------------------------------------------------------------------------------------


def attention_out(out, q, k, v, *mask, is_causal=False, scale=None, enable_gqa=False):
    """``out_fn`` of ``scaled_dot_product_attention`` (inputs ``q, k, v[, mask]``): the tiled
    forward written into ``out``; the log-sum-exp is computed and dropped (the op's VJP
    recomputes what it needs)."""
    attention_forward(q, k, v, mask[0] if mask else None, is_causal=is_causal, scale=scale,
                      enable_gqa=enable_gqa, out=out)


def attention_grad_out(out, g, q, k, v, *mask, is_causal=False, scale=None, enable_gqa=False):
    """``out_fn`` of ``scaled_dot_product_attention_grad`` (inputs ``g, q, k, v[, mask]``): no
    forward is saved between ops, so one tiled forward recomputes the output and the row
    log-sum-exp, then :func:`attention_backward` sweeps the tiles; the packed
    ``(dq, dk, dv)`` is written into ``out``."""
    m = mask[0] if mask else None
    attrs = dict(is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    o, lse = attention_forward(q, k, v, m, **attrs)
    start = 0
    for d in attention_backward(g, q, k, v, o, lse, m, **attrs):
        out[start:start + d.size] = d.reshape(-1)
        start += d.size


def _tile_bytes(e, ev, length, keys, dtype):
    """Per-thread tile bytes of the forward and of the backward kernel, and their blocks."""
    b = fitted_blocks(e, ev, length, keys, dtype)
    size = np.dtype(dtype).itemsize
    forward = (b.br * (e + b.bc + ev + 1)) * size + b.br * 8  # qs, s, pv, m; ell in float64
    backward = (2 * b.br * b.bc + max(b.br, b.bc) * max(e, ev) + length) * size  # p, ds, t, dsum
    return forward, backward, b


def forward_workspace(avals, out, attrs=None, threads: int | None = None) -> int:
    """Bytes :func:`attention_out` holds besides its inputs and output: per thread the scaled
    query tile (Br × E), the score tile (Br × Bc), the product tile (Br × Ev) and the running
    max and sum (Br each); the row log-sum-exp (heads × L); the per-head index arrays; and a
    bool mask turned into 0 / −∞ (the mask's own size in q's dtype). O(L), never L × S.

    Args:
        avals: the inputs' shapes and dtypes (q, k, v[, mask]).
        out: the output's shape and dtype.
        attrs: the node's attributes (unused: the sizes do not depend on them).
        threads: the threads the kernel runs on (default Numba's current count).
    """
    q, k, v = avals[:3]
    size = np.dtype(q.dtype).itemsize
    heads, L = math.prod(out.shape[:-2]), out.shape[-2]
    if not heads or not L:
        return 0
    per_thread, _, b = _tile_bytes(q.shape[-1], v.shape[-1], L, k.shape[-2], q.dtype)
    items = heads * -(-L // b.br)
    threads = _threads(items) if threads is None else max(min(threads, items), 1)
    total = threads * per_thread + heads * L * size + 4 * heads * 8
    if len(avals) == 4 and np.dtype(avals[3].dtype) == np.bool_:
        total += math.prod(avals[3].shape) * size
    return int(total)


def backward_workspace(avals, out, attrs=None, threads: int | None = None) -> int:
    """Bytes :func:`attention_grad_out` holds besides its inputs and output: the recomputed
    forward's output (shaped like ``g``) and what :func:`forward_workspace` counts (the row
    log-sum-exp lives on), the per-head gradients before they are summed into ``out``
    (heads × (L·E + S·E + S·Ev)), and per thread the backward's tiles (P and dS, Br × Bc each;
    a product tile; the row sums D, L). O(L), never L × S."""
    g, q, k, v = avals[:4]
    heads, L = math.prod(g.shape[:-2]), g.shape[-2]
    size = np.dtype(g.dtype).itemsize
    S, e, ev = k.shape[-2], q.shape[-1], v.shape[-1]
    total = forward_workspace(avals[1:], g, attrs, threads) + math.prod(g.shape) * size
    if heads and L and S:
        _, per_thread, _ = _tile_bytes(e, ev, L, S, g.dtype)
        threads = _threads(heads) if threads is None else max(min(threads, heads), 1)
        total += heads * (L * e + S * e + S * ev) * size + threads * per_thread
    return int(total)
