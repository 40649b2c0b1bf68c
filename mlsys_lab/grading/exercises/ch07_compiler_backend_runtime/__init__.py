"""Chapter 7, the compiler backend and runtime (``solutions/ch07_compiler_backend_runtime.ipynb``).

7.1 a greedy-by-size memory planner; 7.2 a transpose-cancelling pass over the Graph IR; 7.3 a
parallel list scheduler; 7.4 a decoder for 8-bit floats of any exponent width and bias. One
module per exercise (see ``ch00_demo`` for the layout).
"""

from mlsys_lab.grading.exercises.ch07_compiler_backend_runtime import (  # noqa: F401
    ex7_1_planner,
    ex7_2_transposes,
    ex7_3_scheduler,
    ex7_4_fp8,
)
