"""Exercise 11.4: a bounded-staleness (SSP) parameter server, driven by an event loop with a
straggler and compared step by step with the rule.

Wrong ideas rejected: asynchronous updates without a bound let the fast workers run 4+ steps
ahead of the straggler (gate and straggler cases); a fully synchronous gate (start only when
level with the slowest) makes fast workers wait while they are within the bound; an off-by-one
gate (< s) waits one step early; averaging the pushes of a round before applying them, or
scaling lr by 1 / W, changes the loss after each push.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, plain, register

# ----------------------------------------------------------------------------- inputs (both sides)

SSP_WORKERS, SSP_STEPS, SSP_LR = 4, 10, 0.05


def _regression(seed):
    rng = np.random.default_rng([seed, 11])
    X = rng.standard_normal((240, 6))
    y = X @ rng.standard_normal(6) + 0.01 * rng.standard_normal(240)
    return X, y


def _durations(seed):
    """Seconds each worker's step takes: about 1, and 3 for worker 3 (a straggler)."""
    rng = np.random.default_rng([seed, 12])
    base = np.array([1.0, 1.1, 0.9, 3.0])
    return base[:, None] * (1 + 0.1 * rng.random((SSP_WORKERS, SSP_STEPS)))


def _gate_states(seed):
    """(clocks, staleness): pushes per worker and the bound, for direct questions."""
    rng = np.random.default_rng([seed, 13])
    states = [([4, 2, 1], 2), ([4, 2, 1], 3), ([3, 3, 3], 0), ([5, 1, 3, 1], 1), ([0, 0], 0)]
    for _ in range(3):
        states.append((rng.integers(0, 7, 4).tolist(), int(rng.integers(0, 4))))
    return states


# ----------------------------------------------------------------------------- probes


def _ssp_drive(server_cls, staleness, durations, seed):
    """Workers on an event loop: a worker asks ``can_start``, pulls, computes for its duration
    and pushes; a waiting worker asks again after every push. Returns what happened."""
    X, y = _regression(seed)
    server = server_cls(np.zeros(X.shape[1]), SSP_WORKERS, staleness, SSP_LR)
    done, waiting = [0] * SSP_WORKERS, set()
    starts, curve, heap, seq = [], [], [], 0

    def try_start(w, now):
        nonlocal seq
        step = done[w]
        if step >= SSP_STEPS:
            return
        if not server.can_start(w):
            waiting.add(w)
            return
        waiting.discard(w)
        starts.append((w, step, float(now), step - min(done)))
        weights = np.asarray(server.pull(w), dtype=np.float64)
        rows = np.random.default_rng([seed, w, step]).choice(len(y), 16, replace=False)
        grad = X[rows].T @ (X[rows] @ weights - y[rows]) / len(rows)
        seq += 1
        heapq.heappush(heap, (now + float(durations[w][step]), seq, w, grad))

    for w in range(SSP_WORKERS):
        try_start(w, 0.0)
    while heap:
        now, _, w, grad = heapq.heappop(heap)
        server.push(w, grad)
        done[w] += 1
        weights = np.asarray(server.pull(w), dtype=np.float64)
        curve.append((float(now), float(0.5 * np.mean((X @ weights - y) ** 2))))
        for v in [w] + sorted(waiting - {w}):
            try_start(v, now)
    return {"starts": starts, "curve": curve, "done": list(done),
            "weights": np.asarray(server.pull(0), dtype=np.float64)}


def _ssp_gate_probe(SSPServer, seed):
    answers = []
    for clocks, staleness in _gate_states(seed):
        server = SSPServer(np.zeros(3), len(clocks), staleness, 0.1)
        for w, count in enumerate(clocks):
            for _ in range(count):
                server.push(w, np.zeros(3))
        answers.append([server.can_start(w) for w in range(len(clocks))])
    return answers


def _ssp_straggler_probe(SSPServer, seed):
    return _ssp_drive(SSPServer, 2, _durations(seed), seed)


def _ssp_bsp_probe(SSPServer, seed):
    return _ssp_drive(SSPServer, 0, _durations(seed), seed)


# ----------------------------------------------------------------------------- judges


class _ReferenceSSP:
    """The rule as the judges apply it (asynchronous updates, a gate on the slowest clock)."""

    def __init__(self, weights, num_workers, staleness, lr):
        self.weights, self.staleness, self.lr = np.array(weights, float), staleness, lr
        self.clock = [0] * num_workers

    def can_start(self, worker):
        return self.clock[worker] - min(self.clock) <= self.staleness

    def pull(self, worker):
        return self.weights.copy()

    def push(self, worker, grad):
        self.weights -= self.lr * np.asarray(grad)
        self.clock[worker] += 1


def _ssp_gate_judge(raw, seed):
    states = _gate_states(seed)
    if not isinstance(raw, list) or len(raw) != len(states):
        raise AssertionError(f"expected answers for {len(states)} clock states, got "
                             f"{describe(raw)}")
    for (clocks, s), got in zip(states, raw):
        want = [c - min(clocks) <= s for c in clocks]
        got = [bool(v) if isinstance(v, (bool, np.bool_)) else v for v in plain(got)]
        if got != want:
            w = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), 0)
            raise AssertionError(f"pushes per worker {clocks}, staleness {s}: can_start({w}) "
                                 f"gave {got[w] if w < len(got) else None!r}, expected {want[w]} "
                                 f"(worker {w} is {_steps(clocks[w] - min(clocks))} ahead of "
                                 "the slowest)")


def _steps(n):
    return f"{n} step" if n == 1 else f"{n} steps"


def _drive_record(raw, what):
    if not isinstance(raw, dict) or not isinstance(raw.get("starts"), list):
        raise AssertionError(f"{what}: the run gave {describe(raw)}")
    if raw.get("done") != [SSP_STEPS] * SSP_WORKERS:
        raise AssertionError(f"{what}: workers finished {raw.get('done')} of {SSP_STEPS} steps "
                             "(a worker that is never allowed to start waits forever)")
    return {(w, c): (t, lead) for w, c, t, lead in raw["starts"]}


def _compare_starts(raw, staleness, seed, what):
    got = _drive_record(raw, what)
    want = _drive_record(_ssp_drive(_ReferenceSSP, staleness, _durations(seed), seed), what)
    for key in sorted(want, key=lambda k: want[k][0]):
        (t, lead), (t_ref, _) = got[key], want[key]
        if lead > staleness:
            raise AssertionError(f"{what}: worker {key[0]} started step {key[1]} at t={t:.3g} "
                                 f"while {_steps(lead)} ahead of the slowest worker; the bound "
                                 f"is s = {staleness}")
        if t > t_ref + 1e-9:
            raise AssertionError(f"{what}: worker {key[0]} started step {key[1]} at t={t:.3g}, "
                                 f"but it may start at t={t_ref:.3g} (it is then at most "
                                 f"{staleness} steps ahead): do not wait for more than the bound")
        if t < t_ref - 1e-9:
            raise AssertionError(f"{what}: worker {key[0]} started step {key[1]} at t={t:.3g}, "
                                 f"before the bound allows (t={t_ref:.3g})")
    return want


def _ssp_straggler_judge(raw, seed):
    _compare_starts(raw, 2, seed, "s = 2 with a straggler")


def _ssp_bsp_judge(raw, seed):
    _compare_starts(raw, 0, seed, "s = 0 (bulk synchronous)")


def _ssp_weights_judge(raw, seed):
    _drive_record(raw, "the weights")
    ref = _ssp_drive(_ReferenceSSP, 2, _durations(seed), seed)
    got = raw.get("weights")
    if not isinstance(got, np.ndarray) or got.shape != ref["weights"].shape:
        raise AssertionError(f"pull returned {describe(got)}; return the weights as an array")
    curve = raw.get("curve") or []
    if len(curve) != len(ref["curve"]):
        raise AssertionError(f"{len(curve)} pushes were applied, expected {len(ref['curve'])}")
    for (t, loss), (_, want) in zip(curve, ref["curve"]):
        if not math.isclose(loss, want, rel_tol=1e-9, abs_tol=1e-12):
            raise AssertionError(f"after the push at t={t:.3g} the loss is {loss:.6g}, expected "
                                 f"{want:.6g}: apply each push at once, w -= lr * grad")
    if not np.allclose(got, ref["weights"], rtol=1e-9, atol=1e-12):
        raise AssertionError("the final weights differ from w -= lr * grad applied per push")


register(
    Exercise(
        id="11.4",
        title="A bounded-staleness parameter server",
        target="SSPServer",
        task="the bounded-staleness server",
        forbidden=("mlsys_lab.distributed.ps.param_server:ParameterServer",),
        cases=(
            Case("can_start: at most s steps ahead of the slowest worker", 2,
                 feedback="compare the worker's pushes with the fewest pushes of any worker",
                 probe=_ssp_gate_probe, judge=_ssp_gate_judge),
            Case("a straggler, s = 2: fast workers run ahead 2 steps, no more, no less", 2,
                 feedback="wait only when the bound would be broken",
                 probe=_ssp_straggler_probe, judge=_ssp_straggler_judge),
            Case("s = 0 is bulk-synchronous", 1, feedback="with s = 0 nobody runs ahead",
                 probe=_ssp_bsp_probe, judge=_ssp_bsp_judge),
            Case("each push is applied at once: the loss after every push", 2,
                 feedback="push: weights -= lr * grad, then count the worker's step",
                 probe=_ssp_straggler_probe, judge=_ssp_weights_judge),
        ),
    ),
)
