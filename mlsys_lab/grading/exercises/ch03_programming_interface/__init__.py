"""Chapter 3, the programming interface (``solutions/ch03_programming_interface.ipynb``).

3.1 a custom layer (a low-rank linear layer as an ``ml.nn.Module``), 3.2 a custom operator
(softplus registered with its own kernel, VJP and JVP rules), 3.3 the functional style: a pure
loss of a parameter dict differentiated with ``ml.grad`` and a pure SGD step.
"""

from mlsys_lab.grading.exercises.ch03_programming_interface import (  # noqa: F401
    ex3_1_low_rank_linear,
    ex3_2_softplus,
    ex3_3_functional,
)
