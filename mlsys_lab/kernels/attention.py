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
one Br×Bc tile and the Bc×E key tile per thread: O(N), not O(N²).

**Backward** (FlashAttention-2): the probabilities are recomputed block by block from the saved
log-sum-exp, ``P = exp(q kᵀ · scale − lse)``; with ``D = rowsum(dO ∘ O)``,
``dV += Pᵀ dO``, ``dP = dO vᵀ``, ``dS = P ∘ (dP − D)``, ``dQ += dS k · scale``,
``dK += dSᵀ q · scale``.

What the kernels do to be fast (a kernel docstring states what it must have, as in MiniTorch):

* **causal blocks skipped**: a key block entirely above the diagonal is never visited (half the
  work at L = S), and inside a diagonal block a row stops at its own position;
* **parallel** over batch × heads × query blocks (forward) or batch × heads (backward) with
  ``prange``: up to four workers per thread, worker w taking items w, w + W, ... (cheap and dear
  causal blocks spread evenly; tiles allocated once per worker), handed to threads one at a
  time so a thread the OS preempts on a busy machine holds up little;
* **vectorised inner loops**: every inner loop runs over a contiguous row (the key tile is
  transposed once per block so ``q kᵀ`` is a sum of axpy's over contiguous rows, four at a time),
  and ``exp`` is a polynomial (Cody–Waite reduction, Horner with FMA, exponent added by bit
  arithmetic) that LLVM vectorises — Numba's ``math.exp`` is a libm call per element (no SVML);
* **two rows per pass**: two query rows share every load of the key and value tiles, and the
  backward's dV/dK updates take two gradient rows per load of dO or q (loads, not FMAs, bound
  these loops; measured 1.35× on both passes);
* **block sizes from the cache** (:func:`attention_blocks`): the book's rule (``Bc = ⌊M / 4d⌋``,
  the four d-wide tiles in the fast memory ``M``; ``Br = min(Bc, d)`` in FlashAttention, whose
  query tile must also fit on chip) applied to what a CPU core's inner loop re-reads for every
  query row: the key and value tiles, from the L1 data cache, so ``Bc = ⌊L1d / 2d⌋``; and
  ``Br = Bc``, so that query blocks line up with key blocks on the causal diagonal and each
  transposed key tile serves as many rows as it has keys (48 KiB L1d, d = 64: Br = Bc = 96).
  Measured on an AVX-512 Xeon (48 KiB L1d, 2 MiB L2; causal, L = 2048, 8 heads, 2 threads),
  forward + backward: d = 32 134 ms (Bc = 192) against 198 ms with the earlier rule (half of
  L2, Br = min(Bc, d): Bc = 1024); d = 64 194 against 280 ms (Bc = 96 against 1024); d = 128
  354 against 420 ms (Bc = 48 against 512). Bc 64-128 ran within 3 % of one another, 256 and
  more slower; Br = Bc was 2-5 % faster than Br = min(Bc, d) and than a Br that is no
  multiple of Bc. On a Zen 4 (32 KiB L1d, 1 MiB L2) Bc from 32 to 512 had run within the
  noise.

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

import dataclasses
import math

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..engine.numba_cache import CACHE
from ..engine.passes.fusion.elementwise import numba_intrinsics
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


def attention_blocks(e: int, ev: int | None = None, dtype=np.float32,
                     caches: cpu_config.CacheSizes | None = None) -> Blocks:
    """Query and key block sizes for head dimensions ``e`` (queries, keys) and ``ev`` (values).

    The book's (and FlashAttention's) rule: with a fast memory of ``M`` elements, ``Bc =
    ⌊M / 4d⌋`` keys and ``Br = min(Bc, d)`` queries, so the four d-wide tiles (Q, K, V, O) fit.
    On a CPU core the tiles re-read for every query row of a block are the key and value tiles
    (a query's and an output's row are one row each), and the memory the inner loop reads
    fastest is the L1 data cache: ``M`` = L1d and two tiles, ``Bc = ⌊M / 2d⌋``; the query
    tile is not held, so ``Br = Bc``: query and key blocks line up on the causal diagonal.
    (Half of L2 with four tiles, the earlier budget, gave Bc = 1024 on a 2 MiB L2, 25-35 %
    slower than this rule: see the module docstring.) ``Bc`` is rounded down to a multiple of
    16 (one AVX-512 vector of float32) and clamped to [16, 1024].

    Args:
        e: head dimension of queries and keys.
        ev: head dimension of values (default ``e``).
        dtype: float32 or float64.
        caches: cache sizes (this machine's by default, :func:`.cpu_config.cache_sizes`).
    """
    caches = caches if caches is not None else cpu_config.cache_sizes()
    d = max(e, ev if ev is not None else e, 1)
    size = np.dtype(dtype).itemsize
    budget = caches.l1d
    raw = budget // (2 * d * size)
    bc = br = int(min(max(raw // 16 * 16, MIN_BLOCK), MAX_BLOCK))
    rule = (f"M = L1d = {budget >> 10} KiB = {budget // size} {np.dtype(dtype).name} elements "
            f"(from {caches.source}), the key and value tiles: Bc = ⌊M/2d⌋ = "
            f"⌊{budget // size}/(2·{d})⌋ = {raw} -> {bc}, Br = Bc = {br}")
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
def _scores(qb, q_row, kt, srow, bc, e, scale):
    """``srow[:bc] = scale · q[q_row] · kt[:, :bc]``: axpy's over contiguous rows of the
    transposed key tile, four rows of it per pass."""
    for jj in range(bc):
        srow[jj] = 0.0
    e4 = e - e % 4
    for c in range(0, e4, 4):
        a0 = qb[q_row, c] * scale
        a1 = qb[q_row, c + 1] * scale
        a2 = qb[q_row, c + 2] * scale
        a3 = qb[q_row, c + 3] * scale
        for jj in range(bc):
            srow[jj] += a0 * kt[c, jj] + a1 * kt[c + 1, jj] + a2 * kt[c + 2, jj] \
                + a3 * kt[c + 3, jj]
    for c in range(e4, e):
        a0 = qb[q_row, c] * scale
        for jj in range(bc):
            srow[jj] += a0 * kt[c, jj]


@njit(**_JIT)
def _apply_mask(srow, bc, row, j0, last, mask, mask_kind):
    """−∞ at causal positions past ``last``, then the additive mask's row (a bool mask
    arrives as 0 / −∞)."""
    for jj in range(max(last - j0 + 1, 0), bc):
        srow[jj] = -np.inf
    if mask_kind == ADD_MASK:
        for jj in range(bc):
            srow[jj] += mask[row, j0 + jj]


@njit(cache=CACHE, fastmath={"nnan", "nsz", "reassoc"})
def _row_max(s, n):
    """max(s[:n]), n >= 1, in vector lanes (the flags let LLVM split the reduction; a NaN score
    makes the row NaN whatever this returns)."""
    mx = s[0]
    for jj in range(1, n):
        mx = max(mx, s[jj])
    return mx


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
def _combine_rows(dst, w, src, j0, nb, factor):
    """``dst[:] += factor · Σ_jj w[jj] · src[j0 + jj, :]`` over ``nb`` rows, four per pass
    (``P V`` into an output row, ``dS K`` into a dQ row)."""
    n = dst.shape[0]
    n4 = nb - nb % 4
    for jj in range(0, n4, 4):
        j = j0 + jj
        a0, a1 = w[jj] * factor, w[jj + 1] * factor
        a2, a3 = w[jj + 2] * factor, w[jj + 3] * factor
        for c in range(n):
            dst[c] += a0 * src[j, c] + a1 * src[j + 1, c] + a2 * src[j + 2, c] \
                + a3 * src[j + 3, c]
    for jj in range(n4, nb):
        a = w[jj] * factor
        for c in range(n):
            dst[c] += a * src[j0 + jj, c]


@njit(**_JIT)
def _transpose_block(src, j0, nb, dst):
    """dst[:, :nb] = src[j0:j0 + nb, :]ᵀ (a key or value tile, made contiguous along keys)."""
    for jj in range(nb):
        for c in range(src.shape[1]):
            dst[c, jj] = src[j0 + jj, c]


@njit(**_JIT)
def _scores2(qb, row, kt, s0, s1, bc, e, scale):
    """:func:`_scores` for rows ``row`` and ``row + 1`` at once: each load of the key tile
    serves two rows (8 FMAs per 4 tile loads, 2 loads and 2 stores of the score rows)."""
    for jj in range(bc):
        s0[jj] = 0.0
        s1[jj] = 0.0
    e4 = e - e % 4
    for c in range(0, e4, 4):
        a0, a1 = qb[row, c] * scale, qb[row, c + 1] * scale
        a2, a3 = qb[row, c + 2] * scale, qb[row, c + 3] * scale
        b0, b1 = qb[row + 1, c] * scale, qb[row + 1, c + 1] * scale
        b2, b3 = qb[row + 1, c + 2] * scale, qb[row + 1, c + 3] * scale
        for jj in range(bc):
            k0, k1, k2, k3 = kt[c, jj], kt[c + 1, jj], kt[c + 2, jj], kt[c + 3, jj]
            s0[jj] += a0 * k0 + a1 * k1 + a2 * k2 + a3 * k3
            s1[jj] += b0 * k0 + b1 * k1 + b2 * k2 + b3 * k3
    for c in range(e4, e):
        a0, b0 = qb[row, c] * scale, qb[row + 1, c] * scale
        for jj in range(bc):
            s0[jj] += a0 * kt[c, jj]
            s1[jj] += b0 * kt[c, jj]


@njit(**_JIT)
def _combine_rows2(d0, d1, w0, w1, src, j0, nb):
    """:func:`_combine_rows` (factor 1) into two rows at once: each row of ``src`` loaded
    serves both."""
    n = d0.shape[0]
    n4 = nb - nb % 4
    for jj in range(0, n4, 4):
        j = j0 + jj
        a0, a1, a2, a3 = w0[jj], w0[jj + 1], w0[jj + 2], w0[jj + 3]
        b0, b1, b2, b3 = w1[jj], w1[jj + 1], w1[jj + 2], w1[jj + 3]
        for c in range(n):
            v0, v1, v2, v3 = src[j, c], src[j + 1, c], src[j + 2, c], src[j + 3, c]
            d0[c] += a0 * v0 + a1 * v1 + a2 * v2 + a3 * v3
            d1[c] += b0 * v0 + b1 * v1 + b2 * v2 + b3 * v3
    for jj in range(n4, nb):
        a, b = w0[jj], w1[jj]
        for c in range(n):
            d0[c] += a * src[j0 + jj, c]
            d1[c] += b * src[j0 + jj, c]


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
def _forward_block(qb, kb, vb, mask, mask_kind, causal, scale, i0, i1, bc, kt, s, m, ell, ob,
                   lse):
    """Rows i0..i1 of one head: the (m, l, s) recurrence over key blocks of ``bc``; ``ob``
    holds the running unnormalised output, divided by ``l`` at the end. Rows go two at a time
    (:func:`_scores2`, :func:`_combine_rows2`) where both see the block."""
    e, keys, ev = qb.shape[1], kb.shape[0], vb.shape[1]
    one = scale / scale  # 1 in the inputs' dtype (a literal 1.0 would promote float32)
    for i in range(i1 - i0):
        m[i] = -np.inf
        ell[i] = 0.0
        for c in range(ev):
            ob[i0 + i, c] = 0.0
    kend = min(keys, i1) if causal else keys
    s0, s1 = s[0], s[1]
    for j0 in range(0, kend, bc):
        nb = min(bc, kend - j0)
        _transpose_block(kb, j0, nb, kt)
        i = 0
        while i < i1 - i0:
            row = i0 + i
            last = row if causal else keys
            if j0 > last:
                i += 1
                continue  # the whole block is above the diagonal for this row
            if i + 1 < i1 - i0:  # row + 1 sees at least what row sees
                last1 = row + 1 if causal else keys
                _scores2(qb, row, kt, s0, s1, nb, e, scale)
                _apply_mask(s0, nb, row, j0, last, mask, mask_kind)
                _apply_mask(s1, nb, row + 1, j0, last1, mask, mask_kind)
                _online_step(s0, nb, m, ell, i, ob[row])
                _online_step(s1, nb, m, ell, i + 1, ob[row + 1])
                _combine_rows2(ob[row], ob[row + 1], s0, s1, vb, j0, nb)
                i += 2
            else:
                _scores(qb, row, kt, s0, nb, e, scale)
                _apply_mask(s0, nb, row, j0, last, mask, mask_kind)
                _online_step(s0, nb, m, ell, i, ob[row])
                _combine_rows(ob[row], s0, vb, j0, nb, one)
                i += 1
    for i in range(i1 - i0):
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
        kt = np.empty((q.shape[2], bc), q.dtype)
        s = np.empty((2, bc), q.dtype)
        m = np.empty(br, q.dtype)
        ell = np.empty(br, np.float64)
        for item in range(t, items, workers):
            h, blk = item // blocks, item % blocks
            i0 = blk * br
            _forward_block(q[qi[h]], k[ki[h]], v[vi[h]], mask[mi[h]], mask_kind, causal, scale,
                           i0, min(i0 + br, length), bc, kt, s, m, ell, out[h], lse[h])


# ------------------------------------------------------------------------------------------------
# Backward
# ------------------------------------------------------------------------------------------------


@njit(**_JIT)
def _rank_update(dst, j0, nb, tile, rows, src, i0, factor):
    """dst[j0 + jj, :] += factor · Σ_i tile[i, jj] · src[i0 + i, :] over the ``rows`` rows of
    the tile (``dV += Pᵀ dO``, ``dK += dSᵀ Q``): two rows of ``dst`` and four of ``src`` per
    pass, so each ``src`` row loaded serves two gradient rows."""
    n = src.shape[1]
    r4 = rows - rows % 4
    n2 = nb - nb % 2
    for jj in range(0, n2, 2):
        d0, d1 = dst[j0 + jj], dst[j0 + jj + 1]
        for i in range(0, r4, 4):
            a0, a1 = tile[i, jj] * factor, tile[i + 1, jj] * factor
            a2, a3 = tile[i + 2, jj] * factor, tile[i + 3, jj] * factor
            b0, b1 = tile[i, jj + 1] * factor, tile[i + 1, jj + 1] * factor
            b2, b3 = tile[i + 2, jj + 1] * factor, tile[i + 3, jj + 1] * factor
            r = i0 + i
            for c in range(n):
                s0, s1, s2, s3 = src[r, c], src[r + 1, c], src[r + 2, c], src[r + 3, c]
                d0[c] += a0 * s0 + a1 * s1 + a2 * s2 + a3 * s3
                d1[c] += b0 * s0 + b1 * s1 + b2 * s2 + b3 * s3
        for i in range(r4, rows):
            a, b = tile[i, jj] * factor, tile[i, jj + 1] * factor
            for c in range(n):
                d0[c] += a * src[i0 + i, c]
                d1[c] += b * src[i0 + i, c]
    for jj in range(n2, nb):
        drow = dst[j0 + jj]
        for i in range(rows):
            a = tile[i, jj] * factor
            for c in range(n):
                drow[c] += a * src[i0 + i, c]


@njit(**_JIT)
def _dscores(prow, dsrow, nb, d, scale):
    """dsrow = scale · P ∘ (dP − D) on one row (``dsrow`` holds dP on entry)."""
    for jj in range(nb):
        dsrow[jj] = prow[jj] * (dsrow[jj] - d) * scale


@njit(**_JIT)
def _backward_head(qb, kb, vb, mask, mask_kind, causal, scale, br, bc, ob, lse, gb, dqb, dkb,
                   dvb, kt, vt, p, ds, dsum):
    """One head's gradients. Per key block (outer) and query block (inner): P = exp(S - lse)
    recomputed, dV += Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D) · scale, dQ += dS K,
    dK += dSᵀ Q; a causal query block wholly above the key block is skipped; rows go two at a
    time where both have keys."""
    length, e = qb.shape
    keys, ev = vb.shape
    one = scale / scale
    for i in range(length):
        acc = 0.0
        for c in range(ev):
            acc += gb[i, c] * ob[i, c]
        dsum[i] = acc
        for c in range(e):
            dqb[i, c] = 0.0
    for j in range(keys):
        for c in range(e):
            dkb[j, c] = 0.0
        for c in range(ev):
            dvb[j, c] = 0.0
    for j0 in range(0, keys, bc):
        nb = min(bc, keys - j0)
        _transpose_block(kb, j0, nb, kt)
        _transpose_block(vb, j0, nb, vt)
        first = (j0 // br) * br if causal else 0
        for i0 in range(first, length, br):
            rows = min(br, length - i0)
            i = 0
            while i < rows:
                row = i0 + i
                last = row if causal else keys
                if j0 > last or lse[row] == -np.inf:
                    for jj in range(nb):
                        p[i, jj] = 0.0
                        ds[i, jj] = 0.0
                    i += 1
                    continue
                last1 = row + 1 if causal else keys
                if i + 1 < rows and lse[row + 1] != -np.inf:  # two rows share the tile loads
                    _scores2(qb, row, kt, p[i], p[i + 1], nb, e, scale)
                    _apply_mask(p[i], nb, row, j0, last, mask, mask_kind)
                    _apply_mask(p[i + 1], nb, row + 1, j0, last1, mask, mask_kind)
                    _exp_shifted(p[i], nb, lse[row])
                    _exp_shifted(p[i + 1], nb, lse[row + 1])
                    _scores2(gb, row, vt, ds[i], ds[i + 1], nb, ev, one)
                    _dscores(p[i], ds[i], nb, dsum[row], scale)
                    _dscores(p[i + 1], ds[i + 1], nb, dsum[row + 1], scale)
                    _combine_rows2(dqb[row], dqb[row + 1], ds[i], ds[i + 1], kb, j0, nb)
                    i += 2
                else:
                    _scores(qb, row, kt, p[i], nb, e, scale)
                    _apply_mask(p[i], nb, row, j0, last, mask, mask_kind)
                    _exp_shifted(p[i], nb, lse[row])
                    _scores(gb, row, vt, ds[i], nb, ev, one)
                    _dscores(p[i], ds[i], nb, dsum[row], scale)
                    _combine_rows(dqb[row], ds[i], kb, j0, nb, one)
                    i += 1
            _rank_update(dvb, j0, nb, p, rows, gb, i0, one)
            _rank_update(dkb, j0, nb, ds, rows, qb, i0, one)


@njit(parallel=True, **_JIT)
def _backward(q, k, v, mask, qi, ki, vi, mi, mask_kind, causal, scale, br, bc, workers, out,
              lse, g, dq, dk, dv):
    """Gradients of attention for head h into dq[h], dk[h], dv[h] (per head: the caller sums
    heads that share a broadcast input). Worker w of ``workers`` takes heads w, w + W, ...."""
    heads, length, ev = out.shape
    for t in prange(workers):
        kt = np.empty((q.shape[2], bc), q.dtype)
        vt = np.empty((ev, bc), q.dtype)
        p = np.empty((br, bc), q.dtype)
        ds = np.empty((br, bc), q.dtype)
        dsum = np.empty(length, q.dtype)
        for h in range(t, heads, workers):
            _backward_head(q[qi[h]], k[ki[h]], v[vi[h]], mask[mi[h]], mask_kind, causal, scale,
                           br, bc, out[h], lse[h], g[h], dq[h], dk[h], dv[h], kt, vt, p, ds, dsum)


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


def _run_parallel(kernel, items, *args):
    """``kernel(*args[:-1], workers, *args[-1])`` with ``workers`` = up to 4 per thread, handed
    to threads one at a time (Numba's dynamic chunks of 1): on a busy machine a preempted thread
    delays a quarter of its share, not the whole call. (The count is an argument because
    ``numba.get_num_threads()`` inside a kernel keeps it out of the disk cache.)"""
    workers = max(min(items, WORKERS_PER_THREAD * numba.get_num_threads()), 1)
    with numba.parallel_chunksize(1):
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
        _run_parallel(_forward, items, pb.q, pb.k, pb.v, pb.mask, pb.qi, pb.ki, pb.vi, pb.mi,
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
        _run_parallel(_backward, heads, pb.q, pb.k, pb.v, pb.mask, pb.qi, pb.ki, pb.vi, pb.mi,
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


def backward_workspace(avals, out, attrs=None, threads: int | None = None) -> int:
    """Bytes :func:`attention_grad_out` holds besides its inputs and output: the recomputed
    forward's workspace (:func:`forward_workspace`, including the row log-sum-exp) and its
    output (shaped like ``g``); the backward's per-head rows are O(L) too. Never L × S."""
    g = avals[0]
    return forward_workspace(avals[1:], g, attrs, threads) + int(
        math.prod(g.shape) * np.dtype(g.dtype).itemsize)


def forward_workspace(avals, out, attrs=None, threads: int | None = None) -> int:
    """Bytes :func:`attention_out` holds besides its inputs and output: per thread a transposed
    key tile (E × Bc), two score rows (2 × Bc) and the running max and sum (Br each); the row
    log-sum-exp (heads × L); the per-head index arrays; and a bool mask turned into 0 / −∞ (the
    mask's own size in q's dtype). O(L), never L × S.

    Args:
        avals: the inputs' shapes and dtypes (q, k, v[, mask]).
        out: the output's shape and dtype.
        attrs: the node's attributes (unused: the sizes do not depend on them).
        threads: the threads the kernel runs on (default Numba's current count).
    """
    q, v = avals[0], avals[2]
    size = np.dtype(q.dtype).itemsize
    heads, L = math.prod(out.shape[:-2]), out.shape[-2]
    if not heads or not L:
        return 0
    e = q.shape[-1]
    blocks = fitted_blocks(e, v.shape[-1], L, avals[1].shape[-2], q.dtype)
    items = heads * -(-L // blocks.br)
    threads = _threads(items) if threads is None else max(min(threads, items), 1)
    per_thread = (e * blocks.bc + 2 * blocks.bc + blocks.br) * size + blocks.br * 8
    total = threads * per_thread + heads * L * size + 4 * heads * 8
    if len(avals) == 4 and np.dtype(avals[3].dtype) == np.bool_:
        total += math.prod(avals[3].shape) * size
    return int(total)
