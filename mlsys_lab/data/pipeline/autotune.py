"""Choosing per-operator parallel degrees from measured per-item stage costs.

The model (the book's pipeline-parallel picture): stage ``i`` costs ``c_i`` seconds per item on
one worker, so ``d_i`` workers process ``d_i / c_i`` items per second, and a pipeline runs at
the rate of its slowest stage. With ``cores`` given, the stages also share that many CPUs, which
caps the rate at ``cores / sum(c_i)`` whatever the degrees. The tuner maximises the predicted
rate with the sum of the tuned degrees at most ``budget``, and of the best choices returns the
one using the fewest workers.

Maximising ``min_i d_i / c_i`` over integers is solved exactly by water-filling: keep adding a
worker to the currently slowest stage (that stage must get one in any better allocation), then
trim every stage to the fewest workers that still reach the resulting rate. ``brute_force`` is
the exhaustive oracle the tests compare against. Tuning a real ``Pipeline`` (measuring its
stage costs, then applying the degrees) is ``pipeline.autotune``.

The model is idealised: it assumes the stages overlap perfectly. Fair sharing of the CPUs,
the GIL, the hand-off between thread groups and uneven items all cost rate it does not see.
``refine_degrees`` corrects for them by hill-climbing from the model's choice on *measured*
throughput (a timed run of the pipeline, or the simulator), as tf.data's AUTOTUNE adjusts on
what it observes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping

from ...errors import ArgumentError

__all__ = ["AUTOTUNE", "choose_degrees", "brute_force", "predicted_throughput", "refine_degrees"]


class _Autotune:
    """The sentinel ``num_parallel=AUTOTUNE``: let the tuner pick this operator's degree."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self):
        return "AUTOTUNE"

    def __reduce__(self):
        return (_Autotune, ())


AUTOTUNE = _Autotune()


def _check_costs(fn: str, costs) -> dict:
    if not isinstance(costs, Mapping):
        costs = dict(enumerate(costs))
    for name, cost in costs.items():
        if not isinstance(cost, (int, float)) or not cost >= 0 or math.isinf(cost):
            raise ArgumentError(f"{fn}: stage {name!r} has cost {cost!r}; costs are finite "
                                "seconds per item, >= 0")
    return dict(costs)


def predicted_throughput(costs, degrees, cores: float | None = None) -> float:
    """Items per second of stages with ``costs`` run with ``degrees`` (and ``cores`` CPUs)."""
    costs = _check_costs("predicted_throughput", costs)
    degrees = degrees if isinstance(degrees, Mapping) else dict(enumerate(degrees))
    if set(degrees) != set(costs):
        raise ArgumentError(f"predicted_throughput: degrees for {sorted(map(str, degrees))}, "
                            f"costs for {sorted(map(str, costs))}")
    rates = [degrees[name] / cost if cost > 0 else math.inf for name, cost in costs.items()]
    total = sum(costs.values())
    if cores is not None and total > 0:
        rates.append(cores / total)
    return min(rates, default=math.inf)


def choose_degrees(costs, budget: int, *, fixed: Mapping | None = None,
                   cores: float | None = None) -> dict:
    """The fewest workers per stage that maximise the predicted throughput.

    Args:
        costs: ``{stage: seconds per item on one worker}`` (or a sequence) for every stage.
        budget: At most this many workers in total over the tuned stages.
        fixed: ``{stage: degree}`` for stages whose degree is given (inline operators, user
            choices). They cap the rate but do not use the budget.
        cores: CPUs shared by every stage (None: one core per worker).

    Returns:
        ``{stage: degree}`` for every stage (the fixed ones unchanged).

    Raises:
        ArgumentError: Bad costs, or a budget smaller than the number of tuned stages.
    """
    costs = _check_costs("choose_degrees", costs)
    fixed = dict(fixed or {})
    tuned = [name for name in costs if name not in fixed]
    if not isinstance(budget, int) or budget < len(tuned):
        raise ArgumentError(f"choose_degrees: budget {budget!r} is fewer than one worker for "
                            f"each of the {len(tuned)} tuned stages")
    cap = predicted_throughput({n: costs[n] for n in fixed}, fixed, None)
    if cores is not None and sum(costs.values()) > 0:
        cap = min(cap, cores / sum(costs.values()))
    degrees = dict.fromkeys(tuned, 1)
    rate = lambda name: degrees[name] / costs[name] if costs[name] > 0 else math.inf
    while tuned and sum(degrees.values()) < budget:
        slowest = min(tuned, key=rate)
        if rate(slowest) >= cap:
            break
        degrees[slowest] += 1
    target = min([cap, *map(rate, tuned)])
    for name in tuned:  # trim: the fewest workers that still reach the target rate
        if math.isfinite(target) and costs[name] > 0:
            need = math.ceil(target * costs[name] * (1 - 1e-12))
            degrees[name] = max(1, min(degrees[name], need))
    return {**degrees, **fixed}


def brute_force(costs, budget: int, *, fixed: Mapping | None = None,
                cores: float | None = None) -> dict:
    """Exhaustive search over every allocation (small cases only): the tuner's test oracle.

    Returns the allocation with the highest predicted throughput, fewest workers on ties.
    Throughputs within a relative 1e-12 are ties, as :func:`choose_degrees` trims them: two
    stages whose costs differ in the last bit are not worth a worker.
    """
    costs = _check_costs("brute_force", costs)
    fixed = dict(fixed or {})
    tuned = [name for name in costs if name not in fixed]
    if budget < len(tuned):
        raise ArgumentError(f"brute_force: budget {budget} is below {len(tuned)} tuned stages")
    best, best_rate, best_workers = None, -math.inf, 0
    for combo in itertools.product(range(1, budget - len(tuned) + 2), repeat=len(tuned)):
        if sum(combo) > budget:
            continue
        degrees = {**dict(zip(tuned, combo)), **fixed}
        rate = predicted_throughput(costs, degrees, cores)
        tie = rate == best_rate or math.isclose(rate, best_rate, rel_tol=1e-12)
        if best is None or (rate > best_rate and not tie) or (tie and sum(combo) < best_workers):
            best, best_rate, best_workers = degrees, rate, sum(combo)
    return best


def refine_degrees(degrees: Mapping, budget: int, evaluate, *, tuned=None, rounds: int = 3,
                   margin: float = 0.03) -> tuple[dict, dict]:
    """Hill-climb from ``degrees`` on measured throughput: the model's choice corrected for what
    it leaves out (contention for the CPUs and the GIL, hand-off costs, uneven items).

    Each round evaluates every neighbour of the current allocation (one more worker for a
    stage, one fewer, or one moved between two stages; at most ``budget`` over the ``tuned``
    stages) and moves to the best one if it beats the current by more than ``margin``, and
    still does when both are measured again back to back (timings are noisy: a move needs a
    clear and repeated gain; every allocation keeps its best measurement).

    Args:
        degrees: The start (``choose_degrees``' answer), ``{stage: degree}``.
        budget: At most this many workers over the tuned stages.
        evaluate: ``evaluate(degrees) -> items per second``: a measured run of the pipeline,
            or the simulator.
        tuned: The stages that may change (default: all).
        rounds: Climbing steps at most.
        margin: Relative gain a neighbour needs to be taken.

    Returns:
        ``(best degrees, {allocation as a tuple: measured rate})`` for every allocation tried.
    """
    tuned = list(degrees) if tuned is None else list(tuned)
    seen = {}
    key = lambda candidate: tuple(candidate[name] for name in degrees)

    def rate(candidate, again=False):
        """The candidate's measured rate (measured again if ``again``: that fresh value)."""
        k = key(candidate)
        if k in seen and not again:
            return seen[k]
        measured = float(evaluate(dict(candidate)))
        seen[k] = max(seen.get(k, 0.0), measured)  # reported: the least disturbed run
        return measured

    current = dict(degrees)
    for _ in range(rounds):
        here = rate(current)
        best, best_rate = None, here * (1 + margin)
        for candidate in _neighbours(current, tuned, budget):
            r = rate(candidate)
            if r > best_rate:
                best, best_rate = candidate, r
        if best is None:
            break
        # confirm before moving: measure both once more, back to back, so that one disturbed
        # measurement (another job on the machine) does not move the climb
        if rate(best, again=True) <= rate(current, again=True) * (1 + margin):
            break
        current = best
    return current, seen


def _neighbours(degrees, tuned, budget):
    used = sum(degrees[name] for name in tuned)
    for name in tuned:
        if used < budget:
            yield {**degrees, name: degrees[name] + 1}
        if degrees[name] > 1:
            yield {**degrees, name: degrees[name] - 1}
            for other in tuned:
                if other != name:
                    yield {**degrees, name: degrees[name] - 1, other: degrees[other] + 1}
