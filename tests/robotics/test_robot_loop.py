"""The perception → planning → control loop on the runtime: latency, deadline misses and drops
respond to load as the queueing argument says."""

import numpy as np

from mlsys_lab.robotics.robot_loop import run_loop


def test_nominal_loop_reaches_the_goal_without_drops_or_misses():
    r = run_loop(duration=30.0)
    assert r.reached
    assert r.deadline_misses == 0 and all(v == 0 for v in r.drops.values())
    # latency from the scan's publication: perception 10 ms + control 2 ms + actuation 0.5 ms
    # + three hops of alpha = 0.2 ms (and a few bytes at 100 MB/s); at most one odometry
    # callback (0.5 ms) on the perception node in the way
    assert 0.0131 <= np.median(r.latency) < 0.0132 and r.latency.max() < 0.0137
    lanes = {s.lane for s in r.spans}
    assert lanes == {"sensor", "perception", "planner", "controller", "base"}
    assert any(s.kind == "service" and s.lane == "planner" for s in r.spans)


def test_load_causes_drops_and_misses_and_a_deep_queue_makes_data_stale():
    shallow = run_loop(duration=20.0, load=(5.0, 0.12), scan_depth=1)
    deep = run_loop(duration=20.0, load=(5.0, 0.12), scan_depth=10)
    before = shallow.latency[shallow.actuated_at < 5.0]
    assert before.max() < 0.02
    # perception now takes 120 ms for scans every 50 ms: scans are dropped, deadlines missed
    assert shallow.drops["perception/scan"] > 0 and shallow.deadline_misses > 0
    # KEEP_LAST 1 keeps the newest scan: latency stays near one callback + one wait
    assert np.percentile(shallow.latency, 99) < 0.25
    # a deep queue works off a backlog: its latency grows until the queue is full
    assert np.percentile(deep.latency, 99) > 2 * np.percentile(shallow.latency, 99)
