"""Collectives on the simulator: values against numpy for random p, sizes and dtypes; simulated
time against the alpha-beta formulas; nccl-tests' bandwidth factors; clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.distributed import collectives as coll
from mlsys_lab.distributed import cost, sim
from mlsys_lab.errors import ArgumentError, ShapeError

A, B = 5e-6, 1 / 25e9
DTYPES = ["float32", "float64", "int32", "int64"]
UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
ROOTED = ("broadcast", "reduce", "gather", "scatter")


def call(comm, x, kind, algo, op="sum", root=0, segments=1):
    fn = getattr(coll, kind)
    if kind == "allreduce":
        return (yield from fn(comm, x, op=op, algo=algo, segments=segments))
    if kind == "reduce_scatter":
        return (yield from fn(comm, x, op=op, algo=algo))
    if kind == "reduce":
        return (yield from fn(comm, x, root=root, op=op, algo=algo))
    if kind == "broadcast":
        return (yield from fn(comm, x, root=root, algo=algo, segments=segments))
    if kind in ("gather", "scatter"):
        return (yield from fn(comm, x, root=root, algo=algo))
    return (yield from fn(comm, x, algo=algo))


def simulate(kind, xs, algo, topo=None, **kw):
    p = len(xs)
    topo = topo or sim.fully_connected(p, A, B)
    return sim.run(sim.Cluster(topo), call, args=[(x, kind, algo) for x in xs], kwargs=kw)


def data(rng, p, n, dtype, op):
    if np.dtype(dtype).kind == "i":
        high = 3 if op == "prod" else 1000
        return [rng.integers(-high, high, n).astype(dtype) for _ in range(p)]
    scale = 1.0 if op == "prod" else 100.0
    return [(rng.standard_normal(n) * scale).astype(dtype) for _ in range(p)]


def assert_reduced(got, xs, op):
    expect = UFUNC[op].reduce(np.stack(xs), axis=0, dtype=xs[0].dtype)
    assert got.dtype == xs[0].dtype and got.shape == xs[0].shape
    if xs[0].dtype.kind == "i" or op in ("max", "min"):
        np.testing.assert_array_equal(got, expect)
    else:
        tol = 1e-4 if xs[0].dtype == np.float32 else 1e-10
        np.testing.assert_allclose(got, expect, rtol=tol, atol=tol * len(xs) * 100)


ranks = st.one_of(st.integers(1, 9), st.integers(10, 64))
sizes = st.one_of(st.just(0), st.integers(1, 9), st.integers(10, 130))


def algo_for(kind, p, draw):
    algos = [a for a in coll.ALGORITHMS[kind]
             if p & (p - 1) == 0 or a not in ("recursive_halving", "recursive_doubling")
             or kind == "allreduce"]
    return draw(st.sampled_from(algos))


@settings(max_examples=40, deadline=None)
@given(st.data(), ranks, sizes, st.sampled_from(DTYPES), st.sampled_from(sorted(UFUNC)))
def test_allreduce_equals_numpy(draw, p, n, dtype, op):
    algo = algo_for("allreduce", p, draw.draw)
    segments = draw.draw(st.integers(1, 3))
    xs = data(np.random.default_rng(p * 1000 + n), p, n, dtype, op)
    res = simulate("allreduce", xs, algo, op=op, segments=segments)
    for got in res.results:
        assert_reduced(got, xs, op)
    assert all(np.array_equal(res.results[0], r) for r in res.results)  # one value everywhere


@settings(max_examples=40, deadline=None)
@given(st.data(), ranks, sizes, st.sampled_from(DTYPES), st.sampled_from(sorted(UFUNC)))
def test_reduce_scatter_and_reduce_equal_numpy(draw, p, n, dtype, op):
    xs = data(np.random.default_rng(n * 7 + p), p, n, dtype, op)
    algo = algo_for("reduce_scatter", p, draw.draw)
    res = simulate("reduce_scatter", xs, algo, op=op)
    whole = np.concatenate(res.results)
    assert_reduced(whole, xs, op)
    assert [len(b) for b in res.results] == [b - a for a, b in coll.block_bounds(n, p)]
    root = draw.draw(st.integers(0, p - 1))
    algo = draw.draw(st.sampled_from(coll.ALGORITHMS["reduce"]))
    res = simulate("reduce", xs, algo, op=op, root=root)
    assert_reduced(res.results[root], xs, op)
    assert all(r is None for i, r in enumerate(res.results) if i != root)


@settings(max_examples=40, deadline=None)
@given(st.data(), ranks, st.integers(0, 12), st.sampled_from(DTYPES))
def test_data_movement_collectives_equal_numpy(draw, p, rows, dtype):
    rng = np.random.default_rng(p + 31 * rows)
    xs = [rng.integers(-99, 99, (rows, 3)).astype(dtype) for _ in range(p)]
    root = draw.draw(st.integers(0, p - 1))
    whole = np.concatenate(xs)
    algo = algo_for("allgather", p, draw.draw)
    for got in simulate("allgather", xs, algo).results:
        np.testing.assert_array_equal(got, whole)
    algo = draw.draw(st.sampled_from(coll.ALGORITHMS["gather"]))
    res = simulate("gather", xs, algo, root=root)
    np.testing.assert_array_equal(res.results[root], whole)
    algo = draw.draw(st.sampled_from(coll.ALGORITHMS["broadcast"]))
    res = simulate("broadcast", xs, algo, root=root, segments=draw.draw(st.integers(1, 3)))
    for got in res.results:
        np.testing.assert_array_equal(got, xs[root])
    res = simulate("alltoall", xs, draw.draw(st.sampled_from(coll.ALGORITHMS["alltoall"])))
    bounds = coll.block_bounds(rows, p)
    for r, got in enumerate(res.results):
        a, b = bounds[r]
        np.testing.assert_array_equal(got, np.concatenate([x[a:b] for x in xs]))
    big = np.concatenate([xs[root]] * p)  # divisible by p for the binomial scatter
    algo = draw.draw(st.sampled_from(coll.ALGORITHMS["scatter"]))
    scattered = simulate("scatter", [big if r == root else None for r in range(p)], algo,
                         root=root).results
    for r, got in enumerate(scattered):
        a, b = coll.block_bounds(len(big), p)[r]
        np.testing.assert_array_equal(got, big[a:b])


def test_alltoall_direct_and_uneven_blocks():
    p = 5
    xs = [np.arange(r * 100, r * 100 + 7) for r in range(p)]  # 7 rows over 5 ranks
    for algo in coll.ALGORITHMS["alltoall"]:
        res = simulate("alltoall", xs, algo)
        for r, got in enumerate(res.results):
            a, b = coll.block_bounds(7, p)[r]
            np.testing.assert_array_equal(got, np.concatenate([x[a:b] for x in xs]))


def test_the_books_allreduce_example():
    xs = [np.array([2, 4, 6]), np.array([1, 2, 3]), np.array([4, 8, 12])]
    for algo in coll.ALGORITHMS["allreduce"]:
        for got in simulate("allreduce", xs, algo).results:
            np.testing.assert_array_equal(got, [7, 14, 21])


def test_zero_d_and_shapes_are_kept():
    xs = [np.float64(r) * np.ones(()) for r in range(4)]
    for algo in coll.ALGORITHMS["allreduce"]:
        assert all(g.shape == () and g == 6 for g in simulate("allreduce", xs, algo).results)
    xs = [np.ones((2, 3, 4)) * r for r in range(3)]
    assert simulate("allreduce", xs, "ring").results[1].shape == (2, 3, 4)
    for algo in coll.ALGORITHMS["broadcast"]:
        assert all(g.shape == (2, 3, 4) for g in simulate("broadcast", xs, algo).results)


def exact_cases():
    ring_topology = {"ring": ("allreduce", "reduce_scatter", "allgather", "broadcast")}
    for kind, algos in coll.ALGORITHMS.items():
        for algo in algos:
            on_ring = algo == "ring" and kind in ring_topology["ring"]
            segments = [1, 4] if algo in ("tree", "double_tree") or (
                kind == "broadcast" and algo == "ring") else [1]
            for seg in segments:
                yield kind, algo, seg, on_ring


@pytest.mark.parametrize("p", [4, 16])
@pytest.mark.parametrize("kind, algo, segments, on_ring", list(exact_cases()))
def test_simulated_time_equals_the_formula(kind, algo, segments, on_ring, p):
    n = p * 4096  # bytes, divisible by p and by the segments
    per_rank = n // 8 // p if kind in ("allgather", "gather") else n // 8
    xs = [np.ones(per_rank) for _ in range(p)]
    if kind == "scatter":
        xs = [np.ones(n // 8) if r == 0 else None for r in range(p)]
    topo = sim.ring(p, A, B) if on_ring else sim.fully_connected(p, A, B)
    res = sim.run(sim.Cluster(topo), call, args=[(x, kind, algo) for x in xs],
                  kwargs={"segments": segments} if kind in ("allreduce", "broadcast") else {})
    formula = cost.collective_time(kind, algo, p, n, A, B, segments=segments)
    assert res.time == pytest.approx(formula, rel=0.01)


def test_ring_allreduce_on_a_ring_is_exact_for_many_p():
    for p in (2, 3, 5, 12, 31):
        n = p * 1000 * 4
        res = simulate("allreduce", [np.ones(n // 4, np.float32)] * p, "ring",
                       topo=sim.ring(p, A, B))
        assert res.time == pytest.approx(2 * (p - 1) * (A + n / p * B), rel=1e-9)


def test_contention_makes_non_neighbour_algorithms_slower_on_a_ring():
    p, n = 16, 1 << 20
    xs = [np.ones(n // 8)] * p
    on_ring = simulate("allreduce", xs, "recursive_doubling", topo=sim.ring(p, A, B)).time
    formula = cost.collective_time("allreduce", "recursive_doubling", p, n, A, B)
    assert on_ring > 1.5 * formula  # partners 4 and 8 apart share the ring's links


def test_bus_bandwidth_factors_follow_nccl_tests():
    p, n, t = 8, 1 << 30, 0.5
    assert cost.algbw(n, t) == n / t
    assert cost.busbw("allreduce", n, t, p) == pytest.approx(n / t * 2 * 7 / 8)
    for kind in ("reduce_scatter", "allgather", "alltoall"):
        assert cost.busbw(kind, n, t, p) == pytest.approx(n / t * 7 / 8)
    for kind in ("broadcast", "reduce"):
        assert cost.busbw(kind, n, t, p) == pytest.approx(n / t)
    # the ring all-reduce's busbw is the link bandwidth as n grows: what the factor is for
    ring = cost.collective_time("allreduce", "ring", p, n, 0.0, 1 / 25e9)
    assert cost.busbw("allreduce", n, ring, p) == pytest.approx(25e9)


def test_best_algorithm_switches_with_message_size():
    assert cost.best_algorithm("allreduce", 64, 1024, 5e-6, 1 / 25e9)[0] in (
        "recursive_doubling", "rabenseifner", "tree", "double_tree")
    assert cost.best_algorithm("allreduce", 64, 1 << 30, 5e-6, 1 / 25e9)[0] in (
        "ring", "rabenseifner")
    assert cost.collective_time("allreduce", "ring", 1, 100, A, B) == 0.0


@pytest.mark.parametrize("call_with, error, match", [
    (dict(kind="allreduce", algo="butterfly"), ArgumentError, "algo='butterfly'"),
    (dict(kind="allreduce", algo="ring", op="mean"), ArgumentError, "op='mean'"),
    (dict(kind="reduce_scatter", algo="recursive_halving"), ArgumentError, "power-of-two"),
    (dict(kind="allgather", algo="recursive_doubling"), ArgumentError, "power-of-two"),
    (dict(kind="broadcast", algo="binomial", root=7), ArgumentError, "root=7"),
    (dict(kind="allreduce", algo="tree", segments=0), ArgumentError, "segments=0"),
])
def test_bad_collective_arguments(call_with, error, match):
    kind = call_with.pop("kind")
    algo = call_with.pop("algo")
    with pytest.raises(error, match=match):
        simulate(kind, [np.ones(6)] * 3, algo, **call_with)


@pytest.mark.parametrize("algo", coll.ALGORITHMS["allreduce"])
def test_mismatched_shapes_are_shape_errors_for_every_allreduce(algo):
    xs = [np.ones(8), np.ones(8), np.ones(8), np.ones(5)]
    with pytest.raises(ShapeError):
        simulate("allreduce", xs, algo)


def test_equal_shape_algorithms_name_the_alternative():
    xs = [np.ones((2, 2)), np.ones((3, 2)), np.ones((2, 2)), np.ones((2, 2))]
    with pytest.raises(ShapeError, match="algo='ring'"):
        simulate("allgather", xs, "recursive_doubling")
    with pytest.raises(ShapeError, match="algo='direct'"):
        simulate("gather", xs, "binomial")
    got = simulate("allgather", xs, "ring").results[0]  # the ring handles unequal rows
    assert got.shape == (9, 2)
    with pytest.raises(ArgumentError, match="divisible"):
        simulate("scatter", [np.ones(7), None, None], "binomial")
    with pytest.raises(ArgumentError, match="None"):
        simulate("allreduce", [None, np.ones(2)], "ring")


def test_tree_links_are_complementary_trees():
    for p in (2, 7, 8, 33):
        trees = coll.tree_links(p, "double_tree")
        for parent, children, root, height, depth in trees:
            assert parent[root] is None and sum(pa is None for pa in parent) == 1
            assert all(len(kids) <= 2 for kids in children)
            for r in range(p):  # every rank hangs below the root, at its depth
                assert all(parent[k] == r for k in children[r])
                node, steps = r, 0
                while parent[node] is not None:
                    node, steps = parent[node], steps + 1
                assert node == root and steps == depth[r]
            assert max(depth) <= p.bit_length() and height[root] == max(depth)
        if p % 2 == 0:
            inner = [{r for r in range(p) if t[1][r]} for t in trees]
            assert not inner[0] & inner[1]  # no rank is an inner node of both trees


def test_barrier_takes_log_p_rounds():
    p = 8
    res = sim.run(sim.Cluster(sim.fully_connected(p, A, B)), coll.barrier)
    assert res.time == pytest.approx(3 * A)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_every_algorithm_at_p64_with_a_size_p_does_not_divide(dtype):
    p, n = 64, 130
    rng = np.random.default_rng(64)
    xs = data(rng, p, n, dtype, "sum")
    for algo in coll.ALGORITHMS["allreduce"]:
        for got in simulate("allreduce", xs, algo, segments=2).results:
            assert_reduced(got, xs, "sum")
    for algo in coll.ALGORITHMS["reduce_scatter"]:
        assert_reduced(np.concatenate(simulate("reduce_scatter", xs, algo).results), xs, "sum")
    for algo in coll.ALGORITHMS["allgather"]:
        for got in simulate("allgather", xs, algo).results:
            np.testing.assert_array_equal(got, np.concatenate(xs))
    for algo in coll.ALGORITHMS["broadcast"]:
        for got in simulate("broadcast", xs, algo, root=37).results:
            np.testing.assert_array_equal(got, xs[37])


@pytest.mark.parametrize("p", [1, 2, 3, 5, 6, 8, 13])
def test_binomial_tree_is_the_lowest_set_bit_tree(p):
    """Parent = v minus its lowest set bit; children below that bit; spans tile the ranks."""
    from mlsys_lab.distributed.collectives import binomial_tree, tree_links

    parent, children, span = binomial_tree(p)
    for v in range(1, p):
        assert parent[v] == v - (v & -v)
        assert v in children[parent[v]]
    assert parent[0] is None and span[0] == p
    for v in range(p):
        assert children[v] == sorted(children[v])
        assert span[v] == 1 + sum(span[c] for c in children[v])
        covered = [v] + [u for c in children[v] for u in range(c, c + span[c])]
        assert covered == list(range(v, v + span[v]))
    (pa, ch, root, height, depth), = tree_links(p, "binomial")
    assert (pa, ch, root) == (parent, children, 0)
    assert len(children[0]) == (p - 1).bit_length()  # the root sends ceil(log2 p) times
    assert max(depth) == max(bin(v).count("1") for v in range(p))


# --- the alpha-beta-gamma model: reductions cost gamma seconds per byte ---------------------
RING_KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast")
REDUCING = ("allreduce", "reduce_scatter", "reduce")


def gamma_case(rng):
    """A random case where the formula is exact (cost's docstring): ring algorithms on a ring,
    the rest fully connected; p a power of two where the algorithm or the binomial tree
    without the one-port model needs it; sizes that split evenly; no one-port trees."""
    while True:
        kind = str(rng.choice(list(coll.ALGORITHMS)))
        algo = str(rng.choice(coll.ALGORITHMS[kind]))
        one_port = bool(rng.integers(2))
        p = int(rng.choice([2, 3, 4, 5, 6, 7, 8, 12, 16]))
        pow2 = p & (p - 1) == 0
        if one_port and algo in ("tree", "double_tree"):
            continue
        if not pow2 and (algo in ("recursive_halving", "recursive_doubling") and
                         kind != "allreduce" or
                         algo == "binomial" and (not one_port or kind == "reduce")):
            continue
        segments = int(rng.integers(1, 5)) if algo in ("tree", "double_tree") or (
            kind == "broadcast" and algo == "ring") else 1
        n = 8 * p * 16 * segments * int(rng.integers(1, 40))  # bytes; float64 elements
        alpha, beta = float(rng.uniform(0, 2e-5)), float(rng.uniform(0, 2e-9))
        gamma = float(rng.uniform(0, 4e-9))
        return kind, algo, one_port, p, segments, n, alpha, beta, gamma


def simulate_case(kind, algo, one_port, p, segments, n, alpha, beta, gamma):
    per_rank = n // 8 // p if kind in ("allgather", "gather") else n // 8
    xs = [np.full(per_rank, r + 1.0) for r in range(p)]
    if kind == "scatter" or (kind == "broadcast" and algo != "scatter_allgather"):
        xs = [x if r == 0 else None for r, x in enumerate(xs)]
    if kind == "scatter":
        xs[0] = np.ones(n // 8)
    make = sim.ring if algo == "ring" and kind in RING_KINDS else sim.fully_connected
    topo = make(p, alpha, beta, gamma=gamma)
    return sim.run(sim.Cluster(topo, one_port=one_port), call,
                   args=[(x, kind, algo) for x in xs],
                   kwargs={"segments": segments} if kind in ("allreduce", "broadcast") else {})


def test_simulated_time_equals_the_alpha_beta_gamma_formula():
    """Over many random cases and both port models: a reduction costs gamma per byte on the
    rank that combines, and the formulas' gamma terms say exactly how much shows."""
    rng = np.random.default_rng(2005)
    seen = set()
    for _ in range(160):
        case = gamma_case(rng)
        kind, algo, one_port, p, segments, n, alpha, beta, gamma = case
        res = simulate_case(*case)
        want = cost.collective_time(kind, algo, p, n, alpha, beta, segments=segments,
                                    one_port=one_port, gamma=gamma)
        assert res.time == pytest.approx(want, rel=1e-9, abs=1e-15), case
        computes = [e for e in res.trace if e.kind == "compute"]
        assert bool(computes) == (kind in REDUCING and gamma > 0), case  # only reductions pay
        seen.add((kind, algo, one_port))
    assert len(seen) > 25  # the random cases reached most algorithms in both port models


@pytest.mark.parametrize("one_port", [False, True])
def test_gamma_terms_are_thakurs(one_port):
    """The classic alpha-beta-gamma costs (Thakur, Rabenseifner, Gropp 2005), written out."""
    a, b, g, p, n = 3e-6, 1e-9, 5e-10, 8, 8 * 8 * 1024
    lg = 3
    want = {
        ("allreduce", "ring"): 2 * (p - 1) * a + 2 * (p - 1) / p * n * b + (p - 1) / p * n * g,
        ("allreduce", "recursive_doubling"): lg * (a + n * b + n * g),
        ("allreduce", "rabenseifner"): 2 * lg * a + 2 * (p - 1) / p * n * b
        + (p - 1) / p * n * g,
        ("reduce_scatter", "ring"): (p - 1) * a + (p - 1) / p * n * (b + g),
        ("reduce_scatter", "recursive_halving"): lg * a + (p - 1) / p * n * (b + g),
        ("reduce", "binomial"): lg * (a + n * b + n * g),
    }
    for (kind, algo), t in want.items():
        assert cost.collective_time(kind, algo, p, n, a, b, one_port=one_port, gamma=g) == \
            pytest.approx(t, rel=1e-12)
        case = (kind, algo, one_port, p, 1, n, a, b, g)
        assert simulate_case(*case).time == pytest.approx(t, rel=1e-9)
    # gamma=0 is the alpha-beta cost, and data-movement collectives never pay gamma
    for kind, algos in coll.ALGORITHMS.items():
        for algo in algos:
            if one_port and algo in ("tree", "double_tree"):
                continue
            base = cost.collective_time(kind, algo, p, n, a, b, one_port=one_port)
            assert cost.collective_time(kind, algo, p, n, a, b, one_port=one_port,
                                        gamma=0.0) == base
            more = cost.collective_time(kind, algo, p, n, a, b, one_port=one_port, gamma=g)
            assert (more > base) == (kind in REDUCING), (kind, algo)


def test_gamma_is_compute_on_the_rank_that_reduces():
    p, n = 4, 8 * 1000
    g = 1e-9
    res = simulate_case("reduce", "binomial", False, p, 1, n, 0.0, 0.0, g)
    spans = sorted((e.rank, e.end - e.start) for e in res.trace if e.kind == "compute")
    # rank 0 combines children 1 and 2, rank 2 combines child 3; leaves never reduce
    assert [r for r, _ in spans] == [0, 0, 2]
    assert all(t == pytest.approx(n * g) for _, t in spans)
    assert res.time == pytest.approx(2 * n * g)
    topo = sim.fully_connected(p, 0.0, 0.0)
    topo.set_device(2, gamma=g)  # one slow reducer: only its own combine costs
    slow = sim.run(sim.Cluster(topo), call, args=[(np.ones(n // 8), "reduce", "binomial")] * p)
    assert slow.time == pytest.approx(n * g) and topo.devices[0].gamma == 0.0
    with pytest.raises(ArgumentError, match="gamma"):
        sim.ring(4, gamma=-1.0)
    with pytest.raises(ArgumentError, match="gamma"):
        cost.collective_time("allreduce", "ring", 4, 100, A, B, gamma=-1.0)
