"""Pruning (masks, fine-tuning, channel pruning, the CSR kernel), distillation (the loss against
its formula and gradient) and the toy weight obfuscation (outputs unchanged)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab import nn
from mlsys_lab.deploy import obfuscate as O
from mlsys_lab.deploy.compress import distill as D
from mlsys_lab.deploy.compress import prune as PR
from mlsys_lab.errors import ArgumentError, DTypeError, ShapeError
from mlsys_lab.nn.module import Parameter

SEEDS = st.integers(0, 2**31 - 1)


def _mlp(sizes=(6, 8, 7, 3), seed=0, dtype=np.float32):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        lin = nn.Linear(a, b, rng=seed + i)
        lin.weight = Parameter(lin.weight.numpy().astype(dtype))
        lin.bias = Parameter(np.random.default_rng(seed + 10 + i).standard_normal(b)
                             .astype(dtype) * 0.1)
        layers.append(lin)
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


# --- magnitude pruning ------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(sparsity=st.floats(0, 1), seed=SEEDS, scope=st.sampled_from(["global", "layer"]))
def test_magnitude_masks_remove_exactly_the_smallest_weights(sparsity, seed, scope):
    model = _mlp(seed=seed % 1000)
    masks = PR.magnitude_masks(model, sparsity, scope)
    weights = {n: p.numpy() for n, p in PR.prunable(model).items()}
    assert set(masks) == set(weights) == {"0.weight", "2.weight", "4.weight"}
    groups = [list(weights)] if scope == "global" else [[n] for n in weights]
    for names in groups:
        keep = np.concatenate([masks[n].ravel() for n in names])
        mags = np.concatenate([np.abs(weights[n]).ravel() for n in names])
        assert keep.size - keep.sum() == round(sparsity * keep.size)
        if keep.any() and not keep.all():
            assert mags[~keep].max() <= mags[keep].min()
    PR.apply_masks(model, masks)
    total = sum(w.size for w in weights.values())
    removed = sum(int((~m).sum()) for m in masks.values())
    assert PR.sparsity_of(model) >= removed / total - 1e-12


def test_pruning_refuses_bad_requests():
    model = _mlp()
    with pytest.raises(ArgumentError, match="sparsity"):
        PR.magnitude_masks(model, 1.5)
    with pytest.raises(ArgumentError, match="scope"):
        PR.magnitude_masks(model, 0.5, "block")
    with pytest.raises(ShapeError, match="no parameter"):
        PR.apply_masks(model, {"0.weight": np.ones((2, 2), bool)})
    with pytest.raises(ArgumentError, match="no weight"):
        PR.magnitude_masks(nn.Sequential(nn.ReLU()), 0.5)


def test_fine_tuning_keeps_pruned_weights_at_zero_and_learns():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    model = _mlp()
    masks = PR.magnitude_masks(model, 0.7)
    PR.apply_masks(model, masks)
    opt = ml.optim.SGD(model.parameters(), lr=0.2)
    losses = PR.fine_tune(model, ml.ops.cross_entropy, opt, [(x, y)], masks, epochs=30)
    assert losses[-1] < losses[0] * 0.8
    for name, p in PR.prunable(model).items():
        assert np.all(p.numpy()[~masks[name]] == 0), name
        assert np.any(p.numpy()[masks[name]] != 0)


# --- channel pruning ---------------------------------------------------------------------------
def test_prune_channels_of_an_mlp_slices_both_layers():
    model = _mlp(seed=3)
    small = PR.prune_channels(model, 0, keep=3)
    assert small[0].out_features == 3 and small[2].in_features == 3
    keep = np.sort(np.argsort(-np.abs(model[0].weight.numpy()).sum(0))[:3])
    np.testing.assert_array_equal(small[0].weight.numpy(), model[0].weight.numpy()[:, keep])
    np.testing.assert_array_equal(small[2].weight.numpy(), model[2].weight.numpy()[keep])
    assert small[4] is model[4]
    with pytest.raises(ArgumentError, match="keep"):
        PR.prune_channels(model, 0, keep=0)
    with pytest.raises(ArgumentError, match="no Conv2d or Linear"):
        PR.prune_channels(model, 4, keep=2)


def test_pruning_dead_channels_of_a_cnn_leaves_the_outputs_unchanged():
    """Filters that ReLU always silences (zero weights, negative bias) carry nothing: removing
    them, the BN channels after them and the Linear rows of their H*W features is exact."""
    rng = np.random.default_rng(4)
    conv = nn.Conv2d(1, 6, 3, padding=1, rng=0)
    w, b = conv.weight.numpy().copy(), rng.uniform(0.1, 0.5, 6).astype(np.float32)
    dead = [1, 4]
    w[dead] = 0.0
    b[dead] = -1.0
    conv.weight, conv.bias = Parameter(w), Parameter(b)
    model = nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.Linear(6 * 5 * 5, 4, rng=1)).eval()
    x = rng.standard_normal((2, 1, 5, 5)).astype(np.float32)
    small = PR.prune_channels(model, 0, keep=4)
    assert small[0].out_channels == 4 and small[3].in_features == 4 * 25
    np.testing.assert_allclose(small(ml.tensor(x)).numpy(), model(ml.tensor(x)).numpy(),
                               rtol=1e-5, atol=1e-6)
    bn_model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1, rng=2), nn.BatchNorm2d(4), nn.ReLU(),
                             nn.Conv2d(4, 2, 3, padding=1, rng=3))
    pruned = PR.prune_channels(bn_model, 0, keep=0.5)
    assert pruned[1].num_features == 2 and pruned[3].in_channels == 2
    assert pruned(ml.tensor(x)).shape == (2, 2, 5, 5)


def test_pruning_keeps_a_dilated_conv_dilated_and_refuses_grouped_convs():
    """A dilated conv whose dead filters are removed computes the same outputs (a rebuilt layer
    that forgot its dilation would change every output); grouped convs are refused."""
    rng = np.random.default_rng(5)
    conv = nn.Conv2d(2, 4, 3, padding=2, dilation=2, rng=0)
    w, b = conv.weight.numpy().copy(), rng.uniform(0.1, 0.5, 4).astype(np.float32)
    w[2], b[2] = 0.0, -1.0
    conv.weight, conv.bias = Parameter(w), Parameter(b)
    model = nn.Sequential(conv, nn.ReLU(), nn.Conv2d(4, 3, 3, padding=1, rng=1))
    x = rng.standard_normal((2, 2, 7, 7)).astype(np.float32)
    small = PR.prune_channels(model, 0, keep=3)
    assert small[0].dilation == conv.dilation and small[2].in_channels == 3
    np.testing.assert_allclose(small(ml.tensor(x)).numpy(), model(ml.tensor(x)).numpy(),
                               rtol=1e-5, atol=1e-6)
    grouped = nn.Sequential(nn.Conv2d(4, 4, 3, groups=2, rng=2), nn.ReLU(),
                            nn.Conv2d(4, 2, 3, rng=3))
    with pytest.raises(ArgumentError, match="grouped"):
        PR.prune_channels(grouped, 0, keep=2)


# --- the CSR kernel ------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(m=st.integers(1, 12), k=st.integers(1, 12), n=st.integers(1, 9),
       density=st.sampled_from([0.0, 0.05, 0.3, 1.0]), seed=SEEDS,
       dtype=st.sampled_from([np.float32, np.float64]))
def test_csr_matmul_equals_dense_numpy(m, k, n, density, seed, dtype):
    a = PR.random_sparse((m, k), density, seed, dtype)
    b = np.random.default_rng(seed).standard_normal((k, n)).astype(dtype)
    csr = PR.CSRMatrix.from_dense(a)
    np.testing.assert_array_equal(csr.to_dense(), a)
    assert csr.nnz == np.count_nonzero(a) and csr.density == pytest.approx(csr.nnz / (m * k))
    assert csr.indptr[-1] == csr.nnz and np.all(np.diff(csr.indptr) >= 0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(PR.csr_matmul(csr, b), a @ b, rtol=tol, atol=tol)


def test_csr_refuses_bad_operands():
    csr = PR.CSRMatrix.from_dense(np.eye(3, dtype=np.float32))
    with pytest.raises(ShapeError):
        PR.csr_matmul(csr, np.ones((4, 2), np.float32))
    with pytest.raises(DTypeError):
        PR.csr_matmul(csr, np.ones((3, 2), np.float64))
    with pytest.raises(DTypeError):
        PR.csr_matmul(np.eye(3), np.ones((3, 2)))
    with pytest.raises(ShapeError):
        PR.CSRMatrix.from_dense(np.ones(3))
    assert csr.nbytes == 3 * 4 + 3 * 4 + 4 * 8


# --- distillation ------------------------------------------------------------------------------
def _log_softmax(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def _distill_np(s, y, t, tau, lam, squared):
    """L = H(o_S, y) + lam * [tau^2] * H(tau(o_S), tau(o_T)) and dL/ds, in float64."""
    b, c = s.shape
    hard = -_log_softmax(s)[np.arange(b), y].mean()
    p_t = np.exp(_log_softmax(t / tau))
    soft = -(p_t * _log_softmax(s / tau)).sum(1).mean()
    w = lam * (tau ** 2 if squared else 1.0)
    onehot = np.eye(c)[y]
    grad = (np.exp(_log_softmax(s)) - onehot) / b + w * (np.exp(_log_softmax(s / tau)) - p_t) \
        / (tau * b)
    return hard + w * soft, grad


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 6), c=st.integers(2, 6), tau=st.floats(0.5, 8), lam=st.floats(0, 3),
       squared=st.booleans(), seed=SEEDS)
def test_distillation_loss_and_gradient_match_the_formula(b, c, tau, lam, squared, seed):
    rng = np.random.default_rng(seed)
    s, t = rng.standard_normal((b, c)) * 3, rng.standard_normal((b, c)) * 3
    y = rng.integers(0, c, b)
    want, want_grad = _distill_np(s, y, t, tau, lam, squared)
    student = ml.tensor(s, requires_grad=True)
    loss = D.distillation_loss(student, y, t, tau, lam, squared)
    assert float(loss.numpy()) == pytest.approx(want, rel=1e-10, abs=1e-12)
    loss.backward()
    np.testing.assert_allclose(student.grad.numpy(), want_grad, rtol=1e-9, atol=1e-12)


def test_distillation_checks_its_arguments_and_soft_targets_sum_to_one():
    s = ml.tensor(np.zeros((2, 3)))
    with pytest.raises(ShapeError, match="one"):
        D.distillation_loss(s, [0, 1], np.zeros((2, 4)))
    with pytest.raises(ArgumentError, match="temperature"):
        D.distillation_loss(s, [0, 1], np.zeros((2, 3)), temperature=0.0)
    p = D.soft_targets(np.array([[1.0, 2.0, 3.0]]), 10.0).numpy()
    assert p.sum() == pytest.approx(1.0) and p.max() - p.min() < 0.25


def test_training_a_student_with_a_teacher_lowers_the_loss():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((96, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    teacher = _mlp((6, 16, 2), seed=1)
    D.train(teacher, ml.optim.Adam(teacher.parameters(), lr=0.05), x, y, epochs=15, batch=32)
    student = _mlp((6, 3, 2), seed=2)
    history = D.train(student, ml.optim.Adam(student.parameters(), lr=0.05), x, y, epochs=15,
                      batch=32, teacher=teacher, temperature=2.0, lam=0.5)
    assert history[-1] < history[0]
    assert D.accuracy(teacher, x, y) > 0.9 and D.accuracy(student, x, y) > 0.75


# --- obfuscation -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_obfuscated_model_gives_the_same_outputs(dtype, tol):
    model = _mlp((6, 9, 8, 4), seed=7, dtype=dtype)
    x = np.random.default_rng(0).standard_normal((20, 6)).astype(dtype)
    scrambled, key = O.obfuscate(model, seed=3)
    want, got = model(ml.tensor(x)).numpy(), scrambled(ml.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    np.testing.assert_array_equal(got.argmax(1), want.argmax(1))
    for old, new in zip(model.parameters(), scrambled.parameters()):
        if old.ndim == 2 and old.shape[1] != 4:  # every hidden layer's weights are scrambled
            assert not np.allclose(np.sort(np.abs(old.numpy()), None),
                                   np.sort(np.abs(new.numpy()), None))
    assert set(key.layers) == {0, 2}
    restored = O.deobfuscate(scrambled, key)
    for a, b in zip(model.parameters(), restored.parameters()):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert O.deobfuscate(scrambled, O.ObfuscationKey({})) is not None


def test_obfuscation_refuses_models_it_cannot_scramble():
    with pytest.raises(ArgumentError, match="Sequential"):
        O.obfuscate(nn.Linear(3, 2))
    with pytest.raises(ArgumentError, match="no two Linear"):
        O.obfuscate(nn.Sequential(nn.Linear(3, 2), nn.Tanh(), nn.Linear(2, 2)))
