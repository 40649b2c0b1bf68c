"""The model-randomisation sanity check (Adebayo et al. 2018).

A map that explains the model must change when the model's weights are replaced by random ones.
:func:`cascading_randomisation` re-initialises the parameterised layers one at a time from the
output towards the input; after each step every explainer draws its map again, and the Spearman
rank correlation of the map's absolute values with the original's says how much survived. An
explainer whose correlation stays high is explaining the input, not the model.
"""

import copy

import numpy as np

from ..errors import ShapeError
from .cam import layers_of


def rankdata(a) -> np.ndarray:
    """Ranks 1..n of a flat array, ties given the mean of their ranks (scipy's ``average``)."""
    a = np.asarray(a, np.float64).ravel()
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    ranks = np.empty(len(a))
    start = 0
    while start < len(a):
        stop = start
        while stop + 1 < len(a) and sorted_a[stop + 1] == sorted_a[start]:
            stop += 1
        ranks[order[start:stop + 1]] = 0.5 * (start + stop) + 1.0
        start = stop + 1
    return ranks


def spearman(a, b) -> float:
    """Spearman's rank correlation of two maps of equal size (0 when one is constant)."""
    a, b = np.asarray(a).ravel(), np.asarray(b).ravel()
    if a.shape != b.shape:
        raise ShapeError(f"spearman: maps of {a.size} and {b.size} values")
    ra, rb = rankdata(a), rankdata(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = np.sqrt((ra @ ra) * (rb @ rb))
    return float(ra @ rb / denom) if denom > 0 else 0.0


def parameterised_layers(model):
    """Indices of the top-level layers that own parameters, in call order."""
    return [i for i, layer in enumerate(layers_of(model, "sanity"))
            if list(layer.parameters())]


def randomised(model, layers, seed: int = 0):
    """A copy of ``model`` whose ``layers`` (indices) have Gaussian weights of the original
    weights' standard deviation (biases likewise); the original is untouched."""
    new = copy.deepcopy(model)
    rng = np.random.default_rng(seed)
    items = layers_of(new, "sanity")
    for i in layers:
        for p in items[i].parameters():
            data = np.asarray(p.data)
            std = float(data.std()) or 0.1
            p.data = rng.normal(0.0, std, data.shape).astype(data.dtype)
    return new


def cascading_randomisation(model, explainers, x, target, seed: int = 0,
                            absolute: bool = True):
    """Correlations of each explainer's map with its original as layers are randomised from the
    top.

    Args:
        explainers: ``{name: fn(model, x, target) -> Explanation}``.
        absolute: compare |map| (the sign dropped, as most pictures show maps) or the signed
            maps.

    Returns:
        ``(steps, correlations)``: ``steps`` names the layers randomised so far (``"none"``
        first), ``correlations[name]`` the Spearman correlation of the map with the original's at
        each step (1.0 at the first).
    """
    norm = np.abs if absolute else np.asarray
    original = {name: norm(fn(model, x, target).attributions) for name, fn in explainers.items()}
    layers = parameterised_layers(model)[::-1]
    steps, correlations = ["none"], {name: [1.0] for name in explainers}
    for k in range(1, len(layers) + 1):
        rand = randomised(model, layers[:k], seed)
        steps.append(f"up to layer {layers[k - 1]}")
        for name, fn in explainers.items():
            correlations[name].append(spearman(original[name],
                                               norm(fn(rand, x, target).attributions)))
    return steps, correlations
