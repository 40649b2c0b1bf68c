"""Exercises of chapter 17 test the idea: the references score full marks on every seed, the
library's own LQR, planner and runtime are refused, and each wrong idea listed in the exercise
modules of ``mlsys_lab/grading/exercises/ch17_robotic_systems/`` scores 0 on the cases that
name it.

Everything runs in process with ``run_cases`` (the probe -> wire -> judge round trip of the
grader). The reference answers are copies of the solution notebook's code.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from mlsys_lab.grading.core.check import run_cases

from ..exercise_results import fails, fails_only, feedback, full, refused

SEEDS = [0, 1, 7, 12345]


# ============================================================================= 17.1 LQR
def lqr_gain(A, B, Q, R, *, iters=100_000, form="right", tol=1e-13):
    P = Q.copy()
    for _ in range(iters):
        if form == "swapped":
            G = R + B.T @ P @ B
            P_next = Q + A @ P @ A.T - A @ P @ B @ np.linalg.solve(G, B.T @ P @ A.T)
        else:
            G = R + B.T @ P @ B
            P_next = Q + A.T @ P @ A - A.T @ P @ B @ np.linalg.solve(G, B.T @ P @ A)
        done = np.abs(P_next - P).max() < tol * max(1.0, np.abs(P_next).max())
        P = P_next
        if done:
            break
    if form == "continuous":
        return np.linalg.solve(R, B.T @ P)
    if form == "no BtPB":
        return np.linalg.solve(R, B.T @ P @ A)
    if form == "swapped":
        return np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A.T)
    if form == "scalar":
        return (B.T @ P @ A) / (R + B.T @ P @ B).sum()
    return np.linalg.solve(R + B.T @ P @ B, B.T @ P @ A)


@pytest.mark.parametrize("seed", SEEDS)
def test_lqr_reference_scores_full_marks(seed):
    full(run_cases("17.1", lqr_gain, seed=seed))


@pytest.mark.parametrize("how, failing", [
    ({"form": "continuous"}, ("a stable system", "an unstable system", "two inputs")),
    ({"form": "no BtPB"}, ("a stable system", "an unstable system", "two inputs")),
    ({"iters": 1}, ("a stable system", "an unstable system", "two inputs", "a slowly")),
    ({"iters": 30, "tol": 0.0}, ("a slowly",)),
    ({"form": "swapped"}, ("a stable system", "an unstable system", "two inputs")),
    ({"form": "scalar"}, ("two inputs",)),
], ids=["continuous-time", "no (R+BtPB)^-1", "one iteration", "30 iterations",
        "transposes swapped", "scalar inverse"])
def test_lqr_wrong_ideas_fail(how, failing):
    with np.errstate(all="ignore"):
        result = run_cases("17.1", lambda A, B, Q, R: lqr_gain(A, B, Q, R, **how), seed=3)
    fails(result, *failing)


def test_lqr_through_the_library_is_refused():
    from mlsys_lab.robotics import lqr

    def through_the_library(A, B, Q, R):
        return lqr.dare(A, B, Q, R).K

    assert refused(run_cases("17.1", through_the_library, seed=0)), "the library ran"


# ============================================================================= 17.2 A*
def astar(grid, start, goal, neighbors, *, h="octile", greedy=False):
    def heuristic(cell):
        dr, dc = abs(cell[0] - goal[0]), abs(cell[1] - goal[1])
        if h == "octile":
            return max(dr, dc) + (math.sqrt(2) - 1) * min(dr, dc)
        if h == "manhattan2":
            return 2.0 * (dr + dc)
        return 0.0

    g, parent, closed = {start: 0.0}, {start: None}, set()
    heap, count = [(heuristic(start), 0, start)], 0

    def path_to(cell):
        path = [cell]
        while parent[path[-1]] is not None:
            path.append(parent[path[-1]])
        return path[::-1]

    while heap:
        _, _, cell = heapq.heappop(heap)
        if cell == goal:
            return path_to(cell)
        if cell in closed:
            continue
        closed.add(cell)
        for nb, step in neighbors(cell):
            if nb in closed:
                continue
            if g[cell] + step < g.get(nb, math.inf):
                g[nb], parent[nb] = g[cell] + step, cell
                count += 1
                heapq.heappush(heap, ((0 if greedy else g[nb]) + heuristic(nb), count, nb))
    return None


@pytest.mark.parametrize("seed", SEEDS)
def test_astar_reference_scores_full_marks(seed):
    full(run_cases("17.2", astar, seed=seed))


def test_dijkstra_fails_only_the_expansion_count():
    result = run_cases("17.2", lambda *a: astar(*a, h="zero"), seed=3)
    fails_only(result, "open grids: strictly fewer")


def test_dijkstra_that_finds_its_own_moves_fails_the_expansion_count():
    """Without calling neighbors, Dijkstra would show zero expansions and pass as A*."""
    def own_moves(grid, start, goal, neighbors):
        calls = []

        def silent(cell):
            calls.append(cell)
            rows, cols = grid.shape
            out = []
            for dr in (-1, 0, 1):
                for dc in (-1, 0, 1):
                    r, c = cell[0] + dr, cell[1] + dc
                    if (dr or dc) and 0 <= r < rows and 0 <= c < cols and not grid[r, c] and \
                            not (dr and dc and (grid[cell[0] + dr, cell[1]]
                                                or grid[cell[0], cell[1] + dc])):
                        out.append(((r, c), math.sqrt(2) if dr and dc else 1.0))
            return out
        return astar(grid, start, goal, silent, h="zero")

    result = run_cases("17.2", own_moves, seed=3)
    fails_only(result, "open grids: strictly fewer")
    assert "neighbors(cell) was called 0 times" in feedback(result), result.report()


@pytest.mark.parametrize("how", [{"h": "manhattan2"}, {"greedy": True}],
                         ids=["manhattan x2", "greedy best-first"])
def test_astar_wrong_ideas_give_longer_paths(how):
    for seed in (3, 4):
        fails(run_cases("17.2", lambda *a: astar(*a, **how), seed=seed), "cluttered grids")


def test_a_path_through_walls_fails():
    def straight_line(grid, start, goal, neighbors):
        neighbors(start)
        n = max(abs(goal[0] - start[0]), abs(goal[1] - start[1]))
        return [(start[0] + round(i * (goal[0] - start[0]) / n),
                 start[1] + round(i * (goal[1] - start[1]) / n)) for i in range(n + 1)]

    fails(run_cases("17.2", straight_line, seed=3), "cluttered grids", "a walled-in goal")


def test_astar_through_the_library_is_refused():
    from mlsys_lab.robotics import planning

    def through_the_library(grid, start, goal, neighbors):
        return planning.astar(grid, start, goal).path

    assert refused(run_cases("17.2", through_the_library, seed=0)), "the library ran"


# ============================================================================= 17.3 KEEP_LAST
class KeepLast:
    def __init__(self, depth):
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.depth, self.items = depth, []

    def push(self, msg):
        self.items.append(msg)
        return self.items.pop(0) if len(self.items) > self.depth else None

    def pop(self):
        return self.items.pop(0) if self.items else None

    def __len__(self):
        return len(self.items)


class DropNewest(KeepLast):
    def push(self, msg):
        if len(self.items) >= self.depth:
            return msg
        self.items.append(msg)
        return None


class Unbounded(KeepLast):
    def push(self, msg):
        self.items.append(msg)
        return None


class OffByOne(KeepLast):
    def push(self, msg):
        self.items.append(msg)
        return self.items.pop(0) if len(self.items) > self.depth + 1 else None


class Lifo(KeepLast):
    def pop(self):
        return self.items.pop() if self.items else None


class Shared(KeepLast):
    items = []

    def __init__(self, depth):
        if depth < 1:
            raise ValueError("depth")
        self.depth = depth


@pytest.mark.parametrize("seed", SEEDS)
def test_keep_last_reference_scores_full_marks(seed):
    full(run_cases("17.3", KeepLast, seed=seed))


@pytest.mark.parametrize("cls, failing", [
    (DropNewest, ("a burst", "depth 1", "a slow subscriber")),
    (Unbounded, ("a burst", "depth 1", "a slow subscriber")),
    (OffByOne, ("a burst", "depth 1", "a slow subscriber")),
    (Lifo, ("a burst", "a slow subscriber")),
    (Shared, ("two queues",)),
], ids=["drop newest", "unbounded", "off by one", "lifo", "class-level list"])
def test_keep_last_wrong_ideas_fail(cls, failing):
    fails(run_cases("17.3", cls, seed=3), *failing)


def test_keep_last_through_the_runtime_is_refused():
    from mlsys_lab.robotics.runtime import Subscription

    class ThroughTheRuntime(KeepLast):
        def __init__(self, depth):
            self.sub = Subscription(None, "t", None, depth, 0.0)  # it checks the depth
            super().__init__(depth)

        def push(self, msg):
            self.sub.offer((0.0, 0, msg))
            return super().push(msg)

    assert refused(run_cases("17.3", ThroughTheRuntime, seed=0)), "the runtime ran"
