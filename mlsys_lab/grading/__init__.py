"""Graded exercises: per-exercise checks, the notebook grader and the exercise builder.

``checks`` (cases, exercises, ``check``), ``probe`` (the kernel side: run the probes, pack raw
results), ``judge`` (the trusted side: verdicts from raw results), ``guard`` (forbidden functions
refuse to run while a probe runs), ``wire`` (plain data between the two sides, no pickle),
``grader`` (``mlsys-lab grade``: one notebook in a fresh kernel), ``builder`` (``mlsys-lab
exercises build``), and one module of checks per chapter, ``chNN`` (``ch00`` is the template).

For a class: ``submissions`` (find submissions, recognise the layouts), ``classroom`` (grade them
in parallel worker processes, with the re-grade cache), ``gradebook`` (CSV/JSON), ``feedback``
(one file per submission), ``class_stats`` (per-exercise statistics and plot), ``release`` (the
student pack and its stamp) and ``commands`` (what the ``grade``/``exercises`` subcommands do).
"""

from .checks import check

__all__ = ["check"]
