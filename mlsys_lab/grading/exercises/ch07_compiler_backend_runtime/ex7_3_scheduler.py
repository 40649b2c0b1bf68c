"""Exercise 7.3: a parallel list scheduler.

Checked for dependency order, per-worker overlap and makespan against the bottom-level list
schedule, including graphs where a scheduler without priorities (FIFO) is 1.5x slower.

Wrong ideas rejected: a list scheduler without a priority (FIFO by readiness or by node id, LIFO,
or "costliest node first") starts the long chain of the critical-path graphs late and finishes
>= 1.5x after the bottom-level schedule; running everything on one worker exceeds 1.2x on the
random graphs and 7 on the two matmuls; starting a node when its worker is free but before its
inputs end, or double-booking a worker, fails validation. No library function list-schedules
with priorities, so nothing is forbidden beyond the grader's own reference.
"""

import math
import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    describe,
    expect_list,
    plain,
    register,
)

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
    for (g, w, cost, what), one in zip(cases, expect_list(raw, len(cases), "random graphs")):
        _judge_against_reference(g, w, cost, one, what)


def _sched_critical_judge(raw, seed):
    cases = _critical_cases(seed)
    for (g, w, cost, what), one in zip(cases, expect_list(raw, len(cases), "critical-path graphs")):
        _judge_against_reference(g, w, cost, one, what)


register(
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
)
