"""The tiled attention kernels (FlashAttention-style, chapter 18) against exact attention in
float64: forward (output and row log-sum-exp) and backward, over shapes whose lengths are not
multiples of the blocks, causal or not, bool and additive masks with fully masked rows,
broadcast batch axes, grouped-query heads, one query (decoding) and empty sequences; the
block-size rule; the vectorised exp; operator selection and the planner's workspace."""

import math

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine import memory
from mlsys_lab.engine.ops_attention import attention_backward_reference, attention_reference
from mlsys_lab.engine.registry import AVal
from mlsys_lab.kernels import attention as A
from mlsys_lab.kernels.cpu_config import CacheSizes

SMALL = A.Blocks(br=4, bc=16, budget=0, rule="test: several blocks and remainders")
TOL = {np.float32: 2e-6, np.float64: 1e-12}

# (q shape, k shape, v shape, mask: None | (shape, "bool" | "add" | "dead"), causal, gqa)
CASES = [
    ((2, 3, 37, 10), (2, 3, 53, 10), (2, 3, 53, 7), None, False, False),   # E != Ev, L, S odd
    ((2, 70, 16), (2, 45, 16), (2, 45, 5), None, True, False),              # causal, L > S
    ((2, 21, 8), (2, 50, 8), (2, 50, 8), None, True, False),                # causal, L < S
    ((3, 1, 8), (3, 33, 8), (3, 33, 8), None, False, False),                # one query: decode
    ((2, 3, 19, 8), (1, 3, 23, 8), (2, 1, 23, 6), ((3, 1, 23), "bool"), False, False),
    ((2, 3, 19, 8), (2, 3, 23, 8), (2, 3, 23, 6), ((19, 23), "add"), False, False),
    ((2, 19, 8), (2, 23, 8), (2, 23, 6), ((2, 19, 23), "dead"), False, False),
    ((2, 4, 9, 8), (2, 2, 23, 8), (2, 2, 23, 6), None, False, True),        # grouped heads
]


def _case(case, dtype, seed=0):
    qs, ks, vs, mask_spec, causal, gqa = case
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in (qs, ks, vs))
    mask = None
    if mask_spec is not None:
        shape, kind = mask_spec
        if kind == "add":
            mask = rng.standard_normal(shape).astype(dtype)
            mask[..., 0, :3] = -np.inf
        else:
            mask = rng.random(shape) < 0.6
            if kind == "dead":
                mask[..., 0, :] = False  # row 0 of each head sees no key
    g = rng.standard_normal(qs[:-1] + (vs[-1],)).astype(dtype)
    return q, k, v, mask, g, dict(is_causal=causal, enable_gqa=gqa)


def _reference(q, k, v, mask, g, attrs):
    q, k, v, g = (a.astype(np.float64) for a in (q, k, v, g))
    if mask is not None and mask.dtype != np.bool_:
        mask = mask.astype(np.float64)
    out, lse = attention_reference(q, k, v, mask, return_lse=True, **attrs)
    grads = attention_backward_reference(g, q, k, v, out, lse, mask, **attrs)
    return out, lse, grads


def _close(got, want, dtype, what):
    assert got.shape == want.shape and got.dtype == dtype, what
    scale = max(1.0, float(np.abs(want).max())) if want.size else 1.0
    err = float(np.abs(got - want).max()) / scale if want.size else 0.0
    assert err <= TOL[dtype], f"{what}: error {err:.2e} > {TOL[dtype]:.0e}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_tiled_forward_and_backward_match_exact_attention(case, dtype):
    q, k, v, mask, g, attrs = _case(case, dtype)
    out, lse = A.attention_forward(q, k, v, mask, blocks=SMALL, **attrs)
    want_out, want_lse, want_grads = _reference(q, k, v, mask, g, attrs)
    _close(out, want_out, dtype, "out")
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse)), "rows with no key"
    live = np.isfinite(want_lse)
    _close(lse[live], want_lse[live], dtype, "lse")
    grads = A.attention_backward(g, q, k, v, out, lse, mask, blocks=SMALL, **attrs)
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        _close(got, want, dtype, name)


def test_default_blocks_and_a_given_scale():
    """This machine's blocks (one key block, many rows) and an explicit scale."""
    q, k, v, mask, g, attrs = _case(CASES[1], np.float32, seed=3)
    attrs = dict(attrs, scale=0.37)
    out, lse = A.attention_forward(q, k, v, mask, **attrs)
    want_out, _, want_grads = _reference(q, k, v, mask, g, attrs)
    _close(out, want_out, np.float32, "out")
    for got, want in zip(A.attention_backward(g, q, k, v, out, lse, mask, **attrs), want_grads):
        _close(got, want, np.float32, "grad")


def test_scale_zero_gives_uniform_weights():
    """scale = 0: every key weighs alike (a kernel that makes its 1 as scale / scale gets NaN)."""
    q, k, v, mask, g, attrs = _case(CASES[1], np.float32, seed=5)
    attrs = dict(attrs, scale=0.0)
    out, lse = A.attention_forward(q, k, v, mask, blocks=SMALL, **attrs)
    want_out, _, want_grads = _reference(q, k, v, mask, g, attrs)
    _close(out, want_out, np.float32, "out")
    for got, want in zip(A.attention_backward(g, q, k, v, out, lse, mask, blocks=SMALL, **attrs),
                         want_grads):
        _close(got, want, np.float32, "grad")


def test_fully_masked_rows_and_empty_sequences_as_the_reference():
    """A row with no key: output 0, lse -inf, no gradient; L = 0, S = 0 and E = 0 work."""
    q, k, v, mask, g, attrs = _case(CASES[6], np.float32)
    out, lse = A.attention_forward(q, k, v, mask, blocks=SMALL)
    assert np.all(out[:, 0] == 0) and np.all(np.isneginf(lse[:, 0]))
    dq, _, _ = A.attention_backward(g, q, k, v, out, lse, mask, blocks=SMALL)
    assert np.all(dq[:, 0] == 0)
    for qs, ks, vs in [((2, 0, 8), (2, 5, 8), (2, 5, 3)), ((2, 5, 8), (2, 0, 8), (2, 0, 3)),
                       ((2, 5, 0), (2, 4, 0), (2, 4, 3))]:
        rng = np.random.default_rng(1)
        q, k, v = (rng.standard_normal(s).astype(np.float32) for s in (qs, ks, vs))
        out, lse = A.attention_forward(q, k, v, scale=1.0)
        want, want_lse = attention_reference(q, k, v, scale=1.0, return_lse=True)
        np.testing.assert_allclose(out, want, atol=1e-6)
        assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
        g = np.ones_like(out)
        for got, ref in zip(A.attention_backward(g, q, k, v, out, lse, scale=1.0),
                            attention_backward_reference(g, q, k, v, want, want_lse, scale=1.0)):
            np.testing.assert_allclose(got, ref, atol=1e-6)


def test_causal_never_touches_key_blocks_above_the_diagonal():
    """Keys past the last query are NaN: a kernel that computed those blocks and masked them
    (0 · NaN) would return NaN; one that skips them returns attention over the first keys."""
    rng = np.random.default_rng(4)
    q, k, v, g = (rng.standard_normal(s).astype(np.float32)
                  for s in ((2, 8, 4), (2, 40, 4), (2, 40, 3), (2, 8, 3)))
    k[:, 8:], v[:, 8:] = np.nan, np.nan
    blocks = A.Blocks(4, 4, 0, "test")
    out, lse = A.attention_forward(q, k, v, is_causal=True, blocks=blocks)
    want, want_lse, want_grads = _reference(q, k[:, :8], v[:, :8], None, g, {"is_causal": True})
    _close(out, want, np.float32, "out")
    dq, dk, dv = A.attention_backward(g, q, k, v, out, lse, is_causal=True, blocks=blocks)
    _close(dq, want_grads[0], np.float32, "dq")
    _close(dk[:, :8], want_grads[1], np.float32, "dk")
    assert np.all(dk[:, 8:] == 0) and np.all(dv[:, 8:] == 0)


def test_bad_shapes_and_dtypes_name_the_op():
    q = np.zeros((2, 4, 8), np.float32)
    with pytest.raises(ml.ShapeError, match="scaled_dot_product_attention.*k \\(2, 5, 7\\)"):
        A.attention_forward(q, np.zeros((2, 5, 7), np.float32), np.zeros((2, 5, 3), np.float32))
    with pytest.raises(ml.DTypeError, match="scaled_dot_product_attention.*float64"):
        A.attention_forward(q, q.astype(np.float64), q)
    with pytest.raises(ml.ShapeError, match="attn_mask \\(3, 4\\)"):
        A.attention_forward(q, q, q, np.ones((3, 4), bool))


def test_blocks_follow_the_books_rule():
    """Br = Bc = floor(sqrt(M / size)) with M = L2 / 16 (the score tile the kernel re-reads
    between its BLAS products), whatever the head dimension; multiples of 16, clamped. The
    earlier rules (K and V tiles in L1d, Bc = floor(L1d / 2d); or half of L2) give other sizes
    on both machines."""
    xeon = CacheSizes(l1d=48 << 10, l2=2 << 20, l3=32 << 20, source="test")
    b = A.attention_blocks(64, dtype=np.float32, caches=xeon)
    assert (b.br, b.bc, b.budget) == (176, 176, 128 << 10) and "⌊√M⌋ = 181" in b.rule
    assert (A.attention_blocks(128, caches=xeon).br, A.attention_blocks(32, caches=xeon).bc) \
        == (176, 176)
    assert A.attention_blocks(64, dtype=np.float64, caches=xeon).bc == 128  # sqrt(16384)
    zen3 = CacheSizes(l1d=32 << 10, l2=512 << 10, l3=32 << 20, source="test")
    assert A.attention_blocks(64, caches=zen3).bc == 80  # floor(sqrt(8192)) = 90 -> 80
    zen5 = CacheSizes(l1d=48 << 10, l2=1 << 20, l3=32 << 20, source="test")
    assert A.attention_blocks(64, caches=zen5).bc == 128
    small = CacheSizes(l1d=4 << 10, l2=16 << 10, l3=1 << 20, source="test")
    assert A.attention_blocks(256, caches=small).bc == A.MIN_BLOCK
    huge = CacheSizes(l1d=48 << 10, l2=256 << 20, l3=1 << 30, source="test")
    assert A.attention_blocks(2, caches=huge).bc == A.MAX_BLOCK
    assert A.fitted_blocks(64, 64, 3, 20).br == 3 and A.fitted_blocks(64, 64, 3, 20).bc == 32


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_nonpositive_is_within_a_few_ulp(dtype):
    import numba

    @numba.njit
    def run(x, out):
        for i in range(x.size):
            out[i] = A.exp_nonpositive(x[i])

    low = -85.0 if dtype == np.float32 else -700.0
    x = np.concatenate([np.linspace(low, 0, 20001), [0.0, -0.0]]).astype(dtype)
    out = np.empty_like(x)
    run(x, out)
    want = np.exp(x.astype(np.float64))
    ulps = np.abs(out - want) / (want * np.finfo(dtype).eps)
    assert ulps.max() <= 3, f"{ulps.max():.1f} ulp"
    specials = np.array([-np.inf, np.nan, -1e4], dtype)
    run(specials, out[:3])
    assert out[0] == 0 and np.isnan(out[1]) and out[2] == 0


def test_selection_picks_the_tiled_kernel_and_the_planner_counts_its_workspace():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 40, 16)).astype(np.float32) for _ in range(3))

    def f(q, k, v):
        return ops.scaled_dot_product_attention(q, k, v, is_causal=True)

    c = ml.compile(f, q, k, v)
    node = next(n for n in c.graph.nodes if n.op == "scaled_dot_product_attention")
    assert node.meta["kernel"].name == "numba.flash_attention"
    assert "numba.flash_attention" in c.explain()
    want = attention_reference(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(c(q, k, v), want, atol=2e-6)
    spaces = [r for r in c.lifetimes if isinstance(r.id, memory.Workspace)]
    declared = A.forward_workspace([x.aval for x in node.inputs], node.outputs[0].aval)
    assert [r.size for r in spaces] == [declared] and declared > 0
    assert c.plan.arena_size >= declared + q.nbytes  # the output and the workspace
    # the op decomposed (matmul, softmax, matmul): the planner sees the L x S scores instead
    ex = ml.compile(lambda q, k, v: ops.softmax(q @ ops.transpose(k, (0, 1, 3, 2)), -1) @ v,
                    q, k, v)
    assert any(math.prod(getattr(r.id, "shape", ())[-2:]) == 40 * 40 for r in ex.lifetimes)


def test_workspace_is_linear_in_length_and_small_at_8192():
    def declared(length, dtype=np.float32):
        aval = AVal((1, 8, length, 64), np.dtype(dtype))
        return A.forward_workspace([aval, aval, aval], aval, threads=2)

    assert declared(4096) - declared(2048) == 2 * (declared(2048) - declared(1024))  # affine
    one_head_scores = 8192 * 8192 * 4
    assert declared(8192) <= one_head_scores / 50


# --- the CUDA kernels at tiny tiles: under Numba's CUDA simulator, or on a real GPU -----------
CUDA_CASES = [
    ((2, 7, 5), (2, 9, 5), (2, 9, 3), None, False, False),
    ((2, 9, 5), (2, 6, 5), (2, 6, 3), None, True, False),
    ((2, 7, 5), (2, 9, 5), (2, 9, 3), ((7, 9), "dead"), False, False),
    ((1, 4, 3, 5), (1, 2, 6, 5), (1, 2, 6, 3), ((1, 3, 6), "add"), False, True),
]


def _cuda_or_skip():
    """The CUDA kernels' module: under Numba's CUDA simulator (tests/conftest.py switches it on),
    or on a real GPU when run with ``NUMBA_ENABLE_CUDASIM=0`` (benchmarks/device_check.sh)."""
    from numba import cuda

    from mlsys_lab.kernels import attention_cuda

    if not (attention_cuda.simulator_enabled() or cuda.is_available()):
        pytest.skip("needs Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1) or a GPU")
    return attention_cuda


@pytest.mark.parametrize("case", CUDA_CASES, ids=[f"case{i}" for i in range(len(CUDA_CASES))])
def test_cuda_forward_matches_exact_attention(case):
    attention_cuda = _cuda_or_skip()
    q, k, v, mask, g, attrs = _case(case, np.float32)
    out, lse = attention_cuda.attention_forward(q, k, v, mask, **attrs)
    want_out, want_lse, _ = _reference(q, k, v, mask, g, attrs)
    _close(out, want_out, np.float32, "out")
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    live = np.isfinite(want_lse)
    _close(lse[live], want_lse[live], np.float32, "lse")


def test_a_compiled_gradient_runs_the_tiled_backward_kernel():
    """The op's VJP is the gradient op, so ml.compile of a gradient selects the tiled backward
    (which recomputes the forward from q, k, v) and declares its O(L) workspace."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 37, 8)).astype(np.float32) for _ in range(3))
    g = rng.standard_normal((2, 37, 8)).astype(np.float32)

    def loss(q, k, v):
        return ops.sum(ops.scaled_dot_product_attention(q, k, v, is_causal=True) * ml.tensor(g))

    c = ml.compile(ml.grad(loss, argnums=(0, 1, 2)), q, k, v)
    node = next(n for n in c.graph.nodes if n.op == "scaled_dot_product_attention_grad")
    assert node.meta["kernel"].name == "numba.flash_attention_backward"
    out, lse = attention_reference(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True,
                                   return_lse=True)
    want = attention_backward_reference(g.astype(np.float64), *(a.astype(np.float64)
                                        for a in (q, k, v)), out, lse, is_causal=True)
    for got, ref in zip(c(q, k, v), want):
        np.testing.assert_allclose(got, ref, atol=5e-6)
    declared = A.backward_workspace([x.aval for x in node.inputs], node.outputs[0].aval)
    assert declared in [r.size for r in c.lifetimes if isinstance(r.id, memory.Workspace)]

    def at(length):  # 8 heads of d = 64: affine in L, so no L x S matrix hides in it
        aval = AVal((1, 8, length, 64), np.dtype(np.float32))
        return A.backward_workspace([aval] * 4, AVal((3 * 8 * length * 64,), aval.dtype),
                                    threads=2)

    assert at(4096) - at(2048) == 2 * (at(2048) - at(1024)) > 0


def test_cuda_selection_picks_the_cuda_kernel():
    _cuda_or_skip()
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((1, 2, 6, 4)).astype(np.float32) for _ in range(3))

    def f(q, k, v):
        return ops.scaled_dot_product_attention(q, k, v, is_causal=True)

    c = ml.compile(f, q, k, v, device="cuda")
    assert "cuda.flash_attention" in c.explain()
    want = attention_reference(*(a.astype(np.float64) for a in (q, k, v)), is_causal=True)
    np.testing.assert_allclose(c(q, k, v), want, atol=2e-6)


@pytest.mark.parametrize("case", CUDA_CASES, ids=[f"case{i}" for i in range(len(CUDA_CASES))])
def test_cuda_backward_matches_exact_attention(case):
    attention_cuda = _cuda_or_skip()
    q, k, v, mask, g, attrs = _case(case, np.float32)
    want_out, want_lse, want_grads = _reference(q, k, v, mask, g, attrs)
    out, lse = want_out.astype(np.float32), want_lse.astype(np.float32)
    grads = attention_cuda.attention_backward(g, q, k, v, out, lse, mask, **attrs)
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        _close(got, want, np.float32, name)
