"""Checks for chapter 13, recommender systems (``solutions/ch13_recommender_systems.ipynb``).

13.1 the row-sparse gradient of an embedding bag with respect to its table: only the touched
rows, each once, repeated ids accumulating, mean pooling dividing by each bag's own size;
13.2 Recall@k = TP / min(TP + FN, k); 13.3 a shard placement that spreads hot keys over the
servers without exceeding their capacity.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references and decide.
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

# ============================================================================= 13.1 sparse gradient
# ----------------------------------------------------------------------------- inputs (both sides)


#: The rows of the big-table case: 2**40 x 4 float64 is 32 TiB, so a dense gradient (built whole
#: and then sliced to the touched rows, which reads right) cannot even be allocated, while ids
#: up to 2**40 are plain int64 for np.unique and a dict.
HUGE_TABLE = 2**40


def _bag_case(rng, num_rows, dim, bags, max_bag, repeats, empty):
    sizes = rng.integers(0 if empty else 1, max_bag + 1, bags)
    if empty:
        sizes[rng.integers(0, bags, max(1, bags // 4))] = 0
    hot = rng.integers(0, num_rows, 3)
    ids = [int(hot[rng.integers(0, 3)]) if repeats and rng.random() < 0.5 else
           int(rng.integers(0, num_rows)) for _ in range(int(sizes.sum()))]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    grad_out = rng.standard_normal((bags, dim))
    return np.array(ids, np.int64), offsets, grad_out, num_rows


def _grad_configs(kind, seed):
    """(ids, offsets, grad_out, num_rows, mode) for one case."""
    rng = np.random.default_rng([seed, 13, len(kind)])
    if kind == "repeats":  # sum pooling, ids repeated within and across bags
        return [(*_bag_case(rng, 50, 3, 6, 4, True, False), "sum") for _ in range(4)] + [
            (np.array([7, 7, 7, 2]), np.array([0, 2]), np.array([[1.0, 2.0], [10.0, 20.0]]),
             9, "sum")]
    if kind == "sparse":  # a table too large to exist densely, a small batch
        return [(*_bag_case(rng, HUGE_TABLE, 4, 8, 3, True, False), "sum"),
                (*_bag_case(rng, HUGE_TABLE, 4, 8, 3, False, False), "mean")]
    if kind == "mean":  # mean pooling with empty bags
        return [(np.array([1, 3, 3]), np.array([0, 0, 1, 3]),
                 np.array([[5.0], [6.0], [8.0], [1.0]]), 4, "mean")] + [
            (*_bag_case(rng, 30, 3, 7, 4, True, True), "mean") for _ in range(4)]
    return [(*_bag_case(rng, int(rng.integers(5, 40)), int(rng.integers(1, 5)),
                        int(rng.integers(1, 9)), 5, bool(rng.integers(0, 2)),
                        bool(rng.integers(0, 2))), mode)
            for mode in ("sum", "mean", "sum", "mean", "sum", "mean")]


def _reference_grad(ids, offsets, grad_out, num_rows, mode):
    """``{row: gradient row}`` bag by bag, one id at a time."""
    ends = list(offsets[1:]) + [len(ids)]
    out = {}
    for b, (s, e) in enumerate(zip(offsets, ends)):
        for i in ids[s:e]:
            share = grad_out[b] / (1 if mode == "sum" else e - s)
            out[int(i)] = out.get(int(i), 0) + share
    return out


# ----------------------------------------------------------------------------- probes


def _grad_probe_of(kind):
    def probe(sparse_embedding_grad, seed):
        runs = []
        for ids, offsets, grad_out, num_rows, mode in _grad_configs(kind, seed):
            got = sparse_embedding_grad(ids.copy(), offsets.copy(), grad_out.copy(), num_rows,
                                        mode)
            if isinstance(got, tuple) and len(got) == 2:
                got = {"rows": np.asarray(got[0]), "values": np.asarray(got[1], np.float64)}
            runs.append(got)
        return runs
    return probe


# ----------------------------------------------------------------------------- judges


def _grad_judge_of(kind):
    def judge(raw, seed):
        configs = _grad_configs(kind, seed)
        if not isinstance(raw, list) or len(raw) != len(configs):
            raise AssertionError(f"expected {len(configs)} results, got {describe(raw)}")
        for (ids, offsets, grad_out, num_rows, mode), got in zip(configs, raw):
            what = (f"ids {ids.tolist()[:10]}{'...' if len(ids) > 10 else ''}, offsets "
                    f"{offsets.tolist()[:10]}, {mode}")
            _expect_grad(got, _reference_grad(ids, offsets, grad_out, num_rows, mode),
                         grad_out.shape[1], num_rows, what)
    return judge


def _expect_grad(got, want, dim, num_rows, what):
    if not isinstance(got, dict) or not isinstance(got.get("rows"), np.ndarray):
        raise AssertionError(f"{what}: returned {describe(got)}; return a pair (rows, values)")
    rows, values = got["rows"], got["values"]
    if rows.ndim != 1 or rows.dtype.kind not in "iu":
        raise AssertionError(f"{what}: rows must be a 1-D integer array, got {rows.dtype} "
                             f"{rows.shape}")
    if values.shape != (rows.shape[0], dim):
        raise AssertionError(f"{what}: values have shape {values.shape}; expected "
                             f"({rows.shape[0]}, {dim}), one row per entry of rows")
    if rows.shape[0] >= num_rows > len(want):
        raise AssertionError(f"{what}: returned {rows.shape[0]} rows of a {num_rows}-row table "
                             f"whose batch touched {len(want)}: a dense gradient; return only "
                             "the touched rows")
    if len(set(rows.tolist())) != rows.shape[0]:
        raise AssertionError(f"{what}: row {_first_repeat(rows)} appears twice in rows; give "
                             "each touched row once, with its contributions added up")
    if set(rows.tolist()) != set(want):
        extra = sorted(set(rows.tolist()) - set(want))[:5]
        missing = sorted(set(want) - set(rows.tolist()))[:5]
        raise AssertionError(f"{what}: rows {sorted(rows.tolist())[:10]} are not the touched "
                             f"rows (extra {extra}, missing {missing}); an id in an empty bag "
                             "does not exist")
    for r, v in zip(rows.tolist(), values):
        if not np.allclose(v, want[r], rtol=1e-9, atol=1e-12):
            raise AssertionError(f"{what}: the gradient of row {r} is {np.round(v, 6).tolist()}, "
                                 f"expected {np.round(want[r], 6).tolist()} (every lookup of "
                                 "the row adds its bag's gradient, divided by that bag's size "
                                 "for mean)")


def _first_repeat(rows):
    seen = set()
    for r in rows.tolist():
        if r in seen:
            return r
        seen.add(r)
    return None


# ============================================================================= 13.2 Recall@k
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


# ============================================================================= 13.3 shard placement
# ----------------------------------------------------------------------------- inputs (both sides)


def _zipf_freq(rng, keys, skew):
    f = 1e6 / np.arange(1, keys + 1) ** skew
    return np.round(f[rng.permutation(keys)])


def _placement_configs(kind, seed):
    """(freq, num_servers, capacity)."""
    rng = np.random.default_rng([seed, 133, len(kind)])
    if kind == "hot":  # plenty of room: only the balance matters
        return [(_zipf_freq(rng, 400, 1.1), 8, 400), (_zipf_freq(rng, 300, 1.3), 4, 300),
                (_zipf_freq(rng, int(rng.integers(100, 300)), 1.0), int(rng.integers(3, 9)),
                 300)]
    if kind == "capacity":  # tight room: n keys on S servers of about n / S each
        out = []
        for keys, servers in ((400, 8), (301, 4), (int(rng.integers(100, 300)), 5)):
            out.append((_zipf_freq(rng, keys, 1.1), servers, -(-keys // servers)))
        return out
    return []


PLACEMENT_BAD_CALLS = ((np.ones(10), 2, 4), (np.ones(7), 3, 2))


def _reference_max_load(freq, servers, capacity):
    from mlsys_lab.recsys.sharding import balanced_placement, server_loads

    return server_loads(freq, balanced_placement(freq, servers, capacity), servers).max()


# ----------------------------------------------------------------------------- probes


def _placement_probe_of(kind):
    def probe(place_shards, seed):
        return [np.asarray(place_shards(freq.copy(), s, c))
                for freq, s, c in _placement_configs(kind, seed)]
    return probe


def _placement_errors_probe(place_shards):
    return [attempt(place_shards, *args) for args in PLACEMENT_BAD_CALLS]


# ----------------------------------------------------------------------------- judges


def _placement_judge_of(kind):
    def judge(raw, seed):
        configs = _placement_configs(kind, seed)
        if not isinstance(raw, list) or len(raw) != len(configs):
            raise AssertionError(f"expected {len(configs)} placements, got {describe(raw)}")
        for (freq, servers, capacity), got in zip(configs, raw):
            what = f"{len(freq)} keys on {servers} servers of capacity {capacity}"
            if not isinstance(got, np.ndarray) or got.shape != freq.shape or \
                    got.dtype.kind not in "iu":
                raise AssertionError(f"{what}: returned {describe(got)}; return one server "
                                     "number (an int) per key")
            if got.size and (got.min() < 0 or got.max() >= servers):
                raise AssertionError(f"{what}: server {int(got.max())} does not exist "
                                     f"(servers are 0..{servers - 1})")
            held = np.bincount(got, minlength=servers)
            if held.max() > capacity:
                raise AssertionError(f"{what}: server {int(held.argmax())} holds "
                                     f"{int(held.max())} keys, more than its capacity; a full "
                                     "server takes no more keys")
            loads = np.bincount(got, weights=freq, minlength=servers)
            best = _reference_max_load(freq, servers, capacity)
            if loads.max() > 1.05 * best:
                raise AssertionError(f"{what}: the busiest server serves {loads.max():.0f} "
                                     f"lookups ({loads.max() / loads.mean():.2f}x the mean); "
                                     f"placing the hottest keys first, each on the least-loaded "
                                     f"server, gets {best:.0f}")
    return judge


def _placement_errors_judge(raw):
    expect_each_raised("place_shards", PLACEMENT_BAD_CALLS, raw, "ValueError",
                       "the keys do not fit on the servers")


register(
    # 13.1. A wrong idea that still produces plausible output would fail because: a dense
    # (num_rows, dim) gradient, or all rows 0..num_rows-1 with zeros, fails the big-table case,
    # and so does a dense gradient built whole and then sliced to the touched rows (what it
    # returns is right): that table has 2**40 rows, 32 TiB densely, which cannot be allocated;
    # assigning instead of adding (values[row] = g[bag]) loses repeated ids ("repeats"); giving
    # one entry per lookup (duplicate rows, PyTorch's uncoalesced form) is refused: each row
    # once; mean pooling that divides by the number of bags, by the total number of ids, or
    # that forgets to divide, gets the wrong values; computing each bag's size as
    # offsets[b+1] - offsets[b] but taking the last bag's end as the next offset (or crashing
    # on empty bags with a division by zero) fails the mean case.
    Exercise(
        id="13.1",
        title="A sparse embedding gradient",
        target="sparse_embedding_grad",
        task="the row-sparse embedding-bag gradient",
        forbidden=(
            "mlsys_lab.engine.ops_embedding",  # every function of the embedding ops
            "mlsys_lab.engine.sparse:RowSparse.merged",
            "mlsys_lab.engine.sparse:unique_first_seen",
            "mlsys_lab.engine.sparse:RowSparse.coalesce",
            "mlsys_lab.engine.sparse:RowSparse.to_dense",
            "mlsys_lab.engine.sparse:scatter_add_rows",
            "mlsys_lab.nn.embedding:EmbeddingBag.forward",
            "mlsys_lab.nn.embedding:Embedding.forward",
        ),
        cases=(
            Case("sum pooling: repeated ids add up, each touched row once", 2,
                 feedback="add every lookup's bag gradient into its row (+=, not =)",
                 probe=_grad_probe_of("repeats"), judge=_grad_judge_of("repeats")),
            Case("only the touched rows of a 2**40-row table (too big to build densely)", 2,
                 feedback="return the touched rows and their gradients, not the whole table",
                 probe=_grad_probe_of("sparse"), judge=_grad_judge_of("sparse")),
            Case("mean pooling divides by each bag's size; empty bags add nothing", 2,
                 feedback="bag b holds ids[offsets[b]:offsets[b+1]] (the last runs to the end)",
                 probe=_grad_probe_of("mean"), judge=_grad_judge_of("mean")),
            Case("random bags, sum and mean, against the reference", 1,
                 feedback="sum and mean, repeats and empty bags", probe=_grad_probe_of("random"),
                 judge=_grad_judge_of("random")),
        ),
    ),
    # 13.2. A wrong idea that still produces plausible output would fail because: dividing by k
    # always is wrong when fewer than k items are relevant ("few"); dividing by the number of
    # relevant items always (plain recall) is wrong when more than k are relevant ("many");
    # counting a retrieved item each time it appears gives recall above the truth on repeated
    # items ("duplicates"); looking past the first k retrieved items, or returning 0 / nan for
    # bad arguments instead of raising, fails the random and error cases.
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
    # 13.3. A wrong idea that still produces plausible output would fail because: round-robin
    # by id (key % S, what hashing does) ignores frequency and puts a hot key together with a
    # share of everything else, 1.5-2x the balanced maximum ("hot"); random placement likewise;
    # greedy least-loaded placement that ignores the capacity overfills the servers left with
    # cold keys ("capacity"); placing keys in id order (not hottest first) onto the least
    # loaded server leaves a hot key to land late on a loaded server; not raising when the
    # keys cannot fit fails the error case.
    Exercise(
        id="13.3",
        title="A shard placement that balances hot keys",
        target="place_shards",
        task="the hot-key-balancing placement",
        forbidden=("mlsys_lab.recsys.sharding:balanced_placement",),
        cases=(
            Case("hot keys spread: busiest server within 5% of the balanced placement", 3,
                 feedback="hottest keys first, each onto the least-loaded server",
                 probe=_placement_probe_of("hot"), judge=_placement_judge_of("hot")),
            Case("tight capacity: no server over capacity, still balanced", 2,
                 feedback="a full server takes no more keys",
                 probe=_placement_probe_of("capacity"), judge=_placement_judge_of("capacity")),
            Case("keys that do not fit raise ValueError", 1,
                 feedback="more keys than num_servers * capacity cannot be placed",
                 probe=_placement_errors_probe, judge=_placement_errors_judge),
        ),
    ),
)
