"""``ShardedTables.simulate``: the sharded tables' pulls and pushes as rank programs on the
distributed simulator. Its simulated time equals the alpha-beta formula worked out here by hand
when nothing contends, its bytes are exactly the touched rows' keys and values, it moves the
same rows and leaves the same tables as the counting mode (pull/push), and queueing on a link
shows when two tables' messages share one."""

import numpy as np
import pytest

from mlsys_lab import recsys as rs
from mlsys_lab.engine.sparse import RowSparse

ALPHA, BETA = 5e-6, 1 / 12.5e9


def _tables(r):
    return [r.standard_normal((60, 8)).astype(np.float32),
            r.standard_normal((40, 8)).astype(np.float32)]


@pytest.mark.parametrize("scheme", ["row", "table", "column"])
def test_simulated_step_moves_the_touched_rows_and_costs_the_alpha_beta_formula(scheme):
    r = np.random.default_rng(0)
    tables = _tables(r)
    ids = np.array([5, 17, 5, 39, 17, 0, 22])
    touched = np.unique(ids)
    grad = RowSparse(ids, r.standard_normal((ids.size, 8)).astype(np.float32), 40)
    sim_ps, count_ps = rs.ShardedTables(tables, 3, scheme), rs.ShardedTables(tables, 3, scheme)
    step = sim_ps.simulate(pulls=[(1, ids)], pushes=[(1, grad)], lr=0.5, alpha=ALPHA, beta=BETA)
    rows = count_ps.pull(1, ids)
    count_ps.push(1, grad, lr=0.5)

    # the same rows, the same tables afterwards
    np.testing.assert_array_equal(step.rows[0].indices, touched)
    np.testing.assert_array_equal(step.rows[0].values, rows.values)
    np.testing.assert_array_equal(step.rows[0].values, tables[1][touched])
    for t in (0, 1):
        np.testing.assert_array_equal(sim_ps.table(t), count_ps.table(t))

    # bytes: each touched row's key (once per server that holds a part of it) and values,
    # pulled and pushed; the acknowledgements are empty
    copies = 3 if scheme == "column" else 1
    touched_bytes = touched.size * (8 * copies + 8 * 4)
    assert step.bytes == 2 * touched_bytes == sim_ps.bytes_pulled + sim_ps.bytes_pushed
    assert sim_ps.server_bytes == count_ps.server_bytes

    # time, by hand: per server, request + reply, then push + acknowledgement, each message
    # alpha + bytes * beta; servers in parallel on their own links; phases one after the other
    if scheme == "row":
        parts = [touched[touched % 3 == s] for s in range(3)]
        pull_bytes = [(8 + 32) * p.size for p in parts]
    elif scheme == "table":
        pull_bytes = [(8 + 32) * touched.size if s == sim_ps.home[1] else 0 for s in range(3)]
    else:
        widths = [c.size for c in sim_ps.columns(1)]
        pull_bytes = [(8 + 4 * w) * touched.size for w in widths]
    phase = max(2 * ALPHA + b * BETA for b in pull_bytes if b)
    assert step.time == pytest.approx(2 * phase, rel=1e-12)
    # which is what the counting mode's formula gives for this uncontended step
    assert step.time == pytest.approx(count_ps.step_time(ALPHA, BETA), rel=1e-12)
    assert step.messages == count_ps.messages


def test_messages_that_share_a_link_queue():
    """Two tables on one server: their pulls share the worker-server link, so the step costs
    less than two separate round trips (the second message streams right behind the first)
    but more than one."""
    r = np.random.default_rng(1)
    tables = _tables(r)
    one = rs.ShardedTables(tables, 1, "table").simulate(pulls=[(0, np.arange(30))],
                                                        alpha=ALPHA, beta=BETA)
    both = rs.ShardedTables(tables, 1, "table").simulate(
        pulls=[(0, np.arange(30)), (1, np.arange(30))], alpha=ALPHA, beta=BETA)
    assert one.time < both.time < 2 * one.time
    assert both.bytes == 2 * one.bytes == 2 * 30 * (8 + 32)


def test_simulate_refuses_bad_requests():
    ps = rs.ShardedTables(_tables(np.random.default_rng(2)), 2, "row")
    with pytest.raises(rs.sharding.ArgumentError, match="simulate: ids outside"):
        ps.simulate(pulls=[(0, [60])])
    with pytest.raises(rs.sharding.ShapeError, match="push: needs a RowSparse"):
        ps.simulate(pushes=[(0, np.zeros((60, 8)))])
