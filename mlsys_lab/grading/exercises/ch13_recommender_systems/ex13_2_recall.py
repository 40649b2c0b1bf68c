"""Exercise 13.2: Recall@k = TP / min(TP + FN, k).

Wrong ideas rejected: dividing by k always is wrong when fewer than k items are relevant
("few"); dividing by the number of relevant items always (plain recall) is wrong when more than
k are relevant ("many"); counting a retrieved item each time it appears gives recall above the
truth on repeated items ("duplicates"); looking past the first k retrieved items, or returning
0 / nan for bad arguments instead of raising, fails the random and error cases.
"""

from __future__ import annotations

import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    attempt,
    describe,
    expect_each_raised,
    register,
)

# ----------------------------------------------------------------------------- inputs (both sides)


def _recall_configs(kind, seed):
    """(retrieved, relevant, k)."""
    rng = np.random.default_rng([seed, 132, len(kind)])
    if kind == "many":  # more relevant items than k
        return [([1, 2, 3], [1, 2, 3, 4, 5], 3), ([4, 9, 1, 8], list(range(10)), 2),
                ([5, 6, 7, 8, 0], [5, 6, 7, 8, 9, 10, 11], 4)]
    if kind == "few":  # fewer relevant items than k
        return [([1, 9, 8], [1, 2], 3), ([3, 0, 4, 5, 6], [0], 5), ([7, 8, 9, 1], [1, 7, 2], 4),
                ([2, 4], [4, 6], 10)]
    if kind == "duplicates":  # the retrieved list repeats an item
        return [([1, 1, 1], [1, 2], 3), ([5, 5, 6, 6], [5, 6, 7, 8, 9], 4),
                ([3, 3, 3, 3, 4], [3, 4], 5)]
    out = []
    for _ in range(12):
        items = int(rng.integers(8, 30))
        retrieved = rng.integers(0, items, int(rng.integers(0, 15))).tolist()
        relevant = rng.choice(items, int(rng.integers(1, 8)), replace=False).tolist()
        out.append((retrieved, relevant, int(rng.integers(1, 12))))
    return out


RECALL_BAD_CALLS = (([1, 2], [], 2), ([1, 2], [1], 0))


def _reference_recall(retrieved, relevant, k):
    hits = len(set(retrieved[:k]) & set(relevant))
    return hits / min(len(set(relevant)), k)


# ----------------------------------------------------------------------------- probes


def _recall_probe_of(kind):
    def probe(recall_at_k, seed):
        return [recall_at_k(list(r), list(s), k) for r, s, k in _recall_configs(kind, seed)]
    return probe


def _recall_errors_probe(recall_at_k):
    return [attempt(recall_at_k, list(r), list(s), k) for r, s, k in RECALL_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _recall_judge_of(kind, hint):
    def judge(raw, seed):
        configs = _recall_configs(kind, seed)
        if not isinstance(raw, list) or len(raw) != len(configs):
            raise AssertionError(f"expected {len(configs)} results, got {describe(raw)}")
        for (retrieved, relevant, k), got in zip(configs, raw):
            want = _reference_recall(retrieved, relevant, k)
            if isinstance(got, bool) or not isinstance(got, numbers.Real) or \
                    abs(float(got) - want) > 1e-12:
                raise AssertionError(f"recall_at_k({retrieved}, {relevant}, k={k}) = "
                                     f"{describe(got)}, expected {want:.4g}: {hint}")
    return judge


def _recall_errors_judge(raw):
    expect_each_raised("recall_at_k", RECALL_BAD_CALLS, raw, "ValueError",
                       "recall needs a relevant item and k >= 1")


register(
    Exercise(
        id="13.2",
        title="Recall@k",
        target="recall_at_k",
        task="Recall@k",
        forbidden=("mlsys_lab.recsys.metrics:recall_at_k",
                   "mlsys_lab.recsys.metrics:mean_recall_at_k"),
        cases=(
            Case("more relevant items than k: a perfect top k scores 1", 2,
                 feedback="divide by min(TP + FN, k), not by the number of relevant items",
                 probe=_recall_probe_of("many"),
                 judge=_recall_judge_of("many", "with more than k relevant items, at most k "
                                        "can be found, so divide by k")),
            Case("fewer relevant items than k: divide by their number", 2,
                 feedback="divide by min(TP + FN, k), not by k",
                 probe=_recall_probe_of("few"),
                 judge=_recall_judge_of("few", "with fewer than k relevant items, divide by "
                                        "their number")),
            Case("an item retrieved twice is found once", 1,
                 feedback="count distinct relevant items in the top k",
                 probe=_recall_probe_of("duplicates"),
                 judge=_recall_judge_of("duplicates", "count each relevant item once")),
            Case("random lists against the reference (only the first k count)", 1,
                 feedback="TP counts relevant items among retrieved[:k]",
                 probe=_recall_probe_of("random"),
                 judge=_recall_judge_of("random", "TP / min(TP + FN, k) over retrieved[:k]")),
            Case("no relevant item, or k < 1, raises ValueError", 1,
                 feedback="recall is undefined then", probe=_recall_errors_probe,
                 judge=_recall_errors_judge),
        ),
    ),
)
