"""Exercise 17.2: A* on an occupancy grid.

The student writes ``astar(grid, start, goal, neighbors)``: ``grid`` is a boolean array
(``True`` = occupied), cells are ``(row, col)`` tuples, and ``neighbors(cell)`` lists
``(next_cell, step_cost)`` for the 8 moves (1 straight, √2 diagonal, no corner cutting). It
returns the path as a list of cells from ``start`` to ``goal``, or ``None`` when there is
none. The answer must get its moves from ``neighbors``: each call is one *expansion*, and the
probe counts them.

The judge's oracle is the shortest-path cost from a Bellman–Ford relaxation written here (it
shares nothing with a heap search), and the least number of expansions any Dijkstra must make:
every cell strictly closer to the start than the goal (Dijkstra pops cells in order of
distance, whatever its tie-breaking). A* with an admissible, consistent heuristic (octile
distance) must return an optimal path and, on open grids, expand *strictly fewer* cells than
that.

Wrong ideas rejected: Dijkstra (``h = 0``: optimal but it expands every closer cell);
an inadmissible heuristic (Manhattan × 2 with diagonal moves: fewer expansions, a longer path
on the cluttered grids); greedy best-first (``f = h``: a longer path on the cluttered grids);
returning a path through occupied cells or with jumps (the path is checked move by move);
a search that finds its moves without calling ``neighbors`` (Dijkstra with its own move list
would then show zero expansions: the "fewer expansions" case asks for at least one call per
cell the path leaves from).
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

SQRT2 = math.sqrt(2.0)

# ----------------------------------------------------------------------------- inputs


def _moves(grid, cell):
    rows, cols = grid.shape
    r, c = cell
    out = []
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        nr, nc = r + dr, c + dc
        if 0 <= nr < rows and 0 <= nc < cols and not grid[nr, nc]:
            out.append(((nr, nc), 1.0))
    for dr, dc in ((-1, -1), (-1, 1), (1, -1), (1, 1)):
        nr, nc = r + dr, c + dc
        if 0 <= nr < rows and 0 <= nc < cols and not grid[nr, nc] and \
                not grid[r + dr, c] and not grid[r, c + dc]:
            out.append(((nr, nc), SQRT2))
    return out


def _distances(grid, start):
    """Every cell's shortest distance from ``start``: Bellman–Ford sweeps to a fixed point."""
    dist = np.full(grid.shape, np.inf)
    dist[start] = 0.0
    free = [tuple(int(v) for v in cell) for cell in zip(*np.nonzero(~grid))]
    changed = True
    while changed:
        changed = False
        for cell in free:
            d = dist[cell]
            if not np.isfinite(d):
                continue
            for nb, step in _moves(grid, cell):
                if d + step < dist[nb] - 1e-12:
                    dist[nb] = d + step
                    changed = True
    return dist


def _best_first(grid, start, goal, h, greedy=False):
    """A small best-first search used only to pick grids that trap the wrong ideas."""
    g, heap, closed, n = {start: 0.0}, [(h(start, goal), 0, start)], set(), 0
    while heap:
        _, _, cell = heapq.heappop(heap)
        if cell == goal:
            return g[cell]
        if cell in closed:
            continue
        closed.add(cell)
        for nb, step in _moves(grid, cell):
            if nb not in closed and g[cell] + step < g.get(nb, math.inf):
                g[nb] = g[cell] + step
                n += 1
                heapq.heappush(heap, ((0 if greedy else g[nb]) + h(nb, goal), n, nb))
    return math.inf


def _manhattan2(a, b):
    return 2.0 * (abs(a[0] - b[0]) + abs(a[1] - b[1]))


def _octile(a, b):
    dr, dc = abs(a[0] - b[0]), abs(a[1] - b[1])
    return max(dr, dc) + (SQRT2 - 1) * min(dr, dc)


def _open_grid(seed: int, k: int):
    rng = np.random.default_rng(17200 + 31 * seed + k)
    rows, cols = int(rng.integers(18, 26)), int(rng.integers(18, 26))
    grid = rng.random((rows, cols)) < (0.0 if k == 0 else 0.05)
    start = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
    goal = (rows - 1 - int(rng.integers(0, 3)), cols - 1 - int(rng.integers(0, 3)))
    grid[start] = grid[goal] = False
    return grid, start, goal


def _cluttered_grid(seed: int, k: int):
    """A random 16 × 16 grid at density 0.3 on which greedy best-first and Manhattan × 2 both
    return a longer path than the optimum (drawn until one is found; about half the grids)."""
    rng = np.random.default_rng(17250 + 101 * seed + k)
    while True:
        grid = rng.random((16, 16)) < 0.3
        start, goal = (0, 0), (15, 15)
        grid[start] = grid[goal] = False
        best = _best_first(grid, start, goal, _octile)
        if not math.isfinite(best):
            continue
        if _best_first(grid, start, goal, _octile, greedy=True) > best + 1e-9 and \
                _best_first(grid, start, goal, _manhattan2) > best + 1e-9:
            return grid, start, goal


def _walled_grid(seed: int):
    rng = np.random.default_rng(17290 + seed)
    grid = rng.random((12, 12)) < 0.1
    r, c = int(rng.integers(4, 8)), int(rng.integers(4, 8))
    grid[r - 1:r + 2, c - 1:c + 2] = True
    grid[r, c] = False  # the goal, walled in on all eight sides
    grid[0, 0] = False
    return grid, (0, 0), (r, c)


# ----------------------------------------------------------------------------- probes


def _run(astar, grid, start, goal):
    calls = []

    def neighbors(cell):
        cell = (int(cell[0]), int(cell[1]))
        calls.append(cell)
        return list(_moves(grid, cell))

    path = attempt(astar, grid.copy(), start, goal, neighbors)
    if path is not None and not isinstance(path, BaseException) and hasattr(path, "__iter__") \
            and not isinstance(path, (str, bytes)):
        try:
            path = [[int(v) for v in cell] for cell in path]
        except (TypeError, ValueError):
            pass
    return {"path": path, "expanded": len(calls)}


def _probe(make, count):
    def probe(astar, seed):
        return [_run(astar, *make(seed, k)) for k in range(count)]
    return probe


def _walled_probe(astar, seed):
    return _run(astar, *_walled_grid(seed))


# ----------------------------------------------------------------------------- judges


def _path_cost(raw_path, grid, start, goal, what):
    if not isinstance(raw_path, list) or not raw_path:
        raise AssertionError(f"{what}: expected a list of (row, col) cells, got "
                             f"{describe(raw_path)}")
    cells = [tuple(c) if isinstance(c, list) and len(c) == 2 else None for c in raw_path]
    if any(c is None for c in cells):
        raise AssertionError(f"{what}: every path entry should be a (row, col) pair, got "
                             f"{describe(raw_path)}")
    if cells[0] != start or cells[-1] != goal:
        raise AssertionError(f"{what}: the path should run from {start} to {goal}, it runs "
                             f"from {cells[0]} to {cells[-1]}")
    cost = 0.0
    for a, b in zip(cells, cells[1:]):
        step = dict(_moves(grid, a)).get(b)
        if step is None:
            raise AssertionError(f"{what}: {a} -> {b} is not a legal move (occupied, a jump, "
                                 f"or a diagonal cutting an occupied corner)")
        cost += step
    return cost


def _judge_grids(make, count, what, fewer):
    def judge(raw, seed):
        if not isinstance(raw, list) or len(raw) != count:
            raise AssertionError(f"{what}: expected {count} results, got {describe(raw)}")
        for k, got in enumerate(raw):
            grid, start, goal = make(seed, k)
            dist = _distances(grid, start)
            path = got["path"]
            if isinstance(path, BaseException) or not isinstance(path, list):
                raise AssertionError(f"{what} {k + 1}: astar returned {describe(path)}, "
                                     f"expected a path")
            cost = _path_cost(path, grid, start, goal, f"{what} {k + 1}")
            if cost > dist[goal] + 1e-9:
                raise AssertionError(
                    f"{what} {k + 1}: the path costs {cost:.4f}, the shortest costs "
                    f"{dist[goal]:.4f} (is the heuristic admissible — never more than the true "
                    f"remaining cost — and is the open set ordered by g + h?)")
            closer = int((dist < dist[goal] - 1e-9).sum())
            if fewer and got["expanded"] < len(path) - 1:
                raise AssertionError(
                    f"{what} {k + 1}: neighbors(cell) was called {got['expanded']} times for a "
                    f"path of {len(path)} cells: every cell the search leaves from must be "
                    f"expanded through neighbors(cell) (the expansions are counted there)")
            if fewer and got["expanded"] >= closer:
                raise AssertionError(
                    f"{what} {k + 1}: {got['expanded']} expansions; any Dijkstra expands the "
                    f"{closer} cells closer to the start than the goal: A* with an informative "
                    f"heuristic (octile distance) must expand fewer")
    return judge


def _walled_judge(raw, seed):
    if raw["path"] is not None:
        raise AssertionError(f"the goal is walled in: astar should return None, got "
                             f"{describe(raw['path'])}")


register(
    Exercise(
        id="17.2",
        title="A* on an occupancy grid",
        target="astar",
        task="A* search",
        forbidden=("mlsys_lab.robotics.planning",),
        cases=(
            Case("open grids: an optimal path", 1,
                 feedback="return the cells from start to goal, each step a legal move",
                 probe=_probe(_open_grid, 2),
                 judge=_judge_grids(_open_grid, 2, "open grid", fewer=False)),
            Case("open grids: strictly fewer expansions than Dijkstra", 2,
                 feedback="order the open set by f = g + h with h the octile distance",
                 probe=_probe(_open_grid, 2),
                 judge=_judge_grids(_open_grid, 2, "open grid", fewer=True)),
            Case("cluttered grids: the cost equals Dijkstra's", 2,
                 feedback="h must never overestimate (octile, not Manhattan × 2), and the "
                          "open set is ordered by g + h, not h alone",
                 probe=_probe(_cluttered_grid, 3),
                 judge=_judge_grids(_cluttered_grid, 3, "cluttered grid", fewer=False)),
            Case("a walled-in goal: None", 1,
                 feedback="when the open set empties without reaching the goal, return None",
                 probe=_walled_probe, judge=_walled_judge),
        ),
    ),
)
