"""Exercise 7.1: a greedy-by-size memory planner.

Checked for valid plans that reuse memory, the exact greedy placement when sizes differ, and the
arena against the lower bound.

Wrong ideas rejected: no reuse (tensors one after another) is valid but fails the reuse bound,
the 10-unit example and the edge cases; first fit in order of birth, smallest first, best fit or
a different gap rule give valid plans but not the greedy-by-size offsets on the distinct-size
sets; treating ``end`` as exclusive overlaps tensors that share their last step; a table for the
chapter's example fails because it is scaled, renamed, shifted and shuffled on every run.

``forbidden``: the planner ``mlsys_lab.engine.memory.plan``, the public strategies by their
package names, and the whole module ``mlsys_lab.engine.memory.strategies`` — every function
compiled from it, which covers its placement helpers (the gap search, the placed-tensor columns,
the "best of all strategies" loop) besides the strategies themselves. The solution uses only
``Lifetime`` (``engine/memory/records.py``), which stays allowed.
"""

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


def _gbs_book_judge(raw, seed):
    recs, unit = _book_lifetimes(seed)
    _, arena = _arena(raw, recs, "the 7-tensor example")
    if arena > 10 * unit:
        raise AssertionError(f"the 7-tensor example (unit {unit:,} B): your arena is {arena:,} B "
                             f"= {arena / unit:g} units; greedy by size fits all seven in the 10 "
                             f"units ({10 * unit:,} B) the lower bound allows")


def _gbs_edge_judge(raw, seed):
    unit, one, disjoint, same_step = _edge_lifetimes(seed)
    raw = expect_list(raw, 3, "single, disjoint and simultaneous tensors")
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
    for i, one in enumerate(expect_list(raw, _N_SETS, f"{_N_SETS} random sets")):
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

    for i, one in enumerate(expect_list(raw, 30, "30 random sets with distinct sizes")):
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


register(
    Exercise(
        id="7.1",
        title="A greedy-by-size memory planner",
        target="greedy_by_size",
        task="the greedy-by-size placement",
        forbidden=(
            # the whole module, placement helpers too (listed first: a refusal of a public
            # strategy below keeps its public name)
            "mlsys_lab.engine.memory.strategies",
            "mlsys_lab.engine.memory:plan",
            "mlsys_lab.engine.memory:naive",
            "mlsys_lab.engine.memory:first_fit",
            "mlsys_lab.engine.memory:best_fit",
            "mlsys_lab.engine.memory:greedy_by_size",
            "mlsys_lab.engine.memory:greedy_by_breadth",
            "mlsys_lab.engine.memory:local_search",
            "mlsys_lab.engine.memory:two_cursor",
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
)
