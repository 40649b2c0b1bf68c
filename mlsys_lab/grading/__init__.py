"""Graded exercises: per-exercise checks, the notebook grader and the exercise builder."""

from .checks import check

__all__ = ["check"]
