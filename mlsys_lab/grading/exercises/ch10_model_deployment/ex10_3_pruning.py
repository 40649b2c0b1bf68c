"""Exercise 10.3: magnitude pruning to an exact sparsity target, global or per layer.

Wrong ideas rejected: ranking the signed values removes the most negative weights, not the
smallest |w| (global case); pruning each layer (or each row) by the same fraction keeps small
weights of a small layer while removing larger ones elsewhere (global case, layers 60x apart);
int() or ceil instead of round removes one too few or too many (count case, fractional parts
.2 .35 .7 .8); a threshold test |w| <= t removes every tie of the k-th smallest (ties case);
changing the weights in place, or no special care at sparsity 0 or 1, fail the last cases.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, Raised, attempt, describe, register
from mlsys_lab.grading.exercises.ch10_model_deployment.common import (
    expect_array,
    expect_not_raised,
)

# ----------------------------------------------------------------------------- inputs (both sides)


def _p_weights(seed, ties=False):
    """Three layers of very different scales (one per-row scale pattern inside the conv), with
    positive and negative weights; with ``ties``, small integer magnitudes repeat many times."""
    rng = np.random.default_rng(10300 + seed + (1000 if ties else 0))
    if ties:
        return {"0.weight": rng.integers(-4, 5, (6, 7)).astype(np.float32),
                "2.weight": 2 * rng.integers(-3, 4, (7, 5)).astype(np.float32)}
    conv = rng.standard_normal((4, 2, 3, 3)) * np.array([0.05, 1.0, 0.2, 3.0])[:, None, None,
                                                                               None]
    return {"0.weight": conv.astype(np.float32),
            "3.weight": (rng.standard_normal((72, 10)) * 0.1).astype(np.float32),
            "5.weight": (rng.standard_normal((10, 10)) * 1.5 - 0.8).astype(np.float32)}


def _p_sparsities(seed):
    """Targets whose ``sparsity * n`` has a fractional part below and above 1/2 (never 1/2)."""
    n = sum(w.size for w in _p_weights(seed).values())
    rng = np.random.default_rng(10390 + seed)
    out = []
    for frac in (0.2, 0.8, 0.35, 0.7):
        k = int(rng.integers(1, n - 2))
        out.append((k + frac) / n)
    return out


# ----------------------------------------------------------------------------- probes


def _p_masks(prune_to_sparsity, weights, sparsity, scope=None):
    copies = {k: v.copy() for k, v in weights.items()}
    out = attempt(prune_to_sparsity, copies, sparsity) if scope is None else \
        attempt(prune_to_sparsity, copies, sparsity, scope)
    if isinstance(out, Raised):
        return out
    if not isinstance(out, dict):
        return {"not_dict": describe(out)}
    touched = [k for k in weights if not np.array_equal(copies[k], weights[k])]
    return {"masks": {str(k): np.asarray(v) for k, v in out.items()}, "touched": touched}


def _p_count_probe(prune_to_sparsity, seed):
    w = _p_weights(seed)
    return [_p_masks(prune_to_sparsity, w, s) for s in _p_sparsities(seed)]


def _p_global_probe(prune_to_sparsity, seed):
    return _p_masks(prune_to_sparsity, _p_weights(seed), 0.6)


def _p_ties_probe(prune_to_sparsity, seed):
    w = _p_weights(seed, ties=True)
    n = sum(v.size for v in w.values())
    return [_p_masks(prune_to_sparsity, w, s) for s in (0.3, 11.2 / n, 0.55)]


def _p_layer_probe(prune_to_sparsity, seed):
    return _p_masks(prune_to_sparsity, _p_weights(seed), 0.5, "layer")


def _p_edges_probe(prune_to_sparsity, seed):
    w = _p_weights(seed)
    return [_p_masks(prune_to_sparsity, w, 0.0), _p_masks(prune_to_sparsity, w, 1.0)]


# ----------------------------------------------------------------------------- judges


def _p_masks_of(raw, weights, what):
    expect_not_raised(raw, what)
    if "not_dict" in raw:
        raise AssertionError(f"{what}: expected a dict of masks, got {raw['not_dict']}")
    masks = raw["masks"]
    if set(masks) != set(weights):
        raise AssertionError(f"{what}: expected masks for {sorted(weights)}, got "
                             f"{sorted(masks)}")
    for name, w in weights.items():
        expect_array(masks[name], f"{what}: mask {name!r}", w.shape, "b")
    if raw["touched"]:
        raise AssertionError(f"{what}: prune_to_sparsity changed the weights {raw['touched']} "
                             f"in place; return masks only")
    return masks


def _p_check_global(masks, weights, sparsity, what):
    n = sum(w.size for w in weights.values())
    k = round(sparsity * n)
    removed = sum(int(np.count_nonzero(~masks[name])) for name in weights)
    if removed != k:
        hint = ""
        if removed == int(np.floor(sparsity * n)) or removed == int(np.ceil(sparsity * n)):
            hint = (f" — that is {'floor' if removed < k else 'ceil'}(sparsity * n); remove "
                    f"round(sparsity * n)")
        elif removed > k:
            hint = " (more than asked: ties at the threshold? remove exactly k)"
        raise AssertionError(f"{what}: sparsity {sparsity:.6f} of {n} weights: remove "
                             f"round({sparsity * n:.2f}) = {k}, you removed {removed}{hint}")
    flat_w = np.concatenate([weights[name].ravel() for name in weights])
    flat_m = np.concatenate([masks[name].ravel() for name in weights])
    if k and k < n and np.abs(flat_w[~flat_m]).max() > np.abs(flat_w[flat_m]).min():
        if np.all(flat_w[~flat_m] <= np.sort(flat_w)[k - 1]):
            raise AssertionError(f"{what}: you removed the {k} most negative weights; prune by "
                                 f"magnitude |w|")
        per_layer = all(
            int(np.count_nonzero(~masks[name])) == round(sparsity * weights[name].size)
            for name in weights)
        if per_layer:
            raise AssertionError(f"{what}: each layer lost the same fraction: that is "
                                 f"scope='layer'; global ranks |w| across all layers at once")
        raise AssertionError(f"{what}: a removed weight has |w| = "
                             f"{float(np.abs(flat_w[~flat_m]).max()):.4g} but a kept one "
                             f"{float(np.abs(flat_w[flat_m]).min()):.4g}; remove the smallest "
                             f"|w| over every layer")


def _p_count_judge(raw, seed):
    w = _p_weights(seed)
    if not isinstance(raw, list) or len(raw) != 4:
        raise AssertionError(f"the check got {describe(raw)}")
    for r, s in zip(raw, _p_sparsities(seed)):
        _p_check_global(_p_masks_of(r, w, f"sparsity {s:.4f}"), w, s, "global pruning")


def _p_global_judge(raw, seed):
    w = _p_weights(seed)
    masks = _p_masks_of(raw, w, "sparsity 0.6 over layers of different scales")
    _p_check_global(masks, w, 0.6, "sparsity 0.6 over layers of different scales")


def _p_ties_judge(raw, seed):
    w = _p_weights(seed, ties=True)
    n = sum(v.size for v in w.values())
    if not isinstance(raw, list) or len(raw) != 3:
        raise AssertionError(f"the check got {describe(raw)}")
    for r, s in zip(raw, (0.3, 11.2 / n, 0.55)):
        what = f"integer weights with many equal |w|, sparsity {s:.3f}"
        _p_check_global(_p_masks_of(r, w, what), w, s, what)


def _p_layer_judge(raw, seed):
    w = _p_weights(seed)
    what = "scope='layer', sparsity 0.5"
    masks = _p_masks_of(raw, w, what)
    for name, arr in w.items():
        _p_check_global({name: masks[name]}, {name: arr}, 0.5, f"{what}, layer {name!r}")


def _p_edges_judge(raw, seed):
    w = _p_weights(seed)
    if not isinstance(raw, list) or len(raw) != 2:
        raise AssertionError(f"the check got {describe(raw)}")
    keep_all = _p_masks_of(raw[0], w, "sparsity 0")
    if not all(m.all() for m in keep_all.values()):
        raise AssertionError("sparsity 0 must keep every weight")
    none = _p_masks_of(raw[1], w, "sparsity 1")
    if any(m.any() for m in none.values()):
        raise AssertionError("sparsity 1 must remove every weight")


register(
    Exercise(
        id="10.3",
        title="Magnitude pruning to a sparsity target",
        target="prune_to_sparsity",
        task="the magnitude pruning function",
        forbidden=(
            "mlsys_lab.deploy.compress.prune",
            "mlsys_lab.deploy.passes",
        ),
        cases=(
            Case("exactly round(sparsity * n) weights removed", 2,
                 feedback="k = round(sparsity * n); remove k weights, not a threshold's worth",
                 probe=_p_count_probe, judge=_p_count_judge),
            Case("global: the smallest |w| across every layer", 2,
                 feedback="rank |w| of all layers together",
                 probe=_p_global_probe, judge=_p_global_judge),
            Case("ties at the threshold: still exactly k", 1,
                 feedback="choose k indices (np.argsort(..., kind='stable')), not |w| <= t",
                 probe=_p_ties_probe, judge=_p_ties_judge),
            Case("scope='layer': the same fraction from each layer", 1,
                 feedback="round(sparsity * n_layer) per layer",
                 probe=_p_layer_probe, judge=_p_layer_judge),
            Case("sparsity 0 keeps all, 1 removes all; weights untouched", 1,
                 feedback="the edge cases of k = 0 and k = n",
                 probe=_p_edges_probe, judge=_p_edges_judge),
        ),
    ),
)
