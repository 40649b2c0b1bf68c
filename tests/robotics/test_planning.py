"""A* against Dijkstra (the oracle for the optimal cost) and a brute-force Bellman–Ford on
random grids; the path follower on the differential-drive robot."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.errors import ArgumentError, ShapeError
from mlsys_lab.robotics import dynamics, planning


def bellman_ford(grid, start, connectivity=8):
    """Every free cell's shortest distance from ``start`` by relaxing all edges to a fixed
    point (an oracle that shares nothing with the heap search)."""
    dist = np.full(grid.shape, np.inf)
    dist[start] = 0.0
    changed = True
    while changed:
        changed = False
        for r in range(grid.shape[0]):
            for c in range(grid.shape[1]):
                if grid[r, c] or not np.isfinite(dist[r, c]):
                    continue
                for (nr, nc), step in planning.grid_neighbors(grid, (r, c), connectivity):
                    if dist[r, c] + step < dist[nr, nc] - 1e-12:
                        dist[nr, nc] = dist[r, c] + step
                        changed = True
    return dist


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), density=st.floats(0.0, 0.35),
       rows=st.integers(4, 14), cols=st.integers(4, 14), conn=st.sampled_from([4, 8]))
def test_astar_cost_equals_dijkstra_on_random_grids(seed, density, rows, cols, conn):
    start, goal = (0, 0), (rows - 1, cols - 1)
    grid = planning.random_grid(rows, cols, density, seed, keep=[start, goal])
    h = "octile" if conn == 8 else "manhattan"
    a = planning.astar(grid, start, goal, heuristic=h, connectivity=conn)
    d = planning.dijkstra(grid, start, goal, connectivity=conn)
    assert (a.path is None) == (d.path is None)
    assert a.expanded <= d.expanded
    if a.path is not None:
        assert a.cost == pytest.approx(d.cost, abs=1e-9)
        assert planning.path_cost(a.path) == pytest.approx(a.cost, abs=1e-9)
        assert a.path[0] == start and a.path[-1] == goal
        assert not any(grid[r, c] for r, c in a.path)
        assert len(set(a.path)) == len(a.path)


def test_costs_equal_bellman_ford():
    for seed in range(5):
        grid = planning.random_grid(12, 12, 0.25, seed, keep=[(0, 0)])
        dist = bellman_ford(grid, (0, 0))
        for goal in [(11, 11), (5, 7), (11, 0)]:
            if grid[goal]:
                continue
            res = planning.astar(grid, (0, 0), goal)
            if np.isfinite(dist[goal]):
                assert res.cost == pytest.approx(dist[goal], abs=1e-9)
            else:
                assert res.path is None and math.isinf(res.cost)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), rows=st.integers(6, 25), cols=st.integers(6, 25),
       density=st.floats(0.0, 0.1))
def test_astar_expands_strictly_fewer_on_open_grids(seed, rows, cols, density):
    start, goal = (0, 0), (rows - 1, cols - 1)
    grid = planning.random_grid(rows, cols, density, seed, keep=[start, goal])
    a = planning.astar(grid, start, goal)
    d = planning.dijkstra(grid, start, goal)
    if d.path is not None:
        assert a.expanded < d.expanded
        assert a.cost == pytest.approx(d.cost, abs=1e-9)


def test_inadmissible_and_greedy_are_not_optimal_somewhere():
    worse_weighted = worse_greedy = 0
    for seed in range(30):
        grid = planning.random_grid(20, 20, 0.3, seed, keep=[(0, 0), (19, 19)])
        d = planning.dijkstra(grid, (0, 0), (19, 19))
        if d.path is None:
            continue
        w = planning.astar(grid, (0, 0), (19, 19), heuristic="manhattan", weight=2.0)
        g = planning.astar(grid, (0, 0), (19, 19), greedy=True)
        assert w.cost >= d.cost - 1e-9 and g.cost >= d.cost - 1e-9
        worse_weighted += w.cost > d.cost + 1e-9
        worse_greedy += g.cost > d.cost + 1e-9
    assert worse_weighted > 0 and worse_greedy > 0


def test_path_follower_reaches_the_goal_of_an_astar_path():
    grid = planning.inflate(planning.random_grid(25, 25, 0.08, 4, keep=[(0, 0), (24, 24)]), 0)
    plan = planning.astar(grid, (0, 0), (24, 24))
    pts = np.array(plan.path, dtype=float)[:, ::-1] * 0.2  # (col, row) cells of 0.2 m
    run = planning.follow_path(dynamics.DiffDrive(), pts, [0.0, 0.0, 0.0], speed=0.5,
                               lookahead=0.5)
    assert run["reached"]
    assert run["cross_track"].max() < 0.4
    assert np.hypot(*(run["states"][-1, :2] - pts[-1])) < 0.1


def test_inflate_and_errors():
    grid = np.zeros((5, 5), bool)
    grid[2, 2] = True
    assert planning.inflate(grid, 1).sum() == 9
    with pytest.raises(ArgumentError, match="occupied"):
        planning.astar(grid, (2, 2), (0, 0))
    with pytest.raises(ArgumentError, match="outside the grid"):
        planning.astar(grid, (0, 0), (9, 9))
    with pytest.raises(ShapeError, match="astar"):
        planning.astar(np.zeros(5), (0, 0), (1, 1))
    with pytest.raises(ArgumentError, match="heuristic"):
        planning.astar(grid, (0, 0), (4, 4), heuristic="nope")
