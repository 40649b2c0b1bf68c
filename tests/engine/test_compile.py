"""ml.compile: operator selection, arena execution, compiled training steps."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import nn, ops
from mlsys_lab.engine import memory
from mlsys_lab.engine.compiler import Compiled
from mlsys_lab.engine.selection import select
from mlsys_lab.nn.train_step import compile_train_step

RNG = np.random.default_rng(0)
F32 = np.float32


def _mlp_fn():
    w1 = RNG.standard_normal((8, 16)).astype(F32)
    w2 = RNG.standard_normal((16, 3)).astype(F32)

    def f(x, y):
        h = ops.relu(x @ w1) * 2.0 + 1.0
        z = ops.concatenate([ops.tanh(h), ops.sigmoid(h)], axis=1)
        return ops.cross_entropy(z[:, :16] @ w2 + ops.reshape(z[:, 16:].sum(axis=1), (-1, 1)),
                                 y)
    return f


@pytest.mark.parametrize("strategy", ["naive", "first_fit", "greedy_by_size", "two_cursor",
                                      "best"])
def test_compiled_matches_interpreter(strategy):
    f = _mlp_fn()
    x = RNG.standard_normal((5, 8)).astype(F32)
    y = np.array([0, 1, 2, 1, 0])
    c = Compiled(f, x, y, passes=None, strategy=strategy)
    want = float(ml.trace(f, x, y)(x, y))
    for _ in range(2):  # the arena is reused across calls
        assert float(c(x, y)) == pytest.approx(want, rel=1e-6)
    c.timeline.check_dependencies(c.graph)
    assert c.plan.arena_size >= memory.lower_bound(c.lifetimes, 64, inplace=c.plan.inplace)


def test_a_planner_bug_shows_up_as_a_wrong_result():
    f = _mlp_fn()
    x = RNG.standard_normal((5, 8)).astype(F32)
    y = np.array([0, 1, 2, 1, 0])
    c = Compiled(f, x, y, passes=None, inplace=False)
    good = float(c(x, y))
    # Put every intermediate at offset 0: live tensors now overlap.
    c.plan.offsets.update({k: 0 for k in c.plan.offsets})
    with pytest.raises(ml.GraphError, match="overlap"):
        memory.verify(c.plan, c.lifetimes)
    c._build()
    assert float(c(x, y)) != pytest.approx(good, rel=1e-3)


def _assert_compiled_step_matches_sgd(build, x, y, lr, steps, loss_rel, rtol, atol,
                                      **options):
    """Train two copies of a model, one compiled and one eager with SGD: losses and
    parameters agree step by step."""
    a, b = build(), build()
    step = compile_train_step(a, ops.cross_entropy, x, y, lr=lr, **options)
    opt = ml.optim.SGD(b.parameters(), lr=lr)
    for _ in range(steps):
        l1 = step(x, y)
        loss = ops.cross_entropy(b(ml.tensor(x)), ml.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert l1 == pytest.approx(loss.item(), rel=loss_rel)
    for p, q in zip(a.parameters(), b.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=rtol, atol=atol)


def test_compiled_training_step_equals_eager_sgd():
    x = RNG.standard_normal((32, 10)).astype(F32)
    y = RNG.integers(0, 4, 32)

    def make():
        return nn.Sequential(nn.Linear(10, 12, rng=0), nn.ReLU(), nn.Linear(12, 4, rng=1))

    _assert_compiled_step_matches_sgd(make, x, y, lr=0.1, steps=4, loss_rel=1e-6, rtol=1e-5,
                                      atol=1e-6, passes=None)


def test_selection_falls_back_and_lowers_precision_as_documented():
    def f(x, w, v):
        return ops.relu(x @ w) + ops.tanh(v)

    a = RNG.standard_normal((4, 4)).astype(F32)
    g = select(ml.trace(f, a, a, a), "npu").lint()
    choices = {n.op: n.meta["choice"] for n in g.nodes if n.op in ("matmul", "tanh")}
    assert choices["matmul"].device == "npu" and "float16" in choices["matmul"].reason
    assert choices["tanh"].device == "cpu" and "fell back to cpu" in choices["tanh"].reason
    assert any(n.op == "copy" for n in g.nodes)
    np.testing.assert_allclose(g(a, a, a).numpy(), f(*map(ml.tensor, (a, a, a))).numpy(),
                               rtol=2e-2, atol=2e-2)
    big = [a] * 100
    g2 = select(ml.trace(lambda *xs: ops.concatenate(list(xs), axis=0), *big), "npu")
    (cat,) = [n for n in g2.nodes if n.op == "concatenate"]
    assert cat.meta["choice"].device == "cpu" and "100 inputs > limit 63" in \
        cat.meta["choice"].reason


def test_compile_on_npu_runs_and_explains():
    def f(x, w):
        return ops.relu(x @ w)

    a = RNG.standard_normal((4, 4)).astype(F32)
    c = Compiled(f, a, a, passes=None, device="npu")
    np.testing.assert_allclose(c(a, a), np.maximum(a @ a, 0), rtol=2e-2, atol=2e-2)
    text = c.explain()
    assert "npu.matmul_fp16" in text and "memory plan" in text


@pytest.mark.parametrize("seed", range(40))
def test_compiled_equals_interpreter_on_random_graphs(seed):
    from mlsys_lab.engine.random_graphs import random_graph

    graph, args = random_graph(seed, n_nodes=14)

    def f(*xs):
        return graph(*xs)

    want = graph(*args)
    want = want if isinstance(want, tuple) else (want,)
    c = Compiled(f, *args, strategy="best")
    for profile in (True, False):  # node-by-node interpreter and generated straight-line code
        got = c(*args, profile=profile)
        got = got if isinstance(got, tuple) else (got,)
        for w, g in zip(want, got):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-5, atol=1e-5)
    assert c.code.startswith("def run(env):") and c.code.count("  # #") == len(c.graph.nodes)


@pytest.mark.parametrize("make", ["resnet", "transformer"])
def test_compiled_training_steps_of_real_models(make):
    from mlsys_lab.nn import zoo

    rng = np.random.default_rng(3)
    if make == "resnet":
        build = lambda: zoo.resnet_cnn(channels=4, blocks=1, image=6)  # noqa: E731
        x = rng.standard_normal((3, 1, 6, 6)).astype(F32)
    else:
        build = lambda: zoo.TransformerClassifier(dim=8, heads=2, hidden=16)  # noqa: E731
        x = rng.standard_normal((2, 5, 8)).astype(F32)
    y = rng.integers(0, 10, x.shape[0])
    _assert_compiled_step_matches_sgd(build, x, y, lr=0.05, steps=3, loss_rel=1e-4, rtol=1e-4,
                                      atol=1e-5)


@pytest.mark.parametrize("device, kernel", [("cpu-numba", "numba.matmul_packed"),
                                            ("cuda", "cuda.matmul_double_buffer")])
def test_selection_picks_the_registered_numba_kernels(device, kernel):
    a = RNG.standard_normal((37, 29)).astype(F32)
    b = RNG.standard_normal((29, 53)).astype(F32)
    c = Compiled(lambda x, y: ops.relu(x @ y), a, b, passes=None, device=device)
    (mm,) = [n for n in c.graph.nodes if n.op == "matmul"]
    assert mm.meta["choice"].kernel == kernel and mm.meta["device"] == device
    np.testing.assert_allclose(c(a, b), np.maximum(a @ b, 0), rtol=1e-4, atol=1e-4)
    copies = [n for n in c.graph.nodes if n.op == "copy"]
    assert (len(copies) > 0) == (device == "cuda")  # host and cpu-numba share memory
