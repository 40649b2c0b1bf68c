#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one run (a session lent a GPU machine calls it once):
#   1. the CUDA kernels' tests on the real GPU (NUMBA_ENABLE_CUDASIM=0): the GEMM ladder, and the
#      attention kernels at the same tiny shapes the simulator runs in CI;
#   2. benchmarks/llm.py --gpu: the tiled causal attention forward, L = 2048, 8 heads, d = 64;
#   3. benchmarks/matmul_gpu.py --quick: the GEMM ladder beside cuBLAS.
# Logs and results files go to $OUT when it is set (the device tool brings that folder back),
# else to benchmarks/results/. Exit status: 2 without a GPU, 1 if a step failed, else 0.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results}"
mkdir -p "$out"
export NUMBA_ENABLE_CUDASIM=0 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if ! nvidia-smi -L > "$out/device.txt" 2>&1; then
  echo "device_check: no NVIDIA GPU here (nvidia-smi -L failed)" >&2
  exit 2
fi
python3 -c 'import sys, numba, numpy; print("python", sys.version.split()[0], "numba",
numba.__version__, "numpy", numpy.__version__)' >> "$out/device.txt" 2>&1
cat "$out/device.txt"
failed=0
step() {  # step NAME SECONDS COMMAND...: run it within SECONDS, its output also in $out/NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log" || { echo "== $name failed"; failed=1; }
}
step gpu_tests 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_kernels_cuda.py \
  tests/kernels/test_attention_kernels.py -k "cuda or test_kernels_cuda"
step gpu_attention 120 python3 benchmarks/llm.py --gpu
if [ -f benchmarks/results/gpu_attention.json ] && [ "$out" != benchmarks/results ]; then
  cp benchmarks/results/gpu_attention.json "$out/"
fi
step gpu_matmul 180 python3 benchmarks/matmul_gpu.py --quick --out "$out/gpu_matmul.json"
exit "$failed"
