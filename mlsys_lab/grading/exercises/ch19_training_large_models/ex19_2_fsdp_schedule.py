"""Exercise 19.2: the FSDP schedule of one training step.

The student writes ``fsdp_schedule(num_layers, prefetch)``: the order in which one rank issues
its work for one step of a model whose layers 0 .. n-1 are sharded FSDP-style. Events are
``("gather", l)`` (all-gather layer l's parameters; it runs on the communication stream, in
issue order), ``("forward", l)`` and ``("backward", l)`` (compute; they wait for the layer's
gather), ``("free", l)`` (drop the gathered parameters) and ``("reduce_scatter", l)`` (send
layer l's gradient shards; after its backward). Each layer is gathered for its forward, freed
after it, gathered again for its backward (the last layer too), freed after it. With
``prefetch`` the next layer's gather (forward: l+1; backward: l-1) is issued right after the
current layer's gather is waited on — before the current layer computes — so it overlaps that
compute; at most two layers are ever gathered. Without ``prefetch`` a gather is issued just
before its own layer computes, and at most one layer is gathered.

The judge replays the events: a compute on a layer that is not gathered, a free of a layer that
is not, a reduce-scatter before its backward or twice, or a layer missing is an error; it counts
the layers gathered at once; and it times the schedule on two streams with stated gather and
compute times, comparing the exposed communication with the best a one-ahead prefetch can do.

Wrong ideas rejected: gathering the whole model at the start (ZeRO-3 without per-layer
gathers: n layers held); never freeing; prefetching two layers ahead (three held); issuing the
prefetch after the current layer's compute (no overlap: the exposed time of no prefetch);
backward in forward order; a reduce-scatter issued before the layer's backward; relying on the
forward's gather in backward (the layer was freed).
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, attempt, describe, register

_KINDS = ("gather", "forward", "backward", "free", "reduce_scatter")

# ----------------------------------------------------------------------------- inputs (both sides)


def _sizes(seed: int) -> list[int]:
    return [int(n) for n in np.random.default_rng(19200 + seed).integers(3, 9, 3)]


def _costs(seed: int, n: int):
    """Per layer: all-gather time, forward compute, backward compute (backward = 2x forward)."""
    rng = np.random.default_rng(19250 + seed + n)
    gather = rng.uniform(0.5, 2.0, n)
    forward = rng.uniform(0.5, 2.0, n)
    return gather, forward, 2.0 * forward


# ----------------------------------------------------------------------------- the judge's replay


def _replay(events, n: int):
    """Check the events' order; return the peak number of layers gathered at once."""
    if not isinstance(events, list):
        raise AssertionError(f"{n} layers: expected a list of (kind, layer) events, got "
                             f"{describe(events)}")
    gathered, issued, forwarded, backwarded, scattered = set(), set(), [], [], set()
    peak = 0
    for k, event in enumerate(events):
        if (not isinstance(event, (list, tuple)) or len(event) != 2 or event[0] not in _KINDS
                or not isinstance(event[1], int) or not 0 <= event[1] < n):
            raise AssertionError(f"{n} layers: event {k} is {describe(event)}; expected "
                                 f"(kind, layer) with kind one of {', '.join(_KINDS)}")
        kind, layer = event
        if kind == "gather":
            if layer in gathered:
                raise AssertionError(f"{n} layers: event {k} gathers layer {layer}, which is "
                                     f"already gathered")
            gathered.add(layer)
            peak = max(peak, len(gathered))
        elif kind == "free":
            if layer not in gathered:
                raise AssertionError(f"{n} layers: event {k} frees layer {layer}, which is not "
                                     f"gathered")
            gathered.discard(layer)
        elif kind in ("forward", "backward"):
            if layer not in gathered:
                raise AssertionError(f"{n} layers: event {k} runs {kind} of layer {layer}, but "
                                     f"its parameters are not gathered (gather it again after "
                                     f"freeing it)")
            (forwarded if kind == "forward" else backwarded).append(layer)
        else:
            if layer not in backwarded or layer in scattered:
                raise AssertionError(f"{n} layers: event {k} reduce-scatters layer {layer} "
                                     f"{'twice' if layer in scattered else 'before its backward'}")
            scattered.add(layer)
        issued.add((kind, layer))
    if forwarded != list(range(n)) or backwarded != list(range(n - 1, -1, -1)):
        raise AssertionError(f"{n} layers: forward ran layers {forwarded}, backward {backwarded}; "
                             f"expected 0..{n - 1} forward, then {n - 1}..0 backward")
    if scattered != set(range(n)) or gathered:
        raise AssertionError(f"{n} layers: every layer's gradient is reduce-scattered once and "
                             f"every gathered layer freed by the end (left gathered: "
                             f"{sorted(gathered)}, not reduce-scattered: "
                             f"{sorted(set(range(n)) - scattered)})")
    return peak


def _exposed(events, gather, forward, backward) -> float:
    """Time the schedule on two streams: gathers in issue order on the communication stream
    (reduce-scatters cost nothing here), compute in order, each compute waiting for its layer's
    latest gather. Exposed communication = finish time - total compute."""
    comm_free = compute_free = 0.0
    ready = {}
    for kind, layer in events:
        if kind == "gather":
            start = max(comm_free, compute_free)  # issued once the compute before it is done
            comm_free = start + gather[layer]
            ready[layer] = comm_free
        elif kind in ("forward", "backward"):
            cost = forward[layer] if kind == "forward" else backward[layer]
            compute_free = max(compute_free, ready[layer]) + cost
    return compute_free - float(np.sum(forward) + np.sum(backward))


def _best_exposed(gather, forward, backward) -> float:
    """The exposed time of the one-ahead prefetch schedule."""
    return _exposed(_reference(len(gather), True), gather, forward, backward)


def _reference(n: int, prefetch: bool) -> list[tuple[str, int]]:
    out = []
    for order, compute in ((range(n), "forward"), (range(n - 1, -1, -1), "backward")):
        order = list(order)
        for i, layer in enumerate(order):
            if not prefetch or i == 0:
                out.append(("gather", layer))
            if prefetch and i + 1 < len(order):
                out.append(("gather", order[i + 1]))
            out.append((compute, layer))
            out.append(("free", layer))
            if compute == "backward":
                out.append(("reduce_scatter", layer))
    return out


# ----------------------------------------------------------------------------- probes


def _probe(prefetch: bool):
    def probe(fsdp_schedule, seed):
        def run():
            return [[tuple(e) if isinstance(e, (list, tuple)) else e
                     for e in fsdp_schedule(n, prefetch)] for n in [1, *_sizes(seed)]]
        return attempt(run)
    return probe


# ----------------------------------------------------------------------------- judges


def _schedules(raw, seed):
    sizes = [1, *_sizes(seed)]
    if not isinstance(raw, list) or len(raw) != len(sizes):
        raise AssertionError(f"expected one schedule per model, got {describe(raw)}")
    return list(zip(sizes, [[tuple(e) if isinstance(e, list) else e for e in s]
                            if isinstance(s, list) else s for s in raw]))


def _valid_judge(raw, seed):
    for n, events in _schedules(raw, seed):
        _replay(events, n)


def _no_prefetch_judge(raw, seed):
    for n, events in _schedules(raw, seed):
        peak = _replay(events, n)
        if peak > 1:
            raise AssertionError(f"{n} layers without prefetch: {peak} layers gathered at once; "
                                 f"gather each just before it computes, free it right after")


def _prefetch_judge(raw, seed):
    for n, events in _schedules(raw, seed):
        peak = _replay(events, n)
        if peak > 2:
            raise AssertionError(f"{n} layers with prefetch: {peak} layers gathered at once; "
                                 f"prefetch one layer ahead only (two gathered at most)")
        gather, forward, backward = _costs(seed, n)
        got, best = _exposed(events, gather, forward, backward), _best_exposed(gather, forward,
                                                                              backward)
        if got > best + 1e-9:
            raise AssertionError(
                f"{n} layers with prefetch: {got:.3f} s of communication exposed, a one-ahead "
                f"prefetch exposes {best:.3f} s (issue the next layer's gather before this "
                f"layer computes)")


register(
    Exercise(
        id="19.2",
        title="The FSDP schedule of one step",
        target="fsdp_schedule",
        task="the FSDP schedule",
        forbidden=("mlsys_lab.distributed.parallel.fsdp",),
        cases=(
            Case("every compute finds its layer gathered; gradients reduce-scattered once", 2,
                 feedback="gather before each forward and each backward; reduce-scatter after "
                          "each backward",
                 probe=_probe(False), judge=_valid_judge),
            Case("without prefetch: one layer gathered at a time", 1.5,
                 feedback="free a layer as soon as its compute is done",
                 probe=_probe(False), judge=_no_prefetch_judge),
            Case("with prefetch: two layers at most, communication hidden", 2.5,
                 feedback="issue the next layer's gather right after waiting on this one's",
                 probe=_probe(True), judge=_prefetch_judge),
        ),
    ),
)
