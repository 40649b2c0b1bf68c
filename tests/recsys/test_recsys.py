"""mlsys_lab.recsys: metrics against scikit-learn, caches against a brute-force simulation,
sharded parameter servers moving exactly the touched rows, hot-key placement, the multi-stage
funnel, update propagation, the data generator and the two models (small tables only)."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as sklearn_metrics

import mlsys_lab as ml
from mlsys_lab import recsys as rs
from mlsys_lab.engine.sparse import RowSparse
from mlsys_lab.errors import ArgumentError, ShapeError


# --- metrics ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 6)), min_size=2, max_size=40))
def test_auc_equals_sklearn_including_ties(pairs):
    y, s = np.array(pairs).T
    if y.min() == y.max():
        with pytest.raises(ArgumentError, match="both"):
            rs.auc(y, s)
        return
    assert rs.auc(y, s / 7.0) == pytest.approx(sklearn_metrics.roc_auc_score(y, s / 7.0),
                                               abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.floats(0.001, 0.999)), min_size=1, max_size=30))
def test_log_loss_equals_sklearn(pairs):
    y, p = np.array(pairs).T
    assert rs.log_loss(y, p) == pytest.approx(
        sklearn_metrics.log_loss(y, p, labels=[0, 1]), rel=1e-10)


def test_log_loss_clips_certain_mistakes_and_refuses_bad_input():
    assert np.isfinite(rs.log_loss([1, 0], [0.0, 1.0]))
    with pytest.raises(ArgumentError):
        rs.log_loss([1], [1.5])
    with pytest.raises(ShapeError):
        rs.auc([0, 1], [0.5])


def recall_reference(retrieved, relevant, k):
    hits = len(set(retrieved[:k]) & set(relevant))
    return hits / min(len(set(relevant)), k)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=12), st.sets(st.integers(0, 9), min_size=1),
       st.integers(1, 8))
def test_recall_at_k_is_tp_over_min_of_relevant_and_k(retrieved, relevant, k):
    assert rs.recall_at_k(retrieved, relevant, k) == pytest.approx(
        recall_reference(retrieved, list(relevant), k))


def test_recall_at_k_examples():
    assert rs.recall_at_k([1, 2, 3], {1, 2, 3, 4, 5}, 3) == 1.0  # divide by k, not |relevant|
    assert rs.recall_at_k([1, 9, 9], {1, 2}, 3) == 0.5  # divide by |relevant|, not k
    assert rs.recall_at_k([1, 1, 1], {1, 2}, 3) == 0.5  # a duplicate counts once
    assert rs.mean_recall_at_k([[1], [5]], [{1}, {2}], 1) == 0.5
    with pytest.raises(ArgumentError):
        rs.recall_at_k([1], set(), 1)
    with pytest.raises(ArgumentError):
        rs.recall_at_k([1], {1}, 0)


# --- caches -----------------------------------------------------------------------------------
def cache_reference(trace, capacity, policy):
    """A list of [key, uses, last use]; evict the min by (uses, last use) for LFU, by last
    use for LRU. Uses count from when the key entered the cache."""
    cache, hits = [], 0
    for t, key in enumerate(trace):
        entry = next((e for e in cache if e[0] == key), None)
        if entry is not None:
            hits += 1
            entry[1] += 1
            entry[2] = t
            continue
        if capacity == 0:
            continue
        if len(cache) == capacity:
            victim = min(cache, key=(lambda e: (e[1], e[2])) if policy == "lfu"
                         else (lambda e: e[2]))
            cache.remove(victim)
        cache.append([key, 1, t])
    return hits


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 12), max_size=80), st.integers(0, 6),
       st.sampled_from(["lru", "lfu"]))
def test_cache_hits_equal_the_brute_force_simulation(trace, capacity, policy):
    hits, misses = rs.simulate_cache(trace, capacity, policy)
    assert hits == cache_reference(trace, capacity, policy)
    assert hits + misses == len(trace)


def test_hit_rate_grows_with_cache_size_and_lfu_wins_on_a_zipf_trace():
    draw, _ = rs.zipf_sampler(2000, 1.1, np.random.default_rng(0))
    trace = draw(5000)
    lru = rs.hit_rate_curve(trace, [0, 10, 100, 1000], "lru")
    lfu = rs.hit_rate_curve(trace, [0, 10, 100, 1000], "lfu")
    assert lru[0] == 0 and all(a <= b for a, b in zip(lru, lru[1:]))
    assert lfu[1] > lru[1]  # a small cache should hold the hot keys, not the recent ones
    with pytest.raises(ArgumentError):
        rs.simulate_cache([1], 2, "fifo")


# --- sharded parameter servers ------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["row", "table", "column"])
def test_pull_and_push_move_exactly_the_touched_rows(scheme):
    r = np.random.default_rng(0)
    tables = [r.standard_normal((50, 6)).astype(np.float32),
              r.standard_normal((30, 6)).astype(np.float32)]
    ps = rs.ShardedTables(tables, 3, scheme)
    ids = np.array([4, 17, 4, 29, 17, 0])
    touched = np.unique(ids)
    rows = ps.pull(1, ids)
    np.testing.assert_array_equal(rows.indices, touched)
    np.testing.assert_array_equal(rows.values, tables[1][touched])
    key_copies = 3 if scheme == "column" else 1  # column shards each need every key
    per_row = 6 * 4
    assert ps.bytes_pulled == touched.size * (8 * key_copies + per_row)
    grad = RowSparse(ids, r.standard_normal((ids.size, 6)).astype(np.float32), 30)
    ps.push(1, grad, lr=0.5)
    assert ps.bytes_pushed == touched.size * (8 * key_copies + per_row)
    want = tables[1].copy()
    grad.add_to(want, scale=-0.5)
    np.testing.assert_allclose(ps.table(1), want, rtol=1e-6)
    changed = np.flatnonzero(np.any(ps.table(1) != tables[1], axis=1))
    np.testing.assert_array_equal(changed, touched)
    np.testing.assert_array_equal(ps.table(0), tables[0])  # the other table is untouched
    assert sum(ps.server_bytes) == ps.bytes_pulled + ps.bytes_pushed


def test_row_placement_spreads_lookups_and_sparse_beats_dense_all_reduce():
    tables = [np.zeros((10_000, 16), np.float32)]
    ps = rs.ShardedTables(tables, 4, "row")
    ps.pull(0, np.arange(0, 400))
    assert ps.server_lookups == [100, 100, 100, 100]
    dense = rs.dense_allreduce_bytes(tables[0].nbytes, 8)
    assert dense == pytest.approx(2 * 7 / 8 * 10_000 * 16 * 4)
    assert ps.bytes_pulled < dense / 20
    with pytest.raises(ArgumentError):
        rs.ShardedTables(tables, 2, "diagonal")
    with pytest.raises(ArgumentError):
        ps.pull(0, [10_000])


def test_table_wise_default_placement_balances_bytes():
    tables = [np.zeros((n, 4), np.float32) for n in (100, 90, 60, 50, 40)]
    ps = rs.ShardedTables(tables, 2, "table")
    per_server = [sum(tables[t].nbytes for t in range(5) if ps.home[t] == s) for s in range(2)]
    # largest first onto the lighter server: 100 | 90, 60 -> 90 | 50 -> 100 | 40 -> 150
    assert sorted(per_server) == [150 * 16, 190 * 16]


def _optimal_max_load(freq, servers):
    return min(max(np.bincount(p, weights=freq, minlength=servers))
               for p in itertools.product(range(servers), repeat=len(freq)))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=7), st.integers(2, 3))
def test_balanced_placement_is_within_the_lpt_bound_of_the_optimum(freq, servers):
    freq = np.array(freq, float)
    place = rs.balanced_placement(freq, servers, capacity=len(freq))
    best = _optimal_max_load(freq, servers)
    assert rs.server_loads(freq, place, servers).max() <= (4 / 3 - 1 / (3 * servers)) * best + 1e-9


def test_balanced_placement_respects_capacity_and_beats_round_robin_on_hot_keys():
    _, pop = rs.zipf_sampler(1000, 1.2, np.random.default_rng(1))
    freq = pop * 1e6
    rr = rs.load_imbalance(rs.server_loads(freq, rs.round_robin_placement(1000, 8), 8))
    place = rs.balanced_placement(freq, 8, capacity=125)
    assert np.bincount(place, minlength=8).max() <= 125
    assert rs.load_imbalance(rs.server_loads(freq, place, 8)) < rr
    with pytest.raises(ArgumentError, match="do not fit"):
        rs.balanced_placement(freq, 8, capacity=100)


def test_replicating_hot_keys_spreads_their_load():
    freq = np.array([1000.0, 10, 10, 10, 10, 10, 10, 10])
    place = rs.round_robin_placement(8, 4)
    before = rs.server_loads(freq, place, 4)
    after = rs.replicated_loads(freq, place, 4, num_hot=1)
    assert after.sum() == pytest.approx(before.sum())
    np.testing.assert_allclose(after, [260, 270, 270, 270])
    assert rs.load_imbalance(after) < rs.load_imbalance(before)


# --- funnel and updates ------------------------------------------------------------------
def test_pipeline_keeps_the_best_and_cuts_a_stage_to_its_budget():
    value = np.random.default_rng(0).permutation(1000).astype(float)
    stages = [rs.FunnelStage("retrieval", lambda u, c: value[c], keep=200, cost_per_item=1e-6,
                       budget=5e-3),
              rs.FunnelStage("ranking", lambda u, c: -c, keep=20, cost_per_item=1e-4, budget=1e-2,
                       fixed_cost=2e-3),
              rs.FunnelStage("re-ranking", lambda u, c: c % 7, keep=5, cost_per_item=1e-5,
                       budget=1e-3)]
    final, reports = rs.Funnel(stages).run(0, np.arange(1000))
    top200 = np.argsort(-value)[:200]
    scored = top200[:80]  # (10 ms - 2 ms) / 0.1 ms = 80 of the 200 retrieved fit
    ranked = scored[np.argsort(scored, kind="stable")[:20]]
    np.testing.assert_array_equal(final, ranked[np.argsort(-(ranked % 7), kind="stable")[:5]])
    assert [r.scored for r in reports] == [1000, 80, 20]
    assert reports[1].trimmed and not reports[0].trimmed
    assert all(r.latency <= r.budget + 1e-12 for r in reports)
    assert "cut to fit" in rs.report_table(reports)


def test_transfer_time_is_the_books_800_seconds():
    assert rs.transfer_time(100e9, 5, 5e9) == 800.0


def test_update_propagation_priority_is_freshest_and_bandwidth_helps():
    res = {s: rs.simulate_propagation(s, num_rows=2000, ticks=60, bandwidth=3200)
           for s in ("full", "incremental", "priority")}
    assert res["priority"].missed_updates < res["incremental"].missed_updates \
        < res["full"].missed_updates
    assert all(r.bytes_per_tick <= 3200 for r in res.values())
    more = rs.simulate_propagation("incremental", num_rows=2000, ticks=60, bandwidth=12800)
    assert more.stale_reads < res["incremental"].stale_reads
    with pytest.raises(ArgumentError):
        rs.simulate_propagation("gossip")


# --- data ---------------------------------------------------------------------------------------
def test_click_log_is_seeded_zipf_and_has_the_requested_click_rate():
    a = rs.synthetic_click_log(20_000, [500, 50], seed=3)
    b = rs.synthetic_click_log(20_000, [500, 50], seed=3)
    np.testing.assert_array_equal(a.ids[0], b.ids[0])
    np.testing.assert_array_equal(a.labels, b.labels)
    counts = np.bincount(a.ids[0].reshape(-1), minlength=500) / 20_000
    hot = np.argsort(-a.popularity[0])[:10]
    np.testing.assert_allclose(counts[hot], a.popularity[0][hot], rtol=0.15)
    assert 0.15 < a.labels.mean() < 0.4
    assert a.dense.shape == (20_000, 13)


# --- models -------------------------------------------------------------------------------------
def test_dot_interaction_keeps_the_strict_lower_triangle():
    r = np.random.default_rng(0)
    feats = [r.standard_normal((4, 3)) for _ in range(5)]
    got = rs.dot_interaction([ml.tensor(f) for f in feats]).numpy()
    want = [[feats[i][b] @ feats[j][b] for i in range(5) for j in range(i)] for b in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.shape == (4, 10)


def test_dlrm_table_gradients_are_row_sparse_and_training_lowers_the_loss():
    log = rs.synthetic_click_log(2048, [300] * 3, seed=0)
    model = rs.DLRM([300] * 3, dim=8, bottom=(16,), top=(16,), rng=0)
    lazy = ml.optim.SparseAdam(model.embedding_parameters(), lr=0.02)
    adam = ml.optim.Adam(model.dense_parameters(), lr=0.01)
    dense, ids, y = log.batch(np.arange(256))
    first = None
    for _ in range(25):
        loss = rs.bce_with_logits(model(dense, ids), y)
        model.zero_grad()
        loss.backward()
        first = loss.item() if first is None else first
        for table, t in zip(model.embedding_parameters(), ids):
            assert isinstance(table.grad, RowSparse)
            assert set(table.grad.indices.tolist()) == set(t.reshape(-1).tolist())
        lazy.step()
        adam.step()
    assert loss.item() < 0.8 * first
    z = model(dense, ids).numpy()
    assert rs.log_loss(y, rs.models.sigmoid_np(z)) == pytest.approx(
        rs.bce_with_logits(ml.tensor(z), y).item(), rel=1e-4)


@pytest.mark.parametrize("sparse", [True, False])
def test_models_pass_their_sparse_flag_to_every_table(sparse):
    """DLRM and TwoTower default to sparse=True (big tables: a row-sparse gradient, row
    updates); sparse=False gives every table a dense gradient."""
    log = rs.synthetic_click_log(64, [50] * 2, seed=0)
    dense, ids, y = log.batch(np.arange(32))
    kind = RowSparse if sparse else ml.Tensor
    dlrm = rs.DLRM([50] * 2, dim=4, bottom=(8,), top=(8,), sparse=sparse, rng=0)
    rs.bce_with_logits(dlrm(dense, ids), y).backward()
    assert [type(t.grad) for t in dlrm.embedding_parameters()] == [kind, kind]
    towers = rs.TwoTower(10, 20, dim=4, out=4, sparse=sparse, rng=0)
    towers.in_batch_loss(np.array([1, 2, 3]), np.array([4, 4, 9])).backward()
    assert [type(t.grad) for t in towers.embedding_parameters()] == [kind, kind]
    assert [t.sparse for t in (*dlrm.tables, towers.user_emb, towers.item_emb)] == [sparse] * 4
    ps = rs.ShardedTables([t.numpy() for t in dlrm.embedding_parameters()], 2, "row")
    if sparse:  # a parameter server takes the touched rows
        ps.push(0, dlrm.embedding_parameters()[0].grad, lr=0.1)
        assert ps.bytes_pushed > 0
    else:  # and refuses a dense table, naming the flag that gives the rows
        with pytest.raises(ShapeError, match="sparse=True"):
            ps.push(0, dlrm.embedding_parameters()[0].grad, lr=0.1)
    assert rs.DLRM([5], dim=2, bottom=(), top=()).tables[0].sparse is True  # the default


def test_dlrm_shapes_match_the_books_configuration():
    model = rs.DLRM([100] * 8, dim=16, bottom=(64,), top=(64, 32), rng=0)
    assert [p.shape for p in model.bottom.parameters()] == [(13, 64), (64,), (64, 16), (16,)]
    assert model.top[0].weight.shape == (16 + 36, 64)  # 9 features: 36 pairs below the diagonal
    out = model(np.zeros((5, 13), np.float32), [np.zeros((5, 1), np.int64)] * 8)
    assert out.shape == (5,)
    with pytest.raises(ArgumentError):
        model(np.zeros((5, 13)), [np.zeros((5, 1), np.int64)] * 7)


def test_two_tower_in_batch_loss_and_retrieval():
    model = rs.TwoTower(20, 30, dim=8, out=4, temperature=0.5, rng=0)
    users, items = np.array([0, 3, 5]), np.array([2, 2, 7])
    with ml.no_grad():
        u, v = model.users(users).numpy(), model.items(items).numpy()
    logits = u @ v.T / 0.5
    want = np.mean(np.log(np.exp(logits).sum(1)) - np.diag(logits))
    assert model.in_batch_loss(users, items).item() == pytest.approx(want, rel=1e-5)
    top = model.retrieve(users, 4, exclude=[{0}, set(), set()])
    with ml.no_grad():
        scores = model.users(users).numpy() @ model.items(np.arange(30)).numpy().T
    scores[0, 0] = -np.inf
    np.testing.assert_array_equal(top, np.argsort(-scores, axis=1, kind="stable")[:, :4])


def _train_two_tower(data, log_q):
    model = rs.TwoTower(200, 300, dim=16, out=16, temperature=0.2, rng=0)
    lazy = ml.optim.SparseAdam(model.embedding_parameters(), lr=0.05)
    adam = ml.optim.Adam(model.dense_parameters(), lr=0.01)
    r = np.random.default_rng(0)
    for _ in range(150):
        batch = data.train[r.integers(0, len(data.train), 128)]
        loss = model.in_batch_loss(batch[:, 0], batch[:, 1], log_q)
        model.zero_grad()
        loss.backward()
        lazy.step()
        adam.step()
    seen = [set() for _ in range(200)]
    for user, item in data.train:
        seen[user].add(int(item))
    return rs.mean_recall_at_k(model.retrieve(np.arange(200), 20, exclude=seen), data.test, 20)


def test_two_tower_with_logq_correction_beats_random_and_uncorrected_recall():
    data = rs.synthetic_interactions(num_users=200, num_items=300, per_user=15, held_out=5,
                                     seed=0)
    freq = np.bincount(data.train[:, 1], minlength=300) + 1
    corrected = _train_two_tower(data, np.log(freq / freq.sum()))
    plain = _train_two_tower(data, None)
    assert corrected > 3 * 20 / 300  # random retrieval gets about k / items
    assert corrected > 2 * plain  # in-batch negatives alone push the popular items down


# the labels and picks the generators drew before they exposed their hidden models (committed
# from that code): the random streams must not move. Labels of
# synthetic_click_log(96, [50, 20], bag_size=2, seed=5):
_OLD_CLICK_LABELS = ("011100000001010000010000000010011001000110001000"
                     "000010001010010100010010001110000000001110100000")
_OLD_PICKS = [18, 9, 30, 31, 10, 35, 31, 30, 24, 6, 2, 30, 30, 35, 18, 2, 6, 17, 30, 18, 39, 7,
              33, 30]  # synthetic_interactions(6 users, 40 items, 4 + 2 picks each, seed=5)
_OLD_HELD_OUT = [{5, 25}, {18, 23}, {9, 39}, {9, 20}, {11, 24}, {18, 24}]


def _click_log_rederived(num_samples, table_sizes, bag_size, seed, num_dense=13, skew=1.05,
                         ctr=0.25, hidden_dim=4):
    """The generator's stream drawn again step by step: (labels, click probabilities)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((num_samples, num_dense))
    logit = dense.astype(np.float32) @ (rng.standard_normal(num_dense) * 0.5 / np.sqrt(num_dense))
    vecs = []
    for size in table_sizes:
        p = 1.0 / np.arange(1, size + 1) ** skew
        cdf = np.cumsum(p / p.sum())
        cdf[-1] = 1.0
        perm = rng.permutation(size)
        t = perm[np.searchsorted(cdf, rng.random(num_samples * bag_size), side="right")]
        t = t.reshape(num_samples, bag_size)
        bias = rng.standard_normal(size) * 0.5
        vec = rng.standard_normal((size, hidden_dim)) * 0.5
        logit = logit + bias[t].mean(1)
        vecs.append(vec[t].mean(1))
    for a in range(len(vecs)):
        for b in range(a):
            logit = logit + np.sum(vecs[a] * vecs[b], axis=1)
    logit = logit - np.quantile(logit, 1 - ctr)
    prob = 1 / (1 + np.exp(-2 * logit))
    return (rng.random(num_samples) < prob).astype(np.float32), prob


def test_click_log_probabilities_are_the_hidden_model_and_the_labels_did_not_move():
    log = rs.synthetic_click_log(96, [50, 20], bag_size=2, seed=5)
    assert "".join(str(int(x)) for x in log.labels) == _OLD_CLICK_LABELS
    labels, prob = _click_log_rederived(3000, [200, 40, 7], bag_size=2, seed=11)
    log = rs.synthetic_click_log(3000, [200, 40, 7], bag_size=2, seed=11)
    np.testing.assert_array_equal(log.labels, labels)
    np.testing.assert_allclose(log.probability, prob, rtol=1e-12)
    assert log.probability.shape == (3000,) and log.probability.dtype == np.float64
    d, ids, y = log.batch(np.arange(5))  # batch() is unchanged: three fields
    assert d.shape == (5, 13) and len(ids) == 3 and y.shape == (5,)
    assert rs.ClickLog(log.dense, log.ids, log.labels, log.popularity).probability is None


def test_click_log_labels_are_calibrated_to_its_probabilities():
    log = rs.synthetic_click_log(100_000, [1000, 100], seed=2)
    p, y = log.probability, log.labels
    edges = np.quantile(p, np.linspace(0, 1, 11))
    bins = np.clip(np.searchsorted(edges, p, side="right") - 1, 0, 9)
    for b in range(10):
        pb, yb = p[bins == b], y[bins == b]
        sigma = np.sqrt(np.sum(pb * (1 - pb))) / pb.size  # std of the bin's click rate
        assert abs(yb.mean() - pb.mean()) < 5 * sigma + 1e-3, (b, yb.mean(), pb.mean())
    # the hidden model is much better than a constant, and a doubled logit is not it
    assert rs.log_loss(y, p) < 0.8 * rs.log_loss(y, np.full(y.size, y.mean()))
    z = np.log(p / (1 - p))
    assert rs.log_loss(y, p) < rs.log_loss(y, rs.models.sigmoid_np(2 * z))


def test_interactions_expose_the_hidden_model_without_moving_the_stream():
    data = rs.synthetic_interactions(num_users=6, num_items=40, per_user=4, held_out=2, seed=5)
    assert data.train[:, 1].tolist() == _OLD_PICKS
    assert data.test == _OLD_HELD_OUT
    assert data.user_vectors.shape == (6, 8) and data.item_vectors.shape == (40, 8)
    np.testing.assert_allclose(np.linalg.norm(data.item_vectors, axis=1), 1.0)
    assert data.temperature == 0.5
    with pytest.raises(ArgumentError, match="hidden_scores"):
        rs.Interactions(6, 40, data.train, data.test, data.popularity).hidden_scores([0])


def test_hidden_scores_give_the_law_of_each_users_first_pick():
    # per_user=1: a user's training pick is one draw from softmax(hidden_scores[user])
    data = rs.synthetic_interactions(num_users=6000, num_items=12, per_user=1, held_out=1,
                                     dim=3, temperature=0.4, seed=3)
    pick = data.train[:, 1]

    def softmax(scores):
        e = np.exp(scores - scores.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)

    def worst_z(scores):  # each item's count of picks against its expected count
        exp = softmax(scores).sum(0)
        return np.max(np.abs(np.bincount(pick, minlength=12) - exp) / np.sqrt(exp))

    def log_likelihood(scores):
        return np.mean(np.log(softmax(scores)[np.arange(6000), pick]))

    scores = data.hidden_scores(np.arange(6000))
    u, v, log_pop = data.user_vectors, data.item_vectors, np.log(data.popularity)
    assert worst_z(scores) < 4
    assert worst_z(np.tile(log_pop, (6000, 1))) > 8  # popularity alone is not the law
    assert worst_z(u @ v.T / 0.4) > 8  # nor the affinity alone
    # the picks are likeliest under the generator's own temperature and popularity weight
    for wrong in (u @ v.T / 0.3 + log_pop, u @ v.T / 0.5 + log_pop,
                  u @ v.T / 0.4 + 0.8 * log_pop, u @ v.T / 0.4 + 1.2 * log_pop):
        assert log_likelihood(scores) > log_likelihood(wrong) + 0.003


def _brute_force_top(scores, exclude, k):
    scores = scores.copy()
    for i, seen in enumerate(exclude):
        scores[i, sorted(seen)] = -np.inf
    return np.argsort(-scores, axis=1, kind="stable")[:, :k]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 31), st.integers(1, 25), st.booleans())
def test_retrieve_with_a_prior_is_the_brute_force_ranking_of_logits_plus_prior(seed, k, ties):
    r = np.random.default_rng(seed)
    model = rs.TwoTower(7, 25, dim=4, out=3, temperature=0.3, rng=seed % 1000)
    if ties:  # identical item vectors and a prior of few values: exactly equal scores
        model.item_emb.weight.data[5:9] = model.item_emb.weight.data[4]
        model.item_emb.weight.data[17] = model.item_emb.weight.data[4]
        prior = r.integers(-2, 1, 25).astype(float)
    else:
        prior = r.normal(0, 2, 25)
    users = r.integers(0, 7, 5)
    exclude = [set(r.choice(25, int(r.integers(0, 4)), replace=False).tolist()) for _ in users]
    with ml.no_grad():
        u, v = model.users(users).numpy(), model.items(np.arange(25)).numpy()
    got = model.retrieve(users, k, exclude=exclude, prior=prior)
    np.testing.assert_array_equal(got, _brute_force_top((u @ v.T) / 0.3 + prior, exclude, k))
    np.testing.assert_array_equal(model.retrieve(users, k, exclude=exclude),
                                  _brute_force_top(u @ v.T, exclude, k))


def test_retrieve_prior_changes_the_ranking_in_the_logits_scale():
    model = rs.TwoTower(3, 10, dim=4, out=4, temperature=0.25, rng=1)
    with ml.no_grad():
        s = model.users([0]).numpy() @ model.items(np.arange(10)).numpy().T
    order = np.argsort(-s[0], kind="stable")
    best, second = order[0], order[1]
    gap = (s[0, best] - s[0, second]) / 0.25  # the logits' gap between the two best items
    prior = np.zeros(10)
    prior[second] = 1.01 * gap  # just enough, in the logits' scale, to swap them
    assert model.retrieve([0], 2, prior=prior)[0].tolist() == [second, best]
    prior[second] = 0.99 * gap
    assert model.retrieve([0], 2, prior=prior)[0].tolist() == [best, second]


def test_retrieve_refuses_a_bad_prior_or_k():
    model = rs.TwoTower(3, 10, dim=4, out=4, rng=0)
    with pytest.raises(ShapeError, match=r"retrieve.*\(9,\).*\(10,\)"):
        model.retrieve([0], 2, prior=np.zeros(9))
    with pytest.raises(ShapeError, match=r"retrieve.*\(1, 10\)"):
        model.retrieve([0], 2, prior=np.zeros((1, 10)))
    with pytest.raises(ArgumentError, match="retrieve.*finite"):
        model.retrieve([0], 2, prior=np.r_[np.zeros(9), np.nan])
    with pytest.raises(ArgumentError, match="retrieve.*k=11"):
        model.retrieve([0], 11)
