"""Assertions on a ``run_cases`` result that the exercise tests share: look a case up by the
start of its name, require full marks, or require that named cases score nothing (the wrong
idea they reject)."""

from __future__ import annotations


def rows(result):
    """``{case name: row}`` of a ``CheckResult``."""
    return {row.name: row for row in result.rows}


def feedback(result):
    """The failing rows' feedback, one string (for assertion messages)."""
    return " | ".join(f"{row.name}: {row.feedback}" for row in result.rows if not row.passed)


def case(result, prefix):
    """The one row whose name starts with ``prefix``."""
    matches = [row for name, row in rows(result).items() if name.startswith(prefix)]
    assert len(matches) == 1, f"no single case starting with {prefix!r}"
    return matches[0]


def fails(result, *prefixes):
    """Each case named by a prefix scores 0."""
    for prefix in prefixes:
        row = case(result, prefix)
        assert row.points == 0, f"{row.name} passed: {feedback(result)}"


def full(result):
    """Every case passed: full marks."""
    assert result.score == result.max > 0, feedback(result)


def fails_only(result, *prefixes, strict=True):
    """The cases named by a prefix (the first case starting with each) score 0; with
    ``strict``, every other case passed (so the check blames the wrong idea on the right case)."""
    by_name = rows(result)
    chosen = {next(n for n in by_name if n.startswith(prefix)) for prefix in prefixes}
    for name, row in by_name.items():
        if name in chosen:
            assert row.points == 0, f"{name} passed: {feedback(result)}"
        elif strict:
            assert row.passed, f"{name} failed: {feedback(result)}"


def refused(result):
    """Every case refused the answer because it calls a library function that is off limits."""
    return result.score == 0 and all("off limits" in row.feedback for row in result.rows)
