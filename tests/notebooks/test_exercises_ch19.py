"""Exercises of chapter 19 test the idea: the references (and independently written answers)
score full marks on every seed, the library's recomputation, FSDP and MoE code is refused, and
each wrong idea listed in the exercise modules of
``mlsys_lab/grading/exercises/ch19_training_large_models/`` scores 0 on the cases that name it.

Everything runs in process with ``run_cases`` (the probe -> wire -> judge round trip of the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import numpy as np
import pytest

from mlsys_lab.grading.core.check import run_cases

from ..exercise_results import fails, fails_only, full, refused

SEEDS = [0, 1, 7, 12345]


# ============================================================================= 19.1 recompute
def backward_with_recompute(layers, x, grad_out, keep):
    n = len(layers)
    bounds = sorted(set(keep) | {0}) + [n]
    kept, a = {}, x
    for i, layer in enumerate(layers):
        if i in bounds:
            kept[i] = a
        a = layer.forward(a)
    del a
    grad = grad_out
    for start, end in reversed(list(zip(bounds, bounds[1:]))):
        inputs = [kept.pop(start)]
        for i in range(start, end - 1):
            inputs.append(layers[i].forward(inputs[-1]))
        for i in range(end - 1, start - 1, -1):
            grad = layers[i].backward(inputs.pop(), grad)
    return grad


def keeping_everything(layers, x, grad_out, keep):
    acts = [x]
    for layer in layers:
        acts.append(layer.forward(acts[-1]))
    grad = grad_out
    for i in range(len(layers) - 1, -1, -1):
        grad = layers[i].backward(acts[i], grad)
    return grad


def recomputing_from_the_start(layers, x, grad_out, keep):
    a = x
    for layer in layers:
        a = layer.forward(a)
    del a
    grad = grad_out
    for i in range(len(layers) - 1, -1, -1):
        a = x
        for j in range(i):
            a = layers[j].forward(a)
        grad = layers[i].backward(a, grad)
    return grad


def one_layer_short(layers, x, grad_out, keep):
    n = len(layers)
    bounds = sorted(set(keep) | {0}) + [n]
    kept, a = {}, x
    for i, layer in enumerate(layers):
        if i in bounds:
            kept[i] = a
        a = layer.forward(a)
    grad = grad_out
    for start, end in reversed(list(zip(bounds, bounds[1:]))):
        inputs = [kept.pop(start)]
        for i in range(start, end - 2):
            inputs.append(layers[i].forward(inputs[-1]))
        for i in range(end - 1, start - 1, -1):
            grad = layers[i].backward(inputs.pop() if inputs else x, grad)
    return grad


def beside_the_layers(layers, x, grad_out, keep):
    """The chain computed by hand from each layer's weights (dug out of its closure: they are
    not attributes), calling no forward at all."""
    weights = [dict(zip(layer.forward.__code__.co_freevars,
                        (c.cell_contents for c in layer.forward.__closure__)))["W"]
               for layer in layers]
    acts = [x.value]
    for W in weights:
        acts.append(np.tanh(W @ acts[-1]))
    grad = grad_out
    for W, out in zip(reversed(weights), reversed(acts[1:])):
        grad = W.T @ ((1.0 - out ** 2) * grad)
    return grad


@pytest.mark.parametrize("seed", SEEDS)
def test_recompute_reference_scores_full_marks(seed):
    full(run_cases("19.1", backward_with_recompute, seed=seed))


def test_keeping_every_activation_fails_the_memory_case():
    fails_only(run_cases("19.1", keeping_everything, seed=2), "only the kept activations")


def test_recomputing_from_the_start_fails_the_call_count():
    fails_only(run_cases("19.1", recomputing_from_the_start, seed=2), "each layer runs forward")


def test_computing_the_chain_beside_the_layers_fails_the_call_count():
    fails_only(run_cases("19.1", beside_the_layers, seed=2), "each layer runs forward")


def test_a_segment_one_layer_short_gets_the_gradient_wrong():
    fails(run_cases("19.1", one_layer_short, seed=2), "the gradient equals")


def test_recompute_through_the_library_is_refused():
    import mlsys_lab as ml

    def through_the_library(layers, x, grad_out, keep):
        ml.recompute(lambda t: t, ml.tensor(np.zeros(2)))
        return backward_with_recompute(layers, x, grad_out, keep)

    assert refused(run_cases("19.1", through_the_library, seed=0))


# ============================================================================= 19.2 FSDP schedule
def fsdp_schedule(num_layers, prefetch, *, late=False, ahead=1, regather=True, rs_first=False):
    events = []
    for order, compute in ((list(range(num_layers)), "forward"),
                           (list(range(num_layers - 1, -1, -1)), "backward")):
        gathered = set()
        for i, layer in enumerate(order):
            if compute == "backward" and not regather:
                pass
            elif late or not prefetch:
                if layer not in gathered:
                    events.append(("gather", layer))
                    gathered.add(layer)
            else:
                for nxt in order[i:i + 1 + ahead]:
                    if nxt not in gathered:
                        events.append(("gather", nxt))
                        gathered.add(nxt)
            if compute == "backward" and rs_first:
                events.append(("reduce_scatter", layer))
            events.append((compute, layer))
            events.append(("free", layer))
            if late and prefetch and i + 1 < len(order):
                events.append(("gather", order[i + 1]))
                gathered.add(order[i + 1])
            if compute == "backward" and not rs_first:
                events.append(("reduce_scatter", layer))
    return events


def gather_everything_first(num_layers, prefetch):
    n = num_layers
    return ([("gather", i) for i in range(n)] + [("forward", i) for i in range(n)]
            + [e for i in range(n - 1, -1, -1) for e in (("backward", i), ("reduce_scatter", i))]
            + [("free", i) for i in range(n)])


@pytest.mark.parametrize("seed", SEEDS)
def test_fsdp_reference_scores_full_marks(seed):
    full(run_cases("19.2", fsdp_schedule, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"late": True}, ("with prefetch",)),
    ({"ahead": 2}, ("with prefetch",)),
    ({"regather": False}, ("every compute", "without prefetch", "with prefetch")),
    ({"rs_first": True}, ("every compute", "without prefetch", "with prefetch")),
], ids=["prefetch after compute", "two ahead", "no backward gather", "reduce-scatter first"])
def test_fsdp_wrong_ideas_fail(how, failing):
    fails(run_cases("19.2", lambda n, p: fsdp_schedule(n, p, **how), seed=3), *failing)


def test_gathering_the_whole_model_fails_both_memory_cases():
    fails_only(run_cases("19.2", gather_everything_first, seed=3), "without prefetch",
               "with prefetch")


def test_fsdp_through_the_library_is_refused():
    from mlsys_lab.distributed.parallel import fsdp

    def through_the_library(num_layers, prefetch):
        fsdp.fsdp_schedule(num_layers, prefetch)
        return fsdp_schedule(num_layers, prefetch)

    assert refused(run_cases("19.2", through_the_library, seed=0))


# ============================================================================= 19.3 routing
def route(logits, k, capacity, *, order="level", cap=True, renorm=True, ties="low",
          f_all=False, factor=True, drop="order"):
    z = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    T, E = probs.shape
    if ties == "low":
        choices = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    else:
        choices = np.argsort(probs, axis=1, kind="stable")[:, ::-1][:, :k]
    chosen = np.take_along_axis(probs, choices, axis=1)
    gates = chosen / chosen.sum(axis=1, keepdims=True) if renorm else chosen.copy()
    experts = choices.copy()
    load = np.zeros(E, dtype=int)
    pairs = ([(t, j) for j in range(k) for t in range(T)] if order == "level"
             else [(t, j) for t in range(T) for j in range(k)])
    if drop == "probability":
        pairs.sort(key=lambda tj: -chosen[tj])
    for t, j in pairs:
        e = choices[t, j]
        if not cap or load[e] < capacity:
            load[e] += 1
        else:
            experts[t, j], gates[t, j] = -1, 0.0
    counted = choices.ravel() if f_all else choices[:, 0]
    f = np.bincount(counted, minlength=E) / counted.size
    return experts, gates, (E if factor else 1) * float(np.sum(f * probs.mean(axis=0)))


def route_by_hand(logits, k, capacity):
    """Written independently: per-token loops, a running list of each expert's tokens."""
    T, E = logits.shape
    taken = {e: [] for e in range(E)}
    experts = -np.ones((T, k), dtype=int)
    gates = np.zeros((T, k))
    soft = []
    for t in range(T):
        e = np.exp(logits[t] - np.max(logits[t]))
        soft.append(e / np.sum(e))
    picks = [sorted(range(E), key=lambda j, p=p: (-p[j], j))[:k] for p in soft]
    for level in range(k):
        for t in range(T):
            target = picks[t][level]
            if len(taken[target]) < capacity:
                taken[target].append(t)
                experts[t, level] = target
                gates[t, level] = soft[t][target] / sum(soft[t][j] for j in picks[t])
    first = np.zeros(E)
    for t in range(T):
        first[picks[t][0]] += 1 / T
    return experts, gates, E * float(first @ np.mean(soft, axis=0))


@pytest.mark.parametrize("seed", SEEDS)
def test_routing_reference_and_an_independent_answer_score_full_marks(seed):
    full(run_cases("19.3", route, seed=seed))
    full(run_cases("19.3", route_by_hand, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"order": "token"}, ("capacity claimed",)),
    ({"cap": False}, ("capacity claimed", "k = 1")),
    ({"drop": "probability"}, ("k = 1",)),
    ({"renorm": False}, ("gates",)),
    ({"ties": "high"}, ("ties",)),
    ({"f_all": True}, ("the load-balancing loss",)),
    ({"factor": False}, ("the load-balancing loss",)),
], ids=["token order", "no capacity", "drop least probable", "raw gates", "ties high",
        "f over all k", "no factor E"])
def test_routing_wrong_ideas_fail(how, failing):
    for seed in (3, 4):
        fails(run_cases("19.3", lambda *a: route(*a, **how), seed=seed), *failing)


def test_routing_through_the_library_is_refused():
    from mlsys_lab.nn import moe

    def through_the_library(logits, k, capacity):
        moe.route_top_k(logits, k, capacity)
        return route(logits, k, capacity)

    assert refused(run_cases("19.3", through_the_library, seed=0))
