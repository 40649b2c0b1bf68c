"""Checks for chapter 0, the demo exercise set (``solutions/ch00_demo.ipynb``).

This module is the template for a chapter's checks: copy it to ``chNN.py``, write one
``Exercise`` per answer cell, and ``register`` them. Each case compares the student's answer with
a *private reference* kept here (never with anything in the notebook namespace), and its
``AssertionError`` message says what was expected — in words a student can act on.
"""

from __future__ import annotations

from mlsys_lab.grading.checks import Case, Exercise, expect_close, expect_equal, register

# ----------------------------------------------------------------------------- references


def _square(x):
    return x * x


def _fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


# ----------------------------------------------------------------------------- 0.1 square


def _square_int(square):
    expect_equal(square(3), _square(3), "square(3)")


def _square_negative_float(square):
    expect_close(square(-1.5), _square(-1.5), "square(-1.5)")


# ----------------------------------------------------------------------------- 0.2 fib


def _fib_base(fib):
    expect_equal(fib(0), _fib(0), "fib(0)")
    expect_equal(fib(1), _fib(1), "fib(1)")


def _fib_first_twenty(fib):
    got = [fib(n) for n in range(20)]
    for n, value in enumerate(got):
        expect_equal(value, _fib(n), f"fib({n})")


def _fib_large(fib):
    expect_equal(fib(90), _fib(90), "fib(90)")


# ----------------------------------------------------------------------------- 0.3 mean


def _mean_simple(mean):
    expect_close(mean([1, 2, 3, 4]), _mean([1, 2, 3, 4]), "mean([1, 2, 3, 4])")


def _mean_keeps_input(mean):
    xs = [3.0, 1.0, 2.0]
    mean(xs)
    assert xs == [3.0, 1.0, 2.0], f"mean changed its input list to {xs}; it should not"


def _mean_empty(mean):
    try:
        result = mean([])
    except ValueError:
        return
    except ZeroDivisionError:
        raise AssertionError(
            "mean([]) raised ZeroDivisionError; raise ValueError with a clear message"
        ) from None
    raise AssertionError(f"mean([]) returned {result!r}; it should raise ValueError")


register(
    Exercise(
        id="0.1",
        title="Square a number",
        target="square",
        cases=(
            Case("square(3) == 9", 1, _square_int, "square(3) should be 9"),
            Case("square(-1.5) == 2.25", 2, _square_negative_float, "works for negative floats"),
        ),
    ),
    Exercise(
        id="0.2",
        title="Fibonacci numbers",
        target="fib",
        cases=(
            Case("fib(0) == 0, fib(1) == 1", 1, _fib_base, "the two base cases"),
            Case("fib(n) for n < 20", 2, _fib_first_twenty, "fib(n) = fib(n-1) + fib(n-2)"),
            Case("fib(90) is exact and fast", 2, _fib_large, "use a loop, not plain recursion"),
        ),
    ),
    Exercise(
        id="0.3",
        title="Mean of a list",
        target="mean",
        cases=(
            Case("mean([1, 2, 3, 4]) == 2.5", 2, _mean_simple, "the arithmetic mean"),
            Case("mean leaves its input alone", 1, _mean_keeps_input, "do not sort in place"),
            Case("mean([]) raises ValueError", 1, _mean_empty, "an empty list has no mean"),
        ),
    ),
)
