"""Test configuration shared by every test module.

Numba's CUDA simulator must be switched on before numba is first imported, so CUDA kernels
are tested on machines without a GPU.
"""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# If a plugin imported numba before this file ran, make it re-read the environment.
import numba.core.config  # noqa: E402

numba.core.config.reload_config()
