"""Exercise 18.2: one decoding step with a KV cache.

The student writes ``decode_step(x, W_q, W_k, W_v, cache_k, cache_v, pos)``: the new token's
hidden vector ``x`` (D,) is projected to a query, key and value of ``H`` heads of size ``d``
(``x @ W`` is (H*d,); head ``h`` is columns ``h*d:(h+1)*d``); its key and value are written into
the preallocated caches (H × T × d) at slot ``pos``, in place; and the step returns, per head,
``softmax(q_h · K_h[:pos+1]ᵀ / sqrt(d)) @ V_h[:pos+1]`` concatenated over heads (H*d,). Nothing
of the earlier tokens is recomputed: their keys and values are read from the cache.

Wrong ideas rejected: attending over the whole buffer (its unwritten slots are NaN here);
leaving the new token out of its own attention (off by one: at pos 0 it has nothing else);
writing at the end of the buffer or appending instead of slot ``pos`` (the slots are checked,
and those after ``pos`` must stay untouched); scaling by 1/sqrt(D) or 1/d instead of
1/sqrt(d); splitting heads the other way (interleaved columns); recomputing the prefix from a
hidden list of the earlier ``x`` (a cache filled by someone else before the first call is
used: such a list is empty or wrong there).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

# ----------------------------------------------------------------------------- inputs (both sides)


def _model(seed: int):
    """Weights of H heads of size d, and a sequence of n hidden vectors."""
    rng = np.random.default_rng(18200 + seed)
    H, d = int(rng.integers(2, 4)), int(rng.choice([2, 4, 6]))
    D, n, T = int(rng.integers(5, 9)), int(rng.integers(6, 11)), 16
    W = [rng.standard_normal((D, H * d)) / np.sqrt(D) * 2.0 for _ in range(3)]
    X = rng.standard_normal((n, D))
    return (H, d, T), W, X


def _heads(v: np.ndarray, H: int, d: int) -> np.ndarray:
    """(n, H*d) -> (H, n, d)."""
    return v.reshape(v.shape[0], H, d).transpose(1, 0, 2)


def _reference(W, X, H, d):
    """Causal multi-head attention recomputed over every prefix: (n, H*d), and K, V."""
    Q, K, V = (_heads(X @ w, H, d) for w in W)
    out = np.empty((X.shape[0], H * d))
    for t in range(X.shape[0]):
        s = np.einsum("hd,hsd->hs", Q[:, t], K[:, :t + 1]) / np.sqrt(d)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[t] = np.einsum("hs,hsd->hd", p, V[:, :t + 1]).reshape(-1)
    return out, K, V


# ----------------------------------------------------------------------------- probes


def _decode(decode_step, seed, prefill: int):
    """Decode the sequence from ``prefill`` on; slots below ``prefill`` are filled beforehand
    (not by the answer); every slot not yet written holds NaN."""
    (H, d, T), W, X = _model(seed)
    cache_k, cache_v = np.full((H, T, d), np.nan), np.full((H, T, d), np.nan)
    if prefill:  # the prefix's keys and values only: ``_reference``, which a probe calling it
        # would leave unrefused, answers the decode step itself
        _, K, V = (_heads(X[:prefill] @ w, H, d) for w in W)
        cache_k[:, :prefill], cache_v[:, :prefill] = K, V
    outs = []
    for pos in range(prefill, X.shape[0]):
        out = decode_step(X[pos].copy(), *(w.copy() for w in W), cache_k, cache_v, pos)
        outs.append(np.array(out, dtype=np.float64, copy=True))
    return {"outs": outs, "cache_k": cache_k.copy(), "cache_v": cache_v.copy()}


def _probe(prefill: int, first_only: bool = False):
    def probe(decode_step, seed):
        def run():
            result = _decode(decode_step, seed, prefill)
            if first_only:
                result["outs"] = result["outs"][:1]
            return result
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _expect_outputs(raw, seed, prefill, what, first_only=False):
    if not isinstance(raw, dict) or not isinstance(raw.get("outs"), list):
        raise AssertionError(f"{what}: decode_step did not run through: got {describe(raw)}")
    (H, d, T), W, X = _model(seed)
    want, K, V = _reference(W, X, H, d)
    want = want[prefill:prefill + 1] if first_only else want[prefill:]
    if len(raw["outs"]) != len(want):
        raise AssertionError(f"{what}: expected {len(want)} outputs, got {len(raw['outs'])}")
    for t, (got, ref) in enumerate(zip(raw["outs"], want), start=prefill):
        got = np.asarray(got)
        if got.shape != ref.shape:
            raise AssertionError(f"{what}: the output at pos {t} has shape {got.shape}, "
                                 f"expected {ref.shape} (H*d: the heads concatenated)")
        if np.isnan(got).any():
            raise AssertionError(f"{what}: the output at pos {t} holds NaN: it read cache slots "
                                 f"that were never written (attend to slots 0..pos only)")
        if not np.allclose(got, ref, rtol=1e-8, atol=1e-10):
            raise AssertionError(f"{what}: at pos {t} the output is {describe(got)}, causal "
                                 f"attention over the prefix gives {describe(ref)}")
    return K, V


def _outputs_judge(prefill, what, first_only=False):
    def judge(raw, seed):
        _expect_outputs(raw, seed, prefill, what, first_only)
    return judge


def _cache_judge(raw, seed):
    K, V = _expect_outputs(raw, seed, 0, "the cache after decoding")
    n = K.shape[1]
    for name, got, want in (("cache_k", raw["cache_k"], K), ("cache_v", raw["cache_v"], V)):
        got = np.asarray(got)
        if not np.allclose(got[:, :n], want, rtol=1e-10, atol=1e-12):
            raise AssertionError(f"{name}[:, :{n}] is {describe(got[:, :n])}, expected the "
                                 f"keys/values of the {n} tokens at their positions "
                                 f"{describe(want)}")
        if not np.isnan(got[:, n:]).all():
            raise AssertionError(f"{name}[:, {n}:] was written: write slot pos only")


register(
    Exercise(
        id="18.2",
        title="A decoding step with a KV cache",
        target="decode_step",
        task="the KV-cache decoding step",
        forbidden=(
            "mlsys_lab.engine.ops_attention",
            "mlsys_lab.kernels.attention",
            "mlsys_lab.nn.attention",
            "mlsys_lab.llm.kv_cache",
        ),
        cases=(
            Case("the first token attends to itself", 1,
                 feedback="at pos 0 the output is v of the token itself",
                 probe=_probe(0, first_only=True),
                 judge=_outputs_judge(0, "the first token", first_only=True)),
            Case("every step equals causal attention over its prefix", 2,
                 feedback="attend to slots 0..pos (the new token included), scale 1/sqrt(d)",
                 probe=_probe(0), judge=_outputs_judge(0, "decoding the whole sequence")),
            Case("keys and values land in slot pos, in place", 1.5,
                 feedback="cache_k[:, pos] = k and cache_v[:, pos] = v; nothing else",
                 probe=_probe(0), judge=_cache_judge),
            Case("a cache filled before the first call is used", 1.5,
                 feedback="read the earlier tokens' keys and values from the cache",
                 probe=_probe(4), judge=_outputs_judge(4, "decoding after a prefilled prompt")),
        ),
    ),
)
