"""Checks for chapter 0, the demo exercise set (``solutions/ch00_demo.ipynb``).

This module is the template for a chapter's checks: copy it to ``chNN.py``, write one
``Exercise`` per answer cell, and ``register`` them. Each ``Case`` has two halves:

* a **probe**, run in the student's kernel: it calls the student's function on the case's inputs
  and returns what came back as plain data — nothing else (no verdict, no reference);
* a **judge**, run by the grader in its own process: it rebuilds the same inputs, computes the
  reference *itself* and raises ``AssertionError`` with a message a student can act on.

A probe or judge that takes ``seed`` gets fresh inputs each run; both must derive the inputs from
it the same way (``_floats`` below serves both). ``forbidden`` names the library functions that
would do the exercise for the student; the references in this module (``_fib``) are off limits
to the student's code without being listed.
"""

from __future__ import annotations

import numpy as np

from mlsys_lab.grading.checks import (
    Case,
    Exercise,
    Raised,
    attempt,
    describe,
    expect_close,
    expect_equal,
    register,
)

# ----------------------------------------------------------------------------- inputs (both sides)


def _floats(seed: int) -> list[float]:
    """-1.5 and five floats of mixed sign drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return [-1.5] + [round(float(x), 3) for x in rng.uniform(-50, 50, 5)]


def _big_n(seed: int) -> int:
    return 60 + seed % 40


# ----------------------------------------------------------------------------- references (judge)


def _fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _expect_list(raw, length: int, what: str) -> list:
    if not isinstance(raw, list) or len(raw) != length:
        raise AssertionError(f"{what}: expected {length} results, got {describe(raw)}")
    return raw


# ----------------------------------------------------------------------------- 0.1 square
# A wrong idea that still looks right (x + x, abs(x) * 2, a table of known answers) fails
# because the inputs are drawn fresh each run and include negative non-integers.


def _square_floats_judge(raw, seed):
    xs = _floats(seed)
    for x, got in zip(xs, _expect_list(raw, len(xs), "square on floats"), strict=True):
        expect_close(got, x * x, f"square({x})")


# ----------------------------------------------------------------------------- 0.2 fib
# A wrong idea fails: an off-by-one start (fib(1) == 0), a closed form in floats (inexact at
# n = 90), a lookup table (n is drawn fresh up to 99), plain recursion (times out).


def _fib_first_twenty_judge(raw):
    for n, value in enumerate(_expect_list(raw, 20, "fib(n) for n < 20")):
        expect_equal(value, _fib(n), f"fib({n})")


def _fib_large_judge(raw, seed):
    got = _expect_list(raw, 2, "fib on large n")
    expect_equal(got[0], _fib(90), "fib(90)")
    expect_equal(got[1], _fib(_big_n(seed)), f"fib({_big_n(seed)})")


# ----------------------------------------------------------------------------- 0.3 mean
# A wrong idea fails: the median or a midrange (random lists), sorting in place (input checked),
# returning 0 or nan for [] (must raise ValueError); numpy/statistics are off limits.


def _mean_values_probe(mean, seed):
    xs = [round(float(x), 2) for x in np.random.default_rng(seed).uniform(-10, 10, 7)]
    return [mean([1, 2, 3, 4]), mean(list(xs))]


def _mean_values_judge(raw, seed):
    xs = [round(float(x), 2) for x in np.random.default_rng(seed).uniform(-10, 10, 7)]
    got = _expect_list(raw, 2, "mean")
    expect_close(got[0], 2.5, "mean([1, 2, 3, 4])")
    expect_close(got[1], sum(xs) / len(xs), f"mean({xs})", rel=1e-9, abs_=1e-9)


def _mean_keeps_input_probe(mean):
    xs = [3.0, 1.0, 2.0]
    mean(xs)
    return xs


def _mean_keeps_input_judge(raw):
    if raw != [3.0, 1.0, 2.0]:
        raise AssertionError(f"mean changed its input list to {describe(raw)}; it should not")


def _mean_empty_judge(raw):
    if isinstance(raw, Raised):
        if raw.is_a("ValueError"):
            return
        raise AssertionError(f"mean([]) raised {raw}; raise ValueError with a clear message")
    raise AssertionError(f"mean([]) returned {describe(raw)}; it should raise ValueError")


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
                 judge=_square_floats_judge),
        ),
    ),
    Exercise(
        id="0.2",
        title="Fibonacci numbers",
        target="fib",
        cases=(
            Case("fib(0) == 0, fib(1) == 1", 1, feedback="the two base cases",
                 probe=lambda fib: [fib(0), fib(1)],
                 judge=lambda raw: expect_equal(raw, [0, 1], "[fib(0), fib(1)]")),
            Case("fib(n) for n < 20", 2, feedback="fib(n) = fib(n-1) + fib(n-2)",
                 probe=lambda fib: [fib(n) for n in range(20)],
                 judge=_fib_first_twenty_judge),
            Case("fib(90) is exact and fast", 2, feedback="use a loop, not plain recursion",
                 probe=lambda fib, seed: [fib(90), fib(_big_n(seed))],
                 judge=_fib_large_judge),
        ),
    ),
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
                 probe=_mean_values_probe, judge=_mean_values_judge),
            Case("mean leaves its input alone", 1, feedback="do not sort in place",
                 probe=_mean_keeps_input_probe, judge=_mean_keeps_input_judge),
            Case("mean([]) raises ValueError", 1, feedback="an empty list has no mean",
                 probe=lambda mean: attempt(mean, []), judge=_mean_empty_judge),
        ),
    ),
)
