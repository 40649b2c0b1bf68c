"""Exercise 0.2: Fibonacci numbers.

Wrong ideas rejected: an off-by-one start (fib(1) == 0), a closed form in floats (inexact at
n = 90), a lookup table (n is drawn fresh up to 99), plain recursion (times out).
"""

from mlsys_lab.grading.core.exercise import Case, Exercise, expect_equal, expect_list, register


def _big_n(seed: int) -> int:
    return 60 + seed % 40


def _fib(n):
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def _first_twenty_judge(raw):
    for n, value in enumerate(expect_list(raw, 20, "fib(n) for n < 20")):
        expect_equal(value, _fib(n), f"fib({n})")


def _large_judge(raw, seed):
    got = expect_list(raw, 2, "fib on large n")
    expect_equal(got[0], _fib(90), "fib(90)")
    expect_equal(got[1], _fib(_big_n(seed)), f"fib({_big_n(seed)})")


register(
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
                 judge=_first_twenty_judge),
            Case("fib(90) is exact and fast", 2, feedback="use a loop, not plain recursion",
                 probe=lambda fib, seed: [fib(90), fib(_big_n(seed))],
                 judge=_large_judge),
        ),
    ),
)
