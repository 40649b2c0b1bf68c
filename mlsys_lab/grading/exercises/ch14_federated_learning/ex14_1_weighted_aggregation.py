"""Exercise 14.1: FedAvg's server step, the sample-weighted average of the returned models.

The student writes ``aggregate(current, results, sampled)``: ``current`` is the global model
(a dict of float64 arrays), ``results`` the clients that returned before the round's deadline
(each a dict with ``"cid"``, ``"parameters"`` — a model like ``current`` —, ``"num_examples"``
and ``"num_steps"``, the local SGD steps it ran), ``sampled`` maps every client the server
sampled this round, returned or not, to its number of examples. Return the new global model
``Σ_k n_k w_k / Σ_k n_k`` over the returned clients only, every parameter array of it; when
no client returned, the model stays ``current``. The inputs must not change.

Wrong ideas rejected: the unweighted mean (right only for equal sample counts: the cases use
1, 3, 7, 40 examples); weighting by the number of local steps or batches (steps grow with the
data but also with the local epochs, which differ here: a straggler ran fewer); summing
``n_k w_k`` without dividing by ``Σ n_k``; normalising by the examples of every *sampled*
client, or counting a dropped client with the current model in its place (its update never
reached the server: the model must not move towards, or shrink to, anything it did not
receive); returning ``None`` or zeros when nobody returned; averaging only the first
parameter array; accumulating into the first client's arrays in place (the caller's results
change). ``forbidden`` is the library's whole strategies module (``weighted_average`` and
every strategy's ``aggregate_fit`` compute this).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

_SHAPES = {"W1": (4, 3), "b1": (3,), "W2": (3, 2), "b2": (2,)}

# ----------------------------------------------------------------------------- inputs (both sides)


def _model(rng):
    return {k: rng.standard_normal(s) for k, s in _SHAPES.items()}


def _round(seed: int, kind: str):
    """(current, results, sampled) for one kind of round."""
    rng = np.random.default_rng(14100 + seed + 13 * len(kind))
    current = _model(rng)
    if kind == "two":
        counts, epochs, dropped = [1, 3], [1, 1], []
    elif kind == "steps":  # the straggler with the most data ran only one local epoch
        counts, epochs, dropped = [7, 40, 12, 3], [5, 1, 5, 5], []
    elif kind == "dropped":
        counts, epochs, dropped = [7, 40, 12, 3, 25], [2] * 5, [1, 4]
    elif kind == "nobody":
        counts, epochs, dropped = [9, 14], [1, 1], [0, 1]
    else:
        raise ValueError(kind)
    cids = sorted(int(c) for c in rng.choice(1000, len(counts), replace=False))
    results = []
    for k, (cid, n, e) in enumerate(zip(cids, counts, epochs)):
        if k in dropped:
            continue
        params = {name: v + rng.standard_normal(v.shape) * 0.5 for name, v in current.items()}
        results.append({"cid": cid, "parameters": params, "num_examples": n,
                        "num_steps": e * -(-n // 10)})
    sampled = {cid: n for cid, n in zip(cids, counts)}
    return current, results, sampled


def _copy_round(current, results, sampled):
    return ({k: v.copy() for k, v in current.items()},
            [{**r, "parameters": {k: v.copy() for k, v in r["parameters"].items()}}
             for r in results], dict(sampled))


def _reference(current, results):
    if not results:
        return current
    total = sum(r["num_examples"] for r in results)
    return {k: sum(r["num_examples"] * r["parameters"][k] for r in results) / total
            for k in current}


# ----------------------------------------------------------------------------- probes


def _probe(kind):
    def probe(aggregate, seed):
        current, results, sampled = _round(seed, kind)
        args = _copy_round(current, results, sampled)

        def run():
            out = aggregate(*args)
            untouched = all(np.array_equal(a[k], b[k]) for a, b in
                            [(args[0], current)] + [(r["parameters"], s["parameters"])
                                                    for r, s in zip(args[1], results)]
                            for k in a)
            if isinstance(out, dict):
                out = {str(k): np.array(v, dtype=np.float64, copy=True) if
                       isinstance(v, (np.ndarray, list, float, int)) else v
                       for k, v in out.items()}
            return {"model": out, "untouched": untouched}
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _expect_model(got, want, what):
    if not isinstance(got, dict):
        raise AssertionError(f"{what}: expected a dict of parameter arrays, got {describe(got)}")
    if sorted(got) != sorted(want):
        raise AssertionError(f"{what}: the model has parameters {sorted(got)}, expected "
                             f"{sorted(want)} (aggregate every array)")
    for k, w in want.items():
        v = got[k]
        if not isinstance(v, np.ndarray) or v.shape != w.shape:
            raise AssertionError(f"{what}: {k} is {describe(v)}, expected an array of shape "
                                 f"{w.shape}")
        if not np.allclose(v, w, rtol=1e-12, atol=1e-12):
            raise AssertionError(f"{what}: {k} = {describe(v)}, expected {describe(w)}")


def _judge(kind, what):
    def judge(raw, seed):
        if not isinstance(raw, dict) or "model" not in raw:
            raise AssertionError(f"{what}: aggregate raised or returned nothing usable: "
                                 f"{describe(raw)}")
        current, results, _ = _round(seed, kind)
        _expect_model(raw["model"], _reference(current, results), what)
        if not raw["untouched"]:
            raise AssertionError(f"{what}: aggregate changed its inputs (build a new model; "
                                 f"the results and the current model belong to the caller)")
    return judge


register(
    Exercise(
        id="14.1",
        title="Sample-weighted aggregation (FedAvg's server step)",
        target="aggregate",
        task="the sample-weighted aggregation",
        forbidden=("mlsys_lab.federated.strategies",),
        cases=(
            Case("two clients with 1 and 3 examples: Σ n_k w_k / Σ n_k", 2,
                 feedback="weight each returned model by its num_examples, divide by their sum",
                 probe=_probe("two"), judge=_judge("two", "two clients")),
            Case("weights are examples, not local steps", 2,
                 feedback="num_steps depends on local epochs; FedAvg weights by num_examples",
                 probe=_probe("steps"), judge=_judge("steps", "clients with different epochs")),
            Case("a dropped client's update never reaches the model", 2,
                 feedback="only the returned results count, in the weights and in the sum",
                 probe=_probe("dropped"), judge=_judge("dropped", "two clients dropped")),
            Case("nobody returned: the model stays", 1,
                 feedback="with no results, return the current model",
                 probe=_probe("nobody"), judge=_judge("nobody", "no client returned")),
        ),
    ),
)
