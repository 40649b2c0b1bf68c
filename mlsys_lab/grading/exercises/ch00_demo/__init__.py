"""Chapter 0, the demo exercise set (``solutions/ch00_demo.ipynb``): the template for a chapter.

Copy this folder to ``chNN_topic/`` (named like the chapter's solution notebook), write one
module per exercise, import them here in order, and add the chapter to ``CHAPTERS`` in
``mlsys_lab/grading/exercises/__init__.py``. An exercise module holds, top to bottom:

* its **inputs**, derived from ``seed`` the same way on both sides when a case takes one;
* its **references**, private to the module (students may not call them: the guard refuses
  every function of ``mlsys_lab/grading/exercises/`` while a probe runs);
* per case, a **probe** (runs in the student's kernel: calls the answer, returns plain data,
  nothing else) and a **judge** (runs in the grader's process: rebuilds the inputs, computes
  the reference itself, raises ``AssertionError`` with a message a student can act on);
* a comment naming the **wrong ideas** its cases reject, and why each fails;
* its ``register(Exercise(...))``, with ``forbidden`` naming the public library functions that
  would do the exercise for the student.
"""

from mlsys_lab.grading.exercises.ch00_demo import ex0_1_square, ex0_2_fib, ex0_3_mean  # noqa: F401
