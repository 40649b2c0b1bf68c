"""The serving simulator's invariants and policies, the cost model's fit, weight-only int8."""

import numpy as np
import pytest

import mlsys_lab as ml
from mlsys_lab import llm
from mlsys_lab.llm.simulator import CostModel

COST = CostModel(base=2e-3, per_seq=1e-4, per_context=1e-7, per_prefill=2e-6)


def test_trace_is_seeded_and_follows_the_stated_laws():
    a = llm.poisson_trace(3000, rate=5.0, seed=1)
    assert a == llm.poisson_trace(3000, rate=5.0, seed=1)
    prompts = np.array([r.prompt for r in a])
    outputs = np.array([r.output for r in a])
    gaps = np.diff([0.0] + [r.arrival for r in a])
    assert prompts.min() >= 16 and prompts.max() <= 512
    assert 120 < outputs.mean() < 136 and outputs.min() >= 1 and outputs.max() <= 512
    assert gaps.mean() == pytest.approx(0.2, rel=0.05)


@pytest.mark.parametrize("policy", llm.simulator.POLICIES)
def test_every_request_finishes_with_its_tokens(policy):
    trace = llm.poisson_trace(60, rate=40.0, seed=2)
    r = llm.simulate(trace, policy, kv_tokens=8192, cost=COST)
    assert r.finished == 60 and r.generated_tokens == sum(t.output for t in trace)
    assert 0.0 <= r.waste <= 1.0 and np.all(r.latencies > 0)
    assert r.p50_latency <= r.p99_latency
    assert r.throughput == pytest.approx(r.generated_tokens / r.makespan)


def test_paged_beats_static_and_wastes_little():
    trace = llm.poisson_trace(200, rate=50.0, seed=3)
    res = {p: llm.simulate(trace, p, kv_tokens=16384, cost=COST)
           for p in llm.simulator.POLICIES}
    assert res["paged"].throughput > res["contiguous"].throughput > res["static"].throughput
    assert res["paged"].throughput > 2 * res["static"].throughput
    assert res["paged"].waste < 0.05 < 0.4 < res["contiguous"].waste


def test_paged_preempts_when_memory_runs_out():
    trace = llm.poisson_trace(40, rate=100.0, seed=4)
    r = llm.simulate(trace, "paged", kv_tokens=2048, cost=COST)
    assert r.finished == 40 and r.preemptions > 0


def test_cost_model_fits_measured_steps(tiny):
    cost, data = llm.measure_cost_model(tiny, batch_sizes=(1, 4), contexts=(8, 32),
                                        prefill=(8, 32), repeats=1)
    assert len(data["decode"]) == 4 and len(data["prefill"]) == 2
    assert min(cost.base, cost.per_seq, cost.per_context, cost.per_prefill) >= 0
    measured = [t for *_, t in data["decode"]]
    predicted = [cost.step_seconds(b, b * L, 0) for b, L, _ in data["decode"]]
    assert 0 < min(predicted) and max(predicted) < 3 * max(measured)


def test_int8_weights_are_per_channel_and_close(tiny):
    q = llm.quantize_weights(tiny)
    lin = q.blocks[0].qkv
    assert isinstance(lin, llm.Int8Linear) and lin.qweight.dtype == np.int8
    w = tiny.blocks[0].qkv.weight.numpy()
    assert lin.scale.shape == (w.shape[1],)
    assert np.allclose(lin.scale, np.abs(w).max(axis=0) / 127, rtol=1e-6)
    assert np.abs(lin.qweight.astype(np.float32) * lin.scale - w).max() <= lin.scale.max() / 2
    diff = llm.quant.compare_logits(tiny, q, np.arange(20)[None])
    assert 0 < diff["rel_rms"] < 0.02
    assert llm.quant.weight_bytes(q) < 0.45 * llm.quant.weight_bytes(tiny)
    with ml.no_grad():
        assert np.isfinite(q(np.arange(5)[None]).numpy()).all()
