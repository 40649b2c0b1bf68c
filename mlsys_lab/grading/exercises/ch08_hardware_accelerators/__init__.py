"""Chapter 8, hardware accelerators (``solutions/ch08_hardware_accelerators.ipynb``).

8.1 a cache-tiled CPU matmul in Numba, judged on its loop nest; 8.2 a shared-memory tiled CUDA
kernel on Numba's CUDA simulator, its global reads counted; 8.3 compute intensity and roofline
arithmetic; 8.4 Winograd F(2,3) by hand, its multiplies counted. One module per exercise (see
``ch00_demo`` for the layout); ``common`` holds what 8.1 and 8.2 share. No module imports numba
at import time (the notebook's first cell must switch the CUDA simulator on first).
"""

from mlsys_lab.grading.exercises.ch08_hardware_accelerators import (  # noqa: F401
    ex8_1_tiled_matmul,
    ex8_2_shared_memory,
    ex8_3_roofline,
    ex8_4_winograd,
)
