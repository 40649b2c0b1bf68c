"""Exercise 0.1: square a number.

Wrong ideas rejected: ``x + x`` or ``abs(x) * 2`` (right at 2 only), a table of known answers
(the floats are drawn fresh each run and include negative non-integers).
"""

import numpy as np

from mlsys_lab.grading.core.exercise import (
    Case,
    Exercise,
    expect_close,
    expect_equal,
    expect_list,
    register,
)


def _floats(seed: int) -> list[float]:
    """-1.5 and five floats of mixed sign drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return [-1.5] + [round(float(x), 3) for x in rng.uniform(-50, 50, 5)]


def _floats_judge(raw, seed):
    xs = _floats(seed)
    for x, got in zip(xs, expect_list(raw, len(xs), "square on floats"), strict=True):
        expect_close(got, x * x, f"square({x})")


register(
    Exercise(
        id="0.1",
        title="Square a number",
        target="square",
        cases=(
            Case("square(3) == 9", 1, feedback="square(3) should be 9",
                 probe=lambda square: square(3),
                 judge=lambda raw: expect_equal(raw, 9, "square(3)")),
            Case("square(-1.5) and random floats", 2, feedback="works for negative floats",
                 probe=lambda square, seed: [square(x) for x in _floats(seed)],
                 judge=_floats_judge),
        ),
    ),
)
