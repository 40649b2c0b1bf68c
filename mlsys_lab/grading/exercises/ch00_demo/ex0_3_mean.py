"""Exercise 0.3: the mean of a list.

Wrong ideas rejected: the median or a midrange (the lists are random), sorting in place (the
input is checked afterwards), returning 0 or nan for ``[]`` (it must raise ``ValueError``);
``numpy`` and ``statistics`` would do the exercise and are forbidden.
"""

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    Raised,
    attempt,
    describe,
    expect_close,
    expect_list,
    register,
)


def _values(seed: int) -> list[float]:
    return [round(float(x), 2) for x in np.random.default_rng(seed).uniform(-10, 10, 7)]


def _values_probe(mean, seed):
    return [mean([1, 2, 3, 4]), mean(_values(seed))]


def _values_judge(raw, seed):
    xs = _values(seed)
    got = expect_list(raw, 2, "mean")
    expect_close(got[0], 2.5, "mean([1, 2, 3, 4])")
    expect_close(got[1], sum(xs) / len(xs), f"mean({xs})", rel=1e-9, abs_=1e-9)


def _keeps_input_probe(mean):
    xs = [3.0, 1.0, 2.0]
    mean(xs)
    return xs


def _keeps_input_judge(raw):
    if raw != [3.0, 1.0, 2.0]:
        raise AssertionError(f"mean changed its input list to {describe(raw)}; it should not")


def _empty_judge(raw):
    if isinstance(raw, Raised):
        if raw.is_a("ValueError"):
            return
        raise AssertionError(f"mean([]) raised {raw}; raise ValueError with a clear message")
    raise AssertionError(f"mean([]) returned {describe(raw)}; it should raise ValueError")


register(
    Exercise(
        id="0.3",
        title="Mean of a list",
        target="mean",
        task="the mean (sum and count)",
        forbidden=(
            "statistics:mean",
            "statistics:fmean",
            "numpy:mean",
            "numpy:average",
            "numpy:ndarray.mean",
        ),
        cases=(
            Case("mean([1, 2, 3, 4]) == 2.5", 2, feedback="the arithmetic mean",
                 probe=_values_probe, judge=_values_judge),
            Case("mean leaves its input alone", 1, feedback="do not sort in place",
                 probe=_keeps_input_probe, judge=_keeps_input_judge),
            Case("mean([]) raises ValueError", 1, feedback="an empty list has no mean",
                 probe=lambda mean: attempt(mean, []), judge=_empty_judge),
        ),
    ),
)
