"""Exercise 18.3: the acceptance rule of speculative sampling.

The student writes ``speculative_verify(p, q, draft, u, sample)``: a draft model proposed the
tokens ``draft`` (γ of them), drawing token ``i`` from ``q[i]`` (a distribution over the
vocabulary); the target model then gave ``p[i]`` at the same positions, plus ``p[γ]`` after
the last draft token. Walk the draft: token ``x = draft[i]`` is accepted when
``u[i] < min(1, p[i][x] / q[i][x])``; at the first rejection, emit one token drawn with
``sample(r)`` from the residual ``r = norm(max(0, p[i] − q[i]))`` and stop; when all γ are
accepted, emit one more drawn with ``sample(p[γ])``. Return the emitted tokens. The rule makes
the emitted token's distribution exactly the target's, whatever the draft model.

Wrong ideas rejected: accepting when ``p ≥ q`` only (deterministic: loses the accepted share of
the other tokens — the cases put ``u`` just below and just above ``p/q``); the inverted ratio
``q/p``; resampling from ``p`` instead of the residual (the output is then biased towards the
draft's likely tokens); the residual without normalisation, or ``p − q`` without the
``max(0, ·)``; going on after a rejection; forgetting the bonus token after γ acceptances; using
another random source than ``u`` and ``sample``. The last case computes, from the answer's own
decisions and residuals, the exact distribution of the first emitted token and compares it with
the target's to 1e-12. ``forbidden`` is the library's whole speculative module (its
``verify``, ``residual`` and ``acceptance_probability`` each do a part of the exercise).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


def _dists(seed: int, gamma: int, V: int = 6):
    """Target rows p (γ+1 × V) and draft rows q (γ × V), strictly positive, different."""
    rng = np.random.default_rng(18300 + seed + 11 * gamma)
    p = rng.dirichlet(np.full(V, 0.7), gamma + 1)
    q = rng.dirichlet(np.full(V, 0.7), gamma)
    return p, q


def _reference(p, q, draft, u):
    """(tokens before the sampled one, the distribution sampled from)."""
    for i, x in enumerate(draft):
        if u[i] >= min(1.0, p[i][x] / q[i][x]):
            residual = np.maximum(p[i] - q[i], 0.0)
            return list(draft[:i]), residual / residual.sum()
    return list(draft), p[len(draft)]


class _Sampler:
    """``sample(dist)``: records what it was given and returns a token chosen by a fixed rule
    (the most likely one; ties to the lowest id)."""

    def __init__(self):
        self.calls = []

    def __call__(self, dist):
        dist = np.array(dist, dtype=np.float64, copy=True)
        self.calls.append(dist)
        return int(np.argmax(dist))


# ----------------------------------------------------------------------------- probes


def _run(verify, p, q, draft, u):
    sample = _Sampler()
    tokens = verify(p.copy(), q.copy(), list(draft), list(u), sample)
    return {"tokens": [int(t) for t in tokens], "samples": sample.calls}


def _boundary_probe(speculative_verify, seed):
    """γ = 1, every possible draft token, u just below and just above min(1, p/q)."""
    p, q = _dists(seed, 1)

    def run():
        out = []
        for x in range(p.shape[1]):
            a = min(1.0, p[0][x] / q[0][x])
            for u in (a * (1 - 1e-9), min(a * (1 + 1e-9), 1 - 1e-12)):
                out.append(_run(speculative_verify, p, q, [x], [u]))
        return out
    return attempt(run)


def _walk_probe(speculative_verify, seed):
    """γ = 4 drafts with seeded uniforms: the walk, the stop and the bonus token."""
    def run():
        out = []
        for k in range(6):
            p, q = _dists(seed + k, 4)
            rng = np.random.default_rng(seed + 100 + k)
            draft = [int(rng.choice(q.shape[1], p=row)) for row in q]
            u = rng.uniform(0, 1, 4) * (0.2 if k % 3 == 0 else 1.0)  # some accept all
            out.append(_run(speculative_verify, p, q, draft, u))
        return out
    return attempt(run)


# ----------------------------------------------------------------------------- judges


def _expect_record(got, p, q, draft, u, what):
    tokens, dist = _reference(p, q, draft, u)
    if not isinstance(got, dict) or not isinstance(got.get("tokens"), list):
        raise AssertionError(f"{what}: expected a list of tokens, got {describe(got)}")
    samples = got.get("samples") or []
    if len(samples) != 1:
        raise AssertionError(f"{what}: sample() was called {len(samples)} times, expected once "
                             f"(one token drawn after the accepted ones)")
    want = tokens + [int(np.argmax(dist))]
    if got["tokens"] != want:
        raise AssertionError(f"{what}: emitted {got['tokens']}, expected {want} "
                             f"(accept while u < min(1, p/q); then one sampled token)")
    if not np.allclose(samples[0], dist, rtol=0, atol=1e-12):
        which = "p[γ] (all accepted)" if len(tokens) == len(draft) else \
            "norm(max(0, p - q)) at the rejected position"
        raise AssertionError(f"{what}: sample() got {describe(samples[0])}, expected {which} "
                             f"= {describe(dist)}")


def _boundary_judge(raw, seed):
    p, q = _dists(seed, 1)
    if not isinstance(raw, list) or len(raw) != 2 * p.shape[1]:
        raise AssertionError(f"expected {2 * p.shape[1]} runs, got {describe(raw)}")
    k = 0
    for x in range(p.shape[1]):
        a = min(1.0, p[0][x] / q[0][x])
        for u in (a * (1 - 1e-9), min(a * (1 + 1e-9), 1 - 1e-12)):
            _expect_record(raw[k], p, q, [x], [u],
                           f"draft token {x} with p/q = {p[0][x] / q[0][x]:.4g} and u = {u:.6g}")
            k += 1


def _walk_judge(raw, seed):
    if not isinstance(raw, list) or len(raw) != 6:
        raise AssertionError(f"expected 6 runs of γ = 4, got {describe(raw)}")
    for k in range(6):
        p, q = _dists(seed + k, 4)
        rng = np.random.default_rng(seed + 100 + k)
        draft = [int(rng.choice(q.shape[1], p=row)) for row in q]
        u = rng.uniform(0, 1, 4) * (0.2 if k % 3 == 0 else 1.0)
        _expect_record(raw[k], p, q, draft, u, f"run {k + 1} (draft {draft})")


def _distribution_judge(raw, seed):
    """The distribution of the first emitted token implied by the answer's own decisions:
    P(y) = Σ_x q(x) [a(x) δ(y = x) + (1 − a(x)) r_x(y)], with a(x) the accepted share of u
    (from the boundary runs) and r_x the distribution it sampled from after rejecting x."""
    p, q = _dists(seed, 1)
    if not isinstance(raw, list) or len(raw) != 2 * p.shape[1]:
        raise AssertionError(f"expected {2 * p.shape[1]} runs, got {describe(raw)}")
    V = p.shape[1]
    induced = np.zeros(V)
    for x in range(V):
        below, above = raw[2 * x], raw[2 * x + 1]
        for got in (below, above):
            if not isinstance(got, dict) or not got.get("tokens"):
                raise AssertionError(f"draft token {x}: no tokens emitted ({describe(got)})")
        a = min(1.0, p[0][x] / q[0][x])
        accepted_below = below["tokens"][0] == x and len(below["tokens"]) == 2
        accepted_above = above["tokens"][0] == x and len(above["tokens"]) == 2
        share = a if accepted_below and not accepted_above else float(accepted_below)
        rejected = above if not accepted_above else None
        induced[x] += q[0][x] * share
        if share < 1.0:
            if rejected is None or len(rejected.get("samples") or []) != 1:
                raise AssertionError(f"draft token {x}: rejected, but no single draw followed")
            r = np.asarray(rejected["samples"][0], dtype=np.float64)
            if r.shape != (V,) or abs(r.sum() - 1.0) > 1e-12 or (r < 0).any():
                raise AssertionError(f"draft token {x}: sample() got {describe(r)}, which is "
                                     f"not a distribution (normalise the residual)")
            induced += q[0][x] * (1.0 - share) * r
    if not np.allclose(induced, p[0], rtol=0, atol=1e-12):
        raise AssertionError(f"the first emitted token follows {describe(induced)}, the target "
                             f"is {describe(p[0])}: speculative sampling must not change it")


register(
    Exercise(
        id="18.3",
        title="The acceptance rule of speculative sampling",
        target="speculative_verify",
        task="the speculative acceptance rule",
        forbidden=("mlsys_lab.llm.speculative",),
        cases=(
            Case("accept while u < min(1, p/q)", 2,
                 feedback="accept token x with probability min(1, p(x)/q(x))",
                 probe=_boundary_probe, judge=_boundary_judge),
            Case("walk γ = 4 drafts: stop at the first rejection, else a bonus token", 2,
                 feedback="after a rejection draw once from norm(max(0, p - q)) and stop; "
                          "after γ acceptances draw once from p[γ]",
                 probe=_walk_probe, judge=_walk_judge),
            Case("the emitted token is distributed exactly as the target's", 2,
                 feedback="accepted share plus residual must add up to p",
                 probe=_boundary_probe, judge=_distribution_judge),
        ),
    ),
)
