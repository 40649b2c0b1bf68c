"""Checks for chapter 7, the compiler backend and runtime
(``solutions/ch07_compiler_backend_runtime.ipynb``).

7.1 a greedy-by-size memory planner, scored by ``memory.verify`` and by its arena against the lower
bound on seeded random lifetime sets; 7.2 a transpose-cancelling pass over the Graph IR, compared
with the package's pass on seeded random traced graphs; 7.3 a parallel list scheduler, checked for
dependency order, per-worker overlap and makespan against a reference list scheduler; 7.4 a complete
FP16 decoder, compared with numpy on all 65536 bit patterns.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from mlsys_lab.grading.checks import Case, Exercise, register

# ----------------------------------------------------------------------------- 7.1 planner


def _random_lifetimes(seed, n=None):
    """A seeded random set of lifetimes, shaped like a network's activations: mostly short-lived,
    a few long-lived, sizes spread over two orders of magnitude (multiples of 64 bytes)."""
    from mlsys_lab.engine.memory import Lifetime

    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(15, 60)) if n is None else n
    steps = max(4, n // 2)
    recs = []
    for i in range(n):
        start = int(rng.integers(0, steps))
        span = int(rng.geometric(0.35)) - 1 if rng.random() < 0.85 else int(rng.integers(0, steps))
        size = 64 * int(rng.choice([1, 2, 4, 8, 16, 32, 64, 128])) * int(rng.integers(1, 4))
        recs.append(Lifetime(f"t{i}", size, start, min(steps, start + span)))
    return recs


def _book_lifetimes():
    from mlsys_lab.engine.memory import Lifetime

    mib = 1 << 20
    return [Lifetime("T0", 4 * mib, 0, 2), Lifetime("T1", 2 * mib, 1, 3),
            Lifetime("T2", 3 * mib, 2, 4), Lifetime("T3", 1 * mib, 0, 6),
            Lifetime("T4", 4 * mib, 3, 5), Lifetime("T5", 2 * mib, 4, 6),
            Lifetime("T6", 3 * mib, 5, 6)]


def _plan_of(greedy_by_size, recs, what):
    """Run the student's planner; check the shape of its answer; return (offsets, arena)."""
    from mlsys_lab.engine import memory
    from mlsys_lab.errors import GraphError

    before = list(recs)
    offsets = greedy_by_size(recs)
    if list(recs) != before:
        raise AssertionError(f"{what}: greedy_by_size changed (reordered) its input list; "
                             "sort a copy instead")
    if not isinstance(offsets, dict):
        raise AssertionError(f"{what}: greedy_by_size should return a dict id -> offset, got "
                             f"{type(offsets).__name__}")
    missing = [r.id for r in recs if r.id not in offsets]
    if missing:
        raise AssertionError(f"{what}: no offset for {missing[:3]} (every tensor needs one)")
    for r in recs:
        o = offsets[r.id]
        if isinstance(o, bool) or not isinstance(o, numbers.Integral) or o < 0:
            raise AssertionError(f"{what}: the offset of {r.id!r} is {o!r}; offsets are "
                                 "non-negative ints")
    arena = max((int(offsets[r.id]) + r.size for r in recs), default=0)
    plan = memory.MemoryPlan({r.id: int(offsets[r.id]) for r in recs}, arena, "yours", 1)
    try:
        memory.verify(plan, recs)
    except GraphError as e:
        raise AssertionError(f"{what}: {e}") from None
    return offsets, arena


def _gbs_book(greedy_by_size):
    recs = _book_lifetimes()
    _, arena = _plan_of(greedy_by_size, recs, "the 7-tensor example")
    if arena > 10 << 20:
        raise AssertionError(f"the 7-tensor example: your arena is {arena:,} B; greedy by size "
                             f"fits all seven in the 10 MiB (10,485,760 B) the lower bound allows")


def _gbs_valid(greedy_by_size):
    for seed in range(40):
        _plan_of(greedy_by_size, _random_lifetimes(seed), f"random set #{seed}")


def _gbs_quality(greedy_by_size):
    from mlsys_lab.engine import memory

    ratios = []
    for seed in range(40):
        recs = _random_lifetimes(seed)
        _, arena = _plan_of(greedy_by_size, recs, f"random set #{seed}")
        ratios.append(arena / memory.lower_bound(recs, 1))
    mean = float(np.mean(ratios))
    if mean > 1.10:
        worst = int(np.argmax(ratios))
        raise AssertionError(f"on 40 random sets your arena averages {mean:.3f}x the lower bound "
                             f"(worst: set #{worst}, {ratios[worst]:.3f}x); greedy by size "
                             "should stay within 1.10x: biggest first, lowest free offset")


def _gbs_edge(greedy_by_size):
    from mlsys_lab.engine.memory import Lifetime

    one = [Lifetime("only", 4096, 0, 0)]
    offsets, arena = _plan_of(greedy_by_size, one, "a single tensor")
    if arena != 4096:
        raise AssertionError(f"a single tensor of 4096 B: arena {arena}, expected 4096 "
                             "(place it at offset 0)")
    disjoint = [Lifetime(f"d{i}", 1000 * (i + 1), i, i) for i in range(5)]
    _, arena = _plan_of(greedy_by_size, disjoint, "five tensors that never overlap in time")
    if arena != 5000:
        raise AssertionError(f"five tensors alive one after another (sizes 1000..5000 B): arena "
                             f"{arena}, expected 5000 — they can all reuse the same bytes")
    same_step = [Lifetime(f"s{i}", 100, 2, 3) for i in range(4)]
    _, arena = _plan_of(greedy_by_size, same_step, "four tensors alive together")
    if arena != 400:
        raise AssertionError(f"four 100-B tensors alive at the same steps: arena {arena}, "
                             "expected 400 (packed with no gaps)")


# ----------------------------------------------------------------------------- 7.2 transposes


def _trace(f, *shapes):
    import mlsys_lab as ml

    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return ml.trace(f, *args), args


def _apply_pass(cancel, graph, what):
    from mlsys_lab.engine.graph import Graph
    from mlsys_lab.errors import GraphError

    before = graph.pretty()
    out = cancel(graph)
    if not isinstance(out, Graph):
        raise AssertionError(f"{what}: the pass should return a Graph, got {type(out).__name__}")
    if graph.pretty() != before:
        raise AssertionError(f"{what}: the pass modified its input graph; build a new one "
                             "(e.g. with Rewriter)")
    if out is graph:
        raise AssertionError(f"{what}: the pass returned its input graph itself; return a new "
                             "Graph (passes never share nodes between graphs)")
    try:
        out.lint()
    except GraphError as e:
        raise AssertionError(f"{what}: the result fails lint(): {e}") from None
    return out


def _same_outputs(g, out, args, what):
    from mlsys_lab.engine.passes.testing import run_graph

    want, got = run_graph(g, *args), run_graph(out, *args)
    if len(want) != len(got):
        raise AssertionError(f"{what}: the graph had {len(want)} outputs, yours has {len(got)}")
    for i, (a, b) in enumerate(zip(want, got)):
        if np.shape(a) != np.shape(b) or not np.allclose(a, b, rtol=1e-5, atol=1e-6,
                                                          equal_nan=True):
            raise AssertionError(f"{what}: output {i} changed (shape {np.shape(a)} -> "
                                 f"{np.shape(b)}); cancelling transposes must not change results")


def _n(graph, op):
    return sum(n.op == op for n in graph.nodes)


def _ct_pair(cancel_transpose_pairs):
    import mlsys_lab as ml

    def f(x, y):
        return ml.ops.transpose(ml.ops.transpose(x, (1, 0)), (1, 0)) + y

    g, args = _trace(f, (3, 4), (3, 4))
    out = _apply_pass(cancel_transpose_pairs, g, "transpose(transpose(x, (1,0)), (1,0)) + y")
    _same_outputs(g, out, args, "transpose(transpose(x, (1,0)), (1,0)) + y")
    if _n(out, "transpose") or len(out.nodes) != 1:
        raise AssertionError(f"transpose(transpose(x, (1,0)), (1,0)) + y: expected only the add to "
                             f"remain, got {[n.op for n in out.nodes]}")


def _ct_compose(cancel_transpose_pairs):
    import mlsys_lab as ml

    def f(x):
        return ml.ops.transpose(ml.ops.transpose(x, (1, 2, 0)), (1, 2, 0))

    g, args = _trace(f, (2, 3, 5))
    what = "transpose(transpose(x, (1,2,0)), (1,2,0)) on a (2,3,5) array"
    out = _apply_pass(cancel_transpose_pairs, g, what)
    _same_outputs(g, out, args, what)
    perms = [tuple(n.attrs["axes"]) for n in out.nodes if n.op == "transpose"]
    if len(out.nodes) != 1 or perms != [(2, 0, 1)]:
        raise AssertionError(f"{what}: expected one transpose with the composed axes (2, 0, 1), "
                             f"got {[n.op for n in out.nodes]} with axes {perms}")


def _ct_identity_and_shared(cancel_transpose_pairs):
    import mlsys_lab as ml

    def f(x):
        t = ml.ops.transpose(x, (1, 0))
        back = ml.ops.transpose(t, (1, 0))
        same = ml.ops.transpose(x, (0, 1))
        return t * 2.0, back + same

    g, args = _trace(f, (3, 4))
    what = "t = transpose(x) read twice, plus an identity transpose"
    out = _apply_pass(cancel_transpose_pairs, g, what)
    _same_outputs(g, out, args, what)
    if _n(out, "transpose") != 1:
        raise AssertionError(f"{what}: expected exactly one transpose left (t, which `t * 2` still "
                             f"reads); got {_n(out, 'transpose')}: {[n.op for n in out.nodes]}")


def _reference_count(graph):
    from mlsys_lab.engine.passes import cancel_transposes

    return _n(cancel_transposes(graph), "transpose")


def _ct_random(cancel_transpose_pairs):
    from mlsys_lab.engine.passes.testing import random_graph

    for seed in range(25):
        g, args = random_graph(seed, n_nodes=14)
        what = f"random graph seed={seed}"
        out = _apply_pass(cancel_transpose_pairs, g, what)
        _same_outputs(g, out, args, what)
        others_before = len(g.nodes) - _n(g, "transpose")
        others_after = len(out.nodes) - _n(out, "transpose")
        if others_after != others_before:
            raise AssertionError(f"{what}: {others_before} non-transpose nodes before, "
                                 f"{others_after} after; leave the other nodes alone")
        want = _reference_count(g)
        if _n(out, "transpose") > want:
            raise AssertionError(f"{what}: {_n(out, 'transpose')} transposes left, but {want} "
                                 "suffice (compose chains, drop identity permutations)")


# ----------------------------------------------------------------------------- 7.3 scheduler


def _preds(graph):
    return {n.id: sorted({v.producer.id for v in n.inputs if v.producer is not None})
            for n in graph.nodes}


def _reference_makespan(graph, workers, cost):
    """List scheduling with the bottom level (longest path to an exit) as priority."""
    preds = _preds(graph)
    succs = {n.id: [] for n in graph.nodes}
    for nid, ps in preds.items():
        for p in ps:
            succs[p].append(nid)
    level = {}
    for n in reversed(graph.nodes):
        level[n.id] = cost[n.id] + max((level[s] for s in succs[n.id]), default=0.0)
    remaining = {nid: len(ps) for nid, ps in preds.items()}
    ready = [nid for nid, k in remaining.items() if k == 0]
    free = [0.0] * workers
    end = {}
    while ready:
        ready.sort(key=lambda i: (-level[i], i))
        nid = ready.pop(0)
        w = min(range(workers), key=lambda k: (free[k], k))
        start = max([free[w]] + [end[p] for p in preds[nid]])
        end[nid] = start + cost[nid]
        free[w] = end[nid]
        for s in succs[nid]:
            remaining[s] -= 1
            if remaining[s] == 0:
                ready.append(s)
    return max(end.values(), default=0.0)


def _wide_graph(seed):
    """A traced graph with several independent branches that meet at the end."""
    import mlsys_lab as ml

    rng = np.random.default_rng(500 + seed)
    lengths = [int(k) for k in rng.integers(1, 6, size=int(rng.integers(2, 5)))]
    unary = [ml.ops.tanh, ml.ops.relu, ml.ops.sigmoid, ml.ops.neg]

    def f(x):
        outs = []
        for b, length in enumerate(lengths):
            h = x * float(b + 1)
            for j in range(length):
                h = unary[(b + j) % len(unary)](h)
            outs.append(h)
        total = outs[0]
        for h in outs[1:]:
            total = total + h
        return total

    return ml.trace(f, np.zeros((4, 4), np.float32), name=f"branches_{seed}")


def _costs(graph, seed):
    rng = np.random.default_rng(900 + seed)
    return {n.id: float(rng.integers(1, 10)) for n in graph.nodes}


def _validate_schedule(graph, workers, cost, result, what):
    if not isinstance(result, dict):
        raise AssertionError(f"{what}: schedule should return a dict node id -> (worker, start, "
                             f"end), got {type(result).__name__}")
    ids = [n.id for n in graph.nodes]
    missing = [i for i in ids if i not in result]
    if missing:
        raise AssertionError(f"{what}: nodes {missing[:5]} are not scheduled")
    extra = [k for k in result if k not in set(ids)]
    if extra:
        raise AssertionError(f"{what}: unknown node ids {extra[:5]} in the schedule")
    for i in ids:
        entry = result[i]
        if not isinstance(entry, (tuple, list)) or len(entry) != 3:
            raise AssertionError(f"{what}: node {i} maps to {entry!r}, expected "
                                 "(worker, start, end)")
        w, s, e = entry
        if isinstance(w, bool) or not isinstance(w, numbers.Integral) or not 0 <= w < workers:
            raise AssertionError(f"{what}: node {i} is on worker {w!r}; workers are "
                                 f"0..{workers - 1}")
        if not math.isclose(float(e) - float(s), cost[i], rel_tol=1e-9, abs_tol=1e-9) or s < -1e-9:
            raise AssertionError(f"{what}: node {i} runs from {s} to {e}, but it costs {cost[i]} "
                                 "(end - start must equal its cost, start >= 0)")
    for i, ps in _preds(graph).items():
        for p in ps:
            if result[i][1] < result[p][2] - 1e-9:
                raise AssertionError(f"{what}: node {i} starts at {result[i][1]} before its input "
                                     f"node {p} ends at {result[p][2]}")
    for w in range(workers):
        spans = sorted((float(result[i][1]), float(result[i][2]), i) for i in ids
                       if result[i][0] == w)
        for (s0, e0, a), (s1, e1, b) in zip(spans, spans[1:]):
            if s1 < e0 - 1e-9:
                raise AssertionError(f"{what}: nodes {a} and {b} overlap on worker {w} "
                                     f"([{s0}, {e0}) and [{s1}, {e1}))")
    return max(float(result[i][2]) for i in ids)


def _run_schedule(schedule, graph, workers, cost, what):
    before = graph.pretty()
    result = schedule(graph, workers, dict(cost))
    if graph.pretty() != before:
        raise AssertionError(f"{what}: schedule modified the graph")
    makespan = _validate_schedule(graph, workers, cost, result, what)
    best = _reference_makespan(graph, workers, cost)
    if makespan > 1.2 * best + 1e-9:
        raise AssertionError(f"{what}: makespan {makespan:g}, but a list scheduler reaches "
                             f"{best:g} (allowed: {1.2 * best:g}); keep workers busy and run the "
                             "longest remaining path first")


def _sched_two_matmuls(schedule):
    import mlsys_lab as ml

    def f(x, a, b):
        return ml.ops.relu(x @ a) + ml.ops.tanh(x @ b)

    z = np.zeros((4, 4), np.float32)
    g = ml.trace(f, z, z, z)
    cost = {n.id: (5.0 if n.op == "matmul" else 1.0) for n in g.nodes}
    what = "relu(x @ a) + tanh(x @ b) on 2 workers (matmul 5, others 1)"
    _run_schedule(schedule, g, 2, cost, what)
    result = schedule(g, 2, dict(cost))
    makespan = max(e for _, _, e in result.values())
    if makespan > 7.0 + 1e-9:
        raise AssertionError(f"{what}: makespan {makespan:g}; the two branches are independent, "
                             "so they can run side by side in 7")


def _sched_one_worker(schedule):
    g = _wide_graph(0)
    cost = _costs(g, 0)
    result = schedule(g, 1, dict(cost))
    makespan = _validate_schedule(g, 1, cost, result, "one worker")
    total = sum(cost.values())
    if makespan > total + 1e-9:
        raise AssertionError(f"one worker: makespan {makespan:g} > the sum of all costs {total:g}; "
                             "a single worker should never idle")


def _sched_random(schedule):
    from mlsys_lab.engine.passes.testing import random_graph

    for seed in range(12):
        g = _wide_graph(seed) if seed % 2 == 0 else random_graph(seed, n_nodes=20)[0]
        cost = _costs(g, seed)
        for workers in (2, 3):
            _run_schedule(schedule, g, workers, cost, f"graph #{seed} ({len(g.nodes)} nodes) on "
                                                      f"{workers} workers")


# ----------------------------------------------------------------------------- 7.4 fp16


def _decode_all(decode_fp16, patterns):
    got = []
    for b in patterns:
        v = decode_fp16(int(b))
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise AssertionError(f"decode_fp16(0x{int(b):04X}) returned {type(v).__name__}; "
                                 "return a Python float")
        got.append(float(v))
    return np.array(got, np.float64)


def _compare_fp16(decode_fp16, patterns, what):
    patterns = np.asarray(patterns, np.uint16)
    want = patterns.view(np.float16).astype(np.float64)
    got = _decode_all(decode_fp16, patterns)
    for b, w, g in zip(patterns, want.tolist(), got.tolist()):
        if math.isnan(w):
            if not math.isnan(g):
                raise AssertionError(f"{what}: decode_fp16(0x{int(b):04X}) = {g!r}; expected nan")
        elif g != w or math.copysign(1.0, g) != math.copysign(1.0, w):
            raise AssertionError(f"{what}: decode_fp16(0x{int(b):04X}) = {g!r}; expected {w!r}")


def _fp16_normal(decode_fp16):
    _compare_fp16(decode_fp16, [0x3C00, 0xC000, 0x3555, 0x7BFF, 0x0400, 0x4248, 0xB0CD],
                  "normal numbers")


def _fp16_special(decode_fp16):
    _compare_fp16(decode_fp16, [0x0000, 0x8000, 0x0001, 0x03FF, 0x8200, 0x7C00, 0xFC00],
                  "zeros, subnormals and infinities")
    _compare_fp16(decode_fp16, [0x7E00, 0x7C01, 0xFFFF], "NaN patterns")


def _fp16_all(decode_fp16):
    _compare_fp16(decode_fp16, np.arange(1 << 16, dtype=np.uint32).astype(np.uint16),
                  "all 65536 patterns")


register(
    Exercise(
        id="7.1",
        title="A greedy-by-size memory planner",
        target="greedy_by_size",
        cases=(
            Case("the 7-tensor example fits in 10 MiB", 2, _gbs_book),
            Case("single, disjoint and simultaneous tensors", 1, _gbs_edge),
            Case("no two live tensors overlap (40 random sets)", 3, _gbs_valid),
            Case("arena within 1.10x the lower bound on average", 2, _gbs_quality),
        ),
    ),
    Exercise(
        id="7.2",
        title="Cancel transpose pairs",
        target="cancel_transpose_pairs",
        cases=(
            Case("a back-and-forth pair disappears", 2, _ct_pair),
            Case("a chain becomes one transpose with the composed axes", 2, _ct_compose),
            Case("a transpose still read elsewhere stays; identity goes", 2,
                 _ct_identity_and_shared),
            Case("25 random graphs: pure, same outputs, fewest transposes", 3, _ct_random),
        ),
    ),
    Exercise(
        id="7.3",
        title="A parallel list scheduler",
        target="schedule",
        cases=(
            Case("two independent matmuls run side by side", 2, _sched_two_matmuls),
            Case("one worker never idles", 1, _sched_one_worker),
            Case("random graphs on 2 and 3 workers: valid, makespan <= 1.2x", 4, _sched_random),
        ),
    ),
    Exercise(
        id="7.4",
        title="Decode every FP16 bit pattern",
        target="decode_fp16",
        cases=(
            Case("normal numbers (the book's formula)", 1, _fp16_normal),
            Case("zeros, subnormals, infinities and NaN", 2, _fp16_special),
            Case("all 65536 patterns agree with numpy", 2, _fp16_all),
        ),
    ),
)
