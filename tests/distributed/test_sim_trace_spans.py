"""The simulator's trace is ml.Span records (issue 28 item 3): one per compute, send and receive,
on lane "rank N", kind compute/send/recv, details rank, bytes, src, dst, link; its sends add up to
the run's message and byte totals."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab.distributed import collectives, sim


def _ring_run(p, batched):
    def prog(comm, x):
        yield comm.compute(seconds=1e-6 * (comm.rank + 1))
        return (yield from collectives.allreduce(comm, x, algo="ring"))

    cluster = sim.Cluster(sim.ring(p, alpha=2e-6, beta=1e-9), batch_collectives=batched)
    return sim.run(cluster, prog, args=[(np.arange(64.0) + r,) for r in range(p)])


@pytest.mark.parametrize("batched", [False, True])
def test_a_ring_allreduce_trace_is_spans_that_add_up_to_the_run(batched):
    p = 4
    res = _ring_run(p, batched)
    trace = res.trace
    assert all(isinstance(e, ml.Span) and 0 <= e.start <= e.end for e in trace)
    assert {e.lane for e in trace} == {f"rank {r}" for r in range(p)}
    assert all(e.lane == f"rank {e.rank}" for e in trace)
    assert {e.kind for e in trace} == {"compute", "send", "recv"}
    sends = [e for e in trace if e.kind == "send"]
    recvs = [e for e in trace if e.kind == "recv"]
    assert len(sends) == len(recvs) == res.messages == 2 * (p - 1) * p
    assert sum(e.bytes for e in sends) == res.bytes
    for e in sends + recvs:
        assert e.name == f"{e.kind} {e.src}->{e.dst}, {e.bytes} B"
        assert e.dst == (e.src + 1) % p and e.rank == (e.src if e.kind == "send" else e.dst)
    assert all(e.link for e in sends)                     # the link directions a send held
    for r in range(p):                                    # a rank's spans end by its finish
        assert max(e.end for e in trace if e.rank == r) <= res.rank_time[r]
        computes = [e for e in trace if e.rank == r and e.kind == "compute"]
        assert computes[0].duration == pytest.approx(1e-6 * (r + 1))
    assert max(e.end for e in trace) == res.time


@pytest.mark.parametrize("batched", [False, True])
def test_seconds_sums_the_trace_without_making_spans(batched):
    res = _ring_run(4, batched)
    for kind in ("compute", "send", "recv"):
        for rank in (None, 0, 3):
            want = sum(e.end - e.start for e in res.trace
                       if e.kind == kind and (rank is None or e.rank == rank))
            assert res.seconds(kind, rank) == want > 0   # the same sum, in the same order
    assert res.seconds("compute", rank=9) == 0


def test_the_event_loop_and_the_batched_ring_emit_the_same_spans():
    event, batched = _ring_run(4, False), _ring_run(4, True)
    assert sorted(event.trace) == sorted(batched.trace)
    assert event.time == batched.time


def test_no_trace_when_not_asked():
    def prog(comm):
        yield comm.compute(seconds=1e-6)

    assert sim.run(sim.Cluster(sim.ring(2)), prog, args=[()] * 2, trace=False).trace == []
