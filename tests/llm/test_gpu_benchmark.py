"""``benchmarks/llm.py --gpu`` times the CUDA attention kernel on a real GPU only: on a machine
without one (or under the CUDA simulator) it exits 2, says why, and writes no results file."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("simulator", ["0", "1"])
def test_gpu_flag_exits_2_without_a_gpu(simulator):
    if simulator == "0" and shutil.which("nvidia-smi"):  # this process runs the simulator
        pytest.skip("a real GPU may be here: the flag would time it")  # pragma: no cover
    results = ROOT / "benchmarks" / "results" / "gpu_attention.json"
    before = results.stat().st_mtime_ns if results.exists() else None
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM=simulator)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "llm.py"), "--gpu"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    why = "the CUDA simulator is on" if simulator == "1" else "no CUDA GPU found"
    assert why in done.stderr
    assert (results.stat().st_mtime_ns if results.exists() else None) == before


def test_the_gpu_timing_runs_the_kernel_and_checks_it_under_the_simulator():
    # what --gpu runs on a real GPU, here on tiny shapes under the simulator (tests/conftest.py):
    # device arrays in, (out, lse) back, CUDA events, the result against the CPU kernel
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import llm_attention
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    result = llm_attention.time_gpu(length=19, repeats=2, heads=2, d=8)
    [row] = result["rows"]
    assert (row["length"], row["heads"], row["d"]) == (19, 2, 8)
    assert row["max_abs_error"] < 1e-5
    assert result["device"] and result["numba_version"]
