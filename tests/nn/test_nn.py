"""Layers, optimisers and checkpoints."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn, ops


def _data(n=128, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 6)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int64)
    return x, y


def _mlp(seed=0):
    return nn.Sequential(nn.Linear(6, 16, rng=seed), nn.ReLU(), nn.Linear(16, 2, rng=seed + 1))


@pytest.mark.parametrize("make_opt", [
    lambda p: ml.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
    lambda p: ml.optim.Adam(p, lr=0.01),
    lambda p: ml.optim.RMSProp(p, lr=0.005),
])
def test_small_model_trains_and_loss_falls(make_opt):
    x, y = _data()
    model = _mlp()
    opt = make_opt(model.parameters())
    losses = []
    for _ in range(60):
        loss = ops.cross_entropy(model(ml.tensor(x)), ml.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


def test_sgd_matches_the_update_formula():
    p = nn.Parameter(np.array([1.0, -2.0], np.float32))
    opt = ml.optim.SGD([p], lr=0.1, momentum=0.5)
    for _ in range(2):
        p.grad = ml.tensor(np.array([1.0, 1.0], np.float32))
        opt.step()
    # buf1 = g, p1 = p0 - lr*g; buf2 = 0.5*g + g, p2 = p1 - lr*1.5*g
    np.testing.assert_allclose(p.numpy(), [1.0 - 0.1 - 0.15, -2.0 - 0.1 - 0.15], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_sgd_dense_update_is_numpys_bit_for_bit(dtype):
    # the fused in-place loop (kernels/optim.py) against numpy's p - dtype(lr) * g, over
    # magnitudes from tiny to huge and the special values (a fused multiply-add, or lr kept in
    # float64, would round differently); float16 and a strided gradient take the numpy path
    from mlsys_lab.kernels.optim import sgd_dense

    rng = np.random.default_rng(7)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 1.0, -3e38])
    for n in (1, 7, 1000):
        with np.errstate(all="ignore"):  # overflow to inf is part of what is compared
            p = (rng.standard_normal(n) * 10.0 ** rng.uniform(-20, 20, n)).astype(dtype)
            g = (rng.standard_normal(n) * 10.0 ** rng.uniform(-20, 20, n)).astype(dtype)
            p[rng.integers(0, n, 3)] = rng.choice(special, 3)
            g[rng.integers(0, n, 3)] = rng.choice(special, 3)
        for lr in (1e-3, 0.3333, 7.0):
            with np.errstate(all="ignore"):
                want = p - np.asarray(lr, dtype) * g
                got = sgd_dense(p.copy(), g, lr)
            assert got.dtype == dtype
            np.testing.assert_array_equal(got.view(f"u{got.itemsize}"),
                                          want.view(f"u{want.itemsize}"))
    p2, g2 = rng.standard_normal((4, 6)), rng.standard_normal((6, 4)).T  # g2 not contiguous
    want = p2 - 0.1 * g2
    np.testing.assert_array_equal(sgd_dense(p2, g2, 0.1), want)


def _special_arrays(rng, n, dtype, nonneg=False):
    """Values from tiny to huge, with 0, -0, +-inf, NaN, denormals and the dtype's extremes."""
    info = np.finfo(dtype)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(info.smallest_subnormal),
                        -float(info.smallest_subnormal), float(info.tiny) / 3, 1.0,
                        float(info.max), -float(info.max)])
    with np.errstate(all="ignore"):
        a = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)).astype(dtype)
        a[rng.integers(0, n, max(3, n // 8))] = rng.choice(special, max(3, n // 8))
    return np.abs(a) if nonneg else a


def _bits(a):
    return a.view(f"u{a.itemsize}")


_FUSED = {  # name: (fused, reference, state arrays (non-negative?), hyper-parameter sets)
    "adam": ("adam_dense", "adam_dense_reference", (False, True),
             [dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, t=1),
              dict(lr=0.3333, beta1=0.5, beta2=0.75, eps=1e-3, weight_decay=0.01, t=7),
              dict(lr=7.0, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=0.0, t=3)]),
    "rmsprop": ("rmsprop_dense", "rmsprop_dense_reference", (True,),
                [dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0),
                 dict(lr=0.3333, alpha=0.5, eps=1e-3, weight_decay=0.01),
                 dict(lr=7.0, alpha=0.0, eps=0.0, weight_decay=0.0)]),
    "adagrad": ("adagrad_dense", "adagrad_dense_reference", (True,),
                [dict(lr=1e-2, eps=1e-10, weight_decay=0.0),
                 dict(lr=0.3333, eps=1e-3, weight_decay=0.01),
                 dict(lr=7.0, eps=0.0, weight_decay=0.0)]),
}


@pytest.mark.parametrize("name", sorted(_FUSED))
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_fused_dense_updates_are_numpys_bit_for_bit(name, dtype):
    """Adam, RMSProp and Adagrad's fused in-place loops (kernels/optim.py) leave the parameter
    and every state array bit-identical to the numpy formula they replace, NaN payloads and
    signed zeros included, over magnitudes from denormal to overflow, with and without
    weight decay; float16 and strided arrays take the numpy path. A fused multiply-add, a
    hyper-parameter kept in float64, or Adam's float64 step rounded differently would show."""
    from mlsys_lab.kernels import optim as K

    fused, reference, state_kinds, hypers = _FUSED[name]
    fused, reference = getattr(K, fused), getattr(K, reference)
    rng = np.random.default_rng(11)
    for n in (1, 9, 2000):
        p, g = _special_arrays(rng, n, dtype), _special_arrays(rng, n, dtype)
        states = [_special_arrays(rng, n, dtype, nonneg) for nonneg in state_kinds]
        for hyper in hypers:
            runs = []
            for fn in (fused, reference):
                arrays = [p.copy(), g.copy(), *(s.copy() for s in states)]
                with np.errstate(all="ignore"):
                    out = fn(*arrays, **hyper)
                assert out is arrays[0] and out.dtype == dtype
                runs.append(arrays)
            for got, want in zip(*runs):
                np.testing.assert_array_equal(_bits(got), _bits(want))
            if n > 1:
                assert not np.array_equal(_bits(runs[0][0]), _bits(p))  # it did update
    p2, g2 = rng.standard_normal((4, 6)), rng.standard_normal((6, 4)).T  # g2 not contiguous
    states = [np.abs(rng.standard_normal((4, 6))) for _ in state_kinds]
    want = reference(p2.copy(), g2, *(s.copy() for s in states), **hypers[1])
    np.testing.assert_array_equal(fused(p2, g2, *states, **hypers[1]), want)


@pytest.mark.parametrize("opt_cls,hyper", [
    (ml.optim.Adam, dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    (ml.optim.RMSProp, dict(lr=0.05, alpha=0.9, eps=1e-6, weight_decay=0.1)),
    (ml.optim.Adagrad, dict(lr=0.05, lr_decay=0.1, eps=1e-6, weight_decay=0.1))])
def test_dense_optimisers_step_as_their_numpy_formula(opt_cls, hyper):
    """Three steps of the optimiser (fused) equal the numpy formula applied by hand, bit for
    bit, with NumPy-scalar hyper-parameters too (they are taken as Python floats)."""
    from mlsys_lab.kernels import optim as K

    rng = np.random.default_rng(2)
    w0 = rng.standard_normal((5, 3)).astype(np.float32)
    grads = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(3)]
    numpy_hyper = {k: (tuple(np.float64(b) for b in v) if k == "betas" else np.float64(v))
                   for k, v in hyper.items()}
    for h in (hyper, numpy_hyper):
        p = ml.nn.Parameter(w0.copy())
        opt = opt_cls([p], **h)
        ref, st = w0.copy(), {k: np.zeros_like(w0) for k in opt.state_names}
        for t, g in enumerate(grads, start=1):
            p.grad = ml.tensor(g)
            opt.step()
            wd, eps, lr = hyper["weight_decay"], hyper["eps"], hyper["lr"]
            if opt_cls is ml.optim.Adam:
                K.adam_dense_reference(ref, g, st["m"], st["v"], lr, *hyper["betas"], eps, wd, t)
            elif opt_cls is ml.optim.RMSProp:
                K.rmsprop_dense_reference(ref, g, st["square_avg"], lr, hyper["alpha"], eps, wd)
            else:
                K.adagrad_dense_reference(ref, g, st["sum"], lr / (1 + (t - 1) * 0.1), eps, wd)
            np.testing.assert_array_equal(p.numpy(), ref)
            for k in opt.state_names:
                np.testing.assert_array_equal(opt.state[0][k], st[k])

@pytest.mark.parametrize("opt_cls", [ml.optim.SGD, ml.optim.Adam, ml.optim.RMSProp,
                                     ml.optim.Adagrad])
def test_dense_steps_allocate_no_parameter_sized_temporary(opt_cls):
    """The fused updates work in place: a step on a 4 MB parameter allocates well under one
    parameter's size (numpy's formulas built 4 to 8 temporaries of 4 MB each), and the
    parameter keeps its buffer."""
    import tracemalloc

    p = ml.nn.Parameter(np.ones(10 ** 6, np.float32))
    p.grad = ml.tensor(np.full(10 ** 6, 0.5, np.float32))
    # SGD's weight decay (and momentum) still go through numpy: plain SGD is the fused one
    opt = opt_cls([p], lr=0.1, weight_decay=0.0 if opt_cls is ml.optim.SGD else 0.01)
    opt.step()  # compiles the kernel outside the measurement
    buffer = p.data
    tracemalloc.start()
    try:
        opt.step()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p.data is buffer and peak < p.data.nbytes // 4, f"peak {peak} bytes"

def test_module_structure_and_modes():
    m = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, rng=0), nn.BatchNorm2d(2), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.5), nn.Linear(8, 3, rng=1))
    names = [n for n, _ in m.named_parameters()]
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "6.weight", "6.bias"]
    assert set(m.state_dict()) == set(names) | {"1.running_mean", "1.running_var"}
    x = ml.tensor(np.random.default_rng(0).standard_normal((4, 1, 4, 4)).astype(np.float32))
    m.train()
    m(x).sum().backward()
    assert all(p.grad is not None for p in m.parameters())
    m.eval()
    np.testing.assert_array_equal(m(x).numpy(), m(x).numpy())  # eval: deterministic
    assert not m[5].training


def test_checkpoint_round_trip_is_exact(tmp_path):
    x, y = _data()
    model = _mlp()
    opt = ml.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(3):
        loss = ops.cross_entropy(model(ml.tensor(x)), ml.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path / "ckpt.npz"
    ml.save({"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3,
             "note": "hello"}, path)
    ck = ml.load(path)
    assert ck["epoch"] == 3 and ck["note"] == "hello"
    other = _mlp(seed=5)
    other.load_state_dict(ck["model"])
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), other.named_parameters()):
        assert n1 == n2 and np.array_equal(p1.numpy(), p2.numpy())
    opt2 = ml.optim.Adam(other.parameters(), lr=0.01)
    opt2.load_state_dict(ck["optim"])
    for m in (model, other):  # identical next step from identical state
        loss = ops.cross_entropy(m(ml.tensor(x)), ml.tensor(y))
        m.zero_grad()
        loss.backward()
    opt.step()
    opt2.step()
    for p1, p2 in zip(model.parameters(), other.parameters()):
        np.testing.assert_array_equal(p1.numpy(), p2.numpy())
    with open(path, "rb") as f:
        assert b"pickle" not in f.read()


def test_truncated_and_corrupted_checkpoints_fail_cleanly(tmp_path):
    model = _mlp()
    path = tmp_path / "c.npz"
    ml.save(model.state_dict(), path)
    blob = path.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(blob[: len(blob) // 2])
    bad = bytearray(blob)
    mid = len(bad) // 2
    bad[mid:mid + 64] = bytes(64)
    (tmp_path / "corrupt.npz").write_bytes(bytes(bad))
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    for name in ("trunc.npz", "corrupt.npz", "junk.npz"):
        with pytest.raises(ml.CheckpointError, match="truncated or corrupted|not an mlsys_lab"):
            ml.load(tmp_path / name)
    with pytest.raises(ml.CheckpointError, match="no checkpoint"):
        ml.load(tmp_path / "missing.npz")


def test_bad_state_dict_leaves_model_untouched():
    model = _mlp()
    before = {k: v.copy() for k, v in model.state_dict().items()}
    sd = {k: v + 1 for k, v in before.items()}
    sd["2.weight"] = np.zeros((3, 3), np.float32)  # mis-shaped, after other keys
    with pytest.raises(ml.CheckpointError, match=r"2\.weight.*\(3, 3\).*\(16, 2\)"):
        model.load_state_dict(sd)
    del sd["2.weight"]
    with pytest.raises(ml.CheckpointError, match="missing keys.*2.weight"):
        model.load_state_dict(sd)
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_partial_loading_for_warm_start():
    src, dst = _mlp(seed=0), _mlp(seed=9)
    part = {k: v for k, v in src.state_dict().items() if k.startswith("0.")}
    missing, unexpected = dst.load_state_dict(part, strict=False)
    assert missing == ["2.weight", "2.bias"] and unexpected == []
    np.testing.assert_array_equal(dst[0].weight.numpy(), src[0].weight.numpy())
    assert not np.array_equal(dst[2].weight.numpy(), src[2].weight.numpy())


def test_save_refuses_objects_that_would_need_pickle(tmp_path):
    with pytest.raises(ml.CheckpointError, match="cannot store"):
        ml.save({"f": lambda: 1}, tmp_path / "x.npz")
    with pytest.raises(ml.CheckpointError, match="object array"):
        ml.save({"o": np.array([{}], dtype=object)}, tmp_path / "x.npz")


def test_embedding_and_layernorm_layers():
    emb = nn.Embedding(5, 3, rng=0)
    ids = ml.tensor(np.array([[0, 4], [4, 4]]))
    out = emb(ids)
    np.testing.assert_array_equal(out.numpy()[1, 0], emb.weight.numpy()[4])
    out.sum().backward()
    counts = np.bincount([0, 4, 4, 4], minlength=5)[:, None] * np.ones((1, 3))
    np.testing.assert_array_equal(emb.weight.grad.numpy(), counts)  # duplicates accumulate
    ln = nn.LayerNorm(4)
    x = ml.tensor(np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    y = ln(x).numpy()
    np.testing.assert_allclose(y.mean(axis=1), 0, atol=1e-6)
    np.testing.assert_allclose(y.std(axis=1), 1, atol=1e-3)


def test_checkpoint_keeps_ints_past_int64_and_generator_states(tmp_path):
    """A PCG64 state holds 128-bit ints: they come back exactly, as ints, and so does the
    dropout generator's state (a wrong round trip would give different masks after resuming)."""
    gen = np.random.default_rng(2**100)
    path = tmp_path / "rng.npz"
    ml.ops.manual_seed(3)
    ml.save({"gen": gen.bit_generator.state, "big": -(2**70), "drop": ml.ops.get_rng_state()},
            path)
    expected = [ml.ops.rng_seed() for _ in range(3)]
    back = ml.load(path)
    assert back["gen"] == gen.bit_generator.state and back["big"] == -(2**70)
    assert isinstance(back["gen"]["state"]["state"], int)
    ml.ops.set_rng_state(back["drop"])
    assert [ml.ops.rng_seed() for _ in range(3)] == expected
    with pytest.raises(ml.ArgumentError, match="PCG64"):
        ml.ops.set_rng_state({"bit_generator": "MT19937"})


# --- Conv2d with dilation and groups ----------------------------------------------------------
@pytest.mark.parametrize("c_in, c_out, k, stride, padding, dilation, groups", [
    (4, 6, 3, 1, 2, 2, 2),          # dilated, two groups
    (3, 3, 3, 1, 1, 1, 3),          # depthwise
    (6, 4, (3, 2), 2, (1, 0), (2, 1), 2),  # rectangular kernel, strided, mixed dilation
])
def test_conv2d_layer_dilation_and_groups_match_the_reference(c_in, c_out, k, stride, padding,
                                                              dilation, groups):
    """The layer's forward pass and both gradients against the brute-force float64 window
    loops of tests/conformance.py (an oracle independent of the library's img2col)."""
    from ..conformance import conv2d_grad_input_ref, conv2d_grad_weight_ref, conv2d_ref

    layer = nn.Conv2d(c_in, c_out, k, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, rng=3)
    kk = (k, k) if np.isscalar(k) else k
    assert layer.weight.shape == (c_out, c_in // groups) + kk
    layer.bias.data = np.random.default_rng(1).standard_normal(c_out).astype(np.float32)
    rng = np.random.default_rng(2)
    x = ml.tensor(rng.standard_normal((2, c_in, 9, 8)).astype(np.float32), requires_grad=True)
    y = layer(x)
    pair = (lambda v: (v, v) if np.isscalar(v) else tuple(v))
    attrs = dict(stride=pair(stride), padding=pair(padding), dilation=pair(dilation),
                 groups=groups)
    want = conv2d_ref(x.numpy(), layer.weight.numpy(), **attrs) \
        + layer.bias.numpy()[None, :, None, None]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-4)
    g = rng.standard_normal(y.shape).astype(np.float32)
    (y * ml.tensor(g)).sum().backward()
    np.testing.assert_allclose(
        layer.weight.grad.numpy(),
        conv2d_grad_weight_ref(x.numpy(), g, layer.weight.shape, **attrs), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(
        x.grad.numpy(), conv2d_grad_input_ref(g, layer.weight.numpy(), x.shape, **attrs),
        rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.bias.grad.numpy(), g.sum(axis=(0, 2, 3)), rtol=1e-4)
    r = repr(layer)
    assert ("groups=" in r) == (groups != 1) and ("dilation=" in r) == (dilation != 1)


def test_conv2d_layer_refuses_channels_that_do_not_split_into_groups():
    with pytest.raises(ml.ShapeError, match="divisible by groups"):
        nn.Conv2d(4, 6, 3, groups=4)
    with pytest.raises(ml.ShapeError, match="groups"):
        nn.Conv2d(4, 4, 3, groups=0)


# --- a replaced child keeps its place in a Sequential (the passes that swap layers depend on
# the order) --------------------------------------------------------------------------------


def _model():
    return nn.Sequential(nn.Linear(4, 5, rng=0), nn.ReLU(), nn.Linear(5, 3, rng=1))


def test_replacing_a_child_keeps_its_position_in_a_sequential():
    model = _model()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    setattr(model, "1", nn.Tanh())
    assert list(dict(model.named_children())) == ["0", "1", "2"]
    assert [type(m).__name__ for m in model] == ["Linear", "Tanh", "Linear"]
    want = model[2](ml.tensor(np.tanh(model[0](ml.tensor(x)).numpy()))).numpy()
    np.testing.assert_allclose(model(ml.tensor(x)).numpy(), want, rtol=1e-6)
    assert list(model.state_dict()) == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_replacing_a_parameter_keeps_the_state_dict_order():
    lin = nn.Linear(3, 2, rng=0)
    names = list(lin.state_dict())
    lin.weight = ml.nn.Parameter(np.zeros((2, 3), np.float32))
    assert list(lin.state_dict()) == names
    assert np.all(lin.state_dict()["weight"] == 0)


def test_a_child_replaced_by_a_plain_value_leaves_the_registry():
    model = _model()
    object_count = len(model._modules)
    model.__setattr__("1", 7)
    assert "1" not in dict(model.named_children()) and len(model._modules) == object_count - 1
