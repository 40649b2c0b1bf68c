"""Graded exercises in three parts (see README.md for the map).

* ``core/`` — what checks one answer: ``exercise`` (cases, exercises, the registry and the helpers
  probes and judges share), ``check`` (the notebook's ``check``), ``probe`` (the kernel side),
  ``judge`` (the trusted side), ``guard`` (forbidden functions refuse while a probe runs),
  ``wire`` (plain data between the two sides, no pickle), ``cells`` (answer and check cells) and
  ``grader`` (``mlsys-lab grade``: one notebook in a fresh kernel).
* ``course/`` — what a teacher runs for a class: ``submissions``, ``classroom`` (parallel grading
  with the re-grade cache), ``gradebook``, ``feedback``, ``statistics``, ``builder`` (exercise
  notebooks from solutions), ``release`` (the student pack and its stamp) and ``commands`` (the
  ``grade`` / ``exercises`` subcommands).
* ``exercises/`` — one package per chapter, one module per exercise (``ch00_demo`` is the
  template).
"""

from .core.check import check

__all__ = ["check"]
