"""Activation recomputation (issue 30): ``ml.recompute`` on the tape, ``recompute_pass`` on traced
training graphs, and the chain schedules (Chen's sqrt(n), the optimal DP against brute force).

Gradients are compared bit for bit (``np.array_equal`` on the raw arrays): recomputation runs the
same ops on the same arrays in the same order, dropout included.
"""

import gc
import math
import weakref

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mlsys_lab as ml
from mlsys_lab.engine.autodiff import tape_order
from mlsys_lab.engine.ops_nn import get_rng_state, manual_seed
from mlsys_lab.engine.passes import recompute as R

# --- helpers ----------------------------------------------------------------------------------


def _same(a, b):
    assert len(a) == len(b)
    for i, (u, v) in enumerate(zip(a, b)):
        if u is None or v is None:
            assert u is None and v is None, i
            continue
        u, v = np.asarray(u), np.asarray(v)
        assert u.dtype == v.dtype and u.shape == v.shape, i
        assert np.array_equal(u, v), f"gradient {i} differs: max |diff| {np.abs(u - v).max()}"


def _mlp_params(rng, widths, dtype=np.float32):
    return [(ml.tensor((rng.standard_normal((a, b)) / math.sqrt(a)).astype(dtype),
                       requires_grad=True),
             ml.tensor((rng.standard_normal(b) * 0.1).astype(dtype), requires_grad=True))
            for a, b in zip(widths[:-1], widths[1:])]


def _layer(h, w, b, p):
    return ml.ops.dropout(ml.ops.tanh(h @ w + b) if p is None else ml.ops.relu(h @ w + b),
                          0.0 if p is None else p)


def _block(h, params, p):
    for w, b in params:
        h = _layer(h, w, b, p)
    return h


def _tape_grads(params, x, loss_fn, seed=7):
    manual_seed(seed)
    for w, b in params:
        w.grad = b.grad = None
    x = ml.tensor(x, requires_grad=True)
    loss = loss_fn(x)
    loss.backward()
    grads = [t.grad for wb in params for t in wb]
    return [x.grad.numpy()] + [g if g is None else g.numpy() for g in grads], loss.item()


# --- the tape ----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_tape_random_mlp_bit_identical_with_dropout(seed):
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(3, 9))
    widths = [int(w) for w in rng.integers(3, 12, depth + 1)]
    params = _mlp_params(rng, widths)
    x = rng.standard_normal((int(rng.integers(1, 6)), widths[0])).astype(np.float32)
    cuts = sorted(set(int(c) for c in rng.integers(1, depth, 2))) + [depth]
    p = float(rng.uniform(0.1, 0.5))

    def plain(x):
        return (_block(x, params, p) ** 2).mean()

    def recomputed(x):
        h, start = x, 0
        for end in cuts:
            h = ml.recompute(_block, h, params[start:end], p)  # non-tensor args pass through
            start = end
        return (h ** 2).mean()

    ref, loss_ref = _tape_grads(params, x, plain)
    state_after_ref = get_rng_state()
    got, loss_got = _tape_grads(params, x, recomputed)
    assert loss_ref == loss_got
    _same(ref, got)
    # the replays restored the generator: the run leaves it where the plain run left it
    assert get_rng_state() == state_after_ref


def _attention_block(x, wq, wk, wv, wo, w1, w2, ln_w, p):
    """A transformer-ish block: pre-norm self-attention and MLP, residuals, dropout."""
    h = ml.ops.layer_norm(x, ln_w)
    q, k, v = h @ wq, h @ wk, h @ wv
    att = ml.ops.softmax(q @ k.transpose(0, 2, 1) * (1.0 / math.sqrt(q.shape[-1])), axis=-1)
    x = x + ml.ops.dropout(att @ v @ wo, p)
    h = ml.ops.layer_norm(x, ln_w)
    return x + ml.ops.dropout(ml.ops.relu(h @ w1) @ w2, p)


def _transformer_params(rng, dim=8, hidden=16):
    shapes = [(dim, dim)] * 4 + [(dim, hidden), (hidden, dim)]
    ws = [ml.tensor((rng.standard_normal(s) / math.sqrt(s[0])).astype(np.float32),
                    requires_grad=True) for s in shapes]
    return ws + [ml.tensor(np.ones(dim, np.float32) + 0.1, requires_grad=True)]


def test_tape_transformer_block_bit_identical_with_dropout():
    rng = np.random.default_rng(5)
    blocks = [_transformer_params(rng) for _ in range(3)]
    x0 = rng.standard_normal((2, 5, 8)).astype(np.float32)
    flat = [(t, None) for ps in blocks for t in ps]

    def run(rec):
        def loss(x):
            for ps in blocks:
                x = ml.recompute(_attention_block, x, *ps, 0.2) if rec else \
                    _attention_block(x, *ps, 0.2)
            return (x * x).mean()
        return _tape_grads([(t, t) for t, _ in flat], x0, loss, seed=11)

    ref, got = run(False), run(True)
    assert ref[1] == got[1]
    _same(ref[0], got[0])


def test_tape_nested_and_several_outputs():
    rng = np.random.default_rng(3)
    params = _mlp_params(rng, [6, 6, 6, 6])
    x0 = rng.standard_normal((4, 6)).astype(np.float32)

    def pair(h):  # two outputs, both used downstream
        u = _layer(h, *params[0], 0.3)
        return u, ml.ops.sigmoid(u @ params[1][0])

    def outer(h, rec):
        u, v = ml.recompute(pair, h) if rec else pair(h)
        return {"a": _layer(u * v, *params[2], 0.3), "b": v.sum()}

    def run(rec):
        def loss(x):
            out = ml.recompute(outer, x, rec) if rec else outer(x, rec)
            return (out["a"] ** 2).sum() + out["b"]
        return _tape_grads(params, x0, loss, seed=2)

    ref, got = run(False), run(True)
    assert ref[1] == got[1]
    _same(ref[0], got[0])


def test_tape_sums_each_use_in_the_tapes_order():
    """An input read twice inside the segment and again outside it (a residual), and one
    weight shared by every segment: the tape adds its gradient terms one at a time, in its
    own order, so the segment must hand back one term per use, not their sum (floating-point
    addition is not associative: (a + b) + c is not a + (b + c))."""
    rng = np.random.default_rng(9)
    w = ml.tensor((rng.standard_normal((16, 16)) / 4).astype(np.float32), requires_grad=True)
    x0 = rng.standard_normal((8, 16)).astype(np.float32)

    def seg(h):
        return ml.ops.tanh(h @ w) * h + ml.ops.sigmoid(h) @ w

    def run(rec):
        def loss(x):
            h = x
            for _ in range(4):
                h = h + (ml.recompute(seg, h) if rec else seg(h))
            return (h * h).sum()
        return _tape_grads([(w, w)], x0, loss)

    ref, got = run(False), run(True)
    _same(ref[0], got[0])


def test_tape_input_without_grad_captured_params_and_functional_api():
    """The first layer: data that does not require grad, parameters captured by the closure;
    and ``ml.grad`` over arguments the segment closes over."""
    rng = np.random.default_rng(4)
    params = _mlp_params(rng, [5, 7, 3])
    x0 = rng.standard_normal((6, 5)).astype(np.float32)
    outs = []
    for rec in (False, True):
        for w, b in params:
            w.grad = b.grad = None
        x = ml.tensor(x0)  # no grad
        y = ml.recompute(_block, x, params, None) if rec else _block(x, params, None)
        assert y.requires_grad
        (y * y).sum().backward()
        outs.append([t.grad.numpy() for wb in params for t in wb])
    _same(*outs)

    w0 = params[0][0].numpy()

    def f(w, x, rec):
        return (ml.recompute(lambda h: ml.ops.tanh(h @ w), x) if rec
                else ml.ops.tanh(x @ w)).sum()

    _same([ml.grad(f)(w0, x0, False)], [ml.grad(f)(w0, x0, True)])
    # nothing requires grad: nothing is recorded
    y = ml.recompute(lambda h: h * 2.0, ml.tensor(x0))
    assert not y.requires_grad and y._ctx is None


def test_tape_frees_the_segment_activations():
    rng = np.random.default_rng(0)
    params = _mlp_params(rng, [4] * 9)
    inner = []

    def block(h):
        for w, b in params:
            h = ml.ops.tanh(h @ w + b)
            inner.append(weakref.ref(h))
        return h

    x = ml.tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
    plain_nodes = len(tape_order([(block(x) ** 2).sum()]))
    inner.clear()
    loss = (ml.recompute(block, x) ** 2).sum()
    gc.collect()
    alive = [r() for r in inner[:-1]]  # the last one is the output
    assert all(a is None for a in alive), "an activation inside the segment is still alive"
    assert len(tape_order([loss])) < plain_nodes
    loss.backward()
    assert x.grad is not None


def test_tape_higher_order_and_forward_mode():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((4, 4))
    x0 = rng.standard_normal((3, 4))

    def f(x, rec):
        g = (lambda h: ml.ops.tanh(h @ ml.tensor(w)) * h)
        y = ml.recompute(g, x) if rec else g(x)
        return (ml.ops.sigmoid(y) * y).sum()

    for rec_pair in [(False, True)]:
        # reverse over reverse: the replay is a second copy of the forward ops in the recorded
        # first-order graph, so second-order sums group differently: equal to rounding only
        hess = [ml.grad(lambda x, r=r: ml.grad(lambda z: f(z, r))(x).sum())(x0).numpy()
                for r in rec_pair]
        np.testing.assert_allclose(hess[0], hess[1], rtol=1e-13, atol=1e-15)
        assert np.abs(hess[0]).max() > 0.1
        hv = [ml.hvp(lambda x, r=r: f(x, r), (x0,), (np.ones_like(x0),)) for r in rec_pair]
        _same([np.asarray(hv[0][0] if isinstance(hv[0], tuple) else hv[0])],
              [np.asarray(hv[1][0] if isinstance(hv[1], tuple) else hv[1])])
        jv = [ml.jvp(lambda x, r=r: f(x, r), (x0,), (np.ones_like(x0),))[1] for r in rec_pair]
        _same([jv[0]], [jv[1]])


def test_tape_float64_central_differences():
    rng = np.random.default_rng(8)
    w = rng.standard_normal((3, 3))
    x0 = rng.standard_normal((2, 3))

    def f(x):
        return (ml.recompute(lambda h: ml.ops.tanh(h @ ml.tensor(w)) * ml.ops.exp(h), x)
                ** 2).sum()

    g = ml.grad(f)(x0).numpy()
    eps = 1e-6
    num = np.zeros_like(x0)
    for i in np.ndindex(*x0.shape):
        d = np.zeros_like(x0)
        d[i] = eps
        num[i] = (f(ml.tensor(x0 + d)).item() - f(ml.tensor(x0 - d)).item()) / (2 * eps)
    np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-8)


def test_tape_errors_name_the_function():
    x = ml.tensor(np.ones((2, 2), np.float32), requires_grad=True)
    with pytest.raises(ml.DTypeError, match="recompute: fn must be callable, got int"):
        ml.recompute(3, x)

    def halves(h):
        return h * 0.5, "a string"

    with pytest.raises(ml.DTypeError, match="recompute: halves must return a Tensor.*got str"):
        ml.recompute(halves, x)
    with pytest.raises(ml.DTypeError, match="recompute: <lambda> .*got NoneType"):
        ml.recompute(lambda h: None, x)

    calls = []

    def moody(h):  # another op on the replay: a function that is not deterministic
        calls.append(1)
        return h * 2.0 if len(calls) == 1 else ml.ops.exp(h)

    y = ml.recompute(moody, x)
    with pytest.raises(ml.GraphError, match="recompute: replaying moody"):
        y.sum().backward()


# --- the graph pass ------------------------------------------------------------------------------
def _chain_graph(n=8, batch=32, dim=8, p=0.2, seed=0):
    rng = np.random.default_rng(seed)
    ws = [(rng.standard_normal((dim, dim)) / math.sqrt(dim)).astype(np.float32)
          for _ in range(n)]
    x = rng.standard_normal((batch, dim)).astype(np.float32)

    def loss(x, *ws):
        h = x
        for w in ws:
            h = ml.ops.dropout(ml.ops.relu(h @ w), p)
        return (h * h).mean()

    g = ml.grad_graph(ml.trace(loss, x, *ws), wrt=tuple(range(1, n + 1)))
    outs = [nd for nd in g.nodes if nd.op == "dropout" and nd.id in R.forward_nodes(g)]
    return g, [x, *ws], outs


def _run(g, args, seed=3):
    manual_seed(seed)
    return [o.numpy() for o in g(*args)]


@pytest.mark.parametrize("seed", [0, 1])
def test_graph_pass_bit_identical_random_mlp_with_dropout(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 10))
    g, args, layer_out = _chain_graph(n=n, batch=int(rng.integers(2, 9)),
                                      dim=int(rng.integers(2, 9)), seed=seed)
    ref = _run(g, args)
    saved = sorted(set(int(i) for i in rng.integers(0, n, 3)))
    for policy in ("nothing", [layer_out[i].id for i in saved],
                   [layer_out[i].outputs[0].name for i in saved],
                   lambda nd: nd.op == "matmul"):
        g2 = R.recompute_pass(g, policy).lint()
        assert any("recomputes" in nd.meta for nd in g2.nodes)
        _same(ref, _run(g2, args))
    assert [nd.op for nd in R.recompute_pass(g, "everything").nodes] == [nd.op for nd in g.nodes]
    assert g.lint() is g and not any("recomputes" in nd.meta for nd in g.nodes)  # not mutated


def test_graph_pass_transformer_block_bit_identical():
    rng = np.random.default_rng(2)
    ps = [t.numpy() for t in _transformer_params(rng)]
    x = rng.standard_normal((2, 4, 8)).astype(np.float32)

    def loss(x, *ps):
        return (_attention_block(_attention_block(x, *ps, 0.25), *ps, 0.25) ** 2).mean()

    g = ml.grad_graph(ml.trace(loss, x, *ps), wrt=tuple(range(1, 8)))
    adds = [nd.id for nd in g.nodes if nd.op == "add" and nd.id in R.forward_nodes(g)]
    g2 = R.recompute_pass(g, adds[1::2]).lint()  # the residual sums as checkpoints
    ref = _run(g, [x, *ps])
    _same(ref, _run(g2, [x, *ps]))
    assert R.peak_memory(g2)[0] < R.peak_memory(g)[0]


def test_graph_pass_peak_lower_by_the_freed_segments():
    """sqrt(n) checkpoints on a 16-layer chain: the planner's peak drops by at least the
    dropped activations of every segment but the largest (the one being recomputed at the
    peak), and stays within 2 sqrt(n) layers' worth plus one segment."""
    n = 16
    g, args, layer_out = _chain_graph(n=n, batch=64, dim=16)
    sched = R.sqrt_schedule(n)
    g2 = R.recompute_pass(g, [layer_out[i].id for i in sched.saved])
    acts = R.saved_activations(g)
    kept = {layer_out[i].outputs[0] for i in sched.saved}
    layer_of = {}
    layer = 0
    for nd in g.nodes:  # forward nodes in order: a layer ends at its dropout
        if nd.id in R.forward_nodes(g):
            layer_of[nd.outputs[0]] = layer
            layer += nd in layer_out
    seg_of = {v: next(k for k, c in enumerate(sched.saved) if layer_of[v] <= c) for v in acts}
    dropped = [v for v in acts if v not in kept and v.producer.op != "rng_seed"]
    per_segment = {}
    for v in dropped:
        per_segment[seg_of[v]] = per_segment.get(seg_of[v], 0) + v.nbytes
    freed = sum(per_segment.values()) - max(per_segment.values())
    (before, arena_before), (after, arena_after) = R.peak_memory(g), R.peak_memory(g2)
    assert before - after >= freed > 0
    assert arena_after <= arena_before - freed
    layer_bytes = sum(v.nbytes for v in acts) / n
    seg = math.ceil(math.sqrt(n))
    act_peak, _ = R.peak_memory(g2, outputs=False)
    assert act_peak <= (2 * math.sqrt(n) + seg) * layer_bytes
    _same(_run(g, args), _run(g2, args))


def test_graph_pass_policy_errors():
    g, _, _ = _chain_graph(n=2, batch=2, dim=2)
    with pytest.raises(ml.DTypeError, match="recompute_pass: policy must be"):
        R.recompute_pass(g, 3.5)
    with pytest.raises(ml.ArgumentError, match="recompute_pass: the policy names 'nope'"):
        R.recompute_pass(g, ["nope"])
    with pytest.raises(ml.DTypeError, match="a policy entry must be"):
        R.recompute_pass(g, [True])


# --- schedules ---------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 20), min_size=n, max_size=n),
    st.lists(st.integers(0, 20), min_size=n, max_size=n),
    st.integers(0, 150))))
def test_optimal_schedule_equals_brute_force(case):
    sizes, costs, budget = case
    brute = R.exhaustive_schedule(sizes, costs, budget)
    if brute is None:
        with pytest.raises(ml.OutOfMemoryError, match="optimal_schedule: no schedule"):
            R.optimal_schedule(sizes, costs, budget)
        return
    dp = R.optimal_schedule(sizes, costs, budget)
    assert dp.cost == brute.cost
    assert dp.peak <= budget and dp.peak == R.chain_peak(sizes, dp.saved)
    assert dp.saved[-1] == len(sizes) - 1


def test_optimal_schedule_float_costs_and_sqrt_comparison():
    rng = np.random.default_rng(0)
    sizes, costs = rng.uniform(1, 3, 12), rng.uniform(0.5, 2, 12)
    for budget in (14.0, 16.0, 20.0, 40.0):
        dp, brute = (R.optimal_schedule(sizes, costs, budget),
                     R.exhaustive_schedule(sizes, costs, budget))
        assert math.isclose(dp.cost, brute.cost, rel_tol=1e-12) and dp.peak <= budget
    assert R.exhaustive_schedule(sizes, costs, 8.0) is None
    n = 64
    chen = R.sqrt_schedule(n)
    best = R.optimal_schedule([1] * n, [1] * n, chen.peak)
    assert best.cost <= chen.cost and best.peak <= chen.peak
    assert R.optimal_schedule([1] * n, [1] * n, n).cost == 0  # room for everything


@pytest.mark.parametrize("n", [1, 2, 5, 16, 17, 64, 100])
def test_sqrt_schedule_peak_bound(n):
    s = R.sqrt_schedule(n)
    k = math.ceil(math.sqrt(n))
    assert s.peak <= 2 * math.sqrt(n) + 1
    assert s.peak <= math.ceil(n / k) + k - 1
    assert s.cost == n - len(s.saved)
    assert s.saved[-1] == n - 1


def test_schedule_argument_errors():
    with pytest.raises(ml.ArgumentError, match="sqrt_schedule: n must be a positive int"):
        R.sqrt_schedule(0)
    with pytest.raises(ml.ArgumentError, match="optimal_schedule: 3 sizes but 2 costs"):
        R.optimal_schedule([1, 2, 3], [1, 1], 10)
    with pytest.raises(ml.ArgumentError, match="chain_peak: sizes and costs must be finite"):
        R.chain_peak([1, -1], [1])
