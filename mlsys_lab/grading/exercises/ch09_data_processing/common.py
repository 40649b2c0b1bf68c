"""Helpers that several chapter 9 exercises share."""

from mlsys_lab.grading.core.exercise import describe


def expect_type(raw, kind, what):
    """For judges: ``raw`` itself when it is a ``kind`` (a type or a tuple of types), else an
    ``AssertionError`` naming ``what`` and what came back instead."""
    if not isinstance(raw, kind):
        raise AssertionError(f"{what}: the check got {describe(raw)}")
    return raw
