"""Planning on an occupancy grid: A* (and Dijkstra, its ``h = 0`` special case) and a
pure-pursuit path follower for the differential-drive robot.

The grid is a 2-D boolean array, ``True`` = occupied; a cell is ``(row, col)``. Moves are to
the 8 neighbours (straight cost 1, diagonal √2; a diagonal may not cut an occupied corner) or
the 4 (``connectivity=4``). A* pops the open cell of least ``f = g + h`` (ties: least ``h``,
then first pushed) and *expands* it; with an admissible and consistent heuristic (``octile``
for 8 moves, ``manhattan`` for 4) the first time the goal is popped its cost is optimal, and
no cell is expanded twice. ``PlanResult.expanded`` counts expansions — the work A* saves over
Dijkstra. An inadmissible heuristic (``weight > 1``) or greedy best-first (``f = h``) expand
fewer cells but may return a longer path.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, ShapeError

__all__ = ["HEURISTICS", "PlanResult", "astar", "dijkstra", "follow_path", "grid_neighbors",
           "inflate", "path_cost", "pure_pursuit", "random_grid"]

SQRT2 = math.sqrt(2.0)


def _octile(r, c, gr, gc):
    dr, dc = abs(r - gr), abs(c - gc)
    return (SQRT2 - 1.0) * min(dr, dc) + max(dr, dc)


def _manhattan(r, c, gr, gc):
    return abs(r - gr) + abs(c - gc)


def _euclidean(r, c, gr, gc):
    return math.hypot(r - gr, c - gc)


def _zero(r, c, gr, gc):
    return 0.0


HEURISTICS = {"octile": _octile, "manhattan": _manhattan, "euclidean": _euclidean,
              "zero": _zero}


def _check_grid(grid, where):
    g = np.asarray(grid)
    if g.ndim != 2:
        raise ShapeError(f"{where}: grid must be 2-D (rows, cols), got shape {g.shape}")
    return g.astype(bool)


def _check_cell(grid, cell, where, name):
    try:
        r, c = (int(v) for v in cell)
    except (TypeError, ValueError):
        raise ArgumentError(f"{where}: {name} must be a (row, col) pair, got {cell!r}") from None
    if not (0 <= r < grid.shape[0] and 0 <= c < grid.shape[1]):
        raise ArgumentError(f"{where}: {name} {cell} is outside the grid of shape {grid.shape}")
    if grid[r, c]:
        raise ArgumentError(f"{where}: {name} {cell} is an occupied cell")
    return r, c


def grid_neighbors(grid, cell, connectivity=8):
    """``[(neighbour, step cost)]`` of a free cell (no corner cutting on diagonals)."""
    rows, cols = grid.shape
    r, c = cell
    out = []
    for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1)):
        nr, nc = r + dr, c + dc
        if 0 <= nr < rows and 0 <= nc < cols and not grid[nr, nc]:
            out.append(((nr, nc), 1.0))
    if connectivity == 8:
        for dr, dc in ((-1, -1), (-1, 1), (1, -1), (1, 1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and not grid[nr, nc] and \
                    not grid[r + dr, c] and not grid[r, c + dc]:
                out.append(((nr, nc), SQRT2))
    return out


@dataclass(frozen=True)
class PlanResult:
    """``path`` (cells from start to goal; ``None``: unreachable), its ``cost``, ``expanded``
    (cells expanded) and ``order`` (the cells in expansion order, for pictures)."""

    path: list | None
    cost: float
    expanded: int
    order: list


def astar(grid, start, goal, heuristic="octile", weight=1.0, connectivity=8, greedy=False):
    """A* search on an occupancy grid.

    Args:
        grid: ``(rows, cols)`` array, truthy = occupied.
        start, goal: ``(row, col)`` free cells.
        heuristic: a name in :data:`HEURISTICS` or ``h(r, c, goal_r, goal_c)``.
        weight: ``f = g + weight·h`` (``> 1``: weighted A*, not optimal in general).
        connectivity: 8 (diagonal moves cost √2) or 4.
        greedy: greedy best-first search (``f = h``): fast, not optimal.

    Returns:
        :class:`PlanResult`.
    """
    grid = _check_grid(grid, "astar")
    start = _check_cell(grid, start, "astar", "start")
    goal = _check_cell(grid, goal, "astar", "goal")
    if connectivity not in (4, 8):
        raise ArgumentError(f"astar: connectivity must be 4 or 8, got {connectivity}")
    h = HEURISTICS.get(heuristic) if isinstance(heuristic, str) else heuristic
    if h is None or not callable(h):
        raise ArgumentError(f"astar: heuristic must be one of {sorted(HEURISTICS)} or a "
                            f"callable h(r, c, goal_r, goal_c), got {heuristic!r}")
    gr, gc = goal
    g = {start: 0.0}
    parent = {start: None}
    closed = set()
    order = []
    count = 0
    h0 = h(*start, gr, gc)
    heap = [(h0 if greedy else weight * h0, h0, count, start)]
    while heap:
        _, _, _, cell = heapq.heappop(heap)
        if cell in closed:
            continue
        closed.add(cell)
        order.append(cell)
        if cell == goal:
            path = [cell]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])
            return PlanResult(path[::-1], g[goal], len(order), order)
        for nb, step in grid_neighbors(grid, cell, connectivity):
            if nb in closed and not greedy and weight <= 1.0:
                continue
            cand = g[cell] + step
            if cand < g.get(nb, math.inf) - 1e-12:
                g[nb], parent[nb] = cand, cell
                hn = h(*nb, gr, gc)
                count += 1
                heapq.heappush(heap, (hn if greedy else cand + weight * hn, hn, count, nb))
                closed.discard(nb)  # inconsistent heuristics may reopen a cell
    return PlanResult(None, math.inf, len(order), order)


def dijkstra(grid, start, goal, connectivity=8):
    """Dijkstra's algorithm: A* with ``h = 0`` (the baseline: same cost, more expansions)."""
    return astar(grid, start, goal, heuristic="zero", connectivity=connectivity)


def path_cost(path):
    """Length of a cell path with straight steps 1 and diagonal steps √2."""
    total = 0.0
    for (r0, c0), (r1, c1) in zip(path, path[1:]):
        d = abs(r1 - r0) + abs(c1 - c0)
        if d not in (1, 2) or max(abs(r1 - r0), abs(c1 - c0)) != 1:
            raise ArgumentError(f"path_cost: cells {(r0, c0)} and {(r1, c1)} are not neighbours")
        total += 1.0 if d == 1 else SQRT2
    return total


def random_grid(rows, cols, density, seed, keep=()):
    """A seeded random occupancy grid with ``density`` occupied cells (cells in ``keep``
    left free)."""
    rng = np.random.default_rng(seed)
    grid = rng.random((rows, cols)) < density
    for r, c in keep:
        grid[r, c] = False
    return grid


def inflate(grid, radius):
    """Grow obstacles by ``radius`` cells (Chebyshev), so a robot of that size fits."""
    grid = _check_grid(grid, "inflate")
    out = grid.copy()
    rows, cols = grid.shape
    for r, c in zip(*np.nonzero(grid)):
        out[max(0, r - radius):min(rows, r + radius + 1),
            max(0, c - radius):min(cols, c + radius + 1)] = True
    return out


def follow_path(robot, waypoints, x0, speed=0.5, lookahead=0.6, dt=0.05, steps=2000,
                goal_tol=0.1, max_turn=3.0):
    """Drive ``robot`` (a :class:`~.dynamics.DiffDrive`) along ``waypoints`` by pure pursuit.

    The target is the first waypoint at least ``lookahead`` ahead of the robot's progress on
    the path; the turn rate is ``ω = 2 v sin(α) / L`` (``α`` the bearing to the target).

    Args:
        waypoints: ``(k, 2)`` positions ``(x, y)`` in metres.
        x0: initial state ``[x, y, θ]``.

    Returns:
        ``dict(states=(T, 3), controls=(T-1, 2), cross_track=(T,), reached=bool)``.
    """
    pts = np.asarray(waypoints, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 2 or len(pts) < 2:
        raise ShapeError(f"follow_path: waypoints must have shape (k >= 2, 2), got {pts.shape}")
    x = np.asarray(x0, dtype=np.float64).copy()
    states, controls, errors = [x.copy()], [], [_cross_track(pts, x[:2])[0]]
    progress = 0
    reached = False
    for _ in range(steps):
        if np.hypot(*(pts[-1] - x[:2])) < goal_tol:
            reached = True
            break
        v, w, progress = pure_pursuit(x, pts, progress, speed, lookahead, dt, max_turn)
        u = np.array([v, w])
        x = robot.step(x, u, dt)
        states.append(x.copy())
        controls.append(u)
        errors.append(_cross_track(pts, x[:2])[0])
    return dict(states=np.array(states), controls=np.array(controls).reshape(-1, 2),
                cross_track=np.array(errors), reached=reached)


def pure_pursuit(x, pts, progress, speed, lookahead, dt, max_turn=3.0):
    """One pure-pursuit step: ``(v, ω, progress)`` for pose ``x`` on the polyline ``pts``
    (``progress``: index of the waypoint reached so far, never decreasing)."""
    d = np.hypot(*(pts[progress:] - x[:2]).T)
    progress += int(np.argmin(d))
    target, last = pts[-1], True
    for p in pts[progress:]:
        if np.hypot(*(p - x[:2])) >= lookahead:
            target, last = p, False
            break
    alpha = math.atan2(target[1] - x[1], target[0] - x[0]) - x[2]
    alpha = math.atan2(math.sin(alpha), math.cos(alpha))
    dist = float(np.hypot(*(target - x[:2])))
    v = min(speed, dist / max(dt, 1e-9)) if last else speed
    w = float(np.clip(2 * v * math.sin(alpha) / max(lookahead, 1e-9), -max_turn, max_turn))
    if abs(alpha) > math.pi / 2:  # turn on the spot first
        v, w = 0.0, max_turn * math.copysign(1.0, alpha)
    return v, w, progress


def _cross_track(pts, p):
    """Distance from ``p`` to the polyline ``pts`` and the segment index."""
    a, b = pts[:-1], pts[1:]
    ab = b - a
    t = np.clip(((p - a) * ab).sum(1) / np.maximum((ab * ab).sum(1), 1e-18), 0, 1)
    d = np.hypot(*(a + t[:, None] * ab - p).T)
    i = int(np.argmin(d))
    return float(d[i]), i
