"""Graded exercises: per-exercise checks, the notebook grader and the exercise builder.

``checks`` (cases, exercises, ``check``), ``probe`` (the kernel side: run the probes, pack raw
results), ``judge`` (the trusted side: verdicts from raw results), ``guard`` (forbidden functions
refuse to run while a probe runs), ``wire`` (plain data between the two sides, no pickle),
``grader`` (``mlsys-lab grade``), ``builder`` (``mlsys-lab exercises build``), and one module of
checks per chapter, ``chNN`` (``ch00`` is the template).
"""

from .checks import check

__all__ = ["check"]
