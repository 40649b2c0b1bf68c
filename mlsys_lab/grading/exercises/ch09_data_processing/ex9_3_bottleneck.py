"""Exercise 9.3: find the bottleneck from measured stage costs.

The slowest of the read rate F, each stage's ``degree / cost``, the shared CPUs and the consume
rate G; a wrong answer gets a hint when it matches exactly one of the wrong ideas below
(``_BN_MISTAKES``).

Wrong ideas rejected (a wrong idea that still names a stage): the stage with the largest cost
per item ignores its degree (random pipelines, where degrees differ); cost / degree or
cost x degree as the "rate" picks the fastest stage; 1 / sum(costs) is a serial pipeline;
ignoring F or G misses the read and device cases; ignoring the shared CPUs misses the cores
case; returning seconds per item instead of items per second fails every rate; ties resolved to
the last stage fail the tie case.
"""

import math
import numbers

import numpy as np

from mlsys_lab.grading.core.exercise import Case, Exercise, describe, plain, register
from mlsys_lab.grading.exercises.ch09_data_processing.common import expect_type

# ----------------------------------------------------------------------------- inputs (both sides)

_STAGE_NAMES = ("read_record", "decode", "crop", "resize", "rotate", "flip", "normalize",
                "to_chw", "batch")


def _random_pipeline(rng, with_rates=False, with_cores=False):
    """A configured pipeline: degrees roughly follow the costs (as someone tuning by hand would
    set them), so the slowest stage is often not the one with the largest cost per item."""
    k = int(rng.integers(3, 8))
    names = [str(x) for x in rng.choice(_STAGE_NAMES, size=k, replace=False)]
    costs = {name: float(10 ** rng.uniform(-4, -2.5)) for name in names}
    cheapest = min(costs.values())
    degrees = {name: int(np.clip(round(costs[name] / cheapest * rng.uniform(0.4, 1.6)), 1, 16))
               for name in names}
    kwargs = {}
    p = min(degrees[n] / costs[n] for n in names)
    if with_rates:
        kwargs["read_rate"] = float(p * rng.uniform(0.5, 2.0))
        kwargs["consume_rate"] = float(p * rng.uniform(0.5, 2.0))
    if with_cores:
        kwargs["cores"] = int(rng.integers(1, 17))
    return costs, degrees, kwargs


def _bn_examples():
    """Hand-made cases with exact answers (seconds per item, workers)."""
    return [
        ({"decode": 0.002}, {"decode": 1}, {}),
        ({"decode": 0.002}, {"decode": 4}, {}),
        ({"decode": 0.002}, {"decode": 4}, {"read_rate": 100.0}),
        ({"decode": 0.002}, {"decode": 4}, {"read_rate": 5000.0, "consume_rate": 1500.0}),
        ({"decode": 0.004, "resize": 0.001}, {"decode": 2, "resize": 1}, {}),
    ]


_BN_EXAMPLE_ANSWERS = [("decode", 500.0), ("decode", 2000.0), ("read", 100.0),
                       ("device", 1500.0), ("decode", 500.0)]


def _bn_random(seed, count, **kinds):
    salt = 1 if kinds.get("with_rates") else 2 if kinds.get("with_cores") else 0
    rng = np.random.default_rng([9600 + salt, seed])
    return [_random_pipeline(rng, **kinds) for _ in range(count)]


def _bn_ties():
    return [
        ({"a": 0.5, "b": 0.25}, {"a": 2, "b": 1}, {}),                       # 4/s each
        ({"a": 0.25, "b": 0.5}, {"a": 1, "b": 4}, {"read_rate": 4.0}),       # read ties a
        ({"a": 0.25}, {"a": 1}, {"consume_rate": 4.0}),                      # G == P: fed
        ({"a": 0.125, "b": 0.125}, {"a": 1, "b": 1}, {"cores": 2}),          # 8/s: a, b, cpus
    ]


_BN_TIE_ANSWERS = [("a", 4.0), ("read", 4.0), ("a", 4.0), ("a", 8.0)]

# ----------------------------------------------------------------------------- probes


def _bn_call(find_bottleneck, cases):
    return [plain(find_bottleneck(dict(c), dict(d), **kw)) for c, d, kw in cases]


def _bn_examples_probe(find_bottleneck):
    return _bn_call(find_bottleneck, _bn_examples())


def _bn_stages_probe(find_bottleneck, seed):
    return _bn_call(find_bottleneck, _bn_random(seed, 30))


def _bn_rates_probe(find_bottleneck, seed):
    return _bn_call(find_bottleneck, _bn_random(seed, 30, with_rates=True))


def _bn_cores_probe(find_bottleneck, seed):
    return _bn_call(find_bottleneck, _bn_random(seed, 30, with_cores=True))


def _bn_ties_probe(find_bottleneck):
    return _bn_call(find_bottleneck, _bn_ties())


# ----------------------------------------------------------------------------- judges


def _reference_bottleneck(costs, degrees, read_rate=None, consume_rate=None, cores=None):
    limits = []
    if read_rate is not None:
        limits.append(("read", read_rate))
    limits += [(n, degrees[n] / costs[n] if costs[n] > 0 else math.inf) for n in costs]
    total = sum(costs.values())
    if cores is not None and total > 0:
        limits.append(("cpus", cores / total))
    if consume_rate is not None:
        limits.append(("device", consume_rate))
    best = limits[0]
    for limit in limits[1:]:
        if limit[1] < best[1]:
            best = limit
    return best


def _bn_limits(costs, degrees, read_rate=None, consume_rate=None, cores=None, *, stages="all",
               read=True, cpus=True, device=True):
    """The limits in pipeline order, as ``_reference_bottleneck`` lists them, with one idea
    changed for the wrong answers: ``stages`` "all" (right), "largest cost" (only the stage of
    the largest cost per item) or "fastest" (only the stage of the highest degree / cost); and
    ``read``, ``cpus``, ``device`` False to leave that limit out."""
    rates = {n: degrees[n] / costs[n] if costs[n] > 0 else math.inf for n in costs}
    names = list(costs)
    if stages == "largest cost":
        names = [max(names, key=costs.get)]
    elif stages == "fastest":
        names = [max(names, key=rates.get)]
    limits = [("read", read_rate)] if read and read_rate is not None else []
    limits += [(n, rates[n]) for n in names]
    total = sum(costs.values())
    if cpus and cores is not None and total > 0:
        limits.append(("cpus", cores / total))
    if device and consume_rate is not None:
        limits.append(("device", consume_rate))
    return limits


def _bn_lowest(limits, last_on_ties=False):
    best = limits[0]
    for limit in limits[1:]:
        if limit[1] < best[1] or (last_on_ties and limit[1] == best[1]):
            best = limit
    return best


#: The wrong ideas a 9.3 answer is diagnosed with, each as what it answers (costs, degrees,
#: kwargs) -> (name, rate), and the hint shown when an answer's choice is that idea's and no
#: other's. tests/notebooks/test_exercises_ch09.py implements each idea and checks its hint.
_BN_MISTAKES = {
    "largest cost": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, stages="largest cost")),
        "that is the stage with the largest cost per item, but its workers share the work: a "
        "stage of d workers at c seconds per item runs at d / c items/s, and the lowest of "
        "those limits the pipeline"),
    "fastest stage": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, stages="fastest")),
        "that is the fastest stage; the lowest rate degree / cost (items per second) limits "
        "the pipeline"),
    "no read": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, read=False)),
        "the reader delivers only read_rate (F) items per second: F is a limit too"),
    "no cpus": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, cpus=False)),
        "all stages share the cores: cores / (sum of the costs) items per second is a limit "
        "too"),
    "no device": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw, device=False)),
        "the device takes only consume_rate (G) items per second: G is a limit too"),
    "last on ties": (
        lambda c, d, kw: _bn_lowest(_bn_limits(c, d, **kw), last_on_ties=True),
        "on a tie the earliest limit in pipeline order is the bottleneck: read, the stages in "
        "their order, cpus, device"),
}
#: The hint for a right name with the reciprocal rate.
_BN_SECONDS_HINT = "that is seconds per item; return items per second"


def _diagnose(got_name, case, want):
    """The one wrong idea whose answer to ``case`` is wrong and names ``got_name``, or None
    when no idea does, or more than one (then no hint can say which mistake it was)."""
    costs, degrees, kwargs = case
    found = []
    for mistake, (answer, _) in _BN_MISTAKES.items():
        theirs = answer(costs, degrees, kwargs)
        if theirs[0] == got_name and (theirs[0] != want[0] or theirs[1] != want[1]):
            found.append(mistake)
    return found[0] if len(found) == 1 else None


def _bn_failure(g, case, want):
    """Why answer ``g`` to ``case`` is wrong (``want`` is right), with a hint derived from the
    mistake it matches, or None when it is right. Returns (message, hinted)."""
    label = f"costs {case[0]}, degrees {case[1]}" + (f", {case[2]}" if case[2] else "")
    if not (isinstance(g, (list, tuple)) and len(g) == 2 and isinstance(g[0], str)
            and isinstance(g[1], numbers.Real) and not isinstance(g[1], bool)):
        return (f"{label}: find_bottleneck should return (name, items per second), got "
                f"{describe(g)}"), False
    if g[0] != want[0]:
        mistake = _diagnose(g[0], case, want)
        hint = f" — {_BN_MISTAKES[mistake][1]}" if mistake else ""
        return (f"{label}: the bottleneck is {want[0]!r} at {want[1]:.6g} items/s, you said "
                f"{g[0]!r}{hint}"), bool(hint)
    if not math.isclose(float(g[1]), want[1], rel_tol=1e-9):
        hint = ""
        if want[1] > 0 and math.isclose(float(g[1]), 1.0 / want[1], rel_tol=1e-6):
            hint = f" ({_BN_SECONDS_HINT})"
        return (f"{label}: {want[0]!r} runs at {want[1]:.6g} items/s, you said "
                f"{float(g[1]):.6g}{hint}"), bool(hint)
    return None


def _bn_judge_list(raw, cases, what, answers=None):
    """Fail on the first wrong answer whose mistake can be named (a hint), else on the first
    wrong answer."""
    got = expect_type(raw, list, what)
    if len(got) != len(cases):
        raise AssertionError(f"{what}: expected {len(cases)} answers, got {len(got)}")
    first = None
    for k, (g, case) in enumerate(zip(got, cases)):
        want = answers[k] if answers is not None else _reference_bottleneck(
            case[0], case[1], **case[2])
        failure = _bn_failure(g, case, want)
        if failure is None:
            continue
        message, hinted = failure
        if hinted:
            raise AssertionError(message)
        first = first or message
    if first:
        raise AssertionError(first)


def _bn_examples_judge(raw):
    _bn_judge_list(raw, _bn_examples(), "worked examples", _BN_EXAMPLE_ANSWERS)


def _bn_stages_judge(raw, seed):
    _bn_judge_list(raw, _bn_random(seed, 30), "random pipelines")


def _bn_rates_judge(raw, seed):
    _bn_judge_list(raw, _bn_random(seed, 30, with_rates=True), "with read and consume rates")


def _bn_cores_judge(raw, seed):
    _bn_judge_list(raw, _bn_random(seed, 30, with_cores=True), "with shared cores")


def _bn_ties_judge(raw):
    _bn_judge_list(raw, _bn_ties(), "ties", _BN_TIE_ANSWERS)


register(
    Exercise(
        id="9.3",
        title="Find the bottleneck from measured stage costs",
        target="find_bottleneck",
        task="the bottleneck finder",
        forbidden=(
            "mlsys_lab.data.pipeline.sim",
            "mlsys_lab.data.pipeline.autotune",
            "mlsys_lab.data.pipeline.report:Report",
        ),
        cases=(
            Case("worked examples: one and two stages, F and G", 1,
                 feedback="degree / cost items per second; F and G are rates too",
                 probe=_bn_examples_probe, judge=_bn_examples_judge),
            Case("30 random pipelines: the lowest degree / cost", 2,
                 feedback="the stage with the lowest degree / cost",
                 probe=_bn_stages_probe, judge=_bn_stages_judge),
            Case("with F and G: the device is the bottleneck iff G < min(F, P)", 1,
                 feedback="compare F, every stage and G",
                 probe=_bn_rates_probe, judge=_bn_rates_judge),
            Case("with shared cores: cores / sum of costs caps the rate", 1,
                 feedback="all stages share the CPUs",
                 probe=_bn_cores_probe, judge=_bn_cores_judge),
            Case("ties go to the earliest limit in pipeline order", 1,
                 feedback="read, the stages in order, cpus, device",
                 probe=_bn_ties_probe, judge=_bn_ties_judge),
        ),
    ),
)
