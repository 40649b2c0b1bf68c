"""Checks for chapter 7, the compiler backend and runtime
(``solutions/ch07_compiler_backend_runtime.ipynb``).

7.1 a greedy-by-size memory planner: valid plans that reuse memory, the exact greedy placement
when sizes differ, and the arena against the lower bound; 7.2 a transpose-cancelling pass over
the Graph IR, compared with the package's pass on seeded random traced graphs; 7.3 a parallel list
scheduler, checked for dependency order, per-worker overlap and makespan against the
bottom-level list schedule, including graphs where a scheduler without priorities (FIFO) is 1.5x
slower; 7.4 a decoder for 8-bit floats of any exponent width and bias, on formats that neither
numpy nor ``ml_dtypes`` knows.

Probes (run in the student's kernel) build the inputs from the seed, call the answer and return
what came back; judges rebuild the same inputs, compute the references and decide.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    Opaque,
    Raised,
    attempt,
    describe,
    plain,
    register,
)

# ============================================================================= 7.1 planner
# ----------------------------------------------------------------------------- inputs (both sides)

#: The chapter's 7-tensor example as (size in units, start, end).
_BOOK = [(4, 0, 2), (2, 1, 3), (3, 2, 4), (1, 0, 6), (4, 3, 5), (2, 4, 6), (3, 5, 6)]
_N_SETS = 40


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


def _distinct_lifetimes(seed):
    """Like ``_random_lifetimes`` but every size differs, so greedy by size has one answer."""
    from mlsys_lab.engine.memory import Lifetime

    rng = np.random.default_rng(5000 + seed)
    n = int(rng.integers(15, 40))
    steps = max(4, n // 2)
    sizes = 64 * rng.choice(np.arange(1, 400), size=n, replace=False)
    recs = []
    for i in range(n):
        start = int(rng.integers(0, steps))
        span = int(rng.geometric(0.35)) - 1 if rng.random() < 0.85 else int(rng.integers(0, steps))
        recs.append(Lifetime(f"u{i}", int(sizes[i]), start, min(steps, start + span)))
    return recs


def _set_seed(seed, i):
    return (seed % 100_000) * _N_SETS + i


def _book_lifetimes(seed):
    """The 7-tensor example, scaled (a random unit), shifted in time, renamed and shuffled."""
    from mlsys_lab.engine.memory import Lifetime

    rng = np.random.default_rng(7100 + seed)
    unit = 64 * int(rng.integers(1000, 40000))
    shift = int(rng.integers(0, 50))
    names = [f"{rng.choice(['act', 'buf', 'tmp', 'x'])}{int(k)}"
             for k in rng.choice(1000, size=len(_BOOK), replace=False)]
    recs = [Lifetime(names[i], s * unit, a + shift, b + shift) for i, (s, a, b) in enumerate(_BOOK)]
    return [recs[int(i)] for i in rng.permutation(len(recs))], unit


def _edge_lifetimes(seed):
    from mlsys_lab.engine.memory import Lifetime

    unit = 64 * (1 + seed % 50)
    one = [Lifetime("only", 64 * unit, 3, 3)]
    disjoint = [Lifetime(f"d{i}", unit * (i + 1), i, i) for i in range(5)]
    same_step = [Lifetime(f"s{i}", unit, 2, 3) for i in range(4)]
    return unit, one, disjoint, same_step


# ----------------------------------------------------------------------------- probes


def _plan_raw(greedy_by_size, recs):
    """What the planner did with ``recs``: its answer and the input list afterwards."""
    offsets = plain(greedy_by_size(recs))
    return {"offsets": offsets, "after": [(r.id, r.size, r.start, r.end) for r in recs]}


def _gbs_book_probe(greedy_by_size, seed):
    return _plan_raw(greedy_by_size, _book_lifetimes(seed)[0])


def _gbs_edge_probe(greedy_by_size, seed):
    _, *sets = _edge_lifetimes(seed)
    return [_plan_raw(greedy_by_size, recs) for recs in sets]


def _gbs_random_probe(greedy_by_size, seed):
    return [_plan_raw(greedy_by_size, _random_lifetimes(_set_seed(seed, i)))
            for i in range(_N_SETS)]


def _gbs_distinct_probe(greedy_by_size, seed):
    return [_plan_raw(greedy_by_size, _distinct_lifetimes(_set_seed(seed, i))) for i in range(30)]


# ----------------------------------------------------------------------------- judges


def _arena(raw, recs, what):
    """Check the shape and validity of one planner answer; return (offsets, arena)."""
    from mlsys_lab.engine import memory
    from mlsys_lab.errors import GraphError

    if not isinstance(raw, dict) or "offsets" not in raw:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    if raw["after"] != [(r.id, r.size, r.start, r.end) for r in recs]:
        raise AssertionError(f"{what}: greedy_by_size changed (reordered) its input list; "
                             "sort a copy instead")
    offsets = raw["offsets"]
    if not isinstance(offsets, dict):
        raise AssertionError(f"{what}: greedy_by_size should return a dict id -> offset, got "
                             f"{describe(offsets)}")
    missing = [r.id for r in recs if r.id not in offsets]
    if missing:
        raise AssertionError(f"{what}: no offset for {missing[:3]} (every tensor needs one)")
    for r in recs:
        o = offsets[r.id]
        if isinstance(o, (bool, np.bool_)) or not isinstance(o, numbers.Integral) or o < 0:
            raise AssertionError(f"{what}: the offset of {r.id!r} is {describe(o)}; offsets are "
                                 "non-negative ints")
    placed = {r.id: int(offsets[r.id]) for r in recs}
    arena = max((placed[r.id] + r.size for r in recs), default=0)
    plan = memory.MemoryPlan(placed, arena, "yours", 1)
    try:
        memory.verify(plan, recs)
    except GraphError as e:
        raise AssertionError(f"{what}: {e}") from None
    return placed, arena


def _list_of(raw, n, what):
    if not isinstance(raw, list) or len(raw) != n:
        raise AssertionError(f"{what}: expected {n} results, got {describe(raw)}")
    return raw


def _gbs_book_judge(raw, seed):
    recs, unit = _book_lifetimes(seed)
    _, arena = _arena(raw, recs, "the 7-tensor example")
    if arena > 10 * unit:
        raise AssertionError(f"the 7-tensor example (unit {unit:,} B): your arena is {arena:,} B "
                             f"= {arena / unit:g} units; greedy by size fits all seven in the 10 "
                             f"units ({10 * unit:,} B) the lower bound allows")


def _gbs_edge_judge(raw, seed):
    unit, one, disjoint, same_step = _edge_lifetimes(seed)
    raw = _list_of(raw, 3, "single, disjoint and simultaneous tensors")
    _, arena = _arena(raw[0], one, "a single tensor")
    if arena != 64 * unit:
        raise AssertionError(f"a single tensor of {64 * unit} B: arena {arena}, expected "
                             f"{64 * unit} (place it at offset 0)")
    _, arena = _arena(raw[1], disjoint, "five tensors that never overlap in time")
    if arena != 5 * unit:
        raise AssertionError(f"five tensors alive one after another (sizes {unit}..{5 * unit} B): "
                             f"arena {arena}, expected {5 * unit} — they can all reuse the same "
                             "bytes")
    _, arena = _arena(raw[2], same_step, "four tensors alive together")
    if arena != 4 * unit:
        raise AssertionError(f"four {unit}-B tensors alive at the same steps: arena {arena}, "
                             f"expected {4 * unit} (packed with no gaps)")


def _random_ratios(raw, seed):
    from mlsys_lab.engine import memory

    ratios = []
    for i, one in enumerate(_list_of(raw, _N_SETS, f"{_N_SETS} random sets")):
        recs = _random_lifetimes(_set_seed(seed, i))
        _, arena = _arena(one, recs, f"random set #{i}")
        ratios.append(arena / memory.lower_bound(recs, 1))
    return ratios


#: A plan "reuses memory" when its arena averages at most this many times the lower bound
#: (no reuse averages 2.3x-3x on these sets; greedy by size about 1.01x, first fit 1.06x-1.16x).
REUSE_RATIO = 1.5
QUALITY_RATIO = 1.05


def _gbs_valid_judge(raw, seed):
    ratios = _random_ratios(raw, seed)
    mean = float(np.mean(ratios))
    if mean > REUSE_RATIO:
        raise AssertionError(f"your plans are valid but barely reuse memory: the arena averages "
                             f"{mean:.2f}x the lower bound on {_N_SETS} random sets (no reuse at "
                             f"all gives about 2.5x); place each tensor in the lowest gap left by "
                             "the tensors alive at the same time")


def _gbs_quality_judge(raw, seed):
    ratios = _random_ratios(raw, seed)
    mean = float(np.mean(ratios))
    if mean > QUALITY_RATIO:
        worst = int(np.argmax(ratios))
        raise AssertionError(f"on {_N_SETS} random sets your arena averages {mean:.3f}x the lower "
                             f"bound (worst: set #{worst}, {ratios[worst]:.3f}x); greedy by size "
                             f"stays within {QUALITY_RATIO:.2f}x: biggest first, lowest free "
                             "offset")


def _gbs_distinct_judge(raw, seed):
    from mlsys_lab.engine import memory

    for i, one in enumerate(_list_of(raw, 30, "30 random sets with distinct sizes")):
        recs = _distinct_lifetimes(_set_seed(seed, i))
        placed, _ = _arena(one, recs, f"distinct-size set #{i}")
        want = memory.plan(recs, "greedy_by_size", alignment=1).offsets
        by_size = sorted(recs, key=lambda r: -r.size)
        for rank, r in enumerate(by_size):
            if placed[r.id] != want[r.id]:
                raise AssertionError(
                    f"distinct-size set #{i}: {r.id!r} ({r.size} B, the #{rank + 1} biggest, "
                    f"live {r.start}..{r.end}) is at offset {placed[r.id]}; greedy by size puts it "
                    f"at {want[r.id]}: place the biggest tensors first, each at the lowest offset "
                    "free from the bigger tensors already placed that are alive at the same time")


# ============================================================================= 7.2 transposes
# ----------------------------------------------------------------------------- inputs (both sides)


def _trace(f, *shapes):
    import mlsys_lab as ml

    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return ml.trace(f, *args), args


def _pair_graph():
    import mlsys_lab as ml

    def f(x, y):
        return ml.ops.transpose(ml.ops.transpose(x, (1, 0)), (1, 0)) + y

    return _trace(f, (3, 4), (3, 4))


def _perms(seed):
    """Two permutations p, q whose compositions p∘q and q∘p differ, and neither is the identity."""
    rng = np.random.default_rng(7200 + seed)
    ndim = 3 + seed % 2
    while True:
        p, q = (tuple(int(i) for i in rng.permutation(ndim)) for _ in range(2))
        pq, qp = tuple(p[i] for i in q), tuple(q[i] for i in p)
        if pq != qp and pq != tuple(range(ndim)):
            return p, q, pq


def _compose_graph(seed):
    import mlsys_lab as ml

    p, q, _ = _perms(seed)

    def f(x):
        return ml.ops.transpose(ml.ops.transpose(x, p), q)

    return _trace(f, (2, 3, 4, 5)[: len(p)])


def _shared_graph():
    import mlsys_lab as ml

    def f(x):
        t = ml.ops.transpose(x, (1, 0))
        back = ml.ops.transpose(t, (1, 0))
        same = ml.ops.transpose(x, (0, 1))
        return t * 2.0, back + same

    return _trace(f, (3, 4))


def _random_graphs(seed):
    from mlsys_lab.engine.random_graphs import random_graph

    return [random_graph((seed % 100_000) * 25 + i, n_nodes=14) for i in range(25)]


# ----------------------------------------------------------------------------- probes


def _pass_raw(cancel, graph, args):
    """What the pass returned, as data: its type, nodes, lint verdict and outputs."""
    from mlsys_lab.engine.graph import Graph
    from mlsys_lab.engine.runtime import run_graph

    out = cancel(graph)
    raw = {"input_after": graph.pretty(), "same_object": out is graph, "type": type(out).__name__}
    if not isinstance(out, Graph):
        return raw
    lint = attempt(out.lint)
    raw["lint"] = lint if isinstance(lint, Raised) else None
    raw["nodes"] = [(n.op, tuple(n.attrs.get("axes", ())) if n.op == "transpose" else ())
                    for n in out.nodes]
    outputs = attempt(run_graph, out, *args)
    if isinstance(outputs, list):  # (shape, values) pairs: 0-d arrays keep their shape
        outputs = [(tuple(np.shape(o)), np.asarray(o).reshape(-1)) for o in outputs]
    raw["outputs"] = outputs
    return raw


def _ct_pair_probe(cancel):
    return _pass_raw(cancel, *_pair_graph())


def _ct_compose_probe(cancel, seed):
    return _pass_raw(cancel, *_compose_graph(seed))


def _ct_shared_probe(cancel):
    return _pass_raw(cancel, *_shared_graph())


def _ct_random_probe(cancel, seed):
    return [_pass_raw(cancel, g, args) for g, args in _random_graphs(seed)]


# ----------------------------------------------------------------------------- judges


def _judge_pass(raw, graph, args, what):
    """Check one pass result; return its node list [(op, axes)]."""
    from mlsys_lab.engine.runtime import run_graph

    if not isinstance(raw, dict) or "type" not in raw:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    if raw["type"] != "Graph" or "nodes" not in raw:
        raise AssertionError(f"{what}: the pass should return a Graph, got a {raw['type']}")
    if raw["input_after"] != graph.pretty():
        raise AssertionError(f"{what}: the pass modified its input graph; build a new one "
                             "(e.g. with Rewriter)")
    if raw["same_object"]:
        raise AssertionError(f"{what}: the pass returned its input graph itself; return a new "
                             "Graph (passes never share nodes between graphs)")
    if isinstance(raw["lint"], Raised):
        raise AssertionError(f"{what}: the result fails lint(): {raw['lint'].message}")
    got = raw["outputs"]
    if isinstance(got, Raised):
        raise AssertionError(f"{what}: running the new graph raised {got}")
    want = run_graph(graph, *args)
    if not isinstance(got, list) or len(got) != len(want):
        raise AssertionError(f"{what}: the graph had {len(want)} outputs, yours gives "
                             f"{describe(got)}")
    for i, (a, (shape, b)) in enumerate(zip(want, got)):
        if (shape != a.shape or not isinstance(b, np.ndarray) or b.size != a.size
                or not np.allclose(a.reshape(-1), b, rtol=1e-5, atol=1e-6, equal_nan=True)):
            raise AssertionError(f"{what}: output {i} changed (shape {a.shape} -> {shape}); "
                                 "cancelling transposes must not change results")
    return raw["nodes"]


def _n(nodes, op):
    return sum(node[0] == op for node in nodes)


def _ct_pair_judge(raw):
    what = "transpose(transpose(x, (1,0)), (1,0)) + y"
    nodes = _judge_pass(raw, *_pair_graph(), what)
    if _n(nodes, "transpose") or len(nodes) != 1:
        raise AssertionError(f"{what}: expected only the add to remain, got "
                             f"{[op for op, _ in nodes]}")


def _ct_compose_judge(raw, seed):
    p, q, pq = _perms(seed)
    what = f"transpose(transpose(x, {p}), {q})"
    nodes = _judge_pass(raw, *_compose_graph(seed), what)
    perms = [axes for op, axes in nodes if op == "transpose"]
    if len(nodes) != 1 or perms != [pq]:
        raise AssertionError(f"{what}: expected one transpose with the composed axes {pq} "
                             f"(position i reads axis p[q[i]]), got {[op for op, _ in nodes]} "
                             f"with axes {perms}")


def _ct_shared_judge(raw):
    what = "t = transpose(x) read twice, plus an identity transpose"
    nodes = _judge_pass(raw, *_shared_graph(), what)
    if _n(nodes, "transpose") != 1:
        raise AssertionError(f"{what}: expected exactly one transpose left (t, which `t * 2` still "
                             f"reads); got {_n(nodes, 'transpose')}: {[op for op, _ in nodes]}")


def _ct_random_judge(raw, seed):
    from mlsys_lab.engine.passes import cancel_transposes

    graphs = _random_graphs(seed)
    raw = _list_of(raw, len(graphs), "25 random graphs")
    for i, ((g, args), one) in enumerate(zip(graphs, raw)):
        what = f"random graph #{i} ({g.name})"
        nodes = _judge_pass(one, g, args, what)
        reference = cancel_transposes(g)
        others_before = sum(n.op != "transpose" for n in g.nodes)
        others_after = len(nodes) - _n(nodes, "transpose")
        # Rewriter.build() prunes nodes that only dropped transposes read: fewer is fine.
        others_least = sum(n.op != "transpose" for n in reference.nodes)
        if not others_least <= others_after <= others_before:
            raise AssertionError(f"{what}: {others_before} non-transpose nodes before, "
                                 f"{others_after} after; leave the other nodes alone")
        want = _n([(n.op,) for n in reference.nodes], "transpose")
        if _n(nodes, "transpose") > want:
            raise AssertionError(f"{what}: {_n(nodes, 'transpose')} transposes left, but {want} "
                                 "suffice (compose chains, drop identity permutations)")


# ============================================================================= 7.3 scheduler
# ----------------------------------------------------------------------------- inputs (both sides)


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


#: The critical-path graphs: SHORTS independent nodes of cost ~3 and one chain of CHAIN nodes of
#: cost ~1, joined at the end, on 3 workers. The chain is the critical path; a scheduler that
#: starts it late (FIFO when the chain comes last, LIFO when it comes first, or "costliest
#: node first") finishes about 1.6x later than the bottom-level schedule.
SHORTS, CHAIN, CRITICAL_WORKERS = 12, 18, 3


def _critical_graph(seed, chain_first):
    import mlsys_lab as ml

    rng = np.random.default_rng(7300 + 2 * seed + chain_first)
    unary = [ml.ops.tanh, ml.ops.relu, ml.ops.sigmoid, ml.ops.neg, ml.ops.exp, ml.ops.abs]
    picks = [unary[int(k)] for k in rng.integers(0, len(unary), SHORTS + CHAIN)]

    def f(x):
        def chain():
            h = x
            for op in picks[SHORTS:]:
                h = op(h)
            return h

        tail = chain() if chain_first else None
        shorts = [op(x) for op in picks[:SHORTS]]
        tail = chain() if tail is None else tail
        return ml.ops.sum(ml.ops.stack([*shorts, tail]), axis=0)

    g = ml.trace(f, np.zeros((4, 4), np.float32),
                 name=f"critical_{'chain_first' if chain_first else 'chain_last'}_{seed}")
    short_ids = _short_nodes(g)
    cost = {}
    for n in g.nodes:
        if n.op in ("stack", "sum"):
            cost[n.id] = 0.5
        elif n.id in short_ids:
            cost[n.id] = 3.0 + float(rng.integers(-2, 3)) / 20
        else:
            cost[n.id] = 1.0 + float(rng.integers(-2, 3)) / 20
    return g, cost


def _short_nodes(graph):
    """Ids of the nodes that read the graph input and feed the join directly (the shorts)."""
    join = next(n for n in graph.nodes if n.op == "stack")
    feeders = {v.producer.id for v in join.inputs if v.producer is not None}
    return {n.id for n in graph.nodes
            if n.id in feeders and all(v.producer is None for v in n.inputs)}


def _two_matmuls():
    import mlsys_lab as ml

    def f(x, a, b):
        return ml.ops.relu(x @ a) + ml.ops.tanh(x @ b)

    z = np.zeros((4, 4), np.float32)
    g = ml.trace(f, z, z, z)
    return g, {n.id: (5.0 if n.op == "matmul" else 1.0) for n in g.nodes}


def _random_schedule_cases(seed):
    """(graph, workers, cost, label) for the random-graph case."""
    from mlsys_lab.engine.random_graphs import random_graph

    base = (seed % 100_000) * 12
    out = []
    for i in range(12):
        g = _wide_graph(base + i) if i % 2 == 0 else random_graph(base + i, n_nodes=20)[0]
        cost = _costs(g, base + i)
        for workers in (2, 3):
            what = f"graph #{i} ({len(g.nodes)} nodes) on {workers} workers"
            out.append((g, workers, cost, what))
    return out


def _critical_cases(seed):
    out = []
    for chain_first in (False, True):
        for k in range(2):
            g, cost = _critical_graph(2 * seed + k, chain_first)
            where = "first" if chain_first else "last"
            out.append((g, CRITICAL_WORKERS, cost,
                        f"{SHORTS} short nodes and a {CHAIN}-node chain traced {where} "
                        f"(#{k}) on {CRITICAL_WORKERS} workers"))
    return out


# ----------------------------------------------------------------------------- probes


def _schedule_raw(schedule, graph, workers, cost):
    result = plain(schedule(graph, workers, dict(cost)))
    return {"result": result, "graph_after": graph.pretty()}


def _sched_two_matmuls_probe(schedule):
    g, cost = _two_matmuls()
    return _schedule_raw(schedule, g, 2, cost)


def _sched_one_worker_probe(schedule, seed):
    g = _wide_graph(seed % 1000)
    return _schedule_raw(schedule, g, 1, _costs(g, seed % 1000))


def _sched_random_probe(schedule, seed):
    return [_schedule_raw(schedule, g, w, c) for g, w, c, _ in _random_schedule_cases(seed)]


def _sched_critical_probe(schedule, seed):
    return [_schedule_raw(schedule, g, w, c) for g, w, c, _ in _critical_cases(seed)]


# ----------------------------------------------------------------------------- judges


def _preds(graph):
    return {n.id: sorted({v.producer.id for v in n.inputs if v.producer is not None})
            for n in graph.nodes}


def _list_schedule(graph, workers, cost, priority="bottom level"):
    """The reference list scheduler: ``{node id: (worker, start, end)}``.

    Whenever a worker frees up it takes, among the nodes whose inputs have all *finished* by
    then, the one with the highest priority (if none is ready, it waits for the next node to
    finish). ``priority`` is ``"bottom level"`` (the node's cost plus the longest chain of costs
    to an exit: the critical path first) or ``"fifo"`` (the lowest node id first).
    """
    preds = _preds(graph)
    succs = {n.id: [] for n in graph.nodes}
    for nid, ps in preds.items():
        for p in ps:
            succs[p].append(nid)
    level = {}
    for n in reversed(graph.nodes):
        level[n.id] = cost[n.id] + max((level[s] for s in succs[n.id]), default=0.0)
    if priority == "fifo":
        level = dict.fromkeys(level, 0.0)
    free = [0.0] * workers
    out = {}
    while len(out) < len(preds):
        w = min(range(workers), key=lambda k: (free[k], k))
        now = free[w]
        ready = [i for i in preds if i not in out and all(p in out and out[p][2] <= now
                                                          for p in preds[i])]
        if not ready:
            free[w] = min(end for _, _, end in out.values() if end > now)
            continue
        nid = max(ready, key=lambda i: (level[i], -i))
        out[nid] = (w, now, now + cost[nid])
        free[w] = now + cost[nid]
    return out


def _makespan(sched):
    return max((end for _, _, end in sched.values()), default=0.0)


def _validate_schedule(graph, workers, cost, raw, what):
    """Check one schedule (dependencies, costs, per-worker overlap); return its makespan."""
    if not isinstance(raw, dict) or "result" not in raw:
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    if raw["graph_after"] != graph.pretty():
        raise AssertionError(f"{what}: schedule modified the graph")
    result = raw["result"]
    if not isinstance(result, dict):
        raise AssertionError(f"{what}: schedule should return a dict node id -> (worker, start, "
                             f"end), got {describe(result)}")
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
            raise AssertionError(f"{what}: node {i} maps to {describe(entry)}, expected "
                                 "(worker, start, end)")
        w, s, e = entry
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, numbers.Integral) \
                or not 0 <= w < workers:
            raise AssertionError(f"{what}: node {i} is on worker {describe(w)}; workers are "
                                 f"0..{workers - 1}")
        if not all(isinstance(t, numbers.Real) and not isinstance(t, (bool, np.bool_))
                   for t in (s, e)):
            raise AssertionError(f"{what}: node {i} runs from {describe(s)} to {describe(e)}; "
                                 "start and end are numbers")
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


def _judge_against_reference(graph, workers, cost, raw, what, slack=1.2):
    makespan = _validate_schedule(graph, workers, cost, raw, what)
    best = _makespan(_list_schedule(graph, workers, cost))
    if makespan > slack * best + 1e-9:
        fifo = _makespan(_list_schedule(graph, workers, cost, priority="fifo"))
        raise AssertionError(f"{what}: makespan {makespan:g}, but the bottom-level list schedule "
                             f"reaches {best:g} (allowed: {slack * best:g}; ready order without a "
                             f"priority: {fifo:g}); keep workers busy and run the node with the "
                             "longest remaining path first")


def _sched_two_matmuls_judge(raw):
    g, cost = _two_matmuls()
    what = "relu(x @ a) + tanh(x @ b) on 2 workers (matmul 5, others 1)"
    makespan = _validate_schedule(g, 2, cost, raw, what)
    if makespan > 7.0 + 1e-9:
        raise AssertionError(f"{what}: makespan {makespan:g}; the two branches are independent, "
                             "so they can run side by side in 7")


def _sched_one_worker_judge(raw, seed):
    g = _wide_graph(seed % 1000)
    cost = _costs(g, seed % 1000)
    makespan = _validate_schedule(g, 1, cost, raw, "one worker")
    total = sum(cost.values())
    if makespan > total + 1e-9:
        raise AssertionError(f"one worker: makespan {makespan:g} > the sum of all costs {total:g}; "
                             "a single worker should never idle")


def _sched_random_judge(raw, seed):
    cases = _random_schedule_cases(seed)
    for (g, w, cost, what), one in zip(cases, _list_of(raw, len(cases), "random graphs")):
        _judge_against_reference(g, w, cost, one, what)


def _sched_critical_judge(raw, seed):
    cases = _critical_cases(seed)
    for (g, w, cost, what), one in zip(cases, _list_of(raw, len(cases), "critical-path graphs")):
        _judge_against_reference(g, w, cost, one, what)


# ============================================================================= 7.4 fp8
# ----------------------------------------------------------------------------- inputs (both sides)

#: (exponent bits, bias) of the fixed formats; none is a format numpy or ml_dtypes has (their
#: 8-bit floats are E4M3 with bias 7, 8 or 11, E5M2 with bias 15 or 16, E3M4 with bias 3).
NORMAL_FORMATS = [(4, 9), (6, 40), (2, 2)]
SPECIAL_FORMATS = [(3, 5), (2, 1), (5, 13), (4, 4)]


def _format_biases(seed):
    """A non-standard bias for each exponent width 2..6, drawn from ``seed``."""
    rng = np.random.default_rng(7400 + seed)
    out = []
    for e in range(2, 7):
        choices = [b for b in range(1, 2 ** e) if b != 2 ** (e - 1) - 1 and b != 2 ** (e - 1)]
        out.append((e, int(rng.choice(choices))))
    return out


def _normal_patterns(exp_bits):
    """Ten normal patterns of the format (exponent neither 0 nor all ones), both signs."""
    rng = np.random.default_rng(100 + exp_bits)
    top = (1 << exp_bits) - 1
    pats = []
    while len(pats) < 10:
        b = int(rng.integers(0, 256))
        e = (b >> (7 - exp_bits)) & top
        if 0 < e < top and b not in pats:
            pats.append(b)
    return pats


def _special_patterns(exp_bits):
    m_bits = 7 - exp_bits
    top = ((1 << exp_bits) - 1) << m_bits
    mmax = (1 << m_bits) - 1
    patterns = [0x00, 0x80, 0x01, mmax, 0x80 | (mmax >> 1 or 1), 0x80 | mmax,  # zeros, subnormals
                top, 0x80 | top]  # infinities
    if m_bits:
        patterns += [top | 1, top | mmax, 0x80 | top | (1 << (m_bits - 1))]  # NaNs
    return patterns


def _fp8_reference(bits, exp_bits, bias):
    """The value of an 8-bit float: 1 sign, ``exp_bits`` exponent and ``7 - exp_bits`` mantissa
    bits, IEEE 754 rules for exponent 0 (subnormal) and all ones (inf / NaN)."""
    m_bits = 7 - exp_bits
    s, e, m = bits >> 7, (bits >> m_bits) & ((1 << exp_bits) - 1), bits & ((1 << m_bits) - 1)
    sign = -1.0 if s else 1.0
    if e == (1 << exp_bits) - 1:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - m_bits)
    return sign * math.ldexp((1 << m_bits) + m, e - bias - m_bits)


# ----------------------------------------------------------------------------- probes


def _decode_raw(decode_fp8, formats, patterns_of):
    return [[plain(decode_fp8(b, e, bias)) for b in patterns_of(e)] for e, bias in formats]


def _all_patterns(exp_bits):
    return list(range(256))


def _fp8_normal_probe(decode_fp8):
    return _decode_raw(decode_fp8, NORMAL_FORMATS, _normal_patterns)


def _fp8_special_probe(decode_fp8):
    return _decode_raw(decode_fp8, SPECIAL_FORMATS, _special_patterns)


def _fp8_all_probe(decode_fp8, seed):
    return _decode_raw(decode_fp8, _format_biases(seed), _all_patterns)


# ----------------------------------------------------------------------------- judges


def _compare_fp8(raw, formats, patterns_of, what):
    raw = _list_of(raw, len(formats), what)
    for (e, bias), values in zip(formats, raw):
        patterns = patterns_of(e)
        values = _list_of(values, len(patterns), f"{what}, E{e}M{7 - e} bias {bias}")
        for b, got in zip(patterns, values):
            call = f"decode_fp8(0b{b:08b}, {e}, {bias})"
            if isinstance(got, (bool, np.bool_, Opaque, Raised)) or \
                    not isinstance(got, numbers.Real):
                raise AssertionError(f"{what}: {call} returned {describe(got)}; return a float")
            got, want = float(got), _fp8_reference(b, e, bias)
            if math.isnan(want):
                if not math.isnan(got):
                    raise AssertionError(f"{what}: {call} = {got!r}; expected nan")
            elif got != want or math.copysign(1.0, got) != math.copysign(1.0, want):
                raise AssertionError(f"{what}: {call} = {got!r}; expected {want!r}")


def _fp8_normal_judge(raw):
    _compare_fp8(raw, NORMAL_FORMATS, _normal_patterns, "normal numbers")


def _fp8_special_judge(raw):
    _compare_fp8(raw, SPECIAL_FORMATS, _special_patterns, "zeros, subnormals, infinities, NaN")


def _fp8_all_judge(raw, seed):
    _compare_fp8(raw, _format_biases(seed), _all_patterns, "all 256 patterns")


# ============================================================================= registry

register(
    # 7.1. A wrong idea that still produces plausible output would fail because: no reuse (tensors
    # one after another) is valid but fails the reuse bound, the 10-unit example and the edge
    # cases; first fit in order of birth, smallest first, best fit or a different gap rule give
    # valid plans but not the greedy-by-size offsets on the distinct-size sets; treating `end` as
    # exclusive overlaps tensors that share their last step; a table for the chapter's example
    # fails because it is scaled, renamed, shifted and shuffled on every run.
    Exercise(
        id="7.1",
        title="A greedy-by-size memory planner",
        target="greedy_by_size",
        task="the greedy-by-size placement",
        forbidden=(
            "mlsys_lab.engine.memory:plan",
            "mlsys_lab.engine.memory:naive",
            "mlsys_lab.engine.memory:first_fit",
            "mlsys_lab.engine.memory:best_fit",
            "mlsys_lab.engine.memory:greedy_by_size",
            "mlsys_lab.engine.memory:greedy_by_breadth",
            "mlsys_lab.engine.memory:local_search",
            "mlsys_lab.engine.memory:two_cursor",
            "mlsys_lab.engine.memory.strategies:_place",
            "mlsys_lab.engine.memory.strategies:_Placed",
            "mlsys_lab.engine.memory.strategies:_best",
            "mlsys_lab.engine.memory.strategies:_lowest_fit",
            "mlsys_lab.engine.memory.strategies:_smallest_fit",
        ),
        cases=(
            Case("the 7-tensor example (scaled, renamed) fits in 10 units", 2,
                 feedback="greedy by size fits the example in 10 units",
                 probe=_gbs_book_probe, judge=_gbs_book_judge),
            Case("single, disjoint and simultaneous tensors", 1,
                 feedback="tensors that never meet share bytes; tensors alive together don't",
                 probe=_gbs_edge_probe, judge=_gbs_edge_judge),
            Case(f"{_N_SETS} random sets: no two live tensors overlap, memory is reused", 2,
                 feedback="valid plans that reuse memory", probe=_gbs_random_probe,
                 judge=_gbs_valid_judge),
            Case("distinct sizes: exactly the greedy-by-size offsets", 2,
                 feedback="biggest first, each at the lowest free offset",
                 probe=_gbs_distinct_probe, judge=_gbs_distinct_judge),
            Case(f"arena within {QUALITY_RATIO:.2f}x the lower bound on average", 1,
                 feedback="biggest first, lowest free offset", probe=_gbs_random_probe,
                 judge=_gbs_quality_judge),
        ),
    ),
    # 7.2. A wrong idea that still produces plausible output would fail because: cancelling only
    # exact inverse pairs leaves a chain of two transposes (compose case, random graphs);
    # composing in the wrong order (q[p[i]]) gives another permutation, so the outputs change;
    # dropping an inner transpose that another node reads breaks that reader; editing the input
    # graph in place or returning it fails the purity check; removing every transpose changes
    # the outputs.
    Exercise(
        id="7.2",
        title="Cancel transpose pairs",
        target="cancel_transpose_pairs",
        task="the transpose-cancelling pass",
        forbidden=(
            "mlsys_lab.engine.passes.backend:cancel_transposes.fn",  # a Pass: guard its function
            "mlsys_lab.engine.passes.backend:layout_transform.fn",
            "mlsys_lab.engine.passes.frontend:algebraic_simplification.fn",
        ),
        cases=(
            Case("a back-and-forth pair disappears", 2, feedback="the pair composes to identity",
                 probe=_ct_pair_probe, judge=_ct_pair_judge),
            Case("a chain becomes one transpose with the composed axes", 2,
                 feedback="position i reads axis p[q[i]]",
                 probe=_ct_compose_probe, judge=_ct_compose_judge),
            Case("a transpose still read elsewhere stays; identity goes", 2,
                 feedback="keep what other nodes read", probe=_ct_shared_probe,
                 judge=_ct_shared_judge),
            Case("25 random graphs: pure, same outputs, fewest transposes", 3,
                 feedback="compose chains, drop identities, copy the rest",
                 probe=_ct_random_probe, judge=_ct_random_judge),
        ),
    ),
    # 7.3. A wrong idea that still produces plausible output would fail because: a list scheduler
    # without a priority (FIFO by readiness or by node id, LIFO, or "costliest node first")
    # starts the long chain of the critical-path graphs late and finishes >= 1.5x after the
    # bottom-level schedule; running everything on one worker exceeds 1.2x on the random graphs
    # and 7 on the two matmuls; starting a node when its worker is free but before its inputs
    # end, or double-booking a worker, fails validation. No library function list-schedules
    # with priorities, so nothing is forbidden beyond the grader's own reference.
    Exercise(
        id="7.3",
        title="A parallel list scheduler",
        target="schedule",
        task="the list scheduler",
        cases=(
            Case("two independent matmuls run side by side", 1, feedback="use both workers",
                 probe=_sched_two_matmuls_probe, judge=_sched_two_matmuls_judge),
            Case("one worker never idles", 1, feedback="no gaps on a single worker",
                 probe=_sched_one_worker_probe, judge=_sched_one_worker_judge),
            Case("random graphs on 2 and 3 workers: valid, makespan <= 1.2x", 2,
                 feedback="dependencies first, no overlap, workers kept busy",
                 probe=_sched_random_probe, judge=_sched_random_judge),
            Case("the critical path first (FIFO order is >= 1.5x slower here)", 3,
                 feedback="priority: the bottom level (longest remaining path)",
                 probe=_sched_critical_probe, judge=_sched_critical_judge),
        ),
    ),
    # 7.4. A wrong idea that still produces plausible output would fail because: numpy's float16
    # (or an ml_dtypes float8, rescaled) decodes none of these formats (E2M5, E6M1 and
    # non-standard biases); the normal-number formula applied everywhere gets subnormals,
    # infinities and NaN wrong; a subnormal exponent of -bias instead of 1 - bias is off by 2x;
    # dropping the sign of zero fails -0.0; a table fails because the biases change every run.
    Exercise(
        id="7.4",
        title="Decode every bit pattern of an 8-bit float",
        target="decode_fp8",
        task="the bit-level decoding",
        forbidden=("numpy:frombuffer", "numpy:ndarray.view", "numpy:generic.view",
                   "struct:unpack"),
        cases=(
            Case("normal numbers (E4M3 bias 9, E6M1 bias 40, E2M5 bias 2)", 1,
                 feedback="(-1)^s · 2^(e - bias) · (1 + m / 2^M)",
                 probe=_fp8_normal_probe, judge=_fp8_normal_judge),
            Case("zeros, subnormals, infinities and NaN", 2,
                 feedback="exponent 0: subnormal; all ones: inf or NaN",
                 probe=_fp8_special_probe, judge=_fp8_special_judge),
            Case("all 256 patterns of E2M5 .. E6M1 with random biases", 2,
                 feedback="every pattern of every format", probe=_fp8_all_probe,
                 judge=_fp8_all_judge),
        ),
    ),
)
