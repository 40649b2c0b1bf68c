"""Exercise 19.3: top-k routing with a capacity, and the load-balancing loss.

The student writes ``route(logits, k, capacity)`` for a mixture-of-experts layer: ``logits`` is
T × E (T tokens, E experts). Each token's router probabilities are ``softmax(logits)`` over the
experts; its k choices are its k most probable experts (ties to the lower expert id), in that
order. Experts take at most ``capacity`` tokens, claimed GShard-style: first every token's first
choice, in token order, then every token's second choice, and so on; a choice whose expert is
full is dropped. Return ``(experts, gates, aux)``: ``experts`` (T × k ints) the chosen experts,
-1 where dropped; ``gates`` (T × k) each choice's probability divided by the sum of the token's
k chosen probabilities, 0 where dropped; ``aux`` Switch Transformer's load-balancing loss
``E · Σ_e f_e · P_e``, with ``f_e`` the fraction of tokens whose first choice is expert ``e``
and ``P_e`` the mean router probability of expert ``e`` over the tokens (before any dropping).

Wrong ideas rejected: claiming capacity token by token (token 0's second choice before token
1's first: in the capacity case the first choices fill every expert exactly, so any second
choice that claims a slot pushes out a later first choice); no capacity (an expert takes more);
dropping the least probable tokens instead of the last ones in order (k = 1 on crowded
experts); gates that are the raw probabilities (not renormalised over the k) or that keep a
dropped choice's weight; choices by logit order with ties to the higher id; ``f_e`` counting
all k choices, or the loss without the factor E.
"""

from __future__ import annotations

import math

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


def _logits(seed: int, kind: str):
    rng = np.random.default_rng(19300 + seed + 13 * len(kind))
    T, E = int(rng.integers(8, 14)), int(rng.integers(3, 6))
    logits = rng.standard_normal((T, E)) * 1.5
    if kind == "crowded":  # most tokens prefer expert 0: capacity binds
        logits[:, 0] += 2.5
    if kind == "ties":
        logits = np.round(logits)
    if kind == "rising":  # every token prefers expert 0, later tokens more strongly: order and
        logits[:, 0] = 3.0 + 0.25 * np.arange(T) + rng.uniform(0, 0.1, T)  # probability disagree
    if kind == "exact":  # first choices fill every expert exactly (T = E · T/E): with k = 2 and a
        T = E * int(rng.integers(3, 5))  # capacity of T/E, every second choice must be dropped
        logits = rng.standard_normal((T, E)) * 0.3
        for t in rng.permutation(T):
            logits[t, t % E] += 3.0
            logits[t, (t % E + 1 + int(rng.integers(0, E - 1))) % E] += 1.5
    return logits


def _reference(logits, k, capacity):
    """Token by token in plain Python (so that a vectorised answer is not a copy of it)."""
    T, E = logits.shape
    rows = []
    for t in range(T):
        top = max(logits[t])
        weights = [math.exp(v - top) for v in logits[t]]
        rows.append([w / sum(weights) for w in weights])
    ranked = [sorted(range(E), key=lambda e, row=row: (-row[e], e))[:k] for row in rows]
    experts = np.array(ranked, dtype=int).reshape(T, k)
    gates = np.array([[row[e] / sum(row[c] for c in picks) for e in picks]
                      for row, picks in zip(rows, ranked)]).reshape(T, k)
    room = dict.fromkeys(range(E), capacity)
    for level in range(k):
        for t in range(T):
            e = ranked[t][level]
            if room[e]:
                room[e] -= 1
            else:
                experts[t, level], gates[t, level] = -1, 0.0
    share = [sum(picks[0] == e for picks in ranked) / T for e in range(E)]
    mean_prob = [sum(row[e] for row in rows) / T for e in range(E)]
    aux = E * sum(f * m for f, m in zip(share, mean_prob))
    return experts, gates, float(aux)


# ----------------------------------------------------------------------------- probes


def _probe(kind: str, k: int, capacity_factor: float):
    def probe(route, seed):
        logits = _logits(seed, kind)
        T, E = logits.shape
        capacity = max(1, int(np.ceil(capacity_factor * k * T / E)))

        def run():
            experts, gates, aux = route(logits.copy(), k, capacity)
            return {"experts": np.asarray(experts), "gates": np.asarray(gates, np.float64),
                    "aux": float(aux)}
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _judge(kind: str, k: int, capacity_factor: float, part: str):
    def judge(raw, seed):
        logits = _logits(seed, kind)
        T, E = logits.shape
        capacity = max(1, int(np.ceil(capacity_factor * k * T / E)))
        experts, gates, aux = _reference(logits, k, capacity)
        what = f"{T} tokens, {E} experts, k = {k}, capacity {capacity}"
        if not isinstance(raw, dict):
            raise AssertionError(f"{what}: route did not return (experts, gates, aux): "
                                 f"{describe(raw)}")
        if part == "experts":
            got = np.asarray(raw["experts"])
            if got.shape != experts.shape or not np.array_equal(got, experts):
                load = np.bincount(got[got >= 0].astype(int), minlength=E) if got.size else []
                raise AssertionError(f"{what}: experts {describe(got)} (load {describe(load)}), "
                                     f"expected {describe(experts)}")
        elif part == "gates":
            got = np.asarray(raw["gates"])
            if got.shape != gates.shape or not np.allclose(got, gates, rtol=1e-9, atol=1e-12):
                raise AssertionError(f"{what}: gates {describe(got)}, expected {describe(gates)} "
                                     f"(the chosen probabilities over their sum; 0 if dropped)")
        elif not np.isclose(raw["aux"], aux, rtol=1e-9, atol=1e-12):
            raise AssertionError(f"{what}: aux = {raw['aux']!r}, expected {aux!r} "
                                 f"(E · Σ f_e · P_e, f from the first choices)")
    return judge


register(
    Exercise(
        id="19.3",
        title="Top-k routing with a capacity",
        target="route",
        task="top-k routing",
        forbidden=("mlsys_lab.nn.moe",),
        cases=(
            Case("top-2 choices with room for all", 1,
                 feedback="each token's k most probable experts, most probable first",
                 probe=_probe("plain", 2, 4.0), judge=_judge("plain", 2, 4.0, "experts")),
            Case("capacity claimed first choices first, in token order", 2,
                 feedback="all first choices claim capacity before any second choice",
                 probe=_probe("exact", 2, 0.5), judge=_judge("exact", 2, 0.5, "experts")),
            Case("k = 1: the tokens past capacity are the last ones in order", 1,
                 feedback="tokens claim in token order; the ones that find the expert full drop",
                 probe=_probe("rising", 1, 1.0), judge=_judge("rising", 1, 1.0, "experts")),
            Case("gates renormalised over the k, 0 where dropped", 1,
                 feedback="divide each chosen probability by the sum of the k chosen",
                 probe=_probe("exact", 2, 0.5), judge=_judge("exact", 2, 0.5, "gates")),
            Case("ties go to the lower expert id", 0.5,
                 feedback="a stable sort of the probabilities, descending",
                 probe=_probe("ties", 2, 4.0), judge=_judge("ties", 2, 4.0, "experts")),
            Case("the load-balancing loss", 0.5,
                 feedback="E times the sum over experts of (first-choice share) x (mean prob)",
                 probe=_probe("crowded", 2, 1.25), judge=_judge("crowded", 2, 1.25, "aux")),
        ),
    ),
)
