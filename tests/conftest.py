"""Test configuration shared by every test module.

Numba's CUDA simulator must be switched on before numba is first imported, so CUDA kernels
are tested on machines without a GPU.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
