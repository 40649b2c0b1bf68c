"""Exercise 13.1: the row-sparse gradient of an embedding bag with respect to its table: only
the touched rows, each once, repeated ids accumulating, mean pooling dividing by each bag's own
size.

Wrong ideas rejected: a dense (num_rows, dim) gradient, or all rows 0..num_rows-1 with zeros,
fails the big-table case, and so does a dense gradient built whole and then sliced to the
touched rows (what it returns is right): that table has 2**40 rows (``HUGE_TABLE``), 32 TiB
densely, which cannot be allocated; assigning instead of adding (values[row] = g[bag]) loses
repeated ids ("repeats"); giving one entry per lookup (duplicate rows, PyTorch's uncoalesced
form) is refused: each row once; mean pooling that divides by the number of bags, by the total
number of ids, or that forgets to divide, gets the wrong values; computing each bag's size as
offsets[b+1] - offsets[b] but taking the last bag's end as the next offset (or crashing on
empty bags with a division by zero) fails the mean case.

``forbidden`` names the whole module ``mlsys_lab.engine.ops_embedding`` (every function compiled
from it: the embedding ops, their backward and its hash-merged ``sparse_bag_grad``), the
row-sparse helpers of ``mlsys_lab.engine.sparse`` and the forward passes of the embedding
layers.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, register

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


register(
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
)
