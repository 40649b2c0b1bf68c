"""ml.ops.scaled_dot_product_attention: semantics beyond the conformance cases, and its errors.

The gradients on every path, against central differences and PyTorch's answers, are in
``tests/conformance.py`` (op ``scaled_dot_product_attention``); here: the rules PyTorch states
(causal alignment, bool vs additive masks, fully masked rows, default scale, GQA), the kernel
contract (plain attributes, the log-sum-exp, the FlashAttention backward reference), dropout,
and errors that name the op and the shapes.
"""

import math

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.engine.ops_attention import (
    SCALED_DOT_PRODUCT_ATTENTION_GRAD,
    attention_backward_reference,
    attention_reference,
    causal_mask,
    unpack,
)
from mlsys_lab.engine.tensor import apply

SDPA = ops.scaled_dot_product_attention


def qkv(seed=0, batch=(2, 3), L=4, S=5, E=3, Ev=2, dtype=np.float64):
    r = np.random.default_rng(seed)
    return [r.standard_normal(batch + shape).astype(dtype)
            for shape in ((L, E), (S, E), (S, Ev))]


def grads(fn, *arrays, u=None):
    ts = [ml.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    u = np.ones(out.shape) if u is None else u
    ops.sum(out * ml.tensor(u.astype(out.dtype))).backward()
    return out.numpy(), [t.grad.numpy() for t in ts]


# --- semantics -----------------------------------------------------------------------------------
@pytest.mark.parametrize("L, S", [(4, 6), (6, 4), (5, 5)])
def test_is_causal_is_the_upper_left_tril_mask(L, S):
    q, k, v = qkv(L=L, S=S)
    want = SDPA(q, k, v, attn_mask=np.tril(np.ones((L, S), bool))).numpy()
    np.testing.assert_allclose(SDPA(q, k, v, is_causal=True).numpy(), want, rtol=1e-14)
    # row 0 sees only key 0: its output is v[..., 0, :]
    np.testing.assert_allclose(SDPA(q, k, v, is_causal=True).numpy()[..., 0, :], v[..., 0, :],
                               rtol=1e-14)


def test_bool_mask_equals_an_additive_minus_inf_mask():
    q, k, v = qkv()
    m = np.random.default_rng(1).random((4, 5)) > 0.5
    m[:, 2] = True
    additive = np.where(m, 0.0, -np.inf)
    np.testing.assert_allclose(SDPA(q, k, v, m).numpy(), SDPA(q, k, v, additive).numpy(),
                               rtol=1e-14)


def test_a_bool_mask_with_the_batch_of_v_only_broadcasts_the_scores():
    # q and k have one batch entry, v and the mask two: the scores are masked per v's entry
    # (the reference masks a fresh score array in place only when the mask fits it)
    q, k, _ = qkv(batch=(1,))
    v = np.random.default_rng(3).standard_normal((2, 5, 2))
    m = np.random.default_rng(4).random((2, 4, 5)) > 0.4
    m[..., 0] = True
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(3)
    want = []
    for i in range(2):
        p = np.where(m[i], np.exp(s[0] - s[0].max(-1, keepdims=True)), 0.0)
        want.append((p / p.sum(-1, keepdims=True)) @ v[i])
    np.testing.assert_allclose(SDPA(q, k, v, m).numpy(), np.stack(want), rtol=1e-12)


def test_additive_mask_shifts_the_scores():
    q, k, v = qkv()
    bias = np.random.default_rng(2).standard_normal((4, 5))
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(3) + bias
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v
    np.testing.assert_allclose(SDPA(q, k, v, bias).numpy(), want, rtol=1e-12)


def test_fully_masked_rows_give_zero_and_zero_gradient_as_pytorch():
    q, k, v = qkv()
    m = np.ones((4, 5), bool)
    m[2] = False
    for mask in (m, np.where(m, 0.0, -np.inf)):
        out, (dq, dk, dv) = grads(lambda a, b, c, mask=mask: SDPA(a, b, c, mask), q, k, v)
        assert np.all(out[..., 2, :] == 0) and np.isfinite(out).all()
        assert np.all(dq[..., 2, :] == 0) and np.isfinite(dq).all()
        assert np.isfinite(dk).all() and np.isfinite(dv).all()
        # the other rows are what the op gives without the dead row
        keep = [0, 1, 3]
        np.testing.assert_allclose(out[..., keep, :],
                                   SDPA(q[..., keep, :], k, v, mask[keep]).numpy(), rtol=1e-14)


def test_no_keys_gives_zeros_and_zero_gradients():
    q, k, v = qkv(S=0)
    out, (dq, dk, dv) = grads(SDPA, q, k, v)
    assert out.shape == (2, 3, 4, 2) and not out.any() and not dq.any()
    assert dk.shape == k.shape and dv.shape == v.shape


def test_default_scale_is_one_over_sqrt_e():
    q, k, v = qkv(E=7)
    np.testing.assert_array_equal(SDPA(q, k, v).numpy(),
                                  SDPA(q, k, v, scale=1 / math.sqrt(7)).numpy())
    assert not np.allclose(SDPA(q, k, v, scale=1.0).numpy(), SDPA(q, k, v).numpy())


def test_gqa_repeats_each_key_head_for_a_group_of_query_heads():
    r = np.random.default_rng(3)
    q, k, v = r.standard_normal((2, 6, 3, 4)), r.standard_normal((2, 2, 5, 4)), \
        r.standard_normal((2, 2, 5, 3))
    rep = lambda x: np.repeat(x, 3, axis=1)  # noqa: E731 - heads 0,0,0,1,1,1
    out, (dq, dk, dv) = grads(lambda a, b, c: SDPA(a, b, c, enable_gqa=True), q, k, v)
    want, (wq, wk, wv) = grads(SDPA, q, rep(k), rep(v))
    np.testing.assert_allclose(out, want, rtol=1e-13)
    np.testing.assert_allclose(dq, wq, rtol=1e-12)
    np.testing.assert_allclose(dk, wk.reshape(2, 2, 3, 5, 4).sum(2), rtol=1e-12)
    np.testing.assert_allclose(dv, wv.reshape(2, 2, 3, 5, 3).sum(2), rtol=1e-12)


def test_float32_large_scores_do_not_overflow():
    q, k, v = qkv(dtype=np.float32)
    out = SDPA(q * 1e4, k, v).numpy()
    assert out.dtype == np.float32 and np.isfinite(out).all()
    want = attention_reference(*(a.astype(np.float64) for a in (q * 1e4, k, v)))
    np.testing.assert_allclose(out, want, rtol=1e-3, atol=1e-3)


def test_mask_given_as_a_list_of_bools():
    q, k, v = qkv(batch=())
    m = [[True] * 5, [True, False] * 2 + [True], [False] * 4 + [True], [True] * 5]
    np.testing.assert_array_equal(SDPA(q, k, v, m).numpy(), SDPA(q, k, v, np.array(m)).numpy())


# --- the kernels' contract ------------------------------------------------------------------------
def test_traced_node_has_plain_attributes():
    q, k, v = qkv()
    g = ml.trace(lambda a, b, c: SDPA(a, b, c, is_causal=True), q, k, v)
    (node,) = [n for n in g.nodes if n.op == "scaled_dot_product_attention"]
    assert node.attrs == {"is_causal": True, "scale": 1 / math.sqrt(3), "enable_gqa": False}
    assert type(node.attrs["scale"]) is float and type(node.attrs["is_causal"]) is bool
    m = np.ones((4, 5), bool)
    g = ml.trace(lambda a, b, c, d: SDPA(a, b, c, d), q, k, v, m)
    (node,) = [n for n in g.nodes if n.op == "scaled_dot_product_attention"]
    assert len(node.inputs) == 4


def test_reference_log_sum_exp():
    q, k, v = qkv()
    m = np.ones((4, 5), bool)
    m[1] = False
    out, lse = attention_reference(q, k, v, m, scale=0.5, return_lse=True)
    s = 0.5 * q @ np.swapaxes(k, -1, -2)
    want = np.log(np.exp(s).sum(-1))
    want[..., 1] = -np.inf
    np.testing.assert_allclose(lse, want, rtol=1e-13)
    np.testing.assert_array_equal(out, attention_reference(q, k, v, m, scale=0.5))


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"mask": "bool"}, {"mask": "float"},
                                {"enable_gqa": True}])
def test_backward_reference_matches_the_tape(kw):
    r = np.random.default_rng(4)
    q = r.standard_normal((2, 4, 5, 3))
    heads = 2 if kw.get("enable_gqa") else 4
    k, v = r.standard_normal((2, heads, 6, 3)), r.standard_normal((2, heads, 6, 2))
    kw = dict(kw)
    mask = kw.pop("mask", None)
    if mask == "bool":
        mask = r.random((5, 6)) > 0.3
        mask[3] = False
    elif mask == "float":
        mask = np.where(r.random((5, 6)) > 0.3, r.standard_normal((5, 6)), -np.inf)
    u = r.standard_normal((2, 4, 5, 2))
    args = (mask,) if mask is not None else ()
    out, got = grads(lambda a, b, c: SDPA(a, b, c, *args, **kw), q, k, v, u=u)
    o, lse = attention_reference(q, k, v, mask, return_lse=True, **kw)
    np.testing.assert_allclose(o, out, rtol=1e-14)
    want = attention_backward_reference(u, q, k, v, o, lse, mask, **kw)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)


def test_compiled_matches_eager():
    q, k, v = qkv(dtype=np.float32)
    c = ml.compile(lambda a, b, c: SDPA(a, b, c, is_causal=True), q, k, v)
    np.testing.assert_allclose(np.asarray(c(q, k, v)), SDPA(q, k, v, is_causal=True).numpy(),
                               rtol=1e-6)


def test_causal_mask_helper():
    np.testing.assert_array_equal(causal_mask(2, 3), [[True, False, False], [True, True, False]])


# --- dropout -------------------------------------------------------------------------------------
def test_dropout_uses_the_library_generator():
    q, k, v = qkv()
    ops.manual_seed(7)
    a, b = SDPA(q, k, v, dropout_p=0.5).numpy(), SDPA(q, k, v, dropout_p=0.5).numpy()
    ops.manual_seed(7)
    c = SDPA(q, k, v, dropout_p=0.5).numpy()
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, c)
    assert not SDPA(q, k, v, dropout_p=1.0).numpy().any()


def test_dropout_drops_weights_and_rescales_the_rest():
    q, k = qkv(batch=(), L=1, S=400)[:2]
    v = np.ones((400, 1))
    ops.manual_seed(0)
    outs = np.array([SDPA(q, k, v, dropout_p=0.25).numpy()[0, 0] for _ in range(200)])
    # weights sum to 1; kept ones scaled by 1/(1-p): the mean of sum(kept weights) stays 1
    assert abs(outs.mean() - 1.0) < 0.02
    assert outs.std() > 0.01


def test_dropout_gradient_reuses_the_forward_mask():
    q, k, v = qkv()
    ops.manual_seed(3)
    ts = [ml.tensor(a, requires_grad=True) for a in (q, k, v)]
    y = SDPA(*ts, dropout_p=0.5)
    ops.sum(y).backward()
    # y is linear in v: <y, 1> = <v, dv> holds only if the gradient used y's mask
    np.testing.assert_allclose(float(ops.sum(y).numpy()), float(np.sum(v * ts[2].grad.numpy())),
                               rtol=1e-12)


# --- errors --------------------------------------------------------------------------------------
def _raises(err, match, *args, **kw):
    with pytest.raises(err, match=match) as e:
        SDPA(*args, **kw)
    assert "scaled_dot_product_attention" in str(e.value)


def test_error_feature_sizes_differ():
    q, k, v = qkv()
    _raises(ml.ShapeError, r"q \(2, 3, 4, 3\), k \(2, 3, 5, 2\)", q, k[..., :2], v)


def test_error_lengths_differ():
    q, k, v = qkv()
    _raises(ml.ShapeError, "same length S", q, k, v[..., :4, :])


def test_error_batch_axes_do_not_broadcast():
    q, k, v = qkv()
    _raises(ml.ShapeError, "do not broadcast", q, k[:1, :2], v[:1, :2])


def test_error_mask_shape():
    q, k, v = qkv()
    _raises(ml.ShapeError, r"attn_mask \(4, 4\) does not broadcast", q, k, v,
            np.ones((4, 4), bool))
    _raises(ml.ShapeError, r"attn_mask \(5, 2, 3, 4, 5\)", q, k, v, np.ones((5, 2, 3, 4, 5), bool))


def test_error_mask_dtype():
    q, k, v = qkv(dtype=np.float32)
    _raises(ml.DTypeError, "attn_mask must be bool or q's dtype float32", q, k, v,
            np.zeros((4, 5)))
    _raises(ml.DTypeError, "attn_mask", q, k, v, np.zeros((4, 5), np.int64))


def test_error_mask_and_is_causal():
    q, k, v = qkv()
    _raises(ml.ArgumentError, "not both", q, k, v, np.ones((4, 5), bool), is_causal=True)


def test_error_dtypes():
    q, k, v = qkv()
    _raises(ml.DTypeError, "one dtype", q.astype(np.float32), ml.tensor(k), ml.tensor(v))
    _raises(ml.DTypeError, "q must be floating", ml.tensor(q.astype(np.int64)), ml.tensor(k),
            ml.tensor(v))


def test_error_rank():
    _raises(ml.ShapeError, "at least 2 dims", np.ones(3), np.ones((2, 3)), np.ones((2, 3)))


def test_error_gqa_heads():
    q, k, v = qkv(batch=(1, 4))
    _raises(ml.ShapeError, "divide the query heads", q, k[:, :3], v[:, :3], enable_gqa=True)
    _raises(ml.ShapeError, "head axis", q[0, 0], k[0, 0], v[0, 0], enable_gqa=True)


def test_error_arguments():
    q, k, v = qkv()
    _raises(ml.ArgumentError, "must lie in", q, k, v, dropout_p=1.5)
    _raises(ml.DTypeError, "scale must be a number", q, k, v, scale="big")
    _raises(ml.DTypeError, "is_causal must be True or False", q, k, v, is_causal=1)


def test_error_in_a_traced_graph_names_the_op():
    q, k, v = qkv()
    with pytest.raises(ml.ShapeError, match="scaled_dot_product_attention"):
        ml.trace(lambda a, b, c: SDPA(a, b, c), q, k[..., :2], v)


# --- the gradient op (where a backward kernel plugs in) -------------------------------------------
def test_the_vjp_is_the_packed_gradient_op():
    q, k, v = qkv()
    g = ml.trace(ml.grad(lambda a, b, c: ops.sum(SDPA(a, b, c, is_causal=True)),
                         argnums=(0, 1, 2)), q, k, v)
    found = [n for n in g.nodes if n.op == "scaled_dot_product_attention_grad"]
    assert len(found) == 1 and found[0].attrs["is_causal"] is True
    assert found[0].output.shape == (q.size + k.size + v.size,)
    assert not any(n.op == "softmax" for n in g.nodes)  # no composed backward left
    flat = apply(SCALED_DOT_PRODUCT_ATTENTION_GRAD, np.ones((2, 3, 4, 2)), q, k, v,
                 is_causal=True, scale=1 / math.sqrt(3), enable_gqa=False)
    _, want = grads(lambda a, b, c: SDPA(a, b, c, is_causal=True), q, k, v)
    for i, w in enumerate(want):
        np.testing.assert_allclose(unpack(flat, i, (q, k, v)).numpy(), w, rtol=1e-12)


def test_a_float_mask_that_needs_a_gradient_takes_the_composed_rule():
    q, k, v = qkv()
    bias = np.random.default_rng(5).standard_normal((4, 5))
    ts = [ml.tensor(a, requires_grad=True) for a in (q, k, v, bias)]
    ops.sum(SDPA(*ts) * ml.tensor(np.arange(2 * 3 * 4 * 2.0).reshape(2, 3, 4, 2))).backward()
    eps, i = 1e-6, (1, 2)
    up, down = bias.copy(), bias.copy()
    up[i] += eps
    down[i] -= eps
    w = np.arange(2 * 3 * 4 * 2.0).reshape(2, 3, 4, 2)
    num = (np.sum(SDPA(q, k, v, up).numpy() * w) - np.sum(SDPA(q, k, v, down).numpy() * w)) / (
        2 * eps)
    assert ts[3].grad.numpy()[i] == pytest.approx(num, rel=1e-6)


def test_gradient_op_errors_name_it():
    q, k, v = qkv()
    with pytest.raises(ml.ShapeError, match="scaled_dot_product_attention_grad: the cotangent"):
        apply(SCALED_DOT_PRODUCT_ATTENTION_GRAD, np.ones((2, 3, 4, 3)), q, k, v, is_causal=False,
              scale=1.0, enable_gqa=False)
