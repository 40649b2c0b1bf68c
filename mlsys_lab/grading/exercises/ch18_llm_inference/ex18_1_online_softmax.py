"""Exercise 18.1: one step of the online softmax (FlashAttention's (m, l, acc) recurrence).

The student writes ``online_softmax_step(state, scores, values)``: given the running state of
``L`` query rows — ``m`` (the largest score seen so far), ``l`` (the sum of ``exp(score - m)``)
and ``acc`` (the sum of ``exp(score - m) * value``) — and one block of scores (L × B) with its
values (B × Ev), return the state after the block. ``acc / l[:, None]`` after the last block is
``softmax(scores) @ values`` over all blocks, and the state never grows with the sequence.

Wrong ideas rejected: not rescaling ``l`` and ``acc`` by ``exp(m_old - m_new)`` when the
maximum grows (right only when the first block holds the row maxima: the later blocks here hold
larger scores); exponentiating without subtracting the maximum (scores of ±800 overflow to inf);
subtracting the first block's maximum only (the same overflow, later); normalising each block on
its own and averaging (right only for equal blocks; the blocks here differ in size and scale);
a fully masked block (all ``-inf``) before any score turns the state into NaN unless the
``-inf - -inf`` case is handled; keeping the blocks (a state that aliases or stores them: the
probe overwrites each block after the step, and the state's shapes are checked); computing the
exact softmax at the end from a hidden copy of the blocks (the state after every block is
judged, and so are two interleaved sequences).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


def _blocks(seed: int, kind: str):
    """(scores, values, block sizes) for one sequence: L rows, S keys split into blocks."""
    rng = np.random.default_rng(18100 + seed + 7 * len(kind))
    L, Ev = int(rng.integers(2, 6)), int(rng.integers(1, 5))
    sizes = [int(b) for b in rng.integers(1, 9, int(rng.integers(3, 7)))]
    S = sum(sizes)
    scores = rng.standard_normal((L, S)) * 2.0
    values = rng.standard_normal((S, Ev))
    if kind == "growing":  # each block's scores above the last: the maximum moves every block
        start = 0
        for k, b in enumerate(sizes):
            scores[:, start:start + b] += 3.0 * k
            start += b
    elif kind == "large":
        scores *= 400.0
    elif kind == "masked":  # the first block masked out entirely, a masked key later
        scores[:, :sizes[0]] = -np.inf
        scores[0, -1] = -np.inf
    elif kind == "one":
        sizes = [S]
    return scores, values, sizes


def _initial(L: int, Ev: int):
    return np.full(L, -np.inf), np.zeros(L), np.zeros((L, Ev))


def _reference_states(scores, values, sizes):
    """The exact state after each block, computed from the definition (not the recurrence)."""
    out, start = [], 0
    for b in sizes:
        seen = scores[:, :start + b]
        m = seen.max(axis=1)
        safe = np.where(np.isfinite(m), m, 0.0)
        w = np.exp(seen - safe[:, None])
        out.append((m, w.sum(axis=1), w @ values[:start + b]))
        start += b
    return out


# ----------------------------------------------------------------------------- probes


def _run(step, scores, values, sizes):
    """Feed the blocks through the answer; each block's buffers are overwritten after its step
    (as a streaming kernel reuses them), and a copy of every state is kept."""
    L, Ev = scores.shape[0], values.shape[1]
    state = _initial(L, Ev)
    block_s = np.empty((L, max(sizes)))
    block_v = np.empty((max(sizes), Ev))
    states, start = [], 0
    for b in sizes:
        s, v = block_s[:, :b], block_v[:b]
        s[...] = scores[:, start:start + b]
        v[...] = values[start:start + b]
        state = step(state, s, v)
        states.append([np.array(part, dtype=np.float64, copy=True) for part in state])
        s[...] = np.nan  # the buffers are reused: a state that kept them sees NaN
        v[...] = np.nan
        start += b
    return states


def _probe(kind):
    def probe(online_softmax_step, seed):
        return attempt(_run, online_softmax_step, *_blocks(seed, kind))
    return probe


def _interleaved_probe(online_softmax_step, seed):
    """Two sequences stepped in a seeded interleaving, each state copied before it is passed
    on: whatever the answer keeps outside the state, it cannot tell the sequences apart."""
    seqs = {"a": _blocks(seed, "growing"), "b": _blocks(seed + 1, "plain")}

    def run():
        states = {k: _initial(s.shape[0], v.shape[1]) for k, (s, v, _) in seqs.items()}
        starts = {k: 0 for k in seqs}
        queue = {k: list(sizes) for k, (_, _, sizes) in seqs.items()}
        turns = ["a"] * len(queue["a"]) + ["b"] * len(queue["b"])
        for k in np.random.default_rng(seed).permutation(turns):
            scores, values, _ = seqs[k]
            size, start = queue[k].pop(0), starts[k]
            state = tuple(np.array(part, copy=True) for part in states[k])
            states[k] = online_softmax_step(state, scores[:, start:start + size].copy(),
                                            values[start:start + size].copy())
            starts[k] += size
        return [[np.asarray(part, dtype=np.float64) for part in states[k]] for k in "ab"]
    return attempt(run)


# ----------------------------------------------------------------------------- judges


def _expect_states(raw, expected, what: str, rel: float = 1e-9):
    if not isinstance(raw, list) or len(raw) != len(expected):
        raise AssertionError(f"{what}: expected a state after each of {len(expected)} blocks, "
                             f"got {describe(raw)}")
    for k, (got, (m, l, acc)) in enumerate(zip(raw, expected)):
        if not isinstance(got, list) or len(got) != 3:
            raise AssertionError(f"{what}: the state after block {k + 1} should be (m, l, acc), "
                                 f"got {describe(got)}")
        for name, value, want in zip(("m", "l", "acc"), got, (m, l, acc)):
            value = np.asarray(value)
            if value.shape != want.shape:
                raise AssertionError(
                    f"{what}: after block {k + 1}, {name} has shape {value.shape}, expected "
                    f"{want.shape} (the state must not grow with the sequence)")
            if np.isnan(value).any():
                raise AssertionError(
                    f"{what}: after block {k + 1}, {name} holds NaN (a fully masked block, "
                    f"or a block buffer the state kept after the step?)")
            if not np.allclose(value, want, rtol=rel, atol=1e-12, equal_nan=False) and not (
                    name == "m" and np.array_equal(value, want)):
                raise AssertionError(
                    f"{what}: after block {k + 1}, {name} = {describe(value)}, expected "
                    f"{describe(want)} (the running max, the sum of exp(s - m) and of "
                    f"exp(s - m) * v over every score seen so far)")


def _judge(kind, what):
    def judge(raw, seed):
        scores, values, sizes = _blocks(seed, kind)
        expected = _reference_states(scores, values, sizes)
        _expect_states(raw, expected, what)
        m, l, acc = expected[-1]
        final = np.asarray(raw[-1][2]) / np.asarray(raw[-1][1])[:, None]
        weights = np.exp(scores - m[:, None])
        exact = (weights / weights.sum(axis=1, keepdims=True)) @ values
        if not np.allclose(final, exact, rtol=1e-9, atol=1e-12):
            raise AssertionError(f"{what}: acc / l is {describe(final)}, softmax(scores) @ "
                                 f"values is {describe(exact)}")
    return judge


def _interleaved_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 2:
        raise AssertionError(f"two interleaved sequences: expected two final states, got "
                             f"{describe(raw)}")
    for name, got, (scores, values, sizes) in zip(("first", "second"), raw,
                                                  (_blocks(seed, "growing"),
                                                   _blocks(seed + 1, "plain"))):
        _expect_states([got], _reference_states(scores, values, sizes)[-1:],
                       f"the {name} of two interleaved sequences")


register(
    Exercise(
        id="18.1",
        title="Online softmax: one block of the (m, l, acc) recurrence",
        target="online_softmax_step",
        task="the online-softmax update",
        forbidden=(
            "mlsys_lab.engine.ops_attention",
            "mlsys_lab.kernels.attention",
        ),
        cases=(
            Case("one block: the state is (max, sum of exp, weighted sum)", 1,
                 feedback="m = row max, l = sum exp(s - m), acc = exp(s - m) @ v",
                 probe=_probe("one"), judge=_judge("one", "one block")),
            Case("blocks whose scores grow: l and acc are rescaled", 2,
                 feedback="when the max grows, multiply l and acc by exp(m_old - m_new)",
                 probe=_probe("growing"), judge=_judge("growing", "growing blocks")),
            Case("scores of ±800: no overflow", 1.5,
                 feedback="subtract the running max before exp",
                 probe=_probe("large"), judge=_judge("large", "scores of ±800")),
            Case("a fully masked first block (all -inf)", 1,
                 feedback="a row whose max is still -inf keeps l = 0 and acc = 0, never NaN",
                 probe=_probe("masked"), judge=_judge("masked", "a masked first block")),
            Case("two sequences stepped in turn: the state is all there is", 1.5,
                 feedback="everything the next step needs must be in (m, l, acc)",
                 probe=_interleaved_probe, judge=_interleaved_judge),
        ),
    ),
)
