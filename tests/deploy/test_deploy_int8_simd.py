"""The int8 kernels' inner dot product: exact against an int64 numpy product for every byte
dtype pair and awkward K (tails, K < 32, K = 0), on the path this machine compiles and, in a
subprocess, on the AVX2-only path (``NUMBA_CPU_NAME=haswell``) that uses the hand-written
256-bit ``vpmaddwd`` intrinsic."""

import os
import subprocess
import sys

import numpy as np
import pytest
from llvmlite import binding as llvm

from mlsys_lab.deploy.quant import int8_kernels as K
from mlsys_lab.deploy.quant import int8_simd

SHAPES = [(3, 0, 2), (2, 5, 3), (4, 31, 5), (3, 32, 4), (5, 77, 3), (7, 200, 9)]
DTYPES = [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8), (np.int8, np.uint8)]


def _extremes(rng, shape, dtype):
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    x.flat[::7] = info.min            # the corners where 16-bit pair sums are largest
    x.flat[3::11] = info.max
    return x


def check_exact(seed=0):
    rng = np.random.default_rng(seed)
    for m, k, n in SHAPES:
        for da, db in DTYPES:
            a, bt = _extremes(rng, (m, k), da), _extremes(rng, (n, k), db)
            want = a.astype(np.int64) @ bt.T.astype(np.int64)
            got = K.int8_matmul(a, bt)
            assert got.dtype == np.int32 and np.array_equal(got, want), (m, k, n, da, db)
    return True


def test_int8_matmul_is_exact_on_this_target():
    assert check_exact()


def test_the_pmaddwd_path_is_exact_on_an_avx2_target():
    if not llvm.get_host_cpu_features().get("avx2"):
        pytest.skip("the host has no AVX2: the intrinsic path cannot run here")
    # Compiled afresh (not loaded from the kernel cache): cached code cannot be disassembled.
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="",
               MLSYS_LAB_NUMBA_CACHE="0")
    code = ("from mlsys_lab.deploy.quant import int8_simd; assert int8_simd.USE_PMADDWD; "
            "from tests.deploy.test_deploy_int8_simd import check_exact; "
            "from mlsys_lab.deploy.quant import int8_kernels as K; import re; check_exact(1); "
            "asm = ''.join(K._int8_dot.inspect_asm().values()); "
            "assert re.search(r'vpmaddwd[^\\n]*ymm', asm), 'no 256-bit vpmaddwd'; print('ok')")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_the_target_choice_follows_the_cpu_name(monkeypatch):
    monkeypatch.setattr(int8_simd.numba.config, "CPU_NAME", "haswell")
    assert int8_simd._use_pmaddwd() == (int8_simd.platform.machine().lower()
                                        in ("x86_64", "amd64"))
    monkeypatch.setattr(int8_simd.numba.config, "CPU_NAME", "skylake-avx512")
    assert not int8_simd._use_pmaddwd()
