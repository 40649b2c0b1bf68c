"""mlsys_lab.timing, driven by a fake clock: the logic of best-of, blocks and interleaving.

No test here reads the real clock: every "cost" is time the fake clock is told to advance.
"""

import pytest

import mlsys_lab as ml
from mlsys_lab import timing


class FakeClock:
    """A clock that moves only when told to; the code under test "runs" by advancing it."""

    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.t += seconds

    def task(self, costs, log=None, name=None):
        """A callable whose i-th call takes ``costs[i]`` seconds (the last cost repeats)."""
        calls = []

        def run(*args):
            calls.append(args)
            if log is not None:
                log.append(name)
            self.t += costs[min(len(calls), len(costs)) - 1]

        run.calls = calls
        return run


def test_best_of_is_the_fastest_timed_run_and_warmup_is_not_timed():
    clock = FakeClock()
    fn = clock.task([0.25, 3.0, 1.0, 2.0, 5.0, 4.0])  # the 0.25 s warm-up must not count
    assert timing.best_of(fn, "a", 7, repeats=5, warmup=1, clock=clock) == 1.0
    assert fn.calls == [("a", 7)] * 6


def test_best_of_without_warmup_times_the_first_call():
    clock = FakeClock()
    fn = clock.task([0.5, 3.0])
    assert timing.best_of(fn, repeats=2, warmup=0, clock=clock) == 0.5


def test_budget_keeps_calling_until_the_deadline_and_repeats_is_a_minimum():
    clock = FakeClock()
    fn = clock.task([1.0])
    timing.best_of(fn, repeats=1, warmup=0, budget=4.5, clock=clock)
    assert len(fn.calls) == 5  # 1 s each: the 5th call ends at 5 s, the first past 4.5 s
    fn = clock.task([1.0])
    timing.best_of(fn, repeats=3, warmup=0, budget=0.5, clock=clock)
    assert len(fn.calls) == 3  # the budget is spent after one call, but 3 are asked for


def test_pause_sleeps_before_the_warmup():
    clock, order = FakeClock(), []
    fn = clock.task([1.0], log=order, name="call")
    real_sleep = clock.sleep
    clock.sleep = lambda s: (order.append("sleep"), real_sleep(s))
    timing.best_of(fn, repeats=2, warmup=1, pause=0.2, clock=clock)
    assert order == ["sleep", "call", "call", "call"]
    assert clock.sleeps == [0.2]


def test_samples_discards_the_first_calls_of_a_block():
    clock = FakeClock()
    fn = clock.task([9.0, 8.0, 1.0, 2.0])
    assert timing.samples(fn, repeats=4, discard=2, clock=clock) == [1.0, 2.0]


def test_compare_runs_the_contestants_round_robin_after_warming_each():
    clock, order = FakeClock(), []
    fns = {name: clock.task([1.0], log=order, name=name) for name in "abc"}
    timing.compare(fns, rounds=3, warmup=2, clock=clock)
    assert order == list("aabbcc") + list("abc") * 3


def test_compare_in_blocks_with_pauses_and_discards():
    clock, order = FakeClock(), []
    fns = {"a": clock.task([5.0, 1.0], log=order, name="a"),
           "b": clock.task([5.0, 2.0], log=order, name="b")}
    result = timing.compare(fns, rounds=2, block=3, discard=1, warmup=0, pause=0.1,
                            clock=clock)
    assert order == list("aaabbbaaabbb")
    assert clock.sleeps == [0.1] * 4  # one pause before each turn
    assert result.samples == {"a": [1.0] * 4, "b": [2.0] * 4}  # 2 turns x (3 - 1) kept


def test_interleaving_spreads_a_load_drift_over_every_contestant():
    # Two functions of equal cost on a machine that gets 3x slower halfway through: timed one
    # after the other, the second looks 3x slower; interleaved, both see the same slowdown.
    clock = FakeClock()

    def work(*_):
        clock.t += 1.0 if clock.t < 50 else 3.0

    def sequential_median(fn):
        return timing.compare({"f": fn}, rounds=50, warmup=0, stat="median", clock=clock)["f"]

    first, second = sequential_median(work), sequential_median(work)
    assert second / first == 3.0
    clock.t = 0.0
    both = timing.compare({"first": work, "second": work}, rounds=50, warmup=0, stat="median",
                          clock=clock)
    assert both.ratio("second") == 1.0


def test_comparison_ratios_against_the_named_baseline():
    clock = FakeClock()
    fns = {"numpy": clock.task([2.0]), "eager": clock.task([3.0]), "fused": clock.task([0.5])}
    result = timing.compare(fns, rounds=2, baseline="numpy", clock=clock)
    assert result.times == {"numpy": 2.0, "eager": 3.0, "fused": 0.5}
    assert result["eager"] == 3.0
    assert result.ratio("eager") == 1.5
    assert result.speedup("fused") == 4.0
    assert result.ratios == {"numpy": 1.0, "eager": 1.5, "fused": 0.25}
    assert result.labels == ["numpy", "eager", "fused"]
    assert timing.compare(fns, rounds=1, clock=clock).baseline == "numpy"  # default: first label
    assert timing.compare(fns, rounds=1, baseline="fused", clock=clock).ratio("numpy") == 4.0


def test_comparison_median_and_non_string_labels():
    clock = FakeClock()
    fns = [clock.task([1.0, 9.0, 2.0, 3.0]), clock.task([4.0])]
    result = timing.compare(fns, rounds=3, warmup=1, stat="median", clock=clock)
    assert result.times == {0: 3.0, 1: 4.0}  # samples of 0: 9, 2, 3 (the 1 s was the warm-up)
    tiles = timing.compare({(512, 16): fns[1], (512, 32): fns[1]}, rounds=1, clock=clock)
    assert tiles.ratio((512, 32)) == 1.0


def test_comparison_prints_a_readable_table():
    clock = FakeClock()
    result = timing.compare({"unfused": clock.task([0.004]), "fused": clock.task([0.001])},
                            rounds=5, clock=clock)
    lines = str(result).splitlines()
    assert lines[0] == "best of 5 interleaved runs each, against 'unfused'"
    assert lines[1].split() == ["ms", "ratio", "speed-up"]
    assert lines[2].split() == ["unfused", "4.000", "1.00x", "1.00x"]
    assert lines[3].split() == ["fused", "1.000", "0.25x", "4.00x"]
    assert repr(result) == str(result)
    assert result.table("us").splitlines()[2].split()[1] == "4000.000"
    slow = timing.compare({"a": clock.task([0.001]), "b": clock.task([0.5])}, rounds=1,
                          stat="median", clock=clock)
    assert str(slow).splitlines()[0].startswith("median of 1 interleaved")
    assert str(slow).splitlines()[3].split()[2:] == ["500.00x", "0.002x"]


def test_timed_returns_the_result_and_the_seconds():
    clock = FakeClock()
    fn = clock.task([2.5])
    assert timing.timed(lambda x: (fn(), x * 2)[1], 21, clock=clock) == (42, 2.5)


@pytest.mark.parametrize("kwargs", [{"rounds": 0}, {"block": 0}, {"warmup": -1},
                                    {"rounds": 1.5}, {"stat": "mean"},
                                    {"block": 2, "discard": 2}])
def test_compare_rejects_bad_arguments_with_a_library_error(kwargs):
    clock = FakeClock()
    fn = clock.task([1.0])
    with pytest.raises(ml.ArgumentError):
        timing.compare({"a": fn}, clock=clock, **kwargs)
    assert fn.calls == []  # refused before any warm-up call


def test_compare_rejects_an_unknown_baseline_no_callables_and_non_callables():
    clock = FakeClock()
    with pytest.raises(ml.UnknownNameError, match="'numpy'.*'a', 'b'"):
        timing.compare({"a": clock.task([1.0]), "b": clock.task([1.0])}, baseline="numpy",
                       clock=clock)
    with pytest.raises(ml.ArgumentError, match="no callables"):
        timing.compare({}, clock=clock)
    with pytest.raises(ml.ArgumentError, match="'b' is a float"):
        timing.compare({"a": clock.task([1.0]), "b": 1.0}, clock=clock)
    with pytest.raises(ml.ArgumentError, match="repeats"):
        timing.best_of(clock.task([1.0]), repeats=0, clock=clock)


def test_the_default_clock_is_perf_counter_and_sleep():
    import time

    assert timing.SYSTEM_CLOCK.now is time.perf_counter
    assert timing.SYSTEM_CLOCK.sleep is time.sleep
