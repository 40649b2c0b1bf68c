"""``benchmarks/device_check.sh``, the one run a session lent a GPU machine makes: every GPU check
in one command. Here, without a GPU, it says so, exits 2 and runs nothing (a test selection that
matched nothing would fail its step there: pytest exits 5)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device_check.sh"


def test_the_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_without_a_gpu_it_exits_2_and_says_why(tmp_path):
    if shutil.which("nvidia-smi"):  # a GPU machine: the script would run the checks
        pytest.skip("nvidia-smi is here")  # pragma: no cover
    done = subprocess.run(["bash", str(SCRIPT)], env=dict(os.environ, OUT=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no NVIDIA GPU here" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["device.txt"]  # no step ran


def test_the_gemm_benchmark_checks_every_variant_under_the_simulator():
    # what matmul_gpu.py runs per shape on a real GPU, rehearsed on a tiny shape under the
    # simulator (tests/conftest.py): every variant launched, checked against float64, timed
    import types

    from numba import cuda

    from mlsys_lab.kernels import cuda as kc

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import matmul_gpu
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    args = types.SimpleNamespace(warmup=0, repeats=1, batch=1, skip=[])
    rows = matmul_gpu.bench_shape(cuda, kc, types.SimpleNamespace(name=None), (24, 20, 16), args)
    assert [r["variant"] for r in rows] == list(kc.VARIANTS)
    assert all(r["correct"] and r["max_rel_error"] < 1e-6 for r in rows), rows
