"""ml.nn.MultiheadAttention and ml.nn.CausalSelfAttention: against attention composed from
matmul and softmax in numpy, against PyTorch's ``nn.MultiheadAttention`` with the same weights
(answers committed in tests/data/torch_mha_reference.npz by tests/data/make_torch_reference.py),
the KV-cache step, dropout in training only, and errors."""

import json
import os

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import ops
from mlsys_lab.nn.attention import causal_attention

MHA_NPZ = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                       "torch_mha_reference.npz")


def _torch_cases():
    with np.load(MHA_NPZ, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    cases = {}
    for key, a in data.items():
        name, what = key.split("::")
        cases.setdefault(name, {})[what] = a
    return cases


TORCH = _torch_cases()


def _load(module, params):
    module.load_state_dict({k[len("param."):]: v for k, v in params.items()
                            if k.startswith("param.")})


def softmax_rows(s):
    """Softmax over the last axis; a row with no finite score is zero."""
    m = np.max(s, -1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0))
    t = e.sum(-1, keepdims=True)
    return np.where(t == 0, 0, e / np.where(t == 0, 1, t))


def composed_mha(m, q, k, v, bias=None):
    """Multi-head attention by hand in float64: projections, heads, softmax(QKᵀ/√d + bias) V,
    output projection. ``bias`` (N or 1, H or 1, L, S) is added to the scores."""
    w = {n: p.numpy().astype(np.float64) for n, p in m.named_parameters()}

    def lin(x, p):
        y = x @ w[f"{p}.weight"]
        return y + w[f"{p}.bias"] if f"{p}.bias" in w else y

    h, d = m.num_heads, m.head_dim

    def heads(x):
        n, t, _ = x.shape
        return x.reshape(n, t, h, d).transpose(0, 2, 1, 3)

    Q, K, V = heads(lin(q, "q_proj")), heads(lin(k, "k_proj")), heads(lin(v, "v_proj"))
    s = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(d)
    if bias is not None:
        s = s + bias
    p = softmax_rows(s)
    y = (p @ V).transpose(0, 2, 1, 3).reshape(q.shape[0], q.shape[1], h * d)
    return lin(y, "out_proj"), p


def data(seed, *shapes):
    r = np.random.default_rng(seed)
    return [r.standard_normal(s).astype(np.float32) for s in shapes]


# --- against PyTorch -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(TORCH))
def test_matches_pytorch_multihead_attention(name):
    c = TORCH[name]
    mod, fwd = json.loads(str(c["module"])), json.loads(str(c["forward"]))
    m = ml.nn.MultiheadAttention(**mod)
    _load(m, c)
    inputs = {k[len("input."):]: v for k, v in c.items() if k.startswith("input.")}
    m.eval()
    out, weights = m(**inputs, **fwd)
    np.testing.assert_allclose(out.numpy(), c["out"], rtol=2e-5, atol=2e-5)
    if "weights" in c:
        np.testing.assert_allclose(weights.numpy(), c["weights"], rtol=2e-5, atol=2e-6)
    else:
        assert weights is None


def test_reference_file_is_small_and_pickle_free():
    assert os.path.getsize(MHA_NPZ) < 100_000
    assert len(TORCH) >= 5


# --- against attention composed by hand --------------------------------------------------------
def test_self_attention_equals_the_composed_reference():
    m = ml.nn.MultiheadAttention(12, 3, rng=0)
    (x,) = data(1, (2, 5, 12))
    out, w = m(x, need_weights=True, average_attn_weights=False)
    want, p = composed_mha(m, x.astype(np.float64), x.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(w.numpy(), p, rtol=1e-4, atol=1e-6)
    out2, none = m(x)  # the op's path (no weights) gives the same output
    assert none is None
    np.testing.assert_allclose(out2.numpy(), out.numpy(), rtol=1e-5, atol=1e-6)


def test_module_masks_block_where_true_as_pytorch_modules_do():
    m = ml.nn.MultiheadAttention(8, 2, kdim=5, vdim=3, rng=2)
    q, k, v = data(3, (2, 4, 8), (2, 6, 5), (2, 6, 3))
    kpm = np.zeros((2, 6), bool)
    kpm[0, 4:] = True  # the last two keys of sample 0 are padding
    am = np.zeros((4, 6), bool)
    am[1, :3] = True
    bias = np.where(kpm[:, None, None, :] | am, -np.inf, 0.0)
    out, _ = m(q, k, v, key_padding_mask=kpm, attn_mask=am)
    want, _ = composed_mha(m, *(a.astype(np.float64) for a in (q, k, v)), bias)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
    # a float key_padding_mask adds to the scores instead
    fk = np.where(kpm, -1e9, 0.25).astype(np.float32)
    out, _ = m(q, k, v, key_padding_mask=fk)
    want, _ = composed_mha(m, *(a.astype(np.float64) for a in (q, k, v)),
                           fk[:, None, None, :].astype(np.float64))
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)


def test_is_causal_with_padding_and_a_fully_padded_sample():
    m = ml.nn.MultiheadAttention(8, 2, rng=4)
    (x,) = data(5, (2, 5, 8))
    kpm = np.zeros((2, 5), bool)
    kpm[1] = True  # sample 1 has no key at all: its rows attend nowhere, zeros before out_proj
    out, _ = m(x, key_padding_mask=kpm, is_causal=True)
    bias = np.where(kpm[:, None, None, :] | np.triu(np.ones((5, 5), bool), 1), -np.inf, 0.0)
    want, _ = composed_mha(m, *(x.astype(np.float64),) * 3, bias)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.numpy()[1], np.broadcast_to(m.out_proj.bias.numpy(), (5, 8)),
                               rtol=1e-6)


def test_unbatched_and_sequence_first_inputs():
    m = ml.nn.MultiheadAttention(8, 2, rng=6)
    (x,) = data(7, (3, 5, 8))
    batched, _ = m(x)
    single, _ = m(x[1])
    np.testing.assert_allclose(single.numpy(), batched.numpy()[1], rtol=1e-5, atol=1e-6)
    m.batch_first = False
    seq_first, _ = m(np.transpose(x, (1, 0, 2)))
    np.testing.assert_allclose(seq_first.numpy(), np.transpose(batched.numpy(), (1, 0, 2)),
                               rtol=1e-5, atol=1e-6)


def test_gradients_reach_every_parameter_and_the_trace_holds_the_op():
    m = ml.nn.MultiheadAttention(8, 2, rng=8)
    (x,) = data(9, (2, 4, 8))
    out, _ = m(x, is_causal=True)
    ops.sum(out * out).backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and np.abs(p.grad.numpy()).sum() > 0, name
    g = ml.trace(lambda a: m(a)[0], x)
    assert any(n.op == "scaled_dot_product_attention" for n in g.nodes)


def test_dropout_only_in_training():
    m = ml.nn.MultiheadAttention(8, 2, dropout=0.5, rng=10)
    (x,) = data(11, (2, 6, 8))
    m.eval()
    a, b = m(x)[0].numpy(), m(x)[0].numpy()
    np.testing.assert_array_equal(a, b)
    m.train()
    ops.manual_seed(0)
    c = m(x)[0].numpy()
    assert not np.allclose(a, c)


# --- causal self-attention ------------------------------------------------------------------------
def test_causal_self_attention_equals_the_composed_reference():
    c = ml.nn.CausalSelfAttention(8, 2, rng=12)
    (x,) = data(13, (2, 6, 8))
    w = {n: p.numpy().astype(np.float64) for n, p in c.named_parameters()}
    qkv = x.astype(np.float64) @ w["qkv.weight"] + w["qkv.bias"]
    q, k, v = (qkv[..., i * 8:(i + 1) * 8].reshape(2, 6, 2, 4).transpose(0, 2, 1, 3)
               for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / 2.0 + np.where(np.tril(np.ones((6, 6))) > 0, 0, -np.inf)
    y = (softmax_rows(s) @ v).transpose(0, 2, 1, 3).reshape(2, 6, 8)
    want = y @ w["proj.weight"] + w["proj.bias"]
    np.testing.assert_allclose(c(x).numpy(), want, rtol=1e-4, atol=1e-5)


def test_step_with_a_kv_cache_equals_the_whole_sequence():
    c = ml.nn.CausalSelfAttention(8, 2, rng=14)
    (x,) = data(15, (2, 7, 8))
    full = c(x).numpy()
    out, k, v = c.step(x[:, :3])  # a prompt of 3
    outs = [out.numpy()]
    for t in range(3, 7):  # then one token at a time
        out, k, v = c.step(x[:, t:t + 1], k, v)
        outs.append(out.numpy())
    assert k.shape == (2, 2, 7, 4)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-6)
    out, _, _ = c.step(x[:, 5:], *c.step(x[:, :5])[1:])  # a chunk of 2 after 5: bottom-right
    np.testing.assert_allclose(out.numpy(), full[:, 5:], rtol=1e-5, atol=1e-6)


def test_causal_attention_is_bottom_right_aligned():
    r = np.random.default_rng(16)
    q, k, v = r.standard_normal((1, 3, 4)), r.standard_normal((1, 5, 4)), \
        r.standard_normal((1, 5, 2))
    got = causal_attention(q, k, v).numpy()
    s = q @ k.transpose(0, 2, 1) / 2.0 + np.where(np.tril(np.ones((3, 5)), 2) > 0, 0, -np.inf)
    np.testing.assert_allclose(got, softmax_rows(s) @ v, rtol=1e-12)
    with pytest.raises(ml.ShapeError, match="causal_attention"):
        causal_attention(k, q, q[..., :2])


# --- errors --------------------------------------------------------------------------------------
def test_errors_name_the_layer_and_the_shapes():
    with pytest.raises(ml.ShapeError, match="divisible by num_heads 3"):
        ml.nn.MultiheadAttention(8, 3)
    with pytest.raises(ml.ShapeError, match="CausalSelfAttention"):
        ml.nn.CausalSelfAttention(8, 3)
    m = ml.nn.MultiheadAttention(8, 2, rng=0)
    (x,) = data(0, (2, 4, 8))
    with pytest.raises(ml.ShapeError, match=r"key_padding_mask must be \(batch, S\) = \(2, 4\)"):
        m(x, key_padding_mask=np.zeros((4, 2), bool))
    with pytest.raises(ml.ShapeError, match=r"attn_mask must be \(L, S\) = \(4, 4\)"):
        m(x, attn_mask=np.zeros((3, 4, 4), bool))
    with pytest.raises(ml.ShapeError, match="query must have 8 features"):
        m(x[..., :6])
    with pytest.raises(ml.DTypeError, match="attn_mask must be bool or floating"):
        m(x, attn_mask=np.zeros((4, 4), np.int64))
    with pytest.raises(ml.ShapeError, match=r"CausalSelfAttention: input must be \(batch, "):
        ml.nn.CausalSelfAttention(8, 2)(x[0])
