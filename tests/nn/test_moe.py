"""nn.MoE: GShard top-k routing with capacity (first choices before second choices), dropped
tokens add nothing, the combine weights, Switch's load-balancing loss, groups, and gradients
of the gate and the experts against float64 central differences."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.nn.moe import capacity, route_top_k


def moe(k=2, c=1.0, experts=4, d=5, hidden=7, groups=1, seed=0, **kw):
    return ml.nn.MoE(d, hidden, experts, k=k, capacity_factor=c, groups=groups, rng=seed,
                     dtype="float64", **kw)


def reference(m, x):
    """Token by token, straight from the definition (numpy only)."""
    wg = m.gate.weight.numpy()
    logits = x @ wg
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    r = m.routing
    out = np.zeros_like(x)
    for t in range(len(x)):
        chosen = p[t, r.expert[t]]
        w = chosen / chosen.sum() if m.normalize else chosen
        for j, e in enumerate(r.expert[t]):
            if r.slot[t, j] < 0:
                continue
            fc1, _, fc2 = m.experts[e]
            h = np.maximum(x[t] @ fc1.weight.numpy() + fc1.bias.numpy(), 0)
            out[t] += w[j] * (h @ fc2.weight.numpy() + fc2.bias.numpy())
    return out, p


def test_first_choices_claim_capacity_before_any_second_choice():
    # token 0 prefers expert 0 then 1; tokens 1 and 2 prefer expert 1 first. Capacity 2:
    # token-order filling (token 0's second choice before token 2's first) would drop token
    # 2's first choice; GShard's order keeps both first choices and drops token 0's second.
    probs = np.array([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.8, 0.1]])
    expert, slot = route_top_k(probs, 2, 2)
    np.testing.assert_array_equal(expert, [[0, 1], [1, 0], [1, 0]])
    np.testing.assert_array_equal(slot, [[0, -1], [0, 1], [1, -1]])
    # ties go to the lower expert index; capacity 1 keeps only the first in token order
    expert, slot = route_top_k(np.full((3, 2), 0.5), 1, 1)
    np.testing.assert_array_equal(expert[:, 0], [0, 0, 0])
    np.testing.assert_array_equal(slot[:, 0], [0, -1, -1])


def test_capacity_formula():
    assert capacity(10, 4, 2, 1.0) == 5          # ceil(1 * 2 * 10 / 4)
    assert capacity(16, 4, 1, 1.25) == 5         # ceil(1.25 * 16 / 4)
    assert capacity(12, 4, 1, 1.0) == 3          # exactly 3, not 4 from rounding
    assert capacity(8, 8, 1, 0.5) == 1


@pytest.mark.parametrize("k,c", [(1, 1.0), (2, 1.0), (2, 0.5), (3, 2.0), (1, 0.25)])
def test_output_equals_token_by_token_definition(k, c):
    m = moe(k=k, c=c)
    x = np.random.default_rng(k).standard_normal((12, 5))
    out, aux = m(x)
    want, p = reference(m, x)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)
    r = m.routing
    assert r.capacity == capacity(12, 4, k, c)
    # dropped = exactly the choices past capacity, per expert
    for e in range(4):
        n = int((r.expert == e).sum())
        assert int(((r.expert == e) & r.kept).sum()) == min(n, r.capacity)
    assert r.tokens_per_expert().max() <= r.capacity
    # Switch's loss: E * sum_i f_i P_i with f from first choices
    f = np.bincount(r.expert[:, 0], minlength=4) / 12
    assert float(aux.numpy()) == pytest.approx(4 * np.sum(f * p.mean(0)), rel=1e-12)


def test_dropped_token_gets_zero_and_weights_rule():
    m = moe(k=1, c=0.25, experts=4)  # capacity ceil(0.25 * 8 / 4) = 1: most tokens dropped
    x = np.random.default_rng(3).standard_normal((8, 5))
    out, _ = m(x)
    r = m.routing
    assert r.dropped.sum() >= 4
    assert np.all(out.numpy()[r.dropped[:, 0]] == 0)
    np.testing.assert_allclose(r.weight[:, 0], r.probs.max(1))        # k = 1: raw softmax prob
    m2 = moe(k=2)
    m2(x)
    np.testing.assert_allclose(m2.routing.weight.sum(1), 1.0)          # k = 2: renormalised
    m3 = moe(k=2, normalize=False)
    m3(x)
    np.testing.assert_allclose(m3.routing.weight,
                               np.take_along_axis(m3.routing.probs, m3.routing.expert, 1))


def test_uniform_router_has_aux_loss_one():
    m = moe(k=1, experts=4)
    m.gate.weight.data = np.zeros_like(m.gate.weight.data)  # every prob 1/4; ties: expert 0
    _, aux = m(np.ones((8, 5)))
    # f = (1, 0, 0, 0), P = 1/4 each: E * sum f P = 4 * 1/4 = 1
    assert float(aux.numpy()) == pytest.approx(1.0)


def test_groups_route_each_group_on_its_own():
    x = np.random.default_rng(5).standard_normal((12, 5))
    whole = moe(k=2, c=0.75, groups=3)
    out, aux = whole(x)
    parts, auxes = [], []
    for g in range(3):
        part = moe(k=2, c=0.75)
        o, a = part(x[4 * g:4 * g + 4])
        parts.append(o.numpy())
        auxes.append(float(a.numpy()))
        np.testing.assert_array_equal(whole.routing.slot[4 * g:4 * g + 4], part.routing.slot)
    np.testing.assert_allclose(out.numpy(), np.concatenate(parts), rtol=1e-12, atol=1e-13)
    assert float(aux.numpy()) == pytest.approx(np.mean(auxes), rel=1e-12)
    assert whole.routing.capacity == capacity(4, 4, 2, 0.75)


def test_gradients_match_central_differences():
    m = moe(k=2, c=0.75, experts=3, d=3, hidden=4, seed=7)
    rng = np.random.default_rng(8)
    x0 = rng.standard_normal((6, 3))
    proj = rng.standard_normal((6, 3))

    def loss(x):
        out, aux = m(x)
        return ml.ops.sum(out * ml.tensor(proj)) + 0.3 * aux

    x = ml.tensor(x0, requires_grad=True)
    m.zero_grad()
    loss(x).backward()
    slots = m.routing.slot.copy()
    assert (slots < 0).any() and (slots >= 0).any()   # the case drops something
    checks = [(x.data, x.grad.numpy())]
    for p in m.parameters():
        checks.append((p.data, None if p.grad is None else p.grad.numpy()))
    used = {e for e in range(3) if (m.routing.expert[m.routing.kept] == e).any()}
    eps = 1e-6
    for data, grad in checks:
        numeric = np.zeros_like(data)
        for i in np.ndindex(data.shape):
            keep = data[i]
            data[i] = keep + eps
            up = float(loss(ml.tensor(x.data)).numpy())
            data[i] = keep - eps
            down = float(loss(ml.tensor(x.data)).numpy())
            data[i] = keep
            numeric[i] = (up - down) / (2 * eps)
            np.testing.assert_array_equal(m.routing.slot, slots)  # routing did not flip
        if grad is None:
            assert np.all(numeric == 0)
        else:
            np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)
    assert m.gate.weight.grad is not None and len(used) >= 2


def test_shapes_and_errors():
    m = moe(k=1)
    out, _ = m(np.zeros((2, 3, 5)))
    assert out.shape == (2, 3, 5)
    with pytest.raises(ml.ShapeError, match="MoE"):
        m(np.zeros((4, 6)))
    with pytest.raises(ml.ShapeError, match="groups"):
        moe(groups=3)(np.zeros((4, 5)))
    with pytest.raises(ml.ArgumentError, match="k=5"):
        ml.nn.MoE(5, 7, 4, k=5)
    with pytest.raises(ml.ArgumentError, match="capacity_factor"):
        ml.nn.MoE(5, 7, 4, capacity_factor=0)
    with pytest.raises(ml.ArgumentError, match="route_top_k"):
        route_top_k(np.ones((2, 3)), 4, 1)
