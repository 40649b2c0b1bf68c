"""Chapter 6, the AI compiler frontend (``solutions/ch06_compiler_frontend.ipynb``).

6.1 VJP rules over numpy, 6.2 forward mode with dual numbers (the book's
``y = ln(x1) + x1 x2 - sin(x2)`` at (2, 5)), 6.3 common-subexpression elimination and 6.4
constant folding as pure ``Graph -> Graph`` passes. The judges' references are the library's
own: ``ml.vjp`` and ``ml.jvp`` for the rules, ``passes.common_subexpression_elimination`` and
``passes.constant_folding`` for the passes, all of which are off limits to the student's code.
"""

from mlsys_lab.grading.exercises.ch06_compiler_frontend import (  # noqa: F401
    ex6_1_vjp_rules,
    ex6_2_dual_numbers,
    ex6_3_cse,
    ex6_4_constant_folding,
)
