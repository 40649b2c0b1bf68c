"""The ROS-2-like runtime: KEEP_LAST keeps the newest ``depth`` messages, services never lose
a request, a cancelled action stops, parameters are validated, all on the simulator's engine."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlsys_lab.distributed.sim.engine import Engine
from mlsys_lab.errors import ArgumentError
from mlsys_lab.robotics.runtime import Runtime
from mlsys_lab.span import Span


def burst_then_drain(depth, burst, cost=0.01):
    """A publisher sends ``burst`` messages at once to a subscriber busy for ``cost`` each."""
    rt = Runtime(alpha=1e-4, beta=0.0)
    pub, sub_node = rt.create_node("pub"), rt.create_node("sub")
    got = []
    sub = sub_node.create_subscription("t", lambda m: got.append(m.seq), depth=depth,
                                       cost=cost)
    rt.at(0.001, lambda: [pub.publish("t", i) for i in range(burst)])
    rt.run(1.0)
    return got, sub


@settings(max_examples=30, deadline=None)
@given(depth=st.integers(1, 8), burst=st.integers(1, 25))
def test_keep_last_keeps_the_newest_depth(depth, burst):
    got, sub = burst_then_drain(depth, burst)
    # all arrive at once, before the first callback starts: the newest `depth` survive
    assert got == list(range(max(0, burst - depth), burst))
    assert sub.dropped == max(0, burst - depth) == len(sub.dropped_seqs)
    assert sub.dropped_seqs == list(range(max(0, burst - depth)))
    assert sub.received == burst


def test_keep_all_drops_nothing_and_slow_subscriber_falls_behind():
    got, sub = burst_then_drain(None, 40)
    assert got == list(range(40)) and sub.dropped == 0
    rt = Runtime(alpha=0.0, beta=0.0)
    cam, slow = rt.create_node("cam"), rt.create_node("slow")
    seen = []
    s = slow.create_subscription("img", lambda m: seen.append(m.seq), depth=2, cost=0.025)
    cam.create_timer(0.01, lambda: cam.publish("img", np.zeros(8)))
    rt.run(0.5)
    assert s.dropped > 0 and s.taken + s.dropped + len(s.queue) == s.received
    assert s.processed in (s.taken, s.taken - 1)
    assert seen == sorted(seen)  # never out of order
    lat = rt.latencies("slow", "img")
    assert lat.min() >= 0.025 - 1e-12  # at least the callback's own cost


def test_message_latency_is_alpha_plus_bytes_beta():
    rt = Runtime(alpha=2e-3, beta=1e-6)
    a, b = rt.create_node("a"), rt.create_node("b")
    arrivals = []
    b.create_subscription("x", lambda m: arrivals.append(rt.now() - m.sent), depth=1)
    rt.at(0.1, lambda: a.publish("x", np.zeros(100)))  # 800 bytes
    rt.run(1.0)
    assert arrivals == [pytest.approx(2e-3 + 800e-6)]
    assert isinstance(rt.engine, Engine)


def test_services_never_lose_a_request():
    rt = Runtime(alpha=1e-4, beta=0.0)
    server, client = rt.create_node("server"), rt.create_node("client")
    server.create_service("square", lambda x: x * x, cost=0.005)
    futures = []
    answered = []

    def flood():
        for i in range(100):  # 100 requests at once; the server needs 0.5 s for them
            futures.append(client.call_async("square", i, callback=lambda f: answered.append(
                f.result())))
    rt.at(0.01, flood)
    rt.run(2.0)
    assert all(f.done() for f in futures)
    assert [f.result() for f in futures] == [i * i for i in range(100)]
    assert answered == [i * i for i in range(100)]
    assert max(f.answered for f in futures) > 0.5  # they queued, none was dropped


def test_a_cancelled_action_stops():
    def count_to(n):
        for i in range(n):
            yield i
        return "done"

    rt = Runtime(alpha=1e-3, beta=0.0)
    server, client = rt.create_node("server"), rt.create_node("client")
    server.create_action_server("count", count_to, step_cost=0.01)
    handles = {}
    rt.at(0.0 + 1e-9, lambda: handles.update(full=client.send_goal("count", 5)))
    rt.at(0.001, lambda: handles.update(cut=client.send_goal("count", 1000)))
    rt.at(0.3, lambda: handles["cut"].cancel())
    rt.run(2.0)
    full, cut = handles["full"], handles["cut"]
    assert full.status == "succeeded" and full.result == "done" and full.feedback == [0, 1, 2,
                                                                                        3, 4]
    assert cut.status == "canceled" and cut.result is None
    assert 0 < len(cut.feedback) < 100
    assert cut.feedback == list(range(len(cut.feedback)))
    # it stopped within a step of the cancel arriving (latency 1 ms, steps of 10 ms shared
    # with nothing else after the first goal finished)
    assert cut.finished - cut.cancel_sent < 0.03
    steps = [s for s in rt.spans if s.lane == "server" and s.detail.get("step") is not None
             and s.start > cut.finished]
    assert steps == []


def test_parameters_are_declared_and_validated():
    rt = Runtime()
    node = rt.create_node("ctrl")
    node.declare_parameter("gain", 1.0)
    node.add_on_set_parameters_callback(
        lambda name, value: (value > 0, "gain must be positive") if name == "gain" else
        (True, ""))
    assert node.set_parameter("gain", 2.5) == (True, "")
    assert node.set_parameter("gain", -1.0) == (False, "gain must be positive")
    assert node.get_parameter("gain") == 2.5
    with pytest.raises(ArgumentError, match="not declared"):
        node.get_parameter("speed")
    with pytest.raises(ArgumentError, match="declared already"):
        node.declare_parameter("gain", 3.0)


def test_timers_overrun_and_spans_are_recorded():
    rt = Runtime()
    node = rt.create_node("busy")
    t = node.create_timer(0.01, lambda: None, cost=0.025)
    rt.run(0.2)
    assert t.overruns > 0 and t.ticks == 19
    spans = [s for s in rt.spans if s.kind == "timer"]
    assert spans and all(isinstance(s, Span) and s.lane == "busy" for s in spans)
    assert all(b.start >= a.end - 1e-12 for a, b in zip(spans, spans[1:]))  # one executor


def test_runtime_errors():
    rt = Runtime()
    node = rt.create_node("n")
    with pytest.raises(ArgumentError, match="depth"):
        node.create_subscription("t", print, depth=0)
    with pytest.raises(ArgumentError, match="no service"):
        node.call_async("missing", 1)
    with pytest.raises(ArgumentError, match="exists"):
        rt.create_node("n")
    rt.run(0.01)
    with pytest.raises(ArgumentError, match="runs once"):
        rt.run(0.01)


def keep_last_model(arrivals, cost, depth):
    """Which messages a single-threaded subscriber takes, by hand: a list, the oldest dropped."""
    seen, queue, free_at = [], [], 0.0
    for i, at in enumerate(arrivals):
        while queue and free_at <= at:
            seen.append(queue.pop(0))
            free_at += cost
        queue.append(i)
        if len(queue) > depth:
            queue.pop(0)
        if free_at < at and len(queue) == 1:
            free_at = at
    return seen, queue


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_a_periodic_publisher_and_a_slow_subscriber_match_the_hand_model(depth):
    period, cost, n = 0.0625, 0.2, 40
    rt = Runtime(alpha=0.0, beta=0.0)
    pub, sub_node = rt.create_node("pub"), rt.create_node("sub")
    got = []
    sub = sub_node.create_subscription("t", lambda m: got.append(m.seq), depth=depth, cost=cost)
    pub.create_timer(period, lambda: pub.publish("t", 0))
    rt.run(period * (n + 0.5))
    arrivals = [period * (k + 1) for k in range(n)]
    seen, _ = keep_last_model(arrivals, cost, depth)
    m = min(len(got), len(seen)) - 1  # the run stops mid-callback; compare what both finished
    assert m >= 10 and got[:m] == seen[:m]
    assert sub.dropped > 0


def test_runs_are_deterministic():
    def run():
        rt = Runtime()
        a, b = rt.create_node("a"), rt.create_node("b")
        b.create_subscription("x", lambda m: b.publish("y", m.data), depth=2, cost=0.013)
        a.create_timer(0.01, lambda: a.publish("x", np.ones(4)), cost=0.001)
        a.create_subscription("y", lambda m: None, depth=1, cost=0.002)
        rt.run(0.5)
        return rt.spans
    assert run() == run()
